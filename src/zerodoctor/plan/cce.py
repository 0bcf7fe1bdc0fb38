"""What Apple's Cut Cross-Entropy (CCE) changes in a training step, as axolotl's CutCrossEntropyPlugin applies it.

Read in apple/ml-cross-entropy at d42911f (2025-06-26; the first commit af5f96a of 2024-11-13 where they differ) and
in axolotl-ai-cloud/ml-cross-entropy at 5f0c7a7 (the fork axolotl installs since v0.11.0, #2813); pure arithmetic: no
torch, no cut_cross_entropy import.

How a run gets it: axolotl's `plugins: [axolotl.integrations.cut_cross_entropy.CutCrossEntropyPlugin]` (since
v0.6.0, #2091) calls `cce_patch(cfg.model_config_type)` in `pre_model_load` when `cfg.cut_cross_entropy` is true --
the plugin's default since v0.9.0 (#2562; before it the key had to be written). Nothing else in axolotl applies it.
`cce_patch` rebinds `<Model>ForCausalLM.forward` to `cce_forward` for the types of `PATCH_FNS` (apple: llama, phi3,
gemma2, mistral, then qwen2 from 24fbe4b); since axolotl v0.12.0 (#2908) any other type gets the llama
`cce_forward` through `patch_llama_like` ("experimental"). A remote-code model (`trust_remote_code`): since axolotl
v0.13.1 (#3257) `cce_patch(..., remote_model_id=base_model)` patches the remote modeling file of the fork's types,
and for any other type `patch_generic` raises a RuntimeError (the run stops at start); before it the import of
`transformers.models.<type>` fails. With the axolotl release unknown the planner plans a remote-code model without
CCE (the larger case). With Liger's fused linear cross-entropy also on, the last patch of
`<Model>ForCausalLM.forward` runs: transformers' Trainer applies Liger at its init (`use_liger_kernel`), after the
plugin's pre-model-load patch, so Liger's loss runs; axolotl's own LigerPlugin (`liger_fused_linear_cross_entropy`)
patches in the same `pre_model_load` hook, so of the two plugins the one listed last in `plugins` wins
(`setup/run.py _cut_cross_entropy` reads the order; Liger last: planned without CCE, its logits the upper bound of
Liger's chunked loss); axolotl refuses the pair when `cut_cross_entropy` is written,
from v0.13.1 (#3330, `check_cross_entropy_conflicts`).

What it keeps (`cce.py LinearCrossEntropyFunction`): `cce_forward` never calls `lm_head`; it hands the final hidden
states `e` (T x H, model dtype) and `lm_head.weight` `c` (V x H) to `linear_cross_entropy(..., shift=True)`. The
forward (`cce_lse_forward_kernel`) walks (BLOCK_B x BLOCK_V) tiles of `e @ c.T` in registers with a fp32 tile
accumulator and writes only the log-sum-exp per label row: `lse` (fp32, B). `ctx.save_for_backward(e, c, bias, lse,
targets, valids, logit_avg)`: the hidden states themselves (not a copy: `e.contiguous()` of a contiguous tensor), the
weight (a parameter), the batch's labels (no copy), `valids` (the B label positions that are not -100 after the
shift: `_build_flat_valids`, `nonzero()` int64 B x 2 -> int32 -> `.sum(1)` int64 B) and, with a gradient needed and
`filter_eps` set ("auto" by default: `finfo(dtype).eps / 32`), `logit_avg` (fp32, V). Inside the forward
also a fp32 `neg_dot` per row (`indexed_neg_dot_forward_kernel`, the target logit) and uint32 locks. No T x V tensor
exists at any time. The backward (`cce_backward_kernel`) sorts the vocabulary by `logit_avg` (`argsort` int64 V ->
int32), allocates `de = zeros_like(e)` (T x H) and, when the head trains, `dc = zeros_like(c)` (V x H) in the model
dtype (fp32 with `accum_e_fp32` / `accum_c_fp32`, off by default and in axolotl's call; the first release allocated
`dc` even for a frozen head, since 76f350d of 2025-01-28 only `if c.requires_grad`), int32 locks of
cdiv(B, 128) x cdiv(H, 64) and cdiv(V, 128) x cdiv(H, 64), and recomputes the logits tile by tile; `filter_eps` only
skips tiles whose softmax gradient is below it (no memory). `dc` is the head's full-size gradient: under ZeRO-2/3
when the head is the largest trainable tensor the planner's "full-size gradient before reduce-scatter" item charges
it (as for Liger, `phases.cce_for`). Under ZeRO-3 `cce_forward` reads `self.lm_head.weight` in the model's forward, an
external parameter (gathered, held to the end of the backward; the fork re-gathers it for the backward with
`GatheredParameters`, 63b15e6): the allocator replay holds it as for Liger.

B, the label rows: b(s-1) at most; the prompt tokens of an SFT sample are -100 and drop out of `valids`, which only
lowers a few bytes per token here (the planner charges b(s-1)).

Evaluation: `PatchOptions.use_lce(labels, training)` is true whenever the batch has labels unless `train_only` (off
by default, and axolotl passes none), so an evaluation forward runs CCE too: no logits at all (`logits=None` in the
output, so nothing is kept for metrics); `needs_grad` is false, so no `logit_avg` and nothing saved.
"""

