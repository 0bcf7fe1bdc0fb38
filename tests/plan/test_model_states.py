"""Model-state arithmetic against hand calculations (memory.md §11, §14; failures.md A3, A5).

The engine itself is checked in test_model_states_engine.py and benchmarks/plan_accuracy.py; these
tests hold the formulas to the byte counts a reader can redo on paper.
"""

from __future__ import annotations

import pytest

from zerodoctor.errors import PlanError
from zerodoctor.models.spec import resolve_model
from zerodoctor.plan.model_states import (
    Component,
    model_state_components,
    pinned_bytes,
    totals,
)

B = 1_000_000_000


def by_name(components: list[Component]) -> dict[str, Component]:
    names = [c.name for c in components]
    return {(c.name if names.count(c.name) == 1 else f"{c.name}@{c.device}"): c for c in components}


def test_zero3_both_offloads_host_is_20_bytes_per_trainable_param_per_rank():
    # memory.md §11.2: 2 (bf16 partition) + 2 (grad partition) + 4 (fp32 master) + 4 (fp32 grad) + 8 (Adam)
    comps = model_state_components(
        trainable=8 * B, frozen=0, stage=3, world_size=8, offload_optimizer="cpu", offload_param="cpu"
    )
    t = totals(comps, after_first_step=True)
    assert t["host"] == 20 * B
    assert t["gpu"] == 500_000_000 * 2  # only the IPG bucket: reduce_bucket_size x bf16
    # before the first step the Adam moments do not exist yet
    assert totals(comps, after_first_step=False)["host"] == 12 * B
    c = by_name(comps)
    assert c["param16"].pinned  # pinned unconditionally (_create_param_groups_fp16_flat_cpu_memory)
    assert c["grad16"].pinned and c["fp32_grad"].pinned and not c["fp32_master"].pinned
    assert c["optimizer_states"].lazy and c["optimizer_states"].bytes == 8 * B


def test_zero3_optimizer_offload_host_18_gpu_2_bytes_per_param():
    comps = model_state_components(
        trainable=8 * B, frozen=0, stage=3, world_size=8, offload_optimizer="cpu", reduce_bucket_size=0
    )
    t = totals(comps, after_first_step=True)
    assert t["host"] == 18 * B and t["gpu"] == 2 * B


def test_zero3_no_offload_16_bytes_plus_step_transients():
    comps = model_state_components(
        trainable=8 * B, frozen=0, stage=3, world_size=8, sub_group_size=B // 4, reduce_bucket_size=0
    )
    c = by_name(comps)
    assert c["fp32_grad"].transient and c["fp32_grad"].bytes == 4 * B // 4
    assert c["grad_flat_copy"].transient and c["grad_flat_copy"].bytes == 2 * B // 4
    assert totals(comps, after_first_step=False)["gpu"] == 8 * B  # 2 + 2 + 4 per param, / 8 ranks
    assert totals(comps, after_first_step=True)["gpu"] == 16 * B + 6 * B // 4


def test_zero3_pin_memory_false_still_pins_the_16bit_param_buffer():
    comps = model_state_components(
        trainable=8 * B,
        frozen=8 * B,
        stage=3,
        world_size=8,
        offload_optimizer="cpu",
        offload_param="cpu",
        pin_memory=False,
    )
    c = by_name(comps)
    assert c["param16"].pinned
    assert not c["frozen16"].pinned and not c["grad16"].pinned and not c["fp32_grad"].pinned


def test_zero2_no_offload_matches_deepspeed_estimator_2p_plus_18p_over_n():
    p, n = 7 * B, 8
    comps = model_state_components(trainable=p, frozen=0, stage=2, world_size=n, reduce_bucket_size=0)
    gpu = sum(c.bytes for c in comps if c.name != "grad_flat_copy")
    # stage_1_and_2.py::estimate_zero2_model_states_mem_needs: 2P + 18P/G
    assert gpu == 2 * p + 18 * p // n


