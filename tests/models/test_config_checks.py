"""A model config.json that no transformers model could be built from is a one-line error, not a plan (the fuzz
campaign of 2026-11-25 found these planned silently, or crashing inside the allocator replay)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from zerodoctor.cli.main import main

LLAMA = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "vocab_size": 32000,
}
MIXTRAL = {
    **LLAMA,
    "model_type": "mixtral",
    "architectures": ["MixtralForCausalLM"],
    "intermediate_size": 14336,
    "num_key_value_heads": 8,
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
}
CLUSTER = ["--gpus-per-node", "8", "--gpu-memory", "80", "--host-ram", "512"]


def _plan(tmp_path: Path, config: dict[str, object], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    code = main(["plan", "--model", str(path), *CLUSTER])
    return code, capsys.readouterr().err


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"num_key_value_heads": 64}, "num_key_value_heads (64) must divide num_attention_heads (32)"),
        ({"num_key_value_heads": 12}, "num_key_value_heads (12) must divide num_attention_heads (32)"),
        ({"vocab_size": 10**15}, "more than any model"),
    ],
)
def test_a_dense_config_no_model_could_have_is_refused(tmp_path, capsys, change, words):
    code, err = _plan(tmp_path, {**LLAMA, **change}, capsys)
    assert code == 2
    assert words in err and "config.json" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"num_local_experts": 0}, "a MoE model with 0 experts per layer"),
        ({"num_experts_per_tok": 9}, "num_experts_per_tok (9) must be between 1 and the 8 experts"),
        ({"num_experts_per_tok": 0}, "num_experts_per_tok (0) must be between 1 and the 8 experts"),
    ],
)
def test_a_moe_config_whose_router_cannot_route_is_refused(tmp_path, capsys, change, words):
    code, err = _plan(tmp_path, {**MIXTRAL, **change}, capsys)
    assert code == 2
    assert words in err and "Traceback" not in err


def test_the_same_configs_within_limits_still_plan(tmp_path, capsys):
    """The checks refuse only what cannot be built: GQA with 8 of 32 heads, MQA, and top-2 of 8 experts plan."""
    for config in ({**LLAMA, "num_key_value_heads": 8}, {**LLAMA, "num_key_value_heads": 1}, MIXTRAL):
        code, err = _plan(tmp_path, config, capsys)
        assert code in (0, 1), err
