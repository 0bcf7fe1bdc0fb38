"""Render a `Diagnosis` (from `zerodoctor.diagnose`): the JSON document, the text report and markdown.

The timeline (first failure, phase, echoes, warnings that matter, last progress, versions) is built once here
from the Diagnosis, so every format shows the same first failure and the same phase as the verdict.
"""

from __future__ import annotations

from typing import Any

from zerodoctor.diagnose.judge import Diagnosis
from zerodoctor.report.render import envelope, render_markdown, render_text, to_json
from zerodoctor.textutil import clip

MAX_ECHOES = 20
MAX_TEXT_LINES = 10


def timeline(result: Diagnosis) -> dict[str, Any]:
    """What happened, in order: the run's one first failure and its phase, the echoes, the warnings."""
    ff = result.first_failure
    lp = result.facts.last_progress
    return {
        "first_failure": None if ff is None else ff.describe(),
        "phase": None if ff is None and result.phase == "unknown" else result.phase,
        "echoes": [e.describe() for e in result.echoes[:MAX_ECHOES]],
        "warnings": [
            {"entry": entry, "location": line.location(), "text": clip(line.text, 300)}
            for entry, line in result.facts.warnings
        ],
        "last_progress": None
        if lp is None
        else {"kind": lp.kind, "step": lp.step, "total": lp.total, "epoch": lp.epoch},
    }


def document(result: Diagnosis) -> dict[str, Any]:
    """The versioned JSON document of `zerodoctor diagnose --format json`."""
    return envelope(
        "diagnose",
        result.findings,
        logs=[{"path": k, "lines": v} for k, v in result.stats.lines.items()],
        engine=result.stats.engine,
        notes=result.stats.notes,
        versions=result.versions,
        timeline=timeline(result),
    )


def render_json(result: Diagnosis) -> str:
    return to_json(document(result))


def render_diagnosis_markdown(result: Diagnosis) -> str:
    return render_markdown(result.findings, title="zerodoctor diagnose")


def render_diagnosis_text(result: Diagnosis, *, color: bool = False) -> str:
    findings = result.findings
    out: list[str] = [f"note: {note}\n" for note in result.stats.notes]
    if findings:
        out.append(render_text(findings[:1], header="Verdict:", color=color))
    if len(findings) > 1:
        out.append("\n")
        out.append(render_text(findings[1:], header="Other candidates (less evidence):", color=False))
    tl = timeline(result)
    out.append("\nTimeline:\n")
    out.append(f"  first failure: {tl['first_failure'] or 'none found'}\n")
    out.append(f"  phase: {(tl['phase'] or 'unknown').replace('_', ' ')}\n")
    lp = tl["last_progress"]
    if lp:
        step = (
            f"step {lp['step']}" + (f" of {lp['total']}" if lp["total"] else "")
            if lp["step"] is not None
            else ""
        )
        epoch = f"epoch {lp['epoch']}" if lp["epoch"] is not None else ""
        out.append(f"  last progress: {', '.join(x for x in (step, epoch) if x)}\n")
    for e in tl["echoes"][:MAX_TEXT_LINES]:
        out.append(f"  then: {e}\n")
    for w in tl["warnings"][:MAX_TEXT_LINES]:
        out.append(f"  warning at {w['location']} ({w['entry']}): {w['text']}\n")
    if result.versions:
        out.append("  versions: " + ", ".join(f"{k} {v}" for k, v in sorted(result.versions.items())) + "\n")
    lines = sum(result.stats.lines.values())
    out.append(f"  read {lines} lines from {len(result.stats.lines)} log(s)\n")
    return "".join(out)
