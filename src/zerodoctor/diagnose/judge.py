"""Judge the extracted facts against every knowledge-base entry and rank the candidates.

An entry is a candidate when its symptoms match (require_any / require_all / exclude over the signatures
seen anywhere in the logs, the same reading as `kb.matcher`) and none of its conditions is false for the
versions (printed by the log, then `--env`) and setup facts (`--config`); an entry about a failure during a save
or an evaluation that needs a line of it is dropped when the log places the failure in another phase. Its score
adds:
  * the weights of the signatures that hit (message, frame, launcher, warning, context, version lines);
  * +1 per condition known to be true;
  * +1.5 when the phase of its failure fits the entry's phase, -1.5 when it clearly does not;
  * +3 when its evidence is the first failure of the run (in time, then line order), -3 when all its
    evidence is collective trouble (NCCL errors, watchdog aborts) that follows another rank's death: those
    are echoes, and the rank that died first carries the root cause.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from zerodoctor.diagnose import rundir
from zerodoctor.diagnose.classes import PREFIX, FailureClass, classify
from zerodoctor.diagnose.extract import CUT_TRACEBACK, Event, Extractor, Facts, OomNumbers, rank_of_file
from zerodoctor.diagnose.reader import LogLine
from zerodoctor.diagnose.scan import ScanStats, iter_hits
from zerodoctor.diagnose.source import CHUNK_BYTES
from zerodoctor.facts import Tri
from zerodoctor.findings import Evidence, Finding, Fix, Severity
from zerodoctor.kb.loader import load_entries
from zerodoctor.kb.matcher import evaluate_conditions, passes_value_check
from zerodoctor.kb.preflight import entry_fixes, entry_references
from zerodoctor.kb.schema import Entry
from zerodoctor.textutil import clip

NO_KNOWN_FAILURE = "no-known-failure"

# The detected phases that fit each KB entry phase.
_PHASE_FIT: dict[str, frozenset[str]] = {
    "optimizer_step": frozenset({"first_optimizer_step", "training_step"}),
    "checkpoint_save": frozenset({"checkpoint_save"}),
    "forward": frozenset({"training_step", "evaluation", "first_optimizer_step"}),
    "backward": frozenset({"training_step", "first_optimizer_step"}),
    "load": frozenset({"load", "zero_init", "resume"}),
    "init": frozenset({"load", "zero_init", "engine_init"}),
    "config": frozenset({"load", "zero_init", "engine_init"}),
    "install": frozenset({"load", "zero_init", "engine_init"}),
    "resume": frozenset({"resume", "load"}),
    "eval": frozenset({"evaluation"}),
    "data": frozenset({"tokenization", "load", "training_step"}),
}
_ECHO_KINDS = frozenset({"nccl", "watchdog"})
# KB entry phases that name one detected phase: where an entry's error is raised when the log itself does not say
# (entry phases that span several, such as forward or checkpoint_save/eval timeouts, are not guessed)
_ENTRY_PHASE: dict[str, str] = {
    "eval": "evaluation",
    "load": "load",
    "init": "engine_init",
    "resume": "resume",
}
# An entry about a failure *during* a save or an evaluation whose symptoms require a `context` line of it (a
# watchdog timeout while rank 0 saves): the line must still be in progress at the failure, so a phase the log
# places elsewhere (training resumed after the save) rules it out; an unplaced failure keeps it.
_IN_PROGRESS_PHASES = frozenset({"checkpoint_save", "eval"})
_IN_PROGRESS_FIT = frozenset({"checkpoint_save", "evaluation", "unknown"})


def _needs_phase_in_progress(entry: Entry) -> bool:
    kinds = {s.id: s.kind for s in entry.symptoms.signatures}
    return entry.phase in _IN_PROGRESS_PHASES and any(
        kinds.get(sid) == "context" for sid in entry.symptoms.require_all
    )


# Signature kinds that are not a failure on their own: a message a healthy run also prints.
_NOT_FAILURE_KINDS = frozenset({"warning", "context", "version"})
# signature kinds that read a failure's own words (its message, the launcher's report of it), not where it was
_FAILURE_WORDS = frozenset({"message", "launcher"})


def _failure_after(facts: Facts, evidence: Sequence[tuple[int, LogLine, str]]) -> bool:
    """Whether a failure (a rank's own death or collective trouble, not the launcher's teardown) is printed
    after the first of these lines: in the same file later, or in another file (no common clock)."""
    if not evidence:
        return bool(facts.events)
    seq, line, _sig = min(evidence, key=lambda e: e[0])
    return any(
        ev.severity_class <= 1 and (ev.line.source != line.source or ev.seq >= seq) for ev in facts.events
    )


@dataclass
class Candidate:
    entry: Entry
    score: float
    matched: list[str]
    evidence: list[tuple[int, LogLine, str]]
    anchor: Event | None
    conditions: list[tuple[str, str]]
    echo_of: Event | None = None
    notes: list[str] = field(default_factory=list)
    # only warning/context/version signatures matched and no failure follows them: never an `error`
    warning_only: bool = False


@dataclass
class Diagnosis:
    findings: list[Finding]
    first_failure: Event | None
    echoes: list[Event]
    facts: Facts
    stats: ScanStats
    versions: dict[str, str]
    phase: str = "unknown"  # the run's phase at its first failure: the verdict's, the timeline's, the JSON's


def _stamp_seconds(stamp: str | None) -> float | None:
    """A prefix timestamp as seconds since the epoch (ISO or ctime forms), None when it has no date
    (dmesg's seconds since boot) or cannot be read. Different forms are then comparable."""
    if not stamp:
        return None
    for fmt, text in (
        ("%Y-%m-%d %H:%M:%S", stamp[:19].replace("T", " ")),
        ("%a %b %d %H:%M:%S %Y", " ".join(stamp.split())),
    ):
        try:
            return datetime.strptime(text, fmt).timestamp() + _fraction(stamp)
        except ValueError:
            continue
    return None


def _fraction(stamp: str) -> float:
    m = re.match(r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d[.,](\d{1,6})", stamp)
    return float("0." + m.group(1)) if m else 0.0


def first_failure(events: Sequence[Event]) -> Event | None:
    """The earliest event of the most serious class: a rank that died on its own beats the NCCL errors of
    the ranks that waited for it, which beat the launcher tearing the job down. Time decides when every
    candidate carries a dated timestamp (ISO and ctime forms compared as times, not as strings); otherwise log
    order does."""
    if not events:
        return None
    best = min(e.severity_class for e in events)
    pool = [e for e in events if e.severity_class == best]
    stamps = [_stamp_seconds(e.line.timestamp) for e in pool]
    if all(t is not None for t in stamps):
        return min(zip(stamps, pool, strict=True), key=lambda tp: (tp[0], tp[1].seq))[1]
    return min(pool, key=lambda e: e.seq)


def _rank_from_launcher(facts: Facts, first: Event) -> int | None:
    """The rank of a failure printed without a rank prefix, from the launcher's report after it: DeepSpeed's
    `exits with return code = N` (its argv's --local_rank) or torchrun's `failed (exitcode: N) local_rank: R` / its
    summary's global rank. Only when every such report in the same log after it names one and the same rank (one
    process failed); otherwise None."""
    ranks = {
        e.rank
        for e in facts.events
        if e.kind == "exit"
        and e.exit_code not in (None, 0)
        and e.line.source == first.line.source
        and e.seq > first.seq
    }
    return next(iter(ranks)) if len(ranks) == 1 else None


# An exception's message goes on below its line (Ray's ActorDiedError prints its fields and then the cause: `The actor
# is dead because ... Worker exit type: SYSTEM_ERROR ...`; ray/exceptions.py ActorDiedError.__init__): a signature
# line this close below an exception line, with no other failure line between, belongs to that exception.
_MESSAGE_TAIL_LINES = 12


def _event_for(facts: Facts, line: LogLine) -> Event | None:
    above: Event | None = None
    for ev in facts.events:
        if ev.line is line or (ev.line.source == line.source and ev.line.lineno == line.lineno):
            return ev
        if ev.traceback is not None and ev.traceback.contains(line):
            return ev
        if (
            ev.line.source == line.source
            and ev.rank == line.rank
            and 0 < line.lineno - ev.line.lineno <= _MESSAGE_TAIL_LINES
            and (above is None or ev.line.lineno > above.line.lineno)
        ):
            above = ev
    if above is not None and above.kind in ("exception", "cuda-oom"):
        return above
    return None


def _symptoms(entry: Entry, matched: set[str]) -> bool:
    sym = entry.symptoms
    if not sym.signatures:
        return False
    ok = (not sym.require_any or bool(matched & set(sym.require_any))) and set(sym.require_all) <= matched
    return ok and not matched & set(sym.exclude)


def judge(
    facts: Facts,
    stats: ScanStats,
    *,
    versions: Mapping[str, str] | None = None,
    config_facts: Mapping[str, Any] | None = None,
) -> Diagnosis:
    all_versions = {**(versions or {}), **facts.versions}
    cfacts = dict(config_facts or {})
    first = first_failure(facts.events)
    if first is not None and first.phase == "unknown":
        # a launcher line or a bare OOM message has no frames: take the phase of the same incident's traceback
        first.phase = next(
            (e.phase for e in facts.events if e.phase != "unknown" and _same_incident(e, first)), "unknown"
        )
    if first is not None and first.rank is None:
        first.rank = _rank_from_launcher(facts, first)
    oom = _primary_oom(facts, first)
    candidates: list[Candidate] = []
    for entry in load_entries():
        counts = facts.signature_hits.get(entry.id, {})
        lines_of = facts.signature_lines.get(entry.id, {})
        # (a signature whose value re-check fails on every line kept for it does not count: kb.matcher.VALUE_CHECKS)
        matched = {
            sid
            for sid in counts
            if any(passes_value_check(entry.id, sid, ln.text) for _seq, ln in lines_of.get(sid, []))
            or not lines_of.get(sid)
        }
        weights = {s.id: s.weight for s in entry.symptoms.signatures}
        notes: list[str] = []
        is_match = _symptoms(entry, matched)
        if (
            not is_match
            and entry.id == "cuda-oom-fragmentation"
            and oom is not None
            and "cuda-oom" in matched
        ):
            # the old OOM format needs arithmetic (reserved - allocated vs the request), not a regex
            is_match = oom.verdict == "fragmentation"
        elif is_match and entry.id == "cuda-oom-fragmentation" and oom is not None and oom.verdict == "lack":
            # the regexes compare the request with the cache; the message's numbers also say the cache is a sliver
            # of a full device (OomNumbers.verdict): the memory is not there, it is not fragmented
            is_match = False
        if not is_match:
            continue
        cond, results = evaluate_conditions(entry, all_versions, cfacts)
        if cond is Tri.FALSE:
            continue
        n_pkg = len(entry.conditions.packages)
        if (
            n_pkg
            and first is not None
            and first.kind == "cuda-oom"
            and all(r.value is Tri.UNKNOWN for r in results[:n_pkg])
            and not _packages_in_log(entry, facts)
        ):
            # a release's bug claimed for a device OOM (any program's failure, in torch's words) in a log that shows
            # none of the packages whose releases it is about - no version, no frame in them: the claim has nothing
            # to stand on (Second-Me#209: a gradient-checkpointed backward OOM with no DeepSpeed in the log is no
            # DeepSpeed 0.16 regression); the failure class names it
            continue
        kinds = {s.kind for s in entry.symptoms.signatures if s.id in matched}
        if first is not None and first.detail.startswith(CUT_TRACEBACK) and not kinds & _FAILURE_WORDS:
            # the paste ends inside the failing traceback: its frames say where the run raised, not what; an entry
            # that matches only frames (and context) has no failure of its own in the log to stand on
            # (ChatGLM-6B#1166: a cut _save_zero_checkpoint traceback was a file write failure, not the optimizer
            # shards' size)
            continue
        score = sum(weights[s] for s in matched if s in weights)
        score += sum(1.0 for r in results if r.value is Tri.TRUE)
        # keyed: two hits on one CR-separated line share a seq, and LogLines do not order
        evidence = sorted(
            (
                (seq, line, sig)
                for sig, lines in facts.signature_lines.get(entry.id, {}).items()
                for seq, line in lines
            ),
            key=lambda e: (e[0], e[1].text, e[2]),
        )
        strong = [e for e in evidence if weights.get(e[2], 0) > 0] or evidence
        anchor = None
        for _seq, line, _sig in strong:
            anchor = _event_for(facts, line)
            if anchor is not None:
                break
        phase_event = anchor or first
        detected = phase_event.phase if phase_event is not None else facts.end_phase
        if _needs_phase_in_progress(entry) and detected not in _IN_PROGRESS_FIT:
            # its context line (a save, an evaluation) was over before the failure: training had resumed
            continue
        fit = _PHASE_FIT.get(entry.phase)
        if "first-step" in entry.id:  # first-step entries are about the lazy creation of optimizer state
            fit = frozenset({"first_optimizer_step"})
        if fit is not None:
            if detected in fit:
                score += 1.5
                if entry.phase == "optimizer_step" and detected == "first_optimizer_step":
                    score += 0.5
            elif detected != "unknown":
                score -= 1.5
        echo_of: Event | None = None
        if first is not None:
            if anchor is not None and (anchor is first or _same_incident(anchor, first)):
                score += 3.0
            elif (
                anchor is not None
                and anchor.kind in _ECHO_KINDS | {"exception"}
                and (
                    anchor.severity_class > first.severity_class
                    and anchor.seq > first.seq  # echoes come after
                )
            ):
                score -= 3.0
                echo_of = first
            elif (
                anchor is None
                and first.severity_class == 0
                and all((_event_for(facts, line) or first).severity_class > 0 for _s, line, _g in strong)
            ):
                score -= 1.0
        if oom is not None and entry.id == "cuda-oom-fragmentation":
            score += 2.0 if oom.verdict == "fragmentation" else -2.0
        warning_only = kinds <= _NOT_FAILURE_KINDS and not _failure_after(facts, evidence)
        if cond is Tri.UNKNOWN and entry.conditions.packages and not facts.events:
            # nothing failed (no exception, exit, OOM or timeout) and the versions that make these lines a known
            # bug are not known: training metrics such as a loss of 0 also come from the data, so it is a warning
            # until --env / the log's versions confirm the release
            warning_only = True
        candidates.append(
            Candidate(
                entry,
                score,
                sorted(matched),
                evidence,
                anchor,
                [(r.description, r.value.name.lower()) for r in results],
                echo_of,
                notes,
                warning_only,
            )
        )
    candidates += _version_only_candidates(candidates, facts, all_versions, cfacts)
    candidates.sort(key=lambda c: (c.warning_only, -c.score, _severity_rank(c.entry), c.entry.id))
    findings = [_finding(c, first, oom, facts.end_phase, top=i == 0) for i, c in enumerate(candidates)]
    for source in stats.lines:  # (a run directory's file per rank holds that rank's output, hit or not)
        file_rank = rank_of_file(source)
        if file_rank is not None and len(facts.ranks_in_log) < 4096:
            facts.ranks_in_log.add(file_rank)
    fclass = classify(facts, first, oom, all_versions)
    if fclass is not None and findings and findings[0].severity is Severity.ERROR:
        findings[0] = replace(
            findings[0], data={**findings[0].data, "failure_class": {"id": fclass.id, **fclass.data}}
        )
    explained = first is not None and any(
        not c.warning_only
        and (
            (c.anchor is not None and (c.anchor is first or _same_incident(c.anchor, first)))
            or any(
                ln.source == first.line.source and ln.lineno == first.line.lineno for _s, ln, _g in c.evidence
            )
            # a launcher's "exits with return code = 1" only reports a rank's own error: an entry whose failure
            # message came before it in the same log explains it
            or (
                first.kind == "exit"
                and first.exit_code == 1
                and any(
                    ln.source == first.line.source and ln.lineno < first.line.lineno and kind == "message"
                    for kind, ln in _evidence_kinds(c)
                )
            )
        )
        for c in candidates
    )
    if fclass is not None and first is not None and not explained and fclass.severity == "error":
        # entries matched other lines (a warning, a loss pattern) but none explains the run's first failure:
        # the verdict is what happened first, the entries follow as other candidates
        findings.insert(0, _class_finding(fclass, first))
    elif not any(f.severity is Severity.ERROR for f in findings):
        if fclass is not None and first is not None and not any(f.id == fclass.id for f in findings):
            # no entry explains the failure: the class layer still names what happened, first
            findings.insert(0, _class_finding(fclass, first))
        else:
            findings.append(_no_known_failure(facts, first, oom, stats))
    echoes = [e for e in facts.events if first is not None and e is not first and e.severity_class > 0]
    phase = str(findings[0].data.get("phase") or "unknown") if findings else "unknown"
    _one_entry_per_line(facts, findings)
    _progress_at_end(facts, stats)
    return Diagnosis(findings, first, echoes[:50], facts, stats, all_versions, phase)


def _one_entry_per_line(facts: Facts, findings: Sequence[Finding]) -> None:
    """A warning line that a finding quotes is named by that finding's entry in the timeline too (two entries'
    signatures can hit one line: the verdict and the timeline must not name different ones)."""
    named: dict[tuple[str | None, int | None], str] = {}
    for f in findings:
        for ev in f.evidence:
            named.setdefault((ev.file, ev.line), f.id)
    facts.warnings = [(named.get((ln.source, ln.lineno), entry), ln) for entry, ln in facts.warnings]


def _progress_at_end(facts: Facts, stats: ScanStats) -> None:
    """The last progress the log shows (the scan's progress at the end of a single log, past its last hit line):
    `last progress` in the timeline is where the run got to, not the progress before the last matched line."""
    ends = [p for p in stats.end_progress.values() if p is not None]
    if len(stats.end_progress) == 1 and ends:
        end = ends[0]
        if facts.last_progress is None or end.lineno >= facts.last_progress.lineno:
            facts.last_progress = end


def _version_only_candidates(
    found: list[Candidate], facts: Facts, versions: Mapping[str, str], cfacts: Mapping[str, Any]
) -> list[Candidate]:
    """Entries with no log signature (a release's bug known only by its versions, e.g. the transformers 4.44
    quantization regression) are candidates when their versions match and an entry they are related to was
    found in the log: then the versions explain that failure. They rank below entries the log shows."""
    ids = {c.entry.id for c in found}
    out: list[Candidate] = []
    for entry in load_entries():
        if entry.symptoms.signatures or not entry.conditions.packages or entry.id in ids:
            continue
        related = set(entry.related) | {c.entry.id for c in found if entry.id in c.entry.related}
        if not related & ids:
            continue
        cond, results = evaluate_conditions(entry, versions, cfacts)
        n_pkg = len(entry.conditions.packages)
        if cond is Tri.FALSE or not all(r.value is Tri.TRUE for r in results[:n_pkg]):
            continue
        evidence = [(line.lineno, line, "version") for line in facts.version_lines[:MAX_VERSION_EVIDENCE]]
        score = sum(1.0 for r in results if r.value is Tri.TRUE)
        out.append(
            Candidate(
                entry,
                score,
                [],
                evidence,
                None,
                [(r.description, r.value.name.lower()) for r in results],
                None,
                ["matched by versions, with a related failure in the log"],
            )
        )
    return out


MAX_VERSION_EVIDENCE = 5


def _evidence_kinds(c: Candidate) -> list[tuple[str, LogLine]]:
    """(signature kind, line) of a candidate's evidence."""
    kinds = {sig.id: sig.kind for sig in c.entry.symptoms.signatures}
    return [(kinds.get(sig_id, ""), ln) for _s, ln, sig_id in c.evidence]


def _severity_rank(entry: Entry) -> int:
    return {"error": 0, "warning": 1, "info": 2}[entry.severity]


def _packages_in_log(entry: Entry, facts: Facts) -> bool:
    """Whether the log shows any package of the entry's version conditions: a version read, or a traceback frame or
    signature line in its files (`site-packages/deepspeed/...`)."""
    names = {pc.package.lower().replace("-", "_") for pc in entry.conditions.packages}
    if names & {k.lower().replace("-", "_") for k in facts.versions}:
        return True
    paths = [f.file.lower() for tb in facts.tracebacks for f in tb.frames]
    paths += [
        ln.text.lower() for sigs in facts.signature_lines.get(entry.id, {}).values() for _seq, ln in sigs
    ]
    return any(f"/{n}/" in p or f"{n}." in p or f"{n} " in p for n in names for p in paths)


def _same_incident(a: Event, b: Event) -> bool:
    """Two events are one failure when they are the same rank's lines close together (a traceback and its
    OOM message; a torchrun summary naming the same pid)."""
    if a.pid is not None and a.pid == b.pid:
        return True
    if a.line.source != b.line.source or a.rank != b.rank:
        return False
    if a.traceback is not None and a.traceback is b.traceback:
        return True
    return abs(a.line.lineno - b.line.lineno) <= 12 and a.severity_class == b.severity_class


def _primary_oom(facts: Facts, first: Event | None) -> OomNumbers | None:
    if not facts.ooms:
        return None
    if first is not None:
        for o in facts.ooms:
            same_rank = o.line.rank == first.rank or first.rank is None
            if (
                o.line.source == first.line.source
                and same_rank
                and abs(o.line.lineno - first.line.lineno) <= 200
            ):
                return o
    return facts.ooms[0]


def _first_failure_data(ev: Event | None) -> dict[str, Any] | None:
    if ev is None:
        return None
    return {
        "rank": ev.rank,
        "file": ev.line.source,
        "line": ev.line.lineno,
        "kind": ev.kind,
        "text": ev.detail,
        "exit_code": ev.exit_code,
        "phase": ev.phase,
    }


def _phase(c: Candidate, first: Event | None, end_phase: str, *, top: bool = False) -> str:
    """The phase a candidate's failure happened in: for the verdict the first failure's (the same phase in
    every view), else its own failure line's, else where the log ends (a NaN loss or a hang has no failure
    line)."""
    if top and first is not None and first.phase != "unknown" and not c.warning_only:
        return first.phase
    for ev in (c.anchor, first):
        if ev is not None and ev.phase != "unknown":
            return ev.phase
    if end_phase == "unknown" and c.entry.phase in _ENTRY_PHASE and not c.warning_only:
        # the log places the failure nowhere, but the entry knows where its error is raised (e.g. ZeRO inference
        # refused: only evaluate/predict start it; a config value refused: deepspeed.initialize)
        return _ENTRY_PHASE[c.entry.phase]
    return end_phase


def _finding(
    c: Candidate, first: Event | None, oom: OomNumbers | None, end_phase: str = "unknown", *, top: bool = True
) -> Finding:
    entry = c.entry
    # A lower-ranked candidate with no failure line of its own is not "the first failure" (e.g. a config
    # problem seen in the log next to an unrelated crash): do not describe it with that crash.
    # One first failure per run: every view (verdict, timeline, JSON) names `first`. A candidate's own failure
    # line is named separately when it is another incident.
    ev = c.anchor or (first if top else None)
    own = (
        c.anchor is not None and first is not None and (c.anchor is first or _same_incident(c.anchor, first))
    )
    parts: list[str] = []
    if c.warning_only:
        parts.append(
            "A warning, not a failure: no failure follows it in the log, so this is reported as a warning."
        )
    if c.echo_of is not None:
        parts.append(
            f"Probably an echo: {c.echo_of.describe()} failed first; these errors on other ranks follow it."
        )
    elif first is not None and (top or own) and not c.warning_only:
        phase = first.phase.replace("_", " ")
        parts.append(f"First failure: {first.describe()} (phase: {phase}).")
        if c.anchor is not None and not own:
            parts.append(f"This entry's own evidence: {c.anchor.describe()}.")
    elif c.anchor is not None:
        parts.append(f"Its failure line: {c.anchor.describe()} (phase: {c.anchor.phase.replace('_', ' ')}).")
    parts.append(entry.summary.strip())
    true_conds = [d for d, v in c.conditions if v == "true"]
    if true_conds:
        parts.append("Confirmed: " + "; ".join(true_conds) + ".")
    unknown = [d.split(" (have")[0] for d, v in c.conditions if v == "unknown"]
    if unknown:
        parts.append("Not known (give --env / --config to check): " + "; ".join(unknown) + ".")
    if oom is not None and "oom" in entry.id:
        parts.append(oom.explain())
    shown = sorted(
        c.evidence,
        key=lambda e: (
            0 if ev is not None and e[1].lineno == ev.line.lineno and e[1].source == ev.line.source else 1,
            e[0],
        ),
    )
    evidence = tuple(
        Evidence(
            file=line.source,
            line=line.lineno,
            key=sig + (f", rank {line.rank}" if line.rank is not None else ""),
            text=line.text.strip()[:300],
        )
        for _seq, line, sig in shown[:12]
    )
    data: dict[str, Any] = {
        "score": round(c.score, 2),
        "phase": _phase(c, first, end_phase, top=top),
        "first_failure": _first_failure_data(first),
        "matched_signatures": c.matched,
        "conditions": [{"condition": d, "value": v} for d, v in c.conditions],
        "root_cause": entry.root_cause.strip(),
    }
    if c.echo_of is not None:
        data["echo_of"] = _first_failure_data(c.echo_of)
    if oom is not None and "oom" in entry.id:
        data["oom"] = oom.to_dict()
    severity = Severity.parse(entry.severity)
    if c.warning_only and severity is Severity.ERROR:
        severity = Severity.WARNING
    data["warning_only"] = c.warning_only
    return Finding(
        id=entry.id,
        severity=severity,
        title=entry.title,
        message=" ".join(parts),
        fixes=entry_fixes(entry, c.matched),
        evidence=evidence,
        references=entry_references(entry),
        source="diagnose",
        confidence=min(max(c.score / 10.0, 0.0), 1.0),
        data=data,
    )


def _class_finding(fc: FailureClass, first: Event) -> Finding:
    data: dict[str, Any] = {
        "phase": first.phase,
        "first_failure": _first_failure_data(first),
        "failure_class": {"id": fc.id, **fc.data},
        "proves": fc.proves,
        "does_not_prove": fc.does_not_prove,
    }
    return Finding(
        id=fc.id,
        severity=Severity.parse(fc.severity),
        title=fc.title + " (not in the knowledge base)",
        message=f"First failure: {first.describe()} (phase: {first.phase.replace('_', ' ')}). "
        + fc.message(),
        fixes=(Fix(text=fc.next_step[:1].upper() + fc.next_step[1:]),),
        evidence=(
            Evidence(file=first.line.source, line=first.line.lineno, text=first.line.text.strip()[:300]),
        ),
        source="diagnose",
        confidence=0.5,
        data=data,
    )


# A log that stops within this many lines of the distributed set-up's last line "ends right after" it
_INIT_TAIL_LINES = 40


def _stalled(facts: Facts, stats: ScanStats | None) -> Finding | None:
    """A log with no failure whose progress bar stops short of its total, and whose text then says the run stopped
    moving (`it stuck here`, `hangs at 96%`): a hang, named as far as the log shows it - where progress stopped,
    not which collective or rank (no watchdog line, no stack)."""
    said = facts.said_stalled
    if said is None or stats is None or len(stats.end_progress) != 1:
        return None
    end = next(iter(stats.end_progress.values()))
    if end is None or end.step is None or not end.total or end.step >= end.total or end.lineno > said.lineno:
        return None
    pct = round(100 * end.step / end.total)  # (as tqdm prints it: `{percentage:3.0f}%`)
    where = f"{said.source}:{end.lineno}"
    proves = (
        f"progress stops at {end.step}/{end.total} ({pct} %, {where}) and no failure, traceback or exit is printed; "
        f"the text after it says the run stopped moving ({said.location()}: {clip(said.text.strip(), 160)})."
    )
    return Finding(
        id=PREFIX + "collective-timeout",
        severity=Severity.WARNING,
        title=f"Hang: progress stopped at {end.step}/{end.total} ({pct} %) with no failure line (not in the knowledge base)",
        message=(
            f"The log proves: {proves} It does not prove: which collective or rank the processes wait in (no NCCL "
            "watchdog line, no stack dump), nor that they wait at all rather than compute slowly. Next: dump every "
            "rank's stack while it hangs (py-spy dump --pid) and compare where they are - a rank in other code (a "
            "save or evaluation on rank 0 only, a dataloader) is the straggler; run with NCCL_DEBUG=INFO and "
            "TORCH_DISTRIBUTED_DEBUG=DETAIL, and a shorter NCCL timeout so the watchdog names the collective."
        ),
        fixes=(
            Fix(
                text="Dump every rank's stack while it hangs (py-spy dump --pid) and compare where they are."
            ),
        ),
        evidence=(Evidence(file=said.source, line=said.lineno, text=said.text.strip()[:300]),),
        source="diagnose",
        confidence=0.3,
        data={
            "phase": facts.end_phase,
            "first_failure": None,
            "failure_class": {
                "id": PREFIX + "collective-timeout",
                "last_progress": f"{end.step}/{end.total}",
                "line": where,
                "said": said.location(),
            },
        },
    )


def _no_known_failure(
    facts: Facts, first: Event | None, oom: OomNumbers | None, stats: ScanStats | None = None
) -> Finding:
    last_exc = next((e for e in reversed(facts.events) if e.kind in ("exception", "cuda-oom")), None)
    shown = first or last_exc
    init = facts.ends_after_init
    end = stats.end_progress.get(init.source) if stats is not None and init is not None else None
    if (
        shown is None
        and init is not None
        and stats is not None
        and 0 <= stats.lines.get(init.source, 0) - init.lineno <= _INIT_TAIL_LINES
        and (end is None or end.lineno < init.lineno)
    ):
        # what the log proves and what not: nothing failed in it, and it stops right after the set-up
        msg = (
            f"No error in the log. It ends right after the distributed set-up ({init.location()}: "
            f"{clip(init.text.strip(), 160)}): no training step, phase or failure is printed after it. If the run "
            "stopped printing there, the ranks are waiting for each other in their first collective (a rank that "
            "did not start or crashed without output, a network interface NCCL cannot use between nodes); the log "
            "does not prove that: a paste or a log read while the run is starting ends the same way. Next: run with "
            "NCCL_DEBUG=INFO and TORCH_DISTRIBUTED_DEBUG=DETAIL, and check every rank's own log."
        )
        return Finding(
            id=NO_KNOWN_FAILURE,
            severity=Severity.INFO,
            title="No failure in the log: it ends right after the distributed set-up",
            message=msg,
            evidence=(Evidence(file=init.source, line=init.lineno, text=init.text.strip()[:300]),),
            source="diagnose",
            data={"phase": "unknown", "first_failure": None, "ends_after_init": init.location()},
        )
    stalled = _stalled(facts, stats) if shown is None else None
    if stalled is not None:
        return stalled
    if shown is None:
        msg = "No known failure and no error found in the log."
    else:
        msg = "No known failure matches. " + (
            f"First failure: {first.describe()}." if first is not None else ""
        )
        if last_exc is not None and last_exc is not first:
            msg += f" Last error: {last_exc.describe()}."
        if oom is not None:
            msg += " " + oom.explain()
    data: dict[str, Any] = {
        "phase": shown.phase if shown is not None else facts.end_phase,
        "first_failure": _first_failure_data(first),
    }
    if last_exc is not None:
        data["last_error"] = _first_failure_data(last_exc)
    if oom is not None:
        data["oom"] = oom.to_dict()
    ev = (
        (Evidence(file=shown.line.source, line=shown.line.lineno, text=shown.line.text.strip()[:300]),)
        if shown is not None
        else ()
    )
    return Finding(
        id=NO_KNOWN_FAILURE,
        severity=Severity.INFO,
        title="No known failure found in the log" if first is None else "Failure not in the knowledge base",
        message=msg,
        evidence=ev,
        source="diagnose",
        data=data,
    )


def diagnose(
    paths: Sequence[str],
    *,
    versions: Mapping[str, str] | None = None,
    config_facts: Mapping[str, Any] | None = None,
    chunk_bytes: int = CHUNK_BYTES,
) -> Diagnosis:
    """Read the logs once and judge them: the library entry point of `zerodoctor diagnose`."""
    extractor = Extractor()
    stats = ScanStats()
    for hit in iter_hits(paths, stats, chunk_bytes=chunk_bytes):
        extractor.feed(hit)
    result = judge(extractor.finish(stats.end_progress), stats, versions=versions, config_facts=config_facts)
    result.findings = rundir.with_hang_findings(result.findings, list(paths))  # the guard's stack dumps
    return result
