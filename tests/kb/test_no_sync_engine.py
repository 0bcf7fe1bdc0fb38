"""ds-no-sync-zero23-grad-accum against the real DeepSpeed engine (CPU accelerator, gloo, one rank): the installed
release's `engine.no_sync()` runs under ZeRO-1 and raises the entry's assertion under ZeRO-2, and `diagnose` names
the entry on the traceback that run printed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from zerodoctor.cli.main import main
from zerodoctor.engine.launch import free_port

# gradient accumulation as HF Trainer / accelerate drive it: the micro-batches before the boundary under no_sync
SCRIPT = """
import sys
import torch
import deepspeed

for stage in (1, 2):
    model = torch.nn.Linear(8, 8)
    config = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 2,
        "zero_optimization": {"stage": stage},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
    }
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    with engine.no_sync():
        engine.backward(engine(torch.randn(1, 8)).sum())
    print(f"no_sync ran under ZeRO stage {stage}", flush=True)
"""


@pytest.mark.engine
def test_real_engine_raises_the_entrys_assertion(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    env = {
        **os.environ,
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
    }
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert "no_sync ran under ZeRO stage 1" in proc.stdout, proc.stderr[-2000:]
    assert "no_sync ran under ZeRO stage 2" not in proc.stdout
    assert proc.returncode != 0
    assert (
        "AssertionError: no_sync context manager is incompatible with gradient partitioning logic of ZeRO stage 2"
        in proc.stderr
    ), proc.stderr[-2000:]
    log = tmp_path / "rank0.log"
    log.write_text(proc.stdout + proc.stderr)
    assert main(["diagnose", str(log), "--format", "json"]) == 1
    report = json.loads(capsys.readouterr().out)
    findings = report["findings"] if isinstance(report, dict) else report
    assert findings[0]["id"] == "ds-no-sync-zero23-grad-accum", [f["id"] for f in findings]
    assert findings[0]["severity"] == "error"
