"""Read what the runtime guard recorded in RUN_DIR/zerodoctor/ and judge it across ranks: the data behind
`zerodoctor report` (HTML + PNGs in `run_html`/`plots`, JSON through `report.render.envelope`).

The reader is tolerant of what a dying job leaves: a truncated last line is skipped and counted, a rank
without a file is reported as missing, never a traceback.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from statistics import median
from typing import Any

from zerodoctor.errors import InputError
from zerodoctor.findings import Evidence, Finding, Fix, Severity
from zerodoctor.safeio import read_bytes, shown
from zerodoctor.textutil import clip

GIB = 1 << 30
MIB = 1 << 20
SPIKE_PHASES = frozenset({"first_optimizer_step", "evaluation", "save"})
OUTLIER_RATIO = 1.10
OUTLIER_MIN_BYTES = 512 * MIB


@dataclass(frozen=True)
class RankData:
    rank: int
    host: str
    local_rank: int
    samples: tuple[dict[str, Any], ...]
    events: tuple[dict[str, Any], ...]
    meta: dict[str, Any]
    records: int
    bad_lines: int

    def series(self, key: str) -> tuple[list[int], list[float]]:
        xs, ys = [], []
        for s in self.samples:
            if key in s and s[key] is not None:
                xs.append(int(s.get("step", 0)))
                ys.append(float(s[key]))
        return xs, ys

    def has(self, key: str) -> bool:
        return any(key in s for s in self.samples)

    def peak(self, key: str) -> float | None:
        vals = [float(s[key]) for s in self.samples if s.get(key) is not None]
        return max(vals) if vals else None


@dataclass(frozen=True)
class NodeData:
    host: str
    measure: str
    steps: tuple[int, ...]
    used: tuple[int, ...]
    limit: int | None
    projection: dict[str, Any] | None


@dataclass(frozen=True)
class RunReport:
    run_dir: str
    ranks: tuple[RankData, ...]
    nodes: tuple[NodeData, ...]
    findings: tuple[Finding, ...]
    prediction: dict[str, Any] | None
    gaps: tuple[dict[str, Any], ...]
    errors: tuple[dict[str, Any], ...]
    stacks: tuple[dict[str, Any], ...]
    placements: tuple[dict[str, Any], ...]
    notes: tuple[str, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def has_gpu(self) -> bool:
        return any(r.has("gpu_allocated") for r in self.ranks)

    @property
    def outliers(self) -> tuple[int, ...]:
        return tuple(sorted({int(f.data["rank"]) for f in self.findings if f.id == "report.outlier-rank"}))

    def markers(self) -> dict[str, list[int]]:
        """Steps of the run's events (from rank 0, or the lowest rank present)."""
        r = self.ranks[0]
        out: dict[str, list[int]] = {
            "save": [],
            "evaluation": [],
            "epoch": [],
            "first_optimizer_step": [],
            "exception": [],
        }
        for e in r.events:
            name, step = e.get("event"), int(e.get("step", 0))
            if name == "save_begin":
                out["save"].append(step)
            elif name == "evaluation_begin":
                out["evaluation"].append(step)
            elif name == "epoch_end":
                out["epoch"].append(step)
            elif name == "first_optimizer_step":
                out["first_optimizer_step"].append(step)
            elif name == "exception":
                out["exception"].append(step)
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_dir": self.run_dir,
            "has_gpu": self.has_gpu,
            "ranks": [
                {
                    "rank": r.rank,
                    "host": r.host,
                    "local_rank": r.local_rank,
                    "records": r.records,
                    "bad_lines": r.bad_lines,
                    "not_available": r.meta.get("not_available", []),
                    "versions": r.meta.get("versions", {}),
                    "samples": list(r.samples),
                    "events": list(r.events),
                }
                for r in self.ranks
            ],
            "nodes": [
                {
                    "host": n.host,
                    "measure": n.measure,
                    "steps": list(n.steps),
                    "used": list(n.used),
                    "limit": n.limit,
                    "projection": n.projection,
                }
                for n in self.nodes
            ],
            "markers": self.markers(),
            "outlier_ranks": list(self.outliers),
            "prediction": self.prediction,
            "gaps": list(self.gaps),
            "errors": list(self.errors),
            "stacks": list(self.stacks),
            "placements": list(self.placements),
            "notes": list(self.notes),
        }


