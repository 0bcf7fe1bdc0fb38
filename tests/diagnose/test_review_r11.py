"""Review of round 11 (issue 10, R1's probes): the speed of the progress search on bars that do not parse, lines that
a run outlived or printed after its end, a second run in the same log, a Ray cause past the wrapper's traceback,
and torchrun's death signal as Python <= 3.10 prints it."""

from __future__ import annotations

from pathlib import Path

import pytest

from zerodoctor.diagnose import diagnose
from zerodoctor.diagnose.patterns import PROGRESS_LITERALS
from zerodoctor.diagnose.scan import _last_progress
from zerodoctor.findings import Severity

RUN = (
    "***** Running training *****\n"
    "  Num examples = 100\n"
    "  0%|          | 0/10 [00:00<?, ?it/s]\n"
    " 10%|█         | 1/10 [00:01<00:09, 1.00it/s]\n"
    "{'loss': 1.2, 'learning_rate': 1e-5, 'epoch': 0.5}\n"
)
FIN = (
    "{'train_runtime': 12.3, 'train_samples_per_second': 8.1, 'train_loss': 1.15, 'epoch': 1.0}\n"
    "100%|██████████| 10/10 [00:10<00:00, 1.00it/s]\n"
    "Training completed. Do not forget to share your model on huggingface.co/models =)\n"
)


def _run(tmp_path: Path, text: str):
    log = tmp_path / "run.log"
    log.write_text(text, encoding="utf-8")
    return diagnose([str(log)])


def _quiet(tmp_path: Path, text: str) -> None:
    d = _run(tmp_path, text)
    assert d.first_failure is None
    assert all(f.severity is not Severity.ERROR for f in d.findings)


# ---- the progress search walks back over bars in other units in linear time ------------------------------------------
class _CountingBytes(bytes):
    """bytes whose rfind adds up the bytes it walks (from the end to the hit, or the whole span on a miss)."""

    walked = 0

    def rfind(self, sub, start=None, end=None):  # type: ignore[override]
        lo, hi = start or 0, len(self) if end is None else end
        pos = super().rfind(sub, lo, hi)
        type(self).walked += hi - (pos if pos >= 0 else lo)
        return pos


def test_the_progress_search_over_bars_in_other_units_is_linear():
    """A download's bar (`246MB/s]`) holds tqdm's `%|` but no progress literal of a training bar: walking back over
    4000 of them searched every literal over a 64 KiB window per line (quadratic: ~4 GB walked here); each byte is
    now walked a few times per literal."""
    line = b"model-00001.safetensors:  42%|\xe2\x96\x88\xe2\x96\x88     | 42M/10000M [00:01<00:01, 246MB/s]\n"
    chunk = _CountingBytes(line * 4000)
    _CountingBytes.walked = 0
    assert _last_progress(chunk, 0, len(chunk), 4001, len(chunk)) is None
    assert _CountingBytes.walked <= 4 * len(PROGRESS_LITERALS) * len(chunk)


def test_a_training_bar_above_bars_in_other_units_is_still_found():
    """Near miss: the walk back skips the download bars and finds the training bar or the cut bar above them, with
    its line number."""
    bar = b" 30%|###       | 3/10 [00:03<00:07, 1.00it/s]\n"
    cut = b" 40%|####\n"  # (a cut bar: its `%|` within reach of the line's start)
    down = b"model.safetensors:  42%|##   | 42M/100M [00:01<00:01, 246MB/s]\n" * 3000
    for head, step in ((bar, 3), (bar + cut, 40), (cut, 40)):  # (the last: a cut bar on the chunk's first line)
        chunk = head + down
        found = _last_progress(chunk, 0, len(chunk), head.count(b"\n") + 3001, len(chunk))
        assert found is not None and found.step == step and found.lineno == head.count(b"\n")


# ---- failure lines a healthy, finished run outlived -------------------------------------------------------------------
@pytest.mark.parametrize(
    "text",
    [
        # CalledProcessError's tail quoted in prose before a run that trains and finishes, and after it
        "Note: last week this job died with <Signals.SIGKILL: 9>. after raising RAM it works.\n" + RUN + FIN,
        RUN + FIN + "Note: last week this job died with <Signals.SIGKILL: 9>. after raising RAM it works.\n",
        # a glog error line above a c10::Error's backtrace header, then training goes on
        RUN
        + "[E1125 09:11:12.123456789 ProcessGroupNCCL.cpp:1234] [PG 0 Rank 0] some harmless error log\n"
        + "Exception raised from foo at /x/y.cpp:12 (most recent call first):\n"
        + "frame #0: c10::Error::Error\n"
        + " 20%|██        | 2/10 [00:02<00:08, 1.00it/s]\n"
        + FIN,
        # nvcc's fatal line quoted in docs after a finished run, no compile in the log
        RUN + FIN + "# docs: an error like\nnvcc fatal   : Unsupported gpu architecture 'compute_90'\n# means old nvcc\n",
        # HfArgumentParser's refusal quoted after a finished run
        RUN
        + FIN
        + "(earlier attempt said ValueError: Some specified arguments are not used by the HfArgumentParser: "
        "['--foo'])\n",
        # xtuner's command error after a finished run (xtuner's cli prints it and returns: nothing ran after it in
        # that command, but this run had finished before it)
        RUN + FIN + "WARNING: command error: 'No such file: work_dirs/x.pth'!\n",
    ],
    ids=["died-prose-before", "died-prose-after", "glog-midrun", "nvcc-docs", "hfparser-after", "xtuner-after"],
)
def test_a_failure_line_the_run_outlived_or_followed_is_no_failure(tmp_path, text):
    _quiet(tmp_path, text)


