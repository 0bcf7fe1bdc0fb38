"""Text, Markdown and JSON renderings of findings. Text goes through rich so terminals get colour; piped
output is plain and stable (the golden tests read it)."""

from __future__ import annotations

import io
import json
import re
import sys
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from zerodoctor import __version__
from zerodoctor.findings import Evidence, Finding, Fix, Severity
from zerodoctor.textutil import printable

if TYPE_CHECKING:
    from rich.console import Console
    from rich.text import Text

JSON_SCHEMA_VERSION = 1
SEVERITY_STYLE = {Severity.ERROR: "bold red", Severity.WARNING: "bold yellow", Severity.INFO: "cyan"}


def summary(findings: Sequence[Finding]) -> dict[str, int]:
    return {
        s.label: sum(1 for f in findings if f.severity is s)
        for s in (Severity.ERROR, Severity.WARNING, Severity.INFO)
    }


def envelope(command: str, findings: Sequence[Finding], **extra: Any) -> dict[str, Any]:
    """The versioned JSON document every command prints with --format json."""
    return {
        "schema_version": JSON_SCHEMA_VERSION,
        "tool": "zerodoctor",
        "version": __version__,
        "command": command,
        **extra,
        "findings": [f.to_dict() for f in findings],
        "summary": summary(findings),
    }


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def to_json(doc: dict[str, Any]) -> str:
    """JSON text that encodes to valid UTF-8: non-ASCII text stays readable, but a lone surrogate (how Python
    carries the undecodable bytes of a file name or an environment value) is written as its \\uXXXX escape,
    which JSON readers accept, instead of the raw bytes that make the whole document invalid UTF-8."""
    # (a terminal that cannot encode all of Unicode, PYTHONIOENCODING=ascii / cp1252, would write `\xe9` for what it
    # cannot encode -- not a JSON escape: there every non-ASCII character is written as JSON's own \uXXXX; review R9)
    text = json.dumps(doc, indent=2, default=str, ensure_ascii=not _stdout_is_utf8()) + "\n"
    return _LONE_SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def _stdout_is_utf8() -> bool:
    encoding = (getattr(sys.stdout, "encoding", None) or "").lower().replace("-", "").replace("_", "")
    return encoding in ("utf8", "utf8sig")


def shown_finding(f: Finding) -> Finding:
    """`f` as a terminal or a Markdown page may show it: control characters of the user's values (a key or a
    model name holding ESC[2J) in its title, message, locations and fixes written as escapes (`printable`).
    The JSON output keeps the values as read (JSON escapes control characters itself)."""
    ev = tuple(replace(e, file=_opt(e.file), key=_opt(e.key), text=_opt(e.text)) for e in f.evidence)
    fixes = tuple(replace(x, text=printable(x.text), command=_opt(x.command)) for x in f.fixes)
    return replace(f, title=printable(f.title), message=printable(f.message), evidence=ev, fixes=fixes)


def _opt(text: str | None) -> str | None:
    return printable(text) if text else text


def finding_text(f: Finding) -> Text:
    from rich.text import Text  # rich only where text is rendered: JSON output does not load it (~25 ms)

    t = Text()
    where = f.evidence[0].location() if f.evidence else ""
    if where:
        t.append(f"{where}: ", style="bold")
    t.append(f"{f.severity.label} ", style=SEVERITY_STYLE[f.severity])
    t.append(f"{f.id}", style="bold")
    if f.name and f.name != f.id:
        t.append(f" [{f.name}]", style="dim")
    t.append(f" {f.title}\n")
    t.append(f"  {f.message}\n")
    append_evidence(t, f.evidence[1:] if where else f.evidence, "  ")
    append_fixes(t, f.fixes, "  ", patches=True)
    if f.references:
        t.append("  see: " + ", ".join(f.references) + "\n", style="dim")
    return t


def append_evidence(t: Text, evidence: Sequence[Evidence], indent: str, *, skip_empty: bool = False) -> None:
    """One dim line per piece of evidence: "at LOCATION: text" (`skip_empty`: leave out entries with neither)."""
    for ev in evidence:
        loc = ev.location()
        if skip_empty and not loc and not ev.text:
            continue
        t.append(f"{indent}at {loc}" if loc else indent, style="dim")
        if ev.text and ev.text != loc:
            t.append(f": {ev.text}" if loc else ev.text, style="dim")
        t.append("\n")


def append_fixes(t: Text, fixes: Sequence[Fix], indent: str, *, patches: bool) -> None:
    """The ranked fixes, "fix N: text  $ command" (`patches`: also the keys and values a fix would write)."""
    for i, fix in enumerate(fixes, 1):
        t.append(f"{indent}fix {i}: ", style="green")
        t.append(fix.text)
        if fix.command:
            t.append(f"  $ {fix.command}", style="green")
        if patches and fix.patch:
            t.append(
                "  (" + ", ".join(f"{k} = {json.dumps(v, default=str)}" for k, v in fix.patch.items()) + ")",
                style="dim",
            )
        t.append("\n")


def text_console(buf: io.StringIO, *, width: int = 100, color: bool = False) -> Console:
    """The console every text report prints to: a buffer, colour only for terminals, long lines kept whole
    (soft wrap: a terminal wraps them, nothing is cut)."""
    from rich.console import Console

    return Console(
        file=buf,
        width=width,
        force_terminal=color,
        no_color=not color,
        highlight=False,
        emoji=False,
        soft_wrap=True,
    )


def render_text(
    findings: Sequence[Finding],
    *,
    header: Text | str | None = None,
    width: int = 100,
    color: bool = False,
    clean_message: str = "No problems found.",
) -> str:
    buf = io.StringIO()
    console = text_console(buf, width=width, color=color)
    if header:
        console.print(printable(header) if isinstance(header, str) else header)
    for f in findings:
        console.print(finding_text(shown_finding(f)))
    counts = summary(findings)
    if findings:
        console.print(f"{counts['error']} error(s), {counts['warning']} warning(s), {counts['info']} info")
    else:
        console.print(clean_message)
    return buf.getvalue()


def render_markdown(findings: Sequence[Finding], *, title: str) -> str:
    lines = [f"# {title}", ""]
    if not findings:
        lines += ["No problems found.", ""]
    for f in map(shown_finding, findings):
        where = f.evidence[0].location() if f.evidence else ""
        lines.append(f"## {f.severity.label.upper()} {f.id}: {f.title}")
        lines.append("")
        if where:
            lines.append(f"`{where}`")
            lines.append("")
        lines.append(f.message)
        lines.append("")
        for ev in f.evidence[1:]:
            lines.append(f"- at `{ev.location()}`" + (f": {ev.text}" if ev.text else ""))
        if f.fixes:
            lines.append("")
            lines.append("**Fixes**")
            lines.append("")
            for i, fix in enumerate(f.fixes, 1):
                cmd = f" `{fix.command}`" if fix.command else ""
                lines.append(f"{i}. {fix.text}{cmd}")
        if f.references:
            lines.append("")
            lines.append("Sources: " + ", ".join(f.references))
        lines.append("")
    counts = summary(findings)
    lines.append(f"{counts['error']} error(s), {counts['warning']} warning(s), {counts['info']} info")
    return "\n".join(lines) + "\n"
