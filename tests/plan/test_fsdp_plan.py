"""The FSDP strategy's items, each from torch / accelerate source (zerodoctor.plan.fsdp), and the CLI."""

from __future__ import annotations

import json
import textwrap
from dataclasses import replace

import pytest

from zerodoctor.models.spec import resolve_model
from zerodoctor.plan.fsdp import fsdp_states, gathered_numel, units
from zerodoctor.plan.inputs import GIB, Cluster, FsdpSettings, PlanInputs, Training, fsdp_as_zero
from zerodoctor.plan.phases import plan_strategy


def _inputs(method: str = "full", gpus: int = 8, **kw: object) -> PlanInputs:
    return PlanInputs(
        model=resolve_model("llama-3.1-8b"),
        cluster=Cluster(1, gpus, 80 * GIB, 1024 * GIB),
        training=Training(method=method, seq_len=4096, **kw),  # type: ignore[arg-type]
        framework="accelerate",
    )


def _names(phase) -> dict[str, int]:
    return {i.name: i.bytes for i in phase.gpu}


def test_full_shard_states_are_fp32_shards_of_padded_units():
    inputs = _inputs()
    p = inputs.model.params
    layer, n_layers, head, embed = units(inputs, FsdpSettings())
    assert (layer * n_layers + head + embed, embed) == (p.total, 0)  # FSDP1: embeddings are in the root
    st = fsdp_states(inputs, FsdpSettings(), inputs.training)
    shard = -(-layer // 8) * n_layers + -(-head // 8)
    assert (st.params, st.grads, st.optimizer) == (4 * shard, 4 * shard, 8 * -(-p.total // 8))


def test_fsdp1_root_stays_gathered_and_holds_the_output_gradient():
    inputs = _inputs()
    plan = plan_strategy(inputs, fsdp_as_zero(FsdpSettings(backward_prefetch="backward_pre")))
    steady = _names(plan.phase("steady"))
    p = inputs.model.params
    layer, _, head, _ = units(inputs, FsdpSettings())
    assert gathered_numel(inputs, FsdpSettings(backward_prefetch="backward_pre"))[0] == head + 2 * layer
    assert gathered_numel(inputs, FsdpSettings())[0] == head + layer
    assert steady["root unit: output-layer gradient held through backward"] == p.lm_head * 2
    assert "FSDP sharded parameters" in steady and "optimizer states" in steady
    # FSDP2: tail unit instead of root, reduce-scattered right after its backward
    v2 = plan_strategy(inputs, fsdp_as_zero(FsdpSettings(version=2, backward_prefetch="backward_pre")))
    assert "root unit: output-layer gradient held through backward" not in _names(v2.phase("steady"))
    # shard_grad_op keeps every unit gathered after forward: the whole 16-bit model
    sgo = FsdpSettings(sharding="shard_grad_op")
    assert gathered_numel(inputs, sgo)[0] == p.total
    assert fsdp_as_zero(sgo).stage == 2


def test_cpu_offload_moves_states_to_pinned_host_blocks():
    inputs = _inputs()
    on = plan_strategy(inputs, fsdp_as_zero(FsdpSettings(offload_params=True)))
    off = plan_strategy(inputs, fsdp_as_zero(FsdpSettings()))
    assert "FSDP sharded parameters" not in _names(on.phase("steady"))
    assert on.gpu_peak()[0] < off.gpu_peak()[0]
    host = {i.name: i.bytes for i in on.phase("steady").host}
    st = fsdp_states(inputs, FsdpSettings(offload_params=True), inputs.training)
    per_node = host["offloaded: FSDP sharded parameters"]
    assert per_node >= st.params * 8  # pinned blocks round up to powers of two, per unit
    assert host["offloaded: optimizer states"] == st.optimizer * 8
    assert on.zero.offload_rank == 2 and on.zero.label == "FSDP1 full_shard + CPU offload"


def test_save_full_state_dict_vs_sharded():
    inputs = _inputs()
    full = plan_strategy(inputs, fsdp_as_zero(FsdpSettings(state_dict_type="full")))
    sharded = plan_strategy(inputs, fsdp_as_zero(FsdpSettings(state_dict_type="sharded")))
    p = inputs.model.params
    host_full = {i.name: i.bytes for i in full.phase("save").host}
    # model then optimizer, one after the other: rank 0 holds the larger, the AdamW states (8 B x P)
    assert host_full["rank 0: full optimizer state dict on the host"] == 8 * p.total
    assert "FULL_STATE_DICT unshard (rank 0)" in _names(full.phase("save"))
    # one node holds all 8 shards: as much as rank 0's full optimizer state dict
    assert full.phase("save").host_bytes == sharded.phase("save").host_bytes
    assert full.checkpoint.weights_bytes == 4 * p.total  # fp32 weights: accelerate upcast them
    only = plan_strategy(
        replace(inputs, training=replace(inputs.training, save_only_model=True)),
        fsdp_as_zero(FsdpSettings(state_dict_type="full")),
    )
    assert "rank 0: full state dict on the host" in {i.name for i in only.phase("save").host}


def test_lora_units_upcast_only_with_use_orig_params():
    inputs = _inputs("lora")
    mixed = fsdp_states(inputs, FsdpSettings(use_orig_params=True), inputs.training)
    peft_wrap = fsdp_states(inputs, FsdpSettings(use_orig_params=False), inputs.training)
    v2 = fsdp_states(inputs, FsdpSettings(version=2), inputs.training)
    assert mixed.upcast_frozen and not peft_wrap.upcast_frozen and not v2.upcast_frozen
    assert mixed.params > 1.8 * peft_wrap.params  # decoder layers in fp32 instead of bf16
    assert mixed.grads > 100 * peft_wrap.grads  # whole-unit flat gradients vs adapter gradients
    assert peft_wrap.optimizer == mixed.optimizer  # AdamW only sees the adapters either way


def test_qlora_gathers_packed_units_and_dequantises():
    inputs = _inputs("qlora", quant_storage="bfloat16")
    plan = plan_strategy(inputs, fsdp_as_zero(FsdpSettings(use_orig_params=False)))
    steady = _names(plan.phase("steady"))
    assert "bnb dequantised weight" in steady
    lora = plan_strategy(_inputs("lora"), fsdp_as_zero(FsdpSettings(use_orig_params=False)))
    assert (
        steady["FSDP gathered units (working set)"]
        < _names(lora.phase("steady"))["FSDP gathered units (working set)"]
    )


FSDP_YAML = """\
distributed_type: FSDP
fsdp_config:
  fsdp_offload_params: false
  fsdp_sharding_strategy: FULL_SHARD
  fsdp_state_dict_type: FULL_STATE_DICT
mixed_precision: bf16
num_processes: 8
"""


def test_cli_plans_an_accelerate_fsdp_config(tmp_path, run_cli):
    cfg = tmp_path / "fsdp.yaml"
    cfg.write_text(textwrap.dedent(FSDP_YAML))
    args = [
        str(cfg),
        "--model",
        "llama-3.1-70b",
        "--gpus-per-node",
        "8",
        "--gpu-memory",
        "80",
        "--host-ram",
        "2048",
    ]
    code, out, _ = run_cli("plan", *args)
    assert code == 1  # a full fine-tune of 70B on 8 GPUs does not fit without offload
    assert "FSDP1 full_shard needs" in out and "fsdp_offload_params" in out
    code, out, _ = run_cli("plan", *args, "--format", "json")
    data = json.loads(out)
    assert data["yours"]["name"] == "yours: FSDP1 full_shard [full]"
    assert data["yours"]["strategy"] == "fsdp" and data["yours"]["fsdp"]["version"] == 1
    names = {c["name"] for c in data["strategies"]}
    assert any(n.startswith("FSDP1 full_shard + CPU offload") for n in names)
    assert any(n.startswith("ZeRO-3") for n in names)


def test_emit_refuses_an_fsdp_strategy(tmp_path):
    from zerodoctor.errors import PlanError
    from zerodoctor.plan.emit import ds_config

    inputs = _inputs()
    plan = plan_strategy(inputs, fsdp_as_zero(FsdpSettings()))
    with pytest.raises(PlanError, match="FSDP strategy, not a DeepSpeed one"):
        ds_config(inputs, plan)


def test_fsdp1_offload_pins_a_gradient_for_frozen_units_and_holds_three_copies_at_lazy_init():
    """torch _flat_param.py init_flat_param_attributes: every FlatParameter with offload_params gets a pinned copy
    of its shard AND a pinned `_cpu_grad` of the same size, frozen (QLoRA base) units included; the pageable shard
    from wrap time stays the FlatParameter's data until the unit's first forward."""
    inputs = replace(_inputs("qlora", gpus=2), model=resolve_model("llama-2-70b"))
    t = replace(inputs.training, quant_storage="bfloat16", lora_rank=8)
    f1 = FsdpSettings(offload_params=True, use_orig_params=False, cpu_ram_efficient_loading=True)
    plan = plan_strategy(inputs, fsdp_as_zero(f1), t)
    steady = {i.name: i.bytes for i in plan.phase("steady").host}
    assert steady["offloaded: FSDP sharded gradients"] == steady["offloaded: FSDP sharded parameters"]
    st = fsdp_states(inputs, f1, t)
    assert st.grads < st.params / 50  # the trainable (adapter) gradients alone are tiny
    load = {i.name: i.bytes for i in plan.phase("load").host}
    assert load["FSDP lazy init: pageable shards (until each unit's first forward)"] == st.params * 2
    assert plan.phase("load").host_bytes > plan.phase("steady").host_bytes
    save = {i.name for i in plan.phase("save").host}
    assert "offloaded: FSDP sharded gradients" in save  # an attribute of the FlatParameter: never freed
    # FSDP2 moves only the reduce-scattered gradients of trainable parameters to the host
    f2 = replace(f1, version=2)
    v2 = {i.name: i.bytes for i in plan_strategy(inputs, fsdp_as_zero(f2), t).phase("steady").host}
    assert v2["offloaded: FSDP sharded gradients"] < v2["offloaded: FSDP sharded parameters"] / 50


def test_the_loading_rank_holds_one_checkpoint_shard_next_to_the_model():
    """transformers reads one shard's state dict at a time into the model it fills: with
    cpu_ram_efficient_loading only local rank 0 does, otherwise every rank."""
    from zerodoctor.plan.phases import LOAD_SHARD_BYTES

    inputs = _inputs(gpus=2)
    for efficient, loaders in ((True, 1), (False, 2)):
        f = FsdpSettings(cpu_ram_efficient_loading=efficient)
        load = {i.name: i.bytes for i in plan_strategy(inputs, fsdp_as_zero(f)).phase("load").host}
        assert load["checkpoint shard being read"] == LOAD_SHARD_BYTES * loaders


def test_qlora_replicated_weights_finding_is_zero3s_not_fsdps():
    """PLAN004 is about ZeRO-3 not partitioning uint8 4-bit weights; an FSDP run reports stage 3 for the grid but
    is not that failure (its message quoted the framework reserve as the 'whole model')."""
    from zerodoctor.plan.candidates import plan

    base = _inputs("qlora", gpus=2)
    fsdp = replace(base, zero=fsdp_as_zero(FsdpSettings(offload_params=True)))
    assert "PLAN004" not in {f.id for f in plan(fsdp).findings}
    zero3 = replace(base, zero=replace(fsdp_as_zero(FsdpSettings()), fsdp=None))
    found = [f for f in plan(zero3).findings if f.id == "PLAN004"]
    assert found and "Llama" in found[0].message


def test_pure_16bit_fsdp_keeps_no_fp32_master() -> None:
    """llama-recipes `--pure_bf16` (model.to(bf16), FSDP without MixedPrecision, torch AdamW): states at 2 B per
    element for the shards and gradients and 2 x 2 B for AdamW, named as such; the mixed-precision default keeps
    accelerate's fp32 upcast (4 + 4 + 8 B)."""
    from zerodoctor.models import resolve_model
    from zerodoctor.plan.fsdp import fsdp_states
    from zerodoctor.plan.inputs import GIB, Cluster, FsdpSettings, PlanInputs, Training, fsdp_as_zero
    from zerodoctor.plan.phases import plan_strategy

    t = Training(method="full", precision="bf16", weights_dtype="bf16", pure_bf16=True)
    inputs = PlanInputs(model=resolve_model("llama-2-7b"), cluster=Cluster(1, 4, 40 * GIB, 512 * GIB), training=t)
    f = FsdpSettings()
    pure, mixed = fsdp_states(inputs, f, t), fsdp_states(inputs, f, Training(method="full", precision="bf16"))
    assert (2 * pure.params, 2 * pure.grads, 2 * pure.optimizer) == (mixed.params, mixed.grads, mixed.optimizer)
    steady = plan_strategy(inputs, fsdp_as_zero(f)).phase("steady")
    shards = next(i for i in steady.gpu if i.name == "FSDP sharded parameters")
    assert "x 2 B" in shards.detail and "no fp32 master" in shards.detail
    # an fp32 run is never "pure 16-bit"
    fp32 = Training(method="full", precision="fp32", pure_bf16=True)
    assert fsdp_states(inputs, f, fp32).params == mixed.params


def test_gradient_accumulation_under_no_sync_holds_the_whole_unsharded_gradient() -> None:
    """accelerate / HF Trainer run every micro-batch but the last under FSDP's no_sync: at the last one's backward
    each rank holds the whole model's gradient in bf16 (tests/plan/test_fsdp_engine.py measures it) instead of its
    fp32 shards (zero_grad set them to None). Not with one micro-batch a step, one shard, or a framework that syncs
    every micro-batch."""
    name = "FSDP no_sync: unsharded gradients of the accumulation"
    p = _inputs().model.params
    acc = _names(plan_strategy(_inputs(grad_accum=4), fsdp_as_zero(FsdpSettings())).phase("steady"))
    one = _names(plan_strategy(_inputs(grad_accum=1), fsdp_as_zero(FsdpSettings())).phase("steady"))
    assert acc[name] == p.total * 2
    assert "FSDP sharded gradients" not in acc and "FSDP sharded gradients" in one and name not in one
    # the root's output-layer gradient is inside the accumulated whole, not charged twice
    assert "root unit: output-layer gradient held through backward" not in acc
    # CPU offload: no_sync keeps them on the GPU (FullyShardedDataParallel.no_sync), though the shards live on the host
    off = _names(plan_strategy(_inputs(grad_accum=4), fsdp_as_zero(FsdpSettings(offload_params=True))).phase("steady"))
    assert off[name] == p.total * 2
    single = _inputs(grad_accum=4, gpus=1)  # FSDP1 on one GPU switches to NO_SHARD: the gradient is whole anyway
    assert name not in _names(plan_strategy(single, fsdp_as_zero(FsdpSettings())).phase("steady"))
    torchtune = replace(_inputs(grad_accum=4), framework="torchtune")
    assert name not in _names(plan_strategy(torchtune, fsdp_as_zero(FsdpSettings())).phase("steady"))
    # LoRA with PEFT's wrap policy (use_orig_params=False): only the adapters' gradients stay unsharded
    lora = _inputs("lora", grad_accum=4)
    st = fsdp_states(lora, FsdpSettings(use_orig_params=False), lora.training)
    steady = _names(plan_strategy(lora, fsdp_as_zero(FsdpSettings(use_orig_params=False))).phase("steady"))
    assert steady[name] == st.grad_numel * 2 < p.total // 100
