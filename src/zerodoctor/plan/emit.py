"""Write a ready DeepSpeed config for a planned strategy.

With an HF-family launcher (HF Trainer, LLaMA-Factory, accelerate) the keys HF Trainer fills stay "auto"
(`lint/rules/_common.HF_FILLABLE_AUTO`: batch sizes, clipping, precision, the hidden-size bucket values),
so the config cannot disagree with the training arguments. For XTuner or plain DeepSpeed every value is
concrete. `train_batch_size` is left out for concrete configs: DeepSpeed derives it from micro batch x
grad accumulation x data-parallel size (a world size filled in as 1 breaks DeepSpeed's batch-size assertion on the real cluster).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from zerodoctor.errors import PlanError
from zerodoctor.plan.inputs import PlanInputs
from zerodoctor.plan.phases import StrategyPlan

NVME_PATH_PLACEHOLDER = "/local_nvme"
"""Written for NVMe offload: replace with a local NVMe mount (DeepSpeed needs a real path per node)."""
PLACEHOLDER_LR = 1e-5
"""The learning rate of an optimizer block zerodoctor has to add (no user config names one): a placeholder the
output says to replace, never presented as the user's value."""
# Blocks the memory plan does not decide: the user's own, carried over exactly as written.
_CARRIED = ("optimizer", "scheduler")


def ds_config(inputs: PlanInputs, plan: StrategyPlan, user: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The DeepSpeed config dict for `plan` (see the module docstring for "auto" vs concrete). `user` is the
    user's DeepSpeed config as written: its optimizer and scheduler blocks are kept."""
    z = plan.zero
    if z.fsdp is not None:
        raise PlanError(
            f"{plan.name} is a torch FSDP strategy, not a DeepSpeed one: there is no DeepSpeed config to write",
            hint="set it in the accelerate config (distributed_type: FSDP, fsdp_offload_params) or pick a ZeRO "
            "strategy",
        )
    t = plan.training
    hf = inputs.framework in ("hf", "llamafactory", "accelerate") or inputs.framework is None
    xtuner = inputs.framework == "xtuner"

    def auto(value: Any) -> Any:
        return "auto" if hf else value

    cfg: dict[str, Any] = {}
    if hf:
        cfg["train_batch_size"] = "auto"
    cfg["train_micro_batch_size_per_gpu"] = "auto" if hf or xtuner else t.micro_batch
    cfg["gradient_accumulation_steps"] = "auto" if hf or xtuner else t.grad_accum
    cfg["gradient_clipping"] = "auto" if hf or xtuner else 1.0
    if t.precision == "bf16":
        cfg["bf16"] = {"enabled": auto(True)}
    elif t.precision == "fp16":
        cfg["fp16"] = {"enabled": auto(True), "loss_scale": 0, "initial_scale_power": 16}
    zero: dict[str, Any] = {"stage": z.stage}
    for part, device in (("offload_optimizer", z.offload_optimizer), ("offload_param", z.offload_param)):
        if device == "none" or (part == "offload_param" and z.stage != 3):
            continue
        block: dict[str, Any] = {"device": device, "pin_memory": z.pin_memory}
        if device == "nvme":
            block["nvme_path"] = NVME_PATH_PLACEHOLDER
        zero[part] = block
    zero["overlap_comm"] = z.overlap
    zero["contiguous_gradients"] = True
    zero["reduce_bucket_size"] = "auto" if hf else z.reduce_bucket_size
    if z.stage == 3:
        zero["sub_group_size"] = z.sub_group_size
        zero["stage3_prefetch_bucket_size"] = "auto" if hf else z.prefetch_bucket_size
        zero["stage3_param_persistence_threshold"] = "auto" if hf else z.param_persistence_threshold
        zero["stage3_max_live_parameters"] = z.max_live_parameters
        zero["stage3_max_reuse_distance"] = z.max_reuse_distance
        zero["stage3_gather_16bit_weights_on_model_save"] = z.gather_16bit_on_save
    else:
        zero["allgather_bucket_size"] = z.allgather_bucket_size
    cfg["zero_optimization"] = zero
    for key in _CARRIED:
        if user is not None and isinstance(user.get(key), dict):
            cfg[key] = copy.deepcopy(dict(user[key]))
    if "optimizer" not in cfg and z.offload_optimizer != "none" and not hf:
        # Without HF/accelerate nobody swaps a torch optimizer for DeepSpeedCPUAdam: name it here
        # (ZeRORuntimeException "client provided optimizer", `zerodoctor kb zero-offload-client-optimizer`).
        cfg["optimizer"] = {"type": "AdamW", "params": {"lr": PLACEHOLDER_LR, "weight_decay": 0.0}}
    return cfg


def emitted_notes(cfg: Mapping[str, Any], user: Mapping[str, Any] | None) -> list[str]:
    """What in an emitted config is not the user's and must be checked before use."""
    notes: list[str] = []
    if "optimizer" in cfg and not (user is not None and isinstance(user.get("optimizer"), dict)):
        notes.append(
            f"optimizer: AdamW with lr {PLACEHOLDER_LR:g} and weight_decay 0.0 is a placeholder (optimizer offload "
            "under plain DeepSpeed needs DeepSpeed's own optimizer and no config given names one): set your "
            "learning rate and weight decay, or pass DeepSpeedCPUAdam to deepspeed.initialize"
        )
    zero = cfg.get("zero_optimization") or {}
    if any(isinstance(zero.get(k), dict) and zero[k].get("nvme_path") == NVME_PATH_PLACEHOLDER for k in _OFFLOADS):
        notes.append(f"nvme_path {NVME_PATH_PLACEHOLDER} is a placeholder: set a local NVMe mount on every node")
    return notes


_OFFLOADS = ("offload_optimizer", "offload_param")


def write_ds_config(
    path: str | Path, inputs: PlanInputs, plan: StrategyPlan, user: Mapping[str, Any] | None = None
) -> tuple[Path, list[str]]:
    """Write the config and say what in it is a placeholder; never overwrites an existing file (PlanError
    instead). A path ending in "/" or naming a directory gets `ds_config.json` inside it
    (`zerodoctor.safeio.output_path`)."""
    from zerodoctor.errors import InputError
    from zerodoctor.safeio import output_path, write_new

    cfg = ds_config(inputs, plan, user)
    text = json.dumps(cfg, indent=2) + "\n"
    try:
        return write_new(output_path(path, "ds_config.json"), text), emitted_notes(cfg, user)
    except InputError as err:
        raise PlanError(err.message, hint=err.hint or "pass a new file name to --emit-ds-config") from None
