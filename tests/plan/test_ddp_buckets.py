"""DistributedDataParallel's gradient buckets in a multi-GPU run without DeepSpeed or FSDP: the reducer keeps one
more flat copy of every trainable gradient (torch/csrc/distributed/c10d/reducer.cpp `initialize_buckets`), beside
`param.grad` while `gradient_as_bucket_view` is off (the HF Trainer / accelerate default). Unit cases on the plan,
and the real reducer on 2 gloo ranks (tests/plan/ddp_job.py, PEFT LoRA adapters on a tiny Llama)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from zerodoctor.models import resolve_model
from zerodoctor.models.spec import model_from_config
from zerodoctor.plan.inputs import GIB, Cluster, PlanInputs, Training, ZeroSettings
from zerodoctor.plan.phases import ddp_bucket_items, plan_strategy, trainable_frozen

HERE = Path(__file__).resolve().parent
ITEM = "DDP gradient buckets"


def _plan(gpus: int, method: str = "lora", **kw: object):  # type: ignore[no-untyped-def]
    inputs = PlanInputs(
        model=resolve_model("qwen2.5-7b-instruct"),
        cluster=Cluster(1, gpus, 80 * GIB, 512 * GIB),
        training=Training(method=method, lora_rank=8, micro_batch=1, seq_len=256, attn="sdpa", **kw),  # type: ignore[arg-type]
        framework="hf",
    )
    return inputs, plan_strategy(inputs, ZeroSettings(stage=0))


def _items(plan, phase: str) -> dict[str, int]:  # type: ignore[no-untyped-def]
    return {i.name: i.bytes for i in plan.phase(phase).gpu}


def test_two_ranks_charge_one_more_copy_of_the_trainable_gradients_from_the_first_step():
    inputs, plan = _plan(2)
    trainable, _ = trainable_frozen(inputs, inputs.training)
    for phase in ("first_step", "steady", "save"):
        assert _items(plan, phase)[ITEM] == trainable * 4  # PEFT adapters are fp32, so are their gradients
    assert ITEM not in _items(plan, "load")  # the wrap happens when training starts


def test_a_full_fine_tune_in_bf16_holds_a_bucket_copy_of_the_whole_model():
    inputs, plan = _plan(2, method="full", weights_dtype="bf16")
    assert _items(plan, "steady")[ITEM] == inputs.model.params.total * 2


def test_one_rank_and_deepspeed_runs_have_no_ddp_buckets():
    _, single = _plan(1)
    assert ITEM not in _items(single, "steady")
    inputs, _ = _plan(2)
    deepspeed = plan_strategy(inputs, ZeroSettings(stage=2))
    assert ITEM not in {i.name for i in deepspeed.phase("steady").gpu}
    assert ddp_bucket_items(0, 2, 8) == []


@pytest.mark.engine
def test_the_real_reducer_buckets_every_trainable_gradient_once_beside_param_grad():
    pytest.importorskip("peft")
    sys.path.insert(0, str(HERE))
    from fsdp_job import CONFIG
    from fsdp_lora_job import LORA_RANK, TARGETS
    from test_fsdp_engine import torchrun_job

    ranks = torchrun_job(HERE / "ddp_job.py")
    assert len(ranks) == 2
    spec = model_from_config({"model_type": "llama", **CONFIG}, name="tiny-llama", source=Path("<ddp_job>"))
    t = Training(method="lora", lora_rank=LORA_RANK, lora_targets=tuple(TARGETS), precision="bf16")
    inputs = PlanInputs(model=spec, cluster=Cluster(1, 2, 80 * GIB, 64 * GIB), training=t, framework="hf")
    planned = _items(plan_strategy(inputs, ZeroSettings(stage=0)), "steady")[ITEM]
    for rank in ranks:
        assert rank["gradient_as_bucket_view"] is False
        assert rank["trainable_numel"] == spec.lora_params(LORA_RANK, tuple(TARGETS))
        # the buckets hold exactly the fp32 trainable gradients, a second copy next to param.grad
        assert sum(rank["bucket_bytes"]) == rank["grad_bytes"] == planned
