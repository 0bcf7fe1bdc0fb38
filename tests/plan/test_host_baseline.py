"""The per-rank process baseline on the host: its size while the model loads, and once the process trains (the
published process-RSS readings of a training process with no model state on the host: PEFT README bloomz-7b1
LoRA, 3.8 GB; huggingface/peft#76, 4080 MiB)."""

from __future__ import annotations

from zerodoctor.models import resolve_model
from zerodoctor.plan.inputs import (
    GIB,
    Cluster,
    FsdpSettings,
    PlanInputs,
    Training,
    ZeroSettings,
    fsdp_as_zero,
)
from zerodoctor.plan.phases import (
    PER_RANK_HOST_BASELINE_BYTES,
    PER_RANK_TRAIN_HOST_BASELINE_BYTES,
    host_baseline,
    plan_strategy,
)


def _inputs(gpus: int = 4) -> PlanInputs:
    return PlanInputs(
        model=resolve_model("qwen2.5-7b-instruct"),
        cluster=Cluster(1, gpus, 80 * GIB, 512 * GIB),
        training=Training(method="lora", lora_rank=8, micro_batch=1, seq_len=512, attn="sdpa"),
        framework="hf",
    )


def _baseline(plan, phase: str) -> int:  # type: ignore[no-untyped-def]
    return next(i.bytes for i in plan.phase(phase).host if i.name == "process baseline")


def test_a_training_process_holds_more_than_a_loading_one_on_every_local_rank():
    inputs = _inputs(4)
    assert PER_RANK_HOST_BASELINE_BYTES < PER_RANK_TRAIN_HOST_BASELINE_BYTES
    assert host_baseline(inputs).bytes == 4 * PER_RANK_HOST_BASELINE_BYTES
    train = host_baseline(inputs, training=True)
    assert train.bytes == 4 * PER_RANK_TRAIN_HOST_BASELINE_BYTES
    assert train.detail == "4 ranks x 3.8 GiB (a training process)"


def test_zero_and_plain_runs_charge_the_load_baseline_at_load_and_the_training_one_after():
    inputs = _inputs(2)
    for zero in (ZeroSettings(stage=0), ZeroSettings(stage=3, offload_optimizer="cpu", offload_param="cpu")):
        plan = plan_strategy(inputs, zero)
        assert _baseline(plan, "load") == 2 * PER_RANK_HOST_BASELINE_BYTES
        for phase in ("first_step", "steady", "save"):
            assert _baseline(plan, phase) == 2 * PER_RANK_TRAIN_HOST_BASELINE_BYTES


def test_fsdp_plans_use_the_same_two_baselines():
    inputs = _inputs(2)
    plan = plan_strategy(inputs, fsdp_as_zero(FsdpSettings(offload_params=True)))
    assert _baseline(plan, "load") == 2 * PER_RANK_HOST_BASELINE_BYTES
    assert _baseline(plan, "steady") == 2 * PER_RANK_TRAIN_HOST_BASELINE_BYTES
