"""Host and load-time items found with the H100 measurements (benchmarks/gpu/plan_gpu_h100.json), each from
DeepSpeed 0.19.8 source: zero.Init's per-parameter pinned partitions stay in PyTorch's pinned cache after stage 3
copies them into its flat buffer; ZeRO-1/2 flattens on the GPU (parameters + flat copy) and pins its fp32 gradient
partition from a pageable copy; with offload_param the partitions are staged on the GPU for each all-gather."""

from __future__ import annotations

from dataclasses import replace

from zerodoctor.models import resolve_model
from zerodoctor.plan import model_states as ms
from zerodoctor.plan.inputs import GIB, Cluster, PlanInputs, Training, ZeroSettings
from zerodoctor.plan.phases import _param_sizes, plan_strategy


def _inputs(method: str = "full", gpus: int = 1) -> PlanInputs:
    return PlanInputs(
        model=resolve_model("llama-3.2-3b"),
        cluster=Cluster(1, gpus, 80 * GIB, 1024 * GIB),
        training=Training(method=method, micro_batch=4, seq_len=2048),
        framework="deepspeed",
    )


def _host(plan, phase: str) -> dict[str, int]:
    return {i.name: i.bytes for i in plan.phase(phase).host}


def test_zero_init_pinned_partitions_stay_cached_with_offload_param():
    inputs = _inputs()
    z = ZeroSettings(stage=3, offload_optimizer="cpu", offload_param="cpu", pin_memory=True)
    host = _host(plan_strategy(inputs, z), "steady")
    layers, rest = _param_sizes(inputs)
    expected = sum(ms.pinned_bytes(n * 2) * k for n, k in layers + rest)
    assert host["zero.Init per-parameter pinned partitions (cached)"] == expected
    # one power-of-two block per parameter: Llama-3.2-3B's 3.21B params x 2 B = 5.98 GiB -> about 8.4 GiB
    assert 8.0 * GIB < expected < 8.8 * GIB
    for off in (
        ZeroSettings(stage=3, offload_optimizer="cpu", offload_param="cpu", pin_memory=False),
        ZeroSettings(stage=3, offload_optimizer="cpu"),
    ):
        assert "zero.Init per-parameter pinned partitions (cached)" not in _host(
            plan_strategy(inputs, off), "steady"
        )


def test_lora_frozen_partitions_are_pinned_per_parameter():
    inputs = _inputs("lora")
    z = ZeroSettings(stage=3, offload_optimizer="cpu", offload_param="cpu", pin_memory=True)
    plan = plan_strategy(inputs, z)
    item = next(i for i in plan.phase("steady").host if i.name == "offloaded: frozen16")
    assert "pinned per parameter" in item.detail
    assert "zero.Init per-parameter pinned partitions (cached)" not in _host(plan, "steady")


def test_zero2_flattens_on_the_gpu_and_pins_from_a_pageable_copy():
    inputs = _inputs()
    p = inputs.model.params
    z = ZeroSettings(stage=2, offload_optimizer="cpu", pin_memory=True)
    plan = plan_strategy(inputs, z)
    load_gpu = {i.name: i.bytes for i in plan.phase("load").gpu}
    # reserved at load = the freed originals (minus what later buffers reuse) + the flat buffer + the clone
    later = sum(v for k, v in load_gpu.items() if k.startswith("model states:") and "param16" not in k)
    assert load_gpu["16-bit parameters + their flat copy while flattening"] == p.total * 2 - later
    assert load_gpu["16-bit partition cloned for the fp32 master"] == p.total * 2
    host = _host(plan, "load")
    assert host["pageable fp32 gradient partition being pinned"] >= p.total * 4
    assert host["whole model loaded per rank"] == p.total * 2
    # a GPU too small for the flat copy: DeepSpeed flattens through the host instead
    small = PlanInputs(**{**inputs.__dict__, "cluster": Cluster(1, 1, 8 * GIB, 1024 * GIB)})
    tight = plan_strategy(small, z)
    assert "16-bit parameters + their flat copy while flattening" not in {
        i.name for i in tight.phase("load").gpu
    }
    assert _host(tight, "load")["whole model loaded per rank"] == 2 * p.total * 2


def test_offload_param_stages_partitions_for_the_all_gather():
    inputs = _inputs(gpus=8)
    z = ZeroSettings(stage=3, offload_optimizer="cpu", offload_param="cpu")
    gpu = {i.name: i.bytes for i in plan_strategy(inputs, z).phase("steady").gpu}
    p = inputs.model.params
    staged = -(-max(p.largest_module_numel, z.prefetch_bucket_size) // 8) * 2
    assert gpu["offload_param: partitions staged on the GPU for an all-gather"] == staged
    no_off = {i.name for i in plan_strategy(inputs, ZeroSettings(stage=3)).phase("steady").gpu}
    assert "offload_param: partitions staged on the GPU for an all-gather" not in no_off


def test_zero3_reduce_scatter_copies_the_bucket():
    inputs = _inputs()
    for bucket in (500_000_000, 3072 * 3072):
        z = ZeroSettings(stage=3, reduce_bucket_size=bucket)
        gpu = {i.name: i.bytes for i in plan_strategy(inputs, z).phase("steady").gpu}
        assert gpu["reduce-scatter: flattened copy of the IPG bucket"] == bucket * 2
    z2 = {i.name for i in plan_strategy(inputs, ZeroSettings(stage=2)).phase("steady").gpu}
    assert "reduce-scatter: flattened copy of the IPG bucket" not in z2


def test_zero3_load_gathers_the_largest_module_on_every_gpu():
    """transformers loads a zero.Init model module by module under GatheredParameters: the largest module is whole on
    every GPU once (integrations/deepspeed.py _load_state_dict_into_zero3_model)."""
    inputs = _inputs(gpus=8)
    name = "load: each module gathered to receive its checkpoint values"
    for z in (ZeroSettings(stage=3), ZeroSettings(stage=3, offload_optimizer="cpu", offload_param="cpu")):
        load = {i.name: i.bytes for i in plan_strategy(inputs, z).phase("load").gpu}
        assert load[name] == inputs.model.params.largest_module_numel * 2
    assert name not in {i.name for i in plan_strategy(inputs, ZeroSettings(stage=2)).phase("load").gpu}
    no_init = replace(inputs, zero3_init=False)
    assert name not in {i.name for i in plan_strategy(no_init, ZeroSettings(stage=3)).phase("load").gpu}
