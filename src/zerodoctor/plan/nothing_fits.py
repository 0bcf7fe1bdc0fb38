"""What to tell a user when no strategy fits (PLAN006, and PLAN001's action then): the phase the closest
candidate fails in, by how much, the item that dominates there, and the one or two changes that would make THIS
run fit -- each found by planning the run again with the change (a smaller micro batch, a shorter sequence,
more nodes, fewer ranks per node, a smaller evaluation batch), named by the user's own keys and values.

`zerodoctor plan` and `zerodoctor check` both answer from here (check's `zerodoctor.check.nothing_fits` is this
module's entry point under its old name).

Why the action follows the dominant item: activations and logits grow with micro batch x sequence length and do
not shrink with more GPUs (ZeRO shards model states, not activations; ZeRO paper section 3), so "add GPUs" is the
wrong advice when they dominate; model states do shrink with the data-parallel degree under ZeRO-3
(deepspeed/runtime/zero/stage3.py partitions parameters, gradients and optimizer states over the data-parallel
group), or move to the host with offload. The parameters ZeRO-3 gathers at once (stage3_max_live_parameters,
the prefetch bucket, the largest module) shrink with neither.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from itertools import islice
from typing import TYPE_CHECKING

from zerodoctor.findings import Evidence, Finding, Fix, Severity

if TYPE_CHECKING:
    from zerodoctor.plan.candidates import PlanResult
    from zerodoctor.plan.inputs import PlanInputs
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
PHASE_WORDS = {
    "load": "model load",
    "first_step": "first optimizer step",
    "steady": "steady step",
    "eval": "evaluation",
    "save": "save",
}
SEQ_STEP = 128
"""Sequence lengths are tried in multiples of this (a cutoff users write; kernels pad to 64/128 anyway)."""
MAX_NODES = 128
"""The largest cluster tried when more GPUs are the answer; beyond it the advice is qualitative."""


def _g(n: float) -> str:
    return f"{n / 2**30:,.1f} GiB"


def closest(candidates: tuple[StrategyPlan, ...] | list[StrategyPlan]) -> StrategyPlan | None:
    """The candidate that misses by the least (its worst need / capacity ratio is the smallest)."""
    pool = [s for s in candidates if s.failing_phases()]
    return min(pool, key=_worst_ratio) if pool else None


def _worst_ratio(s: StrategyPlan) -> float:
    return max((need / max(cap, 1) for _, _, need, cap in s.failing_phases()), default=0.0)


# --------------------------------------------------------------------------------------------------
# The user's names for the settings a change touches
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Names:
    """How the user writes each setting a change names: `per_device_train_batch_size (64, run.yaml:41)`."""

    micro_batch: str
    grad_accum: str
    seq_len: str
    eval_batch: str
    evidence: tuple[Evidence, ...] = ()
    """Where the micro batch, then the sequence length, are set in the user's files (when they are)."""


def _named(k: Known[int] | None, value: int, flag: str, framework_key: str | None) -> str:
    """The setting by the name the user writes it under: the file key and line, the framework's argument when
    its default applies, else zerodoctor's flag."""
    if k is None:
        return f"{framework_key or flag} ({value})"
    o = k.origin
    if o.kind == "file" and o.key:
        where = f"{o.file.rsplit('/', 1)[-1]}:{o.line}" if o.file and o.line else (o.file or "")
        return f"{o.key} ({k.value}{', ' + where if where else ''})"
    if o.kind == "framework" and framework_key:
        return f"{framework_key} ({k.value}, the framework's default)"
    return f"{flag} ({k.value}{', assumed' if o.kind == 'default' else ''})"


