"""The preflight: discover the setup, describe the run once, run every judge on that one description, merge
what they say into one list ordered by when each problem bites, and give one verdict.

Verdicts, strongest first:
  will fail          a finding of severity error: the run as configured fails, and the finding says when
  could not check    something that decides whether it fails could not be judged (the memory plan without
                     the GPU memory, the versions without an environment): an unknown is never a pass
  ready with warnings
  ready
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from zerodoctor.check.registry import PHASE_ORDER, all_checks
from zerodoctor.errors import PlanError, SetupError
from zerodoctor.findings import Evidence, Finding, Fix, Severity
from zerodoctor.setup.discover import discover
from zerodoctor.setup.load import setup_from_documents
from zerodoctor.setup.model import unusable_reference
from zerodoctor.setup.run import Known, Origin, RunDescription, RunFlags, describe_run

if TYPE_CHECKING:
    from zerodoctor.env.model import Environment
    from zerodoctor.plan.candidates import PlanResult

VERDICTS = ("ready", "ready with warnings", "could not check", "will fail")

# The same problem found by two judges is one finding: these ids name the same problem.
SAME_PROBLEM = {
    "DS006": "host-ram-exhausted",
    "PLAN002": "host-ram-exhausted",
    "QL001": "qlora-weights-replicated",
    "PLAN004": "qlora-weights-replicated",
    "DS008": "save-gather-host-ram",
    "PLAN005": "save-only-model-ignored",
}
# Phases of the knowledge base's entries -> when the problem bites in a run.
KB_PHASES = {
    "config": "launch",
    "init": "launch",
    "load": "load",
    "forward": "steady_state",
    "backward": "steady_state",
    "optimizer_step": "first_optimizer_step",
    "checkpoint_save": "checkpoint_save",
    "resume": "load",
    "any": "steady_state",
}
# The planner's phase names -> the check's.
PLAN_PHASES = {
    "load": "load",
    "first_step": "first_optimizer_step",
    "steady": "steady_state",
    "save": "checkpoint_save",
}


@dataclass(frozen=True)
class CheckOptions:
    paths: tuple[str, ...]
    flags: RunFlags
    env_path: str | None = None
    deep: bool = False  # probe DeepSpeed's ops in a subprocess (~3 s) when probing this machine
    only: frozenset[str] | None = None
    skip: frozenset[str] | None = None
    margin: float = 0.10
    selftest: bool = False  # --run: run the setup in miniature on the installed stack (zerodoctor.selftest)
    selftest_timeout_s: float = 600.0


@dataclass(frozen=True)
class Checked:
    """One line of "what was checked and what was not"."""

    what: str
    checked: bool
    detail: str


@dataclass(frozen=True)
class CheckReport:
    verdict: str
    findings: tuple[Finding, ...]
    headline: tuple[tuple[str, str], ...]
    checked: tuple[Checked, ...]
    files: tuple[tuple[str, str], ...]
    skipped: tuple[tuple[str, str], ...]
    run: RunDescription
    plan: PlanResult | None
    env_source: str

    @property
    def when_it_bites(self) -> str | None:
        """The phase of the first error, in run order."""
        errors = [f for f in self.findings if f.severity is Severity.ERROR]
        return phase_of(errors[0]) if errors else None


def phase_of(f: Finding) -> str:
    return str(f.data.get("phase", "launch"))


def run_check(options: CheckOptions) -> CheckReport:
    found = discover(options.paths)
    env, env_source = _environment(options, found.env_path)
    flags = options.flags
    cluster_given = found.cluster is not None or any(
        v is not None for v in (flags.gpus_per_node, flags.gpu_memory_gib, flags.host_ram_gib, flags.nodes)
    )
    if env_source == "this machine" and cluster_given:
        # The run is planned for the cluster described: this machine's packages stand in for the training
        # nodes' (said in "what was checked"), its own GPUs, RAM and limits are not the cluster's.
        env = dataclasses.replace(env, gpus=[], gpus_probed=False, host=None)
        env_source = "this machine's packages"
    setup = setup_from_documents(
        list(found.documents),
        env=env,
        framework=flags.framework,
        world_size=flags.world_size,
        num_nodes=flags.nodes,
        gpus_per_node=flags.gpus_per_node,
        model=flags.model,
        dataset_samples=flags.samples,
    )
    if setup.missing_references:
        doc, key, target = setup.missing_references[0]
        pos = doc.position(key)
        unusable = unusable_reference(doc.path, target)
        raise SetupError(
            f"{doc.display}:{pos.line if pos else 1}: {key} names {target}, "
            + (f"but {unusable}" if unusable else "which does not exist"),
            hint="put the DeepSpeed config next to the training config, or pass it as another file",
        )
    run = describe_run(setup, flags, env=env, cluster_file=found.cluster, strict=True)
    checked: list[Checked] = [
        Checked("configs", True, ", ".join(f"{d.display} ({d.kind})" for d in setup.documents)),
    ]
    findings: list[Finding] = []

    # ---- environment ----------------------------------------------------------------------------------
    from zerodoctor.env.judge import judge_environment

    env_findings = judge_environment(env, run.facts(), include_kb=False)
    findings += env_findings
    versions = env.versions()
    if versions.get("deepspeed"):
        checked.append(Checked("installed stack", True, f"{env_source}: " + _stack(versions)))
    else:
        checked.append(
            Checked(
                "installed stack",
                False,
                f"{env_source} has no DeepSpeed: known-bad versions not checked (pass --env with a snapshot or "
                "`pip freeze` of a training node)",
            )
        )

    # ---- configs and the knowledge base ---------------------------------------------------------------
    from zerodoctor.lint.engine import lint_run, setup_notes

    findings += setup_notes(setup) + lint_run(run)

    # ---- memory plan ----------------------------------------------------------------------------------
    plan_result = None
    try:
        from zerodoctor.plan.candidates import plan
        from zerodoctor.plan.inputs import inputs_from_run

        host_known = run.cluster.host_ram_bytes is not None
        planned = run if host_known else _without_host_limit(run)
        plan_result = plan(inputs_from_run(planned), margin=options.margin)
        plan_findings = list(plan_result.findings)
        if not host_known:
            # GPU verdicts stand; what the host needs is reported in the headline but not judged.
            plan_findings = [f for f in plan_findings if f.id not in HOST_PLAN_FINDINGS]
            checked.append(
                Checked("host RAM", False, "unknown: pass --host-ram GiB, or host_ram_gib in cluster.yaml")
            )
        from zerodoctor.check.nothing_fits import reword_nothing_fits

        findings += [
            _locate_plan_finding(reword_nothing_fits(f, plan_result, run), run) for f in plan_findings
        ]
        findings += _tight(plan_result, options.margin)
        checked.append(Checked("memory plan", True, _plan_summary(plan_result)))
    except PlanError as exc:
        checked.append(Checked("memory plan", False, str(exc)))
        findings.append(
            Finding(
                id="ZD002",
                name="check.not-checked",
                severity=Severity.WARNING,
                title="Memory not checked",
                message=f"GPU and host memory could not be planned: {exc}. Whether the run fits is unknown.",
                fixes=(Fix(exc.hint or "give the missing value (see `zerodoctor check --help`)"),),
                source="check",
                data={"phase": "launch", "not_checked": "memory plan"},
            )
        )
    from zerodoctor.selftest.refusals import is_launch_refusal, not_launched_note

    # the selftest does not run values the framework refuses at start-up (zerodoctor.selftest.refusals)
    refusals = [f for f in findings if is_launch_refusal(f)] if options.selftest else []
    if refusals:
        checked.append(Checked("selftest", False, not_launched_note(refusals)))
    elif options.selftest:
        result = _selftest(run, options.selftest_timeout_s)
        findings += [_with_selftest_phase(f) for f in result.findings]
        passed = sum(1 for c in result.checks if c.status == "passed")
        checked.append(
            Checked(
                "selftest",
                True,
                f"{result.path}, {result.model}: {'passed' if result.ok else 'FAILED'} in "
                f"{result.wall_seconds:.0f} s ({passed}/{len(result.checks)} positive checks passed); "
                f"cannot show: {'; '.join(result.limits)}",
            )
        )
    else:
        checked.append(
            Checked("selftest", False, "not run: `zerodoctor check --run` runs the setup in miniature")
        )

    findings = [f for f in findings if _selected(f, options)]
    findings = _merge(_with_phase(f) for f in findings)
    findings.sort(key=_order)
    verdict = _verdict(findings, checked)
    return CheckReport(
        verdict=verdict,
        findings=tuple(findings),
        headline=tuple(_headline(run, plan_result, _unrecognised(findings))),
        checked=tuple(checked),
        files=tuple((d.display, d.kind) for d in setup.documents),
        skipped=found.skipped,
        run=run,
        plan=plan_result,
        env_source=env_source,
    )


# ---- pieces ---------------------------------------------------------------------------------------------

UNKNOWN_HOST_RAM = 2**60
"""Stands in for a host RAM nobody gave, so the GPU side can be planned; host verdicts are then dropped."""
HOST_PLAN_FINDINGS = frozenset({"PLAN002", "PLAN003"})


def _without_host_limit(run: RunDescription) -> RunDescription:
    placeholder = Known(UNKNOWN_HOST_RAM, Origin("default", "host RAM unknown: the host side is not judged"))
    return dataclasses.replace(run, cluster=dataclasses.replace(run.cluster, host_ram_bytes=placeholder))


def _tight(result: PlanResult, margin: float) -> list[Finding]:
    """The plan fits, but inside the safety margin: a prediction this close is not a pass."""
    s = result.yours
    if s is None or s.status != "tight":
        return []
    gpu, gph = s.gpu_peak()
    cap = s.cluster.gpu_memory_bytes
    host, hph = s.host_peak()
    return [
        Finding(
            id="ZD004",
            name="check.memory-tight",
            severity=Severity.WARNING,
            title="Memory is within the safety margin",
            message=(
                f"{s.zero.label} is predicted at {_gib(gpu)} per GPU ({gph}) of {_gib(cap)}, and {_gib(host)} of "
                f"{_gib(s.cluster.host_ram_bytes)} host RAM per node ({hph}): inside the {margin:.0%} margin the "
                "prediction is not exact enough to promise it fits (longer samples, fragmentation and "
                "allocator slack take the rest)."
            ),
            fixes=(
                Fix(
                    "Make room: enable gradient checkpointing or lower the micro batch / sequence length; or use "
                    + (
                        result.recommended.name
                        if result.recommended is not None
                        else "a strategy that offloads"
                    )
                ),
            ),
            source="check",
            data={"phase": PLAN_PHASES.get(gph, "steady_state"), "gpu_bytes": gpu, "capacity_bytes": cap},
        )
    ]


# The selftest's phases -> when the problem would bite in the real run.
SELFTEST_PHASES = {
    "distributed-init": "launch",
    "model-build": "load",
    "engine-init": "launch",
    "forward-backward": "steady_state",
    "clip-step": "first_optimizer_step",
    "optimizer-steps": "first_optimizer_step",
    "inspect": "load",
    "checkpoint-save": "checkpoint_save",
    "reload": "checkpoint_save",
    "reference": "steady_state",
}
SELFTEST_CHECK_PHASES = {"saved-weights": "checkpoint_save", "reload": "checkpoint_save"}


def _selftest(run: RunDescription, timeout_s: float) -> Any:
    """The deepest tier: the run's own ZeRO config on a shrunken model of its family, on the selftest's default
    ranks for this machine (2, or 1 where torch sees a single GPU: nccl cannot put two ranks on one GPU)."""
    from zerodoctor.selftest import run_selftest, spec_from_run

    return run_selftest(spec_from_run(run), timeout_s=timeout_s)


def _with_selftest_phase(f: Finding) -> Finding:
    phase = SELFTEST_PHASES.get(str(f.data.get("phase")))
    if phase is None:
        phase = SELFTEST_CHECK_PHASES.get(str(f.data.get("check")), "launch")
    return replace(f, data={**f.data, "phase": phase})


def _environment(options: CheckOptions, found: Any) -> tuple[Environment, str]:
    """`--env`, else a snapshot in the setup directory, else this machine (probed without importing torch)."""
    from zerodoctor.env.snapshot import load_env

    if options.env_path is not None and options.env_path.lower() == "none":
        from zerodoctor.env.model import Environment

        # The training nodes' versions are not known, and this machine is not one of them: judge nothing
        # about the stack (said as not checked), rather than this machine's.
        return Environment(python="", platform="", source="versions unknown (--env none)"), "--env none"
    path = options.env_path or (str(found) if found is not None else None)
    if path:
        return load_env(path), path
    from zerodoctor.env.collect import collect

    return collect(deep=options.deep), "this machine"


def _stack(versions: dict[str, str]) -> str:
    names = ("deepspeed", "torch", "transformers", "accelerate", "peft", "bitsandbytes", "trl")
    return ", ".join(f"{n} {versions[n]}" for n in names if versions.get(n))


def _plan_summary(result: PlanResult) -> str:
    s = result.yours or result.recommended
    if s is None:
        return "no strategy fits"
    gpu, gph = s.gpu_peak()
    host, hph = s.host_peak()
    return (
        f"{s.zero.label}: GPU peak {gpu / 2**30:,.1f} GiB ({gph}), host {host / 2**30:,.1f} GiB/node ({hph})"
    )


def _locate_plan_finding(f: Finding, run: RunDescription) -> Finding:
    """The planner speaks of the ZeRO config in general; point its findings at the user's line."""
    if any(e.file for e in f.evidence) or run.zero is None:
        return f
    stage = run.zero.stage.origin
    where = (
        stage.evidence()
        if stage.file
        else (run.files.ds_evidence("zero_optimization") if run.files.ds_doc else None)
    )
    if where is None or not where.file:
        return f
    return replace(f, evidence=(where, *f.evidence))


