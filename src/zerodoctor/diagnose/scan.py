"""One pass over the bytes of the logs with a multi-pattern engine; only lines that hit are decoded.

Every knowledge-base signature and every extractor pattern (`patterns.EXTRACTOR_PATTERNS`) is compiled once
per process into one multi-pattern database and run over newline-aligned chunks of a few MB. A match end
offset names its line; only those lines are decoded, normalised (`reader.parse_line`) and re-checked with
Python's `re` on the normalised text (the reference semantics of the KB: prefixes and colour codes removed),
so the engine is a prefilter and never changes what matches.

Engine choice (measured on a 2-core machine, 300 MB multi-rank log, 190 patterns; see
benchmarks/RESULTS.md for the 1 GB figures):
  * hyperscan (Intel's multi-pattern DFA/NFA engine, `hyperscan` on PyPI): one scan per chunk for all
    patterns, ~GB/s, compile ~0.2 s. Chosen: the only option that meets ">= 1/3 of grep's throughput".
  * google-re2: no multi-pattern scan that reports positions from Python (re2.Set only answers "which
    patterns", per string), so it needs a line loop or one pass per pattern: several times slower.
  * pyahocorasick: a literal prefilter; needs a hand-kept required literal for each regex, and the regexes
    must still run on the hit lines. Faster than `re`, slower and more fragile than hyperscan.
  * pure Python `re` (the fallback when hyperscan cannot be imported): one `finditer` per distinct pattern
    per chunk; correct, about 10-30x slower than hyperscan.
Set ZERODOCTOR_SCAN_ENGINE=python to force the fallback.

With ZERODOCTOR_SCAN_THREADS=N (2 to MAX_SCAN_THREADS; default 1) and a log of more than one chunk, hyperscan
scans the next chunks on N-1 worker threads while the main thread reads and handles the current one (hyperscan
releases the GIL while it scans; each thread has its own scratch space). Chunks are still handled strictly in
file order with the engine a one-thread scan would have used, so the hits and the output are the same whatever
N is; memory grows by one chunk per thread. Off by default: on the 2 shared cores it was measured on, with
other jobs keeping both busy, it made a 1 GiB log slower (benchmarks/RESULTS.md, issue 10); a gain needs idle
cores.

Training progress (tqdm bars, trainer loss dicts) is on every step, so it is not a pattern: for a failure
line, the last progress line before it is found with `bytes.rfind` on literals (`PROGRESS_LITERALS`).
"""

from __future__ import annotations

import functools
import itertools
import os
import re
import threading
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, cast

from zerodoctor.diagnose import rundir
from zerodoctor.diagnose.guardfile import guard_error_source, without_guard_duplicates
from zerodoctor.diagnose.patterns import (
    CUT_BAR_HEAD,
    CUT_BAR_LINE,
    EXTRACTOR_PATTERNS,
    PROGRESS_LITERALS,
    parse_progress,
)
from zerodoctor.diagnose.reader import (
    RECORD_START,
    STANDALONE_LINE,
    TERMINAL_WIDTHS,
    LogLine,
    parse_line,
    split_prefixes,
)
from zerodoctor.diagnose.rundir import error_file_source
from zerodoctor.diagnose.source import CHUNK_BYTES, Source, iter_spans, open_source
from zerodoctor.errors import UsageError
from zerodoctor.kb import cache
from zerodoctor.kb.loader import load_entries

if TYPE_CHECKING:
    from concurrent.futures import Future

# Extractor keys whose lines are failures: they get the progress context and count for "first failure".
FAILURE_KEYS = frozenset(
    {
        "x:tb-head",
        "x:tb-exception",
        "x:oom-cuda",
        "x:oom-host",
        "x:launch-ds-rc",
        "x:launch-elastic-failed",
        "x:launch-elastic-exitcode",
        "x:launch-signal",
        "x:launch-mpirun",
        "x:launch-slurm",
        "x:nccl-error",
        "x:nccl-watchdog",
        "x:nccl-peer",
        # lines the extractor also makes failure events of: they get the progress context too
        "x:launch-shell-killed",
        "x:launch-shell-signal",
        "x:launch-child-signal",
        "x:launch-killing",
        # torchrun's agent stopped by a signal (`Received 1 death signal, shutting down workers`) and a tool's report
        # of exit status 137: launcher outcomes like the others above, the progress before them is where the run was
        "x:launch-death-signal",
        "x:launch-exit-137",
        "x:load-copy-error",
        "x:load-size-mismatch",
        "x:cuda-kernel-assert",
        "x:cpp-what",
        "x:bare-oserror",
        "x:config-validation",
        "x:quoted-kwarg",
    }
)


@dataclass(frozen=True)
class Progress:
    """The last training-progress update seen before a line."""

    kind: str  # tqdm | trainer | deepspeed | mmengine | meter | litgpt
    step: int | None
    total: int | None
    epoch: float | None
    lineno: int
    rank: int | None = None  # the rank whose prefix the progress line carries


@dataclass(frozen=True)
class Hit:
    """A line that matched at least one pattern after normalisation, in file order."""

    line: LogLine
    keys: frozenset[str]  # "kb:<entry>:<signature>" and "x:<extractor pattern>"
    seq: int  # global order: file index * 2**40 + line number
    file_index: int
    progress: Progress | None = None


@dataclass
class ScanStats:
    """What one scan read: lines per source, bytes, hit lines, the engine used, notes on the input."""

    lines: dict[str, int] = field(default_factory=dict)
    hit_lines: int = 0
    counted_only: int = (
        0  # raw matches of saturated knowledge-base patterns, not decoded (see SATURATE_AFTER)
    )
    engine: str = ""
    notes: list[str] = field(default_factory=list)
    # the last training-progress line of each source, wherever it is (hits only carry the progress before them)
    end_progress: dict[str, Progress | None] = field(default_factory=dict)


class _Engine(Protocol):
    name: str
    ids: tuple[int, ...]  # the pattern indices this engine scans for
    once: frozenset[int]  # those reported once at most per scan (the first match), not at every match
    threads_help: bool  # whether scanning on worker threads runs in parallel (the engine releases the GIL)

    def without(self, drop: frozenset[int]) -> _Engine:
        """The same engine without these pattern indices (saturated patterns leave the scan)."""
        ...

    def find(self, data: bytes, end: int | None = None, start: int = 0) -> list[tuple[int, int]]:
        """(pattern index, match end offset) for every match in data[start:end] (the whole of `data` by default);
        `start` is a line's start."""
        ...

    def any_in(self, data: bytes, start: int, end: int) -> bool:
        """Whether any pattern matches in data[start:end] (the scan stops at the first match)."""
        ...


