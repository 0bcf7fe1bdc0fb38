"""Scanning chunks ahead on worker threads gives exactly the hits of a one-thread scan (in file order, with the
engine rebuilt without saturated patterns part-way), and a bad ZERODOCTOR_SCAN_THREADS is a one-line error."""

from __future__ import annotations

from pathlib import Path

import pytest

from zerodoctor.cli.main import main
from zerodoctor.diagnose import scan
from zerodoctor.diagnose.scan import Hit, ScanState, ScanStats, engine, scan_source
from zerodoctor.diagnose.source import open_source

CORPUS = Path(__file__).parent / "corpus"


def _log(steps: int) -> bytes:
    """8 ranks' per-step memory lines (a KB signature that saturates), trace-cache warnings, some lines coloured
    (re-scanned after the colour codes are removed), progress bars, and a kill at the end."""
    out: list[str] = ["[rank0]: ***** Running training *****\n"]
    for step in range(1, steps + 1):
        for r in range(8):
            colour, reset = ("\x1b[32m", "\x1b[0m") if (step + r) % 7 == 0 else ("", "")
            out.append(
                f"[rank{r}]: {colour}[2024-06-21 10:00:00,000] [INFO] [utils.py:787:see_memory_usage] CPU "
                f"Virtual Memory:  used = 391.{r} GB, percent = 38.9%{reset}\n"
            )
            if (step + r) % 5 == 0:
                out.append(
                    f"[rank{r}]: Invalidate trace cache @ step 2: expected module {step}, but got module {r}\n"
                )
        out.append(f"[rank0]: \r {step}/90000 [01:00<40:00,  1.61s/it]\n")
    out.append(
        "[2024-06-21 14:00:00,003] [ERROR] [launch.py:434:sigkill_handler] ['/usr/bin/python3', '-u', "
        "'train.py', '--local_rank=3'] exits with return code = -9\n"
    )
    return "".join(out).encode()


def _scan(path: Path, threads: int, monkeypatch: pytest.MonkeyPatch) -> tuple[list[Hit | int], ScanState]:
    monkeypatch.setenv("ZERODOCTOR_SCAN_THREADS", str(threads))
    state = ScanState(engine("hyperscan"))
    src = open_source(str(path))
    try:
        items = list(scan_source(src, 0, chunk_bytes=4096, state=state, stats=ScanStats()))
    finally:
        src.close()
    return items, state


def test_threads_give_the_hits_of_one_thread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("hyperscan")
    # rebuild the engine after a few skipped matches, so chunks scanned ahead by the older engine are handled
    monkeypatch.setattr(scan, "REBUILD_AFTER_SKIPPED", 200)
    log = tmp_path / "dense.log"
    log.write_bytes(_log(300))  # about 120 chunks of 4 KiB
    one, state_one = _scan(log, 1, monkeypatch)
    assert len(state_one.eng.ids) < len(engine("hyperscan").ids)  # the rebuild happened
    assert sum(isinstance(h, Hit) for h in one) > 64
    for threads in (2, 3, 5):
        many, state = _scan(log, threads, monkeypatch)
        assert many == one, threads
        assert state.eng.ids == state_one.eng.ids
        assert state.verified == state_one.verified and state.saturated == state_one.saturated


def test_one_chunk_and_empty_thread_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("hyperscan")
    log = tmp_path / "small.log"
    log.write_bytes(_log(2))
    monkeypatch.setenv("ZERODOCTOR_SCAN_THREADS", "3")
    assert scan.scan_threads() == 3
    items, _ = _scan(log, 3, monkeypatch)
    assert items[-1] == log.read_bytes().count(b"\n")  # the line count comes last
    monkeypatch.delenv("ZERODOCTOR_SCAN_THREADS")
    assert scan.scan_threads() == 1  # the default: the main thread alone
    monkeypatch.setenv("ZERODOCTOR_SCAN_THREADS", "64")
    assert scan.scan_threads() == scan.MAX_SCAN_THREADS


@pytest.mark.parametrize("value", ["0", "-2", "many"])
def test_bad_thread_count_is_a_usage_error(
    value: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("ZERODOCTOR_SCAN_THREADS", value)
    log = CORPUS / "healthy_hf_trainer_qwen2_1_5b_full_run.log"
    assert main(["diagnose", "--format", "json", str(log)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "ZERODOCTOR_SCAN_THREADS" in err[0] and "Traceback" not in err[0]
