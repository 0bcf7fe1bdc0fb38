"""Pieces handed on without copies (`source.iter_spans`): a regular file is read again from the line after each
piece, a pipe or a stream joins the partial last line to the next block. Either way every byte is handed on once,
each piece ends at a newline unless its line goes on in the next one, and the scan finds the same hits with the
same line numbers and progress whatever the chunk size and however the bytes arrive."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from zerodoctor.diagnose.scan import Hit, ScanState, engine, scan_source
from zerodoctor.diagnose.source import MAX_LINE_BYTES, Source, iter_pieces, iter_spans, open_source


def _log(steps: int, *, long_line: bool = True) -> bytes:
    """Ranks' lines, trainer progress, tqdm updates, CUDA OOMs and NCCL errors now and then; with `long_line`, one
    tqdm stream longer than MAX_LINE_BYTES with no newline (cut at its carriage returns) with an OOM message among
    its updates; no newline at the very end."""
    out: list[bytes] = []
    for step in range(1, steps + 1):
        out.append(f"[rank{step % 4}]: {{'loss': 1.{step:04d}, 'epoch': {step / 1000:.3f}}}\n".encode())
        out.append(f"[rank0]: \r {step}/9000 [01:00<40:00,  1.61s/it]\r {step}/9000 [01:01<40:00]\n".encode())
        if step % 97 == 0:
            out.append(
                f"[rank{step % 4}]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n".encode()
            )
        if step % 151 == 0:
            out.append(f"[rank{step % 3}]: NCCL error in: ProcessGroupNCCL.cpp:1275, step {step}\n".encode())
        if step == steps // 2 and long_line:
            bar = b"".join(
                b"\r %d/9000 [00:%02d<10:00,  3.0it/s]" % (i, i % 60)
                if i != 40_000
                else b"\rtorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB"
                for i in range(50_000)
            )
            assert len(bar) > MAX_LINE_BYTES
            out.append(b"[rank1]: " + bar + b"\n")
    out.append(b"[rank2]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 9.00 GiB")
    return b"".join(out)


DATA = _log(3000)
SHORT_LINES = _log(3000, long_line=False)


def _sources(tmp_path: Path) -> list[Source]:
    path = tmp_path / "run.log"
    path.write_bytes(DATA)
    file_src = open_source(str(path))
    assert file_src.seekable
    pipe_src = Source("run.log", io.BytesIO(DATA))  # read as a pipe or stdin is: no stepping back
    assert not pipe_src.seekable
    return [file_src, pipe_src]


@pytest.mark.parametrize("size", [4096, 65536, 8 << 20])
def test_every_byte_once_and_pieces_end_at_newlines(tmp_path: Path, size: int) -> None:
    for src in _sources(tmp_path):
        spans = list(iter_spans(src, size))
        src.close()
        pieces = [data[:end] for data, end, _continues in spans]
        assert b"".join(pieces) == DATA
        for piece, (_data, _end, continues) in zip(pieces[:-1], spans[:-1], strict=True):
            assert piece.endswith(b"\n") or (continues and len(piece) <= MAX_LINE_BYTES)
        assert not spans[-1][2] and not pieces[-1].endswith(b"\n")
        assert src.offset == len(DATA)


def test_a_regular_file_hands_on_the_blocks_it_read(tmp_path: Path) -> None:
    """No piece of a regular file is joined from two reads (a pipe's are: its partial line goes in front)."""
    path = tmp_path / "run.log"
    path.write_bytes(SHORT_LINES)
    src = open_source(str(path))
    assert all(len(data) <= 4096 for data, _end, _continues in iter_spans(src, 4096))
    src.close()
    pipe = Source("run.log", io.BytesIO(SHORT_LINES))
    assert any(len(data) > 4096 for data, _end, _continues in iter_spans(pipe, 4096))


def test_iter_pieces_are_the_spans_as_bytes(tmp_path: Path) -> None:
    file_src, pipe_src = _sources(tmp_path)
    pieces = list(iter_pieces(file_src, 4096))
    file_src.close()
    assert b"".join(p for p, _ in pieces) == DATA
    assert all(type(p) is bytes for p, _ in pieces)


def _hits(src: Source, size: int) -> list[tuple[object, ...]]:
    items = list(scan_source(src, 0, chunk_bytes=size, state=ScanState(engine())))
    src.close()
    out: list[tuple[object, ...]] = []
    for item in items:
        if isinstance(item, Hit):
            out.append((item.line.lineno, item.line.rank, item.line.text, sorted(item.keys), item.progress))
        else:
            out.append(("lines", item))
    return out


def test_same_hits_whatever_the_chunk_size_and_the_stream(tmp_path: Path) -> None:
    reference = _hits(_sources(tmp_path)[0], 8 << 20)
    assert reference[-1] == ("lines", DATA.count(b"\n") + 1)
    assert sum(1 for h in reference if h[0] != "lines") > 40
    for size in (4096, 65536):
        for src in _sources(tmp_path):
            assert _hits(src, size) == reference, (size, src.seekable)
