"""Issue 9 items of a real run beyond model states, each named in the phase breakdown with its source."""

from __future__ import annotations

from dataclasses import replace

import pytest

from zerodoctor.models import resolve_model
from zerodoctor.plan.activations import activation_bytes
from zerodoctor.plan.inputs import GIB, Cluster, PlanInputs, Training, ZeroSettings
from zerodoctor.plan.phases import ALLOCATOR_SLACK_BYTES, plan_strategy


def _inputs(model="llama-3.1-8b", gpus=8, **training):
    return PlanInputs(
        model=resolve_model(model),
        cluster=Cluster(nodes=1, gpus_per_node=gpus, gpu_memory_bytes=80 * GIB, host_ram_bytes=1024 * GIB),
        training=Training(**training),
        framework="hf",
    )


def _item(plan, phase, name):
    return next((i for i in plan.phase(phase).gpu if i.name == name), None)


def test_qlora_dequantises_a_quantised_linear_never_the_unquantised_lm_head():
    i = _inputs(method="qlora", quant_storage="bfloat16")
    item = _item(plan_strategy(i, ZeroSettings(stage=3)), "steady", "bnb dequantised weight")
    assert "lm_head" not in item.detail.split(" dequantised")[0]
    assert item.bytes == 4096 * 14336 * 2  # an MLP projection of Llama-3.1-8B, in bf16
    assert item.source


def test_model_not_built_under_zero_init_lands_whole_on_every_gpu():
    i = _inputs()
    with_init = plan_strategy(i, ZeroSettings(stage=3))
    without = plan_strategy(replace(i, zero3_init=False), ZeroSettings(stage=3))
    item = _item(without, "load", "whole 16-bit model on every GPU at deepspeed.initialize")
    assert item.bytes == i.model.params.total * 2
    assert _item(with_init, "load", item.name) is None


