"""The model catalog and the analytic parameter counter, held against transformers' own build.

For every catalog entry whose architecture transformers 5.23 knows, the model is built once on the meta
device (no memory, no weights) and its deduplicated parameter count and largest module must equal the
analytic count exactly. `tie_weights()` is called before counting because a meta-device build may leave
tied embeddings untied (memory.md §17), and parameters are deduplicated by identity, not `data_ptr()`
(every meta tensor's pointer is 0, memory.md §2.1).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from zerodoctor.errors import PlanError
from zerodoctor.models.spec import CATALOG_META_KEY, ModelSpec, catalog, resolve_model

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

META_BUILT = (
    "deepseek-coder-v2-instruct", "deepseek-coder-v2-lite", "gemma-2-27b", "llama-2-7b", "llama-3-70b",
    "llama-3-8b", "llama-3.1-405b", "llama-3.1-70b", "llama-3.1-8b", "llama-3.2-1b", "llama-3.2-3b",
    "llava-v1.6-34b", "llava-v1.6-vicuna-13b", "mistral-7b-v0.3", "mixtral-8x7b", "qwen2.5-0.5b",
    "qwen2.5-72b", "qwen2.5-7b", "yi-34b",
)  # fmt: skip
"""Catalog entries built whole on the meta device here (one per family and size class; every family's
formula is also checked on tiny configs in tests/models/test_families.py, which keeps this module fast)."""
META_BUILDABLE = [e.slug for e in catalog() if e.slug in META_BUILT]

# Published exact sizes (model cards / safetensors index); each is also checked against the meta build.
PUBLISHED = {
    "llama-3.1-8b": 8_030_261_248,
    "llama-3-8b": 8_030_261_248,
    "llama-3.1-70b": 70_553_706_496,
    "llama-3.1-405b": 405_853_388_800,
    "llama-3.2-1b": 1_235_814_400,
    "llama-3.2-3b": 3_212_749_824,
    "yi-34b": 34_388_917_248,
    "mistral-7b-v0.3": 7_248_023_552,
    "gemma-2-27b": 27_227_128_320,
    "qwen2.5-7b": 7_615_616_512,
    "qwen2.5-0.5b": 494_032_768,
    "mixtral-8x7b": 46_702_792_704,
}


def _hf_config(spec: ModelSpec) -> Any:
    data = {k: v for k, v in spec.config.items() if k not in ("auto_map", "_name_or_path")}
    model_type = data.pop("model_type")
    return transformers.AutoConfig.for_model(model_type, **data)


def _count(model: Any) -> tuple[int, int]:
    """(total parameters deduplicated by identity, largest module's own parameters)."""
    unique = {id(p): p for p in model.parameters()}
    total = sum(p.numel() for p in unique.values())
    largest = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())
    return total, largest


@pytest.fixture(scope="module")
def meta_counts() -> dict[str, tuple[int, int]]:
    """Build each catalog model once on the meta device (the 405B and 236B builds take a few seconds)."""
    counts: dict[str, tuple[int, int]] = {}
    for slug in META_BUILDABLE:
        spec = resolve_model(slug)
        cfg = _hf_config(spec)
        with torch.device("meta"):
            if spec.model_type == "llava_next":
                model = transformers.LlavaNextForConditionalGeneration(cfg)
            else:
                model = transformers.AutoModelForCausalLM.from_config(cfg)
        model.tie_weights()
        counts[slug] = _count(model)
        del model
    return counts


def test_catalog_has_the_models_the_issue_names() -> None:
    slugs = {e.slug for e in catalog()}
    assert len(slugs) >= 15
    assert {
        "llava-v1.6-vicuna-13b",
        "llava-v1.6-34b",
        "minicpm-llama3-v-2.5",
        "yi-34b",
        "llama-3-8b",
        "llama-3.1-8b",
        "llama-3-70b",
        "llama-3.1-70b",
        "llama-3.1-405b",
        "deepseek-coder-v2-instruct",
        "deepseek-coder-v2-lite",
        "qwen2.5-7b",
        "qwen2.5-72b",
        "mixtral-8x7b",
        "mistral-7b-v0.3",
        "gemma-2-27b",
        "llama-3.2-1b",
        "llama-3.2-3b",
        "qwen2.5-0.5b",
    } <= slugs


