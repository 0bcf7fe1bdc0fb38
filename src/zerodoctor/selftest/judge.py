"""Judge what the selftest's ranks recorded: a verdict per phase, the positive checks, and findings.

A failure is explained by `zerodoctor.diagnose` reading the selftest's own log (the same entry point as
`zerodoctor diagnose`); a failure the knowledge base does not know is still reported with its first error,
rank and phase.
"""

from __future__ import annotations

from typing import Any

from zerodoctor.findings import Evidence, Finding, Fix, Severity
from zerodoctor.selftest.result import (
    FAILED,
    INTERRUPTED,
    NOT_APPLICABLE,
    NOT_CHECKED,
    NOT_REACHED,
    PASSED,
    PHASE_TITLES,
    PHASES,
    SKIPPED,
    TIMED_OUT,
    CheckResult,
    PhaseResult,
    SelftestResult,
)
from zerodoctor.selftest.run import Launch, RankLog
from zerodoctor.selftest.shrink import Adaptation
from zerodoctor.selftest.spec import SAVE_PATHS, SelftestSpec
from zerodoctor.selftest.stops import Stop, is_echo, stopped_ranks
from zerodoctor.textutil import clip

LOSS_TOLERANCE = {"fp32": 1e-3, "bf16": 2e-2, "fp16": 2e-2}
"""Largest relative difference allowed between DeepSpeed's mean loss per step and the plain fp32
single-process reference. 16-bit runs differ by rounding (about 5e-4 measured for bf16 ZeRO-3 offload on
the default tiny Llama over 3 steps); a wrong update, a lost gradient or a skipped clip is far larger."""
WEIGHT_TOLERANCE = 1e-3
"""Saved and reloaded 16-bit weights must equal the live ones (relative to each tensor's largest value)."""
FP32_TOLERANCE = 1e-2
"""zero_to_fp32's fp32 master weights against the 16-bit weights: within bf16 rounding (2^-8)."""

CPU_LIMITS = (
    "a CUDA/CPU device mismatch (accelerator and host are the same device here, so a tensor left on the "
    "wrong one cannot fail; the DeepSpeed 0.14.1/0.14.2 clip-grad bug needs a GPU to show)",
    "pinned host memory (pinning is a no-op without CUDA: no page-locked allocation, no power-of-two "
    "rounding, no `ulimit -l` limit)",
    "GPU memory: no CUDA out-of-memory, no fragmentation, no GPU peak at the first step or at save",
    "NCCL (gloo runs the collectives): no NCCL timeouts, /dev/shm or network problems",
    "CUDA-only kernels (flash attention, fused Adam on GPU) and bitsandbytes 4-bit layers",
)
GPU_LIMITS = (
    "several nodes: the ranks share this machine, so inter-node NCCL, network and per-node host-RAM limits "
    "do not show",
    "memory at your model's size: the model is shrunk (`zerodoctor plan` predicts the real peaks)",
)
ONE_RANK_LIMITS = (
    "partitioning across ranks: with one rank ZeRO keeps everything on it (1/1), and no collective waits "
    "on a partner",
)
TERMINATED_CLASS = "class:terminated"
REFERENCES = ("deepspeedai/DeepSpeed#6877", "deepspeedai/DeepSpeed#5422")


def _own_errors_first(ranks: list[RankLog], phase: str | None = None) -> list[tuple[int, dict[str, Any]]]:
    """(rank, error event) pairs: a rank's own errors before peer-loss echoes, each group in time order."""
    found = [
        (rl.rank, e)
        for rl in ranks
        for e in rl.events
        if e.get("event") == "error" and (phase is None or e.get("phase") == phase)
    ]
    return sorted(found, key=lambda re_: (is_echo(re_[1]), float(re_[1].get("t", 0.0))))


def _hung(launch: Launch) -> bool:
    """The watchdog ended ranks that were still running (rather than the ranks' processes ending)."""
    return launch.watchdog is not None


