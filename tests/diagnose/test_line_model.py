"""The line model: terminal-wrapped lines joined, lines glued onto a tqdm bar split, long `\\r` runs scanned in
full in bounded memory, a truncated .gz read up to where it stops, and odd numbers in log lines never crash."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from zerodoctor.diagnose import diagnose
from zerodoctor.diagnose.reader import log_float, log_int, parse_line, read_lines
from zerodoctor.diagnose.scan import ScanStats, iter_hits
from zerodoctor.diagnose.source import MAX_LINE_BYTES


def _wrap(text: str, width: int, pad: bool) -> str:
    rows = [text[i : i + width] for i in range(0, len(text), width)]
    return "\n".join(r.ljust(width) if pad and i < len(rows) - 1 else r for i, r in enumerate(rows)) + "\n"


@pytest.mark.parametrize(("width", "pad"), [(80, True), (120, False), (200, True), (100, False)])
def test_wrapped_batch_size_assertion_is_found(tmp_path: Path, width: int, pad: bool) -> None:
    msg = (
        "AssertionError: Check batch related parameters. train_batch_size is not equal to micro_batch_per_gpu * "
        "gradient_acc_step * world_size 64 != 4 * 8 * 1"
    )
    if width >= len(msg):
        msg = msg + " " + "x" * (width + 10 - len(msg))
    log = tmp_path / "wrapped.log"
    log.write_text(
        "Traceback (most recent call last):\n"
        '  File "/usr/lib/python3/site-packages/deepspeed/runtime/config.py", line 700, in _batch_assertion\n'
        + _wrap(msg, width, pad)
        + "[2024-05-01 10:00:00,000] [INFO] next record\n"
    )
    assert diagnose([str(log)]).findings[0].id == "batch-size-assertion"


def test_complete_lines_of_terminal_width_are_not_joined(tmp_path: Path) -> None:
    frame = (
        '  File "/usr/lib/python3/dist-packages/deepspeed/runtime/engine.py", line 3850, in save_16bit_model'
    )
    log = tmp_path / "x.log"
    log.write_text(frame + "\nOSError: handle is closed\n")
    hits = list(iter_hits([str(log)]))
    assert [h.line.text for h in hits][-1] == "OSError: handle is closed"


def test_watchdog_glued_onto_a_tqdm_bar_is_its_own_line() -> None:
    raw = (
        b"[rank1]:  5%|5         | 50/1000 [00:50<15:50,  1.00s/it][E ProcessGroupNCCL.cpp:563] [Rank 1] Watchdog "
        b"caught collective operation timeout: WorkNCCL(SeqNum=9, OpType=ALLREDUCE, Timeout(ms)=600000)"
    )
    lines = parse_line("f", 3, raw)
    assert lines[-1].text.startswith("[E ProcessGroupNCCL.cpp:563]") and lines[-1].rank == 1


def test_failure_after_a_long_carriage_return_run_is_found(tmp_path: Path) -> None:
    bar = "".join(f"\r {i % 100}%|####      | {i}/90000 [01:00<40:00,  1.61s/it]" for i in range(60000))
    assert len(bar) > 2 * MAX_LINE_BYTES
    log = tmp_path / "cr.log"
    log.write_text(bar + "\rtorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n")
    stats = ScanStats()
    hits = list(iter_hits([str(log)], stats, chunk_bytes=1 << 20))
    assert stats.lines[str(log)] == 1
    assert [(h.line.lineno, h.line.text[:22]) for h in hits] == [(1, "torch.OutOfMemoryError")]
    assert hits[0].progress is not None and hits[0].progress.step == 59999


def test_truncated_gzip_keeps_every_readable_line_and_says_where(tmp_path: Path) -> None:
    body = b"".join(b"[rank0]: step %d ok\n" % i for i in range(200000))
    data = gzip.compress(body + b"RuntimeError: never reached\n")
    p = tmp_path / "cut.log.gz"
    p.write_bytes(data[: len(data) * 3 // 4])
    got = list(read_lines(str(p)))
    assert len(got) > 140000  # all but the last quarter (GzipFile.read lost its whole last chunk)
    assert all(ln.text == f"step {ln.lineno - 1} ok" for ln in got[:-1])
    stats = ScanStats()
    list(iter_hits([str(p)], stats))
    assert any("stopped reading after" in n and "bytes of text" in n for n in stats.notes)


def test_concatenated_gzip_members(tmp_path: Path) -> None:
    p = tmp_path / "two.log.gz"
    p.write_bytes(gzip.compress(b"a\n") + gzip.compress(b"RuntimeError: second member\n"))
    assert [ln.text for ln in read_lines(str(p))] == ["a", "RuntimeError: second member"]


HUGE = "9" * 5000


@pytest.mark.parametrize(
    "line",
    [
        f"[rank{HUGE}]: RuntimeError: boom",
        f'  File "/x/deepspeed/runtime/engine.py", line {HUGE}, in step',
        f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {HUGE}.00 GiB. GPU {HUGE} has a total "
        "capacity of 1e999 GiB of which nan GiB is free.",
        f"[ERROR] [launch.py:434:sigkill_handler] ['python', '--local_rank={HUGE}'] exits with return code = -{HUGE}",
        f"failed (exitcode: -{HUGE}) local_rank: {HUGE} (pid: {HUGE}) of binary: /usr/bin/python3",
        f"Signal {HUGE} (SIGKILL) received by PID {HUGE}",
        "{'loss': 1.0, 'epoch': .}",
        f" 50%|#####     | {HUGE}/{HUGE} [10:00<10:00,  1.20s/it]",
        "exitcode  : -x9 (pid: abc)",
    ],
)
def test_odd_numbers_never_crash(tmp_path: Path, line: str) -> None:
    log = tmp_path / "odd.log"
    log.write_text("Traceback (most recent call last):\n" + line + "\nRuntimeError: after\n")
    d = diagnose([str(log)])
    assert d.findings


def test_two_hits_on_one_carriage_return_line(tmp_path: Path) -> None:
    log = tmp_path / "cr2.log"
    log.write_text(
        "CUDA out of memory. Tried to allocate 1.00 GiB\rCUDA out of memory. Tried to allocate 2.00 GiB\r"
        "exits with return code = -9\n"
    )
    assert diagnose([str(log)]).findings


def test_log_numbers() -> None:
    assert log_int("42") == 42 and log_int("-9") == -9
    assert log_int(HUGE) is None and log_int("x9") is None and log_int("") is None
    assert log_float(".") is None and log_float("nan") is None and log_float("1e999") is None
    assert log_float("1.5") == 1.5


def test_named_pipe_without_writer_does_not_hang(tmp_path: Path, run_cli) -> None:
    import os

    fifo = tmp_path / "log.fifo"
    os.mkfifo(fifo)
    code, _out, err = run_cli("diagnose", str(fifo))
    assert code == 2 and "empty" in err and "Traceback" not in err


def test_named_pipe_with_a_writer_is_streamed(tmp_path: Path, run_cli) -> None:
    import os
    import threading
    import time

    fifo = tmp_path / "log.fifo"
    os.mkfifo(fifo)

    def write() -> None:
        with open(fifo, "wb") as f:
            f.write(b"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n")

    t = threading.Thread(target=write)
    t.start()
    time.sleep(
        0.3
    )  # the writer is waiting in open(): a reader then sees it (a pipe with no writer reads empty)
    try:
        code, out, err = run_cli("diagnose", str(fifo), "--format", "json")
    finally:
        t.join(timeout=5)
    assert code == 1, err
    assert '"class:gpu-oom"' in out


def test_device_is_refused(run_cli) -> None:
    code, _out, err = run_cli("diagnose", "/dev/null")
    assert code == 2 and "device" in err


def test_quoted_and_ray_prefixed_lines_are_read_like_plain_ones() -> None:
    """A paste quoted in a thread ("> ") and Ray's actor prefix keep their text; the actor is kept as the host."""
    quoted = parse_line("x.log", 1, b"> AssertionError: {'id': 786, 'status': 'INFLIGHT', 'numel': 38603520}")[0]
    assert quoted.text.startswith("AssertionError: {'id': 786")
    ray = parse_line("x.log", 2, b"(ActorModelRayActorBOX pid=499618) RuntimeError: [enforce fail at x.cc:603]")[0]
    assert ray.text == "RuntimeError: [enforce fail at x.cc:603]" and ray.host == "ActorModelRayActorBOX"
    # text that merely contains ">" or parentheses stays as it is
    assert parse_line("x.log", 3, b">>> import deepspeed")[0].text == ">>> import deepspeed"
    assert parse_line("x.log", 4, b"(venv) $ deepspeed train.py")[0].text == "(venv) $ deepspeed train.py"


