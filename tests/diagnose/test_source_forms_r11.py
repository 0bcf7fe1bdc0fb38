"""Round 11 (issue 10): tune-split misses the log itself proves, each generalised to the line as its library prints it
(patterns.py / extract.py / classes.py / judge.py name each source beside its rule).

- torchrun's agent stopped by a signal (torch/distributed/elastic/agent/server/api.py: `Received 1 death signal, shutting
  down workers`) and a tool's exit-137 report are launcher outcomes: the progress before them places them.
- Megatron-LM's train() (megatron/training/training.py) prints `[before the start of training step] datetime: ...`
  before its loop and `iteration N/ TOTAL | ... elapsed time per iteration (ms): ...` per logged step (every version
  since 2019, Megatron-DeepSpeed and the forks too); mmf's training_loop logs `Starting training...` as its logger
  `mmf.trainers.core.training_loop`.
- a DataLoader worker's death (torch/csrc/DataLoader.cpp: `DataLoader worker (pid N) is killed by signal: Killed.`,
  `... exited unexpectedly ...`, the worker's own `ERROR: Unexpected bus error encountered in worker.`) in a training
  loop that has started is the loop's failure (training_step), not an optimizer step's.
- a log with no failure reports where it ends as its phase (the last marker or bar), as a stalled log does.
- Ray re-raises a task's exception as `RayTaskError(X)` (python/ray/exceptions.py as_instanceof_cause), whose text is
  the task's traceback ending in the cause's own `X: message` line: that line says what failed.
- a process that aborts after its run printed its end (`{'train_runtime': ...}`): still a failure (the exit status),
  named as one after the run had finished.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from zerodoctor.diagnose import diagnose
from zerodoctor.findings import Severity

HF_END = (
    "{'loss': 0.51, 'learning_rate': 1e-05, 'epoch': 3.0}\n"
    "100%|##########| 300/300 [10:00<00:00,  2.00s/it]\n"
    "{'train_runtime': 600.1, 'train_samples_per_second': 4.0, 'train_steps_per_second': 0.5, 'train_loss': 0.6, "
    "'epoch': 3.0}\n"
)
BAR = " 59%|#####8    | 1663/2840 [6:59:31<4:51:53, 14.88s/it]"


def _run(tmp_path: Path, text: str):
    log = tmp_path / "run.log"
    log.write_text(text, encoding="utf-8")
    return diagnose([str(log)])


def _top(tmp_path: Path, text: str):
    d = _run(tmp_path, text)
    assert d.findings, "no finding"
    return d.findings[0]


# ---- launcher outcomes placed by the progress before them ----------------------------------------------------------
@pytest.mark.parametrize(
    "stop",
    [
        # torch >= 2.2's glog-style prefix, glued behind the bar (no newline: tqdm's `\r`)
        "W1229 16:43:25.650000 190834 /env/lib/python3.12/site-packages/torch/distributed/elastic/agent/server/"
        "api.py:723] Received 1 death signal, shutting down workers\n",
        # torch 1.x / 2.0's logging prefix, on a line of its own
        "\nWARNING:torch.distributed.elastic.agent.server.api:Received 15 death signal, shutting down workers\n",
        # docker compose's report of the service's exit status 137
        "\ntrain-1 exited with code 137\n",
    ],
)
def test_a_launcher_stop_after_training_progress_is_in_the_training_step(tmp_path, stop):
    text = f"{BAR}\n{BAR}" + stop
    top = _top(tmp_path, text)
    assert top.data["phase"] == "training_step", top


def test_a_death_signal_with_no_progress_before_it_has_no_phase(tmp_path):
    top = _top(
        tmp_path,
        "WARNING:torch.distributed.elastic.agent.server.api:Received 1 death signal, shutting down workers\n",
    )
    assert top.data["phase"] == "unknown"


# ---- Megatron-LM: the loop's start line and its iteration lines --------------------------------------------------
MEGATRON_START = "[before the start of training step] datetime: 2025-05-06 12:45:42 \n"
WORKER_KILLED = (
    "[rank0]: Traceback (most recent call last):\n"
    '[rank0]:   File "/env/lib/python3.10/site-packages/torch/utils/data/dataloader.py", line 1130, in _try_get_data\n'
    "[rank0]:     data = self._data_queue.get(timeout=timeout)\n"
    '[rank0]:   File "/env/lib/python3.10/site-packages/torch/utils/data/_utils/signal_handling.py", line 66, in handler\n'
    "[rank0]:     _error_if_any_worker_fails()\n"
    "[rank0]: RuntimeError: DataLoader worker (pid 9382) is killed by signal: Killed. \n"
)


def test_a_dataloader_worker_killed_at_megatrons_loop_start_is_the_training_step(tmp_path):
    top = _top(tmp_path, MEGATRON_START + WORKER_KILLED)
    assert top.data["phase"] == "training_step"


@pytest.mark.parametrize(
    "line",
    [
        # 2023+: a timestamp, consumed samples
        " [2025-04-13 23:41:12] iteration      120/    1000 | consumed samples:         1920 | elapsed time per "
        "iteration (ms): 1147.6 | learning rate: 3.0E-05 | global batch size:    16 | lm loss: 2.3E+00 |",
        # 2021-2022: no timestamp
        " iteration      120/    1000 | consumed samples:         1920 | elapsed time per iteration (ms): 1147.6 |",
        # 2019-2020: no consumed samples
        " iteration      120/    1000 | elapsed time per iteration (ms): 1147.6 | learning rate: 3.000E-05 |",
    ],
)
def test_megatrons_iteration_lines_are_progress(tmp_path, line):
    """After logged iterations the loop's start marker no longer places the failure at the first step."""
    oom = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.1 GiB\n"
    top = _top(tmp_path, MEGATRON_START + line + "\n" + oom)
    assert top.data["phase"] == "training_step"