_RANK_FILE = re.compile(r"^rank(\d+)\.jsonl$")
MAX_RECORD_FILE_BYTES = 1 << 30  # one sample per step is under 1 KB: a million steps
MAX_RECORD_NUMBER = 1 << 62  # bytes, steps, seconds: anything larger is not a measurement
MAX_RANKS = 1 << 17  # as diagnose.rundir.MAX_WORLD_SIZE
MAX_ERROR_FILE_BYTES = 4 << 20
# the numbers guard.probes and guard.monitor write (gpu_name / gpu_uuid are text); a sample omits what it
# could not read, so a null there is not the guard's
_NUMERIC = frozenset(
    {"t", "step", "optimizer_step", "seconds", "rank", "local_rank", "world_size"}
    | {"gpu_" + k for k in ("allocated", "allocated_peak", "reserved", "reserved_peak", "active")}
    | {"gpu_" + k for k in ("active_peak", "alloc_retries", "ooms", "free", "total", "non_pytorch")}
    | {"rss", "rss_hwm", "node_used", "node_total", "cgroup_usage", "cgroup_limit", "cgroup_oom_kills"}
)


def _unusable(rec: dict[str, Any]) -> str | None:
    """Why a guard record cannot be used (a value the guard never writes), or None. The guard writes finite
    numbers (or null) for its counters and sizes, and a meta record's world_size / local_rank are counts: a
    NaN, an infinity, a string, a 5,000-digit number there would make every chart and sum after it wrong."""
    for key, value in rec.items():
        if key in _NUMERIC:
            if value is None and rec.get("kind") != "sample" and key not in ("world_size", "local_rank"):
                continue
            if isinstance(value, bool) or not isinstance(value, int | float):
                return f"{key}: {shown(repr(value), 40)} is not a number"
            if not math.isfinite(value) or abs(value) > MAX_RECORD_NUMBER:
                return f"{key}: {shown(repr(value), 40)} is not a finite measurement"
            lowest = 1 if key == "world_size" else 0
            if key in ("world_size", "local_rank", "rank") and (
                not float(value).is_integer() or not lowest <= value <= MAX_RANKS
            ):
                return f"{key}: {value!r} is not a rank count or index"
    for key in ("phase", "event", "host"):
        if rec.get(key) is not None and not isinstance(rec[key], str):
            return f"{key}: {shown(repr(rec[key]), 40)} is not a name"
    pred = rec.get("ranks_per_node")
    if pred is not None and (
        not isinstance(pred, int) or isinstance(pred, bool) or not 0 < pred <= MAX_RANKS
    ):
        return f"ranks_per_node: {shown(repr(pred), 40)} is not a rank count"
    return _bad_nested_number(rec)


def _bad_nested_number(value: Any, depth: int = 0) -> str | None:
    """A non-finite or huge number anywhere in a record (predictions keep their numbers in nested dicts)."""
    if isinstance(value, float | int) and not isinstance(value, bool):
        if isinstance(value, float) and not math.isfinite(value) or abs(value) > MAX_RECORD_NUMBER:
            return f"{shown(repr(value), 40)} is not a finite measurement"
    elif isinstance(value, dict | list) and depth < 32:
        for v in value.values() if isinstance(value, dict) else value:
            problem = _bad_nested_number(v, depth + 1)
            if problem:
                return problem
    return None


def guard_folder(run_dir: Path) -> Path:
    d = run_dir / "zerodoctor"
    if run_dir.name == "zerodoctor" and not d.is_dir():
        d = run_dir
    if not d.is_dir():
        raise InputError(
            str(run_dir),
            "no zerodoctor/ folder with guard records here",
            hint="pass the run's output directory (where ZeroDoctorCallback or `zerodoctor guard` wrote)",
        )
    return d


