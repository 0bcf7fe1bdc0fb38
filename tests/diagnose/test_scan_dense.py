"""Hit-dense logs (8 ranks printing DeepSpeed's per-step memory lines and trace-cache warnings): the scan's
cost per MB must not grow with the number of hits, and saturating a busy signature must not change the verdict."""

from __future__ import annotations

import time
from pathlib import Path

from zerodoctor.diagnose import diagnose
from zerodoctor.diagnose.scan import SATURATE_AFTER, ScanStats, iter_hits


def _dense(steps: int, *, failure: bool = True) -> bytes:
    out: list[str] = ["[rank0]: ***** Running training *****\n"]
    for step in range(1, steps + 1):
        for r in range(8):
            out.append(
                f"[rank{r}]: [2024-06-21 10:00:00,000] [INFO] [utils.py:787:see_memory_usage] CPU Virtual "
                f"Memory:  used = 391.{r} GB, percent = 38.9%\n"
            )
            out.append(
                f"[rank{r}]: [INFO] [timer.py:259:stop] epoch=0/micro_step={step}/global_step={step}\n"
            )
            if (step + r) % 5 == 0:
                out.append(
                    f"[rank{r}]: Invalidate trace cache @ step 2: expected module {step}, but got module {r}\n"
                )
        out.append(f"[rank0]: \r {step}/90000 [01:00<40:00,  1.61s/it]\n")
    if failure:
        out.append(
            "[2024-06-21 14:00:00,003] [ERROR] [launch.py:434:sigkill_handler] ['/usr/bin/python3', '-u', "
            "'train.py', '--local_rank=3'] exits with return code = -9\n"
        )
    return "".join(out).encode()


def _scan_seconds(path: Path) -> float:
    # CPU time of this process, best of 3: the machine is shared, wall time is not a measure here
    best = float("inf")
    for _ in range(3):
        t0 = time.process_time()
        for _hit in iter_hits([str(path)]):
            pass
        best = min(best, time.process_time() - t0)
    return best


def test_cost_per_mb_does_not_grow_with_hits(tmp_path: Path) -> None:
    # Both logs fit in one 8 MB chunk, where counting newlines from the chunk start per hit was quadratic:
    # four times the hits took sixteen times as long.
    small, large = tmp_path / "small.log", tmp_path / "large.log"
    small.write_bytes(_dense(1500))
    large.write_bytes(_dense(6000))
    iter_hits([str(small)])  # compile the engine outside the timing
    t_small, t_large = _scan_seconds(small), _scan_seconds(large)
    assert t_large < 8 * t_small + 0.1, (t_small, t_large)


def test_progress_line_numbers_exact_with_any_chunk_size(tmp_path: Path) -> None:
    log = tmp_path / "dense.log"
    log.write_bytes(_dense(40))
    lines = log.read_bytes().split(b"\n")
    for chunk in (4096, 8 << 20):
        hits = list(iter_hits([str(log)], chunk_bytes=chunk))
        with_progress = [h for h in hits if h.progress is not None]
        assert with_progress
        for h in with_progress:
            assert h.progress is not None
            assert b"s/it]" in lines[h.progress.lineno - 1]
            assert h.progress.lineno < h.line.lineno


def test_saturated_signatures_are_counted_not_decoded(tmp_path: Path) -> None:
    log = tmp_path / "dense.log"
    log.write_bytes(_dense(400))
    stats = ScanStats()
    hits = list(iter_hits([str(log)], stats))
    assert stats.counted_only > 0
    mem_hits = [h for h in hits if any("ds-cpu-mem-usage" in k for k in h.keys)]
    assert len(mem_hits) == SATURATE_AFTER
    result = diagnose([str(log)])
    assert result.findings[0].id == "host-oom-sigkill"
    assert len(result.facts.warnings) == 20  # distinct trace-cache warnings are still listed