# A knowledge-base pattern that has passed the re-check on this many lines is "saturated": its evidence
# (extract.MAX_EVIDENCE lines), its distinct warnings (extract.MAX_WARNINGS) and its presence are already
# known, so further raw matches are skipped, and the pattern soon leaves the scan. Per-step lines (DeepSpeed's see_memory_usage,
# trace-cache warnings) would otherwise cost a decode and a regex per line on logs where 8 % of lines hit.
SATURATE_AFTER = 64


class _LazyCompiled:
    """Python `re` objects of the patterns, compiled on first use: most patterns never hit a given log, and
    compiling all ~170 at start costs more than the rest of a small log's diagnosis."""

    def __init__(self, regexes: tuple[str, ...]) -> None:
        self._regexes = regexes
        self._compiled: dict[int, re.Pattern[str]] = {}

    def __getitem__(self, pid: int) -> re.Pattern[str]:
        rx = self._compiled.get(pid)
        if rx is None:
            rx = self._compiled[pid] = re.compile(self._regexes[pid])
        return rx

    def __len__(self) -> int:
        return len(self._regexes)


@dataclass(frozen=True)
class PatternSet:
    """Distinct regexes (engine order) and, for each, the keys that use it."""

    regexes: tuple[str, ...]
    keys: tuple[tuple[str, ...], ...]
    compiled: _LazyCompiled


@functools.cache
def pattern_set() -> PatternSet:
    by_regex: dict[str, list[str]] = {}
    for entry in load_entries():
        for sig in entry.symptoms.signatures:
            by_regex.setdefault(sig.pattern, []).append(f"kb:{entry.id}:{sig.id}")
    for name, rx in EXTRACTOR_PATTERNS.items():
        by_regex.setdefault(rx, []).append(f"x:{name}")
    regexes = tuple(by_regex)
    return PatternSet(regexes, tuple(tuple(v) for v in by_regex.values()), _LazyCompiled(regexes))


class _HyperscanEngine:
    name = "hyperscan"
    threads_help = True

    def __init__(
        self, regexes: Sequence[str], ids: Sequence[int] | None = None, once: frozenset[int] = frozenset()
    ) -> None:
        import hyperscan

        self._local = threading.local()  # a scratch space per thread (one scratch cannot serve two scans)
        self._owner = threading.get_ident()
        self._regexes = tuple(regexes)
        self.ids = tuple(range(len(regexes))) if ids is None else tuple(ids)
        self.once = once & frozenset(self.ids)
        base = hyperscan.HS_FLAG_MULTILINE | hyperscan.HS_FLAG_ALLOWEMPTY
        flags = [base | hyperscan.HS_FLAG_SINGLEMATCH if i in self.once else base for i in self.ids]
        exprs = [self._regexes[i].encode("utf-8") for i in self.ids]
        # Compiling ~170 patterns takes ~0.2 s, most of a cold start: the serialized database is cached,
        # keyed by the patterns and their ids, the flags and the hyperscan build (kb.cache).
        key = cache.key_of(
            [hyperscan.__file__.encode(), str(flags).encode(), repr(self.ids).encode(), *exprs]
        )
        blob = cache.read("hyperscan", key)
        if blob is not None:
            try:
                db = hyperscan.loadb(blob, hyperscan.HS_MODE_BLOCK)
                db.scratch = hyperscan.Scratch(db)  # a deserialized database has no scratch space yet
                self._db = db
                return
            except (hyperscan.error, TypeError, ValueError):  # another hyperscan build: compile again
                pass
        self._db = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
        self._db.compile(expressions=exprs, ids=list(self.ids), elements=len(exprs), flags=flags)
        cache.write("hyperscan", key, bytes(hyperscan.dumpb(self._db)))

    def without(self, drop: frozenset[int]) -> _HyperscanEngine:
        return _HyperscanEngine(self._regexes, [i for i in self.ids if i not in drop], self.once)

    def find(self, data: bytes, end: int | None = None, start: int = 0) -> list[tuple[int, int]]:
        out: list[tuple[int, int]] = []
        add = out.append

        def on_match(pid: int, _start: int, end: int, _flags: int, _ctx: Any) -> None:
            add((pid, start + end))

        self._scan(data, start, end, on_match)
        return out

    def any_in(self, data: bytes, start: int, end: int) -> bool:
        import hyperscan

        try:
            self._scan(data, start, end, lambda *_args: True)  # (a callback that returns True stops the scan)
        except hyperscan.ScanTerminated:
            return True
        return False

    def _scan(self, data: bytes, start: int, end: int | None, on_match: Any) -> None:
        # a view of data[start:end], no copy (hyperscan scans any buffer; its type stubs name str and bytes only)
        whole = start == 0 and (end is None or end == len(data))
        view = data if whole else cast(bytes, memoryview(data)[start:end])
        if threading.get_ident() == self._owner:
            self._db.scan(view, match_event_handler=on_match)
        else:
            scratch = getattr(self._local, "scratch", None)
            if scratch is None:
                scratch = self._local.scratch = self._db.scratch.clone()
            self._db.scan(view, match_event_handler=on_match, scratch=scratch)


class _PythonEngine:
    name = "python-re"
    threads_help = False  # `re` holds the GIL

    def __init__(
        self, regexes: Sequence[str], ids: Sequence[int] | None = None, once: frozenset[int] = frozenset()
    ) -> None:
        self._regexes = tuple(regexes)
        self.ids = tuple(range(len(regexes))) if ids is None else tuple(ids)
        self.once = once & frozenset(self.ids)
        self._compiled = [(i, re.compile(self._regexes[i].encode("utf-8"), re.MULTILINE)) for i in self.ids]

    def without(self, drop: frozenset[int]) -> _PythonEngine:
        return _PythonEngine(self._regexes, [i for i in self.ids if i not in drop], self.once)

    def find(self, data: bytes, end: int | None = None, start: int = 0) -> list[tuple[int, int]]:
        out: list[tuple[int, int]] = []
        stop = len(data) if end is None else end  # (`endpos`: as if the bytes ended there, `$` included)
        for pid, rx in self._compiled:
            found = rx.finditer(data, start, stop)
            out.extend((pid, m.end()) for m in (itertools.islice(found, 1) if pid in self.once else found))
        return out

    def any_in(self, data: bytes, start: int, end: int) -> bool:
        return any(rx.search(data, start, end) is not None for _pid, rx in self._compiled)


