"""Phase detection from the run's own markers when there is no traceback (a SIGKILL shows none)."""

from __future__ import annotations

from pathlib import Path

import pytest

from zerodoctor.diagnose import diagnose

KILL = (
    "[2024-06-21 14:00:00,003] [ERROR] [launch.py:434:sigkill_handler] ['/usr/bin/python3', '-u', 'train.py', "
    "'--local_rank=1'] exits with return code = -9\n"
)


@pytest.mark.parametrize(
    ("before", "phase"),
    [
        # LLaMA-Factory / HF datasets map with workers
        (
            "Running tokenizer on dataset (num_proc=16):  41%|####      | 41000/100000 [01:10<01:40, 587.0 examples/s]\n",
            "tokenization",
        ),
        ("Loading checkpoint shards:  43%|####2     | 3/7 [00:41<00:55, 13.9s/it]\n", "load"),
        # DeepSpeed's checkpoint engine reading ZeRO states back (HF resume_from_checkpoint)
        (
            "Continuing training from checkpoint, will skip to saved global_step\n"
            "[2024-06-21 13:59:00,000] [INFO] [torch_checkpoint_engine.py:27:load] [Torch] Loading checkpoint from "
            "out/checkpoint-500/global_step500/zero_pp_rank_1_mp_rank_00_optim_states.pt...\n",
            "resume",
        ),
        (
            "{'loss': 1.02, 'learning_rate': 1e-05, 'epoch': 0.5}\nSaving model checkpoint to out/checkpoint-500\n",
            "checkpoint_save",
        ),
        ("***** Running training *****\n", "first_optimizer_step"),
        ("***** Running Evaluation *****\n  Num examples = 1000\n", "evaluation"),
    ],
)
def test_phase_of_a_sigkill_from_the_markers_before_it(tmp_path: Path, before: str, phase: str) -> None:
    log = tmp_path / "run.log"
    log.write_text(before + KILL)
    d = diagnose([str(log)])
    assert d.findings[0].severity.name == "ERROR" and d.first_failure is not None
    assert d.first_failure.exit_code == -9
    assert d.phase == phase, d.findings[0].data
