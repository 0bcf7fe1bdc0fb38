"""axolotl's own defaults for the YAML keys that move memory (issue 9).

zerodoctor reads an axolotl YAML as an HF arguments file: axolotl builds HF `TrainingArguments` from it and trains
with its own HF Trainer subclass. Where a key is absent, though, axolotl's pydantic schema and `normalize_config`
decide, not transformers: `micro_batch_size` is 1, not `per_device_train_batch_size`'s 8. Each default below was
read in axolotl's source (axolotl-ai-cloud/axolotl at 067b021c8, 2026: the file:line in each comment, and at the
commits named where it changed);
`zerodoctor.setup.run` takes them for a YAML that `is_axolotl` recognises, each with this source in its origin.

What an axolotl key changes that needs no default of its own: `sample_packing` sets `pad_to_sequence_len: true`
when unset (utils/schemas/validation.py:230-242 `hint_sample_packing_padding`), and with flash attention its sampler
yields one row of `micro_batch_size x sequence_len` tokens (core/builders/causal.py:278-282: `multipack_real_batches`
defaults to `not flash_attention`; core/trainers/base.py:155-163: then `batch_max_len = train_batch_size *
max_seq_length`), the same tokens as `micro_batch_size` rows at `sequence_len`: planned at the cap either way.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from packaging.version import Version

from zerodoctor.facts import truthy
from zerodoctor.versions import parse_version

AXOLOTL_KEYS = frozenset(
    {"base_model", "micro_batch_size", "sequence_len", "sample_packing", "pad_to_sequence_len", "lora_target_linear"}
)
"""Keys of axolotl's schema that neither transformers' TrainingArguments nor LLaMA-Factory, TRL or ms-swift use:
one of them marks an arguments YAML as axolotl's."""


NOT_AXOLOTL_KEYS = frozenset({"model_name_or_path", "per_device_train_batch_size"})
"""HF / TRL argument names axolotl's schema does not have (it names the model `base_model` and the batch
`micro_batch_size`): one of them written makes a stray axolotl key (a `base_model` left in a TRL YAML) not count."""


def is_axolotl(args: Mapping[str, Any] | None) -> bool:
    """Whether an HF-kind arguments file is an axolotl YAML: one of `AXOLOTL_KEYS` written and none of
    `NOT_AXOLOTL_KEYS`."""
    return args is not None and bool(AXOLOTL_KEYS & set(args)) and not NOT_AXOLOTL_KEYS & set(args)


DEFAULTS_SINCE = "0.5.0"
"""The first release that applies the schema's defaults: #1415 (601b77bc9, 2024-03-26) made `validate_config` dump
with exclude_none, where exclude_unset had dropped every unwritten key (micro_batch_size, sequence_len, bf16 stayed
None). The defaults below hold from this release."""


@dataclass(frozen=True)
class AxolotlDefault:
    """One default of axolotl's and where in its source it is set."""

    value: Any
    source: str


