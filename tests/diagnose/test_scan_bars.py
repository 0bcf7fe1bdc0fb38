"""Logs of a data-preparation or loading job, a progress bar on nearly every line (issue 10): the bar-marker patterns are
scanned apart, and between two other hit lines only the last marker line is read (scan.BAR_MARKER_KEYS) - or, where
the stretch names a rank or a time, the last line of each rank prefix and every other line. The work is counted here,
not timed, so the tests do not depend on the machine's load; and the answers are checked against reading every bar."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from zerodoctor.diagnose import diagnose, scan
from zerodoctor.diagnose.classes import _silence_before_interrupt
from zerodoctor.diagnose.reader import parse_line

OOM = (
    "[Fri Jun 21 13:59:58 2024] Out of memory: Killed process 4242 (python) total-vm:812345678kB, "
    "anon-rss:498765432kB, file-rss:0kB, shmem-rss:0kB, UID:1000 pgtables:987654kB oom_score_adj:0\n"
)
CUDA_OOM = (
    "Traceback (most recent call last):\n"
    '  File "/w/train.py", line 9, in <module>\n'
    "    trainer.train()\n"
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.15 GiB "
    "of which 1.2 GiB is free.\n"
)
RUN = 100  # bar lines per run
SEP = "Tokenizing train dataset\n"  # (a marker line with no bar)


def _bars(lines: int, prefix: str = "", sep: str = "") -> str:
    """`lines` bars, tokenization's then checkpoint loading's in each run of RUN, `sep` after each run."""
    out: list[str] = []
    for i in range(lines):
        p = i % 100
        bar = ("\u2588" * (p // 10)).ljust(10)
        if i % RUN < RUN // 2:
            out.append(
                f"{prefix}Map (num_proc=8): {p:3d}%|{bar}| {p * 500}/50000 [00:{p % 60:02d}<00:05, 8{p}.5 examples/s]\n"
            )
        else:
            out.append(
                f"{prefix}Loading checkpoint shards: {p:3d}%|{bar}| {p % 5}/4 [00:0{p % 10}<00:02,  1.{p % 10}s/it]\n"
            )
        if i % RUN == RUN - 1:
            out.append(sep)
    return "".join(out)


@pytest.fixture
def parse_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []

    def counting(source: str, lineno: int, raw: bytes):  # type: ignore[no-untyped-def]
        calls.append(lineno)
        return parse_line(source, lineno, raw)

    monkeypatch.setattr(scan, "parse_line", counting)
    return calls


class _Counting:
    """An engine that counts the matches it hands to Python (`matches`, one entry a scan) and its scans (`scans`)."""

    def __init__(self, eng: Any, matches: list[int]) -> None:
        self.eng, self.matches = eng, matches
        self.name = eng.name
        self.scans = 0

    def find(self, data: bytes, end: int | None = None, start: int = 0) -> list[tuple[int, int]]:
        self.scans += 1
        found = self.eng.find(data, end, start)
        self.matches.append(len(found))
        return found

    def any_in(self, data: bytes, start: int, end: int) -> bool:
        self.scans += 1
        return bool(self.eng.any_in(data, start, end))


def test_bars_between_two_hits_are_read_as_the_last_one(
    tmp_path: Path, parse_calls: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    bar_matches: list[int] = []
    gap_engines = scan.gap_engines
    monkeypatch.setattr(
        scan, "gap_engines", lambda name: (_Counting(gap_engines(name)[0], bar_matches), gap_engines(name)[1])
    )
    log = tmp_path / "bars.log"
    log.write_text(_bars(10_000, sep=SEP) + OOM, encoding="utf-8")
    result = diagnose([str(log)])
    lines = 10_000 + 10_000 // RUN
    # the last marker line and the OOM line reach the per-hit path (before issue 10: all 10,100 marker lines); the bars
    # before them never reach Python: what the bar engine hands over is a window scanned back from the OOM line
    assert parse_calls == [lines, lines + 1]
    assert sum(bar_matches) < 40, bar_matches
    assert [(kind, line.lineno) for kind, line, _seq in result.facts.markers] == [("data", lines)]
    assert result.facts.events[0].phase == "tokenization"


def test_a_few_bars_among_many_hits_cost_a_few_scans(
    tmp_path: Path, parse_calls: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    bar_matches: list[int] = []
    gap_engines = scan.gap_engines
    counting = _Counting(gap_engines(scan.engine().name)[0], bar_matches)
    monkeypatch.setattr(scan, "gap_engines", lambda name: (counting, gap_engines(name)[1]))
    info = "DeepSpeed info: version=0.14.4, git-hash=unknown, git-branch=unknown\n"  # (a hit line: x:ver-ds-info)
    log = tmp_path / "hits.log"
    log.write_text(info * 1000 + _bars(RUN) + info * 1000 + OOM, encoding="utf-8")
    result = diagnose([str(log)])
    # every hit line, the last bar, the OOM line; the stretches with no bar are ruled out in halves, not one by one
    assert len(parse_calls) == 2000 + 1 + 1 and 1000 + RUN in parse_calls
    assert counting.scans < 40, counting.scans
    bars = [(kind, line.lineno) for kind, line, _seq in result.facts.markers if kind in ("data", "load")]
    assert bars == [("load", 1000 + RUN)]


def test_the_last_bar_of_a_log_names_its_phase(tmp_path: Path, parse_calls: list[int]) -> None:
    log = tmp_path / "bars.log"
    log.write_text(_bars(10_000) + OOM, encoding="utf-8")
    result = diagnose([str(log)])
    # (the last bar at its own line: not joined with the bars of its width above it as a terminal-wrapped line)
    assert parse_calls == [10_000, 10_001]
    assert [(m[0], m[1].lineno) for m in result.facts.markers] == [("load", 10_000)]
    assert result.facts.events[0].phase == "load"


def test_where_ranks_are_named_the_last_bar_of_each_is_read(tmp_path: Path, parse_calls: list[int]) -> None:
    log = tmp_path / "ranks.log"
    # rank 0 and rank 1 print the same tokenization bar in turns, then rank 0 alone
    text = "".join(
        f"[rank{i % 2}]: Map (num_proc=8): {i % 100:3d}%|{'#' * 10}| {i}/50000 [00:01<00:05, 812.5 examples/s]\n"
        for i in range(200)
    )
    log.write_text(text + _bars(2 * RUN, "[rank0]: ") + OOM, encoding="utf-8")
    result = diagnose([str(log)])
    assert result.facts.ranks_in_log == {0, 1}
    assert parse_calls == [200, 400, 401]
    assert result.facts.markers[-1][1].lineno == 400
    parse_calls.clear()
    # pdsh's `host-1: ` in front of a bar names no rank: the last bar answers for both hosts
    log.write_text(
        "".join(
            f"node-{i % 2}:  {i % 100:2d}%|{'#' * 10}| {i}/50000 [00:01<00:05, 812.5 examples/s]\n"
            for i in range(50)
        )
        + OOM,
        encoding="utf-8",
    )
    diagnose([str(log)])
    assert parse_calls == [50, 51]


def test_a_bar_with_a_date_is_read_and_its_time_kept(tmp_path: Path, parse_calls: list[int]) -> None:
    # dated bars, then undated ones, then a Ctrl-C an hour later: the silence is measured from the last dated bar
    dated = "".join(
        f"Map (num_proc=8): {i:3d}%|{'#' * 10}| {i}/50000 [00:01<00:05, 812.5 examples/s] 2024-06-21 10:00:{i:02d}\n"
        for i in range(20)
    )
    stop = "KeyboardInterrupt at 2024-06-21 11:00:00\n"
    log = tmp_path / "dated.log"
    log.write_text(dated + _bars(RUN) + stop, encoding="utf-8")
    result = diagnose([str(log)])
    assert parse_calls == [*range(1, 21), 20 + RUN, 21 + RUN]
    silence = _silence_before_interrupt(result.facts)
    assert silence is not None and silence[0] == 3600 - 19 and silence[1].lineno == 20


# Logs whose answers must not depend on which bars are read: the failure amid, after and glued onto bars, a stack dump
# the run outlived, ranks interleaved, a finished run, a Ctrl-C after a silence.
_DUMP = (
    'Thread 0x00007f (most recent call first):\n  File "/x/torch/distributed/distributed_c10d.py", line 3, in barrier\n'
    '  File "/w/train.py", line 9 in <module>\n'
)
_CASES = {
    "oom-after-bars": _bars(3 * RUN, sep=SEP) + CUDA_OOM,
    "oom-amid-bars": _bars(2 * RUN) + CUDA_OOM + _bars(2 * RUN),
    "kill-glued-onto-a-bar": _bars(RUN) + "Loading checkpoint shards:  50%|#####     | 2/4 [00:01<00:02,  1.2s/it]Killed\n",
    "dump-then-bars": _bars(RUN) + _DUMP + _bars(RUN),
    "ranks": "".join(
        f"[rank{i % 3}]:Map:  {i % 100:2d}%|{'#' * 10}| {i}/9000 [00:01<00:05, 81.5 examples/s]\n" for i in range(300)
    )
    + "[rank1]: " + CUDA_OOM.replace("\n", "\n[rank1]: ").rstrip(" [rank1]:") + "\n"
    + "".join(f"[rank{i % 2 * 2}]:Map:  {i % 100:2d}%|{'#' * 10}| {i}/9000 [00:01<00:05, 8.5 examples/s]\n" for i in range(90)),
    "finished-then-bars": "{'train_runtime': 12.5, 'train_samples_per_second': 3.1}\n" + _bars(RUN) + OOM,
    "silence": _bars(RUN, "at 2024-06-21 10:00:00 ") + _bars(RUN) + "KeyboardInterrupt at 2024-06-21 11:00:00\n",
}  # fmt: skip


def _answer(path: Path) -> tuple[object, ...]:
    d = diagnose([str(path)])
    events = [(e.kind, e.line.lineno, e.rank, e.phase, e.detail) for e in d.facts.events]
    findings = [(f.id, f.severity, f.title, f.message) for f in d.findings]
    silence = _silence_before_interrupt(d.facts)
    return events, findings, d.facts.end_phase, sorted(d.facts.ranks_in_log), silence and silence[:1]


@pytest.mark.parametrize("case", sorted(_CASES))
def test_the_answer_is_the_one_every_bar_read_gives(
    case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / f"{case}.log"
    log.write_text(_CASES[case], encoding="utf-8")
    answer = _answer(log)
    # (every bar read: every stretch "names a rank" and no bar has a rank key of its own)
    bars, rank_or_time = scan.gap_engines(scan.engine().name)
    monkeypatch.setattr(scan, "gap_engines", lambda _name: (bars, _Always(rank_or_time)))
    monkeypatch.setattr(scan, "_bar_key", lambda *_args: None)
    assert _answer(log) == answer


class _Always:
    def __init__(self, eng: Any) -> None:
        self.name = eng.name

    def any_in(self, data: bytes, start: int, end: int) -> bool:
        return True


def _map_bar(i: int) -> str:
    return f"Map:  {i // 10:2d}%|#         | {i}/1000 [00:01<00:02, 1234.56 examples/s]"


@pytest.mark.parametrize(
    ("prefix", "eol"), [("", "\n"), ("host-a: ", "\n"), ("", "\r\n")], ids=["plain", "host", "crlf"]
)
def test_a_failure_glued_behind_a_bar_and_wrapped_is_read_mid_stretch(tmp_path: Path, prefix: str, eol: str) -> None:
    """Review R8: `...examples/s]Segmentation fa` + `ult (core dumped)` on the next line, with bars before and after:
    neither half is a hit alone, so the line must be read (and joined with its wrapped rest) though it is not the
    stretch's last bar."""
    lines = [prefix + _map_bar(i) for i in range(150)]
    lines += [prefix + _map_bar(150) + "Segmentation fa", "ult (core dumped)"]  # (a terminal's wrap: no prefix)
    lines += [prefix + _map_bar(i) for i in range(151, 300)]
    log = tmp_path / "wrapped.log"
    log.write_bytes(eol.join(lines).encode() + eol.encode())
    top = diagnose([str(log)]).findings[0]
    assert top.data["failure_class"]["id"] == "class:crash", top
    assert top.data["first_failure"]["line"] == 151, top.data["first_failure"]
