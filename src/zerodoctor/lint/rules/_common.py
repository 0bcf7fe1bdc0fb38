"""Small helpers shared by rules (no judgement lives here)."""

from __future__ import annotations

from typing import Any

from zerodoctor.setup.model import TrainingSetup

# Keys whose "auto" HF Trainer / accelerate fill (transformers integrations/deepspeed.py
# trainer_config_process + trainer_config_finalize; accelerate prepare_deepspeed uses the same set).
HF_FILLABLE_AUTO = {
    "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "train_batch_size", "gradient_clipping",
    "optimizer.params.lr", "optimizer.params.betas", "optimizer.params.eps", "optimizer.params.weight_decay",
    "scheduler.params.warmup_min_lr", "scheduler.params.warmup_max_lr", "scheduler.params.total_num_steps",
    "scheduler.params.warmup_num_steps", "fp16.enabled", "bf16.enabled", "zero_optimization.reduce_bucket_size",
    "zero_optimization.stage3_prefetch_bucket_size", "zero_optimization.stage3_param_persistence_threshold",
}


# `xtuner train` fills only these (xtuner/tools/train.py; docs/framework-facts.md d.2).
XTUNER_FILLABLE_AUTO = {"gradient_accumulation_steps", "train_micro_batch_size_per_gpu", "gradient_clipping",
                        "fp16.enabled", "bf16.enabled"}


def fillable_auto_keys(framework: str | None) -> set[str] | None:
    """The "auto" keys the framework fills; None when the framework is unknown."""
    if framework in ("hf", "llamafactory", "accelerate"):
        return HF_FILLABLE_AUTO
    if framework == "xtuner":
        return XTUNER_FILLABLE_AUTO
    if framework == "deepspeed":
        return set()
    return None


def is_auto(value: Any) -> bool:
    return isinstance(value, str) and value.strip().lower() == "auto"


def auto_keys(node: Any, prefix: str = "") -> list[str]:
    out: list[str] = []
    if isinstance(node, dict):
        for k, v in node.items():
            out += auto_keys(v, f"{prefix}{k}.")
    elif is_auto(node):
        out.append(prefix.rstrip("."))
    return out


def offload_device(setup: TrainingSetup, part: str) -> str:
    """"none" | "cpu" | "nvme" (effective, lower-case) for part in ("optimizer", "param")."""
    value = setup.ds_flat().get(f"zero_optimization.offload_{part}.device", "none")
    return str(value).strip().lower() if value is not None else "none"


def as_number(value: Any) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def truthy(value: Any) -> bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        low = value.strip().lower()
        if low in ("true", "yes", "1", "on"):
            return True
        if low in ("false", "no", "0", "off"):
            return False
        return None
    if isinstance(value, int | float):
        return value != 0
    return None


def gib(nbytes: float) -> str:
    return f"{nbytes / 2**30:,.1f} GiB"