def _selected(f: Finding, options: CheckOptions) -> bool:
    if f.id in ("ZD002",) or f.source == "selftest":
        return True  # what could not be checked, and what the requested selftest found, are always said
    if options.only is not None and f.id not in options.only:
        return False
    return not (options.skip is not None and f.id in options.skip)


def _with_phase(f: Finding) -> Finding:
    phase = None
    if f.source == "selftest":
        return f  # placed by _with_selftest_phase
    if f.id.startswith("PLAN") and f.data.get("phase") in PLAN_PHASES:
        phase = PLAN_PHASES[str(f.data["phase"])]
    elif f.id == "KB001":
        from zerodoctor.kb.loader import load_entries

        kb_id = f.data.get("kb_id")
        entry = next((e for e in load_entries() if e.id == kb_id), None)
        phase = KB_PHASES.get(str(entry.phase), "launch") if entry is not None else "launch"
    elif "phase" in f.data and f.data["phase"] in PHASE_ORDER:
        phase = str(f.data["phase"])
    else:
        info = all_checks().get(f.id)
        phase = info.phase if info is not None else "launch"
    return replace(f, data={**f.data, "phase": phase})


def _problem(f: Finding) -> str:
    if f.data.get("kb_id"):
        return f"kb:{f.data['kb_id']}"
    if f.data.get("problem"):
        return str(f.data["problem"])
    if f.id in SAME_PROBLEM:
        return SAME_PROBLEM[f.id]
    ev = f.evidence[0] if f.evidence else Evidence()
    return f"{f.id}:{f.name}:{ev.file}:{ev.line}:{ev.key}:{f.title}"


