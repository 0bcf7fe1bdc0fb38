"""`zerodoctor check` on setups with one line changed (review R2 findings 4 and 7), through `main([...])`:
a misspelt training-YAML key is an error that names the key the plan then assumed; a duplicate DeepSpeed key
is an error only when DeepSpeed itself would open the file."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LF_LORA = ROOT / "examples" / "healthy-llamafactory-lora"
HF_Z3 = ROOT / "examples" / "healthy-hf-zero3"


def _copy(src: Path, dst: Path, name: str, old: str, new: str) -> Path:
    shutil.copytree(src, dst)
    path = dst / name
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))
    return dst


def _check(run_cli, folder: Path) -> tuple[int, dict, str]:
    code, out, err = run_cli("check", str(folder), "--format", "json")
    assert out, err
    text_code, text, _ = run_cli("check", str(folder))
    assert text_code == code
    return code, json.loads(out), text


def test_llamafactory_typo_is_not_ready(run_cli, tmp_path):
    case = _copy(
        LF_LORA,
        tmp_path / "typo_lf",
        "qwen2_5_7b_lora_sft.yaml",
        "per_device_train_batch_size: 1",
        "per_device_train_batchsize: 1",
    )
    code, doc, text = _check(run_cli, case)
    assert doc["verdict"] == "will fail" and code != 0
    hf004 = [f for f in doc["findings"] if f["id"] == "HF004"]
    assert len(hf004) == 1 and hf004[0]["severity"] == "error"
    assert "did you mean `per_device_train_batch_size`?" in hf004[0]["message"]
    # the plan used HF's default micro batch of 8 because the key was not recognised, and says so
    assert "micro batch 8 (the default: `per_device_train_batchsize` is not a recognised key)" in text


def test_hf_args_typo_names_the_checkpointing_assumption(run_cli, tmp_path):
    case = _copy(
        HF_Z3,
        tmp_path / "hfz",
        "train_args.yaml",
        "gradient_checkpointing: true",
        "gradient_checkpointng: true",
    )
    code, doc, text = _check(run_cli, case)
    assert doc["verdict"] == "will fail" and code != 0
    assert any(f["id"] == "HF004" and f["severity"] == "error" for f in doc["findings"])
    assert "gradient checkpointing off (the default: `gradient_checkpointng` is not a recognised key)" in text


def test_healthy_examples_have_no_unknown_key_finding(run_cli):
    for example in (LF_LORA, HF_Z3):
        _, doc, text = _check(run_cli, example)
        assert not [f for f in doc["findings"] if f["id"] == "HF004"], example
        assert "not a recognised key" not in text


def test_duplicate_deepspeed_key_under_llamafactory_is_a_warning_naming_the_value(run_cli, tmp_path):
    case = _copy(
        LF_LORA, tmp_path / "dup", "ds_z3_config.json", '"stage": 3,', '"stage": 2,\n    "stage": 3,'
    )
    code, doc, _ = _check(run_cli, case)
    assert doc["verdict"] == "ready with warnings", doc["verdict"]
    dup = [f for f in doc["findings"] if "appears twice" in f["message"]]
    assert len(dup) == 1 and dup[0]["severity"] == "warning"
    assert "the run uses 3" in dup[0]["message"]


def test_duplicate_deepspeed_key_is_an_error_when_deepspeed_opens_the_file(run_cli, tmp_path):
    ds = tmp_path / "ds.json"
    ds.write_text(
        '{"train_micro_batch_size_per_gpu": 1,\n "zero_optimization": {"stage": 2,\n "stage": 3}}\n'
    )
    code, out, _ = run_cli("lint", str(ds), "--framework", "deepspeed", "--format", "json")
    findings = json.loads(out)["findings"]
    dup = [f for f in findings if "appears twice" in f["message"]]
    assert len(dup) == 1 and dup[0]["severity"] == "error" and code != 0
