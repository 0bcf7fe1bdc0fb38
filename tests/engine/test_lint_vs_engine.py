"""Lint's verdicts hold on the real engine: 2 ranks under torchrun, DeepSpeed's CPU accelerator and gloo,
ZeRO-3 with optimizer offload, a tiny Llama built from a config (no download). A clean ZeRO-3 offload setup
that lint passes is run by tests/selftest (test_lint_verdict_on_the_setup_holds_on_the_engine), with every
positive check."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from zerodoctor.lint.engine import lint_setup
from zerodoctor.setup.load import load_setup

pytest.importorskip("deepspeed")
from zerodoctor.engine.launch import run_tiny_job  # noqa: E402

pytestmark = pytest.mark.engine
ROOT = Path(__file__).resolve().parents[2]


def test_offload_with_client_optimizer_fails_as_lint_says(tmp_path):
    config = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 1.0,
        "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}},
    }
    (tmp_path / "ds.json").write_text(json.dumps(config))
    findings = lint_setup(load_setup([tmp_path / "ds.json"], framework="deepspeed", world_size=2))
    assert "DS009" in {f.id for f in findings}
    result = run_tiny_job(config, nproc=2, steps=1, workdir=tmp_path / "job", client_optimizer=True)
    assert not result.ok
    err = result.first_error()
    assert err and "You are using ZeRO-Offload with a client provided optimizer" in err["message"]
    # and the fix lint proposes makes it run: an optimizer block
    fixed = {**config, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}
    (tmp_path / "ds.json").write_text(json.dumps(fixed))
    assert "DS009" not in {
        f.id for f in lint_setup(load_setup([tmp_path / "ds.json"], framework="deepspeed", world_size=2))
    }
    assert run_tiny_job(fixed, nproc=2, steps=1, workdir=tmp_path / "job2").ok