@functools.cache
def engine(kind: str | None = None) -> _Engine:
    """The engine of every pattern; the pure bar markers' are reported once per scan, to say a chunk holds one."""
    regexes = pattern_set().regexes
    kind = kind or os.environ.get("ZERODOCTOR_SCAN_ENGINE") or "auto"
    if kind in ("auto", "hyperscan"):
        try:
            return _HyperscanEngine(regexes, once=bar_ids())
        except ImportError:
            if kind == "hyperscan":
                raise
    return _PythonEngine(regexes, once=bar_ids())


# A job that prepares data or loads a model prints a progress bar on nearly every line (datasets' `Map` / `Filter` /
# `Running tokenizer on dataset` bars, `Loading checkpoint shards`), each a hit of a phase marker and nothing else;
# read line by line they cost 30x grep's time (issue 10). So in the main scan the patterns that only name these markers
# match once at most (HS_FLAG_SINGLEMATCH: "this chunk holds a marker"), and a second database of them alone
# (`gap_engines`) is scanned in the stretches between the other hit lines that hold one (`_holding_bars`): of each
# stretch only the LAST marker line is read, found by scanning back from the hit that ends it, so the bars before it
# cost no Python at all. That loses nothing the markers are read for: their readers (extract.py _phase_from_markers_at,
# _last_marker, _outlived, _stack_dump; classes.py _ray_cause, _run_end_before) ask for the last marker before a hit
# line, whether one follows it, or for kinds no bar prints (`finished`, `train`, `guard`, `engine`); and besides its
# marker a line adds only its rank (Facts.ranks_in_log) and an ISO time in its text (classes._silence_before_interrupt).
# So a stretch that names a rank or holds such a time (`_RANK_OR_TIME`, one scan that stops at the first) is read as
# the last bar of each rank prefix and every line of another shape (`_bar_key`). The hit lines themselves are scanned
# for markers too (a kill glued onto a loading bar). tests/diagnose/test_scan_bars.py counts the work and checks that
# the answers are those of reading every bar.
BAR_MARKER_KEYS = frozenset({"x:phase-data", "x:phase-load"})
# what names a rank (reader._PREFIXES `[rank3]:`, `[default0]:`, `[1,3]<stdout>:`; reader._RANK_IN_TEXT `[Rank 3]`,
# `rank=3`), a time classes._stamp reads, and text glued behind a bar's closing bracket (`it/s]Segmentation fa` whose
# rest a terminal wrapped onto the next line: neither half is a hit alone, the line must be read and joined; review R8)
_RANK_OR_TIME = (
    "ank|default|<std",
    r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d",
    r"/(?:s|it)(?:,[^\]\r\n]*)?\][^\r\n]",
)
_BACK_WINDOW = 1024  # (the first window scanned back from a hit: a dozen bars; each next one 8 times wider)


@functools.cache
def bar_ids() -> frozenset[int]:
    """The pattern indices whose keys are all bar markers (BAR_MARKER_KEYS)."""
    return frozenset(i for i, keys in enumerate(pattern_set().keys) if set(keys) <= BAR_MARKER_KEYS)


@functools.cache
def gap_engines(name: str) -> tuple[_Engine, _Engine]:
    """(the bar markers' engine, the `_RANK_OR_TIME` engine) of the same kind as the main engine `name`."""
    make = _HyperscanEngine if name == _HyperscanEngine.name else _PythonEngine
    return make(pattern_set().regexes, sorted(bar_ids())), make(_RANK_OR_TIME)


def _bar_lines(
    chunk: bytes, lo: int, hit: tuple[int, int], limit: int, engines: tuple[_Engine, _Engine]
) -> list[tuple[tuple[int, int], int]]:
    """(line bounds, pattern index) of the bar-marker matches to read from chunk[lo:hit[1]]: on the other hit line
    `hit` (`(limit, limit)`: none, the piece's end), and before it the last marker line's, or, where the stretch
    before that names a rank or a time, every marker line's (see BAR_MARKER_KEYS)."""
    bars, rank_or_time = engines
    hit_start, top = hit
    found: list[tuple[int, int]] = []  # (matches before the hit line)
    out: list[tuple[tuple[int, int], int]] = []
    width = _BACK_WINDOW
    while top > lo and not found:  # scan back in windows that grow, each from a line's start
        start = max(lo, top - width)
        if start > lo:
            start = max(lo, chunk.rfind(b"\n", lo, start) + 1)
        for pid, end in bars.find(chunk, top, start):
            if end - 1 >= hit_start:
                out.append((hit, pid))
            else:
                found.append((pid, end))
        top, width = start, width * 8
    if not found:
        return out
    first, last = _line_bounds(chunk, max(end for _pid, end in found), limit)
    if not rank_or_time.any_in(chunk, lo, first):
        return out + [((first, last), pid) for pid, end in found if first <= end - 1 <= last]
    # every marker line of the stretch: the last one of each rank and host prefix is read, a line of another shape
    # (no plain bar, a date or a rank in its text) each
    lines: dict[tuple[int, int], set[int]] = {}
    for pid, end in bars.find(chunk, hit_start, lo):
        lines.setdefault(_line_bounds(chunk, end, limit), set()).add(pid)
    last_of: dict[object, tuple[int, int]] = {}
    for at in sorted(lines):
        key = _bar_key(chunk, *at)
        last_of[at if key is None else key] = at
    return out + [(at, pid) for at in last_of.values() for pid in lines[at]]


def _holding_bars(
    chunk: bytes, bars: _Engine, los: list[int], hits: list[tuple[int, int]], i: int, j: int
) -> Iterator[int]:
    """The indices k in [i, j) of the stretches chunk[los[k]:hits[k][1]] that hold a bar marker, in order, where [i, j)
    is known to hold one: halved until one stretch is left, a scan that stops at the first match telling which half
    (a chunk of dense hits and a few bars costs a few scans per bar, not one per hit)."""
    while j - i > 1:
        m = (i + j) // 2
        if bars.any_in(chunk, los[i], hits[m - 1][1]):
            yield from _holding_bars(chunk, bars, los, hits, i, m)
            if not bars.any_in(chunk, los[m], hits[j - 1][1]):
                return
        i = m
    yield i


