"""The runtime guard's per-rank error file (`zerodoctor/error-rank{R}.json`, written by guard/crash.py) as log text.

The file holds the exception's traceback and the rank, step and phase the guard had seen when it was raised. It is
read as the guard's own stderr line (`zerodoctor guard [rank R, step S, PHASE]: Type: message`, which the
extractor reads as a phase marker) followed by the traceback, each line `[rankR]: `-prefixed as in the guard's
`error-rank{R}.log`. That `.log` is the same traceback without the phase: it is skipped when its `.json` is read.
"""

from __future__ import annotations

import io
import json
import re
import stat
from pathlib import Path

from zerodoctor.diagnose.source import Source

MAX_GUARD_FILE_BYTES = 4 << 20
_NAME = re.compile(r"^error-rank(\d+)(?:-[\w.-]+)?\.json$")
_PHASE = re.compile(r"^\w{1,40}$")


def guard_error_text(path: str) -> bytes | None:
    """The error file as log text, or None when `path` is not a guard error file."""
    p = Path(path)
    if not _NAME.match(p.name):
        return None
    try:
        st = p.stat()
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_GUARD_FILE_BYTES:
            return None
        with p.open("rb") as fh:
            raw = fh.read(MAX_GUARD_FILE_BYTES + 1)
        if len(raw) > MAX_GUARD_FILE_BYTES:
            return None
        doc = json.loads(raw)
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(doc, dict):
        return None
    tb, phase, message = doc.get("traceback"), doc.get("phase"), doc.get("message")
    if not isinstance(tb, str) or not isinstance(phase, str) or not _PHASE.match(phase):
        return None
    rank = doc.get("rank")
    rank = rank if isinstance(rank, int) and not isinstance(rank, bool) and 0 <= rank < 1 << 20 else None
    if rank is None:
        rank = int(_NAME.match(p.name).group(1))  # type: ignore[union-attr]
    step = doc.get("step")
    step_text = str(step) if isinstance(step, int) and not isinstance(step, bool) else "?"
    exc = str(doc.get("type") or "").rsplit(".", 1)[-1] or "Exception"
    first = message.splitlines()[0][:300] if isinstance(message, str) and message.strip() else ""
    lines = [f"zerodoctor guard [rank {rank}, step {step_text}, {phase}]: {exc}: {first}"]
    lines += [f"[rank{rank}]: {line}" for line in tb.splitlines()]
    return ("\n".join(lines) + "\n").encode("utf-8", "replace")


def guard_error_source(path: str) -> Source | None:
    text = guard_error_text(path)
    return None if text is None else Source(path, io.BytesIO(text))


def without_guard_duplicates(paths: list[str]) -> list[str]:
    """Drop a guard `error-rank{R}.log` whose `error-rank{R}.json` is read too (the same traceback)."""
    chosen = set(paths)
    out = []
    for path in paths:
        p = Path(path)
        twin = str(p.with_suffix(".json"))
        is_twin = p.suffix == ".log" and _NAME.match(p.with_suffix(".json").name) and twin in chosen
        if is_twin and guard_error_text(twin) is not None:
            continue
        out.append(path)
    return out