def _merge(findings: Any) -> list[Finding]:
    """One finding per problem: the most severe (then the one that points at a file line) leads; the others'
    evidence, fixes and references are added and their ids kept in `data.also_found_by`."""
    groups: dict[str, list[Finding]] = {}
    for f in findings:
        groups.setdefault(_problem(f), []).append(f)
    out = []
    for group in groups.values():
        # the most severe leads; on a tie the lint rule (it points at the config line that causes it)
        group.sort(
            key=lambda f: (-int(f.severity), f.source != "lint", not any(e.line for e in f.evidence), f.id)
        )
        lead, rest = group[0], group[1:]
        if not rest:
            out.append(lead)
            continue
        evidence = list(lead.evidence) + [e for g in rest for e in g.evidence if e not in lead.evidence]
        fixes = list(lead.fixes) + [
            x for g in rest for x in g.fixes if x.text not in {y.text for y in lead.fixes}
        ]
        refs = list(dict.fromkeys([*lead.references, *(r for g in rest for r in g.references)]))
        also = [g.id for g in rest]
        out.append(
            replace(
                lead,
                evidence=tuple(dict.fromkeys(evidence)),
                fixes=tuple(fixes),
                references=tuple(refs),
                data={**lead.data, "also_found_by": also, "also": [g.message for g in rest]},
            )
        )
    return out


