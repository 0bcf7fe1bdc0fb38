"""ZeRO-1/2 with offload_optimizer: each gradient's slice in the rank's partition is cast to fp64 on the GPU for its
norm while a bucket is reduced during backward (deepspeed stage_1_and_2.py copy_grads_in_partition). The plan
charges what that adds over the activation peak; the mechanism is checked in the installed DeepSpeed's source."""

from __future__ import annotations

import inspect

import pytest

from zerodoctor.models import resolve_model
from zerodoctor.plan.activations import ActivationEstimate
from zerodoctor.plan.inputs import GIB, Cluster, PlanInputs, Training, ZeroSettings
from zerodoctor.plan.phases import (
    NORM_BYTES,
    ZERO3_NORM_CHUNK,
    offload_norm_items,
    plan_strategy,
    zero3_offload_grad_items,
)

ITEM = "offload_optimizer: a gradient slice in fp64 for its norm"


def _act(saved: int, transient: int, peak: int) -> ActivationEstimate:
    """Activations whose backward moment holds `saved` bytes of layer tensors plus a `transient` recomputed layer."""
    return ActivationEstimate(
        per_layer_saved=0,
        layers=1,
        checkpointed_input=0,
        saved_total=saved,
        logits_and_loss=0,
        backward_transient=transient,
        peak=peak,
        in_backward=saved + transient,
    )


def test_only_what_the_backward_moment_adds_over_the_activation_peak_is_charged():
    # 4 GiB saved + 1 GiB recomputed layer + 2 GiB fp64 slice = 7 GiB during backward, over a 6 GiB peak
    (item,) = offload_norm_items(_act(4 * GIB, GIB, 6 * GIB), largest_trainable=GIB // 4, partition=10 * GIB)
    assert item.name == ITEM and item.bytes == GIB
    # a loss peak higher than the backward moment: nothing on top
    (item,) = offload_norm_items(_act(4 * GIB, GIB, 9 * GIB), largest_trainable=GIB // 4, partition=10 * GIB)
    assert item.bytes == 0


def test_the_heads_saved_tensors_are_not_counted_beside_the_backward_moment():
    # The head's log-probabilities are saved at the loss (saved_total) but freed by the head's backward, before any
    # decoder-layer gradient reaches a bucket: beside the slice is the backward moment (in_backward) only.
    act = ActivationEstimate(
        per_layer_saved=0,
        layers=1,
        checkpointed_input=0,
        saved_total=3 * GIB,  # 1 GiB of layers + 2 GiB of the head's log-probabilities
        logits_and_loss=0,
        backward_transient=GIB,
        peak=4 * GIB,  # the loss moment
        at_loss=4 * GIB,
        in_backward=2 * GIB,  # the layers + the recomputed layer
    )
    (item,) = offload_norm_items(act, largest_trainable=GIB // 8, partition=10 * GIB)  # a 1 GiB fp64 slice
    assert item.bytes == 0  # 2 + 1 GiB during backward stays under the 4 GiB loss peak


def test_a_lora_adapters_fp64_slice_adds_at_most_its_own_size():
    # Qwen-7B LoRA r8 on c_attn/c_proj under ZeRO-2 with the optimizer offloaded (ms-swift's lora_ddp_ds example):
    # an adapter's slice is rank x (at most the vocabulary's 151,936) elements, under 10 MB in fp64; the head's
    # 0.6 GiB of 16-bit log-probabilities, freed before the layers' backward, must not be charged beside it.
    inputs = PlanInputs(
        model=resolve_model("Qwen/Qwen-7B"),
        cluster=Cluster(1, 2, 24 * GIB, 256 * GIB),
        training=Training(
            method="lora",
            lora_rank=8,
            lora_targets=("c_attn", "c_proj"),
            precision="bf16",
            micro_batch=1,
            seq_len=2048,
            gradient_checkpointing=True,
            attn="eager",
        ),
        framework="hf",
    )
    plan = plan_strategy(inputs, ZeroSettings(stage=2, offload_optimizer="cpu"))
    steady = {i.name: i for i in plan.phase("steady").gpu}
    assert "1,215,488 elements x 8 B" in steady[ITEM].detail
    assert steady[ITEM].bytes <= 1_215_488 * NORM_BYTES


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
    assert ITEM not in _plan(ZeroSettings(stage=3, offload_optimizer="cpu"))  # ZeRO-3 has its own item


def test_the_installed_deepspeed_takes_the_norm_of_the_slice_in_the_norm_dtype():
    stage12 = pytest.importorskip("deepspeed.runtime.zero.stage_1_and_2")
    source = inspect.getsource(stage12.DeepSpeedZeroOptimizer.copy_grads_in_partition)
    assert ".to(get_norm_dtype()).norm(2)" in source
    assert "torch.double" in inspect.getsource(stage12.get_norm_dtype)


Z3_ITEM = "offload_optimizer: a gradient partition on the GPU for its fp64 norm and fp32 copy"


def test_zero3_offload_charges_one_partition_copy_plus_its_largest_cast():
    (item,) = zero3_offload_grad_items(_act(0, 0, 0), part=1000, pb=2)
    assert item.name == Z3_ITEM and item.bytes == 1000 * 2 + 1000 * NORM_BYTES
    # above 250M elements the fp64 norm goes in chunks: the fp32 cast of the whole partition can be the larger
    (item,) = zero3_offload_grad_items(_act(0, 0, 0), part=600_000_000, pb=2)
    assert item.bytes == 600_000_000 * 2 + max(ZERO3_NORM_CHUNK * NORM_BYTES, 600_000_000 * 4)
    (item,) = zero3_offload_grad_items(_act(GIB, 0, 10 * GIB), part=1000, pb=2)
    assert item.bytes == 0  # the loss peak is higher than the backward moment


def test_zero3_plans_the_item_only_with_optimizer_offload():
    assert Z3_ITEM in _plan(ZeroSettings(stage=3, offload_optimizer="cpu", offload_param="cpu"))
    assert Z3_ITEM not in _plan(ZeroSettings(stage=3))


def test_the_installed_deepspeed_moves_each_partition_to_the_gpu_before_offloading_it():
    stage3 = pytest.importorskip("deepspeed.runtime.zero.stage3")
    module = inspect.getsource(stage3)  # the method itself is wrapped by an instrumentation decorator
    start = module.index("    def partition_grads(")
    source = module[start : module.index("\n    def ", start + 1)]
    assert "grad_buffer.to(grad_partition.device" in source
    assert "_offload_grad_partition_at_boundary" in source