from __future__ import annotations

from dataclasses import dataclass

CCE_SOURCE = (
    "apple/ml-cross-entropy d42911f and axolotl-ai-cloud/ml-cross-entropy 5f0c7a7 cut_cross_entropy/cce.py "
    "LinearCrossEntropyFunction "
    "(ctx.save_for_backward(e, c, bias, lse, targets, valids, logit_avg)), cce_lse_forward.py, cce_backward.py "
    "cce_backward_kernel (de = zeros_like(e), dc = zeros_like(c)), transformers/utils.py PatchOptions.use_lce; "
    "axolotl src/axolotl/integrations/cut_cross_entropy (pre_model_load -> cce_patch)"
)

CCE_PATCH_TYPES = frozenset(
    {
        "afmoe", "apertus", "arcee", "cohere", "cohere2", "cohere2_moe", "deepseek_v2", "deepseek_v3",
        "deepseek_v4", "exaone4", "exaone4_5", "exaone_moe", "gemma", "gemma2", "gemma3", "gemma3_text", "gemma3n",
        "gemma3n_text", "gemma4", "gemma4_text", "gemma4_unified", "gemma4_unified_text", "glm", "glm4", "glm4_moe",
        "glm4_moe_lite", "glm_moe_dsa", "glm46v", "glm4v", "glm_image", "glm4v_moe", "gpt_oss", "granite",
        "granitemoe", "granitemoeshared", "granitemoehybrid", "hunyuan_v1_dense", "hunyuan_v1_moe", "internvl",
        "kimi_linear", "lfm2", "lfm2_moe", "lfm2_vl", "llama", "llama4", "llava", "llama4_text", "minimax",
        "minimax_m2", "ministral", "ministral3", "mistral", "mistral3", "mistral4", "mixtral", "mllama",
        "nemotron_h", "olmo", "olmo2", "olmo3", "olmoe", "phi", "phi3", "phi4_multimodal", "qwen2", "qwen2_moe",
        "qwen2_vl", "qwen2_5_vl", "qwen3", "qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text",
        "qwen3_moe", "qwen3_vl", "qwen3_vl_moe", "qwen3_next", "smollm3", "seed_oss", "step3p5", "step3p7",
        "voxtral",
    }
)
"""`PATCH_FNS` of axolotl's fork `cut_cross_entropy/transformers/patch.py` at 5f0c7a7 (the pin of the newest axolotl releases;
the fork replaced apple's package in axolotl v0.11.0, #2813): the model types with their own `cce_forward`. axolotl
>= 0.12.0 patches any other transformers type with the llama one (`patch_llama_like`, experimental); an older pin
lists fewer types (865b899: 25), which changes only that label, not the bytes."""


FP32 = 4
INT32 = 4
INT64 = 8
LOCK_ROWS = 128  # triton.cdiv(B, 128) lock rows (forward and backward)
LOCK_COLS = 64  # triton.cdiv(H, 64) lock columns (backward)
_VALIDS_BUILT = 2 * INT64 + 2 * INT32
"""Bytes per label row while `_build_flat_valids` runs: `nonzero()` (int64, B x 2) and its int32 copy at once."""