@pytest.mark.parametrize("slug", [e.slug for e in catalog()])
def test_catalog_entry_is_well_formed(slug: str) -> None:
    raw = json.loads(next(e for e in catalog() if e.slug == slug).path.read_text())
    meta = raw[CATALOG_META_KEY]
    assert meta["hub_ids"] and meta["display_name"] and meta["source"] and meta["published_params"]
    spec = resolve_model(slug)
    p = spec.params
    assert p.total == p.trainable
    assert p.total == (
        p.embedding + p.lm_head + p.decoder_layers + p.final_norm + p.vision_tower + p.projector
    )
    assert p.num_layers == p.num_dense_layers + p.num_moe_layers
    assert (p.lm_head == 0) == p.tied_embeddings
    for hub_id in meta["hub_ids"]:
        assert resolve_model(hub_id).catalog_slug == slug, hub_id


@pytest.mark.parametrize("slug", META_BUILDABLE)
def test_analytic_count_equals_meta_device_build(slug: str, meta_counts: dict[str, tuple[int, int]]) -> None:
    total, largest = meta_counts[slug]
    params = resolve_model(slug).params
    assert params.total == total
    assert params.largest_module_numel == largest


@pytest.mark.parametrize("slug", sorted(PUBLISHED))
def test_published_sizes(slug: str, meta_counts: dict[str, tuple[int, int]]) -> None:
    assert resolve_model(slug).params.total == PUBLISHED[slug] == meta_counts[slug][0]


def test_minicpmv_parts_equal_their_transformers_builds() -> None:
    """MiniCPM-V is remote code: check its LLM and vision parts against transformers, the resampler
    against a module-for-module replica of the published resampler.py."""
    spec = resolve_model("minicpm-llama3-v-2.5")
    cfg = dict(spec.config)
    llm_cfg = {
        k: v
        for k, v in cfg.items()
        if k
        not in ("auto_map", "_name_or_path", "vision_config", "slice_config", "model_type", "architectures")
    }
    from transformers.models.idefics2.configuration_idefics2 import Idefics2VisionConfig
    from transformers.models.idefics2.modeling_idefics2 import Idefics2VisionTransformer

    vis_cfg = {k: v for k, v in cfg["vision_config"].items() if k != "model_type"}
    embed, queries, kv_dim = cfg["hidden_size"], cfg["query_num"], vis_cfg["hidden_size"]
    with torch.device("meta"):
        llm = transformers.LlamaForCausalLM(transformers.LlamaConfig(**llm_cfg))
        vpm = Idefics2VisionTransformer(Idefics2VisionConfig(**vis_cfg))
        resampler = torch.nn.ModuleDict(
            {
                "kv_proj": torch.nn.Linear(kv_dim, embed, bias=False),
                "attn": torch.nn.MultiheadAttention(embed, embed // 128),
                "ln_q": torch.nn.LayerNorm(embed),
                "ln_kv": torch.nn.LayerNorm(embed),
                "ln_post": torch.nn.LayerNorm(embed),
            }
        )
    llm.tie_weights()
    loose = queries * embed + embed * embed  # Resampler.query and Resampler.proj
    p = spec.params
    assert _count(llm)[0] + _count(vpm)[0] + _count(resampler)[0] + loose == p.total
    assert _count(vpm)[0] == p.vision_tower
    assert _count(resampler)[0] + loose == p.projector
    assert p.largest_module_numel == _count(llm)[1]
    assert spec.count_method.startswith("analytic only")


def test_per_layer_counts_for_a_moe_model() -> None:
    p = resolve_model("deepseek-coder-v2-instruct").params
    assert (p.num_dense_layers, p.num_moe_layers, p.num_experts, p.experts_per_token) == (1, 59, 160, 6)
    assert p.is_moe and p.moe_layer > p.dense_layer
    assert p.largest_module_name == "model.layers.{i}.mlp.experts"  # transformers 5 fused experts
    assert 21e9 < p.active_per_token < 22e9


def test_tied_embeddings_are_counted_once() -> None:
    gemma = resolve_model("gemma-2-27b").params
    assert gemma.tied_embeddings and gemma.lm_head == 0
    assert gemma.largest_module_numel == 256_000 * 4608  # the shared tensor still sizes ZeRO-3's gather


@pytest.mark.parametrize(
    ("name", "slug"),
    [
        ("meta-llama/Llama-3.1-405B", "llama-3.1-405b"),
        ("META-LLAMA/llama-3.1-8b-instruct", "llama-3.1-8b"),
        ("deepseek-ai/DeepSeek-Coder-V2-Instruct", "deepseek-coder-v2-instruct"),
        ("01-ai/Yi-34B-200K", "yi-34b"),
        ("/models/Yi-34B-200K", "yi-34b"),
        ("/data/ckpt/meta-llama/Llama-3.1-70B-Instruct/", "llama-3.1-70b"),
        ("liuhaotian/llava-v1.6-34b", "llava-v1.6-34b"),
        ("openbmb/MiniCPM-Llama3-V-2_5", "minicpm-llama3-v-2.5"),
        ("Mixtral-8x7B-Instruct-v0.1", "mixtral-8x7b"),
        ("qwen2.5-7b", "qwen2.5-7b"),
    ],
)
def test_hub_id_and_path_prefix_lookup(name: str, slug: str) -> None:
    assert resolve_model(name).catalog_slug == slug


def test_config_path_and_directory_lookup(tmp_path: Path) -> None:
    src = next(e for e in catalog() if e.slug == "qwen2.5-0.5b").path
    data = json.loads(src.read_text())
    del data[CATALOG_META_KEY]
    model_dir = tmp_path / "my-qwen"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps(data))
    by_dir = resolve_model(str(model_dir))
    by_file = resolve_model(str(model_dir / "config.json"))
    assert by_dir.name == by_file.name == "my-qwen"
    assert by_dir.catalog_slug is None
    assert by_dir.params == resolve_model("qwen2.5-0.5b").params


