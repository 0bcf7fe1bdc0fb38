"""HF TrainingArguments as the Trainer sees them, and how HF fills DeepSpeed's "auto" values.

Mirrors transformers `integrations/deepspeed.py::HfTrainerDeepSpeedConfig` (transformers 5.23.0):
`trainer_config_process` fills batch sizes, clipping, optimizer/scheduler params and fp16/bf16 from the
arguments and records a mismatch for every non-"auto" value that differs; `trainer_config_finalize` fills
the hidden-size based bucket keys and raises "Please correct the following DeepSpeed config values that
mismatch TrainingArguments values" if any mismatch was recorded. Tested against the installed transformers.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from zerodoctor.facts import is_auto
from zerodoctor.setup import axolotl
from zerodoctor.setup.reader import LLAMAFACTORY_KEYS

# TrainingArguments defaults (transformers 5.23.0; tests/setup/test_hf_args.py checks them against the
# installed transformers). The type drives the coercion HfArgumentParser does on YAML/CLI strings.
HF_DEFAULTS: dict[str, tuple[type, Any]] = {
    "per_device_train_batch_size": (int, 8),
    "gradient_accumulation_steps": (int, 1),
    "max_grad_norm": (float, 1.0),
    "learning_rate": (float, 5e-05),
    "adam_beta1": (float, 0.9),
    "adam_beta2": (float, 0.999),
    "adam_epsilon": (float, 1e-08),
    "weight_decay": (float, 0.0),
    "fp16": (bool, False),
    "bf16": (bool, False),
    "fp16_full_eval": (bool, False),
    "bf16_full_eval": (bool, False),
    "save_only_model": (bool, False),
    "save_on_each_node": (bool, False),
    "auto_find_batch_size": (bool, False),
    "num_train_epochs": (float, 3.0),
    "max_steps": (int, -1),
    "dataloader_num_workers": (int, 0),
    "ddp_timeout": (int, 1800),
}
# Arguments whose default is None / not fixed but which we still coerce when given.
HF_TYPES: dict[str, type] = {
    "gradient_checkpointing": bool,
    "warmup_steps": float,
    "warmup_ratio": float,
    "save_steps": float,
    "logging_steps": float,
    "per_device_eval_batch_size": int,
    "seed": int,
}


def coerce(value: Any, typ: type) -> Any:
    """What HfArgumentParser makes of a YAML value: "1e-5" -> 1e-05, "true" -> True. Unparseable stays as is."""
    if value is None or isinstance(value, typ) and not (typ is int and isinstance(value, bool)):
        return value
    try:
        if typ is bool:
            if isinstance(value, str):
                low = value.strip().lower()
                if low in ("true", "yes", "1", "on"):
                    return True
                if low in ("false", "no", "0", "off"):
                    return False
                return value
            return bool(value)
        if typ is int:
            f = float(value)
            return (
                int(f) if math.isfinite(f) and f == int(f) else value
            )  # "inf" stays as written: not a count
        if typ is float:
            f = float(value)
            return f if math.isfinite(f) else value
    except (TypeError, ValueError, OverflowError):
        return value
    return value


def effective_args(given: dict[str, Any], *, axolotl_version: str | None = None) -> dict[str, Any]:
    """The arguments with defaults applied and strings coerced, as the Trainer would have them (for an axolotl
    YAML, the TrainingArguments its builder makes of it: `setup.axolotl.training_arguments`, by the installed
    `axolotl_version` where known)."""
    if axolotl.is_axolotl(given) and not LLAMAFACTORY_KEYS & set(given):
        given = axolotl.training_arguments(given, axolotl_version)
    out = {k: d for k, (_t, d) in HF_DEFAULTS.items()}
    for k, v in given.items():
        typ = HF_DEFAULTS[k][0] if k in HF_DEFAULTS else HF_TYPES.get(k)
        out[k] = coerce(v, typ) if typ else v
    return out


@dataclass
class AutoResolution:
    config: dict[str, Any]
    filled: dict[str, tuple[Any, str]] = field(default_factory=dict)  # ds key -> (value, from which argument)
    unresolved: list[str] = field(
        default_factory=list
    )  # "auto" keys we could not fill (e.g. world size unknown)
    mismatches: list[tuple[str, Any, str, Any]] = field(
        default_factory=list
    )  # (ds key, ds value, hf arg, hf value)


def _node(config: dict[str, Any], dotted: str) -> tuple[dict[str, Any] | None, str]:
    *parents, last = dotted.split(".")
    node: Any = config
    for p in parents:
        node = node.get(p) if isinstance(node, dict) else None
        if node is None:
            return None, last
    return (node if isinstance(node, dict) else None), last


# The ZeRO keys HF Trainer fills from the model's hidden size h when they are "auto" (transformers
# integrations/deepspeed.py HfTrainerDeepSpeedConfig.trainer_config_finalize; the last two only for ZeRO-3).
# The one place these formulas live: the run description and the planner read them from here.
HF_AUTO_BUCKETS: dict[str, tuple[str, Callable[[int], int]]] = {
    "zero_optimization.reduce_bucket_size": ("hidden_size*hidden_size", lambda h: h * h),
    "zero_optimization.stage3_prefetch_bucket_size": (
        "0.9*hidden_size*hidden_size",
        lambda h: int(0.9 * h * h),
    ),
    "zero_optimization.stage3_param_persistence_threshold": ("10*hidden_size", lambda h: 10 * h),
}


def hf_auto_bucket(key: str, hidden_size: int) -> int:
    """What HF Trainer writes for an "auto" bucket key (`zero_optimization.<name>`) of a model of `hidden_size`."""
    return HF_AUTO_BUCKETS[key][1](hidden_size)


def resolve_hf_auto(
    ds_config: dict[str, Any],
    args: dict[str, Any],
    *,
    world_size: int | None,
    hidden_size: int | None,
    zero3: bool,
) -> AutoResolution:
    """Fill "auto" the way HF Trainer does; `args` must already be `effective_args(...)`.
    Values that need unknown facts (world size, the model's hidden size) stay "auto" and are listed."""
    cfg = copy.deepcopy(ds_config)
    res = AutoResolution(cfg)

    def fill(ds_key: str, hf_val: Any, hf_key: str, must_match: bool = True) -> None:
        node, key = _node(cfg, ds_key)
        if node is None or key not in node:
            return
        if is_auto(node[key]):
            if hf_val is None:
                res.unresolved.append(ds_key)
                return
            node[key] = hf_val
            res.filled[ds_key] = (hf_val, hf_key)
            return
        if must_match and hf_val is not None and node[key] is not None and node[key] != hf_val:
            res.mismatches.append((ds_key, node[key], hf_key, hf_val))

    mbs, gas = args["per_device_train_batch_size"], args["gradient_accumulation_steps"]
    must = not args.get("auto_find_batch_size", False)
    tbs = world_size * mbs * gas if world_size and isinstance(mbs, int) and isinstance(gas, int) else None
    fill("train_micro_batch_size_per_gpu", mbs, "per_device_train_batch_size", must)
    fill("gradient_accumulation_steps", gas, "gradient_accumulation_steps")
    fill("train_batch_size", tbs, "train_batch_size (calculated)", must)
    fill("gradient_clipping", args["max_grad_norm"], "max_grad_norm")
    fill("optimizer.params.lr", args["learning_rate"], "learning_rate")
    fill("optimizer.params.betas", [args["adam_beta1"], args["adam_beta2"]], "adam_beta1+adam_beta2")
    fill("optimizer.params.eps", args["adam_epsilon"], "adam_epsilon")
    fill("optimizer.params.weight_decay", args["weight_decay"], "weight_decay")
    fill("scheduler.params.warmup_min_lr", 0, "(constant 0)", must_match=False)
    fill("scheduler.params.warmup_max_lr", args["learning_rate"], "learning_rate")
    fill("fp16.enabled", bool(args["fp16"] or args["fp16_full_eval"]), "fp16|fp16_full_eval")
    fill("bf16.enabled", bool(args["bf16"] or args["bf16_full_eval"]), "bf16|bf16_full_eval")
    for key, (formula, value) in HF_AUTO_BUCKETS.items():
        if zero3 or key == "zero_optimization.reduce_bucket_size":
            fill(key, value(hidden_size) if hidden_size else None, formula, False)
    # total_num_steps needs the dataset size: filled at train time, never a mismatch here. warmup_num_steps is
    # max(1, args.get_warmup_steps(N)) (transformers 5.23), known before launch when warmup_steps >= 1 (that
    # value) or 0 (then 1); a fractional warmup_steps is a ratio of N and stays unknown.
    fill("scheduler.params.total_num_steps", None, "num_training_steps", False)
    ws_arg = coerce(args.get("warmup_steps", 0), float)
    warmup = None
    if isinstance(ws_arg, float | int) and not args.get("warmup_ratio"):
        warmup = max(1, int(ws_arg)) if ws_arg >= 1 or ws_arg == 0 else None
    fill("scheduler.params.warmup_num_steps", warmup, "warmup_steps", warmup is not None)
    return res


# ---------------------------------------------------------------------------------------------------------
# FSDP arguments
# ---------------------------------------------------------------------------------------------------------

FSDP_SHARDING = ("full_shard", "shard_grad_op", "no_shard", "hybrid_shard", "hybrid_shard_zero2")
"""accelerate's FSDP_SHARDING_STRATEGY (accelerate utils/constants.py), lower-cased, in ShardingStrategy order."""

HF_FSDP_DEFAULT_VERSION = 2
"""transformers 5.23 `TrainingArguments._process_fsdp_args`: `fsdp_config.get("version", 2)` (FSDP1 is
deprecated there); accelerate's own plugin defaults to 1 (`FSDP_VERSION`, utils/dataclasses.py)."""


def hf_fsdp_options(fsdp: Any, fsdp_config: Any) -> dict[str, Any] | None:
    """The FSDP plugin options HF Trainer builds from `fsdp` and `fsdp_config`, as
    `TrainingArguments._process_fsdp_args` / `_apply_legacy_fsdp_to_config` do (transformers 5.23): None when
    `fsdp` is off (empty, false, a list without items). Keys lose their `fsdp_` prefix; the legacy words map to
    `cpu_offload` ("offload") and `reshard_after_forward` (a sharding strategy); "auto_wrap" is the default
    anyway. A `fsdp_config` given as a file path is not read (None values mean: HF's defaults)."""
    if fsdp is None or fsdp is False or (isinstance(fsdp, int | float) and not fsdp):
        return None
    if isinstance(fsdp, str):
        if fsdp.strip().lower() in ("", "false", "0", "no"):
            return None
        items = [] if fsdp.strip().lower() in ("true", "1", "yes") else fsdp.split()
    elif isinstance(fsdp, list | tuple):
        items = [str(x) for x in fsdp]
        if not items:
            return None
    else:
        items = []  # fsdp: true
    raw = dict(fsdp_config) if isinstance(fsdp_config, dict) else {}
    opts = {(k[5:] if isinstance(k, str) and k.startswith("fsdp_") else k): v for k, v in raw.items()}
    for item in items:
        word = item.strip().lower()
        if word == "offload":
            opts.setdefault("cpu_offload", True)
        elif word in FSDP_SHARDING:
            opts.setdefault("reshard_after_forward", word)
    return opts
