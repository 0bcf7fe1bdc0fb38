"""Activation-memory formula: hand arithmetic, and a small real measurement held to <= 5 %.

The hand numbers use a tiny Llama (h 256, i 688, 8 heads, 2 kv heads, head_dim 32, V 1024, 3 layers),
b = 1, s = 128, bf16, so T = 128 tokens. The real measurement builds that model with transformers and
sums the bytes autograd saves (saved_tensors_hooks, parameters excluded), exactly as
benchmarks/plan_activations.py does.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from zerodoctor.errors import PlanError
from zerodoctor.models.spec import ModelSpec, model_from_config, resolve_model
from zerodoctor.plan.activations import ActivationEstimate, activation_bytes

ROOT = Path(__file__).resolve().parents[2]

TINY = {
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 688,
    "num_hidden_layers": 3,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "vocab_size": 1024,
    "max_position_embeddings": 4096,
}
T = 128  # tokens


@pytest.fixture(scope="module")
def tiny() -> ModelSpec:
    return model_from_config(TINY, name="tiny", source=Path("<tiny>"))


# Per-layer pieces by hand (bf16, full fine-tuning, T = 128):
NORM = (4 * 256 + 4) * T + 2 * 256 * T  # fp32 copy + fp32 rsqrt + bf16 normalised x = 197,120
QKV_IN = 2 * T * 256  # the norm output q/k/v_proj keep = 65,536
SDPA = 2 * T * (2 * 256 + 2 * 64) + 4 * 8 * T  # rotated q, k, v, output + fp32 logsumexp = 167,936
MLP = 4 * 2 * T * 688  # gate out, silu out, up out, product = 704,512
MLP_IN = 2 * T * 256  # the norm output gate/up_proj keep = 65,536
LAYER_SDPA = 2 * NORM + QKV_IN + SDPA + MLP + MLP_IN
HEAD = NORM + 2 * T * 256 + 4 * T * 1024 + 8 * (T + 1) + 4  # final norm, lm_head in, log-probs, labels
EMBED_IDS = 8 * T  # input_ids kept by the embedding
ROPE = 2 * 2 * 128 * 32  # cos and sin, shared by all layers


def test_per_layer_sdpa_by_hand(tiny: ModelSpec) -> None:
    est = activation_bytes(tiny, micro_batch=1, seq_len=128, attn_impl="sdpa")
    assert LAYER_SDPA == 1_397_760  # also what saved_tensors_hooks measures on the real layer
    assert est.per_layer_saved == LAYER_SDPA
    assert est.layers == 3
    assert est.saved_total == 3 * LAYER_SDPA + EMBED_IDS + ROPE + HEAD


def test_eager_keeps_scores_and_repeated_kv(tiny: ModelSpec) -> None:
    est = activation_bytes(tiny, micro_batch=1, seq_len=128, attn_impl="eager")
    # q, repeat_kv'd k and v at all 8 heads; fp32 softmax output + its bf16 copy (8 x 128 x 128 each);
    # o_proj keeps its own contiguous copy of the output.
    eager = 2 * T * (256 + 2 * 256) + (4 + 2) * 8 * 128 * 128 + 2 * T * 256
    assert est.per_layer_saved == LAYER_SDPA - SDPA + eager


def test_flash_saves_like_sdpa_and_says_it_is_unmeasured(tiny: ModelSpec) -> None:
    flash = activation_bytes(tiny, micro_batch=2, seq_len=512, attn_impl="flash")
    sdpa = activation_bytes(tiny, micro_batch=2, seq_len=512, attn_impl="sdpa")
    assert flash.per_layer_saved == sdpa.per_layer_saved
    assert any("CUDA-only" in n for n in flash.notes)


def test_gradient_checkpointing_keeps_layer_inputs(tiny: ModelSpec) -> None:
    est = activation_bytes(tiny, micro_batch=1, seq_len=128, gradient_checkpointing=True)
    assert est.checkpointed_input == 2 * T * 256
    assert est.saved_total == 3 * 2 * T * 256 + EMBED_IDS + HEAD  # cos/sin sit in the closure, not saved
    # backward recomputes one layer at a time: its saved bytes are part of the transient
    assert est.backward_transient > est.per_layer_saved
    assert est.peak >= est.saved_total


def test_scaling_in_batch_and_sequence(tiny: ModelSpec) -> None:
    a = activation_bytes(tiny, micro_batch=1, seq_len=128)
    b = activation_bytes(tiny, micro_batch=4, seq_len=128)
    assert b.per_layer_saved == 4 * a.per_layer_saved  # everything is linear in b
    e1 = activation_bytes(tiny, micro_batch=1, seq_len=128, attn_impl="eager")
    e2 = activation_bytes(tiny, micro_batch=1, seq_len=256, attn_impl="eager")
    assert e2.per_layer_saved > 2 * e1.per_layer_saved  # the s^2 scores


def test_sequence_parallel_divides_the_sequence(tiny: ModelSpec) -> None:
    sp = activation_bytes(tiny, micro_batch=1, seq_len=512, sequence_parallel=4)
    local = activation_bytes(tiny, micro_batch=1, seq_len=128)
    assert sp.per_layer_saved == local.per_layer_saved
    assert sp.saved_total == local.saved_total
    assert any("sequence parallel 4" in n for n in sp.notes)


def test_logits_and_loss_by_hand(tiny: ModelSpec) -> None:
    est = activation_bytes(tiny, micro_batch=1, seq_len=128)
    tv = T * 1024
    # forward: bf16 logits + fp32 upcast + fp32 log-probs = 10 TV; backward: 3 fp32 TV buffers = 12 TV
    assert est.logits_and_loss == max(10 * tv, 12 * tv)
    fp32 = activation_bytes(tiny, micro_batch=1, seq_len=128, dtype_bytes=4)
    assert fp32.logits_and_loss == 12 * tv  # no upcast copy in an fp32 model


def test_lora_all_linear_by_hand(tiny: ModelSpec) -> None:
    r = 8
    norms = 2 * (4 * 256 + 4) * T  # frozen weights: only the fp32 copy and rsqrt
    mlp = 3 * 2 * T * 688  # gate out, silu out, up out (the product is kept only as down's input)
    # DeepSpeed bf16 (the default): adapters are bf16, so lora_A's input is the very tensor the frozen
    # base received -- q/k/v share one, gate/up share one, o_proj's is the sdpa output already counted.
    est = activation_bytes(tiny, micro_batch=1, seq_len=128, lora_rank=r, lora_targets=("all-linear",))
    bf16 = (
        (2 * T * 256 + 3 * 2 * T * r)  # q, k, v
        + 2 * T * r  # o_proj: lora_A output only
        + (2 * T * 256 + 2 * 2 * T * r)  # gate, up
        + (2 * T * 688 + 2 * T * r)  # down
    )
    assert est.per_layer_saved == norms + bf16 + SDPA + mlp == 1_281_024  # measured on the real layer
    # PEFT's default fp32 adapters without DeepSpeed: every adapter keeps its own fp32 copy of its input.
    fp32 = activation_bytes(
        tiny, micro_batch=1, seq_len=128, lora_rank=r, lora_targets=("all-linear",), lora_adapter_bytes=4
    )
    copies = (
        3 * (4 * T * 256 + 4 * T * r)  # q, k, v
        + (4 * T * 256 + 4 * T * r)  # o_proj
        + 2 * (4 * T * 256 + 4 * T * r)  # gate, up
        + (4 * T * 688 + 4 * T * r)  # down
    )
    assert fp32.per_layer_saved == norms + copies + SDPA + mlp == 2_126_848  # measured too
    assert fp32.per_layer_saved > activation_bytes(tiny, micro_batch=1, seq_len=128).per_layer_saved
    only_q = activation_bytes(tiny, micro_batch=1, seq_len=128, lora_rank=r, lora_targets=("q_proj",))
    assert only_q.per_layer_saved < est.per_layer_saved


def test_moe_and_real_catalog_model() -> None:
    spec = resolve_model("llama-3.1-8b")
    est = activation_bytes(spec, micro_batch=1, seq_len=4096, attn_impl="flash", gradient_checkpointing=True)
    assert est.checkpointed_input == 2 * 4096 * 4096
    assert est.saved_total < est.peak
    # Llama-3 vocabulary: fp32 log-probs alone are 4 x 4096 x 128256 bytes
    assert est.logits_and_loss >= 12 * 4096 * 128256
    mixtral = resolve_model("mixtral-8x7b")
    moe = activation_bytes(mixtral, micro_batch=1, seq_len=1024)
    assert moe.layers == mixtral.params.num_layers and moe.per_layer_saved > 0


def test_bad_arguments(tiny: ModelSpec) -> None:
    with pytest.raises(PlanError):
        activation_bytes(tiny, micro_batch=1, seq_len=128, attn_impl="flex")
    with pytest.raises(PlanError):
        activation_bytes(tiny, micro_batch=0, seq_len=128)
    with pytest.raises(PlanError):
        activation_bytes(tiny, micro_batch=1, seq_len=128, dtype_bytes=1)
    with pytest.raises(PlanError):
        activation_bytes(tiny, micro_batch=1, seq_len=128, lora_rank=8, lora_targets=("nope",))
    with pytest.raises(PlanError):
        activation_bytes(tiny, micro_batch=1, seq_len=128, lora_rank=8, lora_adapter_bytes=3)


def test_import_is_light() -> None:
    code = (
        "import sys, zerodoctor.plan.activations as a, zerodoctor.models.spec as m; "
        "a.activation_bytes(m.resolve_model('llama-3.1-8b'), micro_batch=1, seq_len=8192); "
        "bad = [x for x in ('torch', 'transformers') if x in sys.modules]; assert not bad, bad"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr


def test_estimate_is_frozen(tiny: ModelSpec) -> None:
    est = activation_bytes(tiny, micro_batch=1, seq_len=16)
    assert isinstance(est, ActivationEstimate)
    with pytest.raises(AttributeError):
        est.peak = 0  # type: ignore[misc]


# ---- real measurement ------------------------------------------------------------------------------


def _bench() -> ModuleType:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    spec = importlib.util.spec_from_file_location(
        "plan_activations", ROOT / "benchmarks" / "plan_activations.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("plan_activations", module)  # its dataclass looks itself up there
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_prediction_matches_saved_tensor_hooks(attn: str) -> None:
    bench = _bench()
    model, spec = bench.build("llama-gqa", attn, bench.torch.bfloat16)
    for batch, seq in ((1, 64), (2, 128)):
        for gc in (False, True):
            got = bench.measure(model, batch, seq, gc, spec.params.vocab_size)
            if gc:
                model.activation_checkpointing_disable()
            model.zero_grad(set_to_none=True)
            est = activation_bytes(
                spec, micro_batch=batch, seq_len=seq, attn_impl=attn, gradient_checkpointing=gc
            )
            assert abs(est.saved_total / got["total"] - 1) <= 0.05, (batch, seq, gc, est, got)
            if not gc:
                assert abs(est.per_layer_saved / got["layer"] - 1) <= 0.05, (batch, seq, est, got)
