"""A checkpoint save has two host moments that do not overlap: save_model (HF/accelerate: every rank's 16-bit
clone under ZeRO-1/2, rank 0's consolidated dict under ZeRO-3) returns and frees its state dict before
engine.save_checkpoint runs (dp rank 0 torch.saves the module -- under ZeRO-1/2 the 16-bit flat GPU buffer, one
storage -- while the other ranks write their optimizer partitions). The save phase charges the larger moment."""

from __future__ import annotations

from dataclasses import replace

from zerodoctor.models import resolve_model
from zerodoctor.plan.inputs import GIB, Cluster, PlanInputs, Training, ZeroSettings
from zerodoctor.plan.phases import plan_strategy

FLAT = "rank 0: torch.save copies the 16-bit flat parameters to the host"
CLONE = "every rank: 16-bit state dict on CPU"
STAGING = "torch.save staging of optimizer shards"


def _inputs(framework: str, gpus: int = 8) -> PlanInputs:
    return PlanInputs(
        model=resolve_model("llama-3.2-3b"),
        cluster=Cluster(1, gpus, 80 * GIB, 1024 * GIB),
        training=Training(method="full"),
        framework=framework,
        safetensors_version="0.8.0",
    )


def _save_host(inputs: PlanInputs, z: ZeroSettings) -> tuple[dict[str, int], str]:
    plan = plan_strategy(inputs, z)
    save = plan.phase("save")
    return {i.name: i.bytes for i in save.host}, save.note


def test_plain_deepspeed_saves_only_the_engine_checkpoint():
    inputs = _inputs("deepspeed", gpus=1)
    host, note = _save_host(inputs, ZeroSettings(stage=2, offload_optimizer="cpu"))
    assert CLONE not in host
    assert host[FLAT] == inputs.model.params.total * 2  # the H100 run's save: +5.99 GiB RSS for 5.98 GiB
    assert "engine checkpoint" in note


def test_hf_zero2_charges_the_larger_moment_not_both():
    inputs = _inputs("hf")
    p = inputs.model.params.total
    host, note = _save_host(inputs, ZeroSettings(stage=2))
    assert host[CLONE] == 8 * 2 * p
    assert STAGING not in host and FLAT not in host  # written after the clones are freed
    assert "engine checkpoint afterwards" in note
    only_model = replace(inputs, training=replace(inputs.training, save_only_model=True))
    assert "engine checkpoint" not in _save_host(only_model, ZeroSettings(stage=2))[1]


def test_engine_checkpoint_moment_without_offload():
    inputs = _inputs("deepspeed")
    host, _ = _save_host(inputs, ZeroSettings(stage=2))
    part = -(-inputs.model.params.total // 8) * 4  # each rank's fp32 master partition, one GPU storage
    flat = inputs.model.params.total * 2
    assert host[FLAT] == flat and flat > part
    assert abs(host[STAGING] - 7 * part) <= 7 * 16  # the other seven ranks, while rank 0 writes the module
