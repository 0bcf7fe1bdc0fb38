"""Read a user file, detect which kind of training config it is, and keep positions for every key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from zerodoctor.errors import InputError
from zerodoctor.safeio import read_text
from zerodoctor.setup.deepspeed_config import DEEPSPEED_TOP_KEYS
from zerodoctor.setup.document import KINDS, ConfigDocument
from zerodoctor.setup.json_reader import parse_json
from zerodoctor.setup.python_reader import parse_python_config
from zerodoctor.setup.yaml_reader import parse_yaml

# Top-level keys that only a DeepSpeed config has: every key DeepSpeed reads, less those an HF
# TrainingArguments file can have too.
DEEPSPEED_KEYS = DEEPSPEED_TOP_KEYS - {
    "fp16",
    "bf16",
    "bfloat16",
    "gradient_accumulation_steps",
    "dataloader_drop_last",
}
# DeepSpeed keys that count only with a mapping value (DeepSpeed's `{"type": ..., "params": ...}` blocks): axolotl's
# YAML has `optimizer: adamw_torch_fused` and `lr_scheduler`-style strings under the same names, and `fp8: true` (its
# FP8 mixed-precision switch, utils/schemas/config.py) where DeepSpeed's `fp8` is a block.
DEEPSPEED_BLOCK_KEYS = {"optimizer", "scheduler", "fp8"}
# Keys only the accelerate config file has.
ACCELERATE_KEYS = {
    "compute_environment",
    "distributed_type",
    "deepspeed_config",
    "num_processes",
    "machine_rank",
    "main_training_function",
    "downcast_bf16",
    "num_machines",
    "use_cpu",
    "fsdp_config",
}
# Arguments only LLaMA-Factory has (its model/data/finetuning args). Generic names that TRL or the HF example
# scripts also use (packing, preprocessing_num_workers, overwrite_cache, lora_r...) do not count.
LLAMAFACTORY_KEYS = {
    "finetuning_type",
    "template",
    "cutoff_len",
    "lora_target",
    "quantization_bit",
    "dataset_dir",
    "quantization_method",
    "plot_loss",
}
LLAMAFACTORY_STAGES = {"pt", "sft", "rm", "ppo", "dpo", "kto", "orpo"}  # orpo: v0.6.2-v0.7.1
# TrainingArguments names a DeepSpeed config never has (gradient_accumulation_steps, fp16 and bf16 exist in
# both, so they do not decide).
HF_KEYS = {
    "output_dir",
    "per_device_train_batch_size",
    "learning_rate",
    "num_train_epochs",
    "max_steps",
    "save_strategy",
    "save_steps",
    "logging_steps",
    "deepspeed",
    "gradient_checkpointing",
    "max_grad_norm",
    "lr_scheduler_type",
    "warmup_ratio",
    "save_only_model",
    "model_name_or_path",
    "per_device_eval_batch_size",
}
MODEL_KEYS = {"model_type", "architectures", "hidden_size", "num_hidden_layers", "vocab_size", "text_config"}


def _read_text(path: Path) -> str:
    """The file's text through the one bounded input layer (size cap, special files refused, UTF-8)."""
    return read_text(path)


def detect_kind(path: Path, data: Any, text: str) -> str | None:
    if path.suffix == ".py":
        return "xtuner" if ("xtuner" in text or "mmengine" in text) else None
    if not isinstance(data, dict):
        return None
    keys = set(data)
    if keys & ACCELERATE_KEYS and (
        "distributed_type" in keys or "deepspeed_config" in keys or len(keys & ACCELERATE_KEYS) >= 2
    ):
        return "accelerate"
    if keys & LLAMAFACTORY_KEYS or (
        str(data.get("stage", "")).lower() in LLAMAFACTORY_STAGES and "finetuning_type" in keys
    ):
        return "llamafactory"
    ds_blocks = any(isinstance(data.get(k), dict) for k in ("fp16", "bf16", "bfloat16", *DEEPSPEED_BLOCK_KEYS))
    if keys & (DEEPSPEED_KEYS - DEEPSPEED_BLOCK_KEYS) or ds_blocks:
        return "deepspeed"
    if keys & HF_KEYS:
        return "hf"
    if keys & MODEL_KEYS and ("model_type" in keys or "architectures" in keys):
        return "model"
    return None


def read_document(path: str | Path, kind: str | None = None) -> ConfigDocument:
    """Parse `path`; raise InputError (file:line:col, what is wrong, what to do) on anything unreadable."""
    p = Path(path)
    text = _read_text(p)
    symbols: dict[tuple[str, ...], str] = {}
    duplicates: list[tuple[tuple[str, ...], Any]] = []
    if p.suffix == ".py":
        data, positions, symbols = parse_python_config(str(p), text)
    elif p.suffix == ".json":
        data, positions, duplicates = parse_json(str(p), text)
    elif p.suffix in (".yaml", ".yml"):
        data, positions, duplicates = parse_yaml(str(p), text)
    else:
        stripped = text.lstrip()
        if stripped.startswith("{"):
            data, positions, duplicates = parse_json(str(p), text)
        else:
            data, positions, duplicates = parse_yaml(str(p), text)
    if kind is None:
        kind = detect_kind(p, data, text)
    if kind is None:
        supported = "; ".join(f"{k}: {v}" for k, v in KINDS.items())
        raise InputError(
            str(p),
            "cannot tell what kind of config this is",
            hint=f"supported kinds are {supported}; if it is one of them, `zerodoctor lint --kind KIND` and "
            "`selftest --kind KIND` read it as that kind (plan and check detect the kind from the file's keys)",
        )
    if kind not in KINDS:
        raise InputError(str(p), f"unknown kind {kind!r}", hint=f"use one of: {', '.join(KINDS)}")
    if not isinstance(data, dict):
        raise InputError(
            str(p), f"expected a mapping of settings at the top level, found {type(data).__name__}"
        )
    return ConfigDocument(
        path=p, kind=kind, data=data, positions=positions, text=text, duplicates=duplicates, symbols=symbols
    )
