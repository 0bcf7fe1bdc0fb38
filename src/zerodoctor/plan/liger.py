"""What Liger Kernel changes in a training step's activations, as `use_liger_kernel` applies it.

Read in linkedin/Liger-Kernel at v0.5.10 (2025-05-22) and v0.6.1 / v0.6.2 / v0.8.2 where they differ; pure
arithmetic: no torch, no liger_kernel import.

How a run gets the kernels: transformers' Trainer with `TrainingArguments.use_liger_kernel` (TRL and ms-swift take
the same argument) calls liger_kernel `_apply_liger_kernel_to_instance(model, ...)`: in the 4.x releases from
`Trainer.__init__` (code inline there; from 4.45 to 4.48 with the default configuration and only for a
`PreTrainedModel`, so a LoRA run's PeftModel got nothing: `TRANSFORMERS_PATCHES_PEFT_FROM`); in 5.23 (read) from
`Trainer.train` through `integrations/liger.py apply_liger_kernel(model, liger_kernel_config)`, which unwraps a
PeftModel and passes `liger_kernel_config` (TrainingArguments, huggingface/transformers#38911; the first release
with it was not read) as keyword arguments. The model is patched only when its
`model_type` is a key of `MODEL_TYPE_TO_APPLY_LIGER_FN` (otherwise liger_kernel logs "no Liger kernels supported" and
changes nothing). TRL's SFTConfig `use_liger` (before 0.16) loads the model through `AutoLigerKernelForCausalLM`, before
PEFT wraps it. LLaMA-Factory's `enable_liger_kernel` (model/model_utils/liger_kernel.py `apply_liger_kernel`) calls the
same per-model `apply_liger_kernel_to_<type>` functions before loading, with `fused_linear_cross_entropy=False` for the
stages that need logits (model/loader.py: `require_logits=(finetuning_args.stage not in ["pt", "sft"])`, from
v0.9.1); preference runs are planned with the logits and the RMSNorm/SwiGLU patches (`phases.liger_plan`). The
defaults of the dense SwiGLU families (llama, mistral, qwen2, qwen3; v0.5.10 monkey_patch.py) are `rope=True,
fused_linear_cross_entropy=True, rms_norm=True, swiglu=True, cross_entropy=False`; Granite's are
`fused_linear_cross_entropy=False, cross_entropy=True` (`FUSED_CE_OFF_TYPES`).

What each patched module keeps for the backward, against the HF module (`zerodoctor.plan.activations`):

* Fused linear cross-entropy (`LigerFusedLinearCrossEntropyFunction`, ops/fused_linear_cross_entropy.py): the
  patched `<Model>ForCausalLM.forward` (`lce_forward`) never calls `lm_head` in training; it hands the final
  hidden states and `lm_head.weight` to the function, which walks the T tokens in chunks of
  `chunk_rows` = next_power_of_2(ceil(T / ceil(V / H))) rows: per chunk `logits_chunk = x_chunk @ W.t()` (c x V in
  the model dtype), the cross-entropy kernel overwrites it with its gradient in place, `grad_input[chunk] =
  grad_logits @ W` (a c x H product copied into the slice) and the weight gradient is accumulated into
  `grad_weight` (`torch.addmm(..., out=grad_weight)` up to 0.6.1; from 0.6.2, linkedin/Liger-Kernel#830,
  `grad_weight += torch.mm(grad_logits.t(), x_chunk).float()`: a V x H product in the model dtype and its fp32
  copy per chunk). The gradients are computed in the forward: `grad_input` (T x H) and, when the head trains,
  `grad_weight` (V x H, `zeros_like(weight)`) are what `ctx.save_for_backward` keeps, plus a fp32 per-token loss
  (T) for the forward; the backward only scales them in place (`element_mul_kernel`). No T x V logits, no fp32
  upcast, no log-probabilities.
  Under ZeRO-3 the head weight is gathered when `lce_forward` reads it (DeepSpeed parameter_offload.py
  `ZeROOrderedDict.__getitem__`: an external parameter of the running module, all-gathered), so the planner's
  fetched-parameter working set covers it.
* RMSNorm (`LigerRMSNormFunction`, ops/rms_norm.py): saves its input X (model dtype), W and a fp32 RSTD per row:
  D x T x h + 4T, against HF `LlamaRMSNorm`'s fp32 copy of the input, its rsqrt and (trainable weight) the
  normalised tensor: 4 x T x h + 4T (+ D x T x h).
* SwiGLU (`LigerSiLUMulFunction`, ops/swiglu.py): saves the gate and up outputs (2 x D x T x i) and recomputes
  SiLU in the backward, against HF's SiLU input, SiLU output and up output (3 x D x T x i); the product is kept by
  `down_proj` in both.
* RoPE (`LigerRopeFunction`, ops/rope.py): rotates q and k in place and saves only cos and sin; the rotated q and k
  that attention keeps are the same bytes as HF's, so nothing changes in the saved tensors.

Evaluation is charged as without Liger: `lce_forward` fuses the loss only in training -- v0.5.10 tests `self.training
and (labels is not None or shift_labels is not None)`; from v0.6.0 (`skip_logits`, linkedin/Liger-Kernel#704) the
default is `self.training and labels is not None` -- so an evaluation forward materialises the logits and runs
transformers' loss on them. transformers 5.23's `prediction_step` passes `skip_logits=True` for a loss-only evaluation
with `use_liger_kernel` (huggingface/transformers#44981, #43039); the release that first did is not pinned here, so
the eval phase keeps the larger, materialised case.

Under ZeRO-3 the head weight that `lce_forward` reads becomes an external parameter of the whole model: gathered
again by the model's pre-backward hook and released only at the end of the backward (DeepSpeed
partitioned_param_coordinator.py `release_sub_module` / `release_backward_leftovers`); the allocator replay holds
it that long (plan/allocator.py `_fused_linear_ce`).

Not modelled: TRL's chunked Liger preference losses (DPO/KTO/ORPO `use_liger_loss`, or DPO with `use_liger_kernel`):
their logits are planned, an upper bound; a PEFT `modules_to_save` head (planned frozen); LigerCrossEntropyLoss
(Granite's default) against transformers' loss (planned as transformers' loss). The allocator replay
(plan/allocator.py) allocates as LigerRMSNorm and LigerSiLUMulFunction do (no fp32 copies, no SiLU tensor, input
gradients written in place); its reserved-but-unallocated gap under Liger (Llama-3-8B full ZeRO-3, 4 GPUs, mb2 x 4096:
9.4 GiB against 3.6 GiB without Liger) is not the layers' doing (replaying Liger's ops raised it from 8.95 GiB); the
optimizer step's fp32 sub-group blocks no longer fitting the freed logits' segments is the suspected cause, not
checked. No GPU reading has checked a Liger figure yet: every number here comes from the source.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from packaging.version import Version

from zerodoctor.versions import parse_version

LIGER_SOURCE = (
    "linkedin/Liger-Kernel v0.5.10 src/liger_kernel/ops/fused_linear_cross_entropy.py "
    "fused_linear_cross_entropy_forward (chunk_size, grad_input/grad_weight saved for backward), "
    "transformers/model/qwen2.py lce_forward; v0.6.2 (linkedin/Liger-Kernel#830) `grad_weight += torch.mm(...).float()`"
)
NORM_SWIGLU_SOURCE = (
    "linkedin/Liger-Kernel v0.5.10 src/liger_kernel/ops/rms_norm.py LigerRMSNormFunction.forward "
    "(ctx.save_for_backward(X, W, RSTD)), ops/swiglu.py LigerSiLUMulFunction.forward (ctx.save_for_backward(a, b)), "
    "transformers/monkey_patch.py apply_liger_kernel_to_<model> (rms_norm=True, swiglu=True)"
)

LIGER_MODEL_TYPES = frozenset(
    {
        "gemma",
        "gemma2",
        "gemma3_text",
        "gemma3",
        "glm4",
        "llama",
        "llava",
        "granite",
        "mllama",
        "mllama_text_model",
        "mistral",
        "mixtral",
        "olmo2",
        "qwen2",
        "qwen3",
        "qwen3_moe",
        "qwen2_vl",
        "qwen2_5_vl",
        "phi3",
        "paligemma",
    }
)
"""`MODEL_TYPE_TO_APPLY_LIGER_FN` keys in liger_kernel v0.5.10 transformers/monkey_patch.py (20 types): the model
types `_apply_liger_kernel_to_instance` patches. Later releases add more -- v0.6.2: llama4, llama4_text, glm4v,
smollm3, qwen2_vl_text, qwen2_5_vl_text; v0.8.2 (50 types): among others gpt_oss, olmo3, qwen3_5, qwen3_next,
qwen3_vl, gemma4, ministral, nemotron, exaone4, falcon_h1 -- and LLaMA-Factory maps model_type "glm" to glm4. A type
outside this set is planned unpatched: the larger case when a newer liger_kernel does patch it."""

NORM_SWIGLU_MODEL_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen3"})
"""Dense SwiGLU families whose `apply_liger_kernel_to_<type>` swaps every decoder RMSNorm (and the final norm) for
`LigerRMSNorm` and every MLP for `LigerSwiGLUMLP` by default, and whose decoder layer the activation model counts
as the Llama layer (v0.5.10 monkey_patch.py). MoE and GeGLU families keep the HF saved-tensor count here."""

FUSED_CE_OFF_TYPES = frozenset({"granite"})
"""Types whose `apply_liger_kernel_to_<type>` defaults to `fused_linear_cross_entropy=False, cross_entropy=True`
(monkey_patch.py `apply_liger_kernel_to_granite` at v0.5.10, v0.6.2 and v0.8.2; every other type of
`LIGER_MODEL_TYPES` defaults to the fused loss): the logits are materialised and `LigerCrossEntropyLoss` runs on them,
planned as transformers' loss on the logits (its upper bound)."""