_BAR_LINE_MAX = 1024  # (longer lines, and lines split at `\r` by `_line_bounds`, are read each)
# one bar, nothing glued behind it, no carriage return or colour code: `PREFIXES DESC: NN%|BAR| COUNTS [TIMES, RATE]`
_PLAIN_BAR = re.compile(
    rb"([^\r\x1b%]*(?:%(?!\|)[^\r\x1b%]*)*)%\|[^\r\x1b\[\]%]*(?:%(?!\|)[^\r\x1b\[\]%]*)*\[[^\r\x1b\[\]]*\]"
)
# (a line that holds a date: its time may be read, see classes._stamp)
_DATE = re.compile(rb"\d{4}-\d\d-\d\d")
_BarKey = tuple[int | None, str | None]


def _bar_key(chunk: bytes, start: int, stop: int) -> _BarKey | None:
    """(rank, host) of the line chunk[start:stop] when it is one plain tqdm bar (_PLAIN_BAR) with no date and no rank
    in its text; else None (the line is read on its own)."""
    if stop - start > _BAR_LINE_MAX:
        return None
    if stop > start and chunk[stop - 1] == 13:  # (a CRLF line: its `\r` is the line end, not a carriage return)
        stop -= 1
    m = _PLAIN_BAR.fullmatch(chunk, start, stop)
    # (`[rank3]`, `[Rank 3]`, `rank=3` in the text name a rank: reader._RANK_IN_TEXT)
    if (
        m is None
        or chunk.find(b"ank", m.end(1), stop) >= 0
        or (chunk.find(b"-", start, stop) >= 0 and _DATE.search(chunk, start, stop) is not None)
    ):
        return None
    # (the blanks before the percentage stay: `host-1: ` is a prefix)
    return _prefix_key(chunk[start : m.end(1)].rstrip(b"0123456789"))


@functools.lru_cache(maxsize=4096)  # (a few distinct heads per log)
def _prefix_key(head: bytes) -> _BarKey | None:
    """(rank, host) that the bytes before a bar's percentage name; None where they may name more."""
    if head[:1] in (b"*", b"_", b"`", b">"):  # (Markdown quoting reads the line's end: reader._PREFIXES)
        return None
    text, rank, host, stamp = split_prefixes(head.decode("utf-8", "replace"))
    return (rank, host) if stamp is None and (rank is not None or "ank" not in text) else None


_WINDOW = 64 << 10


def _cut_bars(chunk: bytes, start: int, end: int) -> list[int]:
    """The offsets of `%|` on the lines in chunk[start:end] that are cut tqdm bars (`start`: a line's start)."""
    head = CUT_BAR_HEAD.match(chunk, 0, end) if start == 0 else None
    found = [m.start("bar") for m in CUT_BAR_LINE.finditer(chunk, max(start - 1, 0), end)]
    return [head.start("bar"), *found] if head is not None else found


class _LiteralCursor:
    """The progress literals' start offsets in chunk[lo:hi], last first, as `hi` moves back line by line.

    Each literal's last position is kept and searched again only when `hi` moves below it, in windows that grow
    from the end (each starting at a line start): a literal a log never prints (mmengine's on an HF run) is not
    searched through the whole span for every step, and no line is searched twice. A cut tqdm bar has no literal
    of its own: its lines (patterns.CUT_BAR_LINE) are listed once per window."""

    def __init__(self, chunk: bytes, lo: int, hi: int) -> None:
        self.chunk, self.lo = chunk, lo
        self.floor = hi  # (every literal's last start in [floor, hi) is known)
        self.width = _WINDOW
        self.last = dict.fromkeys(PROGRESS_LITERALS, -1)
        self.cut: list[int] = []  # the cut bars' `%|` offsets in [floor, hi), ascending

    def next_before(self, hi: int) -> int:
        """The last offset below `hi` (<= the previous `hi`) where a literal starts and ends, or -1."""
        for lit, pos in self.last.items():
            if pos >= 0 and pos + len(lit) > hi:
                self.last[lit] = self.chunk.rfind(lit, self.floor, hi)
        while self.cut and self.cut[-1] + 2 > hi:
            self.cut.pop()
        while True:
            pos = max(max(self.last.values()), self.cut[-1] if self.cut else -1)
            if pos >= 0 or self.floor <= self.lo:
                return pos
            start = max(self.lo, self.floor - self.width)
            if start > self.lo:  # (from a line's start: a cut bar is read from its line's start)
                start = max(self.lo, self.chunk.rfind(b"\n", self.lo, start) + 1)
            # overlap by the longest literal so one that straddles the window edge is found
            top = min(hi, self.floor + _LONGEST)
            for lit in PROGRESS_LITERALS:
                self.last[lit] = self.chunk.rfind(lit, start, top)
            self.cut = _cut_bars(self.chunk, start, self.floor)
            self.floor = start
            self.width *= 4


_LONGEST = max(len(lit) for lit in PROGRESS_LITERALS)
_PREFIX_BYTES = 256  # (a line's prefixes: `[rank3]:`, a launcher's host and timestamp)
_PREFIX_WINDOW = 4096  # (a progress line's start further back than this: a tqdm stream, its prefix not read)


def _line_rank(chunk: bytes, pos: int) -> int | None:
    """The rank prefix at the start of the line holding chunk[pos] (which may lie before the searched piece), or None;
    None too for a line that starts more than _PREFIX_WINDOW bytes back, so that the answer does not depend on where
    a chunk starts."""
    nl = chunk.rfind(b"\n", max(0, pos - _PREFIX_WINDOW), pos)
    if nl < 0 and pos > _PREFIX_WINDOW:
        return None
    head = chunk[nl + 1 : nl + 1 + _PREFIX_BYTES].decode("utf-8", "replace")
    return split_prefixes(head.lstrip("\r").split("\r", 1)[0])[1]


