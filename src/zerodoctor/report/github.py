"""GitHub Actions output: workflow-command annotations (shown on the PR's changed lines) and the job's step
summary (Markdown appended to $GITHUB_STEP_SUMMARY). Docs: "Workflow commands for GitHub Actions"."""

from __future__ import annotations

import errno
import os
from collections.abc import Sequence
from pathlib import Path

from zerodoctor.errors import OutputError
from zerodoctor.findings import Finding, Severity
from zerodoctor.safeio import shown

_COMMAND = {Severity.ERROR: "error", Severity.WARNING: "warning", Severity.INFO: "notice"}


def _escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


def workflow_annotations(findings: Sequence[Finding], *, root: Path) -> str:
    """One `::error file=...,line=...::message` line per finding."""
    lines = []
    for f in findings:
        ev = next((e for e in f.evidence if e.file), None)
        props = []
        if ev is not None and ev.file:
            try:
                rel = Path(ev.file).resolve().relative_to(root.resolve()).as_posix()
            except ValueError:
                rel = ev.file
            props.append(f"file={_escape_property(rel)}")
            if ev.line:
                props.append(f"line={ev.line}")
            if ev.column:
                props.append(f"col={ev.column}")
        props.append(f"title={_escape_property(f'{f.id} {f.title}')}")
        fix = f" Fix: {f.fixes[0].text}" if f.fixes else ""
        lines.append(f"::{_COMMAND[f.severity]} {','.join(props)}::{_escape_data(f.message + fix)}")
    return "\n".join(lines) + ("\n" if lines else "")


def write_step_summary(markdown: str) -> Path | None:
    """Append to the file GitHub names in $GITHUB_STEP_SUMMARY; None outside Actions. A path that cannot be
    written (a directory, a missing directory, a full disk) is an OutputError naming it. The file is opened
    without blocking: a FIFO that nobody reads is refused at once (ENXIO) instead of hanging the job."""
    target = os.environ.get("GITHUB_STEP_SUMMARY")
    if not target:
        return None
    path = Path(target)
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags, 0o666)
    except OSError as err:
        raise _summary_error(target, err) from None
    try:
        os.set_blocking(fd, True)  # a reader is attached (or it is a file): write it all
        with os.fdopen(fd, "w", encoding="utf-8", errors="backslashreplace") as fh:
            fh.write(markdown)
    except OSError as err:
        raise _summary_error(target, err) from None
    return path


def _summary_error(target: str, err: OSError) -> OutputError:
    reason = "a FIFO that no process reads" if err.errno == errno.ENXIO else (err.strerror or str(err))
    return OutputError(
        f"cannot write $GITHUB_STEP_SUMMARY ({shown(target)}): {reason}",
        hint="set GITHUB_STEP_SUMMARY to a writable file, or unset it outside GitHub Actions",
    )
