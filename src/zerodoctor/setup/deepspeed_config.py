"""DeepSpeed config knowledge that lint needs without importing DeepSpeed: key aliases, code defaults, and
the config accelerate builds from its YAML.

Defaults are DeepSpeed 0.19.8's pydantic models (`runtime/zero/config.py`, `runtime/zero/offload_config.py`,
`runtime/config.py`); tests/setup/test_deepspeed_defaults.py compares them with the installed DeepSpeed.
"""

from __future__ import annotations

from typing import Any

from zerodoctor.versions import parse_version

# DeepSpeedZeroConfig field -> the spellings it accepts (pydantic aliases and deprecated names).
# We canonicalise to the `stage3_*` spelling that configs in the wild (and HF's docs) use.
ZERO_ALIASES: dict[str, str] = {
    "prefetch_bucket_size": "stage3_prefetch_bucket_size",
    "param_persistence_threshold": "stage3_param_persistence_threshold",
    "model_persistence_threshold": "stage3_model_persistence_threshold",
    "max_live_parameters": "stage3_max_live_parameters",
    "max_reuse_distance": "stage3_max_reuse_distance",
    "gather_16bit_weights_on_model_save": "stage3_gather_16bit_weights_on_model_save",
    "stage3_gather_fp16_weights_on_model_save": "stage3_gather_16bit_weights_on_model_save",
}
TOP_ALIASES: dict[str, str] = {"bfloat16": "bf16"}

# Top-level keys DeepSpeed reads (docs/_pages/config-json.md and runtime/constants.py). Others are ignored,
# so only near-misses of these are reported (an unrelated extra key is harmless).
DEEPSPEED_TOP_KEYS = {
    "train_batch_size",
    "train_micro_batch_size_per_gpu",
    "gradient_accumulation_steps",
    "optimizer",
    "scheduler",
    "communication_data_type",
    "prescale_gradients",
    "gradient_predivide_factor",
    "sparse_gradients",
    "fp16",
    "bf16",
    "bfloat16",
    "amp",
    "gradient_clipping",
    "zero_optimization",
    "zero_allow_untested_optimizer",
    "zero_force_ds_cpu_optimizer",
    "steps_per_print",
    "wall_clock_breakdown",
    "dump_state",
    "activation_checkpointing",
    "flops_profiler",
    "tensorboard",
    "wandb",
    "csv_monitor",
    "comms_logger",
    "aio",
    "checkpoint",
    "data_types",
    "elasticity",
    "autotuning",
    "compression_training",
    "data_efficiency",
    "curriculum_learning",
    "sparse_attention",
    "pipeline",
    "memory_breakdown",
    "torch_autocast",
    "compile",
    "timers",
    "tensor_parallel",
    "sequence_parallel_size",
    "hybrid_engine",
    "weight_quantization",
    "nebula",
    "dataloader_drop_last",
    "disable_allgather",
    "seq_parallel_communication_data_type",
    "gradient_allreduce_op",
    "eigenvalue",
    "quantize_training",
    "progressive_layer_drop",
    "fp8",
}

# Code defaults that decide behaviour (DeepSpeed 0.19.8). Dotted keys of the canonical spelling.
DS_DEFAULTS: dict[str, Any] = {
    "zero_optimization.stage": 0,
    "zero_optimization.offload_optimizer.device": "none",
    "zero_optimization.offload_param.device": "none",
    "zero_optimization.stage3_gather_16bit_weights_on_model_save": False,
    "zero_optimization.sub_group_size": 1_000_000_000,
    "zero_optimization.reduce_bucket_size": 500_000_000,
    "zero_optimization.allgather_bucket_size": 500_000_000,
    "zero_optimization.stage3_prefetch_bucket_size": 50_000_000,
    "zero_optimization.stage3_param_persistence_threshold": 100_000,
    "zero_optimization.stage3_max_live_parameters": 1_000_000_000,
    "zero_optimization.stage3_max_reuse_distance": 1_000_000_000,
    "zero_optimization.contiguous_gradients": True,
    "gradient_clipping": 0.0,
    "fp16.enabled": False,
    "bf16.enabled": False,
    "zero_force_ds_cpu_optimizer": True,
    "zero_allow_untested_optimizer": False,
}


def pin_memory_default(deepspeed_version: str | None) -> bool | None:
    """`offload_*.pin_memory` default: True in 0.19.8 (installed source; DeepSpeed PR #8207), False in 0.16.x
    (DeepSpeed 0.16.x runtime/zero/offload_config.py). For releases in between we do not know, so None."""
    v = parse_version(deepspeed_version)
    if v is None:
        return None
    if v >= parse_version("0.19.8"):  # type: ignore[operator]
        return True
    if v < parse_version("0.17.0"):  # type: ignore[operator]
        return False
    return None