def _last_progress(chunk: bytes, lo: int, hi: int, lineno_at_hi: int, limit: int) -> Progress | None:
    """The last progress update in chunk[lo:hi] (rfind on literals, then parse that line); the piece ends at
    `limit` (>= hi).

    `lineno_at_hi` is the line number of the line that starts at `hi`: the progress line's number is found by
    counting the newlines between it and `hi` only, so the work is bounded by the bytes between two hits and
    the cost per MB does not grow with the number of hits (counting from the chunk start was quadratic)."""
    top = hi  # (the line numbers count from the line at the first `hi`: the search below moves `hi` back)
    cursor = _LiteralCursor(chunk, lo, hi)
    while hi > lo:
        pos = cursor.next_before(hi)
        if pos < 0:
            return None
        start = chunk.rfind(b"\n", lo, pos) + 1
        end = chunk.find(b"\n", pos, limit)
        end = limit if end < 0 else end
        parsed = parse_progress(chunk[max(start, lo) : end].decode("utf-8", "replace"))
        if parsed is not None:
            kind, step, total, epoch = parsed
            return Progress(
                kind, step, total, epoch, lineno_at_hi - chunk.count(b"\n", start, top), _line_rank(chunk, pos)
            )
        hi = max(start - 1, lo) if start > lo else lo
    return None


# A physical line longer than this is split at `\r` for decoding: only the tqdm segment around a match is
# decoded (a >1 MB stream of progress updates would otherwise be decoded and re-checked segment by segment).
LONG_LINE = 64 << 10


# Terminal wrapping: a line copied from a terminal is cut at the terminal's width (80-200 columns), often padded
# with blanks; the rest of the message is on the next physical line(s). A hit line of such a width whose next
# line does not start a new record (no prefix, timestamp, traceback or frame line) is joined with it before the
# re-check, so a wrapped assertion still matches its signature.
_WRAP_MIN, _WRAP_MAX, _WRAP_LINES = 79, 250, 4
_NEW_RECORD = re.compile(
    rb"^(?:\[|\s*File \"|Traceback|\s*\^|\d{4}-\d\d-\d\d|[A-Za-z0-9_.-]*\d[A-Za-z0-9_.-]*: |[A-Z]\d{4} |\s{2,}\S"
    rb"|[A-Za-z_][\w.]*(?:Error|Exception|Warning|Interrupt|Exit)\b|\{'|\s*\d+%\|)"
)
# (reader.STANDALONE_LINE: never the rest of a wrapped line, whatever the line above looks like; RECORD_START: a
# record of its own when the only sign of a wrap is the width of the line above)
_STANDALONE = re.compile(STANDALONE_LINE.encode())
_RECORD_START = re.compile(RECORD_START.encode())
_PAD = b" " * 8  # the shortest run of blanks `reader.unpad_rows` reads as a row's padding
_FRAME_LINE = re.compile(rb'File "[^"]+", line \d+, in [\w<>.]+\s*$')


def _wrapped_end(chunk: bytes, start: int, stop: int, limit: int) -> int:
    """Where a terminal-wrapped logical line that starts at `start` ends (`stop` if it is not wrapped); the piece
    ends at `limit`."""
    end, line_start = stop, start
    above = chunk[chunk.rfind(b"\n", 0, max(start - 1, 0)) + 1 : max(start - 1, 0)] if start else b""
    for _ in range(_WRAP_LINES):
        width = len(chunk[line_start:end].rstrip(b"\r"))
        if not (_WRAP_MIN <= width <= _WRAP_MAX) or end >= limit:
            break
        nxt_stop = chunk.find(b"\n", end + 1, limit)
        nxt_stop = limit if nxt_stop < 0 else nxt_stop
        nxt = chunk[end + 1 : nxt_stop]
        cur = chunk[line_start:end].rstrip(b"\r")
        if _rich_frame_continues(cur, nxt):
            line_start, end, above = end + 1, nxt_stop, cur
            continue
        if (
            not nxt.strip()
            or _NEW_RECORD.match(nxt)
            or _STANDALONE.match(nxt)
            or nxt_stop - end > _WRAP_MAX + 2
        ):
            break
        # a whole traceback frame line: the next line is its source line (indented) - unless the terminal cut the
        # function name (`in _batch_ass` + `ertion`)
        if _FRAME_LINE.search(cur) and not _func_cut(cur, nxt):
            break
        padded = cur.endswith(b" ")
        if padded and (_row_ends_early(cur, nxt) or _row_ends_early(cur, above)):
            break
        # (a line as long as a terminal's width is a wrap only when the next one does not start a record)
        at_width = len(cur) in TERMINAL_WIDTHS and _RECORD_START.match(nxt) is None
        mid_word = cur[-1:].isalnum() and (nxt[:1].islower() or nxt[:1].isdigit())
        if not (padded or at_width or mid_word or _OPEN_PATH.search(cur)):
            break
        line_start, end, above = end + 1, nxt_stop, cur
    return end


# rich's boxed traceback (rich/traceback.py _render_stack): each frame is `PATH:LINE in FUNC` inside `│ ... │`,
# wrapped by rich.text.Text.wrap at the box's inner width - at the blank before the function name when that does
# not fit (`│ /x/pc.py:200 in   │` / `│ fetch_sub_module   │`), or inside a path longer than the box (folded:
# `│ /env/.../zero/partitioned_para │` / `│ m_coordinator.py:200 in fetch_sub_module │`)
_BOX = "│".encode()
_RICH_FUNC_CUT = re.compile(rb"\.py:\d+ in *$")
_RICH_FRAME_REST = re.compile(rb"^\S*\.py:\d+ in(?: \S| *$)")
_PATH_FOLD = re.compile(rb"^\S*/\S*$")


# a launcher's prefix in front of each box row (torchrun's `[default0]:` / `[rank3]:`, pdsh's `host-1: `)
_BOX_PREFIX = re.compile(rb"(?:\[(?:rank|default)\d+\]:|[\w.-]{1,64}: )?\s*")


def _box_split(row: bytes) -> tuple[bytes, bytes] | None:
    """(prefix, text inside) of a rich box row `PREFIX│ TEXT │` (None when the row is not one)."""
    row = row.rstrip(b"\r").rstrip(b" ")
    at = row.find(_BOX)
    if at < 0 or not row.endswith(_BOX) or len(row) - at < 2 * len(_BOX):
        return None
    prefix = row[:at]
    if prefix and _BOX_PREFIX.fullmatch(prefix) is None:
        return None
    return prefix, row[at + len(_BOX) : -len(_BOX)]


