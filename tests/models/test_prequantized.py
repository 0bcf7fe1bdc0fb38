"""Pre-quantized hub ids (GPTQ / AWQ / bitsandbytes checkpoints) resolve to their 16-bit base's shapes with the
quantization recorded; a config.json's `quantization_config` records the same from the file (issue 9).

The ids are real: registered in LLaMA-Factory's src/llamafactory/extras/constants.py (the Qwen (v1) `-Int4`/`-Int8`
and Yi ids before commit 5cccaeec8 removed them), or published by TheBloke."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from zerodoctor.errors import PlanError
from zerodoctor.models import resolve_model
from zerodoctor.models.spec import close_matches, split_prequantized

GPTQ_QUANT_CONFIG = {  # Qwen/Qwen-72B-Chat-Int4's quantization_config (auto-gptq)
    "bits": 4, "group_size": 128, "damp_percent": 0.01, "desc_act": False, "static_groups": False, "sym": True,
    "true_sequential": True, "model_name_or_path": None, "model_file_base_name": "model", "quant_method": "gptq",
}  # fmt: skip
QWEN2_TINY = {"model_type": "qwen2", "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128}  # fmt: skip


@pytest.mark.parametrize(
    ("hub_id", "base_slug", "method", "bits"),
    [
        ("Qwen/Qwen-72B-Chat-Int4", "qwen-72b", "gptq", 4),
        ("Qwen/Qwen-7B-Chat-Int8", "qwen-7b", "gptq", 8),
        ("Qwen/Qwen2.5-7B-Instruct-GPTQ-Int4", "qwen2.5-7b", "gptq", 4),
        ("Qwen/Qwen2.5-7B-Instruct-GPTQ-Int8", "qwen2.5-7b", "gptq", 8),
        ("Qwen/Qwen2.5-14B-Instruct-AWQ", "qwen2.5-14b", "awq", 4),
        ("Qwen/Qwen3-30B-A3B-GPTQ-Int4", "qwen3-30b-a3b", "gptq", 4),
        ("Qwen/Qwen1.5-MoE-A2.7B-Chat-GPTQ-Int4", "qwen1.5-moe-a2.7b", "gptq", 4),
        ("01-ai/Yi-34B-Chat-4bits", "yi-34b", "awq", 4),
        ("01-ai/Yi-6B-Chat-8bits", "yi-6b", "gptq", 8),
        ("TheBloke/Llama-2-70B-chat-GPTQ", "llama-2-70b", "gptq", 4),
        ("TheBloke/Llama-2-70B-chat-AWQ", "llama-2-70b", "awq", 4),
    ],
)
def test_prequantized_hub_id_resolves_to_its_base(hub_id, base_slug, method, bits):
    spec = resolve_model(hub_id)
    base = resolve_model(base_slug)
    assert spec.name == hub_id and spec.display_name == hub_id and spec.hub_ids == (hub_id,)
    assert spec.catalog_slug == base_slug and spec.model_type == base.model_type
    assert spec.params == base.params  # the 16-bit architecture, counted as the base
    q = spec.quantization
    assert q is not None and (q.method, q.bits, q.group_size) == (method, bits, None)
    assert "hub id suffix" in q.source and "pre-quantized checkpoint of" in spec.notes
    # The planner models 4-bit bases only: an 8-bit one carries the reason it refuses.
    if bits == 4:
        assert q.planner_refusal is None
    else:
        assert q.planner_refusal is not None and "4-bit quantized bases only" in q.planner_refusal


def test_a_vision_language_checkpoint_stays_vision_language():
    # Never another architecture: the AWQ Qwen2.5-VL is the VL entry, not the text-only Qwen2.5-7B.
    spec = resolve_model("Qwen/Qwen2.5-VL-7B-Instruct-AWQ")
    assert (
        spec.catalog_slug == "qwen2.5-vl-7b" and spec.model_type == "qwen2_5_vl" and spec.params.is_multimodal
    )
    assert spec.quantization is not None and spec.quantization.method == "awq"


def test_the_16bit_ids_are_untouched():
    assert resolve_model("Qwen/Qwen2.5-7B-Instruct").quantization is None
    assert resolve_model("qwen2.5-72b").quantization is None


def test_qwen_72b_quantized_releases_carry_their_padded_mlp():
    # QwenLM/Qwen2#578: the released 72B GPTQ/AWQ checkpoints pad intermediate_size 29568 -> 29696.
    base = resolve_model("Qwen/Qwen2-72B-Instruct")
    awq = resolve_model("Qwen/Qwen2-72B-Instruct-AWQ")
    assert base.config["intermediate_size"] == 29568 and awq.config["intermediate_size"] == 29696
    assert awq.params.total - base.params.total == 80 * 3 * 8192 * 128
    assert "29696" in awq.notes and awq.quantization is not None and awq.quantization.method == "awq"
    # The 7B has no padding: the base's sizes.
    assert (
        resolve_model("Qwen/Qwen2-7B-Instruct-AWQ").params == resolve_model("Qwen/Qwen2-7B-Instruct").params
    )


@pytest.mark.parametrize(
    ("hub_id", "base"),
    [
        ("Qwen/Qwen2.5-Omni-7B-AWQ", "Qwen/Qwen2.5-Omni-7B"),
        ("CohereForAI/c4ai-command-r-v01-4bit", "CohereForAI/c4ai-command-r-v01"),
        ("xverse/XVERSE-13B-Chat-GPTQ-Int4", "xverse/XVERSE-13B-Chat"),
    ],
)
def test_an_id_whose_base_is_not_bundled_stays_unknown(hub_id, base):
    with pytest.raises(PlanError) as err:
        resolve_model(hub_id)
    message = str(err.value)
    assert (
        message.startswith(f"unknown model '{hub_id}'")
        and f"16-bit base {base} is neither bundled" in message
    )
    # The close matches are the same rule as for any other name: only the architecture the name denotes.
    for match in close_matches(hub_id):
        assert match in message


def test_only_the_suffix_is_stripped_and_never_fuzzily():
    assert split_prequantized("Qwen/Qwen2.5-7B-Instruct") is None
    assert split_prequantized("-AWQ") is None and split_prequantized("org/-AWQ") is None
    base, q = split_prequantized("Qwen/Qwen2.5-7B-Instruct-GPTQ-Int4") or ("", None)
    assert base == "Qwen/Qwen2.5-7B-Instruct" and q is not None and q.method == "gptq"
    # A misspelt base is not rescued by the suffix: it stays unknown.
    with pytest.raises(PlanError, match="unknown model"):
        resolve_model("Qwen/Qwen2.5-7B-Instrcut-AWQ")


def _write(directory: Path, config: dict) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def test_a_gptq_config_json_records_its_quantization(tmp_path):
    model_dir = _write(
        tmp_path / "Qwen2-tiny-GPTQ-Int4", {**QWEN2_TINY, "quantization_config": GPTQ_QUANT_CONFIG}
    )
    spec = resolve_model(str(model_dir))
    q = spec.quantization
    assert q is not None and (q.method, q.bits, q.group_size) == ("gptq", 4, 128)
    assert q.source.endswith("config.json: quantization_config") and q.planner_refusal is None
    assert spec.params == resolve_model(str(_write(tmp_path / "plain", QWEN2_TINY))).params


def test_an_8bit_config_json_is_resolved_and_says_the_planner_refuses_it(tmp_path):
    cfg = {**QWEN2_TINY, "quantization_config": {**GPTQ_QUANT_CONFIG, "bits": 8}}
    q = resolve_model(str(_write(tmp_path / "m8", cfg))).quantization
    assert q is not None and q.bits == 8 and q.planner_refusal is not None
    assert "gptq 8-bit" in q.planner_refusal and "quantization_config" in q.planner_refusal


@pytest.mark.parametrize(
    ("block", "expected"),
    [
        ({"quant_method": "awq", "group_size": 128, "zero_point": True, "version": "gemm"}, ("awq", 4, 128)),
        (
            {"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4"},
            ("bnb", 4, None),
        ),
        ({"quant_method": "bitsandbytes", "_load_in_8bit": True, "load_in_8bit": True}, ("bnb", 8, None)),
        ({"load_in_4bit": True, "bnb_4bit_compute_dtype": "bfloat16"}, ("bnb", 4, None)),  # no quant_method
        ({"quant_method": "gptq", "bits": 4, "group_size": -1}, ("gptq", 4, -1)),
        ({"quant_method": "fp8", "activation_scheme": "dynamic"}, ("fp8", None, None)),
    ],
)
def test_quantization_config_fields_as_transformers_names_them(tmp_path, block, expected):
    q = resolve_model(str(_write(tmp_path / "m", {**QWEN2_TINY, "quantization_config": block}))).quantization
    assert q is not None and (q.method, q.bits, q.group_size) == expected
    assert (q.planner_refusal is None) == (expected[1] == 4)


@pytest.mark.parametrize(
    ("block", "key"),
    [
        ("gptq", "'quantization_config' must be an object"),
        ({"bits": 4}, "has no 'quant_method'"),
        ({"quant_method": "gptq", "bits": "four"}, "quantization_config.bits"),
        ({"quant_method": "gptq", "bits": 4, "group_size": 0}, "quantization_config.group_size"),
        ({"quant_method": "bitsandbytes", "load_in_4bit": "yes"}, "quantization_config.load_in_4bit"),
    ],
)
def test_a_bad_quantization_config_is_one_error_naming_the_key(tmp_path, block, key):
    model_dir = _write(tmp_path / "bad", {**QWEN2_TINY, "quantization_config": block})
    with pytest.raises(PlanError) as err:
        resolve_model(str(model_dir))
    assert key in str(err.value) and str(model_dir / "config.json") in str(err.value)


def _cache(root: Path, hub_id: str, config: dict) -> None:
    repo = root / f"models--{hub_id.replace('/', '--')}"
    _write(repo / "snapshots" / "abc", config)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc")


def test_the_cached_checkpoint_wins_and_a_cached_base_serves_an_unbundled_one(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    # The quantized checkpoint itself in the cache: its own config.json says what it is (group size included).
    _cache(
        tmp_path,
        "Qwen/Qwen2.5-7B-Instruct-GPTQ-Int4",
        {**QWEN2_TINY, "quantization_config": GPTQ_QUANT_CONFIG},
    )
    q = resolve_model("Qwen/Qwen2.5-7B-Instruct-GPTQ-Int4").quantization
    assert q is not None and q.group_size == 128 and "quantization_config" in q.source
    # Only the 16-bit base in the cache (not bundled): the quantized id resolves to it, named as given.
    _cache(tmp_path, "acme/Tiny-Chat", QWEN2_TINY)
    spec = resolve_model("acme/Tiny-Chat-AWQ")
    assert spec.name == "acme/Tiny-Chat-AWQ" and spec.catalog_slug is None
    assert spec.quantization is not None and spec.quantization.method == "awq"


def test_a_local_path_named_after_a_quantized_checkpoint(tmp_path):
    # A mount point without config.json, and a path that does not exist here: both resolve by name.
    empty = tmp_path / "Qwen2.5-7B-Instruct-AWQ"
    empty.mkdir()
    assert resolve_model(str(empty)).catalog_slug == "qwen2.5-7b"
    spec = resolve_model("/models/Qwen2.5-7B-Instruct-GPTQ-Int4")
    assert spec.catalog_slug == "qwen2.5-7b" and spec.quantization is not None


@pytest.mark.parametrize(
    ("name", "slug", "method"),
    [
        # `-Int4` / `-4bits` name the method only in their publisher's naming (Qwen v1: GPTQ; Yi: AWQ) ...
        ("Qwen/Qwen-14B-Chat-Int4", "qwen-14b", "gptq"),
        ("/models/Qwen-72B-Chat-Int4", "qwen-72b", "gptq"),  # a path: the bundled base's owner decides
        ("/data/Yi-6B-Chat-4bits", "yi-6b", "awq"),
        # ... elsewhere the name says the bits, not the method: ChatGLM's own int4 format, Baichuan2's 4bits.
        ("THUDM/chatglm2-6b-int4", "chatglm3-6b", None),
        ("baichuan-inc/Baichuan2-13B-Chat-4bits", "baichuan2-13b", None),
    ],
)
def test_a_publisher_specific_suffix_names_the_method_only_for_its_publisher(name, slug, method):
    spec = resolve_model(name)
    q = spec.quantization
    assert spec.catalog_slug == slug and q is not None and q.bits == 4 and q.method == method
    assert q.planner_refusal is None  # 4-bit: the run's quantization method stands in for an unnamed one
    if method is None:
        assert "the method is named by this suffix only for" in q.source
