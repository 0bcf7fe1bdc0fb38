"""Small helpers shared by rules (no judgement lives here)."""

from __future__ import annotations

from typing import Any

from zerodoctor.facts import as_number, is_auto, truthy
from zerodoctor.setup.model import TrainingSetup

__all__ = ["as_number", "is_auto", "truthy"]  # re-exported for the rules

# Keys whose "auto" HF Trainer / accelerate fill (transformers integrations/deepspeed.py
# trainer_config_process + trainer_config_finalize; accelerate prepare_deepspeed uses the same set).
HF_FILLABLE_AUTO = {
    "train_micro_batch_size_per_gpu",
    "gradient_accumulation_steps",
    "train_batch_size",
    "gradient_clipping",
    "optimizer.params.lr",
    "optimizer.params.betas",
    "optimizer.params.eps",
    "optimizer.params.weight_decay",
    "scheduler.params.warmup_min_lr",
    "scheduler.params.warmup_max_lr",
    "scheduler.params.total_num_steps",
    "scheduler.params.warmup_num_steps",
    "fp16.enabled",
    "bf16.enabled",
    "zero_optimization.reduce_bucket_size",
    "zero_optimization.stage3_prefetch_bucket_size",
    "zero_optimization.stage3_param_persistence_threshold",
}


# `xtuner train` fills only these (xtuner/tools/train.py; docs/framework-facts.md d.2).
XTUNER_FILLABLE_AUTO = {
    "gradient_accumulation_steps",
    "train_micro_batch_size_per_gpu",
    "gradient_clipping",
    "fp16.enabled",
    "bf16.enabled",
}


def fillable_auto_keys(framework: str | None) -> set[str] | None:
    """The "auto" keys the framework fills; None when the framework is unknown."""
    if framework in ("hf", "llamafactory", "accelerate"):
        return HF_FILLABLE_AUTO
    if framework == "xtuner":
        return XTUNER_FILLABLE_AUTO
    if framework == "deepspeed":
        return set()
    return None


def auto_keys(node: Any, prefix: str = "") -> list[str]:
    out: list[str] = []
    if isinstance(node, dict):
        for k, v in node.items():
            out += auto_keys(v, f"{prefix}{k}.")
    elif is_auto(node):
        out.append(prefix.rstrip("."))
    return out


def offload_device(setup: TrainingSetup, part: str) -> str:
    """ "none" | "cpu" | "nvme" for part in ("optimizer", "param"), or "invalid" for anything DeepSpeed's enum
    rejects ("CPU", null, a typo): DS001 reports those, the other rules then stay out of it."""
    value = setup.ds_flat().get(f"zero_optimization.offload_{part}.device", "none")
    return value if value in ("none", "cpu", "nvme") else "invalid"


def node_count(setup: TrainingSetup) -> int | None:
    """Nodes of the job: --nodes, or world size / GPUs per node (--gpus-per-node, else the snapshot's GPUs)."""
    if setup.num_nodes:
        return setup.num_nodes
    per_node = setup.gpus_per_node or setup.facts().get("env.gpu_count")
    if setup.world_size and per_node:
        return max(1, setup.world_size // int(per_node))
    return None


def offloaded_host_bytes_per_node(setup: TrainingSetup) -> tuple[float, float, int] | None:
    """(bytes, bytes per parameter, nodes) of offloaded model states on each node's host after the first
    optimizer step, for a full fine-tune of a known model, from the planner's model-state accounting
    (`zerodoctor.plan.model_states`, measured against DeepSpeed) with pinned blocks rounded as PyTorch rounds
    them; None when it cannot be known (model, nodes, world size) or nothing is offloaded to the host."""
    if setup.total_params is None or setup.method not in ("full", None) or not setup.zero_stage:
        return None
    nodes = node_count(setup)
    if nodes is None:
        return None
    per_node = setup.gpus_per_node or setup.facts().get("env.gpu_count")
    world = setup.world_size or (nodes * int(per_node) if per_node else None)
    # The node's share is about the same however many ranks share it; without the rank count the
    # per-rank pinned blocks (and so their rounding) are unknown, so they are counted as requested.
    exact_ranks = world is not None
    world = world or nodes
    opt, param = offload_device(setup, "optimizer"), offload_device(setup, "param")
    if "cpu" not in (opt, param):
        return None
    from zerodoctor.plan.model_states import model_state_components, totals  # light: no torch

    flat = setup.ds_flat()
    pins = [truthy(flat.get(f"zero_optimization.offload_{p}.pin_memory")) for p in ("optimizer", "param")]
    components = model_state_components(
        trainable=setup.total_params,
        frozen=0,
        stage=setup.zero_stage,
        world_size=world,
        offload_optimizer=opt if opt in ("cpu", "nvme") else "none",
        offload_param=param if param in ("cpu", "nvme") else "none",
        pin_memory=any(p is True for p in pins),
        deepspeed_version=setup.package_version("deepspeed"),
    )
    t = totals(components, after_first_step=True)
    per_rank = t["host"] - t["host_pinned"] + t["host_pinned_rounded"] if exact_ranks else t["host"]
    if per_rank <= 0:
        return None
    need = per_rank * world / nodes
    return need, t["host"] * world / setup.total_params, nodes


def is_hf_trainer_peft(setup: TrainingSetup) -> bool:
    """LoRA/QLoRA through HF Trainer (HF, LLaMA-Factory): under ZeRO-3 Trainer.save_model gathers only the
    trainable adapter weights (`_zero3_consolidated_16bit_state_dict(exclude_frozen_parameters=True)`,
    transformers 5.23 trainer.py), whatever stage3_gather_16bit_weights_on_model_save says."""
    return setup.framework in ("hf", "llamafactory") and setup.method in ("lora", "qlora")


def gib(nbytes: float) -> str:
    return f"{nbytes / 2**30:,.1f} GiB"
