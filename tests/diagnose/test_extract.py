"""Extraction: tracebacks per rank, OOM numbers (new and old formats), launcher exits, versions, phases."""

from __future__ import annotations

from pathlib import Path

from zerodoctor.diagnose.extract import Extractor, parse_oom
from zerodoctor.diagnose.reader import LogLine
from zerodoctor.diagnose.scan import iter_hits


def _facts(tmp_path: Path, text: str):
    p = tmp_path / "x.log"
    p.write_text(text)
    ex = Extractor()
    for hit in iter_hits([str(p)]):
        ex.feed(hit)
    return ex.finish()


def test_oom_new_format() -> None:
    o = parse_oom(
        LogLine(
            "f",
            1,
            (
                "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.39 GiB. GPU 5 has a total capacity of "
                "79.32 GiB of which 2.40 GiB is free. Including non-PyTorch memory, this process has 76.90 GiB memory in "
                "use. Of the allocated memory 73.28 GiB is allocated by PyTorch, and 1.59 GiB is reserved by PyTorch but "
                "unallocated."
            ),
        )
    )
    assert o is not None
    assert (o.tried, o.total, o.free, o.allocated, o.reserved_unallocated, o.gpu) == (
        3.39,
        79.32,
        2.40,
        73.28,
        1.59,
        5,
    )
    assert o.verdict == "lack" and round(o.missing_gib or 0, 2) == 0.99


def test_oom_old_format_mib() -> None:
    o = parse_oom(
        LogLine(
            "f",
            1,
            (
                "RuntimeError: CUDA out of memory. Tried to allocate 512.00 MiB (GPU 0; 15.78 GiB total capacity; "
                "14.00 GiB already allocated; 100.00 MiB free; 14.20 GiB reserved in total by PyTorch)"
            ),
        )
    )
    assert o is not None and o.tried == 0.5 and o.total == 15.78
    assert round(o.reserved_unallocated or 0, 2) == 0.2 and o.verdict == "lack"


def test_interleaved_tracebacks_per_rank(tmp_path: Path) -> None:
    f = _facts(
        tmp_path,
        (
            "[rank0]: Traceback (most recent call last):\n"
            "[rank1]: Traceback (most recent call last):\n"
            '[rank0]:   File "/x/a.py", line 1, in forward\n'
            '[rank1]:   File "/x/b.py", line 2, in save_checkpoint\n'
            "[rank1]: OSError: disk full\n"
            "[rank0]: ValueError: bad\n"
        ),
    )
    by_rank = {tb.rank: tb for tb in f.tracebacks}
    assert by_rank[0].exc_type == "ValueError" and by_rank[0].frames[0].func == "forward"
    assert by_rank[1].exc_type == "OSError" and by_rank[1].frames[0].file == "/x/b.py"
    phases = {e.rank: e.phase for e in f.events}
    assert phases == {0: "training_step", 1: "checkpoint_save"}


def test_launcher_summary_gives_global_rank(tmp_path: Path) -> None:
    f = _facts(
        tmp_path,
        (
            "host-2: ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: -9) local_rank: 0 (pid: 14750) of binary: /usr/bin/python3\n"
            "host-2:   rank      : 8 (local_rank: 0)\n"
            "host-2:   exitcode  : -9 (pid: 14750)\n"
            "host-2:   traceback : Signal 9 (SIGKILL) received by PID 14750\n"
        ),
    )
    assert {e.rank for e in f.events} == {8}
    assert {e.exit_code for e in f.events} == {-9}


def test_versions_printed_by_the_run(tmp_path: Path) -> None:
    f = _facts(
        tmp_path,
        (
            "[2024-01-01 00:00:00,000] [INFO] [logging.py:96:log_dist] [Rank 0] DeepSpeed info: version=0.14.2, git-hash=abc\n"
            "torch version .................... 2.3.0+cu121\n"
            "transformers==4.41.2\n"
            "- Accelerate version: 0.30.1\n"
        ),
    )
    assert f.versions == {
        "deepspeed": "0.14.2",
        "torch": "2.3.0+cu121",
        "transformers": "4.41.2",
        "accelerate": "0.30.1",
    }


def test_phase_from_markers_and_progress(tmp_path: Path) -> None:
    f = _facts(
        tmp_path,
        (
            "***** Running training *****\n"
            "100%|##########| 50/50 [01:00<00:00,  1.0it/s]\n"
            "exits with return code = -9\n"
            "Saving model checkpoint to out/checkpoint-50\n"
            "exits with return code = -9\n"
            "Loading checkpoint shards: 100%\n"
            "exits with return code = -9\n"
            "***** Running training *****\n"
            "exits with return code = -9\n"
        ),
    )
    assert [e.phase for e in f.events] == ["epoch_end", "checkpoint_save", "load", "first_optimizer_step"]
