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
    # vLLM's logger (vllm/logger.py _FORMAT `%(levelname)s %(asctime)s %(filename)s:%(lineno)d] %(message)s` in 0.x,
    # `... [%(fileinfo)s:%(lineno)d] ...` later, _DATE_FORMAT `%m-%d %H:%M:%S`, milliseconds appended in newer ones):
    # its NewLineFormatter repeats the prefix on every line of a message, so a traceback it logs is one per line
    # (`ERROR 03-11 11:58:53 [core.py:1100] ValueError: ...`)
    (
        "time",
        re.compile(
            r"^(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) (\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d{1,6})?) "
            r"\[?[\w./-]{1,200}\.py:\d{1,7}\] ?"
        ),
    ),
    ("time", re.compile(r"^\[\s*(\d+\.\d+)\]\s*")),  # dmesg "[12345.678901] "
    # Ray's worker prefix "(ActorModelRayActorBOX pid=499618) ", "(RayWorkerWrapper pid=81, ip=10.0.0.3) "
    # (OpenRLHF, verl): which actor printed the line, like a host
    ("host", re.compile(r"^\(([A-Za-z_][\w.:-]{0,80}) pid=\d+(?:, ip=[\d.]+)?\)\s")),
    # a paste quoted in an issue thread ("> " per line, as GitHub and mail replies quote)
    ("quote", re.compile(r"^> ?(?!>)")),
    # a line pasted as Markdown inline code (`ImportError: cannot import name ...` between single backticks); a
    # ``` fence is not inline code
    ("code", re.compile(r"^`(?!`)")),
    # a line a GitHub comment wraps whole in Markdown emphasis (`*AssertionError: ...*`, `_..._`, `**...**`,
    # `***...***`, `__...__`): the markers at both ends go (CommonMark: the text starts and ends with a non-blank and
    # the closing run is as long as the opening one); `**kwargs`, `__init__` or a `____` rule are no such line
    ("emph", re.compile(r"^(\*{1,3}|_{1,3})(?=[^\s*_])(?=.*[^\s*_]\1\s*$)")),
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
            elif kind == "emph":
                text = text.rstrip()[: -len(m.group(1))]
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


# One lost newline: a frame's indented source line with the next frame header glued behind it (Megatron-LM#176:
# `    test_dataset = build_dataset(2, 'test')  File "/x/megatron/data/gpt_dataset.py", line 110, in build_dataset`).
# Python prints a frame's source line indented by 4 (traceback.py FrameSummary format), no other line starts so and
# holds a frame header after its text.
_SOURCE_THEN_FRAME = re.compile(r'^ {4,}\S[^"]*?\s(?=File "[^"]+", line \d+, in )')


def _split_lost_newlines(segment: str) -> list[str]:
    if segment.count('", line ') < 2 or len(_FRAME_HEAD.findall(segment)) < 2:
        m = _SOURCE_THEN_FRAME.match(segment)
        return [segment[: m.end()].rstrip(), segment[m.end() :]] if m else [segment]
    parts = _FRAME_HEAD.split(segment)
    return [p for p in parts if p.strip()]


# Terminal rows kept on one physical line: a screen copied row by row (tmux/screen capture, a terminal emulator's
# "copy as text", a web console) gives each row of a wrapped logical line as a field of the window's width W, padded
# with blanks up to W, and the rows follow each other on the same line - so a run of blanks ends exactly at column W,
# 2W, ... and the text is cut where the row ended, inside a word as often as not ("site-packages/tr" + "l/trainer",
# "train bat" + "ch size"). A run this long that ends on such a column, with rows of text before each run, is the
# padding of a row: it is removed. The text of each row is at most w columns (the width the program wrapped at); a
# row filled to w was cut inside the text (joined with no blank), a shorter one ended at a blank (one blank kept).
_PAD_MIN_RUN = 8
_PAD_RUN = re.compile(f" {{{_PAD_MIN_RUN},}}(?=[^ ])")
_PAD_WIDTH_MIN, _PAD_WIDTH_MAX = 80, 400
_PAD_ROW_MIN = 20  # a row's text before its padding: a table's short cells are no wrapped rows
# Blanks that are no row padding: a tqdm bar's empty part (`0%|          | 0/7`), rich's box (`... in <module>    │`),
# columns of a table or a shell's job status (`8156 Killed                  python3 main.py`): a row of wrapped text
# holds single blanks after its indentation, and no bar or box border closes its padding
_NOT_A_ROW = re.compile(r"\S {2,}\S|[|│]\s*$")
_BORDERS = "|│┃║"


# the widths terminals and consoles wrap at (a row this long was filled, so cut inside the text)
TERMINAL_WIDTHS = frozenset({80, 100, 120, 132, 140, 150, 160, 180, 200, 220, 240, 250})