def test_zero2_offload_buffers():
    comps = model_state_components(
        trainable=7 * B,
        frozen=0,
        stage=2,
        world_size=8,
        offload_optimizer="cpu",
        largest_param_numel=525_336_576,
        reduce_bucket_size=0,
    )
    c = by_name(comps)
    assert c["param16"].device == "gpu" and c["param16"].bytes == 14 * B  # the whole model on every rank
    assert c["fp32_master"].device == "host" and c["fp32_master"].pinned
    assert c["param16_staging"].bytes == 2 * 7 * B // 8 and c["param16_staging"].pinned
    assert c["grad_staging@gpu"].bytes == c["grad_staging@host"].bytes == 2 * 525_336_576
    assert "grad16" not in c  # GAS 1: gradients go straight into the fp32 host buffer
    with_gas = by_name(
        model_state_components(
            trainable=7 * B,
            frozen=0,
            stage=2,
            world_size=8,
            offload_optimizer="cpu",
            gradient_accumulation_steps=4,
        )
    )
    assert with_gas["grad16"].device == "host" and with_gas["grad16"].bytes == 2 * 7 * B // 8


def test_zero2_old_deepspeed_pins_master_unconditionally_and_has_no_staging_copy():
    comps = by_name(
        model_state_components(
            trainable=B,
            frozen=0,
            stage=2,
            world_size=2,
            offload_optimizer="cpu",
            pin_memory=False,
            deepspeed_version="0.16.5",
        )
    )
    assert comps["fp32_master"].pinned and "param16_staging" not in comps
    new = by_name(
        model_state_components(
            trainable=B,
            frozen=0,
            stage=2,
            world_size=2,
            offload_optimizer="cpu",
            pin_memory=False,
            deepspeed_version="0.19.8",
        )
    )
    assert not new["fp32_master"].pinned and "param16_staging" in new


def test_overlap_comm_doubles_the_zero2_bucket_only():
    z2 = by_name(model_state_components(trainable=B, frozen=0, stage=2, world_size=2, overlap_comm=True))
    z3 = by_name(model_state_components(trainable=B, frozen=0, stage=3, world_size=2, overlap_comm=True))
    assert z2["ipg_bucket"].bytes == 2 * z3["ipg_bucket"].bytes == 2 * 500_000_000 * 2


