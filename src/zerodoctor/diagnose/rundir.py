"""`zerodoctor diagnose RUN_DIR`: a directory of a run's logs, read as the list of its log files.

A run directory holds one or more log files per rank (`rank3.log`, `node-1/stderr.log`, torchrun's
`--log-dir` tree `<run_id>/attempt_<n>/<local_rank>/{stdout,stderr}.log`) and torchrun's error files
(`error.json`, written by `@record` / TORCHELASTIC_ERROR_FILE). Log files are taken by name; an error file
is turned into the text of the traceback it records, so it is read like any other log. The rank of a file
with no rank prefix in its lines comes from its name or its directory (`.../3/stderr.log`: see extract).
"""

from __future__ import annotations

import io
import json
import stat
from pathlib import Path

from zerodoctor.diagnose.reader import Source
from zerodoctor.errors import DiagnoseError

MAX_FILES = 4096
MAX_DEPTH = 6
MAX_ERROR_FILE_BYTES = 4 << 20
_LOG_SUFFIXES = (".log", ".txt", ".out", ".err", ".gz", ".stdout", ".stderr")
_LOG_NAMES = frozenset({"stdout", "stderr", "error.json"})


def _is_log(p: Path) -> bool:
    name = p.name.lower()
    return name in _LOG_NAMES or name.endswith(_LOG_SUFFIXES) or (name.endswith(".json") and "error" in name)


def _is_dir(p: Path) -> bool:
    try:
        return p.is_dir()
    except (OSError, ValueError):  # a name the file system refuses is not a directory
        return False


def expand(paths: list[str]) -> list[str]:
    """Every path as given, a directory replaced by its log files (sorted, depth and count bounded)."""
    out: list[str] = []
    for path in paths:
        p = Path(path)
        if path == "-" or not _is_dir(p):
            out.append(
                path
            )  # the reader says what is wrong with it (no such file, a device, a name too long)
            continue
        found: list[str] = []
        stack = [(p, 0)]
        while stack:
            d, depth = stack.pop()
            try:
                children = sorted(d.iterdir())
            except OSError as exc:
                raise DiagnoseError(
                    f"{d}: cannot list: {exc.strerror or exc}", hint="check the permissions"
                ) from None
            for c in children:
                if c.is_symlink():
                    continue
                if c.is_dir() and depth < MAX_DEPTH:
                    stack.append((c, depth + 1))
                elif c.is_file() and _is_log(c):
                    found.append(str(c))
            if len(found) > MAX_FILES:
                raise DiagnoseError(
                    f"{path}: more than {MAX_FILES} log files under this directory",
                    hint="give the run's own directory, or the log files themselves",
                )
        if not found:
            raise DiagnoseError(
                f"{path}: no log files in this directory (looked for *.log, *.txt, *.out, *.err, *.gz, "
                "stdout/stderr and torchrun's error.json)",
                hint="give the log files themselves",
            )
        out.extend(sorted(found))
    return out


def error_file_text(path: str) -> bytes | None:
    """The traceback recorded in a torchrun error file, as log text (None when it is not one)."""
    p = Path(path)
    if not p.name.lower().endswith(".json"):
        return None
    try:
        st = p.stat()
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_ERROR_FILE_BYTES:
            return None  # a device (/dev/zero) or a pipe is no torchrun error file: the log reader handles it
        with p.open("rb") as fh:
            raw = fh.read(MAX_ERROR_FILE_BYTES + 1)  # bounded even if the size changed since stat
        if len(raw) > MAX_ERROR_FILE_BYTES:
            return None
        doc = json.loads(raw)
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(doc, dict) or "message" not in doc:
        return None
    msg = doc["message"]
    lines: list[str] = []
    if isinstance(msg, dict):
        extra = msg.get("extraInfo") if isinstance(msg.get("extraInfo"), dict) else {}
        stack = extra.get("py_callstack") if isinstance(extra, dict) else None
        if isinstance(stack, str) and stack.strip():
            lines.append(stack.rstrip("\n"))
        elif isinstance(msg.get("message"), str):
            lines.append(msg["message"])
    elif isinstance(msg, str):
        lines.append(msg)
    if not lines:
        return None
    return ("\n".join(lines) + "\n").encode("utf-8", "replace")


def error_file_source(path: str) -> Source | None:
    text = error_file_text(path)
    return None if text is None else Source(path, io.BytesIO(text))