def test_a_quoted_zero3_status_assertion_is_a_library_assertion_in_a_forward(tmp_path: Path) -> None:
    log = tmp_path / "quoted.log"
    log.write_text(
        "> AssertionError: {'id': 786, 'status': 'INFLIGHT', 'numel': 38603520, 'ds_numel': 38603520, 'shape':\n"
        "> (50265, 768), 'ds_shape': (50265, 768), 'requires_grad': False, 'grad_shape': None, 'persist': False,\n"
        "> 'active_sub_modules': {3}}\n",
        encoding="utf-8",
    )
    d = diagnose([str(log)])
    assert d.findings[0].id == "class:library-assertion", [f.id for f in d.findings]
    assert d.phase == "training_step"
    # an INFLIGHT parameter is not the NOT_AVAILABLE look-alike entry (a module outside the engine's hooks)
    assert "z3-param-not-available" not in [f.id for f in d.findings]


def test_a_hit_in_the_second_half_of_a_wrapped_line_keeps_the_first_half(tmp_path: Path) -> None:
    """The heartbeat monitor's message wrapped at 116 columns inside a word: the hit is on the second physical line,
    the rank prefix on the first; both are read as one line (and the rank is named)."""
    msg = (
        "[rank6]:[E429 13:55:49.384372190 ProcessGroupNCCL.cpp:1743] [PG ID 0 PG GUID 0(default_pg) Rank 6] "
        "ProcessGroupNCCL's watchdog got stuck for 480 seconds without making progress in monitoring enqueued "
        "collectives. This typically indicates a NCCL/CUDA API (e.g., CudaEventDestroy) hang blocking the watchdog, "
        "and could be triggered by another thread holding the GIL inside a CUDA api, or other deadlock-prone "
        "behaviors."
    )
    log = tmp_path / "wrapped.log"
    log.write_text(_wrap(msg, 116, pad=False), encoding="utf-8")
    assert "ProcessGroupNCCL'\ns watchdog" in log.read_text()  # the cut falls inside the word
    d = diagnose([str(log)])
    assert d.findings[0].id == "class:collective-timeout", [f.id for f in d.findings]
    assert d.first_failure is not None and d.first_failure.rank == 6 and d.first_failure.line.lineno == 1