def test_lora_frozen_and_trainable_split():
    spec = resolve_model("llama-3.1-8b")
    lora = spec.lora_params(16)
    frozen = spec.params.total
    z3 = by_name(
        model_state_components(
            trainable=lora, frozen=frozen, stage=3, world_size=8, offload_optimizer="cpu", offload_param="cpu"
        )
    )
    assert z3["frozen16"].bytes == 2 * -(-frozen // 8) and z3["frozen16"].device == "host"
    assert z3["frozen16"].pinned
    assert z3["optimizer_states"].bytes == 8 * -(-lora // 8)
    z2 = by_name(model_state_components(trainable=lora, frozen=frozen, stage=2, world_size=8))
    assert z2["frozen16"].bytes == 2 * frozen and z2["frozen16"].device == "gpu"  # ZeRO-2 never shards it


def test_qlora_frozen_is_4bit_and_replicated_without_quant_storage():
    frozen = 8 * B
    comps = by_name(
        model_state_components(
            trainable=40_000_000,
            frozen=frozen,
            stage=3,
            world_size=8,
            frozen_bytes_per_param=0.5,
            frozen_partitioned=False,
        )
    )
    assert comps["frozen16"].bytes == 4 * B and comps["frozen16"].device == "gpu"
    sharded = by_name(
        model_state_components(
            trainable=40_000_000, frozen=frozen, stage=3, world_size=8, frozen_bytes_per_param=0.5
        )
    )
    assert sharded["frozen16"].bytes == 4 * B // 8


def test_deepseek_236b_48_gpus_no_offload_first_step_exceeds_80gb():
    # failures.md A5: OOM in the first optimizer step, inside AdamW's lazy zeros_like.
    p = resolve_model("deepseek-coder-v2-instruct").params.trainable
    comps = model_state_components(trainable=p, frozen=0, stage=3, world_size=48)
    per_rank = -(-p // 48)
    before = totals(comps, after_first_step=False)["gpu"]
    after = totals(comps, after_first_step=True)["gpu"]
    assert before == 8 * per_rank + 500_000_000 * 2
    assert after == 16 * per_rank + 6 * B + 500_000_000 * 2  # + fp32 grad and flatten copy of one sub-group
    assert before < 80e9 < after
    # The reported failed allocation (3.39 GiB) is one Adam moment of a ~1e9-element sub-group.
    assert 4 * 0.9e9 / 2**30 < 3.39 < 4 * B / 2**30


def test_yi_34b_both_offloads_per_node_host():
    p = resolve_model("yi-34b").params.trainable
    comps = model_state_components(
        trainable=p, frozen=0, stage=3, world_size=8, offload_optimizer="cpu", offload_param="cpu"
    )
    node = 8 * totals(comps, after_first_step=True)["host"]
    assert node == 8 * 20 * -(-p // 8)  # ≈ 688 GB (failures.md A3 says 18 B/param ≈ 620 GB: no grad16)
    assert 687e9 < node < 689e9


def test_fp32_training_zero3_master_aliases_param_partition():
    comps = by_name(model_state_components(trainable=B, frozen=0, stage=3, world_size=1, param_bytes=4))
    assert "fp32_master" not in comps and comps["param16"].bytes == 4 * B


def test_exact_layout_from_param_numels():
    numels = [1000, 3, 7, 2048]
    z3 = by_name(
        model_state_components(trainable=sum(numels), frozen=0, stage=3, world_size=4, param_numels=numels)
    )
    assert z3["param16"].bytes == 2 * (250 + 1 + 2 + 512)  # each tensor padded to a multiple of 4
    z2 = by_name(
        model_state_components(trainable=sum(numels), frozen=0, stage=2, world_size=2, param_numels=numels)
    )
    assert z2["param16"].bytes == 2 * 3060  # flat group padded to a multiple of 2 x 2
    # partition 0 = [0, 1530): params 0..2 and the first part of param 3, counted whole
    assert z2["grad16"].bytes == 2 * sum(numels)


def test_optimizers():
    sgd = by_name(model_state_components(trainable=B, frozen=0, stage=3, world_size=1, optimizer="sgd"))
    assert sgd["optimizer_states"].bytes == 4 * B
    bnb = by_name(
        model_state_components(trainable=B, frozen=0, stage=3, world_size=1, optimizer="adamw_8bit")
    )
    assert bnb["optimizer_states"].bytes == int(2.03125 * B)


def test_nvme_offload_puts_states_on_nvme_with_pinned_swap_buffers():
    comps = model_state_components(
        trainable=8 * B, frozen=0, stage=3, world_size=8, offload_optimizer="nvme", offload_param="nvme"
    )
    t = totals(comps, after_first_step=True)
    assert t["nvme"] == (2 + 4 + 4 + 8) * B
    swaps = [c for c in comps if c.name == "swap_buffer"]
    assert all(c.pinned and c.device == "host" for c in swaps)
    assert sum(c.bytes for c in swaps) == 4 * B * 4 + 5 * 100_000_000 * 2


def test_pinned_bytes_rounds_to_power_of_two():
    assert pinned_bytes(0) == 0
    assert pinned_bytes(1) == 1
    assert pinned_bytes(4096) == 4096
    assert pinned_bytes(4097) == 8192
    assert pinned_bytes(int(20.4 * 2**30)) == 32 * 2**30  # sglang PR #36562 (memory.md §11.4)
    assert pinned_bytes(int(20.4 * 2**30), max_round_threshold=2**30) == int(20.4 * 2**30)
    comps = model_state_components(
        trainable=8 * B, frozen=0, stage=3, world_size=8, offload_optimizer="cpu", offload_param="cpu"
    )
    t = totals(comps, after_first_step=True)
    assert t["host_pinned"] == (2 + 2 + 4) * B
    assert t["host_pinned_rounded"] == 2 * pinned_bytes(2 * B) + pinned_bytes(4 * B)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"stage": 4},
        {"world_size": 0},
        {"offload_optimizer": "gpu"},
        {"stage": 2, "offload_optimizer": "nvme"},
        {"stage": 0, "offload_optimizer": "cpu"},
        {"optimizer": "lion"},
        {"param_bytes": 1},
    ],
)
def test_invalid_inputs_raise_plan_error(kwargs):
    args = {"trainable": B, "frozen": 0, "stage": 3, "world_size": 2, **kwargs}
    with pytest.raises(PlanError):
        model_state_components(**args)