def load_run(run_dir: str | Path) -> RunReport:
    """Read and judge one run directory; raises InputError (one line) when there is nothing to read."""
    root = Path(run_dir)
    if not root.exists():
        raise InputError(str(root), "no such directory", hint="pass the run's output directory")
    d = guard_folder(root)
    files = sorted((int(m.group(1)), p) for p in d.iterdir() if (m := _RANK_FILE.match(p.name)))
    if not files:
        raise InputError(str(d), "no rank*.jsonl guard records", hint="was the guard active in this run?")
    ranks: list[RankData] = []
    notes: list[str] = []
    predictions: list[dict[str, Any]] = []
    gaps: list[dict[str, Any]] = []
    placements: list[dict[str, Any]] = []
    raw_findings: list[tuple[int, dict[str, Any]]] = []
    for rank, path in files:
        samples, events, bad, n = [], [], 0, 0
        meta: dict[str, Any] = {}
        raw = read_bytes(path, limit=MAX_RECORD_FILE_BYTES, what="a guard record file")
        unusable: list[str] = []
        for number, line in enumerate(raw.decode("utf-8", errors="replace").splitlines(), 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except (ValueError, RecursionError):  # ValueError: also a number of more than 4,300 digits
                bad += 1
                continue
            if not isinstance(rec, dict):
                bad += 1
                continue
            problem = _unusable(rec)
            if problem:
                bad += 1
                unusable.append(f"line {number}: {problem}")
                continue
            n += 1
            kind = rec.get("kind")
            if kind == "sample":
                samples.append(rec)
            elif kind == "event":
                events.append(rec)
            elif kind == "meta" and not meta:
                meta = rec
            elif kind == "finding" and isinstance(rec.get("finding"), dict):
                raw_findings.append((rank, rec["finding"]))
            elif kind == "prediction":
                predictions.append(rec)
            elif kind == "gap":
                gaps.append(rec)
            elif kind == "placement":
                placements.append(rec)
            elif kind == "guard_error":
                notes.append(
                    f"rank {rank}: the guard's own error in {rec.get('where')} was ignored: {rec.get('error')}"
                )
        if bad > len(unusable):
            notes.append(
                f"{path.name}: {bad - len(unusable)} unreadable line(s) skipped (a rank killed mid-write "
                "leaves one)"
            )
        if unusable:
            notes.append(
                f"{path.name}: {len(unusable)} record(s) with values no guard writes skipped ({unusable[0]})"
            )
        ranks.append(
            RankData(
                rank,
                str(meta.get("host", "?")),
                int(meta.get("local_rank", rank)),
                tuple(samples),
                tuple(events),
                meta,
                n,
                bad,
            )
        )
    world = max((int(r.meta.get("world_size", 1)) for r in ranks), default=1)
    missing = sorted(set(range(world)) - {r.rank for r in ranks})
    if missing:
        notes.append(f"no guard records from rank(s) {missing} of {world}")
    errors = tuple(_read_errors(d))
    stacks = tuple(_read_stacks(d, [r.rank for r in ranks]))
    nodes = tuple(_nodes(ranks))
    findings = _guard_findings(raw_findings)
    findings += _judge(ranks, nodes, errors, stacks)
    return RunReport(
        run_dir=str(root),
        ranks=tuple(ranks),
        nodes=nodes,
        findings=tuple(findings),
        prediction=next(
            (p for p in predictions if p.get("rank") == 0), predictions[0] if predictions else None
        ),
        gaps=tuple(gaps),
        errors=errors,
        stacks=stacks,
        placements=tuple(placements),
        notes=tuple(notes),
    )


def _finding_from_dict(d: dict[str, Any], rank: int) -> Finding:
    try:
        sev = Severity.parse(str(d.get("severity", "info")))
    except ValueError:
        sev = Severity.INFO

    def items(key: str) -> list[Any]:  # a list the guard wrote; anything else (a damaged record) is none
        value = d.get(key)
        return value if isinstance(value, list) else []

    def evidence(e: dict[str, Any]) -> Evidence:
        kept = {k: e[k] for k in ("file", "key", "text") if isinstance(e.get(k), str)}
        kept.update({k: e[k] for k in ("line", "column") if type(e.get(k)) is int and 0 < e[k] < 1 << 31})
        return Evidence(**kept)

    data = d.get("data")
    return Finding(
        id=str(d.get("id", "guard.unknown")),
        severity=sev,
        title=str(d.get("title", "")),
        message=f"rank {rank}: {d.get('message', '')}",
        fixes=tuple(Fix(str(t)) for t in items("fixes")),
        evidence=tuple(evidence(e) for e in items("evidence") if isinstance(e, dict)),
        references=tuple(str(r) for r in items("references")),
        source=str(d.get("source", "guard")),
        data={**(data if isinstance(data, dict) else {}), "rank": rank},
    )


def _guard_findings(raw: list[tuple[int, dict[str, Any]]]) -> list[Finding]:
    """Guard findings of all ranks; one per (id, rank), and rank-independent ones (step count, lint) once."""
    out: list[Finding] = []
    seen: set[tuple[str, int | None]] = set()
    for rank, d in raw:
        fid = str(d.get("id"))
        per_rank = fid.startswith("guard.") and fid not in ("guard.max-steps-below-epoch",)
        key = (fid, rank if per_rank else None)
        if key in seen:
            continue
        seen.add(key)
        out.append(_finding_from_dict(d, rank))
    return out


def _read_errors(d: Path) -> list[dict[str, Any]]:
    out = []
    for p in sorted(d.glob("error-rank*.json")):
        try:
            rec = json.loads(read_bytes(p, limit=MAX_ERROR_FILE_BYTES, what="an error file"))
        except (InputError, ValueError, RecursionError):  # unreadable or damaged: the rank files still count
            continue
        if isinstance(rec, dict):
            rec = {k: v for k, v in rec.items() if k != "traceback"}
            rec["file"] = p.name
            out.append(rec)
    return out


def _read_stacks(d: Path, ranks: list[int]) -> list[dict[str, Any]]:
    """Which ranks' watchdogs fired and where each one's main thread stood in its last dump (innermost first):
    the same reading `zerodoctor diagnose RUN_DIR` merges (`diagnose.rundir.read_rank_stacks`)."""
    from zerodoctor.diagnose.rundir import read_rank_stacks

    wanted = set(ranks)
    return [
        {
            "rank": s.rank,
            "file": Path(s.path).name,
            "dumps": s.dumps,
            "top_frames": [f"{f.func} ({Path(f.file).name}:{f.line})" for f in s.frames[:6]],
        }
        for s in read_rank_stacks(d)
        if s.rank in wanted
    ]


def _nodes(ranks: list[RankData]) -> list[NodeData]:
    """Host RAM per node: the cgroup when it has a limit (read from the lowest local rank of each host); else
    the job's own RSS (the sum over the node's ranks, step by step) against what the node had free for it,
    since node memory also counts other processes on a shared machine. The projection fits the samples
    outside spike phases (first optimizer step, evaluation, save)."""
    by_host: dict[str, list[RankData]] = {}
    for r in sorted(ranks, key=lambda r: (r.local_rank, r.rank)):
        by_host.setdefault(r.host, []).append(r)
    out = []
    for host, on_host in by_host.items():
        r = on_host[0]
        cg = [s for s in r.samples if "cgroup_limit" in s and "cgroup_usage" in s]
        if cg:
            pts = [(int(s["step"]), int(s["cgroup_usage"]), s.get("phase"), s.get("t")) for s in cg]
            limit: int | None = int(cg[-1]["cgroup_limit"])
            measure = "cgroup"
        else:
            pts, limit = _job_rss(on_host)
            measure = "job RSS"
        steps = max((int(s.get("step", 0)) for s in r.samples), default=0)
        out.append(
            NodeData(
                host,
                measure,
                tuple(p[0] for p in pts),
                tuple(p[1] for p in pts),
                limit,
                _project(pts, limit, steps),
            )
        )
    return out


def _job_rss(on_host: list[RankData]) -> tuple[list[tuple[int, int, Any, Any]], int | None]:
    """The job's RSS on one host per sample of its lowest local rank (each other rank's latest RSS at or before
    that step added), and the limit it can grow to: its last RSS plus what the node still had free."""
    first, others = on_host[0], on_host[1:]
    latest: list[dict[int, int]] = []
    for o in others:
        by_step: dict[int, int] = {}
        for s in o.samples:
            if "rss" in s:
                by_step[int(s.get("step", 0))] = int(s["rss"])
        latest.append(by_step)
    pts: list[tuple[int, int, Any, Any]] = []
    for s in first.samples:
        if "rss" not in s:
            continue
        step = int(s.get("step", 0))
        total = int(s["rss"])
        for by_step in latest:
            before = [v for k, v in by_step.items() if k <= step]
            total += before[-1] if before else 0
        pts.append((step, total, s.get("phase"), s.get("t")))
    last = next((s for s in reversed(first.samples) if "node_used" in s and "node_total" in s), None)
    if not pts or last is None:
        return pts, None
    return pts, pts[-1][1] + max(int(last["node_total"]) - int(last["node_used"]), 0)


# A trend needs enough calm steps, over enough of the run, to be one (a 4-step job is warm-up, not a trend);
# the same 64 MiB minimum growth the live guard uses (guard.options.GuardOptions.trend_min_growth_bytes).
PROJECTION_MIN_CALM_STEPS = 20
PROJECTION_MIN_RUN_SHARE = 0.25
PROJECTION_MIN_GROWTH = 64 * MIB


def _project(
    pts: list[tuple[int, int, Any, Any]], limit: int | None, run_steps: int | None = None
) -> dict[str, Any] | None:
    """A straight line through the calm samples of the last up to 60 steps, with how far to trust it:
    None when there are fewer than PROJECTION_MIN_CALM_STEPS calm steps or they cover less than
    PROJECTION_MIN_RUN_SHARE of the steps recorded; `confidence` is "high" (R^2 >= 0.9 over 50+ steps), "medium"
    (R^2 >= 0.6) or "low", from the fit's R^2 and the number of steps."""
    calm_all = [p for p in pts if p[2] not in SPIKE_PHASES]
    distinct = sorted({p[0] for p in calm_all})[-60:]
    if limit is None or len(distinct) < PROJECTION_MIN_CALM_STEPS:
        return None
    calm = [p for p in calm_all if p[0] >= distinct[0]]
    total_steps = max(run_steps or 0, max(p[0] for p in pts))
    if total_steps and (distinct[-1] - distinct[0] + 1) / total_steps < PROJECTION_MIN_RUN_SHARE:
        return None
    xs = [p[0] for p in calm]
    ys = [p[1] for p in calm]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mx) ** 2 for x in xs)
    if var == 0:
        return None
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var
    ss_tot = sum((y - my) ** 2 for y in ys)
    ss_res = sum((y - (my + slope * (x - mx))) ** 2 for x, y in zip(xs, ys, strict=True))
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else 0.0
    confidence = "high" if r2 >= 0.9 and len(distinct) >= 50 else "medium" if r2 >= 0.6 else "low"
    fit = {"calm_steps": len(distinct), "r2": round(r2, 3), "confidence": confidence}
    growth = slope * (xs[-1] - xs[0])
    if slope <= 0 or growth < PROJECTION_MIN_GROWTH:
        return {"slope_bytes_per_step": slope, "exhaustion_step": None, **fit}
    last_x, last_y = xs[-1], my + slope * (xs[-1] - mx)
    step = round(last_x + (limit - last_y) / slope)
    out: dict[str, Any] = {
        "slope_bytes_per_step": slope,
        "exhaustion_step": step,
        "from_step": last_x,
        "from_bytes": int(last_y),
        **fit,
    }
    ts = [p[3] for p in calm]
    if all(isinstance(t, int | float) for t in ts) and ts[-1] > ts[0]:
        sec_per_step = (ts[-1] - ts[0]) / max(xs[-1] - xs[0], 1)
        out["exhaustion_in_s"] = (step - last_x) * sec_per_step
    return out