def _box_body(row: bytes) -> bytes | None:
    """The text inside a rich box row `│ TEXT │`, behind a launcher's prefix or not (None when it is none)."""
    split = _box_split(row)
    return None if split is None else split[1]


def _rich_frame_continues(cur: bytes, nxt: bytes) -> bool:
    """Whether box row `nxt` holds the rest of the rich frame that box row `cur` starts (see above)."""
    ca, cb = _box_split(cur), _box_split(nxt)
    if ca is None or cb is None or ca[0] != cb[0] or len(cur.rstrip(b"\r")) != len(nxt.rstrip(b"\r")):
        return False
    a, b = ca[1], cb[1]
    inner = len(a.decode("utf-8", "replace")) - 2  # `│ ` + text + ` │`
    a, b = a.strip(b" "), b.strip(b" ")
    if _RICH_FUNC_CUT.search(a):
        return re.fullmatch(rb"[A-Za-z_<][\w.<>]*", b) is not None
    # (a fold fills the row: a path longer than the box is cut at its last column)
    return (
        _PATH_FOLD.match(a) is not None
        and len(a.decode("utf-8", "replace")) >= inner
        and _RICH_FRAME_REST.match(b) is not None
    )


# a frame header cut inside its path (`  File "/x/site-packages/trl/trainer/grpo_trainer`): a path never spans lines
_OPEN_PATH = re.compile(rb'^\s*File "[^"]*$')
_NAME_REST = re.compile(rb"[\w<>.]+\s*$")
_EXC_NAME = re.compile(rb"[\w.]*(?:Error|Exception|Warning|Interrupt|Exit)\s*$")


def _func_cut(cur: bytes, nxt: bytes) -> bool:
    """Whether a frame line `cur` as long as a terminal's width was cut inside its function name and `nxt` is the
    rest: a name's characters, not the frame's indented source line nor a bare exception name (`AssertionError`
    right below a frame whose source Python could not read)."""
    return (
        len(cur) >= _WRAP_MIN
        and (cur[-1:].isalnum() or cur.endswith(b"_"))
        and _NAME_REST.match(nxt) is not None
        and _EXC_NAME.match(nxt) is None
    )


def _row_ends_early(cur: bytes, other: bytes) -> bool:
    """Whether `cur` is a row of a screen copied with every row padded to the same width W (the row below or above,
    `other`, has that width too) whose text ends before W - 1: the terminal would have put the next characters on
    this row, so the logical line ended here (a text that reaches W - 1 had a blank at column W, and goes on)."""
    return len(other.rstrip(b"\r")) == len(cur) and len(cur.rstrip(b" ")) < len(cur) - 1


def _continues_previous(prev: bytes, cur: bytes) -> bool:
    """Whether physical line `cur` is the terminal-wrapped rest of `prev` (the same tests as _wrapped_end)."""
    prev = prev.rstrip(b"\r")
    if _rich_frame_continues(prev, cur):
        return True
    if (
        not (_WRAP_MIN <= len(prev) <= _WRAP_MAX)
        or not cur.strip()
        or _NEW_RECORD.match(cur)
        or _STANDALONE.match(cur)
    ):
        return False
    if (_FRAME_LINE.search(prev) and not _func_cut(prev, cur)) or (
        prev.endswith(b" ") and _row_ends_early(prev, cur)
    ):
        return False
    mid_word = prev[-1:].isalnum() and (cur[:1].islower() or cur[:1].isdigit())
    # a run of physical lines of one width is a paragraph cut at the terminal's width, whatever that width is
    same_width = len(prev) == len(cur.rstrip(b"\r"))
    return (
        prev.endswith(b" ")
        or (len(prev) in TERMINAL_WIDTHS and _RECORD_START.match(cur) is None)
        or mid_word
        or same_width
        or _OPEN_PATH.search(prev) is not None
    )


def _wrapped_start(chunk: bytes, start: int, limit: int) -> int:
    """Where the terminal-wrapped logical line that the physical line at `start` continues begins (`start` when
    it starts a line of its own): a hit in the second half of a wrapped line keeps the first half's rank prefix
    and text (`[rank6]:[E429 ...] ProcessGroupNCCL'` / `s watchdog got stuck for 480 seconds ...`)."""
    first = start
    for _ in range(_WRAP_LINES):
        if first == 0:
            break
        cur_stop = chunk.find(b"\n", first, limit)
        cur = chunk[first : limit if cur_stop < 0 else cur_stop]
        prev_start = chunk.rfind(b"\n", 0, first - 1) + 1
        if not _continues_previous(chunk[prev_start : first - 1], cur):
            break
        first = prev_start
    return first


def _join_wrapped(raw: bytes) -> bytes:
    """The physical lines of a wrapped line as one: the padding blanks of each cut are removed. A row of the full
    width (or, in a screen copied with every row padded to one width, any row) whose text stops one column short had
    a blank there: one is kept."""
    parts = [p.rstrip(b"\r") for p in raw.split(b"\n")]
    if len(parts) > 1 and all(_box_body(p) is not None for p in parts):
        return _join_box_rows(parts)
    grid = len(parts) > 1 and all(len(p) == len(parts[0]) for p in parts)
    width = max(len(p) for p in parts[:-1]) if len(parts) > 1 else 0
    out: list[bytes] = []
    for p in parts[:-1]:
        text = p.rstrip(b" ")
        # (one blank in the last column of a full row is the text's own: the terminal cut right after it)
        out.append(text + b" " if len(text) == len(p) - 1 and (grid or len(p) == width) else text)
    out.append(raw.rsplit(b"\n", 1)[-1])
    return b"".join(out)


def _join_box_rows(parts: list[bytes]) -> bytes:
    """Rich box rows of one wrapped frame as one `│ TEXT │` row: a row rich filled to the box's inner width was a
    fold inside a word (joined with no blank), a shorter one was cut at the blank before the next word."""
    prefix = (_box_split(parts[0]) or (b"", b""))[0]
    bodies = [_box_body(p) or b"" for p in parts]
    inner = len(bodies[0].decode("utf-8", "replace")) - 2  # `│ ` + text + ` │`
    out = bodies[0].strip(b" ")
    full = len(out.decode("utf-8", "replace")) >= inner
    for body in bodies[1:]:
        piece = body.strip(b" ")
        out += piece if full else b" " + piece
        full = len(piece.decode("utf-8", "replace")) >= inner
    return prefix + _BOX + b" " + out + b" " + _BOX


