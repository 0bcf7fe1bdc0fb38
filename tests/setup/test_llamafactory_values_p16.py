"""LLaMA-Factory's finetuning_type / stage / preference-loss values by release (read from finetuning_args.py at
every tag): accepted where that release accepts them, refused with the release named where it does not (issue 9)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from zerodoctor.setup.llamafactory_values import refusal

ROOT = Path(__file__).resolve().parents[2]
LF_LORA = ROOT / "examples" / "healthy-llamafactory-lora"
YAML = "qwen2_5_7b_lora_sft.yaml"
CLUSTER = ("--nodes", "1", "--gpus-per-node", "8", "--gpu-memory", "80", "--host-ram", "512")


@pytest.mark.parametrize(
    ("field", "value", "version", "accepted"),
    [
        ("finetuning_type", "oft", "0.9.4", True),
        ("finetuning_type", "oft", "0.9.5", True),
        ("finetuning_type", "oft", "0.9.3", False),
        ("finetuning_type", "oft", None, True),  # release unknown: some release accepts it
        ("finetuning_type", "lora", "0.2.2", True),
        ("finetuning_type", "none", "0.2.1", True),
        ("finetuning_type", "none", "0.2.2", False),
        ("finetuning_type", "galore", None, False),  # GaLore is use_galore, not a finetuning_type
        ("stage", "orpo", "0.6.2", True),
        ("stage", "orpo", "0.7.1", True),
        ("stage", "orpo", "0.8.0", False),  # from v0.8.0: stage dpo + pref_loss orpo
        ("stage", "orpo", "0.6.1", False),
        ("stage", "kto", "0.8.0", True),
        ("stage", "kto", "0.7.1", False),
        ("stage", "simpo", None, False),
        ("pref_loss", "simpo", "0.8.0", True),
        ("pref_loss", "orpo", "0.9.5", True),
        ("pref_loss", "sigmoid", "0.7.1", False),  # the field was dpo_loss then
        ("dpo_loss", "kto", "0.5.0", True),
        ("dpo_loss", "kto", "0.5.3", False),
        ("dpo_loss", "kto_pair", "0.5.3", True),
        ("dpo_loss", "ipo", "0.4.0", False),
    ],
)
def test_values_by_release(field, value, version, accepted):
    why = refusal(field, value, version)
    assert (why is None) == accepted, why
    if why is not None and version is not None:
        assert f"LLaMA-Factory {version} refuses {field} {value!r}" in why


def test_refusal_names_when_it_was_accepted_and_what_this_release_takes():
    why = refusal("finetuning_type", "oft", "0.9.3")
    assert why == (
        "LLaMA-Factory 0.9.3 refuses finetuning_type 'oft' (accepted from 0.9.4; 0.9.3 accepts: lora, freeze, full)"
    )
    assert "accepted from 0.6.2 until 0.8.0" in (refusal("stage", "orpo", "0.9.0") or "")


def _case(tmp_path: Path, edit: str, pin: str | None = None) -> Path:
    case = tmp_path / "lf"
    shutil.copytree(LF_LORA, case)
    yaml = case / YAML
    text = yaml.read_text().replace("finetuning_type: lora", edit)
    yaml.write_text(text.replace("stage: sft\n", "") if "stage:" in edit else text)
    if pin:
        env = case / "env.txt"
        env.write_text(env.read_text() + pin + "\n")
    return case


def test_oft_is_planned_not_refused(run_cli, tmp_path):
    case = _case(tmp_path, "finetuning_type: oft")
    code, out, err = run_cli("check", str(case), "--format", "json")
    doc = json.loads(out)
    assert not [f for f in doc["findings"] if f["id"] in ("ZD003", "PLAN006")], doc["findings"]
    assert doc["verdict"] in ("ready", "ready with warnings")
    code, out, err = run_cli(
        "plan", str(case / YAML), "--env", str(case / "env.txt"), *CLUSTER, "--format", "json"
    )
    plan = json.loads(out)
    assert plan["training"]["method"] == "lora" and plan["training"]["lora_rank"] == 8
    assert any(
        "finetuning_type oft: planned as LoRA's adapter-only trainable set" in n for n in plan["notes"]
    )


def test_quantized_oft_is_planned_as_a_qlora_adapter(run_cli, tmp_path):
    case = _case(tmp_path, "finetuning_type: oft\nquantization_bit: 4\noft_block_size: 64")
    code, out, err = run_cli(
        "plan", str(case / YAML), "--env", str(case / "env.txt"), *CLUSTER, "--format", "json"
    )
    t = json.loads(out)["training"]
    assert t["method"] == "qlora" and t["lora_rank"] == 16  # (64 - 1) / 4 = 15.75


def test_oft_under_a_release_without_it_is_refused_with_that_release(run_cli, tmp_path):
    case = _case(tmp_path, "finetuning_type: oft", pin="llamafactory==0.9.3")
    code, out, err = run_cli("check", str(case))
    assert code == 2
    assert "LLaMA-Factory 0.9.3 refuses finetuning_type 'oft' (accepted from 0.9.4" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    code, out, err = run_cli("lint", str(case / YAML), "--env", str(case / "env.txt"), "--format", "json")
    zd3 = [f for f in json.loads(out)["findings"] if f["id"] == "ZD003"]
    assert len(zd3) == 1 and "LLaMA-Factory 0.9.3 refuses finetuning_type 'oft'" in zd3[0]["message"]


def test_unknown_finetuning_type_is_one_error_naming_the_releases(run_cli, tmp_path):
    case = _case(tmp_path, "finetuning_type: galore")
    code, out, err = run_cli("lint", str(case / YAML), "--format", "json")
    zd3 = [f for f in json.loads(out)["findings"] if f["id"] == "ZD003"]
    assert len(zd3) == 1, zd3  # not a second "finetuning method is not known" for the same line
    assert "no LLaMA-Factory release (v0.2.2 to v0.9.5) accepts finetuning_type 'galore'" in zd3[0]["message"]


def _describe(tmp_path: Path, text: str, pin: str | None = None):
    from zerodoctor.setup.load import load_setup
    from zerodoctor.setup.run import describe_run

    case = _case(tmp_path, text, pin)
    return describe_run(load_setup([str(case / YAML)]))


def test_orpo_stage_has_no_reference_and_pairs_its_inputs(tmp_path):
    run = _describe(tmp_path, "finetuning_type: full\nstage: orpo")
    assert run.files.framework == "llamafactory"
    assert run.reference_model.value is False and run.paired_inputs.value is True


def test_kto_builds_its_reference_whatever_pref_loss_says(tmp_path):
    run = _describe(tmp_path, "finetuning_type: full\nstage: kto\npref_loss: simpo")
    assert run.reference_model.value is True and run.paired_inputs.value is False
