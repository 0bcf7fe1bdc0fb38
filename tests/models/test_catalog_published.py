"""Catalog entries added for published setups: counts equal the published totals; aliases resolve."""

from __future__ import annotations

import pytest

from zerodoctor.models import resolve_model


@pytest.fixture(scope="module", autouse=True)
def _shared_meta_build_cache(tmp_path_factory):
    """One on-disk meta-build cache for this module: several tests count the same vision-language entry, and
    each build imports torch and transformers' model code (seconds); the cached answer takes milliseconds."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ZERODOCTOR_CACHE_DIR", str(tmp_path_factory.mktemp("meta_build_cache")))
        yield


@pytest.mark.parametrize(
    ("name", "total"),
    [
        ("llama-2-7b", 6_738_415_616),
        ("meta-llama/Llama-2-13b-hf", 13_015_864_320),
        ("lmsys/vicuna-13b-v1.5", 13_015_864_320),
        ("meta-llama/Llama-2-70b-hf", 68_976_648_192),
    ],
)
def test_published_totals(name, total):
    assert resolve_model(name).params.total == total


def test_deepseek_coder_33b_is_the_published_33_3b():
    assert resolve_model("deepseek-ai/deepseek-coder-33b-instruct").params.total == pytest.approx(
        33.3e9, rel=0.005
    )


# Entries added for the LLaMA-Factory coverage (benchmarks/model_coverage.py): the count of each bundled
# config.json against the total its publisher states -- within 0.5 % of an exact or three-digit figure, and at
# the stated precision where a card gives one decimal of a billion (Granite's table: "1.3B"). SmolLM-360M is
# left out: "360M" is the size in its name, and the count (361,821,120) is 0.5 % above it.
@pytest.mark.parametrize(
    ("name", "published"),
    [
        ("openai-community/gpt2", 124e6),  # model card: 124M
        ("openai-community/gpt2-medium", 355e6),  # model card: 355M
        ("openai-community/gpt2-large", 774e6),  # model card: 774M
        ("openai-community/gpt2-xl", 1558e6),  # nanoGPT model.py: 1558M
        ("HuggingFaceTB/SmolLM-135M", 135e6),  # model card: 135M
        ("CohereForAI/aya-23-8B", 8e9),  # model card: 8B
        # safetensors metadata of granite-3.1-8b-instruct (the card's one-decimal 8.1B truncates it)
        ("ibm-granite/granite-3.1-8b-instruct", 8_170_848_256),
        ("Qwen/Qwen3-VL-4B-Thinking", 4.44e9),  # hub count as quoted: 4.44 billion
        ("Qwen/Qwen3-VL-30B-A3B-Instruct", 31.07e9),  # hub count as listed: 31.07B
        ("Qwen/Qwen3-VL-235B-A22B-Instruct", 235e9),  # the name's 235B (no exact figure found)
        ("Qwen/Qwen3.5-35B-A3B-Base", 35e9),  # the name's 35B (no exact figure found)
        ("Qwen/Qwen3.5-397B-A17B", 397e9),  # the name's 397B (no exact figure found)
    ],
)
def test_coverage_entries_match_published_totals(name, published):
    assert resolve_model(name).params.total == pytest.approx(published, rel=0.005)


@pytest.mark.parametrize(
    ("name", "card_billions"),
    [
        ("ibm-granite/granite-3.0-2b-base", 2.5),
        ("ibm-granite/granite-3.1-2b-instruct", 2.5),
        ("ibm-granite/granite-3.0-1b-a400m-instruct", 1.3),
        ("ibm-granite/granite-3.1-3b-a800m-base", 3.3),
        ("HuggingFaceTB/SmolLM-1.7B-Instruct", 1.7),
        ("microsoft/Phi-4-mini-instruct", 3.8),
        ("Qwen/Qwen3-4B-Thinking-2507", 4.0),
        ("Qwen/Qwen3-VL-8B-Instruct", 8.8),  # hub count as listed for Instruct and Thinking
        ("OpenGVLab/InternVL3_5-8B-HF", 8.5),  # 8.5B total as listed for InternVL3_5-8B
        ("mistralai/Ministral-3-3B-Instruct-2512", 3.8),  # card: 3.4B language model + 0.4B vision encoder
        ("Qwen/Qwen3.5-4B-Base", 4.5),  # listed as "a 4.5 billion parameter" model (the MTP block not built)
    ],
)
def test_coverage_entries_match_one_decimal_cards(name, card_billions):
    assert round(resolve_model(name).params.total / 1e9, 1) == card_billions


# Cards that state only the size in the model's name ("a 7B parameter model"): the count rounds to it. The
# exact counts (StarCoder2-7B 7,173,923,840; LLaVA-1.5-7B 7,063,427,072 with its 0.30B CLIP tower) are above
# the nominal 7B by 2.5 % and 0.9 %, as the hub pages' own counts are.
@pytest.mark.parametrize(
    ("name", "card_billions"),
    [
        ("bigcode/starcoder2-7b", 7),
        ("llava-hf/llava-1.5-7b-hf", 7),
        ("OpenGVLab/InternVL3_5-30B-A3B-HF", 31),  # "~31B" in a public variant table
        ("Qwen/Qwen2-VL-2B-Instruct", 2),  # Qwen2-VL report abstract: "2B, 8B, and 72B"
        ("Qwen/Qwen2-VL-7B", 8),
        ("google/gemma-3-27b-it", 27),  # 27.43B: a 417M SigLIP tower beside the language model
    ],
)
def test_coverage_entries_round_to_the_nominal_size(name, card_billions):
    assert round(resolve_model(name).params.total / 1e9) == card_billions


# Base / long-context / instruction-tuned checkpoints aliased to an entry of one shape: the model cards state the
# same totals, layers and heads (Qwen2.5-Coder, Qwen2.5-1M) and the alias resolves to that entry.
@pytest.mark.parametrize(
    ("name", "slug"),
    [
        ("Qwen/Qwen2.5-Coder-3B", "qwen2.5-3b"),
        ("Qwen/Qwen2.5-Coder-14B", "qwen2.5-14b"),
        ("Qwen/Qwen2.5-Coder-32B", "qwen2.5-32b"),
        ("Qwen/Qwen2.5-7B-Instruct-1M", "qwen2.5-7b"),
        ("Qwen/Qwen2.5-14B-Instruct-1M", "qwen2.5-14b"),
        ("Qwen/Qwen2.5-Math-72B-Instruct", "qwen2.5-72b"),
        ("Qwen/QwQ-32B-Preview", "qwen2.5-32b"),  # litgpt's config: the sizes of QwQ-32B
        ("Qwen/Qwen3-30B-A3B-Thinking-2507", "qwen3-30b-a3b"),
        ("Qwen/Qwen3-235B-A22B-Thinking-2507", "qwen3-235b-a22b"),
        ("google/codegemma-7b-it", "gemma-7b"),
        ("alpindale/Mistral-7B-v0.2-hf", "mistral-7b-v0.1"),  # litgpt: v0.2 base has v0.1's sizes
    ],
)
def test_aliases_resolve_to_the_entry_of_their_shape(name, slug):
    assert resolve_model(name).catalog_slug == slug


# Vision-language entries whose card states the parts: the language model is the text model of the named size
# (its own card's total) and the vision side the report's figure, each to the precision it is stated in
# (half a unit of its last digit; 0.5 % of a three-digit figure).
@pytest.mark.parametrize(
    ("name", "text_params", "text_tolerance", "vision_params", "vision_tolerance"),
    [
        ("Qwen/Qwen2-VL-7B-Instruct", 7.6e9, 0.05e9, 675e6, 3.4e6),  # Qwen2-7B card 7.6B; ViT ~675M
        ("Qwen/Qwen2.5-VL-3B-Instruct", 3.09e9, 0.005e9, None, None),  # Qwen2.5-3B card: 3.09B
        ("Qwen/Qwen2-VL-72B-Instruct", 72_706_203_648, 0, None, None),  # keras-hub: Qwen2.5-72B
        ("Qwen/Qwen2.5-VL-32B-Instruct", 32_763_876_352, 0, None, None),  # keras-hub: Qwen2.5-32B
        ("Qwen/Qwen2.5-VL-72B-Instruct", 72_706_203_648, 0, None, None),  # keras-hub: Qwen2.5-72B
        ("mistralai/Ministral-3-3B-Base-2512", 3.4e9, 0.05e9, 0.4e9, 0.05e9),  # card: 3.4B LM + 0.4B vision
    ],
)
def test_vision_language_parts_match_their_cards(
    name, text_params, text_tolerance, vision_params, vision_tolerance
):
    p = resolve_model(name).params
    vision = p.vision_tower + p.projector
    assert abs(p.total - vision - text_params) <= text_tolerance
    if vision_params is not None:
        assert abs(vision - vision_params) <= vision_tolerance


def test_falcon_180b_is_the_nominal_180b_rounded_up():
    # 80 layers of 14848 with 232 heads in 8 KV groups, tied 65024-token embedding: 178.56B, which the card
    # calls "a 180B parameters" model (0.8 % above the count, two significant digits).
    total = resolve_model("tiiuae/falcon-180B-chat").params.total
    assert total == 178_557_088_768
    assert round(total, -10) == 180e9


# Gemma 3: the language model without its embedding, and the SigLIP tower, against the parameter table of the
# Gemma 3 technical report (arXiv 2503.19786, Table 1: non-embedding 3,209M / 10,759M / 25,600M, vision encoder
# 417M; figures as recalled from the report, not retrieved here). The report's embedding column (675M, 1,012M,
# 1,416M) is 0.4-0.6 % above the 262208-row tables these entries build (671M, 1,007M, 1,410M).
@pytest.mark.parametrize(
    ("name", "non_embedding"),
    [
        ("google/gemma-3-4b-it", 3_209e6),
        ("google/gemma-3-12b-pt", 10_759e6),
        ("google/gemma-3-27b-it", 25_600e6),
    ],
)
def test_gemma3_parts_match_the_report(name, non_embedding):
    p = resolve_model(name).params
    text = p.total - p.vision_tower - p.projector - p.embedding - p.lm_head
    assert abs(text - non_embedding) <= 0.5e6
    assert abs(p.vision_tower - 417e6) <= 0.5e6


# PaliGemma / PaliGemma 2: keras-hub's presets (keras_hub/src/models/pali_gemma/pali_gemma_presets.py) state the
# exact count of each model with the original 257152-token table; the Hugging Face checkpoints carry 64 more rows
# (transformers' converters resize to 257152 + 2 tokens, padded to a multiple of 64), so the count is the preset's
# plus 64 x hidden, to the parameter.
@pytest.mark.parametrize(
    ("name", "keras_params", "hidden"),
    [
        ("google/paligemma-3b-pt-224", 2_923_335_408, 2048),
        ("google/paligemma-3b-mix-448", 2_924_220_144, 2048),
        ("google/paligemma-3b-pt-896", 2_927_759_088, 2048),
        ("google/paligemma2-3b-pt-224", 3_032_094_960, 2304),
        ("google/paligemma2-3b-mix-448", 3_032_979_696, 2304),
        ("google/paligemma2-3b-pt-896", 3_036_518_640, 2304),
        ("google/paligemma2-10b-pt-224", 9_662_409_456, 3584),
        ("google/paligemma2-10b-mix-448", 9_663_294_192, 3584),
        ("google/paligemma2-10b-pt-896", 9_666_833_136, 3584),
        ("google/paligemma2-28b-mix-224", 27_650_192_112, 4608),
    ],
)
def test_paligemma_counts_equal_keras_hub_presets(name, keras_params, hidden):
    assert resolve_model(name).params.total == keras_params + 64 * hidden


def test_paligemma2_28b_resolutions_differ_by_their_position_embeddings():
    # keras-hub lists the 224 px figure for the 28B at 448 and 896 px too; the towers differ only in positions.
    at = {px: resolve_model(f"google/paligemma2-28b-pt-{px}").params.total for px in (224, 448, 896)}
    assert at[448] - at[224] == (1024 - 256) * 1152
    assert at[896] - at[224] == (4096 - 256) * 1152


# keras-hub states the exact count of each preset (keras_hub/src/models/*/*_presets.py, "params"); these catalog
# entries equal it to the parameter. Gemma 3 presets converted from Google's original checkpoints carry the
# 262144-row table (64 rows fewer than the Hugging Face 262208); keras-hub's Llama 3.2 presets count the tied head
# twice and are left out.
@pytest.mark.parametrize(
    ("name", "keras_params"),
    [
        ("Qwen/Qwen2.5-0.5B", 494_032_768),
        ("Qwen/Qwen2.5-3B", 3_085_938_688),
        ("Qwen/Qwen2.5-32B-Instruct", 32_763_876_352),
        ("Qwen/Qwen2.5-72B-Instruct", 72_706_203_648),
        ("Qwen/Qwen2.5-Math-1.5B", 1_543_714_304),  # tied, unlike DeepSeek-R1-Distill-Qwen-1.5B
        ("Qwen/Qwen2.5-Math-7B", 7_615_616_512),
        ("Qwen/Qwen3-0.6B", 596_049_920),
        ("Qwen/Qwen3-1.7B", 1_720_574_976),
        ("Qwen/Qwen3-4B", 4_022_468_096),
        ("Qwen/Qwen3-8B", 8_190_735_360),
        ("Qwen/Qwen3-14B", 14_768_307_200),
        ("Qwen/Qwen3-32B", 32_762_123_264),
        ("Qwen/Qwen3.5-4B-Base", 4_539_265_536),
        ("Qwen/Qwen3.5-35B-A3B", 35_107_181_936),
        ("Qwen/Qwen3.5-9B-Base", 9_409_813_744),
        ("Qwen/Qwen3.5-27B", 27_356_728_560),
        ("Qwen/Qwen3.5-0.8B-Base", 852_985_920),
        ("meta-llama/Meta-Llama-3-8B", 8_030_261_248),
        ("mistralai/Mistral-7B-v0.1", 7_241_732_096),
        ("mistralai/Mistral-7B-v0.3", 7_248_023_552),
        ("microsoft/Phi-3-mini-4k-instruct", 3_821_079_552),
        ("google/codegemma-1.1-2b", 2_506_172_416),
        ("google/codegemma-1.1-7b-it", 8_537_680_896),
        ("google/gemma-2-2b", 2_614_341_888),
        ("google/gemma-2-9b", 9_241_705_984),
        ("google/gemma-2-27b", 27_227_128_320),
        ("google/gemma-3-1b-pt", 999_885_952),
        ("google/gemma-3-270m-it", 268_098_176),
        ("google/medgemma-4b-it", 4_300_079_472),
        ("google/medgemma-27b-text-it", 27_009_002_240),
    ],
)
def test_counts_equal_keras_hub_presets(name, keras_params):
    assert resolve_model(name).params.total == keras_params


@pytest.mark.parametrize(
    ("name", "keras_params", "hidden"),
    [
        ("google/gemma-3-4b-pt", 4_299_915_632, 2560),
        ("google/gemma-3-12b-it", 12_187_079_280, 3840),
        ("google/gemma-3-27b-pt", 27_432_062_576, 5376),
    ],
)
def test_gemma3_counts_are_keras_hub_presets_plus_the_64_hub_rows(name, keras_params, hidden):
    assert resolve_model(name).params.total == keras_params + 64 * hidden
