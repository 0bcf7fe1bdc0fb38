"""Who stopped first, from the evidence the ranks leave (phase logs, faulthandler stacks, torchrun's summary).

The real-engine cases (a rank that exits, a rank that hangs) are in test_selftest_engine.py; these cover the
cases a 2-rank CPU run cannot stage on demand: every rank stuck at the same point, a JIT-build lock wait."""

from __future__ import annotations

from pathlib import Path

from zerodoctor.selftest.run import Launch, RankLog, torchrun_failures
from zerodoctor.selftest.stops import main_stack, stopped_ranks, waiting_in_collective

SP = "/venv/lib/python3.11/site-packages"
WAITING = f'''Thread 0x00007f0000000001 (most recent call first):
  File "{SP}/deepspeed/runtime/zero/parameter_offload.py", line 12 in _prefetch
  File "/usr/lib/python3.11/threading.py", line 975 in run

Current thread 0x00007f0000000002 (most recent call first):
  File "{SP}/torch/distributed/distributed_c10d.py", line 4943 in reduce_scatter_single
  File "{SP}/deepspeed/comm/torch.py", line 300 in reduce_scatter_tensor
  File "{SP}/deepspeed/runtime/zero/stage3.py", line 1400 in reduce_ipg_grads
  File "/repo/src/zerodoctor/selftest/worker.py", line 415 in train_step
  File "/repo/src/zerodoctor/selftest/worker.py", line 440 in run
'''
LOCK = f'''Current thread 0x00007f0000000002 (most recent call first):
  File "{SP}/torch/utils/file_baton.py", line 42 in wait
  File "{SP}/torch/utils/cpp_extension.py", line 2100 in _jit_compile
  File "/repo/src/zerodoctor/selftest/worker.py", line 300 in _load_ops
'''


def _rank(rank: int, marks: int, stack: str) -> RankLog:
    events = [
        {"event": "hello", "pid": 100 + rank, "t": 0.0},
        {"event": "start", "phase": "engine-init", "t": 1.0},
    ]
    events += [
        {"event": "mark", "phase": "engine-init", "step": 0, "micro": 0, "at": "forward", "t": 2.0}
    ] * marks
    return RankLog(rank, events, stack=stack)


def _launch(logs: list[RankLog]) -> Launch:
    return Launch(logs, -15, Path("log"), Path("."), 9.0, {"reason": "phase-limit", "phase": "engine-init"})


def test_main_thread_stack_and_collective_waits_are_read_from_faulthandler_text():
    frames = main_stack(WAITING)
    assert frames[0].func == "reduce_scatter_single" and frames[-1].func == "run"
    assert waiting_in_collective(frames)
    assert not waiting_in_collective(main_stack(LOCK))  # a JIT-build lock is no collective


def test_equal_progress_the_rank_outside_a_collective_is_the_one_that_hung():
    logs = [_rank(0, 1, WAITING), _rank(1, 1, LOCK)]
    stop = stopped_ranks(logs, _launch(logs), hung=True)
    assert stop is not None and stop.rank == 1
    assert "waiting in a collective" in stop.others[0]


def test_every_rank_stuck_at_the_same_point_names_no_single_rank():
    logs = [_rank(0, 1, LOCK), _rank(1, 1, LOCK)]
    stop = stopped_ranks(logs, _launch(logs), hung=True)
    assert stop is not None and stop.rank is None and stop.phase == "engine-init"
    assert stop.describe().startswith("every rank stopped at the same point")


def test_torchrun_summary_gives_exit_codes_and_the_first_failure():
    text = """Failures:
[1]:
  time      : 2026-11-24_07:38:35
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 27465)  (SIGTERM)
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-24_07:38:35
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : 17 (pid: 27466)
"""
    assert torchrun_failures(text) == ({0: -15, 1: 17}, 1)
    assert torchrun_failures("no summary") == ({}, None)