def canonical(config: dict[str, Any]) -> dict[str, Any]:
    """A copy with alias spellings renamed to the canonical ones (the last spelling wins, as in DeepSpeed)."""
    out: dict[str, Any] = {}
    for k, v in config.items():
        out[TOP_ALIASES.get(k, k)] = v
    zero = out.get("zero_optimization")
    if isinstance(zero, dict):
        z: dict[str, Any] = {}
        for zk, v in zero.items():
            z[ZERO_ALIASES.get(str(zk), str(zk))] = v
        # Legacy ZeRO-Offload switches (DeepSpeedZeroConfig validators): "cpu_offload": true means
        # offload_optimizer to cpu, "cpu_offload_param": true means offload_param to cpu.
        if z.get("cpu_offload") is True and "offload_optimizer" not in z:
            z["offload_optimizer"] = {"device": "cpu"}
        if z.get("cpu_offload_param") is True and "offload_param" not in z:
            z["offload_param"] = {"device": "cpu"}
        out["zero_optimization"] = z
    return out


def spelled(config: dict[str, Any], canonical_key: str) -> str:
    """The dotted key as the user spelled it, so findings point at the key in their file."""
    parts: list[str] = canonical_key.split(".")
    if parts[0] == "bf16" and "bf16" not in config and "bfloat16" in config:
        parts[0] = "bfloat16"
    if (
        parts[0] == "zero_optimization"
        and len(parts) > 1
        and isinstance(config.get("zero_optimization"), dict)
    ):
        zero = config["zero_optimization"]
        if parts[1] not in zero:
            for alias, canon in ZERO_ALIASES.items():
                if canon == parts[1] and alias in zero:
                    parts[1] = alias
                    break
    return ".".join(parts)


def flatten(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in config.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def with_defaults(config: dict[str, Any], deepspeed_version: str | None = None) -> dict[str, Any]:
    """Flattened canonical config with DeepSpeed's defaults for decision-relevant keys that are absent."""
    flat = flatten(canonical(config))
    for k, v in DS_DEFAULTS.items():
        flat.setdefault(k, v)
    pin = pin_memory_default(deepspeed_version)
    for part in ("offload_optimizer", "offload_param"):
        key = f"zero_optimization.{part}.pin_memory"
        if key not in flat and pin is not None:
            flat[key] = pin
    return flat


# accelerate's `deepspeed_config:` YAML section -> DeepSpeed config keys (accelerate 1.15.0,
# utils/dataclasses.py DeepSpeedPlugin.__post_init__, "plugin_to_config_mapping").
ACCELERATE_TO_DS: dict[str, str] = {
    "gradient_accumulation_steps": "gradient_accumulation_steps",
    "gradient_clipping": "gradient_clipping",
    "zero_stage": "zero_optimization.stage",
    "offload_optimizer_device": "zero_optimization.offload_optimizer.device",
    "offload_param_device": "zero_optimization.offload_param.device",
    "offload_param_nvme_path": "zero_optimization.offload_param.nvme_path",
    "offload_optimizer_nvme_path": "zero_optimization.offload_optimizer.nvme_path",
    "zero3_save_16bit_model": "zero_optimization.stage3_gather_16bit_weights_on_model_save",
}


def accelerate_plugin_config(section: dict[str, Any], mixed_precision: str | None) -> dict[str, Any]:
    """The DeepSpeed config DeepSpeedPlugin builds when the YAML names no deepspeed_config_file:
    batch sizes "auto", gradient_accumulation_steps and gradient_clipping "auto" unless given, ZeRO stage 2
    unless given, offload devices "none" unless given; then `set_mixed_precision` adds fp16/bf16 blocks."""
    gas = section.get("gradient_accumulation_steps", "auto")
    clip = section.get("gradient_clipping", "auto")
    cfg: dict[str, Any] = {
        "train_batch_size": "auto",
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": gas,
        "zero_optimization": {
            "stage": section.get("zero_stage", 2),
            "offload_optimizer": {"device": section.get("offload_optimizer_device", "none") or "none"},
            "offload_param": {"device": section.get("offload_param_device", "none") or "none"},
            "stage3_gather_16bit_weights_on_model_save": bool(section.get("zero3_save_16bit_model", False)),
        },
    }
    # accelerate sets nvme_path only for an nvme device
    for part in ("optimizer", "param"):
        block = cfg["zero_optimization"][f"offload_{part}"]
        if block["device"] == "nvme" and section.get(f"offload_{part}_nvme_path"):
            block["nvme_path"] = section[f"offload_{part}_nvme_path"]
    if clip:
        cfg["gradient_clipping"] = clip
    apply_mixed_precision(cfg, mixed_precision)
    return cfg


def apply_mixed_precision(cfg: dict[str, Any], mixed_precision: str | None) -> None:
    """accelerate `DeepSpeedPlugin.set_mixed_precision`: adds `{"enabled": true}` blocks when absent and fills
    "auto" in existing ones."""
    # a YAML `mixed_precision: 5` or `true` is not a precision accelerate knows: treated as "no" (DS001/DS003
    # judge the written blocks)
    mp = mixed_precision.lower() if isinstance(mixed_precision, str) else "no"
    if mp == "fp16" and "fp16" not in cfg:
        cfg["fp16"] = {"enabled": True, "auto_cast": True}
    elif mp in ("bf16", "fp8") and "bf16" not in cfg:
        cfg["bf16"] = {"enabled": True}
    for dtype, on in (("fp16", mp == "fp16"), ("bf16", mp in ("bf16", "fp8"))):
        block = cfg.get(dtype)
        if (
            isinstance(block, dict)
            and isinstance(block.get("enabled"), str)
            and block["enabled"].lower() == "auto"
        ):
            block["enabled"] = on