def _phase_results(
    ranks: list[RankLog], launch: Launch, stop: Stop | None, first: dict[str, Any] | None
) -> list[PhaseResult]:
    out = []
    wd = launch.watchdog or {}
    stop_is_first = stop is not None and first is not None and first.get("type") in ("hang", "exit")
    for name in PHASES:
        starts = {
            rl.rank: e["t"]
            for rl in ranks
            for e in rl.events
            if e.get("event") == "start" and e.get("phase") == name
        }
        ends = {
            rl.rank: e["t"]
            for rl in ranks
            for e in rl.events
            if e.get("event") == "end" and e.get("phase") == name
        }
        errors = _own_errors_first(ranks, name)
        seconds = None
        if starts and ends:
            seconds = round(max(ends[r] - starts[r] for r in starts if r in ends), 2)
        if stop is not None and stop_is_first and stop.phase == name:
            limit = wd.get("reason") == "phase-limit"
            detail = stop.describe()
            if limit:
                detail += f" (phase limit {wd.get('limit_s')} s)"
            out.append(
                PhaseResult(
                    name,
                    TIMED_OUT if limit else INTERRUPTED,
                    wd.get("seconds") if limit else None,
                    detail,
                    stop.rank,
                )
            )
        elif errors:
            rank, e = errors[0]
            detail = f"{e.get('type')}: {clip(str(e.get('message')), 300)}"
            if is_echo(e) and stop is not None and stop.rank is not None and stop.rank != rank:
                detail += f" (after rank {stop.rank} {stop.how})"
            out.append(PhaseResult(name, FAILED, seconds, detail, rank))
        elif wd.get("phase") == name and wd.get("reason") == "phase-limit":
            out.append(
                PhaseResult(
                    name,
                    TIMED_OUT,
                    wd.get("seconds"),
                    f"still in this phase after {wd.get('seconds')} s (limit {wd.get('limit_s')} s): the "
                    "watchdog ended every rank",
                    stop.rank if stop is not None else wd.get("rank"),
                )
            )
        elif starts and set(starts) - set(ends):
            missing = sorted(set(starts) - set(ends))
            how = (
                stop.others.get(missing[0], "") if stop is not None else ""
            ) or "ended without a Python exception, or was ended"
            out.append(
                PhaseResult(
                    name,
                    INTERRUPTED,
                    None,
                    f"rank {', '.join(map(str, missing))} never finished this phase: {how}",
                    missing[0],
                )
            )
        elif starts:
            out.append(PhaseResult(name, PASSED, seconds, _phase_detail(name, ranks)))
        elif name == "reference":
            out.append(
                PhaseResult(
                    name,
                    SKIPPED if all(rl.done for rl in ranks) else NOT_REACHED,
                    None,
                    "no plain reference for a model built by a factory"
                    if all(rl.done for rl in ranks)
                    else "",
                )
            )
        else:
            out.append(PhaseResult(name, NOT_REACHED, None))
    return out


def _phase_detail(name: str, ranks: list[RankLog]) -> str:
    """What a passed phase is worth saying: the time DeepSpeed spent building or loading its ops."""
    if name == "distributed-init" and ranks:
        builds = ranks[0].data("distributed-init").get("jit_builds") or {}
        return "; ".join(f"{op} JIT-built (init took {sec} s)" for op, sec in builds.items())
    if name != "engine-init" or not ranks:
        return ""
    data = ranks[0].data("engine-init")
    ops = data.get("ops") or {}
    parts = [f"{op} {v['how']} in {v['seconds']} s" for op, v in ops.items()]
    if data.get("initialize_seconds") is not None:
        parts.append(f"deepspeed.initialize {data['initialize_seconds']} s")
    return "; ".join(parts)


