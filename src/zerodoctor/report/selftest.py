"""Render a `SelftestResult` (from `zerodoctor.selftest`): the text header above the findings, and Markdown
(phase table, checks table, differences, limits, then the findings) for PR comments and CI step summaries.
The JSON document is `SelftestResult.to_dict()` inside the common envelope."""

from __future__ import annotations

from zerodoctor.report.render import render_markdown
from zerodoctor.selftest.result import FAILED, INTERRUPTED, PASSED, TIMED_OUT, SelftestResult

_MARK = {PASSED: "ok  ", FAILED: "FAIL", TIMED_OUT: "HUNG", INTERRUPTED: "DIED"}


def _seconds(value: float | None) -> str:
    return f"{value:.2f} s" if value is not None else "-"


def _path_line(result: SelftestResult) -> str:
    versions = (
        f" (torch {result.versions.get('torch')}, DeepSpeed {result.versions.get('deepspeed')})"
        if result.versions
        else ""
    )
    return result.path + versions


def _wall_line(result: SelftestResult) -> str:
    jit = (
        f", {result.jit_build_seconds:.1f} s of it building DeepSpeed ops" if result.jit_build_seconds else ""
    )
    return f"{result.wall_seconds:.1f} s wall{jit}"


def summary_text(result: SelftestResult, *, source: str) -> str:
    """The header shown above the findings: what ran, each phase with its time, each positive check."""
    lines = [
        f"zerodoctor selftest: {source}",
        f"  model: {result.model}",
        f"  path:  {_path_line(result)}",
        "",
        "phases:",
    ]
    for p in result.phases:
        secs = f"{p.seconds:6.2f} s" if p.seconds is not None else "       -"
        mark = _MARK.get(p.status, "    ")
        lines.append(f"  {mark} {p.title:<40} {secs}  {p.status}" + (f": {p.detail}" if p.detail else ""))
    lines += ["", "checks:"]
    for c in result.checks:
        lines.append(f"  {_MARK.get(c.status, '    ')} {c.name:<18} {c.status}: {c.detail}")
    if result.adaptations:
        lines += ["", "differences from your setup (and why):"]
        lines += [f"  - {a.describe()}" for a in result.adaptations]
    if result.limits:
        lines += ["", "what this run cannot show:"]
        lines += [f"  - {text}" for text in result.limits]
    lines += ["", f"log: {result.log_path}   ({_wall_line(result)})", ""]
    return "\n".join(lines)


def _cell(text: str) -> str:
    """Text safe inside a Markdown table cell: one line, pipes escaped."""
    return " ".join(str(text).split()).replace("|", "\\|")


def render_selftest_markdown(result: SelftestResult, *, source: str) -> str:
    """Markdown: what ran, a table of phases (verdict, time, rank, detail), a table of checks, the
    differences from the user's setup and what the path cannot show, then the findings."""
    verdict = "passed" if result.ok else "FAILED"
    lines = [
        f"# zerodoctor selftest: {verdict}",
        "",
        f"- setup: {_cell(source)}",
        f"- model: {_cell(result.model)}",
        f"- path: {_cell(_path_line(result))}",
        f"- time: {_wall_line(result)}; log `{result.log_path}`",
        "",
        "## Phases",
        "",
        "| phase | verdict | time | rank | detail |",
        "|---|---|---:|---:|---|",
    ]
    for p in result.phases:
        verdict_cell = f"**{p.status}**" if p.status in (FAILED, TIMED_OUT, INTERRUPTED) else p.status
        rank = "" if p.rank is None else str(p.rank)
        lines.append(
            f"| {_cell(p.title)} | {verdict_cell} | {_seconds(p.seconds)} | {rank} | {_cell(p.detail)} |"
        )
    lines += ["", "## Checks", "", "| check | verdict | detail |", "|---|---|---|"]
    for c in result.checks:
        verdict_cell = f"**{c.status}**" if c.status == FAILED else c.status
        lines.append(f"| {c.name} | {verdict_cell} | {_cell(c.detail)} |")
    if result.adaptations:
        lines += ["", "## Differences from your setup", ""]
        lines += [f"- {a.describe()}" for a in result.adaptations]
    if result.limits:
        lines += ["", "## What this run cannot show", ""]
        lines += [f"- {text}" for text in result.limits]
    lines.append("")
    findings = render_markdown(list(result.findings), title="Findings")
    # the findings' own headings sit one level below this document's title
    body = "\n".join(("#" + line if line.startswith("#") else line) for line in findings.splitlines())
    return "\n".join(lines) + "\n" + body + "\n"
