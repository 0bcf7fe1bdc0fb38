"""Text of a selftest's phases, checks and adaptations (the findings are rendered by `zerodoctor.report`)."""

from __future__ import annotations

from zerodoctor.selftest.result import FAILED, PASSED, TIMED_OUT, SelftestResult

_MARK = {PASSED: "ok  ", FAILED: "FAIL", TIMED_OUT: "HUNG"}


def summary_text(result: SelftestResult, *, source: str) -> str:
    """The header shown above the findings: what ran, each phase with its time, each positive check."""
    lines = [
        f"zerodoctor selftest: {source}",
        f"  model: {result.model}",
        f"  path:  {result.path}"
        + (
            f" (torch {result.versions.get('torch')}, DeepSpeed {result.versions.get('deepspeed')})"
            if result.versions
            else ""
        ),
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
        lines += ["", "what this CPU run cannot show:"]
        lines += [f"  - {text}" for text in result.limits]
    jit = (
        f", {result.jit_build_seconds:.1f} s of it building DeepSpeed ops" if result.jit_build_seconds else ""
    )
    lines += ["", f"log: {result.log_path}   ({result.wall_seconds:.1f} s wall{jit})", ""]
    return "\n".join(lines)