def names_for(inputs: PlanInputs, run: RunDescription | None = None) -> Names:
    """The names of the run's batch and length settings; zerodoctor's flags when no run description is known."""
    run = run if run is not None else inputs.run
    t = inputs.training
    fw = run.files.framework if run is not None else inputs.framework
    hf_like = fw in ("hf", "llamafactory")
    if run is None:
        return Names(
            micro_batch=f"--micro-batch ({t.micro_batch})",
            grad_accum=f"--grad-accum ({t.grad_accum})",
            seq_len=f"--seq-len ({t.seq_len})",
            eval_batch=f"per_device_eval_batch_size ({t.eval_micro_batch})",
        )
    located = tuple(k.origin.evidence() for k in (run.micro_batch, run.seq_len) if k.origin.kind == "file")
    return Names(
        micro_batch=_named(
            run.micro_batch,
            t.micro_batch,
            "--micro-batch",
            "per_device_train_batch_size" if hf_like else None,
        ),
        grad_accum=_named(
            run.grad_accum, t.grad_accum, "--grad-accum", "gradient_accumulation_steps" if hf_like else None
        ),
        seq_len=_named(run.seq_len, t.seq_len, "--seq-len", "cutoff_len" if fw == "llamafactory" else None),
        eval_batch=_named(
            run.eval_micro_batch,
            t.eval_micro_batch or 0,
            "per_device_eval_batch_size",
            "per_device_eval_batch_size",
        ),
        evidence=located,
    )


def _key(named: str) -> str:
    """`per_device_train_batch_size (64, run.yaml:41)` -> `per_device_train_batch_size`."""
    return named.split(" (", 1)[0]


# --------------------------------------------------------------------------------------------------
# Changes that fit, found by planning the run again
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Change:
    """One change to the run that makes a strategy fit, with the peaks of the plan that shows it."""

    kind: str
    """"micro_batch", "seq_len", "batch_1_seq_len" (both: micro batch 1 and this length), "eval_batch", "nodes" or
    "ranks_per_node"."""
    strategy: str
    """The strategy (`StrategyPlan.name`) that fits with the change."""
    text: str
    value: int
    peak_gpu: int
    peak_host: int