def _judge(
    ranks: list[RankData],
    nodes: tuple[NodeData, ...],
    errors: tuple[dict[str, Any], ...],
    stacks: tuple[dict[str, Any], ...],
) -> list[Finding]:
    out: list[Finding] = []
    out += _outliers(ranks)
    out += _fragmentation(ranks)
    for e in errors:
        raw_diag = e.get("diagnosis")
        diag: dict[str, Any] = raw_diag if isinstance(raw_diag, dict) else {}
        diag_fixes = diag["fixes"] if isinstance(diag.get("fixes"), list) else []
        diag_refs = diag["references"] if isinstance(diag.get("references"), list) else []
        out.append(
            Finding(
                id="report.rank-failed",
                severity=Severity.ERROR,
                title=f"rank {e.get('rank')} failed",
                message=(
                    f"rank {e.get('rank')} on {e.get('host')} raised {e.get('type')} at step {e.get('step')} "
                    f"({e.get('phase')}, {e.get('time')}): {clip(str(e.get('message', '')), 300).rstrip('.')}"
                    + (f". Diagnosis: {diag.get('title')}: {diag.get('message')}" if diag else "")
                ),
                fixes=tuple(Fix(str(t)) for t in diag_fixes),
                evidence=(Evidence(file=str(e.get("file")), text=clip(str(e.get("message", "")), 300)),),
                references=tuple(str(r) for r in diag_refs),
                source="report",
                data={"rank": e.get("rank"), "diagnosis": diag.get("id")},
            )
        )
    if stacks:
        fired = sorted(s["rank"] for s in stacks)
        quiet = sorted({r.rank for r in ranks} - set(fired))
        where = "; ".join(
            f"rank {s['rank']}: {' <- '.join(s['top_frames'][:3]) or 'no frames'}" for s in stacks
        )
        out.append(
            Finding(
                id="report.hang-stacks",
                severity=Severity.WARNING,
                title="the hang watchdog dumped stacks",
                message=(
                    f"rank(s) {fired} did not reach the next step boundary in time and dumped their stacks ({where})"
                    + (
                        f"; rank(s) {quiet} did not dump: they were not stuck, or never reached that point"
                        if quiet
                        else ""
                    )
                ),
                fixes=(
                    Fix(
                        "the ranks stuck in a collective wait for the ranks that are elsewhere: read the stacks of "
                        "the ranks that are not in a collective first (stacks-rank*.txt in the guard folder)"
                    ),
                    Fix(
                        "a rank that never dumped either finished its step or died: check its error file and log"
                    ),
                ),
                evidence=tuple(Evidence(file=s["file"], text=(s["top_frames"] or ["?"])[0]) for s in stacks),
                source="report",
                data={"ranks_dumped": fired, "ranks_quiet": quiet},
            )
        )
    for n in nodes:
        pr = n.projection
        if pr and pr.get("exhaustion_step") is not None and n.limit and pr.get("confidence") != "low":
            secs = pr.get("exhaustion_in_s")
            if secs is not None and secs < 2 * 3600:
                out.append(
                    Finding(
                        id="report.host-ram-projection",
                        severity=Severity.WARNING,
                        title=f"host RAM on {n.host} heads for the limit",
                        message=(
                            f"{'the job cgroup' if n.measure == 'cgroup' else 'the job RSS'} on {n.host} grows {pr['slope_bytes_per_step'] / MIB:.1f} MiB per step "
                            f"outside spike phases; at this rate it reaches the {n.limit / GIB:.1f} GiB limit at about "
                            f"step {pr['exhaustion_step']} ({secs / 60:.0f} min after the last sample); "
                            f"confidence {pr['confidence']}: a straight line through {pr['calm_steps']} calm steps, "
                            f"R^2 {pr['r2']:.2f}"
                        ),
                        fixes=(
                            Fix(
                                "find what grows between steps (see the guard's host-ram-trend finding), or raise the "
                                "job's memory limit"
                            ),
                        ),
                        source="report",
                        data={"host": n.host, **pr},
                    )
                )
    return out