MICRO_BATCH = AxolotlDefault(
    1,
    # utils/schemas/training.py:77-78 HyperparametersConfig: `micro_batch_size: int | None = Field(default=1, ...)`
    # (utils/config/models/input/v0_4_1 the same since the pydantic schema, #1239, 2024-02-26)
    "axolotl micro_batch_size default 1 (utils/schemas/training.py HyperparametersConfig; applied from v0.5.0, #1415)",
)
SEQUENCE_LEN = AxolotlDefault(
    512,
    # utils/schemas/config.py:665-666: `sequence_len: int = Field(default=512, ...)`; the v0_4_1 schema's 1024 was
    # never applied (DEFAULTS_SINCE)
    "axolotl sequence_len default 512 (utils/schemas/config.py; applied from v0.5.0, #1415)",
)
GRADIENT_CHECKPOINTING = AxolotlDefault(
    False,
    # utils/schemas/config.py:600-601: `gradient_checkpointing: ... = Field(default=False, ...)`
    "axolotl gradient_checkpointing default false (utils/schemas/config.py)",
)
PRECISION = AxolotlDefault(
    "bf16",
    # utils/schemas/config.py:559-560 `bf16: Literal["auto"] | bool | None = Field(default="auto")`;
    # utils/config/__init__.py:156-196 resolve_dtype: "auto" -> bf16 where is_torch_bf16_gpu_available(), else fp16
    "axolotl bf16 'auto' (its default): bf16 on a GPU with bf16, fp16 on one without (utils/config resolve_dtype)",
)
ATTENTION = AxolotlDefault(
    "sdpa",
    # loaders/model.py:754-762 _set_attention_config: no attn_implementation unless `attn_implementation` (or, at
    # eac4a61f5 loaders/model.py:530-552, flash_attention / sdp_attention / eager_attention) says: transformers' own
    "axolotl passes no attn_implementation without an attention key (loaders/model.py): transformers' sdpa",
)
LORA_TARGET_LINEAR = (
    # loaders/adapter.py:171-182 _build_peft_lora_config: `if cfg.lora_target_linear: linear_names =
    # find_all_linear_names(model)` (every nn.Linear / Linear4bit but the output head), added to lora_target_modules
    "axolotl lora_target_linear: every linear layer but lm_head (loaders/adapter.py find_all_linear_names)"
)
LORA_DROPOUT = AxolotlDefault(
    0.0,
    # utils/schemas/peft.py:80 LoraConfig: `lora_dropout: float | None = 0.0` (None before #1647, 2024-05)
    "axolotl lora_dropout default 0.0 (utils/schemas/peft.py)",
)
QUANT_STORAGE = AxolotlDefault(
    "bfloat16",
    # loaders/model.py:712-720 (utils/models.py before #2680): adapter qlora + load_in_4bit: BitsAndBytesConfig(nf4,
    # bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=torch_dtype, bnb_4bit_quant_storage=torch.bfloat16)
    # since #1428 (2024-03-21); uint8 (no storage key) before
    "axolotl qlora: BitsAndBytesConfig(nf4, double quant, bnb_4bit_quant_storage=torch.bfloat16) (loaders/model.py)",
)
LORA_4BIT_UNQUANTIZED = AxolotlDefault(
    "0.13.0",
    # loaders/model.py:712 `elif self.cfg.adapter == "qlora" and self.cfg.load_in_4bit:` builds the only 4-bit
    # BitsAndBytesConfig; #3205 (aa1240acd, first in v0.13.0) dropped the legacy `model_kwargs["load_in_4bit"]`, which
    # had quantized `adapter: lora` too (transformers' BitsAndBytesConfig defaults: uint8 storage)
    "axolotl >= 0.13.0 quantizes only for adapter qlora (loaders/model.py, #3205): the weights load unquantized",
)
KBIT_PREPARATION = AxolotlDefault(
    "none",
    # loaders/model.py:422-478 _configure_embedding_dtypes: for adapter lora/qlora (`needs_fa2_dtype = True`) it calls
    # prepare_model_for_kbit_training (:988-1023; skipped under ZeRO-3 and FSDP-QLoRA), then (:471-478)
    # _convert_embedding_modules_dtype(dist_dtype=cfg.torch_dtype) (:1025-1047): every module named "*norm*" and the
    # embedding / lm_head back to 16-bit; bitsandbytes' Linear4bit.forward casts a bias to its input's dtype. Nothing the preparation upcast stays fp32 (the MoE router
    # `.gate` it upcasts before is the one exception: a hidden x experts matrix per layer).
    "axolotl puts the norms, embedding and lm_head back in the torch dtype after prepare_model_for_kbit_training "
    "(loaders/model.py _configure_embedding_dtypes)",
)
EVAL_BATCH = (
    # utils/config/__init__.py:208-209 normalize_config: `if cfg.eval_batch_size is None: cfg.eval_batch_size =
    # cfg.micro_batch_size`; core/builders/base.py:671-674 passes it as per_device_eval_batch_size
    "axolotl eval_batch_size default: micro_batch_size (utils/config normalize_config)"
)
EVALUATES = (
    # core/builders/base.py:514-523 _configure_save_and_eval_strategy: `if not self.eval_dataset and
    # cfg.val_set_size == 0: eval_strategy = "no"`, else "steps" with eval_steps (which normalize_config,
    # utils/config/__init__.py:250-253, derives from evals_per_epoch) or the written eval_strategy; nothing written:
    # TrainingArguments' eval_strategy "no". val_set_size defaults to 0.0 (utils/schemas/config.py:1084-1085)
    "axolotl evaluates an eval set (val_set_size > 0 or test_datasets) at eval_steps / evals_per_epoch / "
    "eval_strategy (core/builders/base.py)"
)


def training_arguments(args: Mapping[str, Any], version: str | None = None) -> dict[str, Any]:
    """The HF TrainingArguments an axolotl YAML becomes, where axolotl's names or defaults differ from HF's, for
    the checks that compare them with the DeepSpeed config (HF001, DS002): core/builders/base.py:668 passes
    `micro_batch_size` (default 1) as `per_device_train_batch_size`; :270-280 `_configure_precision_settings` passes
    the `bf16` that resolve_dtype made of "auto" (its default, utils/config/__init__.py:156-170: true on a GPU with
    bf16, assumed here) and `fp16 = fp16 and not bf16`. Other keys stay as written. An unwritten bf16 is "auto" from v0.5.0
    and where `version` (the installed axolotl) is not known; before, it stays None (`PRECISION_WRITTEN_DEFAULT`;
    review R10, 5: `plan` reads the same release)."""
    out = dict(args)
    if "per_device_train_batch_size" not in args:
        out["per_device_train_batch_size"] = args.get("micro_batch_size", MICRO_BATCH.value)
    parsed = parse_version(version)
    unwritten = None if parsed is not None and parsed < Version(DEFAULTS_SINCE) else PRECISION_WRITTEN_DEFAULT
    bf16, fp16 = args.get("bf16", unwritten), args.get("fp16")
    if isinstance(bf16, str) and bf16.strip().lower() == "auto":
        out["bf16"] = not bool(truthy(fp16))
    if truthy(out.get("bf16")):
        out["fp16"] = False
    return out


PRECISION_WRITTEN_DEFAULT = "auto"
"""`bf16`'s schema default (utils/schemas/config.py:559-560), applied from v0.5.0 (#1415; `validate_config` dumped
with exclude_unset before, so an unwritten bf16 stayed None: fp32)."""


def quantization(args: Mapping[str, Any], quant: Mapping[str, Any]) -> dict[str, Any]:
    """The 4-bit settings an axolotl YAML loads with: for `adapter: qlora` + `load_in_4bit` its loader builds the
    BitsAndBytesConfig itself, bf16 storage whatever the YAML says (`QUANT_STORAGE`), so the checks see the storage
    set by the framework (QL001 does not ask for a key axolotl never reads). Other settings stay as read."""
    out = dict(quant)
    if out.get("load_in_4bit") and str(args.get("adapter", "")).strip().lower() == "qlora":
        out["bnb_4bit_quant_storage"] = QUANT_STORAGE.value
        out["quant_storage_set_by_framework"] = True
    return out