def test_an_oom_right_after_megatrons_loop_start_is_the_first_step(tmp_path):
    """Near miss: the same start marker, but a failure of the step itself (no iteration logged yet)."""
    oom = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.1 GiB\n"
    top = _top(tmp_path, MEGATRON_START + oom)
    assert top.data["phase"] == "first_optimizer_step"


# ---- mmf's loop start and the DataLoader worker's own SIGBUS report --------------------------------------------------
SIGBUS = "ERROR: Unexpected bus error encountered in worker. This might be caused by insufficient shared memory (shm).\n"


def test_mmfs_loop_start_then_a_worker_bus_error_is_the_training_step(tmp_path):
    text = "2020-08-03T10:20:25 | mmf.trainers.core.training_loop: Starting training...\n" + SIGBUS
    d = _run(tmp_path, text)
    assert d.findings[0].id == "fw-exitcode-7-sigbus-shm"
    assert d.findings[0].data["phase"] == "training_step"
    assert d.first_failure is not None and d.first_failure.exit_code == -7


def test_a_scripts_own_starting_training_line_is_no_marker(tmp_path):
    """Near miss: the bare phrase (any script prints it, some before a resume) places nothing."""
    top = _top(tmp_path, "Starting training...\n" + SIGBUS)
    assert top.data["phase"] == "unknown"


@pytest.mark.parametrize(
    "failure,phase",
    [
        ("RuntimeError: DataLoader worker (pid(s) 4711, 4712) exited unexpectedly\n", "training_step"),
        (SIGBUS, "training_step"),
        # near miss: the step itself failing right after the loop started
        (
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
            "79.1 GiB\n",
            "first_optimizer_step",
        ),
    ],
)
def test_the_hf_trainers_loop_start_then_a_data_failure(tmp_path, failure, phase):
    text = "***** Running training *****\n  Num examples = 1000\n" + failure
    assert _top(tmp_path, text).data["phase"] == phase