def _outliers(ranks: list[RankData]) -> list[Finding]:
    key = "gpu_reserved_peak" if any(r.has("gpu_reserved_peak") for r in ranks) else "rss"
    peaks = {r.rank: r.peak(key) for r in ranks}
    vals = [v for v in peaks.values() if v is not None]
    if len(vals) < 2:
        return []
    med = median(vals)
    out = []
    for rank, v in peaks.items():
        if v is not None and v > med * OUTLIER_RATIO and v - med > OUTLIER_MIN_BYTES:
            out.append(
                Finding(
                    id="report.outlier-rank",
                    severity=Severity.WARNING,
                    title=f"rank {rank} uses more memory than the others",
                    message=(
                        f"rank {rank} peaked at {v / GIB:.2f} GiB {key.replace('_', ' ')}, the median rank at "
                        f"{med / GIB:.2f} GiB; under ZeRO every rank should hold about the same (uneven batches, "
                        "a rank that also does logging/eval work, or replicated weights: QLoRA skips zero.Init)"
                    ),
                    fixes=(
                        Fix(
                            "compare the rank's samples around its peak step in the report; check for rank-0-only "
                            "work and for weights loaded outside zero.Init"
                        ),
                    ),
                    source="report",
                    data={"rank": rank, "metric": key, "peak": v, "median": med},
                )
            )
    return out


