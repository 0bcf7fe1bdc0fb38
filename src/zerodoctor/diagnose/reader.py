"""Read training logs in bounded memory: plain files, `.gz` files or stdin, as newline-aligned byte chunks.

Only the lines the scanner selects are decoded and normalised (`parse_line`): rank/host/launcher prefixes,
timestamps and ANSI colour codes are removed, tqdm carriage-return updates become separate segments and
Windows line ends are dropped. A file that ends in the middle of a line (truncated, or still being written)
yields that last partial line like any other.

Bad input is a `DiagnoseError` naming the file and what to do: a path that cannot be opened, an empty file,
a binary file (NUL bytes in the first block), a corrupt `.gz`.
"""

from __future__ import annotations

import fcntl
import math
import os
import re
import stat
import sys
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from zerodoctor.errors import DiagnoseError

CHUNK_BYTES = 8 << 20
# A "line" longer than this (a minified dump, a binary blob) is cut, so memory stays bounded.
MAX_LINE_BYTES = 1 << 20
_SNIFF_BYTES = 8192

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


# ---- sources -----------------------------------------------------------------------------------------


@dataclass
class Source:
    """An opened log: its display name and a binary stream positioned at the start."""

    name: str
    stream: BinaryIO
    notes: list[str] = field(default_factory=list)
    offset: int = 0  # bytes of text handed on so far (for "stopped reading after N bytes")

    def close(self) -> None:
        if self.stream is not sys.stdin.buffer:
            self.stream.close()


def open_source(path: str) -> Source:
    """Open `path` ('-' = stdin; gzip detected by its magic bytes) and check the first block."""
    if path == "-":
        stream: BinaryIO = sys.stdin.buffer
        name = "<stdin>"
        head = _peek(stream, name)
        if head[:2] == b"\x1f\x8b":
            stream = _Gunzip(_Prepend(head, stream))  # type: ignore[arg-type,assignment]
            head = _peek(stream, name)
    else:
        p = Path(path)
        name = path
        try:
            is_dir = p.is_dir()
        except (OSError, ValueError):  # a name too long for the file system: reported by the open below
            is_dir = False
        if is_dir:
            raise DiagnoseError(
                f"{path}: is a directory", hint="give the log files themselves, e.g. DIR/*.log"
            )
        try:
            raw = _open_log(path)
            magic = raw.read(2)
        except FileNotFoundError:
            raise DiagnoseError(f"{path}: no such file", hint="check the path") from None
        except OSError as exc:
            raise DiagnoseError(
                f"{path}: cannot open: {exc.strerror or exc}", hint="check the permissions"
            ) from None
        # no seek: a named pipe or a process substitution (/dev/fd/63) cannot seek
        joined = _Prepend(magic, raw)
        stream = _Gunzip(joined) if magic == b"\x1f\x8b" else joined  # type: ignore[assignment,arg-type]
        head = _peek(stream, name)
    if not head:
        raise DiagnoseError(f"{name}: the log is empty", hint="give the file the job's stdout/stderr went to")
    if b"\x00" in head[:_SNIFF_BYTES]:
        raise DiagnoseError(
            f"{name}: this is a binary file, not a text log (NUL bytes in the first {_SNIFF_BYTES} bytes)",
            hint="give the text log; for a core dump or a checkpoint, diagnose the job's stdout/stderr",
        )
    src = Source(name, _Prepend(head, stream))  # type: ignore[arg-type]
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.start < len(head) - 4:  # not just a multi-byte character cut by the block end
            src.notes.append(
                f"{name}: not valid UTF-8 (first bad byte at offset {exc.start}); "
                "undecodable bytes are shown as U+FFFD"
            )
    return src


def _open_log(path: str) -> BinaryIO:
    """Open a log for reading: a regular file, or a named pipe / process substitution (streamed). A pipe with
    no writer is opened without blocking and then reads as empty (no hang); devices and sockets are refused."""
    st = os.stat(path)
    if stat.S_ISFIFO(st.st_mode):
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
        fcntl.fcntl(fd, fcntl.F_SETFL, flags & ~os.O_NONBLOCK)
        return os.fdopen(fd, "rb")
    if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) or stat.S_ISSOCK(st.st_mode):
        raise DiagnoseError(
            f"{path}: is a device or socket, not a log file",
            hint="give the file the job's output went to, or pipe it in with -",
        )
    return open(path, "rb")  # noqa: SIM115 - closed by Source.close


def _peek(stream: BinaryIO, name: str) -> bytes:
    try:
        return stream.read(_SNIFF_BYTES)
    except (OSError, EOFError, zlib.error) as exc:
        raise DiagnoseError(
            f"{name}: cannot read: {exc}", hint="is it a complete, uncorrupted file?"
        ) from None