@dataclass(frozen=True)
class CutCrossEntropy:
    """CCE in a run (`phases.cce_for`)."""

    head_grad_charged: bool = False
    """The head's V x H gradient `dc` is charged by the planner's "full-size gradient before reduce-scatter" item
    (ZeRO-2/3, a trainable head that is the largest trainable tensor): not a second time here."""
    head_trains: bool = False
    """The head trains outside full fine-tuning: a PEFT `modules_to_save` copy of `lm_head` (or of the tied
    embedding), whose `c.requires_grad` makes the backward allocate `dc` (`phases.cce_for`)."""


@dataclass(frozen=True)
class CutCE:
    """The Cut Cross-Entropy of one micro-batch, in bytes (module docstring)."""

    tokens: int  # T = b x s
    rows: int  # B: label rows after the shift, b(s-1)
    hidden_in: int  # e, T x H in the model dtype: saved (the final norm's output itself)
    lse: int  # fp32 per row: saved
    valids: int  # int64 per row: saved
    logit_avg: int  # fp32 per vocabulary entry (filter_eps with a gradient): saved
    forward_step: int  # the larger of building `valids` and the forward's neg_dot + locks
    grad_input: int  # de, T x H in the model dtype (backward)
    grad_weight: int  # dc, V x H in the model dtype, with a trainable head not charged elsewhere (backward)
    vocab_sort: int  # argsort(logit_avg) in int64 and its int32 copy, at once (backward)
    vocab_order: int  # the int32 order kept through the backward kernel
    locks: int  # the backward's de / dc locks
    head_trainable: bool = True

    @property
    def saved(self) -> int:
        """What stays from the loss's forward to its backward."""
        return self.hidden_in + self.lse + self.valids + self.logit_avg

    @property
    def transient(self) -> int:
        """What exists only inside the function (forward or backward), on top of `saved`."""
        return max(self.forward_step, self.vocab_sort, self.vocab_order + self.backward_grads)

    @property
    def backward_grads(self) -> int:
        """de, dc and the locks of the backward kernel."""
        return self.grad_input + self.grad_weight + self.locks


def cut_ce_bytes(
    *, tokens: int, batch: int, hidden: int, vocab: int, dtype_bytes: int, head_trainable: bool, cce: CutCrossEntropy
) -> CutCE:
    """Bytes of `LinearCrossEntropyFunction` in training for `tokens` rows (`batch` sequences) of `hidden` features
    against a `vocab` x `hidden` head in `dtype_bytes` (module docstring)."""
    d = dtype_bytes
    rows = max(tokens - batch, 1)
    forward = max(_VALIDS_BUILT * rows, FP32 * rows + INT32 * -(-rows // LOCK_ROWS))
    dc = head_trainable and not cce.head_grad_charged
    lock_cols = -(-hidden // LOCK_COLS)
    locks = INT32 * lock_cols * (-(-rows // LOCK_ROWS) + (-(-vocab // LOCK_ROWS) if head_trainable else 0))
    return CutCE(
        tokens=tokens,
        rows=rows,
        hidden_in=d * tokens * hidden,
        lse=FP32 * rows,
        valids=INT64 * rows,
        logit_avg=FP32 * vocab,
        forward_step=forward,
        grad_input=d * tokens * hidden,
        grad_weight=d * vocab * hidden if dc else 0,
        vocab_sort=(INT64 + INT32) * vocab,
        vocab_order=INT32 * vocab,
        locks=locks,
        head_trainable=head_trainable,
    )


def cut_ce_eval_bytes(*, tokens: int, batch: int, hidden: int, dtype_bytes: int) -> int:
    """An evaluation forward's loss under CCE (no gradient: no `logit_avg`, nothing saved): the final hidden states
    it reads, `valids` (and the two tensors it is built from), then `lse`, `neg_dot` and the locks."""
    rows = max(tokens - batch, 1)
    after = (INT64 + 2 * FP32) * rows + INT32 * -(-rows // LOCK_ROWS)
    return dtype_bytes * tokens * hidden + max(_VALIDS_BUILT * rows, after)
