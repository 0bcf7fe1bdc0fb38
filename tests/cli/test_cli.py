"""The CLI through main(argv): exit codes, formats, golden output, --fix, bad input."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "golden"
LLAVA = ROOT / "examples" / "llava-zero3-offload"


def _golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("ZD_UPDATE_GOLDEN"):
        path.write_text(text)
    assert path.exists(), f"missing golden file {path}; run with ZD_UPDATE_GOLDEN=1 once and review it"
    assert text == path.read_text()


def test_help_documents_exit_codes(run_cli):
    code, out, _ = run_cli("--help")
    assert code == 0
    for line in (
        "0  clean",
        "1  findings at or above --fail-on",
        "2  usage or input error",
        "3  internal error",
    ):
        assert line in out


def test_no_command_is_usage_error(run_cli):
    code, out, _ = run_cli()
    assert code == 2 and "COMMAND" in out


def test_unknown_option_is_usage_error(run_cli):
    code, _, err = run_cli("lint", "--no-such-option", "x.json")
    assert code == 2 and "unrecognized arguments" in err


@pytest.mark.parametrize("fmt,ext", [("text", "txt"), ("json", "json"), ("markdown", "md")])
def test_lint_llava_golden(run_cli, monkeypatch, fmt, ext):
    monkeypatch.chdir(LLAVA)
    code, out, err = run_cli("lint", "train_args.yaml", "--env", "env.txt", "--format", fmt)
    assert code == 1, err
    _golden(f"lint_llava.{ext}", out)
    if fmt == "json":
        doc = json.loads(out)
        assert doc["schema_version"] == 1 and doc["command"] == "lint"
        f = doc["findings"][0]
        for key in ("id", "severity", "title", "message", "fixes", "evidence", "references"):
            assert key in f
        assert all(isinstance(x, str) for x in f["fixes"])
        assert {"file", "line", "key"} <= set(f["evidence"][0])


def test_fail_on_levels(run_cli, monkeypatch):
    monkeypatch.chdir(ROOT / "examples" / "healthy-hf-zero3")
    assert run_cli("lint", "train_args.yaml", "--env", "env.txt")[0] == 0
    assert run_cli("lint", "train_args.yaml", "--env", "env.txt", "--fail-on", "info")[0] == 1  # HF003 info
    monkeypatch.chdir(LLAVA)
    assert run_cli("lint", "train_args.yaml", "--env", "env.txt", "--fail-on", "never")[0] == 0


def test_env_snapshot_round_trip(run_cli, tmp_path):
    code, out, err = run_cli("env", "--no-deep", "--format", "json")
    assert code in (0, 1), err
    doc = json.loads(out)
    assert doc["command"] == "env" and "environment" in doc and isinstance(doc["findings"], list)
    snap = tmp_path / "env.json"
    snap.write_text(out)
    code, out2, _ = run_cli("env", "--env", str(snap), "--format", "json")
    assert json.loads(out2)["environment"]["packages"] == doc["environment"]["packages"]
    # the snapshot feeds lint too
    code, _, err = run_cli("lint", str(LLAVA / "train_args.yaml"), "--env", str(snap))
    assert code in (0, 1), err


def test_env_from_pip_freeze_flags_the_known_bug(run_cli):
    code, out, _ = run_cli("env", "--env", str(LLAVA / "env.txt"), "--format", "json")
    doc = json.loads(out)
    ids = [f["id"] for f in doc["findings"]]
    assert "ds-z3-offload-clipgrad-device-mismatch" in ids
    f = next(f for f in doc["findings"] if f["id"] == "ds-z3-offload-clipgrad-device-mismatch")
    assert f["severity"] == "warning"  # versions match; the config conditions are not known to env
    assert code == 0


def test_env_text_shows_the_machine(run_cli):
    code, out, _ = run_cli("env", "--no-deep")
    assert "python" in out and "host RAM" in out and "/dev/shm" in out and "deepspeed" in out


def test_kb_list_and_show(run_cli):
    code, out, _ = run_cli("kb", "--format", "json")
    doc = json.loads(out)
    assert code == 0 and len(doc["entries"]) >= 25 and len(doc["rules"]) >= 16
    assert {"id", "title", "severity"} <= set(doc["entries"][0])
    code, out, _ = run_cli("kb", "ds-z3-offload-clipgrad-device-mismatch")
    assert code == 0
    for part in (
        "Why it happens:",
        "How to fix it:",
        "Sources:",
        "deepspeedai/DeepSpeed#5461",
        ">=0.14.1, <0.14.3",
    ):
        assert part in out
    code, out, _ = run_cli("kb", "deepspeed.batch-size-mismatch")
    assert code == 0 and "DS002" in out and "Use instead" in out
    code, _, err = run_cli("kb", "ds-z3-offload-clipgrad")
    assert code == 2 and "did you mean ds-z3-offload-clipgrad-device-mismatch" in err


@pytest.mark.parametrize(
    "content,suffix,fragment",
    [
        ('{\n  "zero_optimization": {"stage": 3,}\n}', ".json", "x.json:2:"),
        ("a: [1,\n", ".yaml", "x.yaml:2:"),
        ("def f(:\n", ".py", "x.py:1:"),
        ("", ".json", "the file is empty"),
        ("just: text\n", ".yaml", "cannot tell what kind of config"),
    ],
)
def test_bad_input_is_one_clear_line(run_cli, tmp_path, content, suffix, fragment):
    p = tmp_path / f"x{suffix}"
    p.write_text(content)
    code, out, err = run_cli("lint", str(p))
    assert code == 2 and out == ""
    assert fragment in err and "Traceback" not in err and err.count("\n") == 1


def test_binary_and_missing_files(run_cli, tmp_path):
    b = tmp_path / "x.json"
    b.write_bytes(b"\x00\x01\x02")
    code, _, err = run_cli("lint", str(b))
    assert code == 2 and "binary" in err
    code, _, err = run_cli("lint", str(tmp_path / "missing.json"))
    assert code == 2 and "no such file" in err
    bad = tmp_path / "latin1.yaml"
    bad.write_bytes("output_dir: caf\xe9\n".encode("latin-1"))
    code, _, err = run_cli("lint", str(bad))
    assert code == 2 and "UTF-8" in err


def test_internal_error_is_exit_3(run_cli, monkeypatch, tmp_path):
    from zerodoctor.lint.rules import ds003_fp16_bf16_both_enabled as mod

    def boom(setup):
        raise ZeroDivisionError("rule bug")

    from dataclasses import replace

    monkeypatch.setattr(mod, "RULE", replace(mod.RULE, check=boom))
    p = tmp_path / "ds.json"
    p.write_text('{"train_micro_batch_size_per_gpu": 1}')
    code, _, err = run_cli("lint", str(p))
    assert code == 3 and "internal error" in err and "ZeroDivisionError" in err


def test_fix_writes_a_copy_and_keeps_everything_else(run_cli, tmp_path):
    src = tmp_path / "ds.json"
    original = (
        '{\n    "train_batch_size": 64,\n    "train_micro_batch_size_per_gpu": 4,\n    "gradient_accumulation_steps": 8,\n'
        '    "zero_optimization": {"stage": 3, "reduce_bucket_size": 5e8, "my_note": null},\n'
        '    "custom_key": {"kept": [1, 2, 3]}\n}\n'
    )
    src.write_text(original)
    code, out, _ = run_cli("lint", str(src), "--framework", "deepspeed", "--world-size", "1", "--fix")
    fixed = tmp_path / "ds.fixed.json"
    assert fixed.exists() and src.read_text() == original  # the input is untouched
    data = json.loads(fixed.read_text())
    assert "train_batch_size" not in data  # DS002's safe fix: let DeepSpeed derive it
    assert data["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] is True  # DS007's safe fix
    assert data["custom_key"] == {"kept": [1, 2, 3]} and data["zero_optimization"]["my_note"] is None
    assert '"reduce_bucket_size": 5e8' in fixed.read_text()  # number spelling kept
    assert "fixed: " in out and "wrote " in out
    # a second run never overwrites the first copy
    run_cli("lint", str(src), "--framework", "deepspeed", "--world-size", "1", "--fix")
    assert (tmp_path / "ds.fixed.2.json").exists()
    # the corrected copy lints clean of what was fixed
    code, out, _ = run_cli(
        "lint", str(fixed), "--framework", "deepspeed", "--world-size", "1", "--format", "json"
    )
    ids = {f["id"] for f in json.loads(out)["findings"]}
    assert "DS002" not in ids and "DS007" not in ids


def test_fix_in_place_keeps_a_backup_and_yaml_comments(run_cli, tmp_path):
    shutil.copytree(ROOT / "examples" / "peft-qlora-zero3-missing-quant-storage", tmp_path / "ex")
    args = tmp_path / "ex" / "train_args.yaml"
    before = args.read_text()
    code, out, _ = run_cli(
        "lint", str(args), str(tmp_path / "ex" / "deepspeed_config_z3_qlora.yaml"), "--fix", "--in-place"
    )
    after = args.read_text()
    assert (tmp_path / "ex" / "train_args.yaml.bak").read_text() == before
    assert "bnb_4bit_quant_storage_dtype: bfloat16" in after
    assert "# VARIANT (seed 003)" in after  # comments survive
    assert len(after.splitlines()) == len(before.splitlines()) + 1
    code, out, _ = run_cli(
        "lint", str(args), str(tmp_path / "ex" / "deepspeed_config_z3_qlora.yaml"), "--format", "json"
    )
    assert "QL001" not in {f["id"] for f in json.loads(out)["findings"]}


def test_fix_only_with_fix(run_cli, tmp_path):
    p = tmp_path / "ds.json"
    p.write_text('{"train_micro_batch_size_per_gpu": 1}')
    code, _, err = run_cli("lint", str(p), "--in-place")
    assert code == 2 and "--fix" in err
