"""Turn raw log lines into normalised `LogLine`s (the byte I/O -- files, `.gz`, pipes, stdin, chunks -- is
`zerodoctor.diagnose.source`).

Only the lines the scanner selects are decoded and normalised (`parse_line`): rank/host/launcher prefixes,
timestamps and ANSI colour codes are removed, tqdm carriage-return updates become separate segments and
Windows line ends are dropped. A file that ends in the middle of a line (truncated, or still being written)
yields that last partial line like any other.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field

from zerodoctor.diagnose.source import iter_pieces, open_source

_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(\x07|\x1b\\)|\x1b[@-Z\\-_]")
# One prefix at a time, applied repeatedly (pdsh adds `host: `, torchrun --tee adds `[rank3]:`, DeepSpeed's
# multi-node launcher adds `host-1: ` in front of that, and so on).
_PREFIXES: tuple[tuple[str, re.Pattern[str]], ...] = (
    # torchrun --tee / --log-line-prefix-template "[rank3]:", "[default0]:", "[default0]<stderr>:"
    ("rank", re.compile(r"^\[(?:rank|default)(\d+)\](?:<std(?:out|err)>)?:\s?")),
    # mpirun --tag-output "[1,3]<stderr>:" (jobid, rank)
    ("rank", re.compile(r"^\[\d+,(\d+)\]<std(?:out|err)>:\s?")),
    # torchrun local rank prefix "0: " (rare) is ambiguous with other text, so it is not stripped.
    # pdsh / DeepSpeed multi-node launcher "host-1: ", "10.0.0.12: ", "worker-3: "
    # (a host name has a digit, or is localhost: "ValueError: " and "torch.OutOfMemoryError: " are not hosts)
    ("host", re.compile(r"^(localhost|[A-Za-z0-9_.-]*\d[A-Za-z0-9_.-]*): ")),
    # timestamps: "[2024-05-01 12:00:00,123] ", "2024-05-01T12:00:00.123Z ", "[Tue Apr 23 09:42:07 2024] "
    (
        "time",
        re.compile(r"^\[?(\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?)\]?\s+"),
    ),
    ("time", re.compile(r"^\[((?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) \w{3} +\d+ \d\d:\d\d:\d\d \d{4})\]\s*")),
    ("time", re.compile(r"^\[\s*(\d+\.\d+)\]\s*")),  # dmesg "[12345.678901] "
    # Ray's worker prefix "(ActorModelRayActorBOX pid=499618) ", "(RayWorkerWrapper pid=81, ip=10.0.0.3) "
    # (OpenRLHF, verl): which actor printed the line, like a host
    ("host", re.compile(r"^\(([A-Za-z_][\w.:-]{0,80}) pid=\d+(?:, ip=[\d.]+)?\)\s")),
    # a paste quoted in an issue thread ("> " per line, as GitHub and mail replies quote)
    ("quote", re.compile(r"^> ?(?!>)")),
    # a line pasted as Markdown inline code (`ImportError: cannot import name ...` between single backticks); a
    # ``` fence is not inline code
    ("code", re.compile(r"^`(?!`)")),
)
_INLINE_CODE_END = re.compile(r"(?<!`)`\s*$")
_RANK_IN_TEXT = re.compile(r"\[Rank (\d+)\]|\brank(?: |=)(\d+)\b|\[rank(\d+)\]")


# Numbers read from log text: a 5,000-digit "rank" or pid must not raise (int() refuses > 4300 digits) and must
# not become a huge value that breaks formatting or JSON downstream.
MAX_INT_DIGITS = 18


def log_int(text: str | None) -> int | None:
    """An integer from a log field, or None when it is not one or is absurdly long (> 18 digits)."""
    if text is None:
        return None
    t = text.strip()
    digits = t[1:] if t[:1] in "+-" else t
    if not digits.isascii() or not digits.isdigit() or len(digits) > MAX_INT_DIGITS:
        return None
    return int(t)


def log_float(text: str | None) -> float | None:
    """A finite float from a log field, or None ('.', 'nan', 'inf', 1e999, a 5,000-digit number)."""
    if text is None or len(text) > 64:
        return None
    try:
        v = float(text)
    except ValueError:
        return None
    return v if math.isfinite(v) else None


@dataclass(frozen=True)
class LogLine:
    """One logical line: file, 1-based line number, rank/host/timestamp from its prefixes, normalised text."""

    source: str
    lineno: int
    text: str
    rank: int | None = None
    host: str | None = None
    timestamp: str | None = None
    raw: str = field(default="", compare=False)

    def location(self) -> str:
        return f"{self.source}:{self.lineno}"


def strip_ansi(text: str) -> str:
    return _ANSI.sub("", text) if "\x1b" in text else text


def split_prefixes(text: str) -> tuple[str, int | None, str | None, str | None]:
    """Remove rank/host/timestamp prefixes; return (text, rank, host, timestamp)."""
    rank: int | None = None
    host: str | None = None
    stamp: str | None = None
    for _ in range(6):
        for kind, rx in _PREFIXES:
            m = rx.match(text)
            if m is None:
                continue
            if kind == "host":
                name = m.group(1)
                if host is not None or name.isdigit() or "Error" in name:
                    continue
                host = name
            elif kind == "rank":
                if rank is None:
                    rank = log_int(m.group(1))
            elif kind == "quote":
                pass
            elif kind == "code":
                text = _INLINE_CODE_END.sub("", text)
            elif stamp is None:
                stamp = m.group(1)
            text = text[m.end() :]
            break
        else:
            break
    return text, rank, host, stamp


# A tqdm bar ends with "...it/s]" or "...s/it]", or with a postfix "...1.37it/s, loss=2.6]"; text glued right
# after it (a watchdog line printed by another thread while the bar had no newline) is a line of its own.
_BAR_END = re.compile(r"(?:it/s|s/it)(?:,[^\[\]\r\n]{0,400})?\]")


def _has_bar(text: str) -> bool:
    return "it]" in text or "it/s, " in text or "s/it, " in text


def _split_glued(segment: str) -> list[str]:
    if not _has_bar(segment):
        return [segment]
    parts: list[str] = []
    pos = 0
    for m in _BAR_END.finditer(segment):
        if m.end() > pos and segment[m.end() :].strip():
            parts.append(segment[pos : m.end()])
            pos = m.end()
    parts.append(segment[pos:])
    return [p for p in parts if p.strip()]


# A traceback whose newlines were lost (a paste in a single backtick span, a log joined into one line): two or more
# frame headers on one physical line. No real log line holds two, so the line is cut before `Traceback (most
# recent call last):` and before each frame header, and the extractor reads the traceback as printed.
_FRAME_HEAD = re.compile(r'\s(?=File "[^"]+", line \d+, in )|\s(?=Traceback \(most recent call last\))')


def _split_lost_newlines(segment: str) -> list[str]:
    if segment.count('", line ') < 2 or len(_FRAME_HEAD.findall(segment)) < 2:
        return [segment]
    parts = _FRAME_HEAD.split(segment)
    return [p for p in parts if p.strip()]


def parse_line(source: str, lineno: int, raw: bytes) -> list[LogLine]:
    """Decode and normalise one physical line; tqdm `\\r` updates give one LogLine per non-empty segment, and
    text glued onto the end of a tqdm bar is split off into its own LogLine."""
    text = raw.decode("utf-8", errors="replace").rstrip("\r\n")
    text = strip_ansi(text)
    segments = [s for s in text.split("\r") if s.strip()] if "\r" in text else [text]
    if _has_bar(text):
        segments = [p for seg in segments for p in _split_glued(seg)]
    if '", line ' in text:
        segments = [p for seg in segments for p in _split_lost_newlines(seg)]
    out: list[LogLine] = []
    outer_rank: int | None = None
    outer_host: str | None = None
    for seg in segments or [""]:
        body, rank, host, stamp = split_prefixes(seg)
        # A tqdm segment after `\r` carries no prefix of its own: it belongs to the line's first prefix.
        rank = rank if rank is not None else outer_rank
        host = host or outer_host
        outer_rank, outer_host = rank, host
        if rank is None:
            m = _RANK_IN_TEXT.search(body)
            if m:
                rank = log_int(next(g for g in m.groups() if g is not None))
        out.append(LogLine(source, lineno, body, rank, host, stamp, seg))
    return out


def read_lines(path: str) -> Iterator[LogLine]:
    """Every line of a log, normalised (for tests and small logs; `scan` is the fast path)."""
    src = open_source(path)
    lineno = 0
    pending = False  # the previous chunk ended inside the line that this one continues
    try:
        for chunk, continues in iter_pieces(src):
            raws = chunk.split(b"\n")
            if chunk.endswith(b"\n"):
                raws.pop()
            for i, raw in enumerate(raws):
                if not (i == 0 and pending):
                    lineno += 1
                yield from parse_line(src.name, lineno, raw)
            pending = continues
    finally:
        src.close()
