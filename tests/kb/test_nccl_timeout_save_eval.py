"""nccl-timeout-save-eval names a watchdog timeout only while a save or an evaluation is in progress: a timeout in
plain training, or after a save that finished before training resumed, is the failure class
(class:collective-timeout), not this entry."""

from __future__ import annotations

from pathlib import Path

import pytest

from zerodoctor.diagnose import diagnose

WATCHDOG = (
    "[rank1]:[E ProcessGroupNCCL.cpp:563] [Rank 1] Watchdog caught collective operation timeout: "
    "WorkNCCL(SeqNum=211067, OpType=_ALLGATHER_BASE, NumelIn=2359296, NumelOut=18874368, Timeout(ms)=1800000) "
    "ran for 1800419 milliseconds before timing out.\n"
    "[rank1]:[E ProcessGroupNCCL.cpp:577] [Rank 1] Some NCCL operations have failed or timed out. Due to the "
    "asynchronous nature of CUDA kernels, subsequent GPU operations might run on corrupted/incomplete data.\n"
    "E0520 03:41:02.120000 140234 torch/distributed/elastic/multiprocessing/api.py:833] failed (exitcode: -6) "
    "local_rank: 1 (pid: 2231) of binary: /usr/bin/python3\n"
)
TRAINING = (
    "{'loss': 1.2, 'grad_norm': 0.5, 'learning_rate': 1e-05, 'epoch': 0.4}\n"
    " 40%|####      | 400/1000 [1:00:00<1:30:00,  9.00s/it]\n"
)
SAVE = "[INFO|trainer.py:3719] 2024-05-20 03:10:44,018 >> Saving model checkpoint to out/checkpoint-400\n"
EVAL = "[INFO|trainer.py:3614] 2024-05-20 03:10:02,114 >> ***** Running Evaluation *****\n"
SAVE_FRAME = (
    '[rank1]:   File "/usr/lib/python3.10/site-packages/deepspeed/runtime/engine.py", line 3480, in '
    "_zero3_consolidated_16bit_state_dict\n"
)
RESUMED = " 41%|####      | 410/1000 [1:01:30<1:28:30,  9.00s/it]\n"


@pytest.mark.parametrize(
    ("name", "text", "top_id"),
    [
        ("plain training", TRAINING + WATCHDOG, "class:collective-timeout"),
        ("saving at the timeout", TRAINING + SAVE + WATCHDOG, "nccl-timeout-save-eval"),
        ("evaluating at the timeout", TRAINING + EVAL + WATCHDOG, "nccl-timeout-save-eval"),
        ("a frame of the save path", SAVE_FRAME + WATCHDOG, "nccl-timeout-save-eval"),
        (
            "the save finished, training resumed",
            TRAINING + SAVE + RESUMED + WATCHDOG,
            "class:collective-timeout",
        ),
    ],
)
def test_entry_needs_a_save_or_eval_in_progress(tmp_path: Path, name: str, text: str, top_id: str) -> None:
    log = tmp_path / "run.log"
    log.write_text(text)
    findings = diagnose([str(log)]).findings
    assert findings[0].id == top_id, name
    if top_id.startswith("class:"):
        assert all(f.id != "nccl-timeout-save-eval" for f in findings), name
