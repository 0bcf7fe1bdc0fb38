"""Baichuan(2)-13B's remote code runs its own ALiBi attention whatever `attn_implementation` says: dense 16-bit
[b, heads, s, s] scores and masks (baichuan-inc/Baichuan2-13B-Chat modeling_baichuan.py, `BaichuanAttention.forward`
and `BaichuanModel.get_alibi_mask`). The 7B models use RoPE and are planned like any Llama-style decoder."""

from __future__ import annotations

import math

import pytest

from zerodoctor.models import resolve_model
from zerodoctor.plan.activations import _attention_saved, _Shape, activation_bytes, remote_alibi_attention

B13 = "baichuan-inc/Baichuan2-13B-Chat"


def test_only_the_13b_models_are_alibi():
    assert remote_alibi_attention(resolve_model(B13))
    assert remote_alibi_attention(resolve_model("baichuan-inc/Baichuan-13B-Chat"))
    assert not remote_alibi_attention(resolve_model("baichuan-inc/Baichuan2-7B-Chat"))
    assert not remote_alibi_attention(resolve_model("meta-llama/Llama-2-13b-hf"))


def test_attn_implementation_does_not_change_a_13b_plan_and_the_masks_are_charged():
    spec = resolve_model(B13)
    kw = {"micro_batch": 1, "seq_len": 8192, "gradient_checkpointing": True, "lora_rank": 8}
    by_impl = {impl: activation_bytes(spec, attn_impl=impl, lora_targets=("W_pack",), **kw) for impl in ("sdpa", "flash", "eager")}
    peaks = {e.peak for e in by_impl.values()}
    assert len(peaks) == 1
    est = by_impl["sdpa"]
    score = 2 * 40 * 8192 * 8192  # one 16-bit [1, 40, 8192, 8192] tensor: 5 GiB
    # the two masks stay from the forward to the end of the backward: the checkpointed inputs + masks + head
    assert est.saved_total >= 2 * score + 40 * 8192 * 5120 * 2
    assert any("ALiBi" in n for n in est.notes) and est.attention_used.startswith("dense ALiBi")
    # in the recomputed layer's backward: two saved score tensors + three gradients of that size
    assert est.backward_transient >= 5 * score
    llama = activation_bytes(resolve_model("meta-llama/Llama-2-13b-hf"), attn_impl="sdpa", **kw)
    assert est.peak > llama.peak + 6 * score  # a 13B Llama with sdpa keeps no score matrix at all


def test_alibi_attention_saves_what_autograd_saves_on_cpu():
    """The op sequence of BaichuanAttention.forward (eager branch, 16-bit softmax) run on CPU under
    saved_tensors_hooks: matmul keeps copies of q and k^T (non-contiguous views of W_pack's output), `torch.max`
    keeps its [b, a, s, s] input, softmax its output (which matmul(p, v) keeps too), matmul(p, v) a copy of v."""
    torch = pytest.importorskip("torch")
    b, s, a, d = 2, 64, 4, 16
    h = a * d
    proj_in = torch.randn(b, s, 3 * h, dtype=torch.bfloat16, requires_grad=True)
    mask = torch.randn(b, a, s, s, dtype=torch.bfloat16)
    storages: dict[int, int] = {}

    def pack(t):  # type: ignore[no-untyped-def]
        st = t.untyped_storage()
        storages[st.data_ptr()] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        proj = proj_in * 1  # W_pack's output: a fresh storage
        proj = proj.unflatten(-1, (3, h)).unsqueeze(0).transpose(0, -2).squeeze(-2)
        q = proj[0].view(b, s, a, d).transpose(1, 2)
        k = proj[1].view(b, s, a, d).transpose(1, 2)
        v = proj[2].view(b, s, a, d).transpose(1, 2)
        w = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(d)
        w = w + mask
        w = torch.max(w, torch.tensor(torch.finfo(w.dtype).min))
        w = torch.nn.functional.softmax(w, dim=-1)
        torch.matmul(w, v).transpose(1, 2).reshape(b, s, h)
    shape = _Shape(
        tokens=b * s, batch=b, seq=s, hidden=h, inter=4 * h, q_dim=h, kv_dim=h, heads=a, kv_heads=a,
        head_dim=d, vocab=100, d=2,
    )
    # `proj_in * 1` saves nothing of size (a Python scalar); the clamp's 0-dim fp32 bound is 4 bytes
    assert sum(storages.values()) == _attention_saved(shape, "alibi") + 4
