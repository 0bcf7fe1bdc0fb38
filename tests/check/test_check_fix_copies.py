"""`check --fix DIR` and `lint --fix` (review R2 finding 11), through `main([...])`: a did-you-mean rename is
applied in place; the recommended DeepSpeed config is the user's file with only the strategy's keys changed,
every change listed; every finding whose fix is not applied says why."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def _flat(node, prefix=""):
    out = {}
    for k, v in node.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _fix(run_cli, setup: Path, out_dir: Path) -> dict:
    code, out, err = run_cli("check", str(setup), "--fix", str(out_dir), "--format", "json")
    assert out, err
    return json.loads(out)["fix"]


def test_recommended_config_keeps_the_users_keys_and_lists_every_change(run_cli, tmp_path):
    example = EXAMPLES / "llamafactory-deepseek-coder-v2-z3"
    fix = _fix(run_cli, example, tmp_path / "fixed")
    rec_path = next(Path(p) for p in fix["written"] if p.endswith("ds_config.recommended.json"))
    rec = json.loads(rec_path.read_text())
    user = json.loads((example / "ds_z3_config.json").read_text())
    for key in ("monitor_config", "comms_config", "fp16", "zero_allow_untested_optimizer"):
        assert rec[key] == user[key], key
    assert rec["zero_optimization"]["overlap_comm"] is False  # the user's value, not the emitter's default
    assert '"sub_group_size": 1e9' in rec_path.read_text()  # the number as the user spelled it
    flat_user, flat_rec = _flat(user), _flat(rec)
    changed = {k for k in flat_user.keys() | flat_rec.keys() if flat_user.get(k) != flat_rec.get(k)}
    listed = " ".join(c for c in fix["changes"] if c.startswith("ds_config.recommended.json"))
    for key in changed:  # every difference from the user's file is in the list
        block = ".".join(key.split(".")[:2])
        assert key in listed or block in listed, (key, listed)
    assert any("still names ds_z3_config.json" in n for n in fix["not_fixed"])
    assert any(n.startswith("PLAN001: written as ds_config.recommended.json") for n in fix["not_fixed"])


def test_zero_block_typo_is_renamed_in_place(run_cli, tmp_path):
    setup = tmp_path / "typo"
    shutil.copytree(EXAMPLES / "healthy-llamafactory-lora", setup)
    ds = setup / "ds_z3_config.json"
    ds.write_text(ds.read_text().replace('"stage": 3', '"stgae": 3'))
    fix = _fix(run_cli, setup, tmp_path / "fixed")
    copy = next(Path(p) for p in fix["written"] if p.endswith("ds_z3_config.json"))
    assert copy.read_text() == ds.read_text().replace('"stgae": 3', '"stage": 3')
    assert any(
        "DS001: renamed zero_optimization.stgae to zero_optimization.stage (value 3)" in c
        for c in fix["changes"]
    )


def test_training_yaml_typo_is_renamed_and_top_level_ds_typo_says_why_not(run_cli, tmp_path):
    setup = tmp_path / "typo"
    shutil.copytree(EXAMPLES / "healthy-llamafactory-lora", setup)
    yaml = setup / "qwen2_5_7b_lora_sft.yaml"
    yaml.write_text(
        yaml.read_text().replace("per_device_train_batch_size: 1", "per_device_train_batchsize: 1")
    )
    ds = setup / "ds_z3_config.json"
    ds.write_text(ds.read_text().replace('"gradient_clipping": "auto"', '"gradient_cliping": 1.0'))
    fix = _fix(run_cli, setup, tmp_path / "fixed")
    copy = next(Path(p) for p in fix["written"] if p.endswith("qwen2_5_7b_lora_sft.yaml"))
    assert copy.read_text() == yaml.read_text().replace(
        "per_device_train_batchsize: 1", "per_device_train_batch_size: 1"
    )
    (why,) = [n for n in fix["not_fixed"] if "gradient_cliping" in n]
    assert why.startswith(
        "DS001: not applied automatically: Rename `gradient_cliping` to `gradient_clipping`"
    )
    assert "changes how it trains" in why


def test_lint_fix_says_why_a_finding_is_not_fixed(run_cli, tmp_path):
    ds = tmp_path / "ds.json"
    ds.write_text(
        '{"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3, "bogus_knob": 1}}\n'
    )
    code, out, _ = run_cli("lint", str(ds), "--fix")
    assert (
        "not applied automatically: Remove `bogus_knob`" in out and "no setting is close to this name" in out
    )
    # the safe fix of another finding is written; the unknown key stays as the user wrote it
    assert '"bogus_knob": 1' in (tmp_path / "ds.fixed.json").read_text()


def test_text_output_lists_each_change_of_the_written_copies(run_cli, tmp_path):
    """The text format prints what --fix changed, not only the files it wrote (the JSON's fix.changes)."""
    example = EXAMPLES / "llamafactory-deepseek-coder-v2-z3"
    fix = _fix(run_cli, example, tmp_path / "json")
    code, out, err = run_cli("check", str(example), "--fix", str(tmp_path / "text"))
    assert fix["changes"]
    for change in fix["changes"]:
        assert f"changed: {change}" in out, (change, out[-2000:])
