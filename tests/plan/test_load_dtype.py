"""The host at load for a DeepSpeed run whose model is not built under zero.Init (ZeRO-1/2, or ZeRO-3 without
zero.Init): transformers materialises every rank's whole model in the dtype it loads -- fp32 from transformers 4
without `torch_dtype` (dolly's trainer.py, databrickslabs/dolly#111), or what the run states -- and DeepSpeed casts it
to 16-bit only inside `deepspeed.initialize` (engine.py `_configure_distributed_model`, before `module.to(device)`),
before it builds any ZeRO state. Unit cases on the plan, and the real engine on 2 gloo ranks
(tests/plan/load_dtype_job.py)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from zerodoctor.models import resolve_model
from zerodoctor.plan.inputs import GIB, Cluster, PlanInputs, Training, ZeroSettings
from zerodoctor.plan.phases import plan_strategy

HERE = Path(__file__).resolve().parent
ITEM = "the model in its loaded dtype, before deepspeed.initialize casts it"
WHOLE = "whole model loaded per rank"


def _load(zero: ZeroSettings, transformers: str | None = None, **kw: object) -> tuple[dict[str, int], int]:
    model = resolve_model("pythia-2.8b")
    inputs = PlanInputs(
        model=model,
        cluster=Cluster(1, 2, 80 * GIB, 512 * GIB),
        training=Training(method="full", micro_batch=1, seq_len=512, **kw),  # type: ignore[arg-type]
        zero=zero,
        framework="hf",
        transformers_version=transformers,
        zero3_init=False,
    )
    return {i.name: i.bytes for i in plan_strategy(inputs, zero).phase("load").host}, model.params.total


def test_fp32_weights_are_on_the_host_whole_until_deepspeed_casts_them():
    items, total = _load(ZeroSettings(stage=3), weights_dtype="fp32")
    assert items[WHOLE] == 2 * total * 2  # the 16-bit model the engine moves to the GPU, as before
    assert items[WHOLE] + items[ITEM] == 2 * total * 4  # two local ranks, each with the whole fp32 model first
    items, _ = _load(ZeroSettings(stage=3), weights_dtype="bf16")
    assert ITEM not in items


def test_transformers_4_without_torch_dtype_loads_fp32_and_5_loads_the_checkpoint_dtype():
    items, total = _load(ZeroSettings(stage=3), transformers="4.25.1")
    assert items[WHOLE] + items[ITEM] == 2 * total * 4
    items, _ = _load(ZeroSettings(stage=3), transformers="5.23.0")
    assert ITEM not in items


def test_the_fp32_moment_adds_nothing_when_the_offloaded_states_built_later_are_larger():
    items, total = _load(ZeroSettings(stage=3, offload_optimizer="cpu", offload_param="cpu"), weights_dtype="fp32")
    assert items[ITEM] == 0  # the offloaded fp32 master and 16-bit buffers built later already exceed it
    assert sum(items.values()) > 2 * total * 4


@pytest.mark.engine
def test_the_real_engine_receives_fp32_weights_and_casts_them_to_bf16_itself():
    pytest.importorskip("deepspeed")
    sys.path.insert(0, str(HERE))
    from test_fsdp_engine import torchrun_job

    old = os.environ.get("DS_ACCELERATOR")
    os.environ["DS_ACCELERATOR"] = "cpu"
    try:
        ranks = torchrun_job(HERE / "load_dtype_job.py")
    finally:
        if old is None:
            os.environ.pop("DS_ACCELERATOR", None)
        else:
            os.environ["DS_ACCELERATOR"] = old
    assert len(ranks) == 2
    for rank in ranks:
        assert rank["dtypes_before"] == ["torch.float32"] and rank["bytes_before"] == rank["numel"] * 4
        assert rank["dtypes_after"] == ["torch.bfloat16"] and rank["bytes_after"] == rank["numel"] * 2