# ---- a log with no failure: where it ends ---------------------------------------------------------------------------
def test_a_log_without_failure_reports_the_phase_it_ends_in(tmp_path):
    text = "".join(
        f"Loading checkpoint shards:  {p}%|###       | {n}/30 [00:39<01:04,  3.23s/it]\n"
        for p, n in ((33, 10), (37, 11))
    )
    top = _top(tmp_path, text)
    assert top.id == "no-known-failure" and top.severity is Severity.INFO
    assert top.data["phase"] == "load"


def test_a_finished_run_is_no_failure_and_has_no_phase(tmp_path):
    top = _top(tmp_path, HF_END)
    assert top.severity is not Severity.ERROR
    assert top.data["phase"] == "unknown"


# ---- Ray's wrapped task exceptions ------------------------------------------------------------------------------
RAY_HEAD = (
    "Traceback (most recent call last):\n"
    '  File "/env/lib/python3.10/site-packages/ray/_private/worker.py", line 861, in get_objects\n'
    "    raise value.as_instanceof_cause()\n"
    "ray.exceptions.RayTaskError({cause}): ray::ActorModelRayActor.fit() (pid=59379, ip=10.0.0.1, "
    "actor_id=3a07)\n"
    '  File "/env/lib/python3.10/site-packages/openrlhf/trainer/ray/ppo_actor.py", line 85, in __init__\n'
    "    {code}\n"
)


def test_a_ray_wrapped_import_error_is_an_import_error(tmp_path):
    text = (
        RAY_HEAD.format(cause="ModuleNotFoundError", code="import vllm")
        + "ModuleNotFoundError: No module named 'vllm'\n"
    )
    top = _top(tmp_path, text)
    assert top.id == "class:import-error"
    assert "vllm" in top.title  # (the cause line's module, not the wrapper's text)


def test_a_ray_wrapped_cuda_oom_is_a_gpu_oom(tmp_path):
    text = RAY_HEAD.format(cause="OutOfMemoryError", code='self.model.to("cuda")') + (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.50 GiB. GPU 0 has a total capacity of "
        "79.14 GiB of which 1.02 GiB is free.\n"
    )
    assert _top(tmp_path, text).id == "class:gpu-oom"


def test_a_ray_wrapper_without_its_cause_line_is_read_as_before(tmp_path):
    """Near miss: the task's traceback cut before its cause's line - the wrapper alone, not another line's class."""
    text = RAY_HEAD.format(cause="ModuleNotFoundError", code="import vllm")
    top = _top(tmp_path, text)
    assert top.id == "class:crash"


# ---- an abort after the run's end -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "tail,said",
    [
        (
            "terminate called without an active exception\nAborted (core dumped)\n",
            "without an active exception",
        ),
        (
            "terminate called after throwing an instance of 'c10::Error'\n"
            "  what():  CUDA error: driver shutting down\n"
            "Aborted (core dumped)\n",
            "driver shutting down",
        ),
        ("Aborted (core dumped)\n", None),
    ],
)
def test_an_abort_after_the_runs_end_is_a_failure_named_after_the_end(tmp_path, tail, said):
    top = _top(tmp_path, HF_END + tail)
    assert top.severity is Severity.ERROR  # the exit status says the process failed
    assert top.id == "class:crash"
    assert "after the run had finished" in top.title
    assert "run.log:3" in top.message  # the end line, from this log
    if said is not None:
        assert said in top.message


def test_an_abort_during_training_is_not_named_after_the_end(tmp_path):
    """Near miss: the same abort with training progress and no end line before it."""
    top = _top(tmp_path, f"{BAR}\nterminate called without an active exception\nAborted (core dumped)\n")
    assert top.severity is Severity.ERROR
    assert "after the run had finished" not in top.title


def test_a_bars_line_number_is_its_own_when_a_later_line_holds_a_progress_literal(tmp_path):
    """scan._last_progress moves its window back past a line that holds a literal but is no progress (the summary's
    `'epoch': `): the bar's line number still counts from the window's first end."""
    from zerodoctor.diagnose.scan import ScanStats, iter_hits

    log = tmp_path / "run.log"
    log.write_text(HF_END, encoding="utf-8")
    stats = ScanStats()
    for _hit in iter_hits([str(log)], stats):
        pass
    end = stats.end_progress[str(log)]
    assert end is not None and (end.step, end.total, end.lineno) == (300, 300, 2)


