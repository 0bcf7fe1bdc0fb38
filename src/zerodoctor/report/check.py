"""Renderings of a `zerodoctor check` report: text (people), Markdown (PR comments, CI step summaries), JSON
(versioned). SARIF lives in report/sarif.py."""

from __future__ import annotations

import io
from typing import TYPE_CHECKING, Any

from rich.text import Text

from zerodoctor.check.registry import PHASE_TITLES, PHASES
from zerodoctor.findings import Finding, Severity
from zerodoctor.report.render import (
    SEVERITY_STYLE,
    append_evidence,
    append_fixes,
    envelope,
    shown_finding,
    summary,
    text_console,
)
from zerodoctor.textutil import printable

if TYPE_CHECKING:
    from zerodoctor.check.pipeline import CheckReport

_VERDICT_STYLE = {
    "will fail": "bold red",
    "could not check": "bold yellow",
    "ready with warnings": "bold yellow",
    "ready": "bold green",
}


def verdict_line(report: CheckReport) -> str:
    """`WILL FAIL at the first optimizer step: <what>` / `READY` / ..."""
    line = report.verdict.upper()
    first = next((f for f in report.findings if f.severity is Severity.ERROR), None)
    if first is not None:
        line += f" {PHASE_TITLES.get(str(first.data.get('phase')), '')}: {first.title}"
    elif report.verdict == "could not check":
        missing = [c.what for c in report.checked if not c.checked and c.what != "selftest"]
        line += f": {', '.join(missing)} not checked"
    return line


def render_text(report: CheckReport, *, color: bool = False, width: int = 100) -> str:
    buf = io.StringIO()
    console = text_console(buf, width=width, color=color)
    head = Text("zerodoctor check: ", style="bold")
    head.append(verdict_line(report), style=_VERDICT_STYLE.get(report.verdict, "bold"))
    console.print(head)
    console.print()
    pad = max((len(k) for k, _ in report.headline), default=8) + 2
    for key, value in report.headline:
        console.print(Text(printable(f"{key:<{pad}}{value}")))
    for note in report.run.notes:
        console.print(Text(printable(f"{'note':<{pad}}{note}")))
    console.print()
    if report.findings:
        console.print(Text("Findings, in the order they would bite", style="bold"))
    for phase, title in PHASES:
        group = [f for f in report.findings if f.data.get("phase") == phase]
        if not group:
            continue
        console.print(Text(f"\n{title}", style="bold underline"))
        for f in group:
            console.print(_finding(shown_finding(f)))
    console.print(Text("What was checked", style="bold"))
    for c in report.checked:
        console.print(Text(printable(f"  [{'x' if c.checked else ' '}] {c.what}: {c.detail}")))
    if report.skipped:
        skipped = "; ".join(f"{p} ({why})" for p, why in report.skipped)
        console.print(Text(printable(f"  skipped files: {skipped}"), style="dim"))
    counts = summary(report.findings)
    console.print()
    console.print(
        Text(
            f"verdict: {report.verdict} ({counts['error']} error(s), {counts['warning']} warning(s), "
            f"{counts['info']} info)",
            style=_VERDICT_STYLE.get(report.verdict, "bold"),
        )
    )
    return buf.getvalue()


def _finding(f: Finding) -> Text:
    """What went wrong first, then where, then what to do: severity, id and title; the message; every
    location; the ranked fixes; the sources."""
    t = Text("  ")
    t.append(f"{f.severity.label.upper()}", style=SEVERITY_STYLE[f.severity])
    t.append(f" {f.id}", style="bold")
    t.append(f"  {f.title}\n")
    t.append(f"    {f.message}\n")
    append_evidence(t, f.evidence, "    ", skip_empty=True)
    append_fixes(t, f.fixes, "    ", patches=False)
    if f.data.get("also_found_by"):
        t.append(f"    also found by: {', '.join(f.data['also_found_by'])}\n", style="dim")
    if f.references:
        t.append("    see: " + ", ".join(f.references) + "\n", style="dim")
    return t


def render_markdown(report: CheckReport) -> str:
    return printable(_markdown(report))


def _markdown(report: CheckReport) -> str:
    lines = [f"# zerodoctor check: {verdict_line(report)}", ""]
    if report.headline:
        lines += ["| | |", "|---|---|"] + [f"| {k} | {v} |" for k, v in report.headline] + [""]
    for phase, title in PHASES:
        group = [f for f in report.findings if f.data.get("phase") == phase]
        if not group:
            continue
        lines += [f"## {title[0].upper()}{title[1:]}", ""]
        for f in group:
            where = f.evidence[0].location() if f.evidence else ""
            lines.append(f"### {f.severity.label.upper()} {f.id}: {f.title}")
            lines.append("")
            if where:
                lines += [f"`{where}`", ""]
            lines += [f.message, ""]
            for i, fix in enumerate(f.fixes, 1):
                lines.append(f"{i}. {fix.text}" + (f" `{fix.command}`" if fix.command else ""))
            if f.references:
                lines += ["", "Sources: " + ", ".join(f.references)]
            lines.append("")
    lines += ["## What was checked", ""]
    lines += [f"- [{'x' if c.checked else ' '}] **{c.what}**: {c.detail}" for c in report.checked]
    counts = summary(report.findings)
    lines += [
        "",
        f"Verdict: **{report.verdict}** ({counts['error']} error(s), {counts['warning']} warning(s), "
        f"{counts['info']} info)",
    ]
    return "\n".join(lines) + "\n"


def json_document(report: CheckReport) -> dict[str, Any]:
    run = report.run
    return envelope(
        "check",
        report.findings,
        verdict=report.verdict,
        headline=dict(report.headline),
        checked=[{"what": c.what, "checked": c.checked, "detail": c.detail} for c in report.checked],
        files=[{"path": p, "kind": k} for p, k in report.files],
        skipped=[{"path": p, "why": w} for p, w in report.skipped],
        environment=report.env_source,
        sources=run.sources(),
        notes=list(run.notes),
    )