def _order(f: Finding) -> tuple[int, int, str, int, str]:
    ev = f.evidence[0] if f.evidence else Evidence()
    return (PHASE_ORDER.get(phase_of(f), 0), -int(f.severity), ev.file or "", ev.line or 0, f.id)


def _verdict(findings: list[Finding], checked: list[Checked]) -> str:
    if any(f.severity is Severity.ERROR for f in findings):
        return "will fail"
    if any(not c.checked and c.what != "selftest" for c in checked):
        return "could not check"
    if any(f.severity is Severity.WARNING for f in findings):
        return "ready with warnings"
    return "ready"


def _gib(n: float) -> str:
    return f"{n / 2**30:,.1f} GiB"


# The settings the headline shows, by the argument names that set them (HF TrainingArguments, LLaMA-Factory).
_HEADLINE_KEYS = {
    "micro batch": ("per_device_train_batch_size",),
    "grad accum": ("gradient_accumulation_steps",),
    "seq": ("cutoff_len", "max_seq_length", "model_max_length", "max_length"),
    "gradient checkpointing": ("gradient_checkpointing", "disable_gradient_checkpointing"),
}


def _unrecognised(findings: list[Finding]) -> dict[str, str]:
    """Intended argument name -> the misspelt key as written (HF004's did-you-mean findings)."""
    out: dict[str, str] = {}
    for f in findings:
        near, key = f.data.get("near"), f.data.get("key")
        if f.id == "HF004" and isinstance(near, str) and isinstance(key, str):
            out[near] = key
    return out


