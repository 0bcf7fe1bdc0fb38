"""Small helpers shared by rules (no judgement lives here)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from zerodoctor.facts import as_number, is_auto, truthy
from zerodoctor.setup.model import TrainingSetup
from zerodoctor.setup.run import RunDescription

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


def given_cluster(run: RunDescription) -> tuple[int | None, int | None]:
    """(nodes, world size) as the user or the environment gave them; zerodoctor's own assumptions (one node)
    are not facts a rule may judge by (a 48-GPU job assumed to be 8 would be a false alarm)."""
    c = run.cluster
    nodes = c.nodes.value if c.nodes is not None and c.nodes.origin.kind != "default" else None
    world = c.world_size.value if c.world_size is not None and c.world_size.origin.kind != "default" else None
    if nodes is None and world is not None and c.gpus_per_node is not None:
        nodes = max(1, world // c.gpus_per_node.value)
    if world is None and nodes is not None and c.gpus_per_node is not None:
        world = nodes * c.gpus_per_node.value
    return nodes, world


def offloaded_host_bytes_per_node(run: RunDescription) -> tuple[float, float, int] | None:
    """(bytes, bytes per parameter, nodes) of offloaded model states on each node's host after the first
    optimizer step, for a full fine-tune of a known model, from the planner's model-state accounting
    (`zerodoctor.plan.model_states`, measured against DeepSpeed) with pinned blocks rounded as PyTorch rounds
    them; None when it cannot be known (model, nodes, world size) or nothing is offloaded to the host.
    Offload devices and pinning are the run description's (the planner reads the same values)."""
    z = run.zero
    if run.model is None or run.method.value != "full" or z is None or not z.stage.value:
        return None
    total = int(run.model.params.total)
    nodes, world = given_cluster(run)
    if nodes is None:
        return None
    # The node's share is about the same however many ranks share it; without the rank count the
    # per-rank pinned blocks (and so their rounding) are unknown, so they are counted as requested.
    exact_ranks = world is not None
    world = world or nodes
    opt, param = z.offload_optimizer.value, z.offload_param.value
    if "cpu" not in (opt, param):
        return None
    from zerodoctor.plan.model_states import model_state_components, totals  # light: no torch

    components = model_state_components(
        trainable=total,
        frozen=0,
        stage=z.stage.value,
        world_size=world,
        offload_optimizer=opt,
        offload_param=param,
        pin_memory=z.pin_memory.value,
        deepspeed_version=run.deepspeed_version,
    )
    t = totals(components, after_first_step=True)
    per_rank = t["host"] - t["host_pinned"] + t["host_pinned_rounded"] if exact_ranks else t["host"]
    if per_rank <= 0:
        return None
    need = per_rank * world / nodes
    return need, t["host"] * world / total, nodes


GATHER_BYTES_PER_PARAM = 2  # the 16-bit gather at save: every parameter in bf16/fp16 on rank 0's host
HOST_HEADROOM = 0.8  # a host is "full" above 80 % of its RAM (the OS, page cache, the job's other processes)


@dataclass(frozen=True)
class SaveGather:
    """The 16-bit gather at save on node 0's host: `spike` bytes on top of `held` offloaded bytes, against
    `ram` (None: unknown). `fits` is None when the host RAM is unknown."""

    spike: float
    held: float
    ram: float | None

    @property
    def fits(self) -> bool | None:
        return None if not self.ram else self.spike + self.held <= HOST_HEADROOM * self.ram


def save_gather(run: RunDescription) -> SaveGather | None:
    """What gathering the full 16-bit model at save costs node 0 (DS007 and DS008 judge by the same numbers);
    None when the model is unknown."""
    if run.model is None:
        return None
    share = offloaded_host_bytes_per_node(run)
    ram = run.cluster.host_ram_bytes.value if run.cluster.host_ram_bytes is not None else None
    return SaveGather(
        spike=float(run.model.params.total * GATHER_BYTES_PER_PARAM),
        held=share[0] if share else 0.0,
        ram=float(ram) if ram else None,
    )


def is_hf_trainer_peft(setup: TrainingSetup) -> bool:
    """LoRA/QLoRA through HF Trainer (HF, LLaMA-Factory): what its ZeRO-3 save gathers depends on the transformers
    version (`trainer_peft_save`)."""
    return setup.framework in ("hf", "llamafactory") and setup.method in ("lora", "qlora")


def trainer_peft_save(run: RunDescription) -> str | None:
    """How HF Trainer saves this LoRA/QLoRA run under ZeRO-3 (plan/host_save.py): "adapters" from transformers 5.0
    (`_zero3_consolidated_16bit_state_dict(exclude_frozen_parameters=True)`, whatever
    stage3_gather_16bit_weights_on_model_save says); "whole model" for 4.x or an unknown version (the whole 16-bit
    model gathered to rank 0's host, or with the gather off an EMPTY adapter file); None when not such a run."""
    from zerodoctor.plan.host_save import peft_z3_save_gathers_adapters_only

    if not is_hf_trainer_peft(run.files):
        return None
    version = run.env.version_of("transformers") if run.env is not None else None
    return "adapters" if peft_z3_save_gathers_adapters_only(version) else "whole model"


def transformers_shown(run: RunDescription) -> str:
    """The training nodes' transformers as a user reads it: "transformers 4.57.6", or that it is unknown and how to
    give it."""
    version = run.env.version_of("transformers") if run.env is not None else None
    if version:
        return f"transformers {version}"
    return "an unknown transformers version (pass --env from the training nodes: `zerodoctor env`)"


def gib(nbytes: float) -> str:
    return f"{nbytes / 2**30:,.1f} GiB"