def _largest_fitting(lo: int, hi: int, fits: Callable[[int], bool]) -> int | None:
    """The largest n in [lo, hi] with fits(n), assuming fits is monotone (smaller n never needs more)."""
    if hi < lo or not fits(lo):
        return None
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def _smallest_fitting(lo: int, hi: int, fits: Callable[[int], bool]) -> int | None:
    """The smallest n in [lo, hi] with fits(n), assuming more n never needs more."""
    if hi < lo or not fits(hi):
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        if fits(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


def _changes(
    inputs: PlanInputs, best: StrategyPlan, names: Names, margin: float, order: tuple[str, ...]
) -> Iterator[Change]:
    """Each change in `order` that makes `best`'s strategy fit, with the smallest step from the user's values."""
    from zerodoctor.plan.phases import plan_strategy

    t = best.training
    c = inputs.cluster
    memo: dict[tuple[str, int], StrategyPlan] = {}

    def planned(kind: str, n: int) -> StrategyPlan:
        if (kind, n) not in memo:
            tr, inp = t, inputs
            if kind == "micro_batch":
                tr = replace(t, micro_batch=n)
            elif kind == "seq_len":
                tr = replace(t, seq_len=n)
            elif kind == "batch_1_seq_len":
                tr = replace(t, micro_batch=1, seq_len=n)
            elif kind == "eval_batch":
                tr = replace(t, eval_micro_batch=n)
            elif kind == "nodes":
                inp = replace(inputs, cluster=replace(c, nodes=n))
            elif kind == "ranks_per_node":
                inp = replace(inputs, cluster=replace(c, gpus_per_node=n, nodes=c.world_size // n))
            memo[(kind, n)] = plan_strategy(inp, best.zero, tr, label=best.label, margin=margin)
        return memo[(kind, n)]

    def fits(kind: str) -> Callable[[int], bool]:
        return lambda n: planned(kind, n).fits

    def peaks(kind: str, n: int) -> str:
        p = planned(kind, n)
        gpu, gph = p.gpu_peak()
        host, hph = p.host_peak()
        return f"{_g(gpu)} per GPU ({PHASE_WORDS.get(gph, gph)}), {_g(host)} per node ({PHASE_WORDS.get(hph, hph)})"

    def change(kind: str, n: int, text: str) -> Change:
        p = planned(kind, n)
        return Change(kind, best.name, text, n, p.gpu_peak()[0], p.host_peak()[0])

    for kind in order:
        if kind == "micro_batch" and t.micro_batch > 1:
            n = _largest_fitting(1, t.micro_batch - 1, fits(kind))
            if n is not None:
                accum = -(-t.grad_accum * t.micro_batch // n)
                yield change(
                    kind,
                    n,
                    f"{names.micro_batch} -> {n} and {_key(names.grad_accum)} {t.grad_accum} -> {accum} to keep the "
                    f"global batch: {peaks(kind, n)}",
                )
        elif kind == "seq_len" and t.seq_len > SEQ_STEP:
            k = _largest_fitting(
                1, (t.seq_len - 1) // SEQ_STEP, lambda m: planned("seq_len", m * SEQ_STEP).fits
            )
            if k is not None:
                yield change(
                    kind, k * SEQ_STEP, f"{names.seq_len} -> {k * SEQ_STEP}: {peaks(kind, k * SEQ_STEP)}"
                )
        elif kind == "batch_1_seq_len" and t.micro_batch > 1 and t.seq_len > SEQ_STEP:
            k = _largest_fitting(
                1, (t.seq_len - 1) // SEQ_STEP, lambda m: planned("batch_1_seq_len", m * SEQ_STEP).fits
            )
            if k is not None:
                accum = t.grad_accum * t.micro_batch
                yield change(
                    kind,
                    k * SEQ_STEP,
                    f"{names.micro_batch} -> 1 ({_key(names.grad_accum)} {t.grad_accum} -> {accum}) and "
                    f"{names.seq_len} -> {k * SEQ_STEP}: {peaks(kind, k * SEQ_STEP)}",
                )
        elif kind == "eval_batch" and (t.eval_micro_batch or 0) > 1:
            n = _largest_fitting(1, (t.eval_micro_batch or 1) - 1, fits(kind))
            if n is not None:
                yield change(kind, n, f"{names.eval_batch} -> {n}: {peaks(kind, n)}")
        elif kind == "nodes" and c.nodes < MAX_NODES:
            n = _smallest_fitting(c.nodes + 1, MAX_NODES, fits(kind))
            if n is not None:
                yield change(
                    kind,
                    n,
                    f"{n} nodes of {c.gpus_per_node} GPUs ({n * c.gpus_per_node} GPUs, now {c.world_size}): "
                    f"{peaks(kind, n)}",
                )
        elif kind == "ranks_per_node" and c.gpus_per_node > 1:
            fitting = [
                g
                for g in range(c.gpus_per_node - 1, 0, -1)
                if c.world_size % g == 0 and planned(kind, g).fits
            ]
            if fitting:
                g = fitting[0]
                yield change(
                    kind,
                    g,
                    f"{g} ranks per node on {c.world_size // g} nodes (the same {c.world_size} GPUs, now "
                    f"{c.gpus_per_node} per node on {c.nodes}): {peaks(kind, g)}",
                )


def _order(top: Item, resource: str, phase: str) -> tuple[str, ...]:
    """Which changes to try, most relevant first, from the item that dominates the failing phase."""
    name = top.name.lower()
    if phase == "eval" and resource == "gpu":
        return ("eval_batch", "micro_batch", "seq_len")
    if resource == "host":
        return ("ranks_per_node", "nodes")
    if any(w in name for w in _ACTIVATIONS):
        return ("micro_batch", "seq_len", "batch_1_seq_len")
    if name.startswith(_WORKING_SET):
        # they do not shrink it, but the rest of the phase may give way
        return ("micro_batch", "seq_len", "batch_1_seq_len")
    if name.startswith(_MODEL_STATES):
        return ("nodes", "micro_batch", "seq_len")
    return ("micro_batch", "seq_len", "nodes")


# --------------------------------------------------------------------------------------------------
# The qualitative action (when no change is found, and as the reason)
# --------------------------------------------------------------------------------------------------


def _action(
    item: Item, resource: str, names: Names, inputs: PlanInputs, best: StrategyPlan
) -> tuple[str, list[Fix]]:
    name = item.name.lower()
    if resource == "host":
        # every rank of a node holds its own copy or share of this item, so fewer ranks per node shrink it
        text = "add host RAM per node, or run fewer ranks per node (spread them over more nodes)"
        fixes = [Fix("Give each node more host RAM, or spread the ranks over more nodes")]
        if name.startswith(_MODEL_STATES) or "optimizer" in name or "offload" in name:
            text += ", or offload to NVMe instead of the CPU"
            fixes.append(Fix("Offload to NVMe instead of the CPU"))
        return text, fixes
    if name.startswith("evaluation"):
        # the evaluation forward runs at the eval batch (transformers' default 8), not the training one
        text = (
            f"it grows with the evaluation batch, not the training one: lower {names.eval_batch}, or set "
            "prediction_loss_only / eval_accumulation_steps"
        )
        return text, [
            Fix(f"Lower {names.eval_batch}"),
            Fix("Set prediction_loss_only or eval_accumulation_steps"),
        ]
    if any(w in name for w in _ACTIVATIONS):
        mb, seq = names.micro_batch, names.seq_len
        lower = f"lower {mb} or {seq}" if best.training.micro_batch > 1 else f"shorten {seq}"
        text = f"they grow with micro batch x sequence length and do not shrink with more GPUs: {lower}"
        fixes = [Fix(f"Shorten {seq}")]
        if best.training.micro_batch > 1:
            fixes.insert(0, Fix(f"Lower {mb}; raise gradient accumulation to keep the global batch"))
        if not best.training.gradient_checkpointing:
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


def _tried(inputs: PlanInputs, best: StrategyPlan, names: Names, order: tuple[str, ...]) -> tuple[str, ...]:
    """What `_changes` tried for `order`, in the user's words (only what could be tried: a micro batch above 1...)."""
    t, c = best.training, inputs.cluster
    words = {
        "micro_batch": f"{names.micro_batch} down to 1" if t.micro_batch > 1 else "",
        "seq_len": f"{names.seq_len} down to {SEQ_STEP}" if t.seq_len > SEQ_STEP else "",
        "eval_batch": f"{names.eval_batch} down to 1" if (t.eval_micro_batch or 0) > 1 else "",
        "nodes": f"up to {MAX_NODES} nodes of {c.gpus_per_node} GPUs" if c.nodes < MAX_NODES else "",
        "ranks_per_node": "fewer ranks per node on more nodes" if c.gpus_per_node > 1 else "",
    }
    return tuple(w for k in order if (w := words.get(k, "")))


def _bases(
    inputs: PlanInputs, candidates: tuple[StrategyPlan, ...] | list[StrategyPlan], best: StrategyPlan
) -> list[StrategyPlan]:
    """The strategies a change is tried with: the closest one of the user's method (and of the user's ZeRO
    settings when given), then the closest of all."""
    own = [s for s in candidates if s.training.method == inputs.training.method]
    if inputs.zero is not None:
        z = inputs.zero
        own = [
            s
            for s in own
            if (s.zero.stage, s.zero.offload_optimizer, s.zero.offload_param)
            == (z.stage, z.offload_optimizer, z.offload_param)
        ] or own
    first = closest(own)
    return [first, best] if first is not None and first is not best else [best]


@dataclass(frozen=True)
class Advice:
    """Why nothing fits and what would: the closest strategy, where and by how much it misses, the dominant item,
    the qualitative action, and the changes found by planning the run again."""

    best: StrategyPlan
    phase: str
    resource: str
    need: int
    capacity: int
    top: Item
    action: str
    changes: tuple[Change, ...]
    fixes: tuple[Fix, ...]
    evidence: tuple[Evidence, ...]
    tried: tuple[str, ...] = ()
    """The changes tried that fit on none of the strategies tried (`--micro-batch (4) down to 1`)."""

    @property
    def where(self) -> str:
        return f"{'per GPU' if self.resource == 'gpu' else 'per node'} at the {PHASE_WORDS.get(self.phase, self.phase)}"

    def text(self) -> str:
        """`the closest, X, needs A per GPU at the steady step against B (C over), D of it activations: ...`."""
        head = (
            f"the closest, {self.best.name}, needs {_g(self.need)} {self.where} against {_g(self.capacity)} "
            f"({_g(self.need - self.capacity)} over), {_g(self.top.bytes)} of it {self.top.name}"
        )
        if self.changes:
            found = "; or ".join(c.text for c in self.changes)
            return f"{head}; planned again, this run fits with {self.changes[0].strategy} when {found}"
        tried = (
            f"; planned again, none of these fits on its own: {', '.join(self.tried)}" if self.tried else ""
        )
        return f"{head}: {self.action}{tried}"

    def data(self) -> dict[str, object]:
        return {
            "phase": self.phase,
            "dominant": self.top.name,
            "resource": self.resource,
            "need_bytes": self.need,
            "capacity_bytes": self.capacity,
            "closest": self.best.name,
            "tried": list(self.tried),
            "changes": [
                {
                    "kind": c.kind,
                    "value": c.value,
                    "strategy": c.strategy,
                    "gpu_peak_bytes": c.peak_gpu,
                    "host_peak_bytes": c.peak_host,
                }
                for c in self.changes
            ],
        }


def advise(
    inputs: PlanInputs,
    candidates: tuple[StrategyPlan, ...] | list[StrategyPlan],
    margin: float,
    run: RunDescription | None = None,
    *,
    max_changes: int = 2,
) -> Advice | None:
    """Why the closest candidate misses and up to `max_changes` changes that make it fit (None: all fit)."""
    best = closest(candidates)
    if best is None:
        return None
    phase_name, resource, need, cap = max(best.failing_phases(), key=lambda x: x[2] / max(x[3], 1))
    phase = best.phase(phase_name)
    items = phase.gpu if resource == "gpu" else phase.host
    real = [i for i in items if not i.name.startswith(_OVERHEAD)] or list(items)
    top = max(real, key=lambda i: i.bytes)
    names = names_for(inputs, run)
    action, fixes = _action(top, resource, names, inputs, best)
    changes: list[Change] = []
    for base in _bases(inputs, candidates, best):
        # all the changes from one strategy: the user's own when any change fits with it, else the closest's
        changes = list(
            islice(_changes(inputs, base, names, margin, _order(top, resource, phase_name)), max_changes)
        )
        if changes:
            break
    computed = [Fix(f"With {ch.strategy}: {ch.text}") for ch in changes]
    tried = () if changes else _tried(inputs, best, names, _order(top, resource, phase_name))
    evidence: tuple[Evidence, ...] = ()
    if any(w in top.name.lower() for w in _ACTIVATIONS) and resource == "gpu":
        evidence = names.evidence  # the user's line that sets the micro batch (then the sequence length)
    return Advice(
        best,
        phase_name,
        resource,
        need,
        cap,
        top,
        action,
        tuple(changes),
        (*computed, *fixes),
        evidence,
        tried,
    )


def nothing_fits_finding(
    inputs: PlanInputs,
    candidates: tuple[StrategyPlan, ...] | list[StrategyPlan],
    margin: float,
    run: RunDescription | None = None,
    *,
    advice: Advice | None = None,
) -> Finding:
    """PLAN006: none of the candidates fits; the closest one's worst miss and what would fit (`advice` when the
    caller has it already)."""
    c = inputs.cluster
    head = (
        f"none of {len(candidates)} strategies fits {c.world_size} x {_g(c.gpu_memory_bytes)} GPUs and "
        f"{_g(c.host_ram_bytes)} host RAM per node with a {margin:.0%} margin"
    )
    advice = advice if advice is not None else advise(inputs, candidates, margin, run)
    finding = Finding(
        id="PLAN006",
        name="plan.nothing-fits",
        severity=Severity.ERROR,
        title="no strategy fits this cluster",
        message=f"{head}: add GPUs or nodes, or use GPUs with more memory",  # no candidate was evaluated
        source="plan",
    )
    if advice is None:
        return finding
    return replace(
        finding,
        message=f"{head}; {advice.text()}",
        fixes=advice.fixes,
        evidence=advice.evidence,
        data=advice.data(),
    )


def reword_nothing_fits(f: Finding, result: PlanResult, run: RunDescription) -> Finding:
    """PLAN006 answered again with `run`'s own names (check's entry point); other findings unchanged."""
    if f.id != "PLAN006" or ("closest" in f.data and result.inputs.run is not None):
        return f  # not PLAN006, or already answered by the planner with a run's own names
    new = nothing_fits_finding(result.inputs, result.candidates, result.margin, run)
    return replace(new, evidence=(*new.evidence, *f.evidence), data={**f.data, **new.data})
