"""The rule registry: a plain dict, code -> module. Each module has `RULE` and a docstring (its docs).
Codes never change once published; add new rules at the end of their family."""

from __future__ import annotations

from types import ModuleType

from zerodoctor.lint.rules import (
    ds001_invalid_config,
    ds002_batch_size_mismatch,
    ds003_fp16_bf16_both_enabled,
    ds004_auto_without_hf,
    ds005_offload_settings,
    ds006_offload_host_memory,
    ds007_z3_save_without_gather,
    ds008_z3_gather_huge_model,
    ds009_offload_client_optimizer,
    hf001_ds_args_mismatch,
    hf002_device_map_with_zero3,
    hf003_save_only_model,
    hf004_unknown_argument,
    kb001_known_failure,
    ql001_zero3_quant_storage,
    ql002_zero3_requirements,
    xt001_max_iters,
)

RULES: dict[str, ModuleType] = {
    "DS001": ds001_invalid_config,
    "DS002": ds002_batch_size_mismatch,
    "DS003": ds003_fp16_bf16_both_enabled,
    "DS004": ds004_auto_without_hf,
    "DS005": ds005_offload_settings,
    "DS006": ds006_offload_host_memory,
    "DS007": ds007_z3_save_without_gather,
    "DS008": ds008_z3_gather_huge_model,
    "DS009": ds009_offload_client_optimizer,
    "HF001": hf001_ds_args_mismatch,
    "HF002": hf002_device_map_with_zero3,
    "HF003": hf003_save_only_model,
    "HF004": hf004_unknown_argument,
    "QL001": ql001_zero3_quant_storage,
    "QL002": ql002_zero3_requirements,
    "XT001": xt001_max_iters,
    "KB001": kb001_known_failure,
}
