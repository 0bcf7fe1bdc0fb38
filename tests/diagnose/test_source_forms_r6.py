"""Round 6 (issue 10): a SIGKILLed process as its parent or shell reports it, from the text each source prints.

- bash, non-interactive (jobs.c notify_of_job_status): `/bin/bash: line 27: 318 Killed  sh start.sh`
- bash `Killed` pasted into a GitHub comment in Markdown emphasis: `**Killed**`
- torch.multiprocessing.spawn (torch/multiprocessing/spawn.py ProcessContext.join):
  `process %d terminated with signal %s` -- the index is the rank the process was spawned as
- joblib's loky executor (joblib/externals/loky/process_executor.py TerminatedWorkerError): "... or by an excessive
  memory usage causing the Operating System to kill the worker.\\n\\nThe exit codes of the workers are {SIGKILL(-9)}"
"""

from __future__ import annotations

import json

import pytest


def _top(tmp_path, run_cli, text: str) -> dict:
    log = tmp_path / "run.log"
    log.write_text(text, encoding="utf-8")
    code, out, err = run_cli("diagnose", str(log), "--format", "json")
    assert code in (0, 1), err
    doc = json.loads(out)
    findings = doc["findings"] if isinstance(doc, dict) else doc
    return findings[0]


HOST_KILLS = {
    "bash-job-report": "Epoch 5/5\n - 24s - loss: 5.9945\n/bin/bash: line 27: 318 Killed                  sh start.sh\n",
    "markdown-bold": "iter 144: loss 0.5882\nlabels\n[]\n\n**Killed**\n",
    "spawn-sigkill": "Traceback (most recent call last):\n  File \"train.py\", line 9, in <module>\n"
    "    mp.spawn(main, nprocs=2)\nException: process 1 terminated with signal SIGKILL\n",
    "loky-sigkill": "joblib.externals.loky.process_executor.TerminatedWorkerError: A worker process managed by the "
    "executor was unexpectedly terminated. This could be caused by a segmentation fault while calling the function "
    "or by an excessive memory usage causing the Operating System to kill the worker.\n\n"
    "The exit codes of the workers are {SIGKILL(-9)}\n",
}


@pytest.mark.parametrize("name", sorted(HOST_KILLS))
def test_a_sigkilled_child_reported_by_its_parent_is_a_host_kill(tmp_path, run_cli, name):
    top = _top(tmp_path, run_cli, HOST_KILLS[name])
    assert top["id"] in ("class:host-oom-kill", "host-oom-sigkill"), top["id"]
    assert top["severity"] == "error"


def test_the_spawn_index_is_the_rank_that_failed(tmp_path, run_cli):
    top = _top(tmp_path, run_cli, HOST_KILLS["spawn-sigkill"])
    assert (top.get("data") or {}).get("first_failure", {}).get("rank") == 1


NOT_HOST_KILLS = {
    # another signal: the spawn context names it, and it is no SIGKILL
    "spawn-sigsegv": "Exception: process 0 terminated with signal SIGSEGV\n",
    # a worker that exited with an error code: loky's set holds no signal
    "loky-exit-1": "joblib.externals.loky.process_executor.TerminatedWorkerError: A worker process managed by the "
    "executor was unexpectedly terminated.\n\nThe exit codes of the workers are {EXIT(1)}\n",
    # the word in prose, not the shell's report at the end of a line
    "prose": "Step 3 done. The job was not Killed by anything, it finished.\n{'train_loss': 0.51, 'epoch': 3.0}\n",
}


@pytest.mark.parametrize("name", sorted(NOT_HOST_KILLS))
def test_other_ends_are_not_host_kills(tmp_path, run_cli, name):
    top = _top(tmp_path, run_cli, NOT_HOST_KILLS[name])
    assert top["id"] not in ("class:host-oom-kill", "host-oom-sigkill"), (name, top["id"])