def test_xtuners_command_error_of_its_failed_child_after_the_end_is_a_failure(tmp_path):
    """Near miss: xtuner >= 0.2 runs `torchrun` with check=True inside the try that prints the command error; a child
    that printed its end, then exited 1, is still a failed run."""
    said = "Command '['torchrun', '--nproc_per_node=8', 'train.py']' returned non-zero exit status 1."
    top = _run(tmp_path, RUN + FIN + f"WARNING: command error: '{said}'!\n").findings[0]
    assert top.severity is Severity.ERROR


def test_a_lone_nvcc_fatal_line_is_no_build_failure(tmp_path):
    """Near miss of the build-failure rule: nvcc's line with no compile (no nvcc command, no torch build) before it."""
    d = _run(tmp_path, "nvcc fatal   : Unsupported gpu architecture 'compute_90'\n")
    assert all(f.id != "class:op-build-failure" for f in d.findings)


def test_an_nvcc_fatal_line_after_torchs_build_line_is_the_build_failure(tmp_path):
    text = "Building extension module fused_adam...\nnvcc fatal   : Unsupported gpu architecture 'compute_90'\n"
    assert _run(tmp_path, text).findings[0].id == "class:op-build-failure"


def test_the_hfparser_refusal_before_the_second_run_started_still_counts(tmp_path):
    """Near miss: a run that finished, a second one whose loop started, then its refusal - the second run's failure."""
    text = (
        RUN
        + FIN
        + "***** Running training *****\n"
        + "ValueError: Some specified arguments are not used by the HfArgumentParser: ['--foo']\n"
    )
    assert _run(tmp_path, text).findings[0].severity is Severity.ERROR


# ---- two runs in one log ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "exit_line",
    [
        "torch.distributed.elastic.multiprocessing.api: [ERROR] failed (exitcode: 1) local_rank: 0 (pid: 12) of "
        "binary: python\n",
        "[ERROR] [launch.py:325:sigkill_handler] ['python'] exits with return code = -11\n",
    ],
)
def test_an_exit_in_a_second_run_is_not_named_after_the_first_runs_end(tmp_path, exit_line):
    text = (
        RUN
        + "{'train_runtime': 12.3, 'train_samples_per_second': 8.1, 'train_loss': 1.15, 'epoch': 1.0}\n"
        + "=== run 2\n"
        + RUN
        + " 30%|███       | 3/10 [00:03<00:07, 1.00it/s]\n"
        + exit_line
    )
    top = _run(tmp_path, text).findings[0]
    assert top.severity is Severity.ERROR
    assert "after the run had finished" not in top.title
    assert "training was over" not in top.message


# ---- Ray: the cause inside the wrapper's own traceback ----------------------------------------------------------------
def test_a_ray_cause_line_past_later_progress_is_not_the_wrappers(tmp_path):
    text = (
        "***** Running training *****\n"
        " 10%|█         | 1/10 [00:01<00:09, 1.00it/s]\n"
        "ray.exceptions.RayTaskError(ValueError): ray::TrainWorker.step() (pid=1234, ip=10.0.0.2)\n"
        "(TrainWorker pid=1234) retrying\n"
        " 20%|██        | 2/10 [00:01<00:09, 1.00it/s]\n"
        "ValueError: Unrelated: invalid literal for int() with base 10: 'x'\n"
    )
    top = _run(tmp_path, text).findings[0]
    assert "Unrelated" not in top.message
    assert "RayTaskError(ValueError)" in top.title


# ---- torchrun's death signal as Python <= 3.10 prints it --------------------------------------------------------------
@pytest.mark.parametrize("said,code", [("Signals.SIGTERM", -15), ("15", -15), ("Signals.SIGINT", -2)])
def test_torchruns_death_signal_in_both_forms(tmp_path, said, code):
    """torch api.py logs `Received %s death signal` with a signal.Signals: `Signals.SIGTERM` on Python <= 3.10."""
    text = (
        " 10%|█         | 1/10 [00:01<00:09, 1.00it/s]\n"
        "[2025-04-13 23:41:30,000] torch.distributed.elastic.agent.server.api: [WARNING] Received "
        f"{said} death signal, shutting down workers\n"
    )
    d = _run(tmp_path, text)
    assert d.first_failure is not None and d.first_failure.exit_code == code