def _jit_seconds(ranks: list[RankLog]) -> float:
    """Seconds rank 0 spent JIT-building DeepSpeed ops (distributed init and engine init)."""
    if not ranks:
        return 0.0
    init = ranks[0].data("distributed-init").get("jit_builds") or {}
    ops = ranks[0].data("engine-init").get("ops") or {}
    built = [float(v["seconds"]) for v in ops.values() if v.get("how") == "JIT-built"]
    return round(max(init.values(), default=0.0) + sum(built), 2)


def _rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-12)


def _checks(spec: SelftestSpec, ranks: list[RankLog], world: int) -> list[CheckResult]:
    checks: list[CheckResult] = []
    insp = [rl.data("inspect") for rl in ranks]
    path = ranks[0].data("distributed-init") if ranks else {}
    on_cpu = path.get("accelerator") == "cpu"
    # --- partitioning -------------------------------------------------------------------------------------
    if all(insp) and insp:
        stage = spec.zero_stage
        i0 = insp[0]
        if stage == 3:
            full_p = i0["partitioned_full"]
            bad = [
                i
                for i in insp
                if not (
                    full_p > 0
                    and i["partitioned_local"] <= i["partitioned_bound"]
                    and i["partitioned_local"] >= full_p / world - world * 64
                )
            ]
            detail = (
                f"ZeRO-3: each rank holds {i0['partitioned_local']:,} of {full_p:,} partitioned parameter "
                f"elements ({i0['partitioned_local'] / max(full_p, 1):.1%}; expected 1/{world}), plus "
                f"{i0['persistent']:,} elements of small tensors kept whole on every rank (persistence "
                f"threshold); the module's own view of {i0['module_views_empty']} partitioned tensors is empty "
                "between uses, as ZeRO-3 leaves it"
            )
            if full_p == 0:
                detail = (
                    "ZeRO-3 partitioned nothing: every tensor is below the persistence threshold, so each "
                    "rank holds the whole model"
                )
            checks.append(CheckResult("partitioning", FAILED if bad else PASSED, detail, {"ranks": insp}))
        else:
            master = i0.get("master_numel")
            trainable = i0["trainable_full"]
            expect_part = stage in (1, 2)
            if master is None:
                checks.append(
                    CheckResult(
                        "partitioning",
                        NOT_CHECKED,
                        f"stage {stage}: no ZeRO fp32 master partition to measure",
                        {"ranks": insp},
                    )
                )
            else:
                share = master / max(trainable, 1)
                ok = share <= 1 / world + 0.05 if expect_part else share >= 0.95
                checks.append(
                    CheckResult(
                        "partitioning",
                        PASSED if ok else FAILED,
                        f"ZeRO-{stage}: parameters whole on every rank (as stage {stage} keeps them); fp32 master and "
                        f"optimizer states partitioned: rank 0 holds {master:,} of {trainable:,} trainable elements "
                        f"({share:.1%}; expected {'1/' + str(world) if expect_part else 'all'})",
                        {"ranks": insp},
                    )
                )
        # --- placement ------------------------------------------------------------------------------------
        opt_dev = spec.offload_optimizer
        want = "cpu" if opt_dev in ("cpu", "nvme") else str(path.get("accelerator") or "accelerator")
        got_master = set(i0.get("master_devices") or [])
        got_states = set(i0.get("adam_state_devices") or [])
        cls = i0.get("optimizer_class")
        problems = []
        if got_master and not all(d.startswith(want) for d in got_master):
            problems.append(f"fp32 master on {sorted(got_master)}, expected {want}")
        if got_states and not all(d.startswith(want) for d in got_states):
            problems.append(f"optimizer states on {sorted(got_states)}, expected {want}")
        if (
            opt_dev in ("cpu", "nvme")
            and cls != "DeepSpeedCPUAdam"
            and "Adam" in str((spec.ds_config.get("optimizer") or {}).get("type", ""))
        ):
            problems.append(f"optimizer is {cls}, expected DeepSpeedCPUAdam for offload_optimizer={opt_dev}")
        states = i0.get("adam_state_numel")
        detail = (
            f"offload_optimizer={opt_dev}: fp32 master on {sorted(got_master) or '?'}, Adam states "
            f"({states:,} elements per rank) on {sorted(got_states) or '?'}, optimizer {cls}; "
            f"offload_param={spec.offload_param}: parameter partitions on {i0.get('param_devices')}"
        )
        if on_cpu:
            detail += (
                "; on the CPU path the accelerator is the host, so this shows the optimizer DeepSpeed chose "
                "but cannot tell GPU from host placement"
            )
        checks.append(
            CheckResult(
                "placement",
                FAILED if problems else PASSED,
                "; ".join(problems) + ("; " if problems else "") + detail,
                {"rank0": i0},
            )
        )
    else:
        for name in ("partitioning", "placement"):
            checks.append(CheckResult(name, NOT_CHECKED, "the run did not get that far"))
    # --- clipping ---------------------------------------------------------------------------------------------
    clip0 = ranks[0].data("clip-step") if ranks else {}
    if spec.clip is None:
        checks.append(
            CheckResult(
                "clipping",
                NOT_APPLICABLE,
                "no gradient_clipping in the config: the clip path (where DeepSpeed 0.14.1/0.14.2 "
                "failed with offload) is not exercised",
            )
        )
    elif clip0 and clip0.get("applied") is False:
        # fp16 with dynamic loss scaling: the forced step overflowed and DeepSpeed skipped it before clipping
        checks.append(
            CheckResult(
                "clipping",
                NOT_CHECKED,
                "the first optimizer step overflowed in 16-bit and DeepSpeed skipped it (dynamic loss scaling), "
                "so the clipping code path did not run in this selftest",
                {"grad_norm": clip0.get("grad_norm"), "clip": spec.clip},
            )
        )
    elif clip0.get("grad_norm") is None:
        checks.append(CheckResult("clipping", NOT_CHECKED, "the first optimizer step did not complete"))
    else:
        norm = float(clip0["grad_norm"])
        checks.append(
            CheckResult(
                "clipping",
                PASSED if norm > spec.clip else FAILED,
                f"first optimizer step: gradient norm {norm:.4g} {'>' if norm > spec.clip else '<='} gradient_clipping "
                f"{spec.clip:g}, so the clipping code path {'ran' if norm > spec.clip else 'did not run'}",
                {"grad_norm": norm, "clip": spec.clip},
            )
        )
    # --- loss vs reference --------------------------------------------------------------------------------
    ref = ranks[0].data("reference") if ranks else {}
    steps = (
        [ranks[0].data("clip-step")] + list(ranks[0].data("optimizer-steps").get("steps", []))
        if ranks
        else []
    )
    per_rank_steps = []
    for rl in ranks:
        s = [rl.data("clip-step")] + list(rl.data("optimizer-steps").get("steps", []))
        per_rank_steps.append([x for x in s if x])
    tol = LOSS_TOLERANCE.get(str(path.get("precision") or spec.precision), 2e-2)
    if ref.get("skipped"):
        checks.append(CheckResult("loss-vs-reference", NOT_CHECKED, str(ref["skipped"])))
    elif not ref.get("steps") or not steps or not all(per_rank_steps):
        checks.append(CheckResult("loss-vs-reference", NOT_CHECKED, "the run did not finish its steps"))
    else:
        rows = []
        worst = 0.0
        for k, r in enumerate(ref["steps"]):
            losses = [v for rs in per_rank_steps if k < len(rs) for v in rs[k]["losses"]]
            ds = sum(losses) / len(losses)
            rel_diff = _rel(ds, r["loss"])
            worst = max(worst, rel_diff)
            rows.append(
                {"step": k + 1, "deepspeed": round(ds, 5), "reference": round(r["loss"], 5), "rel": rel_diff}
            )
        shown = ", ".join(f"{x['deepspeed']:.4f} vs {x['reference']:.4f}" for x in rows)
        checks.append(
            CheckResult(
                "loss-vs-reference",
                PASSED if worst <= tol else FAILED,
                f"mean loss per step, DeepSpeed vs plain single-process fp32 reference: {shown}; largest relative "
                f"difference {worst:.2e} (tolerance {tol:g} for {path.get('precision') or spec.precision})",
                {"steps": rows, "tolerance": tol},
            )
        )
    # --- saved weights ----------------------------------------------------------------------------------
    save = ranks[0].data("checkpoint-save") if ranks else {}
    if not save:
        checks.append(CheckResult("saved-weights", NOT_CHECKED, "the save did not complete"))
    elif save.get("file") is None:
        needs = spec.save_path in ("save_16bit_model", "state_dict")
        checks.append(
            CheckResult(
                "saved-weights",
                FAILED if needs else NOT_APPLICABLE,
                (save.get("note") or "no weights file was written")
                + f" (save path: {SAVE_PATHS[spec.save_path]})",
                save,
            )
        )
    else:
        empty, missing = int(save.get("empty_count", 0)), int(save.get("missing_count", 0))
        diff = float(save.get("max_rel_diff") or 0.0)
        ok = empty == 0 and missing == 0 and diff <= WEIGHT_TOLERANCE
        detail = (
            f"{save.get('tensors')} tensors, {save.get('numel'):,} elements, {save.get('file_bytes'):,} bytes"
            f" written by {spec.save_path}; {empty} empty, {missing} missing; largest difference from the "
            f"live weights {diff:.1e}"
        )
        if empty:
            detail = (
                f"{empty} of {save.get('tensors')} saved tensors are empty (e.g. {', '.join(save['empty'][:3])}): "
                f"the save wrote ZeRO-3's partitioned views, not the weights; " + detail
            )
        checks.append(CheckResult("saved-weights", PASSED if ok else FAILED, detail, save))
    # --- reload and zero_to_fp32 ------------------------------------------------------------------------
    reload = ranks[0].data("reload") if ranks else {}
    if not reload:
        checks.append(CheckResult("reload", NOT_CHECKED, "the reload did not complete"))
        checks.append(CheckResult("zero-to-fp32", NOT_CHECKED, "the reload did not complete"))
    else:
        d = float(reload.get("reload_max_rel_diff") or 0.0)
        checks.append(
            CheckResult(
                "reload",
                PASSED if d <= WEIGHT_TOLERANCE else FAILED,
                f"one more step moved the weights, load_checkpoint restored them: largest difference from the saved "
                f"weights {d:.1e} (tolerance {WEIGHT_TOLERANCE:g})",
                reload,
            )
        )
        if not reload.get("zero_to_fp32_ok"):
            checks.append(
                CheckResult(
                    "zero-to-fp32", FAILED, f"zero_to_fp32 failed: {reload.get('zero_to_fp32_error')}", reload
                )
            )
        else:
            zd = float(reload.get("zero_to_fp32_max_rel_diff") or 0.0)
            empty_z, miss_z = reload.get("zero_to_fp32_empty") or [], reload.get("zero_to_fp32_missing") or []
            ok = zd <= FP32_TOLERANCE and not empty_z and not miss_z
            checks.append(
                CheckResult(
                    "zero-to-fp32",
                    PASSED if ok else FAILED,
                    f"DeepSpeed's zero_to_fp32 rebuilt {reload.get('zero_to_fp32_tensors')} fp32 tensors from the checkpoint "
                    f"in {reload.get('zero_to_fp32_seconds')} s; {len(empty_z)} empty, {len(miss_z)} missing; largest "
                    f"difference from the 16-bit weights {zd:.1e} (tolerance {FP32_TOLERANCE:g}, 16-bit rounding)",
                    reload,
                )
            )
    return checks