# ---- subprocess.CalledProcessError's tail on a line of its own ------------------------------------------------------
def test_the_called_process_errors_signal_tail_alone_is_the_childs_kill(tmp_path):
    """CPython's CalledProcessError.__str__ ends `died with <Signals.SIGKILL: 9>.`; a long command line puts it apart."""
    text = (
        "died with <Signals.SIGKILL: 9>.\n---\n"
        "CalledProcessError: Command '['/venv/bin/python', 'train_network.py', '--enable_bucket',\n"
    )
    d = _run(tmp_path, text)
    assert d.first_failure is not None and d.first_failure.exit_code == -9
    assert d.findings[0].id in ("class:host-oom-kill", "host-oom-sigkill")


def test_the_whole_called_process_error_line_is_one_failure(tmp_path):
    """Near miss: the tail inside the exception's own line gives no second event."""
    text = "subprocess.CalledProcessError: Command '['/usr/bin/python3', 'train.py']' died with <Signals.SIGKILL: 9>.\n"
    d = _run(tmp_path, text)
    assert len(d.facts.events) == 1 and d.facts.events[0].exit_code == -9


# ---- nvcc's own fatal error: a compile that stopped ------------------------------------------------------------------
@pytest.mark.parametrize(
    "fatal",
    [
        "nvcc fatal   : Unsupported gpu architecture 'compute_86'\n",
        "nvcc fatal   : Value 'sm_90' is not defined for option 'gpu-architecture'\n",
    ],
)
def test_nvccs_fatal_error_is_an_op_build_failure_even_without_the_extension_name(tmp_path, fatal):
    """A paste that starts inside nvcc's command line (no `-DTORCH_EXTENSION_NAME=`): nvcc's fatal line is the build's."""
    top = _top(tmp_path, "-gencode=arch=compute_86,code=compute_86 --use_fast_math -lineinfo\n" + fatal)
    assert top.id == "class:op-build-failure"
    assert fatal.split(":", 1)[1].strip()[:20] in top.message


def test_an_nvcc_failure_the_run_went_on_after_is_no_failure(tmp_path):
    """Near miss: a compile that failed, then the training loop started (the op was optional, a fallback was used)."""
    text = (
        "-gencode=arch=compute_86,code=compute_86 --use_fast_math -lineinfo\n"
        "nvcc fatal   : Unsupported gpu architecture 'compute_86'\n"
        "***** Running training *****\n  Num examples = 1000\n"
    )
    d = _run(tmp_path, text)
    assert d.findings[0].severity is not Severity.ERROR


# ---- xtuner's command line catching its mode's exception ------------------------------------------------------------
XTUNER_ERROR = (
    "10/18 16:45:32 - mmengine - WARNING - WARNING: command error: ''Adafactor is already registered in optimizer at "
    "torch.optim''!\n"
    "10/18 16:45:32 - mmengine - WARNING - \n"
    "    Arguments received: ['xtuner', 'train', 'cfg.py', '--deepspeed', 'deepspeed_zero2']. xtuner commands use the "
    "following syntax:\n"
)


def test_xtuners_command_error_is_the_failure(tmp_path):
    top = _top(tmp_path, XTUNER_ERROR)
    assert top.severity is Severity.ERROR and top.id == "class:crash"
    assert "Adafactor is already registered" in top.message


def test_xtuners_command_error_without_an_exception_is_none(tmp_path):
    """Near miss: `WARNING: command error!` (an unknown mode: the usage text, no exception caught) is no such event."""
    text = "10/18 16:45:32 - mmengine - WARNING - WARNING: command error!\n"
    d = _run(tmp_path, text)
    assert not d.facts.events


