"""Model types without an analytic counter are counted from transformers' own meta-device build.

Each case is a small config of an architecture users fine-tune (MoE with biases and attention sinks,
interleaved dense/MoE, hybrid Mamba, vision-language, encoder-decoder); the expected figures are computed
here from the built model independently of the folding code: unique parameters, the layers that hold
experts, the tied head.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import transformers

from zerodoctor.errors import PlanError
from zerodoctor.models import meta_build, model_from_config, resolve_model
from zerodoctor.models.spec import close_matches

TEXT = {"hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
        "intermediate_size": 96, "vocab_size": 256}  # fmt: skip
VISION_CLIP = {"model_type": "clip_vision_model", "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
               "num_attention_heads": 4, "image_size": 32, "patch_size": 8}  # fmt: skip

CASES: dict[str, dict[str, Any]] = {
    "gpt_oss": {**TEXT, "model_type": "gpt_oss", "head_dim": 16, "num_local_experts": 4, "num_experts_per_tok": 2},
    "glm4_moe": {**TEXT, "model_type": "glm4_moe", "n_routed_experts": 4, "num_experts_per_tok": 2,
                 "moe_intermediate_size": 32, "first_k_dense_replace": 1, "n_shared_experts": 1},
    "olmo2": {**TEXT, "model_type": "olmo2"},
    "starcoder2": {**TEXT, "model_type": "starcoder2"},
    "jamba": {**TEXT, "model_type": "jamba", "num_experts": 4, "num_experts_per_tok": 2, "expert_layer_period": 2,
              "expert_layer_offset": 1, "attn_layer_period": 2, "attn_layer_offset": 1, "mamba_d_state": 4,
              "mamba_d_conv": 2, "mamba_expand": 2, "use_mamba_kernels": False},
    "llava": {"model_type": "llava", "text_config": {**TEXT, "model_type": "llama"}, "vision_config": VISION_CLIP,
              "image_token_index": 255},
    "t5": {"model_type": "t5", "d_model": 64, "d_kv": 16, "d_ff": 96, "num_layers": 2, "num_decoder_layers": 2,
           "num_heads": 4, "vocab_size": 256},
}  # fmt: skip


def _reference(config: dict[str, Any]) -> tuple[int, int]:
    """Unique parameters and decoder layers holding experts, from the model transformers builds."""
    data = dict(config)
    cfg = transformers.AutoConfig.for_model(data.pop("model_type"), **data)
    with torch.device("meta"):
        model = meta_build._build(cfg)
    model.tie_weights()
    total = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    moe_layers = {n.split(".experts")[0] for n, _ in model.named_parameters() if ".experts." in n}
    return total, len(moe_layers)


@pytest.mark.parametrize("model_type", sorted(CASES))
def test_count_equals_transformers_build_and_parts_add_up(model_type: str) -> None:
    config = CASES[model_type]
    spec = model_from_config(config, name=model_type, source=Path(f"{model_type}.json"))
    p = spec.params
    total, moe_layers = _reference(config)
    assert p.total == total
    assert spec.count_method.startswith("exact: transformers")
    assert p.num_moe_layers == moe_layers
    parts = p.embedding + p.lm_head + p.decoder_layers + p.final_norm + p.vision_tower + p.projector
    assert parts == p.total
    assert max(m.numel for m in spec.modules) == p.largest_module_numel


def test_moe_facts_of_a_gpt_oss_config() -> None:
    p = model_from_config(CASES["gpt_oss"], name="g", source=Path("g.json")).params
    assert (p.is_moe, p.num_experts, p.experts_per_token, p.num_moe_layers, p.num_dense_layers) == (
        True,
        4,
        2,
        4,
        0,
    )
    assert p.active_per_token < p.total


def test_glm4_moe_keeps_its_first_dense_layer_apart() -> None:
    p = model_from_config(CASES["glm4_moe"], name="g", source=Path("g.json")).params
    assert (p.num_dense_layers, p.num_moe_layers) == (1, 3)
    assert p.moe_layer > p.dense_layer > 0


def test_vision_language_model_splits_text_vision_and_projector() -> None:
    spec = model_from_config(CASES["llava"], name="l", source=Path("l.json"))
    p = spec.params
    assert p.is_multimodal and p.vision_tower > 0 and p.projector > 0
    assert (p.num_layers, p.hidden_size, p.vision_num_layers, p.vision_hidden_size) == (4, 64, 2, 32)
    assert any(m.component == "vision" and m.name == "q_proj" for m in spec.modules)


def test_tied_head_is_counted_once() -> None:
    config = {**TEXT, "model_type": "olmo2", "tie_word_embeddings": True}
    spec = model_from_config(config, name="o", source=Path("o.json"))
    assert spec.params.tied_embeddings and spec.params.lm_head == 0
    assert spec.params.total == _reference(config)[0]


@pytest.mark.parametrize(
    ("name", "published"),
    [
        ("openai/gpt-oss-120b", 116.8e9),  # OpenAI's model card: 116.8B in total
        ("gpt-oss-20b", 20.9e9),  # 20.9B
        ("Qwen/Qwen2.5-VL-7B-Instruct", 8.29e9),  # the hub page's safetensors count: 8.29B
    ],
)
def test_catalog_entries_built_on_meta_match_the_published_totals(name: str, published: float) -> None:
    spec = resolve_model(name)
    assert spec.params.total == pytest.approx(published, rel=0.002)
    assert spec.count_method.startswith("exact: transformers")


def test_sizes_left_to_defaults_are_named() -> None:
    spec = model_from_config({"model_type": "olmo2", "hidden_size": 64, "num_attention_heads": 4,
                              "num_hidden_layers": 2}, name="o", source=Path("o.json"))  # fmt: skip
    assert "does not state vocab_size" in spec.count_method


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({**TEXT, "model_type": "olmo2", "num_hidden_layers": 100_000}, "more than any published model"),
        # caught before transformers' config class builds a per-layer list of a billion entries
        ({**TEXT, "model_type": "gpt_oss", "num_hidden_layers": 10**9}, "num_hidden_layers = 1000000000 is more"),
        ({"model_type": "llava", "text_config": {**TEXT, "num_hidden_layers": 10**6}}, "text_config.num_hidden"),
        ({**TEXT, "model_type": "glm4_moe", "n_routed_experts": 10**6}, "n_routed_experts = 1000000 is more"),
        (
            {**TEXT, "model_type": "gpt_oss", "num_attention_heads": "many"},
            r"bad\.json: transformers .* (refuses|cannot)",
        ),
    ],
)
def test_a_config_transformers_cannot_build_is_a_plan_error(config: dict[str, Any], message: str) -> None:
    with pytest.raises(PlanError, match=message):
        model_from_config(config, name="bad", source=Path("bad.json"))


def test_without_transformers_the_generic_decoder_is_approximate_and_says_so(monkeypatch) -> None:
    monkeypatch.setattr(meta_build, "transformers_version", lambda: None)
    spec = model_from_config({**TEXT, "model_type": "olmo2"}, name="o", source=Path("o.json"))
    assert spec.count_method.startswith("approximate")
    with pytest.raises(PlanError, match="counted exactly from its meta-device build"):
        model_from_config(CASES["gpt_oss"], name="g", source=Path("g.json"))


@pytest.mark.parametrize(
    "name",
    [
        "openai/gpt-oss-120b-custom",
        "Qwen/Qwen2.5-VL-7B-Instruct",
        "llava-hf/llava-1.5-13b-hf",
        "acme/orca-7b",
    ],
)
def test_close_matches_never_cross_architectures(name: str) -> None:
    from zerodoctor.models.spec import catalog, family_from_name

    family = family_from_name(name)
    by_name = {e.slug: e.model_type for e in catalog()} | {
        h: e.model_type for e in catalog() for h in e.hub_ids
    }
    assert {by_name[m] for m in close_matches(name)} <= ({family} if family else set())


def test_a_second_count_is_read_from_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZERODOCTOR_CACHE_DIR", str(tmp_path))
    first = model_from_config(CASES["gpt_oss"], name="g", source=Path("g.json"))
    assert list(tmp_path.glob("meta-build-*.bin"))

    def no_build(*args: object) -> None:
        raise AssertionError("built again")

    monkeypatch.setattr(meta_build, "build_shapes", no_build)
    again = model_from_config(CASES["gpt_oss"], name="g", source=Path("g.json"))
    assert again.params == first.params and again.modules == first.modules
    # Another config is another key.
    with pytest.raises(AssertionError, match="built again"):
        model_from_config({**CASES["gpt_oss"], "num_hidden_layers": 2}, name="g", source=Path("g.json"))
