"""The selftest does not launch a setup its framework or DeepSpeed refuses at start-up (zerodoctor.selftest.refusals):
a miniature run of values HF Trainer never accepts would "pass" where the real launch stops."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

from zerodoctor.findings import Finding, Severity
from zerodoctor.selftest.refusals import is_launch_refusal

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _healthy_copy(tmp_path: Path, old: str, new: str) -> Path:
    setup = tmp_path / "setup"
    shutil.copytree(EXAMPLES / "healthy-hf-zero3", setup)
    ds = setup / "ds_z3_config.json"
    text = ds.read_text()
    assert old in text
    ds.write_text(text.replace(old, new))
    return setup


def test_ds_micro_batch_contradicting_hf_args_is_not_launched(run_cli, tmp_path):
    """HF Trainer stops with 'Please correct the following DeepSpeed config values that mismatch
    TrainingArguments values' (HF001): the selftest says so and starts no rank (nothing in its workdir)."""
    setup = _healthy_copy(
        tmp_path, '"train_micro_batch_size_per_gpu": "auto"', '"train_micro_batch_size_per_gpu": 4'
    )
    workdir = tmp_path / "work"
    started = time.monotonic()
    code, out, _ = run_cli("selftest", str(setup), "--workdir", str(workdir))
    assert time.monotonic() - started < 30  # no torchrun, no DeepSpeed op build
    assert code == 1
    assert "not launched: the real run is refused at launch (HF001)" in out
    assert "ds train_micro_batch_size_per_gpu=4 vs hf per_device_train_batch_size=1" in out
    assert not workdir.exists() or not any(workdir.iterdir())


def test_string_count_is_refused_by_deepspeed_and_named(run_cli, tmp_path):
    setup = _healthy_copy(
        tmp_path, '"train_micro_batch_size_per_gpu": "auto"', '"train_micro_batch_size_per_gpu": "1"'
    )
    code, out, _ = run_cli("selftest", str(setup), "--format", "json")
    doc = json.loads(out)
    assert code == 1
    assert "DS001" in {f["id"] for f in doc["findings"]}
    assert all(f["severity"] == "error" for f in doc["findings"])


def test_check_run_does_not_start_the_selftest_of_a_refused_setup(run_cli, tmp_path):
    setup = _healthy_copy(
        tmp_path, '"train_micro_batch_size_per_gpu": "auto"', '"train_micro_batch_size_per_gpu": 4'
    )
    code, out, _ = run_cli("check", str(setup), "--run", "--format", "json")
    doc = json.loads(out)
    selftest = next(c for c in doc["checked"] if c["what"] == "selftest")
    assert not selftest["checked"] and "refused at launch (HF001)" in selftest["detail"]
    assert doc["verdict"] == "will fail" and code == 1


@pytest.mark.parametrize(
    ("source", "severity", "phase", "refused"),
    [
        ("lint", Severity.ERROR, None, True),  # no phase: bites at launch
        ("lint", Severity.ERROR, "launch", True),
        # a known bug of the first optimizer step (KB001) or a save that will not fit: what the selftest shows
        ("lint", Severity.ERROR, "first_optimizer_step", False),
        ("lint", Severity.ERROR, "checkpoint_save", False),
        ("lint", Severity.WARNING, None, False),
        ("plan", Severity.ERROR, "launch", False),  # memory is the GPU's question, not the launch's
    ],
)
def test_only_lint_errors_at_launch_stop_the_selftest(source, severity, phase, refused):
    data = {"phase": phase} if phase else {}
    f = Finding(id="X", name="x", severity=severity, title="t", message="m", source=source, data=data)
    assert is_launch_refusal(f) is refused