def _line_bounds(chunk: bytes, end: int, limit: int) -> tuple[int, int]:
    pos = max(end - 1, 0)
    start = chunk.rfind(b"\n", 0, pos) + 1
    stop = chunk.find(b"\n", pos, limit)
    stop = limit if stop < 0 else stop
    if stop - start > LONG_LINE:
        cr = chunk.rfind(b"\r", start, pos)
        start = cr + 1 if cr >= 0 else max(start, pos - LONG_LINE)
        cr_end = chunk.find(b"\r", pos, stop)
        stop = cr_end if cr_end >= 0 else min(stop, pos + LONG_LINE)
    return start, stop


@dataclass
class ScanState:
    """What the sources of one scan share: the engine (saturated patterns leave it), re-check counts."""

    eng: _Engine
    verified: dict[int, int] = field(default_factory=dict)  # pattern index -> lines that passed the re-check
    saturated: set[int] = field(default_factory=set)
    skipped_since_rebuild: int = 0


# Raw matches of saturated patterns still cost a Python callback each; once this many were skipped, the
# engine is rebuilt without them (a hyperscan compile is ~0.2 s, cached by pattern set for the next run).
REBUILD_AFTER_SKIPPED = 50_000

# The main thread reads, counts lines and handles hits (about 1.3 CPU s per GiB here) while hyperscan scans (about
# 2 CPU s per GiB): two scanning threads keep up with it; more only hold more chunks in memory.
MAX_SCAN_THREADS = 4


def scan_threads() -> int:
    """Threads that scan chunks: ZERODOCTOR_SCAN_THREADS (at most MAX_SCAN_THREADS), else 1 (the main thread
    alone)."""
    env = os.environ.get("ZERODOCTOR_SCAN_THREADS", "").strip()
    if not env:
        return 1
    try:
        n = int(env)
    except ValueError:
        n = 0
    if n < 1:
        raise UsageError(
            f"ZERODOCTOR_SCAN_THREADS={env!r} is not a positive whole number",
            hint="set it to 1 (scan on the main thread) or more, or unset it",
        )
    return min(n, MAX_SCAN_THREADS)


def _engine_for_chunk(state: ScanState) -> _Engine:
    """The engine a chunk is handled with: saturated patterns leave it once enough of their matches were skipped."""
    if state.skipped_since_rebuild >= REBUILD_AFTER_SKIPPED and state.saturated & set(state.eng.ids):
        state.eng = state.eng.without(frozenset(state.saturated))
        state.skipped_since_rebuild = 0
    return state.eng


# A chunk handed out for scanning ahead: the engine it was given to and the future of its matches.
_Ahead = tuple["_Engine", "Future[list[tuple[int, int]]]"]


# A piece of a source: its bytes are data[:end] (`source.iter_spans`); `continues` as there.
_Piece = tuple[bytes, int, bool]


def _pieces_ahead(
    src: Source, chunk_bytes: int, state: ScanState
) -> Iterator[tuple[bytes, int, bool, _Ahead | None]]:
    """Each piece of `src` in order; with more than one scan thread (and an engine that releases the GIL) also
    the scan of it started ahead on a worker thread (at most `threads` pieces in flight), else None: the caller
    scans it (`_matches`)."""
    pieces = iter_spans(src, chunk_bytes)
    threads = scan_threads() if state.eng.threads_help else 1
    first = next(pieces, None) if threads > 1 else None
    second = next(pieces, None) if first is not None else None
    if second is None:  # one thread, or a log of one chunk (most logs): no pool
        for data, end, continues in pieces if first is None else (first,):
            yield data, end, continues, None
        return
    assert first is not None
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=threads - 1, thread_name_prefix="zerodoctor-scan") as pool:
        ahead: deque[tuple[bytes, int, bool, _Ahead]] = deque()
        for data, end, continues in _chain(first, second, pieces):
            ahead.append((data, end, continues, (state.eng, pool.submit(state.eng.find, data, end))))
            if len(ahead) >= threads:
                yield ahead.popleft()
        while ahead:
            yield ahead.popleft()


def _chain(first: _Piece, second: _Piece, rest: Iterator[_Piece]) -> Iterator[_Piece]:
    yield first
    yield second
    yield from rest


def _matches(
    chunk: bytes, limit: int, started: _Ahead | None, state: ScanState
) -> tuple[_Engine, list[tuple[int, int]]]:
    """The engine a one-thread scan would handle chunk[:limit] with, and that engine's matches in it. A chunk scanned
    ahead by an older engine (one that still had patterns saturated since) has its matches cut to the current
    engine's patterns, so the result is the same either way."""
    eng = _engine_for_chunk(state)
    if started is None:
        return eng, eng.find(chunk, limit)
    scanned_by, future = started
    matches = future.result()
    if scanned_by is not eng:  # rebuilt since this chunk was handed out: its ids are a subset
        keep = frozenset(eng.ids)
        matches = [m for m in matches if m[0] in keep]
    return eng, matches