LIGER_CONFIG_KEYS = ("fused_linear_cross_entropy", "rms_norm", "swiglu")
"""The `liger_kernel_config` keys (transformers TrainingArguments, passed as `**kernel_config` to
`_apply_liger_kernel_to_instance`) that change what the planner charges; `rope` and `cross_entropy` do not."""

TRANSFORMERS_PATCHES_PEFT_FROM = "4.49.0"
"""The HF Trainer's `use_liger_kernel` hook (in `Trainer.__init__` from 4.45) patched only `isinstance(model,
PreTrainedModel)`: a PeftModel logged "The model is not an instance of PreTrainedModel. No liger kernels will be
applied." and trained unpatched (huggingface/transformers#34016, on 4.45.1). huggingface/transformers#35680 added the
`model.get_base_model()` branch; it was reviewed on 2025-01-14, after v4.48.0 (2025-01-10), so 4.49.0 is the first
release with it (the 4.48.x patch releases were not read). A run that patches before PEFT wraps the model
(LLaMA-Factory `enable_liger_kernel`, TRL < 0.16 `use_liger` loading through `AutoLigerKernelForCausalLM`) is not
affected."""

WEIGHT_GRAD_COPY_FROM = "0.6.2"
"""From liger_kernel 0.6.2 (`accum_dtype` option, linkedin/Liger-Kernel#830) each chunk accumulates the head's
gradient with `grad_weight += torch.mm(grad_logits_chunk.t(), _input_chunk).float()` (0.8.2 keeps it when
`grad_weight` is not fp32, the default): a V x H product in the model dtype and its fp32 copy exist together. Up to
0.6.1 `torch.addmm(..., out=grad_weight)` accumulates in place. An unknown version is planned as a current one."""