def _first_error(ranks: list[RankLog], launch: Launch, stop: Stop | None) -> dict[str, Any] | None:
    """The run's first failure: a rank's own Python exception; else the rank that died or hung first (see
    `zerodoctor.selftest.stops`); else a peer-loss error; else what the watchdog or torchrun saw."""
    errs = _own_errors_first(ranks)
    own = [(r, e) for r, e in errs if not is_echo(e)]
    if own:
        rank, e = own[0]
        return {
            "rank": rank,
            "phase": e.get("phase"),
            "type": e.get("type"),
            "message": e.get("message"),
            "traceback": e.get("traceback"),
            "others": _others_text(stop, rank),
        }
    if stop is not None:
        # a rank that vanished or hung comes first when the others' errors are what its disappearance caused
        # (a gloo "Connection reset by peer", an NCCL timeout)
        text = stop.describe()
        if errs and errs[0][0] not in stop.others:
            text += f"; rank {errs[0][0]} then failed: {errs[0][1].get('type')}: " + clip(
                str(errs[0][1].get("message")), 200
            )
        if not _hung(launch) and launch.returncode not in (0, None):
            text += f" (torchrun exit code {launch.returncode}; the log says how it ended)"
        return {
            "rank": stop.rank,
            "phase": stop.phase,
            "type": "hang" if _hung(launch) else "exit",
            "message": text,
            "evidence": list(stop.evidence),
        }
    if errs:
        rank, e = errs[0]
        return {
            "rank": rank,
            "phase": e.get("phase"),
            "type": e.get("type"),
            "message": e.get("message"),
            "traceback": e.get("traceback"),
        }
    if launch.watchdog:
        return {
            "rank": launch.watchdog.get("rank"),
            "phase": launch.watchdog.get("phase"),
            "type": "watchdog",
            "message": _watchdog_text(launch.watchdog),
        }
    if launch.returncode not in (0, None) or not all(rl.done for rl in ranks):
        return {
            "rank": None,
            "phase": None,
            "type": "exit",
            "message": f"torchrun exited with code {launch.returncode} and no rank recorded an error "
            "(a rank may have died before its first phase)",
        }
    return None


