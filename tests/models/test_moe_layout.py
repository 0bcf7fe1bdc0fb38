"""MoE experts laid out as the run's transformers builds them (`with_transformers_layout`).

transformers 5 builds one fused experts module per layer (3-D `gate_up_proj` + `down_proj`); 4.x built one
`nn.Linear` per expert (transformers v4.36.0 models/mixtral/modeling_mixtral.py `MixtralBlockSparseTop2MLP`: `w1`,
`w2`, `w3`; v4.40.0 models/qwen2_moe/modeling_qwen2_moe.py `Qwen2MoeMLP`: `gate_proj`, `up_proj`, `down_proj`;
the same in the 4.45.2 and 4.57.1 wheels).
ZeRO-3 fetches per module, so the largest module differs by the layout. The transformers-5 side is checked on a
real meta-device build with the installed transformers.
"""

from __future__ import annotations

import pytest

from zerodoctor.models import resolve_model
from zerodoctor.models.spec import EXPERTS, LINEAR, with_transformers_layout

MIXTRAL_H, MIXTRAL_I, MIXTRAL_E, MIXTRAL_V = 4096, 14336, 8, 32000


@pytest.mark.parametrize("version", [None, "", "not-a-version", "5.0.0rc1", "5.0.0", "5.23.0"])
def test_unknown_or_current_transformers_keeps_the_fused_experts(version: str | None) -> None:
    spec = resolve_model("mixtral-8x7b")
    assert with_transformers_layout(spec, version) is spec
    assert spec.params.largest_module_name == "model.layers.{i}.mlp.experts"
    assert spec.params.largest_module_numel == MIXTRAL_E * 3 * MIXTRAL_H * MIXTRAL_I


@pytest.mark.parametrize("version", ["4.36.0", "4.57.1"])
def test_transformers_4_builds_one_linear_per_expert(version: str) -> None:
    spec = resolve_model("mixtral-8x7b")
    old = with_transformers_layout(spec, version)
    assert old.params.total == spec.params.total
    assert sum(m.total for m in old.modules) == sum(m.total for m in spec.modules)
    assert not [m for m in old.modules if m.kind == EXPERTS]
    experts = {m.name: m for m in old.modules if ".experts.{e}." in m.path}
    assert set(experts) == {"w1", "w2", "w3"}
    assert (experts["w1"].in_features, experts["w1"].out_features) == (MIXTRAL_H, MIXTRAL_I)
    assert (experts["w2"].in_features, experts["w2"].out_features) == (MIXTRAL_I, MIXTRAL_H)
    assert all(m.kind == LINEAR and m.count == 32 * MIXTRAL_E for m in experts.values())
    assert experts["w1"].path == "model.layers.{i}.block_sparse_moe.experts.{e}.w1"
    router = [m for m in old.modules if m.path == "model.layers.{i}.block_sparse_moe.gate"]
    assert len(router) == 1 and router[0].kind == LINEAR and router[0].out_features == MIXTRAL_E
    # the largest module is now the embedding / head (V x h), not a layer's experts block
    assert old.params.largest_module_numel == MIXTRAL_V * MIXTRAL_H
    assert "experts" not in old.params.largest_module_name
    assert "transformers " + version in old.notes
    # LoRA can target the experts by their 4.x names, as PEFT did on a 4.x Mixtral
    assert {lin.name for lin in old.linear_modules()} >= {"w1", "w2", "w3", "gate"}
    assert with_transformers_layout(old, version) is old  # idempotent


def test_qwen_moe_experts_take_the_gate_up_down_names() -> None:
    spec = resolve_model("qwen1.5-moe-a2.7b")
    old = with_transformers_layout(spec, "4.40.0")
    names = {m.name for m in old.modules if ".experts.{e}." in m.path}
    assert names == {"gate_proj", "up_proj", "down_proj"}
    assert old.params.total == spec.params.total


def test_a_dense_model_is_unchanged() -> None:
    spec = resolve_model("llama-3-8b")
    assert with_transformers_layout(spec, "4.36.0") is spec


def test_the_fused_layout_matches_a_real_transformers_5_mixtral_build() -> None:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    if int(transformers.__version__.split(".")[0]) < 5:
        pytest.skip("the fused experts layout is transformers 5's")
    spec = resolve_model("mixtral-8x7b")
    config = transformers.MixtralConfig(**{k: v for k, v in spec.config.items() if not k.startswith("_")})
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    modules = {name: sum(p.numel() for p in m.parameters(recurse=False)) for name, m in model.named_modules()}
    largest = max(modules, key=lambda n: modules[n])
    assert modules[largest] == spec.params.largest_module_numel
    assert largest.replace(".0.", ".{i}.") == spec.params.largest_module_name
    tensors = {name: p.numel() for name, p in model.named_parameters()}
    biggest_tensor = max(tensors, key=lambda n: tensors[n])
    assert biggest_tensor.endswith("mlp.experts.gate_up_proj")
    assert tensors[biggest_tensor] == MIXTRAL_E * 2 * MIXTRAL_I * MIXTRAL_H  # 2/3 of the fused module