FP32 = 4
BOOL = 1


@dataclass(frozen=True)
class LigerKernels:
    """Which Liger kernels change the saved tensors of a run (`liger_kernels`)."""

    fused_linear_ce: bool
    rms_norm: bool
    swiglu: bool
    weight_grad_copy: bool
    """The per-chunk V x H product and its fp32 copy of liger_kernel >= 0.6.2 (`WEIGHT_GRAD_COPY_FROM`)."""
    head_grad_charged: bool = False
    """The head's full-size gradient that the fused loss makes in the forward is charged by the planner's own
    "full-size gradient before reduce-scatter" item (ZeRO-2/3, the head is the largest trainable tensor): the
    fused loss then does not charge it a second time."""


def liger_kernels(
    model_type: str, liger_version: str | None, config: Mapping[str, bool] | None = None
) -> LigerKernels | None:
    """The kernels liger_kernel applies to a model of `model_type`: each `apply_liger_kernel_to_<type>` default
    (`FUSED_CE_OFF_TYPES`), overridden by the `config` a run passes (`liger_kernel_config`: its
    fused_linear_cross_entropy / rms_norm / swiglu keys); None when liger_kernel has no patch for the type (it then
    trains as the HF model)."""
    if model_type not in LIGER_MODEL_TYPES:
        return None
    cfg = config or {}
    v = parse_version(liger_version)
    dense = model_type in NORM_SWIGLU_MODEL_TYPES
    return LigerKernels(
        fused_linear_ce=bool(cfg.get("fused_linear_cross_entropy", model_type not in FUSED_CE_OFF_TYPES)),
        rms_norm=dense and bool(cfg.get("rms_norm", True)),
        swiglu=dense and bool(cfg.get("swiglu", True)),
        weight_grad_copy=v is None or v >= Version(WEIGHT_GRAD_COPY_FROM),
    )