# A line that is a whole record on its own and never the rest of a wrapped one: the shell's report of a signal
# (`Killed`, `Segmentation fault (core dumped)`, `Bus error`, `Terminated`, bash's job line `./run.sh: line 12:
# 4242 Killed  python train.py`) and glibc's / libstdc++'s abort messages. A line as long as a terminal's width
# above it is a complete line, not a row the terminal cut (review 1: a 120-column progress print swallowed `Killed`).
_SIGNALS = (
    r"(?:Killed|Terminated|Segmentation fault|Bus error|Aborted|Floating point exception|Illegal instruction"
    r"|Hangup|Trace/breakpoint trap)"
)
STANDALONE_LINE = (
    rf"^[ \t]*{_SIGNALS}(?: \(core dumped\))?[ \t]*\r?$|^(?:\S+: )?line \d+: +\d+ +{_SIGNALS}\b"
    r"|^(?:terminate called after throwing|free\(\): |double free or corruption|corrupted size vs\. prev_size"
    r"|malloc\(\): |munmap_chunk\(\): )"
)
# The start of a record: with only "the line above is as long as a terminal's width" for a wrap, a next line that
# starts like this is a record of its own (a capitalised word: `Invalidate trace cache ...`, `Root Cause ...`; a
# logger level `ERROR:` / `WARNING:`; a tool's `srun: error:` / `bash: line 3:`). A terminal cuts at a column, not
# at a blank, so a real row's rest starts inside a word (`orld_size`), with a blank, or with punctuation; a cut
# right before a capitalised word that ends at a blank is the rare case given up.
RECORD_START = (
    STANDALONE_LINE
    + r"|^(?:[A-Z][a-z]+(?:[ :(,]|\r?$)|[A-Z]{2,}:|(?:srun|slurmstepd|wandb|bash|sh|mpirun|/bin/\w+): "
    r"|\S+\.sh: line \d+: )"
)
_STANDALONE = re.compile(STANDALONE_LINE)


_FRAME_HEADER = re.compile(r'", line \d+, in \S')
_IN_FRAME_PATH = re.compile(r'File "[^"]*$')


def _frame_cut(row: str, rest: str) -> bool | None:
    """For a row cut inside a frame header's `", line N, in F`: whether it was cut inside a word (the header reads
    right joined with no blank) or at one of its blanks; None when the cut is not there."""
    tail, head = row[-30:], rest[:30]
    for sep in ("", " "):
        m = _FRAME_HEADER.search(tail + sep + head)
        if m is not None and m.start() < len(tail) < m.end():
            return sep == ""
    return None


def _cut_inside(row: str, rest: str) -> bool:
    """Whether a single padded row (whose text width is not known from other rows) was cut inside the text: inside
    a frame header's path (paths hold no blank) or its `", line N, in F` where the header reads right with no blank,
    a row as long as a usual terminal width, a row ending inside a path or a long token (its last word has a '/' or
    a '\\\\', or is 30+ characters long), or the next row starts with punctuation that follows a word directly (`, in
    __init__`)."""
    frame = _frame_cut(row, rest)
    if frame is not None:
        return frame
    if _STANDALONE.match(rest) is not None:
        return False  # (`Killed` after a padded row: a line of its own, kept apart by a blank)
    if _IN_FRAME_PATH.search(row) is not None:
        return True
    last = row.rsplit(" ", 1)[-1]
    return (
        len(row) in TERMINAL_WIDTHS
        or "/" in last
        or "\\" in last
        or len(last) >= 30
        or rest[:1] in (",", ".", ";", ":", ")", "]", "}")
    )


def unpad_rows(text: str) -> str:
    """`text` with the padding of terminal rows copied onto one line removed (see above); unchanged otherwise."""
    if " " * _PAD_MIN_RUN not in text:
        return text
    runs = list(_PAD_RUN.finditer(text))
    if not runs:  # (only trailing blanks)
        return text
    width = runs[0].end()
    if not (_PAD_WIDTH_MIN <= width <= _PAD_WIDTH_MAX) or len(runs) * width >= len(text):
        return text
    rows: list[str] = []
    for k, run in enumerate(runs):
        if run.end() != (k + 1) * width or run.start() - k * width < _PAD_ROW_MIN:
            return text  # a run off the row grid, or a short cell: aligned text, not padded rows
        row = text[k * width : run.start()]
        # (the first row's rank/host/time prefix and indentation may hold several blanks)
        body = split_prefixes(row)[0].lstrip() if k == 0 else row
        if _NOT_A_ROW.search(body) or text[run.end()] in _BORDERS:
            return text
        rows.append(row)
    inner = max(len(r) for r in rows)
    out: list[str] = []
    for row in rows:
        out.append(row)
        cut_inside = _cut_inside(row, text[width:]) if len(rows) == 1 else len(row) == inner
        if not cut_inside:
            out.append(" ")
    out.append(text[len(rows) * width :])
    return "".join(out)


def parse_line(source: str, lineno: int, raw: bytes) -> list[LogLine]:
    """Decode and normalise one physical line; tqdm `\\r` updates give one LogLine per non-empty segment, and
    text glued onto the end of a tqdm bar is split off into its own LogLine."""
    text = raw.decode("utf-8", errors="replace").rstrip("\r\n")
    text = strip_ansi(text)
    segments = [s for s in text.split("\r") if s.strip()] if "\r" in text else [text]
    if "        " in text:
        segments = [unpad_rows(s) for s in segments]
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