class _Gunzip:
    """A streaming gzip reader that hands on every byte it could decompress before it raises.

    `gzip.GzipFile.read(n)` raises on a truncated member and the bytes it decompressed in that call are lost
    (up to a whole 8 MB chunk). Here the compressed input is fed to zlib in 256 KB pieces, decompressed output
    is returned as it comes, and the error (truncated, corrupt) is raised only on the read after the last good
    byte. Concatenated members (`cat a.gz b.gz`) are read one after another."""

    _IN = 256 << 10

    def __init__(self, raw: BinaryIO) -> None:
        self._raw = raw
        self._d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        self._buf = bytearray()
        self._error: Exception | None = None
        self._done = False

    def _fill(self, n: int) -> None:
        while len(self._buf) < n and not self._done and self._error is None:
            data = self._d.unconsumed_tail or self._raw.read(self._IN)
            if not data:
                if not self._d.eof:
                    self._error = EOFError(
                        "compressed file ended before the end-of-stream marker was reached"
                    )
                self._done = True
                break
            try:
                self._buf += self._d.decompress(data, max(n - len(self._buf), 1 << 16))
            except zlib.error as exc:
                self._error = exc
                break
            if self._d.eof:
                rest = self._d.unused_data
                self._d = zlib.decompressobj(16 + zlib.MAX_WBITS)
                if rest.lstrip(b"\x00"):  # another member follows (trailing zero padding is not one)
                    try:
                        self._buf += self._d.decompress(rest, 1 << 16)
                    except zlib.error as exc:
                        self._error = exc
                        break
                else:
                    more = self._raw.read(self._IN)
                    if not more.lstrip(b"\x00"):
                        self._done = True
                        break
                    try:
                        self._buf += self._d.decompress(more, 1 << 16)
                    except zlib.error as exc:
                        self._error = exc
                        break

    def read(self, n: int = -1) -> bytes:
        want = n if n >= 0 else 1 << 62
        self._fill(want)
        if not self._buf and self._error is not None:
            err, self._error = self._error, None
            self._done = True
            raise err
        out = bytes(self._buf[:want])
        del self._buf[:want]
        return out

    def close(self) -> None:
        self._raw.close()


class _Prepend:
    """A read-only stream that first returns `head`, then the rest of `stream`."""

    def __init__(self, head: bytes, stream: BinaryIO) -> None:
        self._head = head
        self._stream = stream

    def read(self, n: int = -1) -> bytes:
        if self._head:
            head, self._head = self._head, b""
            if n < 0:
                return head + self._stream.read()
            if len(head) >= n:
                self._head = head[n:]
                return head[:n]
            return head + self._stream.read(n - len(head))
        return self._stream.read(n)

    def close(self) -> None:
        self._stream.close()


def iter_pieces(src: Source, size: int = CHUNK_BYTES) -> Iterator[tuple[bytes, bool]]:
    """Newline-aligned chunks of about `size` bytes, each with `continues`: True when the chunk ends inside a
    line that the next chunk continues (same line number).

    Memory stays bounded and nothing is skipped: a line longer than MAX_LINE_BYTES (a stream of tqdm `\\r`
    updates with no newline, a dump) is cut at its last `\\r` before that length (so progress segments stay
    whole), else at that length, and handed on in pieces. The last chunk may end without a newline (a
    truncated log): it is complete, `continues` False."""
    carry = b""
    while True:
        try:
            block = src.stream.read(size)
        except (OSError, EOFError, zlib.error) as exc:
            # A truncated or corrupt .gz: diagnose what was readable, say where it stopped.
            src.notes.append(
                f"{src.name}: stopped reading after {src.offset + len(carry):,} bytes of text: {exc} (the file "
                "looks truncated or corrupt); every line before that point was read"
            )
            block = b""
        if not block:
            if carry:
                src.offset += len(carry)
                yield carry, False
            return
        data = carry + block if carry else block
        cut = data.rfind(b"\n")
        if cut < 0:
            if len(data) > MAX_LINE_BYTES:
                cr = data.rfind(b"\r", 0, MAX_LINE_BYTES)
                at = cr + 1 if cr > 0 else MAX_LINE_BYTES
                src.offset += at
                yield data[:at], True
                carry = data[at:]
            else:
                carry = data
            continue
        carry = data[cut + 1 :]
        src.offset += cut + 1
        yield data[: cut + 1] if carry else data, False


def iter_chunks(src: Source, size: int = CHUNK_BYTES) -> Iterator[bytes]:
    """The chunks of `iter_pieces` without the continuation flag."""
    for chunk, _continues in iter_pieces(src, size):
        yield chunk


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
