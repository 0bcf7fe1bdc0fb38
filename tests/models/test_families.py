"""The counter, family by family, against transformers' own build on the meta device (tiny configs built
here: no hub). Exactness of the formulas does not depend on size, so small shapes keep this fast."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from zerodoctor.errors import PlanError
from zerodoctor.models import model_from_config

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

BASE = {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 3, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 128, "pad_token_id": 0, "bos_token_id": 1,
        "eos_token_id": 2}  # fmt: skip
MOE = {"num_experts_per_tok": 2, "moe_intermediate_size": 48}
MLA = {"kv_lora_rank": 16, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16, "n_group": 1,
       "topk_group": 1, "n_routed_experts": 4, "n_shared_experts": 1, "first_k_dense_replace": 1}  # fmt: skip

FAMILIES: dict[str, dict[str, Any]] = {
    "llama": {"model_type": "llama"},
    "llama-biases-tied": {
        "model_type": "llama",
        "attention_bias": True,
        "mlp_bias": True,
        "tie_word_embeddings": True,
    },  # fmt: skip
    "mistral": {"model_type": "mistral"},
    "qwen2": {"model_type": "qwen2"},
    "qwen2-tied": {"model_type": "qwen2", "tie_word_embeddings": True},
    "qwen3": {"model_type": "qwen3", "head_dim": 32},
    "qwen3-tied-bias": {
        "model_type": "qwen3",
        "head_dim": 32,
        "tie_word_embeddings": True,
        "attention_bias": True,
    },  # fmt: skip
    "gemma": {"model_type": "gemma", "head_dim": 32},
    "gemma2": {"model_type": "gemma2", "head_dim": 32},
    "gemma3_text": {"model_type": "gemma3_text", "head_dim": 32},
    "phi3": {"model_type": "phi3"},
    "mixtral": {"model_type": "mixtral", "num_local_experts": 4, "num_experts_per_tok": 2},
    "qwen2_moe": {
        "model_type": "qwen2_moe",
        "num_experts": 4,
        "shared_expert_intermediate_size": 80,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [0],
        **MOE,
    },  # fmt: skip
    "qwen3_moe": {"model_type": "qwen3_moe", "num_experts": 4, "head_dim": 32, **MOE},
    "deepseek_v2-lite": {"model_type": "deepseek_v2", "q_lora_rank": None, **MLA, **MOE},
    "deepseek_v3": {"model_type": "deepseek_v3", "q_lora_rank": 32, **MLA, **MOE},
    "gpt_neox": {"model_type": "gpt_neox", "intermediate_size": 256},
    "falcon-7b-style": {
        "model_type": "falcon",
        "multi_query": True,
        "parallel_attn": True,
        "bias": False,
        "new_decoder_architecture": False,
    },  # fmt: skip
    "falcon-40b-style": {"model_type": "falcon", "new_decoder_architecture": True, "num_kv_heads": 2},
    "falcon-rw-style": {
        "model_type": "falcon",
        "multi_query": False,
        "parallel_attn": False,
        "bias": True,
        "new_decoder_architecture": False,
    },  # fmt: skip
    "bloom": {"model_type": "bloom", "n_layer": 3, "n_head": 4},
    "opt": {"model_type": "opt", "ffn_dim": 256, "max_position_embeddings": 32, "word_embed_proj_dim": 64},
}


def _meta(config: dict[str, Any]) -> tuple[int, int]:
    data = dict(config)
    cfg = transformers.AutoConfig.for_model(data.pop("model_type"), **data)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    model.tie_weights()
    unique = {id(p): p for p in model.parameters()}
    largest = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())
    return sum(p.numel() for p in unique.values()), largest


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_family_count_equals_the_meta_device_build(family: str) -> None:
    config = {**BASE, **FAMILIES[family]}
    spec = model_from_config(config, name=family, source=Path(f"{family}.json"))
    total, largest = _meta(config)
    assert spec.params.total == total
    assert spec.params.largest_module_numel == largest
    assert spec.count_method.startswith("analytic")


@pytest.mark.parametrize(("model_type", "within"), [("olmo", 0.02), ("starcoder2", 0.35)])
def test_unknown_decoder_is_counted_approximately_and_says_so(
    model_type: str, within: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Without transformers to build it (an install without the [hf] extra): olmo, a Llama-style decoder with
    # parameter-free LayerNorms (close); starcoder2: biased LayerNorms and a two-matrix GELU MLP (far): both
    # are labelled approximate. With transformers they are exact (tests/models/test_meta_build.py).
    from zerodoctor.models import meta_build

    monkeypatch.setattr(meta_build, "transformers_version", lambda: None)
    config = {**BASE, "model_type": model_type}
    spec = model_from_config(config, name=model_type, source=Path(f"{model_type}.json"))
    assert spec.count_method.startswith("approximate")
    assert model_type in spec.count_method
    total, _ = _meta(config)
    assert abs(spec.params.total - total) / total < within


def test_unknown_moe_or_incomplete_config_is_refused() -> None:
    with pytest.raises(PlanError, match="not supported"):
        model_from_config({**BASE, "model_type": "acme_moe", "num_experts": 4}, name="j", source=Path("j.json"))
    with pytest.raises(PlanError, match="not supported"):
        model_from_config({"model_type": "acme_seq2seq", "d_model": 64}, name="t5", source=Path("t5.json"))
