"""FSDP1 + LoRA wrapped as PEFT documents it (PEFT's fsdp_auto_wrap_policy, use_orig_params=False) on the real
engine: 2 gloo ranks on CPU (tests/plan/fsdp_lora_job.py). The frozen decoder-layer FlatParameters require no
gradient, so the planner's "unsharded gradient of one unit" for LoRA/QLoRA is one layer's adapters, not the layer
(torch/distributed/fsdp/_flat_param.py: a FlatParameter requires grad only if its parameters do)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from zerodoctor.models.spec import model_from_config
from zerodoctor.plan.inputs import GIB, Cluster, FsdpSettings, PlanInputs, Training, fsdp_as_zero
from zerodoctor.plan.phases import plan_strategy

pytest.importorskip("torch")
pytest.importorskip("peft")
pytestmark = pytest.mark.engine

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from fsdp_job import CONFIG  # noqa: E402
from fsdp_lora_job import LORA_RANK, TARGETS  # noqa: E402
from test_fsdp_engine import torchrun_job  # noqa: E402


def test_frozen_layer_units_get_no_gradient_and_the_planner_charges_one_layer_of_adapters():
    ranks = torchrun_job(HERE / "fsdp_lora_job.py")
    assert len(ranks) == 2

    spec = model_from_config({"model_type": "llama", **CONFIG}, name="tiny-llama", source=Path("<fsdp_job>"))
    t = Training(method="lora", lora_rank=LORA_RANK, lora_targets=tuple(TARGETS), precision="bf16")
    inputs = PlanInputs(model=spec, cluster=Cluster(1, 2, 80 * GIB, 1024 * GIB), training=t, framework="hf")
    adapters = spec.lora_params(LORA_RANK, tuple(TARGETS))
    layer_numel = spec.params.decoder_layers // spec.params.num_layers
    f = FsdpSettings(use_orig_params=False)
    steady = {i.name: i for i in plan_strategy(inputs, fsdp_as_zero(f)).phase("steady").gpu}
    unit_grad = steady["unsharded gradient of one unit"]
    per_layer = -(-adapters // spec.params.num_layers)
    assert unit_grad.bytes == per_layer * 2 + -(-per_layer // 2) * 2  # bf16 gradient + reduce-scatter output
    for rank in ranks:
        trainable = [u["unsharded"] for u in rank["units"] if u["requires_grad"]]
        frozen = [u["unsharded"] for u in rank["units"] if not u["requires_grad"]]
        assert sum(trainable) == adapters  # only the adapters' FlatParameters require grad
        assert max(frozen) >= layer_numel  # the decoder layers (and the root) are frozen units
        assert 0 < rank["max_unsharded_grad_numel"] <= per_layer < layer_numel