def _headline(
    run: RunDescription, result: PlanResult | None, unrecognised: dict[str, str] | None = None
) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    unrecognised = unrecognised or {}

    def assumed(what: str, origin: str) -> str:
        """ " (assumed)" for zerodoctor's own assumption; a framework default or an assumption that a misspelt
        key left in place names that key (the plan used the default because the key was not recognised)."""
        typo = next((unrecognised[k] for k in _HEADLINE_KEYS[what] if k in unrecognised), None)
        if typo and origin in ("default", "framework"):
            return f" (the default: `{typo}` is not a recognised key)"
        return " (assumed)" if origin == "default" else ""

    if run.model is not None:
        out.append(("model", f"{run.model.display_name} ({run.model.params.total / 1e9:,.2f}B parameters)"))
    elif run.model_ref is not None:
        out.append(("model", f"{run.model_ref.value} (not known: {run.model_note or 'no config'})"))
    c = run.cluster
    if c.world_size is not None:
        per = f" ({c.nodes.value} x {c.gpus_per_node.value})" if c.nodes and c.gpus_per_node else ""
        out.append(("GPUs", f"{c.world_size.value}{per}"))

    def v(k: Known[Any]) -> str:
        """A value, marked when it is zerodoctor's assumption rather than something the setup says."""
        return f"{k.value} (assumed)" if k.origin.kind == "default" else str(k.value)

    def w(k: Known[Any], what: str) -> str:
        """Like v(), naming the misspelt key that left the value at zerodoctor's assumption."""
        return f"{k.value}{assumed(what, k.origin.kind)}"

    method = run.method.value + (f" r={v(run.lora_rank)}" if run.method.value in ("lora", "qlora") else "")
    out.append(
        (
            "training",
            f"{method}, {run.precision.value}, micro batch {w(run.micro_batch, 'micro batch')} x grad accum "
            f"{w(run.grad_accum, 'grad accum')}, seq {w(run.seq_len, 'seq')}, gradient checkpointing "
            f"{'on' if run.gradient_checkpointing.value else 'off'}"
            + assumed("gradient checkpointing", run.gradient_checkpointing.origin.kind),
        )
    )
    if run.zero is not None:
        z = run.zero
        offl = [
            f"{p} -> {k.value}"
            for p, k in (("optimizer", z.offload_optimizer), ("param", z.offload_param))
            if k.value != "none"
        ]
        out.append(("ZeRO", f"stage {z.stage.value}" + (f", offload {', '.join(offl)}" if offl else "")))
    steps = run.steps_per_epoch()
    if steps is not None:
        out.append(("steps per epoch", f"{steps:,} optimizer steps"))
    if result is None:
        return out
    s = result.yours or result.recommended
    if s is not None:
        gpu, gph = s.gpu_peak()
        host, hph = s.host_peak()
        cap = s.cluster.gpu_memory_bytes
        out.append(
            (
                "GPU peak",
                f"{_gib(gpu)} of {_gib(cap)} per GPU ({gph}){'' if result.yours else ' (recommended)'}",
            )
        )
        of_host = (
            "host RAM unknown"
            if s.cluster.host_ram_bytes >= UNKNOWN_HOST_RAM
            else _gib(s.cluster.host_ram_bytes)
        )
        out.append(("host peak", f"{_gib(host)} per node ({hph}); node has {of_host}"))
        out.append(
            (
                "checkpoint save",
                f"{_gib(s.phase('save').host_bytes)} host per node; {_gib(s.checkpoint.full_bytes)} on disk",
            )
        )
        out.append(
            (
                "memory verdict",
                s.status + ("" if s.cluster.host_ram_bytes < UNKNOWN_HOST_RAM else " (GPU only)"),
            )
        )
    if result.recommended is not None and result.recommended is not result.yours:
        out.append(("recommended", result.recommended.name))
    return out