def _others_text(stop: Stop | None, first_rank: int) -> str:
    if stop is None:
        return ""
    return "; ".join(f"rank {r} {how}" for r, how in sorted(stop.others.items()) if r != first_rank)


def _watchdog_text(wd: dict[str, Any]) -> str:
    if wd.get("reason") == "phase-limit":
        return (
            f"rank {wd.get('rank')} spent {wd.get('seconds')} s in phase {wd.get('phase')} (limit "
            f"{wd.get('limit_s')} s); the watchdog ended every rank"
        )
    if wd.get("reason") == "after-failure":
        return (
            f"rank {wd.get('rank')} was still running {wd.get('seconds')} s after another rank failed; the "
            "watchdog ended every rank"
        )
    return f"the selftest ran past its {wd.get('limit_s')} s limit; the watchdog ended every rank"


def _diagnose(
    spec: SelftestSpec, launch: Launch, versions: dict[str, str]
) -> tuple[list[Finding], Finding | None]:
    """`zerodoctor diagnose` on the selftest's log: (knowledge-base entries that match, at most 2; the failure
    class, `class:*`, which names the kind of failure but is no knowledge-base entry)."""
    from zerodoctor.diagnose import diagnose
    from zerodoctor.diagnose.classes import PREFIX as CLASS_PREFIX
    from zerodoctor.diagnose.judge import NO_KNOWN_FAILURE

    try:
        result = diagnose([str(launch.log_path)], versions=versions or None, config_facts=spec.facts or None)
    except Exception:  # noqa: BLE001 - diagnose is a helper here; its own failure must not hide the verdict
        return [], None
    found = [f for f in result.findings if f.id != NO_KNOWN_FAILURE]
    known = [f for f in found if not f.id.startswith(CLASS_PREFIX)][:2]
    failure_class = next((f for f in found if f.id.startswith(CLASS_PREFIX)), None)
    if failure_class is not None and failure_class.id == TERMINATED_CLASS and launch.watchdog:
        failure_class = None  # the run was stopped from outside by the selftest's own watchdog: no news
    return known, failure_class