def trainer_patches_peft_model(transformers_version: str | None) -> bool:
    """Whether the HF Trainer's `use_liger_kernel` hook patches the base model of a PeftModel
    (`TRANSFORMERS_PATCHES_PEFT_FROM`); False for an unknown version, the larger case."""
    v = parse_version(transformers_version)
    return v is not None and v >= Version(TRANSFORMERS_PATCHES_PEFT_FROM)


def flce_chunk_rows(tokens: int, hidden: int, vocab: int) -> int:
    """Rows per chunk of the fused linear cross-entropy: `inc_factor = cdiv(V, H)`, `chunk_size =
    next_power_of_2(cdiv(BT, inc_factor))` (fused_linear_cross_entropy_forward), at most the tokens there are."""
    inc = -(-vocab // max(hidden, 1))
    rows = -(-tokens // max(inc, 1))
    return min(1 << max(rows - 1, 0).bit_length(), tokens)


@dataclass(frozen=True)
class FusedLinearCE:
    """The fused linear cross-entropy of one micro-batch, in bytes (module docstring)."""

    chunk_rows: int
    chunks: int
    grad_input: int  # T x H, model dtype: saved for backward
    grad_weight: int  # V x H, model dtype, when the head trains and no other item charges it: saved for backward
    hidden_in: int  # the final hidden states handed to the function (alive during its forward, not saved)
    loss_rows: int  # fp32 per-token loss + the bool target mask
    chunk_logits: int  # c x V logits of one chunk, overwritten with their gradient
    chunk_step: int  # the larger of the c x H input-gradient product and (>= 0.6.2) the V x H product + fp32 copy
    head_trainable: bool = True  # the head's weight requires grad (full fine-tuning), so `grad_weight` exists

    @property
    def saved(self) -> int:
        """What stays from the loss's forward to its backward."""
        return self.grad_input + self.grad_weight

    @property
    def transient(self) -> int:
        """What exists only inside the function's forward, on top of `saved`."""
        return self.hidden_in + self.loss_rows + self.chunk_logits + self.chunk_step


def fused_linear_ce_bytes(
    *, tokens: int, hidden: int, vocab: int, dtype_bytes: int, head_trainable: bool, kernels: LigerKernels
) -> FusedLinearCE:
    """Bytes of `LigerFusedLinearCrossEntropyFunction` for `tokens` rows of `hidden` features against a
    `vocab` x `hidden` head in `dtype_bytes` (module docstring)."""
    d = dtype_bytes
    rows = flce_chunk_rows(tokens, hidden, vocab)
    weight_grad = head_trainable and not kernels.head_grad_charged
    copy = vocab * hidden * (d + FP32) if kernels.weight_grad_copy and head_trainable else 0
    return FusedLinearCE(
        chunk_rows=rows,
        chunks=math.ceil(tokens / rows),
        grad_input=d * tokens * hidden,
        grad_weight=d * vocab * hidden if weight_grad else 0,
        hidden_in=d * tokens * hidden,
        loss_rows=(FP32 + BOOL) * tokens,
        chunk_logits=d * rows * vocab,
        chunk_step=max(d * rows * hidden, copy),
        head_trainable=head_trainable,
    )
