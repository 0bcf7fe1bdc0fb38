"""Activation memory of one micro-batch for Hugging Face decoder models, derived op by op.

`activation_bytes(spec, micro_batch=b, seq_len=s, ...)` predicts the bytes that autograd keeps for the
backward pass ("saved tensors") when transformers 5.23 trains a decoder model, plus the logits/loss
transient and the backward transient, for the three attention back ends (`flash` = flash-attention-2,
`sdpa` = `torch.nn.functional.scaled_dot_product_attention`, `eager`), with or without HF gradient
checkpointing, for full fine-tuning or LoRA.

Nothing here is fitted. Every term below is what one autograd node saves, read from the transformers
5.23 modeling code (`models/llama/modeling_llama.py`, `integrations/sdpa_attention.py`,
`integrations/moe.py`, `loss/loss_utils.py`) and PyTorch's derivative formulas, and checked against
`torch.autograd.graph.saved_tensors_hooks` on real transformers layers by `benchmarks/plan_activations.py`
(bf16 and fp32 on CPU; flash-attention needs CUDA and is predicted only). Notation: T = b x s tokens on
this rank, h = hidden, i = intermediate, nq = heads x head_dim, nkv = kv_heads x head_dim, a = heads,
V = vocab, D = bytes of the model dtype (2 for bf16), fp32 = 4 bytes.

Where the classic formula (Korthikanti et al. 2022: sbh(34 + 5as/h) per GPT layer, docs/memory-model.md)
is wrong for a modern HF model in bf16:

* RMSNorm (`LlamaRMSNorm`) upcasts to fp32 and autograd keeps the fp32 copy (`pow` and the `mul` by
  `rsqrt` both save it) and the fp32 `rsqrt` (b x s x 1): 4Th + 4T per norm, then the bf16
  normalised tensor (saved by `weight * x`) and its output (saved by the next Linear): 2 x D Th more.
  Two norms per layer: 8Th + 2 x 2DTh + 8T -- more than the 4sbh Korthikanti gives two LayerNorms.
* RoPE does not keep q and k before rotation: `q * cos` saves only `cos`. What attention keeps is the
  rotated q (nq) and k (nkv) and v (nkv); with GQA k and v are kv-head sized for sdpa (the CPU and
  CUDA kernels get `enable_gqa=True` when there is no padding mask) and flash, but `repeat_kv` expands
  them to all heads in eager.
* SDPA/flash keep the attention output and a fp32 logsumexp (4 x b x a x s); the output is already in
  (b, s, a, d) layout, so the `transpose(1, 2).contiguous()` before `o_proj` copies nothing and `o_proj`
  saves the same storage. Eager keeps the fp32 softmax output (4 b a s^2) *and* its bf16 copy
  (D b a s^2): the 5as/h term of Korthikanti becomes (4 + D) b a s^2 here, no dropout mask.
* SwiGLU keeps gate output, SiLU output, up output and their product: 4 x D x T x i.
* No dropout masks anywhere (Llama/Mistral/Qwen2 have attention_dropout 0 and no hidden dropout).
* The loss upcasts the logits to fp32 (`logits.float()` in `ForCausalLMLoss`); `cross_entropy` is
  `log_softmax` + `nll_loss` and keeps the fp32 log-probabilities: 4TV saved, while the bf16 logits
  (D TV, alive in the model output) and the fp32 copy (4TV) exist only around the loss.

LoRA (PEFT) changes what the base model keeps: a frozen `nn.Linear` needs only its weight to pass the
gradient to its input, so it saves nothing; a frozen RMSNorm weight lets `weight * x` skip `x`. The
adapter keeps its input (`lora_A`) and `lora_A`'s output (`lora_B`). Under DeepSpeed bf16 the engine
casts every parameter, adapters included, to bf16, so the adapters of q, k and v share one saved input.
Plain PEFT upcasts adapter weights to fp32 (`autocast_adapter_dtype=True`) and every adapter then
casts its input to fp32 (`_cast_input_dtype`): a separate 4 x T x in copy per adapted module
(`lora_adapter_bytes=4`) -- LoRA then keeps more activation bytes than full fine-tuning.

Gradient checkpointing (HF default `use_reentrant=False`): each checkpointed decoder layer keeps only
its input hidden state (D Th, `_make_saved_tensor` of the positional argument; the rotary cos/sin are
held by the `partial`, not saved). In backward one layer at a time is recomputed, so the transient is
one layer's saved bytes plus its gradients.

Assumptions: a 16-bit model (DeepSpeed bf16/fp16; not torch.autocast over fp32 weights, whose cast
weight copies autograd would also keep), no padding mask (a padded batch makes sdpa fall back to
`repeat_kv`, so k and v are kept at all heads as in eager), PEFT `lora_dropout=0`, HF non-reentrant
checkpointing of every decoder layer.

The module is import-light by design (the planner answers in well under a second): no torch, no
transformers.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from zerodoctor.errors import PlanError
from zerodoctor.models import LORA_ALL_LINEAR, ModelSpec
from zerodoctor.plan.cce import CutCE, CutCrossEntropy, cut_ce_bytes, cut_ce_eval_bytes
from zerodoctor.plan.liger import FusedLinearCE, LigerKernels, fused_linear_ce_bytes
from zerodoctor.versions import parse_version

ATTN_IMPLS = ("flash", "sdpa", "eager")
"""Attention back ends the estimate knows (HF `attn_implementation` values; flash = flash_attention_2)."""

FP32 = 4
INT64 = 8
BOOL = 1
"""torch.bool, the mask `native_dropout` keeps for its backward."""

LOSS_SHIFTS = ("none", "loss_function", "model_forward")
"""How transformers shifts the logits for the causal-LM loss (`loss_shift_for`): "none" = 4.49 and later,
`ForCausalLMLoss` pads the labels instead (huggingface/transformers#35646); "loss_function" = 4.46-4.48,
`ForCausalLMLoss` upcasts and copies `logits[..., :-1, :].contiguous()` while the model's 16-bit logits are still
referenced by the caller; "model_forward" = up to 4.45, the model's own forward (`modeling_llama.py`:
`self.lm_head(...).float()`, then the same shift) drops the 16-bit logits right after the upcast."""


def loss_shift_for(transformers_version: str | None) -> str:
    """Which of `LOSS_SHIFTS` a transformers release does (read in the 4.35.0, 4.45.2, 4.46.1, 4.48.3 and
    4.49.0 wheels). An unknown version is planned as a current one ("none")."""
    v = parse_version(transformers_version)
    if v is None or v.release >= (4, 49):
        return "none"
    return "loss_function" if v.release >= (4, 46) else "model_forward"


# Model types whose decoder layer is the Llama layer as far as saved tensors go (q/k/v biases do not
# change what autograd keeps: `addmm` saves the same input as `mm`).
_LLAMA_LIKE = ("llama", "mistral", "qwen2", "mixtral")

_BAICHUAN_ROPE_HIDDEN = 4096
"""Baichuan's remote code comes in two modeling files: the 7B models (hidden 4096) use RoPE, the 13B models
(Baichuan-13B, Baichuan2-13B: hidden 5120) ALiBi (`BaichuanModel.get_alibi_mask` in baichuan-inc/Baichuan2-13B-Chat
modeling_baichuan.py)."""


def remote_alibi_attention(spec: ModelSpec) -> bool:
    """True for a model whose own (remote) attention adds a dense ALiBi bias, whatever `attn_implementation`
    says: Baichuan(2)-13B. Its `BaichuanAttention.forward` computes `matmul(q, k^T) / sqrt(d)`, adds the
    [b, heads, s, s] mask, clamps it with `torch.max`, and takes a 16-bit `softmax` (or, only where xformers is
    installed, SDPA with that dense `attn_mask`); the mask itself is built in the model dtype per forward
    (`_buffered_future_mask`, [heads, s, s], cached on the module as `self.alibi_mask`) and combined with the
    padding mask into a second [b, heads, s, s] tensor that every layer receives."""
    return spec.model_type == "baichuan" and spec.params.hidden_size != _BAICHUAN_ROPE_HIDDEN


_BAICHUAN2_VOCAB = 125_696
"""Baichuan2's tokenizer size (every Baichuan2 config.json; Baichuan-1 has 64,000). Its configs also carry
`z_loss_weight` (Baichuan2's configuration_baichuan.py), which Baichuan-1's do not."""

NORM_HEAD_SOURCE = (
    "baichuan-inc/Baichuan2-13B-Chat modeling_baichuan.py NormHead.forward (`if self.training: norm_weight = "
    "nn.functional.normalize(self.weight)`, then `nn.functional.linear(hidden_states, norm_weight)`; copy read in "
    "jrd77/Baichuan2-13B-Chat@35e3d5af948ecfe718bbb31633f053ae2a063725); modelscope/ms-swift@a5f1a113a "
    "examples/pytorch/llm/src/utils/model.py:87-97 patch_baichuan2_7b (the same body for the 7B head); torch "
    "derivatives.yaml linear/mm (the weight is saved for the input gradient)"
)


def remote_norm_head(spec: ModelSpec) -> bool:
    """True for a Baichuan2 model, whose output layer is the remote code's `NormHead`: in training every forward
    computes `F.normalize(self.weight)` -- a new vocab x hidden tensor in the model dtype -- and `F.linear` saves it
    for the input gradient, so it lives from the head's forward to the head's backward (`NORM_HEAD_SOURCE`).
    Recognised by model_type "baichuan" with Baichuan2's vocabulary or its `z_loss_weight` key (a user's own
    config.json as published, or the bundled baichuan2-7b / baichuan2-13b entries); Baichuan-1 has a plain
    `nn.Linear` head."""
    return spec.model_type == "baichuan" and (
        spec.params.vocab_size == _BAICHUAN2_VOCAB or "z_loss_weight" in spec.config
    )


@dataclass(frozen=True)
class ActivationEstimate:
    """Activation bytes of one micro-batch on one rank (see the module docstring for every term)."""

    per_layer_saved: int  # bytes saved for backward by one decoder layer (no checkpointing)
    layers: int
    checkpointed_input: int  # bytes kept per layer when checkpointed (its input hidden state)
    saved_total: int  # all layers' saved bytes at the end of forward (with or without checkpointing)
    logits_and_loss: int  # logits (model dtype) + fp32 upcast + loss/grad buffers at the loss
    backward_transient: int  # extra bytes during backward (recomputed layer when checkpointing, its grads)
    peak: int  # max over forward end / loss / backward of the activation-related bytes
    notes: tuple[str, ...] = ()
    # part of `peak` due to the shifted fp32 logits copy of transformers < 4.49 (`loss_shift`)
    shifted_copy_peak: int = 0
    # the attention the model really runs when its own code overrides `attn_impl` ("" = as asked)
    attention_used: str = ""
    # part of `peak` due to Baichuan2's normalised head copy (`remote_norm_head`), held at the loss
    norm_head_peak: int = 0
    # the two moments `peak` is the larger of: at the loss (saved tensors + the loss's transient) and inside the
    # first layer backward (saved layers + the recomputed layer and its gradients)
    at_loss: int = 0
    in_backward: int = 0
    # Liger's fused linear cross-entropy in place of the logits and the loss (`plan/liger.py`), and the part of
    # `peak` due to it (its saved gradients and its chunk at the loss) or to Cut Cross-Entropy's (`cut_loss`)
    fused_loss: FusedLinearCE | None = None
    fused_loss_peak: int = 0
    # Apple's Cut Cross-Entropy in place of the logits and the loss (`plan/cce.py`)
    cut_loss: CutCE | None = None
    # bytes Liger's RMSNorm and SwiGLU save fewer (or more) than the HF modules over the layers, at the peak moment
    liger_layer_delta: int = 0


@dataclass(frozen=True)
class _Shape:
    tokens: int  # T = b x s on this rank
    batch: int
    seq: int  # tokens per sequence on this rank
    hidden: int
    inter: int
    q_dim: int  # heads x head_dim
    kv_dim: int  # kv_heads x head_dim
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    d: int  # bytes of the model dtype
    liger_norm: bool = False  # LigerRMSNorm (plan/liger.py): saves its input and a fp32 rstd
    liger_swiglu: bool = False  # LigerSiLUMulFunction: saves the gate and up outputs only


def _lora_targets(spec: ModelSpec, lora_rank: int, lora_targets: tuple[str, ...]) -> frozenset[str]:
    """Short names of the adapted decoder-layer Linears (q_proj, ..., down_proj)."""
    if lora_rank <= 0:
        return frozenset()
    names = {lin.name for lin in spec.linear_modules(components=("text",)) if "{i}" in lin.path}
    if not lora_targets or LORA_ALL_LINEAR in lora_targets:
        return frozenset(names)
    chosen = {t.rsplit(".", 1)[-1] for t in lora_targets} & names
    if not chosen:
        raise PlanError(
            f"LoRA targets {list(lora_targets)} match no decoder Linear of {spec.name}",
            hint=f"its decoder linear modules are: {', '.join(sorted(names))}; or use '{LORA_ALL_LINEAR}'",
        )
    return frozenset(chosen)


def _norm_saved(t: _Shape, trainable_weight: bool) -> int:
    """LlamaRMSNorm: `x.to(fp32)` kept by `pow(2)` and by `x * rsqrt(var)` (4Th; in an fp32 model the
    `.to` is a no-op and this is the input itself), `rsqrt` output (4T fp32, b x s x 1). With a trainable
    weight, `weight * x_norm.to(dtype)` also keeps the normalised tensor (D Th); its output is counted by
    whoever consumes it (the next Linear's saved input). `LigerRMSNorm` keeps its input and the fp32 rstd
    (D Th + 4T), trainable weight or not (plan/liger.py)."""
    if t.liger_norm:
        return t.d * t.tokens * t.hidden + FP32 * t.tokens
    saved = FP32 * t.tokens * t.hidden + FP32 * t.tokens
    if trainable_weight:
        saved += t.d * t.tokens * t.hidden
    return saved


def _linear_inputs(
    t: _Shape,
    features_in: int,
    consumers: tuple[str, ...],
    full_ft: bool,
    lora: frozenset[str],
    rank: int,
    adapter: int,
    dropout: bool = False,
) -> int:
    """Bytes kept for the input X (T x features_in) shared by the Linears in `consumers`.

    Full FT: every Linear saves X for its weight gradient; they share one storage -> D x T x in once.
    LoRA: the frozen base saves nothing; each adapted Linear's `lora_A` saves its input and `lora_B` saves
    `lora_A`'s output (`adapter` x T x r each). PEFT casts X to the adapter dtype (`_cast_input_dtype`):
    when that differs from the model dtype (PEFT's default fp32 adapters on a bf16 model without
    DeepSpeed) every adapted Linear makes and keeps its own copy (adapter x T x in each -- q, k and v
    make three); when it is the same (DeepSpeed bf16 casts every parameter, adapters included) the cast
    is a no-op and the adapters share X.
    With `lora_dropout` > 0 (`dropout`) every adapter runs `lora_A(dropout(x))`: the dropout output is a new
    tensor per adapted Linear, which `lora_A` keeps (adapter x T x in), and CUDA's fused `native_dropout` keeps
    its bool mask (1 x T x in; on CPU `_dropout_impl` keeps a mask in the input's dtype); x itself is then kept
    by none of them.
    """
    if full_ft:
        return t.d * t.tokens * features_in
    adapted = [c for c in consumers if c in lora]
    if not adapted:
        return 0
    a_out = adapter * t.tokens * rank * len(adapted)
    if dropout:
        return (adapter + BOOL) * t.tokens * features_in * len(adapted) + a_out
    if adapter != t.d:
        return adapter * t.tokens * features_in * len(adapted) + a_out
    return t.d * t.tokens * features_in + a_out


def _attention_saved(t: _Shape, attn_impl: str) -> int:
    """What the attention core keeps (after the q/k/v Linears, before `o_proj`)."""
    b, s, a = t.batch, t.seq, t.heads
    if attn_impl == "alibi":
        # Baichuan-13B (`remote_alibi_attention`): q, k and v are views of W_pack's output (one D x T x 3h
        # storage, kept by matmul(q, k^T) and matmul(p, v)); `/ sqrt(d)` and `+ mask` keep nothing; `torch.max`
        # with a 0-dim tensor keeps its [b, a, s, s] input; the 16-bit `softmax` keeps its output, which
        # matmul(p, v) keeps too: two D x b a s^2 tensors.
        return t.d * t.tokens * (t.q_dim + 2 * t.kv_dim) + 2 * t.d * b * a * s * s
    if attn_impl in ("flash", "sdpa"):
        # Rotated q (new tensor: q*cos + rotate_half(q)*sin), rotated k, v (a view of v_proj's output),
        # the output, and the fp32 logsumexp (b x a x s). GQA stays kv-sized: sdpa gets
        # `enable_gqa=True` (no padding mask), flash-attention handles GQA natively.
        return t.d * t.tokens * (2 * t.q_dim + 2 * t.kv_dim) + FP32 * b * a * s
    # eager: repeat_kv copies k and v to all heads (reshape of an expand) unless there is no grouping;
    # matmul(q, k^T) keeps q and k_rep; softmax(dtype=fp32) keeps its fp32 output; `.to(bf16)` makes the
    # probabilities that matmul(p, v_rep) keeps with v_rep; dropout(p=0.0) returns its input unchanged.
    kv_rep = t.q_dim if t.kv_heads != t.heads else t.kv_dim
    scores = b * a * s * s
    probs = FP32 * scores + (t.d * scores if t.d < FP32 else 0)  # fp32 model: `.to` is a no-op
    return t.d * t.tokens * (t.q_dim + 2 * kv_rep) + probs


def _mlp_saved(
    t: _Shape, full_ft: bool, lora: frozenset[str], rank: int, adapter: int, dropout: bool = False
) -> int:
    """SwiGLU `down(silu(gate(x)) * up(x))`: SiLU keeps its input (gate output), `mul` keeps both factors
    (SiLU output, up output), `down_proj` keeps the product (full FT) -- 4 x D x T x i. Liger's SwiGLU keeps the
    gate and up outputs and recomputes SiLU in its backward: 2 x D x T x i before the product (plan/liger.py)."""
    saved = (2 if t.liger_swiglu else 3) * t.d * t.tokens * t.inter
    saved += _linear_inputs(t, t.inter, ("down_proj",), full_ft, lora, rank, adapter, dropout)
    return saved


def _moe_saved(spec: ModelSpec, t: _Shape) -> int:
    """Mixtral sparse MoE block with the transformers 5 default `grouped_mm` experts (integrations/moe.py).

    S = T x k routed rows. Router: fp32 softmax output (4 T E), `topk` indices (8 T k), the in-place
    renormalisation `/=` keeps the fp32 top-k values and their sum (4 T k + 4 T). Experts: `sort` keeps
    the permutation (8 S), `hidden[perm // k]` keeps its index (8 S) and grouped_mm keeps the gathered
    rows (D S h); the gate_up output (D S 2m) is kept whole (SiLU keeps the gate half, `mul` the up
    half, both views of one storage), SiLU output and product (D S m each), the down output (D S h) and
    the fp32 routing weights (4 S) kept by `proj_out * weights`; `[inv_perm]` keeps its index (8 S),
    and grouped_mm keeps the int32 per-expert offsets (4 E).
    """
    p = spec.params
    k = max(p.experts_per_token, 1)
    m = p.moe_intermediate_size or p.intermediate_size
    rows = t.tokens * k
    router = FP32 * t.tokens * p.num_experts + INT64 * t.tokens * k + FP32 * t.tokens * k + FP32 * t.tokens
    experts = rows * (t.d * (2 * t.hidden + 4 * m) + FP32 + 3 * INT64)
    offsets = 4 * p.num_experts  # int32 cumulative tokens per expert, kept by both grouped_mm calls
    return router + experts + offsets


def _layer_saved(
    spec: ModelSpec,
    t: _Shape,
    attn_impl: str,
    lora: frozenset[str],
    rank: int,
    adapter: int,
    moe: bool,
    dropout: bool = False,
) -> int:
    full_ft = not lora
    saved = 2 * _norm_saved(t, trainable_weight=full_ft)  # input_layernorm, post_attention_layernorm
    saved += _linear_inputs(
        t, t.hidden, ("q_proj", "k_proj", "v_proj", "W_pack"), full_ft, lora, rank, adapter, dropout
    )
    saved += _attention_saved(t, attn_impl)
    # o_proj input: flash/sdpa output is already (b, s, a, d) in memory, so `.contiguous()` is a no-op and
    # o_proj saves the attention output's own storage (counted above). Eager's matmul output is
    # (b, a, s, d): the transpose+contiguous is a copy that o_proj saves.
    # Same for a bf16 `lora_A` on o_proj: its input is that storage, only `lora_A`'s output is new.
    if attn_impl in ("eager", "alibi") or (lora and (adapter != t.d or dropout)):
        saved += _linear_inputs(t, t.q_dim, ("o_proj",), full_ft, lora, rank, adapter, dropout)
    elif "o_proj" in lora:
        saved += adapter * t.tokens * rank
    if moe:
        saved += _moe_saved(spec, t)
        if full_ft:
            saved += t.d * t.tokens * t.hidden  # the router's F.linear keeps the norm output
    else:
        saved += _mlp_saved(t, full_ft, lora, rank, adapter, dropout)
        saved += _linear_inputs(t, t.hidden, ("gate_proj", "up_proj"), full_ft, lora, rank, adapter, dropout)
    return saved


def _backward_grads(t: _Shape, attn_impl: str, moe_rows: int, moe_inter: int) -> int:
    """Gradient buffers alive at once inside one layer's backward (derived, not measured: CPU has no
    allocator peak statistics). MLP: incoming grad (D Th) + grad of the product + grads of both
    factors (3 D T i). Eager attention: grad of the bf16 probabilities, its fp32 upcast and the softmax
    input grad ((D + 8) b a s^2). sdpa/flash: dq, dk, dv plus the output grad and flash-attention-2's
    fp32 dq accumulator (4 T nq)."""
    mlp = t.d * t.tokens * t.hidden + 3 * t.d * (moe_rows * moe_inter if moe_rows else t.tokens * t.inter)
    if attn_impl == "eager":
        attn = t.d * t.tokens * t.hidden + (t.d + 2 * FP32) * t.batch * t.heads * t.seq * t.seq
    elif attn_impl == "alibi":
        # 16-bit softmax: the probabilities' grad, softmax's input grad and the `torch.max` (where-select)
        # grad, each D x b a s^2, are alive together at most.
        attn = t.d * t.tokens * t.hidden + 3 * t.d * t.batch * t.heads * t.seq * t.seq
    else:
        attn = t.d * t.tokens * (t.hidden + 2 * t.q_dim + 2 * t.kv_dim) + FP32 * t.tokens * t.q_dim
    return max(mlp, attn)


def activation_bytes(
    spec: ModelSpec,
    *,
    micro_batch: int,
    seq_len: int,
    attn_impl: str = "sdpa",
    gradient_checkpointing: bool = False,
    dtype_bytes: int = 2,
    lora_rank: int = 0,
    lora_targets: tuple[str, ...] = (),
    sequence_parallel: int = 1,
    lora_adapter_bytes: int | None = None,
    loss_dtype_bytes: int = FP32,
    trainable_layers: int | None = None,
    frozen_layers_keep_inputs: bool = False,
    loss_shift: str = "none",
    lora_dropout: float = 0.0,
    liger: LigerKernels | None = None,
    cut_ce: CutCrossEntropy | None = None,
) -> ActivationEstimate:
    """Activation bytes of one micro-batch (`micro_batch` sequences of `seq_len` tokens) on one rank.

    `attn_impl`: "flash" | "sdpa" | "eager". `dtype_bytes`: 2 (bf16/fp16) or 4 (fp32). `lora_rank` > 0
    means a frozen base with PEFT LoRA adapters on `lora_targets` (empty or "all-linear" = every decoder
    Linear). `sequence_parallel` (Ulysses / XTuner sp) splits each sequence across that many ranks:
    everything here is per rank with s / sp tokens (the all-to-all buffers are not included).
    `lora_adapter_bytes`: dtype bytes of the adapter weights; None = the model dtype, which is what
    DeepSpeed bf16/fp16 gives (the engine casts every parameter); 4 = PEFT's default fp32 adapters on a
    16-bit model without DeepSpeed (`autocast_adapter_dtype=True`).
    `loss_dtype_bytes`: 4 = transformers' `ForCausalLMLoss` (logits upcast to fp32); the model dtype =
    a model whose own forward calls `CrossEntropyLoss` on the 16-bit logits after
    `logits[..., :-1, :].contiguous()` (remote-code Qwen (v1)): a shifted 16-bit copy, 16-bit
    log-probabilities and 16-bit gradients instead of the fp32 ones.
    `loss_shift` (`LOSS_SHIFTS`, from `loss_shift_for(transformers version)`): before transformers 4.49 the
    upcast logits are shifted by `logits[..., :-1, :].contiguous()` before `cross_entropy`: with a micro-batch
    of several sequences one more fp32 tensor of b(s-1) x V alive until the loss returns (one sequence's slice
    is contiguous already: no copy); up to 4.45 the 16-bit logits are gone by then. log_softmax keeps only its
    output, so the backward has the same three tensors, of b(s-1) rows.
    `lora_dropout` > 0: each adapter keeps its own dropped copy of its input and the dropout's bool mask
    (`_linear_inputs`); PEFT's default and LLaMA-Factory's are 0, PEFT's example scripts use 0.1.
    `liger` (`plan/liger.py liger_kernels`): the Liger kernels `use_liger_kernel` patches in -- RMSNorm and SwiGLU
    change what each layer saves (`_norm_saved`, `_mlp_saved`), the fused linear cross-entropy replaces the logits,
    their fp32 upcast and the log-probabilities with the gradients it computes in the forward and one chunk.
    `cut_ce` (`plan/cce.py`, without a Liger fused loss): Cut Cross-Entropy replaces them with the final hidden states
    and a few bytes per token kept for its backward, which allocates the input (and head) gradients.
    """
    # Every argument but `liger`, captured before any other local exists: `_liger_layer_delta` re-estimates this very
    # step with the HF norm and MLP, and a keyword added to this signature reaches it without being listed again.
    same_step = functools.partial(activation_bytes, **{k: v for k, v in locals().items() if k != "liger"})
    if loss_shift not in LOSS_SHIFTS:
        raise PlanError(f"unknown loss shift '{loss_shift}'", hint=f"use one of {LOSS_SHIFTS}")
    if attn_impl not in ATTN_IMPLS:
        raise PlanError(f"unknown attention implementation '{attn_impl}'", hint=f"use one of {ATTN_IMPLS}")
    if micro_batch < 1 or seq_len < 1 or sequence_parallel < 1:
        raise PlanError("micro_batch, seq_len and sequence_parallel must be positive integers")
    if dtype_bytes not in (2, 4):
        raise PlanError(f"dtype_bytes must be 2 (bf16/fp16) or 4 (fp32), got {dtype_bytes}")
    adapter = dtype_bytes if lora_adapter_bytes is None else lora_adapter_bytes
    if adapter not in (2, 4):
        raise PlanError(f"lora_adapter_bytes must be 2 or 4, got {lora_adapter_bytes}")
    p = spec.params
    notes: list[str] = []
    seq = math.ceil(seq_len / sequence_parallel)
    if sequence_parallel > 1:
        notes.append(f"sequence parallel {sequence_parallel}: {seq} tokens per rank per sequence")
    t = _Shape(
        tokens=micro_batch * seq,
        batch=micro_batch,
        seq=seq,
        hidden=p.hidden_size,
        inter=p.intermediate_size,
        q_dim=p.num_heads * p.head_dim,
        kv_dim=p.kv_heads * p.head_dim,
        heads=p.num_heads,
        kv_heads=p.kv_heads,
        head_dim=p.head_dim,
        vocab=p.vocab_size,
        d=dtype_bytes,
        liger_norm=liger is not None and liger.rms_norm,
        liger_swiglu=liger is not None and liger.swiglu,
    )
    lora = _lora_targets(spec, lora_rank, lora_targets)
    full_ft = not lora
    # Dense ALiBi masks alive from the model's forward to the end of backward (`remote_alibi_attention`): the
    # cached [a, s, s] bias and the [b, a, s, s] sum with the padding mask, both in the model dtype.
    alibi_masks = 0
    if remote_alibi_attention(spec):
        attn_impl = "alibi"
        alibi_masks = t.d * t.heads * t.seq * t.seq * (1 + t.batch)
        notes.append(
            f"{spec.model_type} 13B remote code: ALiBi attention whatever attn_implementation says -- dense 16-bit "
            f"[b, heads, s, s] scores and masks ({alibi_masks / 2**30:.2f} GiB of masks), as without xformers"
        )
    if spec.model_type not in _LLAMA_LIKE:
        notes.append(
            f"{spec.model_type}: decoder layer approximated by the Llama layer (measured only for llama, "
            "mistral, qwen2, mixtral)"
        )
    if p.is_multimodal:
        notes.append("vision tower / projector activations not included (text decoder only)")
    if attn_impl == "flash":
        notes.append("flash-attention-2 is CUDA-only: predicted from its saved tensors, not measured on CPU")
    if lora:
        how = "shared input" if adapter == dtype_bytes else "one cast copy of its input per adapter"
        drop = (
            f"lora_dropout {lora_dropout:g}: each adapter keeps its dropped input copy and a bool mask"
            if lora_dropout > 0
            else "lora_dropout 0"
        )
        notes.append(f"LoRA: frozen base saves no Linear inputs; {adapter}-byte adapters ({how}); {drop}")
    dropout = bool(lora) and lora_dropout > 0

    dense = _layer_saved(spec, t, attn_impl, lora, lora_rank, adapter, moe=False, dropout=dropout)
    moe_layer = (
        _layer_saved(spec, t, attn_impl, lora, lora_rank, adapter, moe=True, dropout=dropout) if p.is_moe else 0
    )
    n_dense = p.num_dense_layers if p.is_moe else p.num_layers
    n_moe = p.num_moe_layers if p.is_moe else 0
    layers = n_dense + n_moe
    per_layer = moe_layer if n_moe else dense
    all_layers = dense * n_dense + moe_layer * n_moe

    freeze = trainable_layers is not None
    k_train = min(max(trainable_layers or 0, 0), layers) if freeze else layers
    if freeze:
        # The last k layers train (MoE layers come after the dense ones in models that mix them).
        k_moe = min(k_train, n_moe)
        all_layers = moe_layer * k_moe + dense * (k_train - k_moe)
        if k_train and not t.liger_norm:
            # The first trainable layer's input does not require grad: its input RMSNorm keeps only the
            # normalised tensor for its weight gradient, not the fp32 copies. (LigerRMSNorm keeps its input and
            # rstd for the weight's gradient all the same.)
            all_layers -= _norm_saved(t, trainable_weight=False)
        notes.append(
            f"freeze tuning: {k_train} of {layers} layers train; the frozen prefix keeps no activations"
            + (
                " (checkpointed frozen layers keep their input: enable_input_require_grads)"
                if gradient_checkpointing and frozen_layers_keep_inputs
                else ""
            )
        )
    any_grad = k_train > 0 or (gradient_checkpointing and frozen_layers_keep_inputs)

    # Model-level saved tensors outside the layers.
    extras = 0
    if full_ft and not freeze:
        extras += INT64 * t.tokens  # embedding keeps input_ids for its weight gradient
    if not gradient_checkpointing and k_train:
        extras += 2 * t.d * seq * p.head_dim  # rotary cos and sin (1 x s x d), shared by all layers
    if not full_ft and not gradient_checkpointing:
        # Without checkpointing nothing makes the frozen embedding's output require grad, so layer 0's
        # input RMSNorm has no grad-requiring input and saves nothing.
        all_layers -= _norm_saved(t, trainable_weight=False)
    # Final norm, lm_head input, loss (freeze tuning: both frozen, their input requires grad).
    head = _norm_saved(t, trainable_weight=full_ft and not freeze)
    if full_ft and not freeze:
        head += t.d * t.tokens * t.hidden  # lm_head keeps the final norm output
    # log_softmax output (fp32 log-probabilities, kept by log_softmax and nll_loss), the shifted labels
    # (`pad(labels, (0, 1))[..., 1:].contiguous()`: for b = 1 the slice is already contiguous, so the
    # padded storage of s + 1 ids is what is kept) and nll_loss's total weight.
    labels = INT64 * (seq + 1 if micro_batch == 1 else t.tokens)
    lb = FP32 if loss_dtype_bytes >= FP32 or t.d >= FP32 else t.d
    loss_saved = lb * t.tokens * t.vocab + labels + FP32
    head += loss_saved
    # Baichuan2's NormHead: the normalised V x h weight F.linear keeps for the input gradient (frozen head: only
    # it; a trainable head also keeps its input, counted above, and normalize's own tensors, not counted).
    norm_head = t.d * t.vocab * t.hidden if remote_norm_head(spec) else 0
    head += norm_head
    if not any_grad:
        head = norm_head = 0  # nothing requires grad: no graph at all
    elif norm_head:
        notes.append(
            f"Baichuan2 NormHead: F.normalize(lm_head.weight) makes a {t.vocab:,} x {t.hidden:,} {t.d}-byte copy "
            f"every training forward, saved by F.linear until the head's backward ({norm_head / 2**30:.2f} GiB)"
        )

    ckpt_input = t.d * t.tokens * t.hidden
    ckpt_layers = layers
    if freeze:
        ckpt_layers = layers if frozen_layers_keep_inputs else k_train
    layers_kept = ckpt_input * ckpt_layers if gradient_checkpointing else all_layers
    extras += alibi_masks if any_grad else 0
    saved_total = layers_kept + extras + head

    # Around the loss: bf16 logits (alive in the model output) + fp32 upcast + log-probabilities in
    # forward; in backward the saved log-probabilities + nll's grad + log_softmax's input grad (all fp32).
    # In the model dtype instead: logits + the shifted contiguous copy + log-probabilities, and three
    # 16-bit tensors in backward.
    if t.d < lb:
        copy_or_upcast = FP32 * t.tokens * t.vocab  # logits.float()
    elif t.d < FP32:
        copy_or_upcast = t.d * t.tokens * t.vocab  # shift_logits.contiguous()
    else:
        copy_or_upcast = 0
    # transformers < 4.49 shifts the upcast logits (`logits[..., :-1, :].contiguous()`; the model-dtype path
    # above already counts its own shift): for one sequence the slice is already contiguous, so only a micro-batch
    # of several makes a copy, of b(s-1) rows; log_softmax and its gradients then have b(s-1) rows. Up to 4.45
    # the 16-bit logits die with the upcast.
    old = loss_shift != "none" and not (lb == t.d < FP32)
    rows = t.tokens - t.batch if old else t.tokens
    shifted = lb * rows * t.vocab if old and t.batch > 1 else 0
    logits16 = 0 if old and loss_shift == "model_forward" and t.d < lb else t.d * t.tokens * t.vocab
    loss_fwd = logits16 + copy_or_upcast + shifted + lb * rows * t.vocab
    loss_fwd_now = t.d * t.tokens * t.vocab + copy_or_upcast + lb * t.tokens * t.vocab
    loss_bwd = 3 * lb * rows * t.vocab
    logits_and_loss = max(loss_fwd, loss_bwd)
    if shifted:
        notes.append(
            "transformers < 4.49: the loss also keeps a shifted fp32 copy of the logits (micro-batch > 1)"
            + (
                "; the 16-bit logits are freed by the upcast (<= 4.45)"
                if loss_shift == "model_forward"
                else ""
            )
        )

    moe_rows = t.tokens * max(p.experts_per_token, 1) if n_moe else 0
    grads = _backward_grads(t, attn_impl, moe_rows, p.moe_intermediate_size or p.intermediate_size)
    backward_transient = grads + (per_layer if gradient_checkpointing else 0)
    # Phases: at the loss (everything saved so far + the loss transient, which includes the saved
    # log-probabilities) and inside the first layer backward (the head's tensors are freed by then).
    at_loss = saved_total - lb * t.tokens * t.vocab + logits_and_loss
    in_backward = layers_kept + extras + backward_transient
    fused = None
    if liger is not None and liger.fused_linear_ce and any_grad:
        # Liger's fused linear cross-entropy (plan/liger.py): no logits, upcast or log-probabilities; the final norm
        # and the gradients the function computes in its forward stay until the backward, its chunk only inside it.
        head_trainable = full_ft and not freeze
        fused = fused_linear_ce_bytes(
            tokens=t.tokens, hidden=t.hidden, vocab=t.vocab, dtype_bytes=t.d, head_trainable=head_trainable, kernels=liger
        )
        saved_total = layers_kept + extras + _norm_saved(t, trainable_weight=head_trainable) + fused.saved
        logits_and_loss = fused.transient
        at_loss = saved_total + fused.transient
        notes.append(
            f"Liger fused linear cross-entropy: {fused.chunks} chunk(s) of {fused.chunk_rows} tokens, no {t.tokens} x "
            f"{t.vocab:,} logits"
        )
    cut = None
    if fused is None and cut_ce is not None and any_grad:
        # Cut Cross-Entropy (plan/cce.py): no logits at all; the final hidden states stay for its backward, which
        # allocates their gradient (and the head's)
        norm_trains = full_ft and not freeze
        cut = cut_ce_bytes(
            tokens=t.tokens, batch=t.batch, hidden=t.hidden, vocab=t.vocab, dtype_bytes=t.d,
            head_trainable=norm_trains or cut_ce.head_trains, cce=cut_ce,
        )  # fmt: skip
        saved_total = layers_kept + extras + _norm_saved(t, trainable_weight=norm_trains) + cut.saved
        logits_and_loss = cut.transient
        at_loss = saved_total + cut.transient
        notes.append(f"Cut Cross-Entropy: no {t.tokens} x {t.vocab:,} logits, the LSE per label row only")
    peak = max(at_loss, in_backward)
    without_shift = max(at_loss - logits_and_loss + max(loss_fwd_now, 3 * lb * t.tokens * t.vocab), in_backward)
    fused_peak = 0
    loss_fn = fused or cut
    if loss_fn is not None:
        without_shift = peak
        fused_peak = peak - max(at_loss - loss_fn.saved - loss_fn.transient, in_backward)
    without_norm_head = max(at_loss - norm_head, in_backward)
    return ActivationEstimate(
        per_layer_saved=per_layer,
        layers=layers,
        checkpointed_input=ckpt_input,
        saved_total=saved_total,
        logits_and_loss=logits_and_loss,
        backward_transient=backward_transient,
        peak=peak,
        notes=tuple(notes),
        shifted_copy_peak=max(peak - without_shift, 0),
        attention_used="dense ALiBi (the model's own attention)" if alibi_masks else "",
        norm_head_peak=peak - without_norm_head,
        at_loss=at_loss,
        in_backward=in_backward,
        fused_loss=fused,
        fused_loss_peak=fused_peak,
        cut_loss=cut,
        liger_layer_delta=_liger_layer_delta(peak - fused_peak, liger, lambda hf: same_step(liger=hf)),
    )


def _liger_layer_delta(
    peak_without_loss: int, liger: LigerKernels | None, estimate: Callable[[LigerKernels], ActivationEstimate]
) -> int:
    """How many bytes Liger's RMSNorm and SwiGLU lower the activation peak (less the fused loss's part) against the
    HF modules, by estimating the same step with them switched off; 0 without them."""
    if liger is None or not (liger.rms_norm or liger.swiglu):
        return 0
    hf = estimate(replace(liger, rms_norm=False, swiglu=False))
    return hf.peak - hf.fused_loss_peak - peak_without_loss


@dataclass(frozen=True)
class EvalForward:
    """The GPU bytes of one evaluation forward (`eval_forward_bytes`): no tensor is saved for backward, so what is
    alive is one layer's working tensors or the loss's, plus the logits the evaluation keeps."""

    layer: int  # one decoder layer's tensors during its forward + the residual stream
    loss: int  # the logits and the loss's copies at the eval batch
    kept_logits: int  # the batch's logits kept for metrics (0 when only the loss is kept)
    kv_cache: int  # every layer's keys and values (use_cache: the model is in eval mode, no checkpointing switch)
    peak: int
    tokens: int


def eval_forward_bytes(
    spec: ModelSpec,
    *,
    micro_batch: int,
    seq_len: int,
    attn_impl: str = "sdpa",
    dtype_bytes: int = 2,
    loss_dtype_bytes: int = FP32,
    loss_shift: str = "none",
    sequence_parallel: int = 1,
    keep_logits: bool = False,
    use_cache: bool = False,
    cut_cross_entropy: bool = False,
) -> EvalForward:
    """One evaluation forward under `torch.no_grad()` (transformers trainer.py `prediction_step`): autograd saves
    nothing, so the layers run one at a time and only one layer's tensors are alive at once, bounded here by what
    that layer saves for backward when it trains (`activation_bytes` of a full fine-tune, one layer) plus the
    residual stream; the labels are in the batch, so the model computes its loss: the 16-bit logits, their fp32
    upcast and the log-probabilities (and the shifted copy of transformers < 4.49 for several sequences), as in
    training's forward. With `keep_logits` (no `prediction_loss_only`) the batch's logits are returned and kept.
    `use_cache`: the model's config keeps `use_cache` true, and in eval mode transformers does not turn it off for
    gradient checkpointing (`if self.gradient_checkpointing and self.training`), so the forward builds a
    DynamicCache of every layer's keys and values (2 x layers x tokens x kv_heads x head_dim, model dtype), alive in
    the output until the loss is computed.
    `cut_cross_entropy`: the model's forward runs Cut Cross-Entropy in evaluation too (`plan/cce.py`): no logits, so
    none kept either; the loss is the final hidden states and a few bytes per label row (`cce.cut_ce_eval_bytes`)."""
    act = activation_bytes(
        spec,
        micro_batch=micro_batch,
        seq_len=seq_len,
        attn_impl=attn_impl,
        gradient_checkpointing=False,
        dtype_bytes=dtype_bytes,
        sequence_parallel=sequence_parallel,
        loss_dtype_bytes=loss_dtype_bytes,
        loss_shift=loss_shift,
    )
    p = spec.params
    seq = math.ceil(seq_len / sequence_parallel)
    tokens = micro_batch * seq
    d = dtype_bytes
    lb = FP32 if loss_dtype_bytes >= FP32 or d >= FP32 else d
    tv = tokens * p.vocab_size
    layer = act.per_layer_saved + d * tokens * p.hidden_size
    if d < lb:
        copy_or_upcast = FP32 * tv  # logits.float()
    elif d < FP32:
        copy_or_upcast = d * tv  # the model-dtype loss: shift_logits.contiguous()
    else:
        copy_or_upcast = 0
    old = loss_shift != "none" and not (lb == d < FP32)
    rows = tokens - micro_batch if old else tokens
    shifted = lb * rows * p.vocab_size if old and micro_batch > 1 else 0
    logits16 = 0 if old and loss_shift == "model_forward" and d < lb else d * tv
    loss = logits16 + copy_or_upcast + shifted + lb * rows * p.vocab_size
    kept = d * tv if keep_logits else 0
    if cut_cross_entropy:
        loss = cut_ce_eval_bytes(tokens=tokens, batch=micro_batch, hidden=p.hidden_size, dtype_bytes=d)
        kept = 0
    cache = 2 * p.num_layers * tokens * p.kv_heads * p.head_dim * d if use_cache else 0
    return EvalForward(
        layer=layer, loss=loss, kept_logits=kept, kv_cache=cache, peak=max(layer, loss) + kept + cache, tokens=tokens
    )


# --------------------------------------------------------------------------------------------------
# Vision tower and resampler of MiniCPM-Llama3-V 2.5 (the images of a vision-language fine-tune)
# --------------------------------------------------------------------------------------------------

PIXEL_CHANNELS = 3
"""RGB slices: the patch convolution keeps its input, 3 x patch^2 values per patch."""


@dataclass(frozen=True)
class VisionActivations:
    """What the vision side of one micro-batch keeps for backward, and how it was counted."""

    tower: int
    resampler: int
    slices: int
    patches_per_slice: int
    detail: str

    @property
    def total(self) -> int:
        return self.tower + self.resampler


def vision_activation_bytes(
    spec: ModelSpec,
    *,
    micro_batch: int,
    images_per_sample: int,
    tower_trainable: bool,
    resampler_trainable: bool,
    gradient_checkpointing: bool,
    dtype_bytes: int,
) -> VisionActivations | None:
    """Saved tensors of MiniCPM-Llama3-V 2.5's vision side, which run before the language model and are
    released only by its own backward, after the language model's: so they sit under the whole LLM peak.

    From OpenBMB/MiniCPM-V finetune (dataset.py `SupervisedDataset.__getitem__` opens one image per sample;
    `slice_image`: the source image resized to about `scale_resolution`^2 pixels plus, for a larger image, up to
    `max_slice_nums` slices of that size) and the model's remote code (`get_vllm_embedding` with
    `batch_vision_input`: every slice of the batch through `vpm` at once, padded to the longest;
    `Resampler.forward`): per image at most 1 + `max_slice_nums` slices of (`scale_resolution` / patch)^2
    patches -- the upper bound of the model's `slice_config`, since the images' sizes are the dataset's.
    Each slice adds `query_num` tokens to the language model's sequence, inside its `model_max_length` cap.

    Counted with the tensors autograd saves in transformers 5.23's Idefics2VisionTransformer (eager
    attention, as the remote code loads it) and torch's nn.MultiheadAttention (measured with
    saved_tensors_hooks, tests/plan/test_vision_activations.py), n = patches of the micro-batch, D = bytes of
    the dtype, h/i = the tower's hidden/intermediate sizes, a its heads, L patches per slice, E the language
    model's hidden size:
    * tower, trainable (finetune.py `tune_vision`), gradient checkpointing on: the patch convolution's input
      (3 p^2 n D), the position ids (8 n), each layer's input (n h D, `GradientCheckpointingLayer`), the
      post-layernorm's input and statistics (n h D + 2 n D); without checkpointing each layer keeps 8 n h D
      (norm inputs, q/k/v/out_proj inputs, q, k, v), 2 n i D (fc1 output, fc2 input), 2 n D of statistics
      and its eager attention's fp32 softmax and 16-bit copy, (4 + D) a L n. Frozen: nothing (no input
      requires grad).
    * resampler (trained in every MiniCPM-V fine-tune: `resampler.requires_grad_(True)`): `kv_proj`'s input
      (n h D), `ln_kv`'s input, the attention's key and value inputs and its projected key and value
      (5 n E D), the attention probabilities (need_weights: D x heads x query_num x n), the norm's
      statistics (2 n D), and per slice the query side (5 x query_num x E x D).
    None when the model has no MiniCPM-V `slice_config`, or no image is fed."""
    cfg = spec.config
    slice_cfg = cfg.get("slice_config") if isinstance(cfg.get("slice_config"), dict) else None
    vis = cfg.get("vision_config") if isinstance(cfg.get("vision_config"), dict) else None
    if slice_cfg is None or vis is None or images_per_sample <= 0 or not (tower_trainable or resampler_trainable):
        return None
    patch = int(slice_cfg.get("patch_size", vis.get("patch_size", 14)))
    side = int(slice_cfg.get("scale_resolution", 448)) // max(patch, 1)
    per_slice = side * side
    slices = images_per_sample * (1 + int(slice_cfg.get("max_slice_nums", 9)))
    n = micro_batch * slices * per_slice
    h = int(vis["hidden_size"])
    inter = int(vis["intermediate_size"])
    heads = int(vis["num_attention_heads"])
    e = spec.params.hidden_size
    queries = int(cfg.get("query_num", 96))
    tower, resampler = vision_saved_bytes(
        patches=n,
        patches_per_slice=per_slice,
        patch=patch,
        hidden=h,
        intermediate=inter,
        heads=heads,
        layers=spec.params.vision_num_layers,
        embed=e,
        queries=queries,
        resampler_heads=max(e // 128, 1),
        dtype_bytes=dtype_bytes,
        gradient_checkpointing=gradient_checkpointing,
        tower_trainable=tower_trainable,
        resampler_trainable=resampler_trainable,
    )
    detail = (
        f"{slices} slices per micro-batch sample x {per_slice} patches (1 + max_slice_nums, "
        f"(scale_resolution / patch)^2: the most the model's slice_config encodes per image); "
        f"tower {'trainable' if tower_trainable else 'frozen'}"
        f"{', gradient checkpointing' if tower_trainable and gradient_checkpointing else ''}: "
        f"{tower / 2**30:.2f} GiB, resampler {resampler / 2**30:.2f} GiB; the slices add "
        f"{slices * queries} query tokens to each sample's sequence (inside seq_len)"
    )
    return VisionActivations(tower, resampler, slices, per_slice, detail)


def vision_saved_bytes(
    *,
    patches: int,
    patches_per_slice: int,
    patch: int,
    hidden: int,
    intermediate: int,
    heads: int,
    layers: int,
    embed: int,
    queries: int,
    resampler_heads: int,
    dtype_bytes: int,
    gradient_checkpointing: bool,
    tower_trainable: bool,
    resampler_trainable: bool,
) -> tuple[int, int]:
    """(tower, resampler) saved bytes for `patches` patch tokens in slices of `patches_per_slice`: the terms of
    `vision_activation_bytes`."""
    n, d = patches, dtype_bytes
    tower = 0
    if tower_trainable:
        tower = PIXEL_CHANNELS * patch * patch * n * d + 8 * n + n * hidden * d + 2 * n * d  # conv in, ids, post-LN
        if gradient_checkpointing:
            tower += layers * n * hidden * d
        else:
            attention = (FP32 + d) * heads * patches_per_slice * n
            tower += layers * (8 * n * hidden * d + 2 * n * intermediate * d + 4 * n * d + attention)
    resampler = 0
    if resampler_trainable:
        slices = -(-n // max(patches_per_slice, 1))
        resampler = n * hidden * d + 5 * n * embed * d + d * resampler_heads * queries * n + 2 * n * d
        # the query side: the repeated queries, q's projection input and scaled copy, out_proj's and ln_post's
        # inputs, the final `@ proj`'s input (5 x queries x E per slice) and ln_q / ln_post statistics
        resampler += slices * queries * (5 * embed * d + 2 * d) + 2 * queries * d
    return tower, resampler