def test_adamw_temporary_is_one_sub_group_under_zero3_and_the_partition_under_zero2():
    i = _inputs()
    total = i.model.params.total
    z3 = _item(
        plan_strategy(i, ZeroSettings(stage=3, sub_group_size=10**8)), "first_step", "AdamW update temporary"
    )
    assert z3.bytes == 10**8 * 4
    z2 = _item(plan_strategy(i, ZeroSettings(stage=2)), "first_step", "AdamW update temporary")
    assert z2.bytes == -(-total // 8) * 4
    offl = plan_strategy(i, ZeroSettings(stage=3, offload_optimizer="cpu"))
    assert _item(offl, "first_step", "AdamW update temporary") is None  # DeepSpeedCPUAdam on the host


def test_zero3_working_set_and_full_gradient_are_named_with_sources():
    p = plan_strategy(_inputs(), ZeroSettings(stage=3, offload_optimizer="cpu", offload_param="cpu"))
    ws = _item(p, "steady", "ZeRO-3 fetched parameters (working set)")
    # max_live (1e9) + the parameter the prefetch loop adds last (the 128256 x 4096 head)
    assert ws.bytes == (10**9 + 128256 * 4096) * 2 and "partitioned_param_coordinator.py" in ws.source
    grad = _item(p, "steady", "full-size gradient before reduce-scatter")
    assert grad.bytes == 128256 * 4096 * 2  # the embedding's whole bf16 gradient
    names = {i.name for i in p.phase("steady").gpu}
    assert {"CUDA context", "NCCL buffers", "allocator reserved but unallocated"} <= names


def test_single_gpu_has_no_nccl_buffers_and_expandable_segments_cut_slack():
    i = _inputs(gpus=1)
    p = plan_strategy(i, ZeroSettings(stage=0))
    assert _item(p, "steady", "NCCL buffers") is None
    q = plan_strategy(replace(i, expandable_segments=True), ZeroSettings(stage=0))
    slack = "allocator reserved but unallocated"
    assert _item(q, "steady", slack).bytes < _item(p, "steady", slack).bytes


def test_zero_stages_get_the_simulated_allocator_gap_per_phase():
    # plan/allocator.py replays the run's allocation sequence; stage 0 (no DeepSpeed) keeps the fixed estimate
    p = plan_strategy(_inputs(), ZeroSettings(stage=3))
    slack = "allocator reserved but unallocated"
    items = {ph: _item(p, ph, slack) for ph in ("load", "first_step", "steady", "save")}
    assert all("simulated (default allocator)" in i.detail for i in items.values())
    assert items["steady"].bytes > items["save"].bytes  # the loss tensors leave split cached blocks behind
    q = plan_strategy(replace(_inputs(), expandable_segments=True), ZeroSettings(stage=3))
    assert "simulated (expandable_segments on)" in _item(q, "steady", slack).detail
    plain = plan_strategy(_inputs(gpus=1), ZeroSettings(stage=0))
    assert _item(plain, "steady", slack).bytes == ALLOCATOR_SLACK_BYTES


def test_loss_in_the_model_dtype_is_cheaper_than_the_fp32_upcast():
    spec = resolve_model("qwen2.5-7b")
    up = activation_bytes(spec, micro_batch=1, seq_len=4096, gradient_checkpointing=True)
    own = activation_bytes(spec, micro_batch=1, seq_len=4096, gradient_checkpointing=True, loss_dtype_bytes=2)
    tv = 4096 * spec.params.vocab_size
    assert up.logits_and_loss == 12 * tv  # backward: three fp32 tensors of T x V
    assert own.logits_and_loss == 6 * tv  # logits + shifted copy + log-probabilities, all bf16


def test_modules_to_save_train_a_copy_of_the_embeddings_next_to_the_adapters():
    plain = _inputs(method="lora")
    with_emb = _inputs(method="lora", trainable_modules=("embed_tokens", "lm_head"))
    p0 = plan_strategy(plain, ZeroSettings(stage=3))
    p1 = plan_strategy(with_emb, ZeroSettings(stage=3))
    assert p1.trainable_params - p0.trainable_params == 2 * 128256 * 4096
    assert p1.frozen_params == p0.frozen_params == plain.model.params.total
    grad = _item(p1, "steady", "full-size gradient before reduce-scatter")
    assert grad.bytes == 128256 * 4096 * 2


def test_freeze_tuning_trains_the_last_layers():
    i = _inputs(method="freeze", freeze_trainable_layers=2)
    p = plan_strategy(i, ZeroSettings(stage=2))
    per_layer = i.model.params.decoder_layers // i.model.params.num_layers
    assert p.trainable_params == 2 * per_layer
    assert p.frozen_params == i.model.params.total - 2 * per_layer


def test_reference_model_is_partitioned_under_zero3_whole_below_and_on_the_host_with_param_offload():
    i = _inputs(reference_model=True)
    total = i.model.params.total
    z3 = _item(plan_strategy(i, ZeroSettings(stage=3)), "steady", "reference model (frozen, 16-bit)")
    assert z3.bytes == -(-total // 8) * 2
    z2 = _item(plan_strategy(i, ZeroSettings(stage=2)), "load", "reference model (frozen, 16-bit)")
    assert z2.bytes == total * 2
    off = plan_strategy(i, ZeroSettings(stage=3, offload_optimizer="cpu", offload_param="cpu"))
    host = next(h for h in off.phase("steady").host if h.name.startswith("reference model"))
    assert host.bytes == -(-total // 8) * 2 * 8
    assert _item(off, "steady", "reference model (frozen, 16-bit)") is None


def test_paired_preference_inputs_double_the_activations():
    one = plan_strategy(_inputs(seq_len=2048), ZeroSettings(stage=3))
    two = plan_strategy(_inputs(seq_len=2048, paired_inputs=True), ZeroSettings(stage=3))
    a1 = _item(one, "steady", "activations + logits/loss").bytes
    a2 = _item(two, "steady", "activations + logits/loss").bytes
    assert a2 == pytest.approx(2 * a1, rel=0.01)


def test_gptq_base_is_whole_on_every_gpu_with_its_group_constants():
    bnb = _inputs(method="qlora", quant_storage="bfloat16")
    gptq = _inputs(method="qlora", quant_method="gptq", quant_group_size=128)
    z3 = ZeroSettings(stage=3)
    p_bnb, p_gptq = plan_strategy(bnb, z3), plan_strategy(gptq, z3)
    frozen = {c.name: c.bytes for c in p_gptq.components}["frozen16"]
    linear = sum(
        lin.in_features * lin.out_features * lin.count
        for lin in gptq.model.linear_modules()
        if not lin.path.endswith("lm_head")
    )
    rest = gptq.model.params.total - linear
    assert frozen == pytest.approx(linear * (0.5 + 2.5 / 128) + rest * 2, rel=1e-6)  # not divided by 8
    assert {c.name: c.bytes for c in p_bnb.components}["frozen16"] < frozen / 4  # bnb: partitioned
    assert _item(p_gptq, "steady", "gptq dequantised weight") is not None


def test_cutoff_len_is_a_cap_the_longest_sample_decides():
    cap = plan_strategy(_inputs(seq_len=8192), ZeroSettings(stage=3))
    short = plan_strategy(_inputs(seq_len=8192, longest_sample_tokens=1024), ZeroSettings(stage=3))
    same = plan_strategy(_inputs(seq_len=1024), ZeroSettings(stage=3))
    act = "activations + logits/loss"
    assert (
        _item(short, "steady", act).bytes
        == _item(same, "steady", act).bytes
        < _item(cap, "steady", act).bytes
    )


def test_one_rank_zero3_fetches_no_parameters_unless_they_are_offloaded():
    """With one rank DeepSpeed does not all-gather: each parameter becomes a view of its GPU partition
    (NoGatherHandle), so the fetched working set costs nothing; with offload_param each fetch still copies the
    partition to the GPU, and with two ranks the gathered parameters are new memory."""
    name = "ZeRO-3 fetched parameters (working set)"
    one = _item(plan_strategy(_inputs(gpus=1), ZeroSettings(stage=3)), "steady", name)
    assert one is not None and one.bytes == 0 and "NoGatherHandle" in one.source
    offload = ZeroSettings(stage=3, offload_param="cpu", offload_optimizer="cpu")
    assert _item(plan_strategy(_inputs(gpus=1), offload), "steady", name).bytes > 0
    assert _item(plan_strategy(_inputs(gpus=2), ZeroSettings(stage=3)), "steady", name).bytes > 0


@pytest.mark.parametrize(
    ("offload", "version", "cloned"),
    [
        ("none", "0.11.1", True),  # no offload: `.to(cuda).clone()` was always a GPU copy
        ("cpu", "0.11.1", False),  # `.to("cpu").clone()`: moved to the host before the copy
        ("cpu", "0.18.2", False),
        ("cpu", "0.18.3", True),  # deepspeedai/DeepSpeed#7700: `.detach().clone().to(device)`
        ("cpu", None, True),  # an unknown version is taken as a current one
    ],
)
def test_zero2_master_clone_on_the_gpu_follows_the_deepspeed_version(offload, version, cloned):
    i = replace(_inputs(), deepspeed_version=version)
    plan = plan_strategy(i, ZeroSettings(stage=2, offload_optimizer=offload))
    item = _item(plan, "load", "16-bit partition cloned for the fp32 master")
    assert (item is not None) is cloned
    if item is not None:
        assert item.bytes == -(-i.model.params.total // 8) * 2  # the rank's 16-bit partition
