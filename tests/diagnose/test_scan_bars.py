"""Logs of a data-preparation or loading job, a progress bar on nearly every line (issue 10): a run of plain bars that
only hit a phase marker is read as its last line, so the per-hit path (decode, normalise, re-check, extract) runs once
per run, not once per line - counted here, not timed, so the test does not depend on the machine's load."""

from __future__ import annotations

from pathlib import Path

import pytest

from zerodoctor.diagnose import diagnose, scan
from zerodoctor.diagnose.reader import parse_line

OOM = (
    "[Fri Jun 21 13:59:58 2024] Out of memory: Killed process 4242 (python) total-vm:812345678kB, "
    "anon-rss:498765432kB, file-rss:0kB, shmem-rss:0kB, UID:1000 pgtables:987654kB oom_score_adj:0\n"
)
RUN = 100  # bar lines per run
SEP = "Tokenizing train dataset\n"  # (a marker line with no bar, read on its own: it ends a run)


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


def test_runs_of_bars_reach_the_per_hit_path_once_per_run(tmp_path: Path, parse_calls: list[int]) -> None:
    log = tmp_path / "bars.log"
    log.write_text(_bars(10_000, sep=SEP) + OOM, encoding="utf-8")
    result = diagnose([str(log)])
    runs = 10_000 // RUN
    # the last bar of each run, each marker line between runs, the OOM line (before issue 10: all 10,000 bars too)
    assert len(parse_calls) == 2 * runs + 1, len(parse_calls)
    # what the runs said is kept: the last marker of each run (at its own line: not joined with the bars of its width
    # above it as a terminal-wrapped line), the marker between runs, the phase the log ended in
    assert [kind for kind, _line, _seq in result.facts.markers] == ["load", "data"] * runs
    assert [m[1].lineno for m in result.facts.markers[:2]] == [RUN, RUN + 1]
    assert result.facts.events[0].phase == "tokenization"


def test_the_last_bar_of_a_log_names_its_phase(tmp_path: Path, parse_calls: list[int]) -> None:
    log = tmp_path / "bars.log"
    log.write_text(_bars(10_000) + OOM, encoding="utf-8")
    result = diagnose([str(log)])
    assert len(parse_calls) == 2
    assert [(m[0], m[1].lineno) for m in result.facts.markers] == [("load", 10_000)]
    assert result.facts.events[0].phase == "load"


def test_a_run_is_cut_where_the_rank_changes(tmp_path: Path, parse_calls: list[int]) -> None:
    log = tmp_path / "ranks.log"
    # rank 0 and rank 1 print the same tokenization bar in turns: no line repeats the one before it
    text = "".join(
        f"[rank{i % 2}]: Map (num_proc=8): {i % 100:3d}%|{'#' * 10}| {i}/50000 [00:01<00:05, 812.5 examples/s]\n"
        for i in range(200)
    )
    log.write_text(text + _bars(2 * RUN, "[rank0]: ") + OOM, encoding="utf-8")
    result = diagnose([str(log)])
    assert result.facts.ranks_in_log == {0, 1}
    assert len(parse_calls) == 200 + 1 + 1
    parse_calls.clear()
    # (and the host: pdsh's `host-1: ` in front of a bar with no description)
    log.write_text(
        "".join(
            f"node-{i % 2}:  {i % 100:2d}%|{'#' * 10}| {i}/50000 [00:01<00:05, 812.5 examples/s]\n"
            for i in range(50)
        )
        + OOM,
        encoding="utf-8",
    )
    diagnose([str(log)])
    assert len(parse_calls) == 50 + 1
    assert [kind for kind, _line, _seq in result.facts.markers][-2:] == ["data", "load"]


def test_a_bar_with_text_glued_behind_it_is_read_alone(tmp_path: Path, parse_calls: list[int]) -> None:
    log = tmp_path / "glued.log"
    glued = (
        "Map (num_proc=8):  50%|#####     | 25000/50000 [00:01<00:05, 812.5 examples/s] tokenizing shard 3\n"
    )
    log.write_text(_bars(RUN) + glued + _bars(RUN) + OOM, encoding="utf-8")
    diagnose([str(log)])
    # (a line that is no plain bar is read on its own, as before: it ends the run before it)
    assert parse_calls == [RUN, RUN + 1, 2 * RUN + 1, 2 * RUN + 2]
