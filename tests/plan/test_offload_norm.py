"""ZeRO-1/2 with offload_optimizer: each gradient's slice in the rank's partition is cast to fp64 on the GPU for its
norm while a bucket is reduced during backward (deepspeed stage_1_and_2.py copy_grads_in_partition). The plan
charges what that adds over the activation peak; the mechanism is checked in the installed DeepSpeed's source."""

from __future__ import annotations

import inspect

import pytest

from zerodoctor.models import resolve_model
from zerodoctor.plan.activations import ActivationEstimate
from zerodoctor.plan.inputs import GIB, Cluster, PlanInputs, Training, ZeroSettings
from zerodoctor.plan.phases import NORM_BYTES, offload_norm_items, plan_strategy

ITEM = "offload_optimizer: a gradient slice in fp64 for its norm"


def _act(saved: int, transient: int, peak: int) -> ActivationEstimate:
    return ActivationEstimate(
        per_layer_saved=0,
        layers=1,
        checkpointed_input=0,
        saved_total=saved,
        logits_and_loss=0,
        backward_transient=transient,
        peak=peak,
    )


def test_only_what_the_backward_moment_adds_over_the_activation_peak_is_charged():
    # 4 GiB saved + 1 GiB recomputed layer + 2 GiB fp64 slice = 7 GiB during backward, over a 6 GiB peak
    (item,) = offload_norm_items(_act(4 * GIB, GIB, 6 * GIB), largest_trainable=GIB // 4, partition=10 * GIB)
    assert item.name == ITEM and item.bytes == GIB
    # a loss peak higher than the backward moment: nothing on top
    (item,) = offload_norm_items(_act(4 * GIB, GIB, 9 * GIB), largest_trainable=GIB // 4, partition=10 * GIB)
    assert item.bytes == 0


def test_the_slice_is_at_most_the_rank_partition():
    (item,) = offload_norm_items(_act(0, 0, 0), largest_trainable=1000, partition=300)
    assert item.bytes == 300 * NORM_BYTES


def _plan(zero: ZeroSettings):  # type: ignore[no-untyped-def]
    inputs = PlanInputs(
        model=resolve_model("yi-34b"),
        cluster=Cluster(1, 4, 80 * GIB, 1024 * GIB),
        training=Training(method="full", precision="fp16", micro_batch=1, seq_len=4096, attn="flash"),
        framework="deepspeed",
    )
    return {i.name: i for i in plan_strategy(inputs, zero).phase("steady").gpu}


def test_zero2_offload_charges_the_head_slice_and_other_strategies_do_not():
    steady = _plan(ZeroSettings(stage=2, offload_optimizer="cpu"))
    # Yi-34B's untied head, 64000 x 7168, lies in one rank's partition: 3.4 GiB in fp64
    assert "458,752,000 elements x 8 B" in steady[ITEM].detail
    assert steady[ITEM].bytes > 0
    assert ITEM not in _plan(ZeroSettings(stage=2))
    assert ITEM not in _plan(ZeroSettings(stage=3, offload_optimizer="cpu"))


def test_the_installed_deepspeed_takes_the_norm_of_the_slice_in_the_norm_dtype():
    stage12 = pytest.importorskip("deepspeed.runtime.zero.stage_1_and_2")
    source = inspect.getsource(stage12.DeepSpeedZeroOptimizer.copy_grads_in_partition)
    assert ".to(get_norm_dtype()).norm(2)" in source
    assert "torch.double" in inspect.getsource(stage12.get_norm_dtype)