def scan_source(
    src: Source,
    file_index: int,
    *,
    chunk_bytes: int = CHUNK_BYTES,
    eng: _Engine | None = None,
    state: ScanState | None = None,
    stats: ScanStats | None = None,
) -> Iterator[Hit | int]:
    """Yield the Hits of one source in line order, then its line count (an int) last.

    `state` is shared by the sources of one scan, so a knowledge-base pattern saturates once for the whole
    run (SATURATE_AFTER)."""
    ps = pattern_set()
    state = state if state is not None else ScanState(eng or engine())
    verified, saturated = state.verified, state.saturated
    kb_only = [all(k.startswith("kb:") for k in keys) for keys in ps.keys]
    base_line = 0
    progress: Progress | None = None
    ansi_ids = {i for i, keys in enumerate(ps.keys) if "x:ansi" in keys}
    frame_ids = {i for i, keys in enumerate(ps.keys) if set(keys) <= {"x:tb-frame", "x:tb-frame-ipy"}}
    bar_only = bar_ids()
    gaps = gap_engines(state.eng.name)
    pending = False  # the previous piece ended inside the line this one continues
    # Each piece is chunk[:limit]: the bytes after `limit` belong to the next piece (`source.iter_spans`).
    for chunk, limit, continues, started in _pieces_ahead(src, chunk_bytes, state):
        # (the engine is chosen and the chunk scanned here, once the previous chunk is no longer referenced)
        eng, matches = _matches(chunk, limit, started, state)
        if pending:
            base_line -= 1  # the first line here is the last line of the previous piece
        per_line: dict[tuple[int, int], set[int]] = {}
        skipped = 0
        # the last line found whole (from newline to newline, not cut at `\r` by _line_bounds): a match that ends in
        # it or on its newline is on that line (a bar line holds several matches, found in the order they end)
        here, line_start, line_stop = (-1, -1), -1, -2
        has_bars = False
        for pid, end in matches:
            if pid in bar_only:  # (reported once: see BAR_MARKER_KEYS)
                has_bars = True
                continue
            if pid in saturated:
                skipped += 1
                continue
            if not line_start <= end - 1 <= line_stop:
                here = _line_bounds(chunk, end, limit)
                line_start, line_stop = here
                if line_stop - line_start > LONG_LINE or not (
                    (line_start == 0 or chunk[line_start - 1] == 10) and (line_stop == limit or chunk[line_stop] == 10)
                ):
                    line_start, line_stop = -1, -2
            per_line.setdefault(here, set()).add(pid)
        # the marker lines to read in each stretch up to a hit line that holds one (see BAR_MARKER_KEYS)
        if has_bars:
            hits = [*sorted(per_line), (limit, limit)]
            los = list(itertools.accumulate((stop for _start, stop in hits[:-1]), max, initial=0))
            for i in _holding_bars(chunk, gaps[0], los, hits, 0, len(hits)):
                for at, pid in _bar_lines(chunk, los[i], hits[i], limit, gaps):
                    per_line.setdefault(at, set()).add(pid)
        counted_to, counted_lines = 0, base_line
        searched_to = 0
        # end of the last wrapped line joined in this chunk (its rest is not joined backwards again)
        joined_to = 0
        for start, stop in sorted(per_line):
            pids = per_line[(start, stop)]
            if saturated and pids <= saturated:  # saturated earlier in this chunk
                skipped += len(pids)
                continue
            if start < joined_to and pids <= frame_ids:
                # (the rest of a frame header already joined onto the row above it: read once, whole)
                continue
            counted_lines += chunk.count(b"\n", counted_to, start)
            counted_to = start
            lineno = counted_lines + 1
            raw = chunk[start:stop]
            wrapped = False
            if stop - start <= _WRAP_MAX + 1 and b"\r" not in raw[:-1]:
                # (a line already joined onto the hit line before it is also read alone, as it always was)
                first = _wrapped_start(chunk, start, limit) if start >= joined_to else start
                if first < start and pids <= bar_only and gaps[0].any_in(chunk, first, start):
                    first = start  # (a bar is not the rest of the bar above it, which was not read: BAR_MARKER_KEYS)
                joined_end = _wrapped_end(chunk, start, stop, limit) if stop - start >= _WRAP_MIN else stop
                if first < start or joined_end > stop:
                    lineno -= chunk.count(b"\n", first, start)
                    raw, wrapped = _join_wrapped(chunk[first:joined_end]), True
                    joined_to = joined_end
            padded = _PAD in raw
            segments = parse_line(src.name, lineno, raw)
            for line in segments:
                if len(segments) > 1 and (bar := parse_progress(line.text)) is not None:
                    # a bar that a failure line was glued behind (`1/594 [00:21<3:28:13, 21.07s/it][rank4]:
                    # Traceback ...`, reader.parse_line splits them): printed before the segments after it
                    progress = Progress(*bar, lineno, line.rank)
                    searched_to = start
                # (a terminal's row padding removed from the line: `reader.unpad_rows`)
                if wrapped or pids & ansi_ids or (padded and "        " not in line.raw):
                    # colour codes or a terminal wrap may split a pattern: run the engine again on the clean text
                    candidates = {pid for pid, _end in eng.find(line.text.encode("utf-8"))}
                else:
                    candidates = pids
                passed = [pid for pid in candidates if ps.compiled[pid].search(line.text)]
                if not passed:
                    continue
                keys = [k for pid in passed for k in ps.keys[pid]]
                for pid in passed:
                    n = verified[pid] = verified.get(pid, 0) + 1
                    if n >= SATURATE_AFTER and kb_only[pid]:
                        saturated.add(pid)
                kset = frozenset(keys)
                hit_progress = None
                if kset & FAILURE_KEYS or any(k.startswith("kb:") for k in kset):
                    found = _last_progress(chunk, searched_to, start, lineno, limit)
                    if found is not None:
                        progress = found
                    searched_to = start
                    hit_progress = progress
                yield Hit(line, kset, file_index * (1 << 40) + lineno, file_index, hit_progress)
        state.skipped_since_rebuild += skipped
        if stats is not None:
            stats.counted_only += skipped
        # (the newlines before the last hit line are counted already: counting the chunk again from its start cost
        # up to twice the count on chunks whose hits reach their end)
        chunk_lines = (
            counted_lines
            - base_line
            + chunk.count(b"\n", counted_to, limit)
            + (0 if chunk.endswith(b"\n", 0, limit) else 1)
        )
        pending = continues
        if searched_to < limit:
            found = _last_progress(chunk, searched_to, limit, base_line + chunk_lines + 1, limit)
            if found is not None:
                progress = found
        base_line += chunk_lines
    if stats is not None:
        stats.end_progress[src.name] = progress
    yield base_line


def iter_hits(
    paths: Sequence[str], stats: ScanStats | None = None, *, chunk_bytes: int = CHUNK_BYTES
) -> Iterator[Hit]:
    """Open every path first (so bad input fails before any work), then scan them one after another,
    yielding hits in order; `stats` is filled in as it goes."""
    stats = stats if stats is not None else ScanStats()
    sources = [
        guard_error_source(p) or error_file_source(p) or open_source(p)
        for p in without_guard_duplicates(rundir.expand(list(paths)))
    ]
    eng = engine()
    stats.engine = eng.name
    state = ScanState(eng)
    try:
        for index, src in enumerate(sources):
            for item in scan_source(src, index, chunk_bytes=chunk_bytes, state=state, stats=stats):
                if isinstance(item, int):
                    stats.lines[src.name] = item
                else:
                    stats.hit_lines += 1
                    yield item
            stats.notes.extend(src.notes)
    finally:
        for src in sources:
            src.close()