def _class_name(f: Finding) -> str:
    """A failure class's name without the "(not in the knowledge base)" its diagnose title carries."""
    title = f.title.split(" (not in the knowledge base)")[0]
    return f"{title} (`{f.id}`)"


def _failed_finding(
    first: dict[str, Any], launch: Launch, known: list[Finding], failure_class: Finding | None
) -> Finding:
    """The selftest's one verdict on a failed run: phase, rank, first error, what diagnose knows about it."""
    phase = first.get("phase")
    title = PHASE_TITLES.get(str(phase), str(phase or "startup"))
    rank = first.get("rank")
    where = f"rank {rank}" if rank is not None else "every rank"
    read = Fix(f"read the first error above ({where}, phase {title}) and the full log: {launch.log_path}")
    if known:
        diag_text = f" zerodoctor diagnose on this log: {known[0].title}."
        fixes = known[0].fixes
    elif failure_class is not None:
        diag_text = (
            f" Not in the knowledge base; zerodoctor diagnose names its class: {_class_name(failure_class)}."
        )
        fixes = (*failure_class.fixes[:1], read)
    else:
        diag_text = " zerodoctor diagnose does not know this failure."
        fixes = (read,)
    others = f" Then: {first['others']}." if first.get("others") else ""
    return Finding(
        id="selftest-timeout" if first.get("type") in ("watchdog", "hang") else "selftest-failed",
        severity=Severity.ERROR,
        title=f"Selftest failed in phase '{title}' on {where}",
        message=f"First error: {first.get('type')}: {clip(str(first.get('message')), 900)}.{others}{diag_text}",
        fixes=fixes,
        evidence=(Evidence(file=str(launch.log_path), text=first.get("message")),),
        references=known[0].references if known else (),
        source="selftest",
        data={
            "phase": phase,
            "rank": rank,
            "first_error": first,
            "diagnosis": known[0].id if known else None,
            "failure_class": failure_class.id if failure_class is not None and not known else None,
        },
    )


