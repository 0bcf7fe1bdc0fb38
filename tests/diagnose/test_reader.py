"""The streaming reader: prefixes, ANSI, tqdm carriage returns, CRLF, gzip, stdin, truncation, bad input."""

from __future__ import annotations

import gzip
import io
import sys
from pathlib import Path

import pytest

from zerodoctor.diagnose.reader import parse_line, read_lines, split_prefixes
from zerodoctor.diagnose.scan import ScanStats, iter_hits
from zerodoctor.diagnose.source import iter_chunks, open_source
from zerodoctor.errors import DiagnoseError


@pytest.mark.parametrize(
    ("raw", "text", "rank", "host"),
    [
        ("[rank3]: RuntimeError: boom", "RuntimeError: boom", 3, None),
        ("[default0]:Traceback (most recent call last):", "Traceback (most recent call last):", 0, None),
        ("host-1: [rank12]: x", "x", 12, "host-1"),
        ("10.0.0.7: [2024-05-01 12:00:00,123] [INFO] hi", "[INFO] hi", None, "10.0.0.7"),
        ("[1,5]<stderr>: oops", "oops", 5, None),
        ("RuntimeError: not a host", "RuntimeError: not a host", None, None),
        (
            "torch.OutOfMemoryError: CUDA out of memory.",
            "torch.OutOfMemoryError: CUDA out of memory.",
            None,
            None,
        ),
    ],
)
def test_prefixes(raw: str, text: str, rank: int | None, host: str | None) -> None:
    body, r, h, _ts = split_prefixes(raw)
    assert (body, r, h) == (text, rank, host)


def test_ansi_tqdm_and_crlf() -> None:
    raw = b"\x1b[31m[rank1]:  1%|1 | 1/100 [00:01<01:40,  1.0s/it]\r  2%|2 | 2/100 [00:02<01:38,  1.0s/it]\rboom\x1b[0m\r\n"
    lines = parse_line("f", 7, raw)
    assert [ln.text for ln in lines][-1] == "boom"
    assert all(ln.rank == 1 and ln.lineno == 7 for ln in lines)
    assert len(lines) == 3


def test_gzip_truncated_and_line_numbers(tmp_path: Path) -> None:
    p = tmp_path / "log.gz"
    p.write_bytes(gzip.compress(b"a\r\nb\nRuntimeError: last line without newline"))
    lines = list(read_lines(str(p)))
    assert [(ln.lineno, ln.text) for ln in lines] == [
        (1, "a"),
        (2, "b"),
        (3, "RuntimeError: last line without newline"),
    ]


def test_corrupt_gzip_is_read_as_far_as_possible(tmp_path: Path) -> None:
    data = gzip.compress(b"x\n" * 100000 + b"RuntimeError: boom\n")
    p = tmp_path / "cut.log.gz"
    p.write_bytes(data[: len(data) // 2])
    src = open_source(str(p))
    list(iter_chunks(src))
    assert any("truncated" in n for n in src.notes)


def test_chunk_boundaries_do_not_split_or_lose_lines(tmp_path: Path) -> None:
    p = tmp_path / "big.log"
    body = "".join(f"line {i}\n" for i in range(5000)) + "RuntimeError: at the end\n"
    p.write_text(body)
    stats = ScanStats()
    hits = list(iter_hits([str(p)], stats, chunk_bytes=1000))
    assert stats.lines[str(p)] == 5001
    assert [(h.line.lineno, h.line.text) for h in hits] == [(5001, "RuntimeError: at the end")]


@pytest.mark.parametrize(
    ("content", "message"),
    [(b"", "empty"), (b"\x7fELF\x00\x00\x00binary", "binary")],
)
def test_bad_input(tmp_path: Path, content: bytes, message: str) -> None:
    p = tmp_path / "bad.log"
    p.write_bytes(content)
    with pytest.raises(DiagnoseError, match=message):
        open_source(str(p))


def test_missing_and_directory(tmp_path: Path) -> None:
    with pytest.raises(DiagnoseError, match="no such file"):
        open_source(str(tmp_path / "nope.log"))
    with pytest.raises(DiagnoseError, match="directory"):
        open_source(str(tmp_path))


def test_invalid_utf8_is_a_note_not_an_error(tmp_path: Path) -> None:
    p = tmp_path / "latin1.log"
    p.write_bytes("caf\xe9 ok\n".encode("latin-1") + b"RuntimeError: x\n")
    src = open_source(str(p))
    assert src.notes and "UTF-8" in src.notes[0]
    assert [ln.text for ln in read_lines(str(p))][0] == "caf\ufffd ok"


def test_stdin(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = io.TextIOWrapper(io.BytesIO(gzip.compress(b"ValueError: from stdin\n")))
    monkeypatch.setattr(sys, "stdin", fake)
    hits = list(iter_hits(["-"]))
    assert hits[0].line.source == "<stdin>" and hits[0].line.text == "ValueError: from stdin"


def test_python_fallback_engine_finds_the_same_lines(tmp_path: Path) -> None:
    from zerodoctor.diagnose.scan import engine, scan_source

    p = tmp_path / "x.log"
    p.write_text(
        "ok\n[rank2]: exits with return code = -9\nCUDA out of memory. Tried to allocate 1.00 GiB\nok\n"
    )
    got = {}
    for name in ("python", "auto"):
        items = list(scan_source(open_source(str(p)), 0, eng=engine(name)))
        got[name] = [(h.line.lineno, sorted(h.keys)) for h in items if not isinstance(h, int)]
    assert got["python"] == got["auto"] and len(got["auto"]) == 2
