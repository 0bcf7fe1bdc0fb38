"""PLAN006 ("no strategy fits") placed and worded from the plan itself: the phase is the one the closest
candidate fails in (not always the model load), and the action follows the item that dominates that phase,
named by the user's own keys.

Why: activations and logits grow with micro batch x sequence length and do not shrink with more GPUs (ZeRO
shards model states, not activations; ZeRO paper section 3), so "add GPUs" is the wrong advice when they
dominate; model states do shrink with the data-parallel degree under ZeRO-3 (deepspeed/runtime/zero/stage3.py
partitions parameters, gradients and optimizer states over the data-parallel group), or move to the host with
offload. The planner's own text (zerodoctor.plan.candidates) is kept up to its generic advice, which this
replaces.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from zerodoctor.findings import Finding, Fix

if TYPE_CHECKING:
    from zerodoctor.plan.candidates import PlanResult
    from zerodoctor.plan.phases import Item, StrategyPlan
    from zerodoctor.setup.run import Known, RunDescription

# Items that follow from the others (fixed costs, the allocator's cache) and so never decide the action.
_OVERHEAD = ("CUDA context", "NCCL buffers", "allocator reserved")
_ACTIVATIONS = ("activation", "logits")
# Parameters gathered at once (set by stage3_max_live_parameters / prefetch bucket / the largest module).
_WORKING_SET = (
    "zero-3 fetched parameters",
    "16-bit gather of the largest module",
    "offload_param: partitions staged",
)
# What ZeRO partitions over the data-parallel group.
_MODEL_STATES = (
    "model states",
    "16-bit partition",
    "adamw update",
    "full-size gradient",
    "reduce-scatter",
    "paged optimizer",
)
_PHASE_WORDS = {
    "load": "model load",
    "first_step": "first optimizer step",
    "steady": "steady step",
    "eval": "evaluation",
    "save": "save",
}
_GENERIC_TAILS = ("; the smallest per-GPU peak", "; add GPUs or nodes")


def _g(n: float) -> str:
    return f"{n / 2**30:,.1f} GiB"


def _closest(result: PlanResult) -> StrategyPlan | None:
    """The candidate that misses by the least (its worst need / capacity ratio is the smallest)."""

    def worst(s: StrategyPlan) -> float:
        return max((need / max(cap, 1) for _, _, need, cap in s.failing_phases()), default=0.0)

    pool = [s for s in result.candidates if s.failing_phases()]
    return min(pool, key=worst) if pool else None


def _named(k: Known[int], flag: str, framework_key: str | None) -> str:
    """The setting by the name the user writes it under: the file key and line, the framework's argument when
    its default applies, else zerodoctor's flag."""
    o = k.origin
    if o.kind == "file" and o.key:
        where = f"{o.file.rsplit('/', 1)[-1]}:{o.line}" if o.file and o.line else (o.file or "")
        return f"{o.key} ({k.value}{', ' + where if where else ''})"
    if o.kind == "framework" and framework_key:
        return f"{framework_key} ({k.value}, the framework's default)"
    return f"{flag} ({k.value}{', assumed' if o.kind == 'default' else ''})"


def _action(item: Item, resource: str, run: RunDescription, best: StrategyPlan) -> tuple[str, list[Fix]]:
    name = item.name.lower()
    if resource == "host":
        # every rank of a node holds its own copy or share of this item, so fewer ranks per node shrink it
        text = "add host RAM per node, or run fewer ranks per node (spread them over more nodes)"
        fixes = [Fix("Give each node more host RAM, or spread the ranks over more nodes")]
        if name.startswith(_MODEL_STATES) or "optimizer" in name or "offload" in name:
            text += ", or offload to NVMe instead of the CPU"
            fixes.append(Fix("Offload to NVMe instead of the CPU"))
        return text, fixes
    if any(w in name for w in _ACTIVATIONS):
        fw = run.files.framework
        hf_like = fw in ("hf", "llamafactory")
        mb = _named(run.micro_batch, "--micro-batch", "per_device_train_batch_size" if hf_like else None)
        seq = _named(run.seq_len, "--seq-len", "cutoff_len" if fw == "llamafactory" else None)
        text = f"they grow with micro batch x sequence length and do not shrink with more GPUs: lower {mb} or {seq}"
        fixes = [
            Fix(f"Lower {mb}; raise gradient accumulation to keep the global batch"),
            Fix(f"Shorten {seq}"),
        ]
        if not run.gradient_checkpointing.value:
            text += ", or turn gradient checkpointing on"
            fixes.append(Fix("Turn gradient checkpointing on"))
        return text, fixes
    if name.startswith(_WORKING_SET):
        text = (
            "the parameters ZeRO-3 gathers at once do not shrink with more GPUs: lower "
            "stage3_max_live_parameters and stage3_prefetch_bucket_size in the DeepSpeed config, or use GPUs with "
            "more memory"
        )
        return text, [
            Fix("Lower stage3_max_live_parameters and stage3_prefetch_bucket_size"),
            Fix("Use larger GPUs"),
        ]
    if name.startswith(_MODEL_STATES):
        offloaded = best.zero.offload_optimizer != "none" and best.zero.offload_param != "none"
        text = "ZeRO-3 spreads model states over every GPU: add GPUs or nodes" + (
            "" if offloaded else ", or offload the optimizer and parameters to the CPU"
        )
        fixes = [Fix("Add GPUs or nodes (ZeRO-3 shards model states over all of them)")]
        return text, fixes if offloaded else [*fixes, Fix("Offload the optimizer and parameters to the CPU")]
    text = "more GPUs do not shrink it: use GPUs with more memory or remove what it comes from"
    return text, [Fix(f"Reduce {item.name}, or use GPUs with more memory")]


def reword_nothing_fits(f: Finding, result: PlanResult, run: RunDescription) -> Finding:
    """PLAN006 with the phase and action of the closest candidate's worst miss; other findings unchanged."""
    if f.id != "PLAN006":
        return f
    best = _closest(result)
    if best is None:
        return f
    phase_name, resource, need, cap = max(best.failing_phases(), key=lambda x: x[2] / max(x[3], 1))
    phase = next(p for p in best.phases if p.name == phase_name)
    items = phase.gpu if resource == "gpu" else phase.host
    real = [i for i in items if not i.name.startswith(_OVERHEAD)] or list(items)
    top = max(real, key=lambda i: i.bytes)
    action, fixes = _action(top, resource, run, best)
    head = f.message
    for tail in _GENERIC_TAILS:
        head = head.split(tail)[0]
    where = (
        f"{'per GPU' if resource == 'gpu' else 'per node'} at the {_PHASE_WORDS.get(phase_name, phase_name)}"
    )
    message = (
        f"{head}; the closest, {best.name}, needs {_g(need)} {where} against {_g(cap)}, "
        f"{_g(top.bytes)} of it {top.name}: {action}"
    )
    evidence = f.evidence
    if any(w in top.name.lower() for w in _ACTIVATIONS) and resource == "gpu":
        # point at the user's line that sets the micro batch (then the sequence length), when the file says it
        located = [k.origin.evidence() for k in (run.micro_batch, run.seq_len) if k.origin.kind == "file"]
        evidence = (*located, *f.evidence)
    return replace(
        f,
        message=message,
        fixes=tuple(fixes),
        evidence=evidence,
        data={**f.data, "phase": phase_name, "dominant": top.name, "resource": resource},
    )