def judge(
    spec: SelftestSpec, launch: Launch, *, ranks: int, rank_changes: list[Adaptation]
) -> SelftestResult:
    logs = launch.ranks
    init = logs[0].data("distributed-init") if logs else {}
    own_error = next((r for r, e in _own_errors_first(logs) if not is_echo(e)), None)
    stop = stopped_ranks(logs, launch, hung=_hung(launch), first_rank=own_error)
    first = _first_error(logs, launch, stop)
    phases = _phase_results(logs, launch, stop, first)
    checks = _checks(spec, logs, ranks)
    versions = {k: str(init[k]) for k in ("torch", "deepspeed") if init.get(k)}
    backend, accel = init.get("backend"), init.get("accelerator")
    n_ranks = f"{ranks} rank{'s' if ranks != 1 else ''}"
    if backend:
        path = f"{backend} + DeepSpeed {accel} accelerator, {n_ranks} under torchrun"
    else:
        path = f"{n_ranks} under torchrun (stopped before the backend was known)"
    limits = (CPU_LIMITS if accel == "cpu" else GPU_LIMITS) + (ONE_RANK_LIMITS if ranks == 1 else ())
    worker_adapt = [
        Adaptation(a["key"], a["user_value"], a["run_value"], a["why"]) for a in init.get("adaptations", [])
    ]
    adaptations = tuple(spec.adaptations) + tuple(rank_changes) + tuple(worker_adapt)
    findings: list[Finding] = []
    if first is not None:
        known, failure_class = _diagnose(spec, launch, versions)
        findings.append(_failed_finding(first, launch, known, failure_class))
        findings.extend(known)
    findings.extend(_lock_findings(launch))
    findings.extend(_check_findings(spec, checks))
    if accel == "cpu":
        findings.append(
            Finding(
                id="selftest-cpu-path",
                severity=Severity.INFO,
                title="Ran on the CPU path: gloo + DeepSpeed's CPU accelerator",
                message="The same ZeRO code paths ran (partitioning, offload, CPU Adam, clipping, save, reload), but "
                "this path cannot show: " + "; ".join(CPU_LIMITS) + ". Run `zerodoctor selftest` on one GPU "
                "node of the cluster for those.",
                source="selftest",
                references=REFERENCES,
            )
        )
    return SelftestResult(
        findings=tuple(findings),
        phases=tuple(phases),
        checks=tuple(checks),
        path=path,
        limits=limits,
        adaptations=adaptations,
        model=f"{spec.model_family} shrunk to {spec.tiny_params:,} parameters",
        wall_seconds=launch.wall_seconds,
        log_path=str(launch.log_path),
        workdir=str(launch.workdir),
        jit_build_seconds=_jit_seconds(logs),
        versions=versions,
        first_error=first,
    )


