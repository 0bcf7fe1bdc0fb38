"""Open training logs as bytes in bounded memory: plain files, `.gz` files, named pipes or stdin, handed on as
newline-aligned chunks: `iter_spans` without copying them (what the scanner reads), `iter_pieces` as bytes of their
own.

Bad input is a `DiagnoseError` naming the file and what to do: a path that cannot be opened, an empty file,
a binary file (NUL bytes in the first block), a device or socket. A truncated or corrupt `.gz` is read up to its
last good byte and the stop is noted on the `Source`.
"""

from __future__ import annotations

import codecs
import fcntl
import os
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


@dataclass
class Source:
    """An opened log: its display name and a binary stream positioned at the start. `seekable`: the stream is a
    plain regular file that can step back (`iter_spans` reads each chunk from a line start instead of copying the
    partial last line in front of the next block)."""

    name: str
    stream: BinaryIO
    notes: list[str] = field(default_factory=list)
    offset: int = 0  # bytes of text handed on so far (for "stopped reading after N bytes")
    seekable: bool = False

    def close(self) -> None:
        if self.stream is not sys.stdin.buffer:
            self.stream.close()


def open_source(path: str) -> Source:
    """Open `path` ('-' = stdin; gzip detected by its magic bytes) and check the first block."""
    plain: BinaryIO | None = None
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
        # no seek: a named pipe or a process substitution (/dev/fd/63) cannot seek; a plain regular file is
        # rewound after the checks below and read directly
        if magic != b"\x1f\x8b" and raw.seekable():
            plain = raw
        joined = _Prepend(magic, raw)
        stream = _Gunzip(joined) if magic == b"\x1f\x8b" else joined  # type: ignore[assignment,arg-type]
        head = _peek(stream, name)
    notes: list[str] = []
    if head[:2] in UTF16_BOMS:
        # UTF-16 text (PowerShell 5.1's `>` writes UTF-16LE with a BOM): read as the UTF-8 it decodes to
        stream = _Utf16(_Prepend(head, stream))  # type: ignore[arg-type,assignment]
        plain = None
        head = _peek(stream, name)
        notes.append(f"{name}: UTF-16 text (byte-order mark), read as decoded")
    if not head:
        raise DiagnoseError(f"{name}: the log is empty", hint="give the file the job's stdout/stderr went to")
    if b"\x00" in head[:_SNIFF_BYTES]:
        raise DiagnoseError(
            f"{name}: this is a binary file, not a text log (NUL bytes in the first {_SNIFF_BYTES} bytes)",
            hint="give the text log; for a core dump or a checkpoint, diagnose the job's stdout/stderr; for text "
            "saved as UTF-16 without a byte-order mark, convert it first: iconv -f UTF-16LE -t UTF-8 FILE > FILE.txt",
        )
    cr_lines = _cr_line_ends(head)
    src = _rewound(name, plain) if plain is not None else None
    if src is None:
        src = Source(name, _Prepend(head, stream))  # type: ignore[arg-type]
    src.notes.extend(notes)
    if cr_lines:
        src.stream = _CrLines(src.stream)  # type: ignore[assignment]
        src.seekable = False
        src.notes.append(
            f"{name}: its lines end in a carriage return (CR) alone: each CR is read as a line end"
        )
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.start < len(head) - 4:  # not just a multi-byte character cut by the block end
            src.notes.append(
                f"{name}: not valid UTF-8 (first bad byte at offset {exc.start}); "
                "undecodable bytes are shown as U+FFFD"
            )
    return src


UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")


def _cr_line_ends(head: bytes) -> bool:
    """Whether a log's first block says its lines end in a lone CR (classic Mac, or a `tr '\\n' '\\r'` copy): no LF
    at all, two or more CRs, and at least three pieces between them that are not tqdm updates (a log that opens with
    a long run of a bar's `\\r` refreshes keeps them as segments of one line, as in any other log)."""
    if b"\n" in head or head.count(b"\r") < 2:
        return False
    records = 0
    for piece in head.split(b"\r"):
        if piece.strip() and not (b"%|" in piece or b"it/s" in piece or b"s/it" in piece):
            records += 1
            if records >= 3:
                return True
    return False


class _CrLines:
    """A stream read with universal line ends: CR LF and a lone CR read as LF (a CR at the end of a read waits for
    the next byte). Not seekable: the offsets are no longer the file's."""

    def __init__(self, raw: BinaryIO) -> None:
        self._raw = raw
        self._cr = False  # a CR held back from the end of the last read

    def read(self, n: int = -1) -> bytes:
        while True:
            got = self._raw.read(n)
            data = b"\r" + got if self._cr else got
            self._cr = bool(got) and n >= 0 and data.endswith(b"\r")  # (read(-1) reads to the end)
            if self._cr:
                data = data[:-1]
            if data or not got:
                return data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")

    def close(self) -> None:
        self._raw.close()