def test_two_lines_of_one_width_that_start_records_are_not_joined(tmp_path: Path) -> None:
    """Equal widths alone do not join lines that start records of their own (timestamps, rank prefixes)."""
    b = "[2024-05-01 10:00:01,000] [ERROR] [launch.py:321:sigkill_handler] ['python', 'train.py'] exits with return code = -9"
    a = "[2024-05-01 10:00:00,000] [INFO] [launch.py:146:main] WORLD INFO DICT: {'localhost': [0, 1, 2, 3]}"
    a = a + "x" * (len(b) - len(a))
    assert len(a) == len(b)
    log = tmp_path / "two.log"
    log.write_text(a + "\n" + b + "\n", encoding="utf-8")
    d = diagnose([str(log)])
    assert d.first_failure is not None and d.first_failure.line.lineno == 2


def test_a_watchdog_line_glued_onto_a_bar_with_a_postfix_is_split_and_the_bar_read_as_training(
    tmp_path: Path,
) -> None:
    """Lightning/NeMo bars end in a postfix (`1.37it/s, loss=2.6, ...]`); a watchdog line glued after it is its
    own line, and the bar is the training progress it interrupted."""
    bar = (
        "Epoch 0:   6%|##        | 32040/500150 [6:28:43<94:39:17,  1.37it/s, loss=2.6, v_num=95nc, "
        "reduced_train_loss=2.590, global_step=3.2e+4]"
    )
    watchdog = (
        "[E ProcessGroupNCCL.cpp:458] [Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=96117, "
        "OpType=ALLREDUCE, Timeout(ms)=1800000) ran for 25625613 milliseconds before timing out."
    )
    parts = parse_line("x.log", 1, (bar + watchdog).encode())
    assert [p.text for p in parts] == [bar, watchdog]
    log = tmp_path / "nemo.log"
    log.write_text(bar + watchdog + "\n" + watchdog + "\n", encoding="utf-8")
    d = diagnose([str(log)])
    assert d.findings[0].id == "class:collective-timeout"
    assert d.phase == "training_step"