def test_directory_without_config_falls_back_to_catalog_by_name(tmp_path: Path) -> None:
    mount = tmp_path / "Llama-3.1-8B-Instruct"
    mount.mkdir()
    assert resolve_model(str(mount)).catalog_slug == "llama-3.1-8b"
    with pytest.raises(PlanError, match="directory has no config.json"):
        resolve_model(str(tmp_path))


def test_unknown_name_lists_close_matches() -> None:
    with pytest.raises(PlanError) as err:
        resolve_model("llama-3.1-80b")
    message = str(err.value)
    assert "unknown model 'llama-3.1-80b'" in message
    assert "llama-3.1-8b" in message and "config.json" in message


def test_missing_field_names_file_and_field(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text(
        json.dumps(
            {
                "model_type": "llama",
                "hidden_size": 64,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "vocab_size": 100,
            }
        )
    )
    with pytest.raises(PlanError) as err:
        resolve_model(str(config))
    assert str(config) in str(err.value) and "'intermediate_size'" in str(err.value)


def test_unsupported_model_type_and_bad_json(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "rwkv"}))
    with pytest.raises(PlanError, match="rwkv config states no size"):
        resolve_model(str(config))
    config.write_text("{not json")
    with pytest.raises(PlanError, match="not valid JSON|invalid JSON"):
        resolve_model(str(config))
    with pytest.raises(PlanError, match="no config.json"):
        resolve_model(str(tmp_path / ".."))


def test_lora_counts() -> None:
    spec = resolve_model("llama-3.1-8b")
    h, kv, inter, layers, r = 4096, 1024, 14336, 32, 16
    qv = layers * r * ((h + h) + (h + kv))
    assert spec.lora_params(r, ["q_proj", "v_proj"]) == qv
    all_linear = layers * r * (2 * (h + h) + 2 * (h + kv) + 3 * (h + inter))
    assert spec.lora_params(r, "all-linear") == all_linear
    names = {lin.name for lin in spec.linear_modules()}
    assert names == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head"}
    with pytest.raises(PlanError, match="match no nn.Linear"):
        spec.lora_params(r, ["query_key_value"])
    # PEFT matches names anywhere: LLaVA's CLIP tower has q_proj/v_proj too.
    llava = resolve_model("llava-v1.6-vicuna-13b")
    assert llava.lora_params(r, ["q_proj"]) > llava.lora_params(r, ["q_proj"], components=["text"])


def test_import_does_not_pull_in_torch() -> None:
    code = (
        "import sys, zerodoctor.models.spec as m; m.resolve_model('llama-3.1-405b'); "
        "bad = [x for x in ('torch', 'transformers', 'deepspeed') if x in sys.modules]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def _published(text: str) -> float:
    """`"7.24B"`, `"560M"`, `"671B without ..."` -> parameters."""
    import re

    m = re.match(r"\s*([\d.]+)\s*([BM])", text)
    assert m, text
    return float(m.group(1)) * (1e9 if m.group(2) == "B" else 1e6)


@pytest.mark.parametrize("slug", [e.slug for e in catalog()])
def test_every_catalog_total_matches_its_published_size(slug: str) -> None:
    """The model card's rounded size (every entry; the exact figures above for the meta-built ones)."""
    raw = json.loads(next(e for e in catalog() if e.slug == slug).path.read_text())
    published = _published(raw[CATALOG_META_KEY]["published_params"])
    total = resolve_model(slug).params.total
    assert abs(total - published) / published < 0.05, (total, published)


def test_catalog_has_a_hundred_models_with_aliases() -> None:
    assert len(catalog()) >= 100
    assert sum(len(e.hub_ids) for e in catalog()) >= 250