class _Utf16:
    """A UTF-16 stream (its BOM names the byte order) read as UTF-8 bytes; a bad code unit reads as U+FFFD."""

    def __init__(self, raw: BinaryIO) -> None:
        self._raw = raw
        self._dec = codecs.getincrementaldecoder("utf-16")(errors="replace")

    def read(self, n: int = -1) -> bytes:
        while True:
            data = self._raw.read(n)
            text = self._dec.decode(data, final=not data)
            if text or not data:
                return text.encode("utf-8", "replace")

    def close(self) -> None:
        self._raw.close()


def _rewound(name: str, raw: BinaryIO) -> Source | None:
    """A regular file read from its start again (its first block was read for the checks), or None if it
    cannot seek after all (then the block read is handed on in front of the rest)."""
    try:
        raw.seek(0)
    except OSError:
        return None
    return Source(name, raw, seekable=True)


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
        if isinstance(stream, _Gunzip):  # not one byte of text: the same error as an empty plain log
            raise DiagnoseError(
                f"{name}: the log is empty: no text could be decompressed ({exc})",
                hint="the .gz file is truncated or corrupt: copy it again, or give the uncompressed log",
            ) from None
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
        self._error: Exception | None = None

    def read(self, n: int = -1) -> bytes:
        if self._error is not None:
            err, self._error = self._error, None
            raise err
        if self._head:
            head, self._head = self._head, b""
            if 0 <= n <= len(head):
                self._head = head[n:]
                return head[:n]
            try:
                return head + self._stream.read(n - len(head) if n >= 0 else -1)
            except (OSError, EOFError, zlib.error) as exc:
                # (a truncated .gz raises on the read after its last good byte: the head goes first, the error next)
                self._error = exc
                return head
        return self._stream.read(n)

    def close(self) -> None:
        self._stream.close()


def iter_spans(src: Source, size: int = CHUNK_BYTES) -> Iterator[tuple[bytes, int, bool]]:
    """Newline-aligned pieces of about `size` bytes, without copying them: each is `(data, end, continues)`, the
    piece being `data[:end]` (the bytes after `end` belong to the next piece); `continues` is True when the piece
    ends inside a line that the next piece continues (same line number).

    Memory stays bounded and nothing is skipped: a line longer than MAX_LINE_BYTES (a stream of tqdm `\\r`
    updates with no newline, a dump) is cut at its last `\\r` before that length (so progress segments stay
    whole), else at that length, and handed on in pieces. The last piece may end without a newline (a
    truncated log): it is complete, `continues` False.

    A seekable source (a regular file) is read from the start of the line after each piece's last newline: the
    piece is the block `read` returned, as it is. Otherwise the partial line at a block's end is joined to the
    next block (one copy). (Slicing each piece out of its block and joining blocks cost 0.3 s of CPU per 300 MiB
    here, a third of the scan: every fresh 8 MiB object is new memory to fault in.)"""
    carry = b""
    stream = src.stream
    while True:
        try:
            block = stream.read(size)
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
                yield carry, len(carry), False
            return
        data = carry + block if carry else block
        cut = data.rfind(b"\n")
        if cut < 0:
            if len(data) > MAX_LINE_BYTES:
                cr = data.rfind(b"\r", 0, MAX_LINE_BYTES)
                at = cr + 1 if cr > 0 else MAX_LINE_BYTES
                src.offset += at
                yield data, at, True
                carry = _rest(src, data, at)
            else:
                carry = data
            continue
        src.offset += cut + 1
        yield data, cut + 1, False
        carry = _rest(src, data, cut + 1)


def _rest(src: Source, data: bytes, end: int) -> bytes:
    """What follows a piece: stepped back over in a seekable source (read again with the next block), else kept
    to go in front of it."""
    if end == len(data):
        return b""
    if src.seekable:
        src.stream.seek(end - len(data), os.SEEK_CUR)
        return b""
    return data[end:]


def iter_pieces(src: Source, size: int = CHUNK_BYTES) -> Iterator[tuple[bytes, bool]]:
    """The pieces of `iter_spans` as bytes of their own (each sliced out of its block), with `continues`."""
    for data, end, continues in iter_spans(src, size):
        yield (data if end == len(data) else data[:end]), continues


def iter_chunks(src: Source, size: int = CHUNK_BYTES) -> Iterator[bytes]:
    """The chunks of `iter_pieces` without the continuation flag."""
    for chunk, _continues in iter_pieces(src, size):
        yield chunk