def _fragmentation(ranks: list[RankData]) -> list[Finding]:
    out = []
    for r in ranks:
        if not r.has("gpu_reserved"):
            continue
        worst = max(r.samples, key=lambda s: s.get("gpu_reserved", 0) - s.get("gpu_allocated", 0))
        gap = worst.get("gpu_reserved", 0) - worst.get("gpu_allocated", 0)
        retries = max(int(s.get("gpu_alloc_retries", 0)) for s in r.samples)
        if retries > 0 or (gap > GIB and gap > 0.2 * worst.get("gpu_reserved", 1)):
            out.append(
                Finding(
                    id="report.fragmentation",
                    severity=Severity.WARNING,
                    title=f"rank {r.rank}: the caching allocator is fragmented",
                    message=(
                        f"up to {gap / GIB:.2f} GiB reserved but not allocated (step {worst.get('step')}) and "
                        f"{retries} allocator retries (cudaMalloc failed, cache flushed, retried)"
                    ),
                    fixes=(
                        Fix("set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"),
                        Fix(
                            "lower ZeRO-3 prefetch/bucket sizes (stage3_prefetch_bucket_size, reduce_bucket_size)"
                        ),
                    ),
                    source="report",
                    data={"rank": r.rank, "gap": gap, "retries": retries},
                )
            )
    return out