def _lock_findings(launch: Launch) -> list[Finding]:
    """A setup phase that hung while an old JIT-build lock file existed: name the file."""
    locks = (launch.watchdog or {}).get("stale_locks") or []
    if not locks:
        return []
    import datetime as _dt

    shown = [
        f"{path} (created {_dt.datetime.fromtimestamp(m, _dt.timezone.utc):%Y-%m-%d %H:%M:%S} UTC)"
        for path, m in locks
    ]
    return [
        Finding(
            id="selftest-stale-jit-lock",
            severity=Severity.ERROR,
            title="DeepSpeed op load waited on a JIT build lock left by a killed build",
            message=(
                f"The ranks hung in phase '{launch.watchdog.get('phase') if launch.watchdog else ''}' while "
                f"these lock files, older than this run, existed: {'; '.join(shown)}. torch's extension builder "
                "waits for such a lock to disappear; a build killed while holding it (a CI timeout, Ctrl-C) "
                "leaves it behind and every later DeepSpeed op load on this machine waits forever."
            ),
            fixes=tuple(
                Fix(
                    "make sure no build is running (no cc1plus / ninja process), then delete the lock file",
                    command=f"rm {path}",
                )
                for path, _m in locks[:3]
            ),
            evidence=tuple(Evidence(file=path) for path, _m in locks[:3]),
            source="selftest",
        )
    ]


def _check_findings(spec: SelftestSpec, checks: list[CheckResult]) -> list[Finding]:
    out = []
    ds_file = spec.ds_file
    for c in checks:
        if c.status != FAILED:
            continue
        fixes: tuple[Fix, ...] = ()
        refs: tuple[str, ...] = ()
        evidence: tuple[Evidence, ...] = ()
        if c.name == "saved-weights":
            from zerodoctor.kb.loader import get_entry
            from zerodoctor.kb.preflight import entry_fixes, entry_references

            entry = get_entry("z3-save-empty-weights")
            key = "zero_optimization.stage3_gather_16bit_weights_on_model_save"
            own = Fix(
                f"set {key}: true" + (f" in {ds_file}" if ds_file else "") + " and save through the engine "
                "(trainer.save_model() / engine.save_16bit_model() on every rank)",
                target="deepspeed",
                patch={key: True},
            )
            fixes = (own, *entry_fixes(entry))
            refs = entry_references(entry)
            evidence = (
                (Evidence(file=ds_file, key=key, text=f"{spec.gather_on_save}".lower()),) if ds_file else ()
            )
        out.append(
            Finding(
                id=f"selftest-{c.name}",
                severity=Severity.ERROR,
                title=f"Selftest check failed: {c.name.replace('-', ' ')}",
                message=c.detail,
                fixes=fixes,
                references=refs,
                evidence=evidence,
                source="selftest",
                data={"check": c.name},
            )
        )
    return out
