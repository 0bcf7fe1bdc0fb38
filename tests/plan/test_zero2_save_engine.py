"""The host side of a checkpoint save under ZeRO-2 + offload_optimizer against the real DeepSpeed engine on CPU
(2 gloo ranks, tests/plan/zero2_save_job.py): what HF Trainer's save_model clones on every rank, what safetensors
>= 0.8 adds while rank 0 writes it (nothing: the planner charges the shard's bytes copy only up to 0.7), and what
`engine.save_checkpoint` adds when the optimizer partition is already on the host (nothing: torch.save writes host
storages as they are). Peaks are the kernel's RSS high-water mark, reset before each save.

What CPU cannot show: pinned memory and its power-of-two rounding, and the GPU-to-host copy torch.save makes of the
16-bit flat buffer on dp rank 0 (on the CPU accelerator that buffer is already on the host)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from zerodoctor.models.spec import model_from_config
from zerodoctor.plan import model_states as ms
from zerodoctor.plan.inputs import GIB, Cluster, PlanInputs, Training, ZeroSettings
from zerodoctor.plan.phases import plan_strategy

pytest.importorskip("deepspeed")
pytest.importorskip("psutil")
pytestmark = pytest.mark.engine

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def measured() -> list[dict]:
    import os

    from test_fsdp_engine import torchrun_job

    old = os.environ.get("DS_ACCELERATOR")
    os.environ["DS_ACCELERATOR"] = "cpu"  # the ranks inherit it: DeepSpeed's CPU accelerator even on a GPU machine
    try:
        rows = torchrun_job(HERE / "zero2_save_job.py")
    finally:
        if old is None:
            del os.environ["DS_ACCELERATOR"]
        else:
            os.environ["DS_ACCELERATOR"] = old
    if not all(r["hwm_reset"] for r in rows):
        pytest.skip("/proc/self/clear_refs is not writable here: no peak to measure")
    return rows


def _plan():  # type: ignore[no-untyped-def]
    sys.path.insert(0, str(HERE))
    from zero2_save_job import CONFIG

    spec = model_from_config({"model_type": "llama", **CONFIG}, name="tiny-llama", source=Path("<zero2_save_job>"))
    inputs = PlanInputs(
        model=spec,
        cluster=Cluster(1, 2, 80 * GIB, 1024 * GIB),
        training=Training(method="full", precision="bf16"),
        framework="hf",
        safetensors_version="0.8.0",
    )
    return plan_strategy(inputs, ZeroSettings(stage=2, offload_optimizer="cpu", pin_memory=True))


def test_every_rank_clones_the_16bit_model(measured):
    plan = _plan()
    item = next(i for i in plan.phase("save").host if i.name == "every rank: 16-bit state dict on CPU")
    assert len(measured) == 2
    for row in measured:
        assert row["total"] == plan.trainable_params
        assert row["clone_bytes"] * 2 == item.bytes  # per node: 2 local ranks


def test_offloaded_states_are_the_planned_bytes(measured):
    comps = {c.name: c.bytes for c in _plan().components if c.device == ms.HOST}
    for row in measured:
        assert abs(row["fp32_master_bytes"] - comps[ms.FP32_MASTER]) <= 64, row
        assert abs(row["adam_bytes"] - comps[ms.OPTIMIZER_STATES]) <= 64, row


def test_writing_host_state_adds_nothing(measured):
    plan = _plan()
    save_host = {i.name for i in plan.phase("save").host}
    assert "safetensors shard being written" not in save_host  # safetensors 0.8: no bytes copy
    assert not any(n.startswith("torch.save staging") for n in save_host)  # offloaded: host storages
    for row in measured:
        assert row["save_file_peak"] < 0.05 * row["clone_bytes"], row
        assert row["save_checkpoint_peak"] < 0.05 * row["clone_bytes"], row