# ---- a c10::Error logged by torch's C++ logging, its backtrace header below -----------------------------------------
RAISED = (
    "Exception raised from OperationSetup at build/third_party/op-plugin/op_plugin/CMakeFiles/op_plugin_atb.dir/"
    "compiler_depend.ts:129 (most recent call first):\n"
    "frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0xb8 (0xffffadcec908 in /env/torch/lib/libc10.so)\n"
)


@pytest.mark.parametrize(
    "err",
    [
        "[rank0]:[E326 08:57:33.451117940 compiler_depend.ts:418] setup failed!\n",  # torch >= 2.3's own format
        "[E compiler_depend.ts:418] setup failed!\n",  # torch 1.x / 2.0-2.2 (glog without time)
    ],
)
def test_a_logged_c10_error_with_its_backtrace_header_is_the_failure(tmp_path, err):
    top = _top(tmp_path, err + RAISED)
    assert top.severity is Severity.ERROR and top.id == "class:crash"
    assert "setup failed!" in top.message


def test_a_watchdogs_error_line_above_the_header_stays_the_watchdogs(tmp_path):
    """Near miss: the error line is already a failure (the watchdog's timeout): no second one from the header."""
    text = (
        "[rank1]:[E1018 02:19:35.112000000 ProcessGroupNCCL.cpp:616] [Rank 1] Watchdog caught collective operation "
        "timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600080 "
        "milliseconds before timing out.\n"
        "Exception raised from checkTimeout at ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:618 (most recent call "
        "first):\n"
    )
    d = _run(tmp_path, text)
    assert {e.kind for e in d.facts.events} == {
        "watchdog"
    }  # (the header names checkTimeout: the watchdog's too)


def test_a_c10_error_line_alone_is_no_failure(tmp_path):
    """Near miss: torch's C++ error log lines without a raised exception's header (c10d retrying a connection)."""
    text = (
        "[W socket.cpp:464] [c10d] The server socket has failed to bind.\n[E socket.cpp:957] retrying in 1s\n"
    )
    d = _run(tmp_path, text)
    assert not d.facts.events


# ---- HfArgumentParser's refusal quoted in a sentence ------------------------------------------------------------------
def test_hfargumentparsers_refusal_quoted_in_prose_is_a_config_rejection(tmp_path):
    text = (
        "When I run the finetune_dpo.sh, an error occures: ValueError: Some specified arguments are not used by the "
        "HfArgumentParser: ['--task', 'DPO', '--dpo_beta', '0.1'] \nAny solution? Thanks!\n"
    )
    top = _top(tmp_path, text)
    assert top.id == "class:config-rejected"
    assert "key: task, dpo_beta)" in top.message  # the flags, not their values


def test_a_sentence_naming_the_parser_without_its_message_is_no_failure(tmp_path):
    """Near miss: prose about HfArgumentParser, no ValueError text of its own."""
    d = _run(tmp_path, "I parse my flags with HfArgumentParser: ['--task'] works fine.\n")
    assert not d.facts.events


# ---- a tqdm bar cut after its bar characters ------------------------------------------------------------------------
OOM_LINE = (
    "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 284.00 MiB (GPU 0; 31.75 GiB total capacity; "
    "27.12 GiB already allocated; 99.50 MiB free; 30.44 GiB reserved in total by PyTorch)\n"
)


@pytest.mark.parametrize(
    "bar,phase",
    [
        (" 10%|███████████████████▌\n", "training_step"),
        ("  0%|\n", "first_optimizer_step"),
    ],
)
def test_a_cut_bar_redrawn_after_a_failure_places_it(tmp_path, bar, phase):
    """tqdm redraws its bar when the failure closes it; a paste cut after the bar characters keeps its percentage."""
    assert _top(tmp_path, OOM_LINE + bar).data["phase"] == phase


def test_a_table_row_with_a_percentage_is_no_bar(tmp_path):
    """Near miss: a Markdown table's cell is no tqdm bar (it does not start the line)."""
    assert _top(tmp_path, OOM_LINE + "| gpu | 10%| x |\n").data["phase"] == "unknown"
