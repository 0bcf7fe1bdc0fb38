"""Round 12 (issue 10): fixes from reviews R1 and R4 of round 11, and tune-split misses the log itself proves, each
built from the library's own message text (patterns.py / extract.py / classes.py name each source beside its rule).

- extract.py keeps its phase markers in a bounded list: a run of bars that the scan does not collapse (interleaved
  ranks' `[rankN]:` bars) after a failure must not push out the markers before the failure (review R4 item 1).
- a tool's report of an exit status 137 (kubectl exec, docker compose, PyCharm) after the run printed its end is named
  as an exit after the end; one the run outlived (a note about an earlier attempt) is no failure (review R1 item 9).
- progress in other forms: tqdm bars whose unit is a step (`5.00step/s`, `2.00s/step`: tqdm's format_meter), mmf's
  `progress: N/M, ... num_updates: N` log line (mmf/utils/logger.py summarize_report) (review R1 item 9, R4's note).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from zerodoctor.diagnose import diagnose
from zerodoctor.diagnose.patterns import parse_progress
from zerodoctor.findings import Severity

OOM_RANK1 = (
    "[rank1]: Traceback (most recent call last):\n"
    '[rank1]:   File "train.py", line 10, in <module>\n'
    "[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 1 has a total capacity of "
    "79.10 GiB of which 1.06 MiB is free.\n"
)


def _run(tmp_path: Path, text: str):
    log = tmp_path / "run.log"
    log.write_text(text, encoding="utf-8")
    return diagnose([str(log)])


def _top(tmp_path: Path, text: str):
    d = _run(tmp_path, text)
    assert d.findings, "no finding"
    return d.findings[0]


# ---- markers kept across a long run of interleaved ranks' bars (review R4 item 1) --------------------------------
def _map_bar(i: int, rank: int) -> str:
    # datasets' Dataset.map bar (arrow_dataset.py: `desc="Map"`, `num_proc`), prefixed by torchrun's `[rankN]:`
    total = 60000
    return f"[rank{rank}]:Map (num_proc=8):  {i * 100 // total:2d}%|##        | {i * 3}/{total} [00:{i % 60:02d}<01:00, 1234.56 examples/s]\n"


def test_a_failure_keeps_its_tokenization_phase_under_a_long_run_of_interleaved_bars(tmp_path):
    before = "".join(_map_bar(i, i % 3) for i in range(900))
    # ranks 0 and 2 go on mapping after rank 1 failed: 10,500 bar lines whose prefixes alternate (no run collapses)
    after = "".join(_map_bar(900 + i, (i % 2) * 2) for i in range(10500))
    top = _top(tmp_path, before + OOM_RANK1 + after)
    assert top.data["phase"] == "tokenization", top
    assert top.data["first_failure"]["rank"] == 1, top


def test_each_guard_line_is_kept(tmp_path):
    # (negative: the runtime guard's lines are markers of one kind that each name their own rank's phase; two in a
    # row stay two, and the failing rank's one names the phase)
    text = (
        "zerodoctor guard [rank 1, step 12, save]: Failure not in the knowledge base: see the traceback\n"
        "zerodoctor guard [rank 0, step 12, train]: Failure not in the knowledge base: see the traceback\n"
        "[rank1]: Traceback (most recent call last):\n"
        '[rank1]:   File "/work/train.py", line 40, in <module>\n'
        "[rank1]:     helper(batch)\n"
        "[rank1]: RuntimeError: something unusual happened\n"
    )
    assert _top(tmp_path, text).data["phase"] == "checkpoint_save"


# ---- an exit status 137 that a tool reports (review R1 item 9) ------------------------------------------------
RUN_START = (
    "***** Running training *****\n"
    "  Num examples = 100\n"
    "  0%|          | 0/10 [00:00<?, ?it/s]\n"
    " 10%|#         | 1/10 [00:01<00:09, 1.00it/s]\n"
)
RUN_END = (
    "{'train_runtime': 12.3, 'train_samples_per_second': 8.1, 'train_loss': 1.15, 'epoch': 1.0}\n"
    "100%|##########| 10/10 [00:10<00:00, 1.00it/s]\n"
    "Training completed. Do not forget to share your model on huggingface.co/models =)\n"
)


def test_an_exit_137_after_the_run_printed_its_end_is_named_after_the_end(tmp_path):
    # kubectl exec's report of the command's exit status (k8s.io/kubectl pkg/cmd/util/helpers.go)
    top = _top(tmp_path, RUN_START + RUN_END + "command terminated with exit code 137\n")
    assert top.severity == Severity.ERROR
    assert top.data["failure_class"]["id"] == "class:crash", top
    assert "code 137 (SIGKILL" in top.title and "after the run had finished" in top.title, top.title


def test_an_exit_137_during_training_is_still_a_kill(tmp_path):
    # (negative: with no end before it, the SIGKILL is the host OOM kill it always was)
    top = _top(tmp_path, RUN_START + "train-1 exited with code 137\n")
    assert top.data["failure_class"]["id"] == "class:host-oom-kill", top


def test_an_exit_137_the_run_outlived_is_no_failure(tmp_path):
    # (negative: a note about an earlier attempt, then a run that trains and finishes)
    text = "Pod restarted: previous container command terminated with exit code 137; now with more memory\n"
    d = _run(tmp_path, text + RUN_START + RUN_END)
    assert all(f.severity != Severity.ERROR for f in d.findings), d.findings


# ---- progress lines of other forms (review R1 item 9, review R4's note) -------------------------------------------
STOP = "WARNING:torch.distributed.elastic.agent.server.api:Received 15 death signal, shutting down workers\n"


@pytest.mark.parametrize(
    ("bar", "step"),
    [
        # tqdm's format_meter with unit="step" / "steps" (std.py rate_noinv_fmt / rate_inv_fmt, tqdm 4.x)
        ("Training:  50%|#####     | 50/100 [00:10<00:10,  5.00step/s]", 50),
        ("Training:   5%|5         | 5/100 [00:30<09:30,  6.00s/steps]", 5),
        ("Training:   5%|5         | 5/100 [00:10<03:10,  2.00s/step, loss=1.2]", 5),
        ("Steps:  50%|#####     | 50/100 [00:10<00:10,  5.00steps/s, loss=1, lr=1e-05]", 50),
        ("Training:   0%|          | 0/100 [00:00<?, ?step/s]", 0),
        # mmf's training log line (mmf/utils/logger.py summarize_report -> log_progress, `simple` and `json` formats)
        (
            "2021-03-04T10:01:00 | mmf.trainers.callbacks.logistics: progress: 100/22000, train/total_loss: 2.7313, "
            "train/total_loss/avg: 3.1254, max mem: 5423.0, experiment: run, epoch: 1, num_updates: 100, "
            "iterations: 100, max_updates: 22000, lr: 0.00005, ups: 1.67, time: 01m 00s 123ms",
            100,
        ),
        ('{"progress": "300/22000", "train/total_loss": 2.7, "epoch": 1, "num_updates": 300, "max_updates": 22000}', 300),
    ],
)
def test_progress_forms_are_read(tmp_path, bar, step):
    parsed = parse_progress(bar)
    assert parsed is not None and parsed[1] == step, parsed
    top = _top(tmp_path, f"{bar}\n{bar}\n" + STOP)
    assert top.data["phase"] == ("first_optimizer_step" if step == 0 else "training_step"), top


@pytest.mark.parametrize(
    "line",
    [
        # (negatives: a dataset map's bar in steps is data preparation; Keras' Progbar is no tqdm bar; a `progress:`
        # line without mmf's num_updates is anyone's)
        "Map:  50%|#####     | 50/100 [00:10<00:10,  5.00steps/s]",
        "100/100 [==============================] - 10s 100ms/step - loss: 0.1",
        "Download progress: 3/10, please wait",
    ],
)
def test_near_miss_progress_forms_are_not_progress(line):
    assert parse_progress(line) is None


# ---- an exception quoted in double quotes inside prose (tune misses r1v132, acc2821, llava901) ---------------------
@pytest.mark.parametrize(
    ("text", "top_id"),
    [
        # vLLM's default_weight_loader (model_loader/weight_utils.py: `assert param.size() == loaded_weight.size(),
        # f"Attempted to load weight ({loaded_weight.size()}) into parameter ({param.size()})"`) given a ZeRO-3 policy's
        # empty partitioned weight; in bold, with torchrun's rank prefix inside the quotes
        (
            'After the first step, this error appears: **"[rank0]: AssertionError: Attempted to load weight '
            '(torch.Size([0])) into parameter (torch.Size([1280, 3, 2, 14, 14]))"**.\n',
            "z3-empty-partition-outside-engine",
        ),
        # (the releases that raise it as a ValueError; typographic quotes)
        (
            "the weight sync fails with \u201cValueError: Attempted to load weight (torch.Size([0])) into parameter "
            "(torch.Size([151936, 1536]))\u201d every time\n",
            "z3-empty-partition-outside-engine",
        ),
        # transformers' refusal to move a bitsandbytes model (modeling_utils.py PreTrainedModel.to), quoted in prose
        (
            'However, there is always happening: "ValueError: .to is not supported for 4-bit or 8-bit models. Please '
            'use the model as it is, since the model has already been set to the correct devices and casted to the '
            'correct dtype"\n',
            "class:crash",
        ),
    ],
)
def test_an_exception_quoted_in_double_quotes_is_the_failure(tmp_path, text, top_id):
    top = _top(tmp_path, "I made the deepspeed config with accelerate config.\n\n" + text + "\nHow to solve?\n")
    assert top.id == top_id and top.severity == Severity.ERROR, top


def test_the_trainer_refusing_to_resume_is_a_resume_failure(tmp_path):
    # transformers' Trainer.train with resume_from_checkpoint=True (trainer.py: `raise ValueError(f"No valid checkpoint
    # found in output directory ({args.output_dir})")`), the whole line quoted, and as a traceback's last line
    for text in (
        '### Question\n\nwhen i resume from the save checkpoint i got this error:\n"ValueError: No valid checkpoint '
        'found in output directory"\n',
        '  File "/opt/transformers/trainer.py", line 1557, in train\n    raise ValueError(f"No valid checkpoint found '
        'in output directory ({args.output_dir})")\nValueError: No valid checkpoint found in output directory (./ckpt)\n',
    ):
        top = _top(tmp_path, text)
        assert top.severity == Severity.ERROR and top.data["phase"] == "resume", top


def test_an_exception_quoted_before_a_run_that_finished_is_no_failure(tmp_path):
    # (negative: the quote is what an earlier attempt said; this run trains and prints its end)
    text = 'Last time it said "ValueError: No valid checkpoint found in output directory", now it works:\n'
    d = _run(tmp_path, text + RUN_START + RUN_END)
    assert all(f.severity != Severity.ERROR for f in d.findings), d.findings


def test_a_quoted_line_without_an_exception_is_nothing(tmp_path):
    # (negative: a quoted span that names no exception type, a JSON value, a vLLM load of a non-empty weight)
    text = (
        'the log says "loading weights: done" and {"status": "ok", "note": "no Error here"}\n'
        "AssertionError: Attempted to load weight (torch.Size([4096])) into parameter (torch.Size([5120]))\n"
    )
    d = _run(tmp_path, text)
    assert d.findings and d.findings[0].id != "z3-empty-partition-outside-engine", d.findings


# ---- deepspeed.initialize's config assertions pasted without their type (tune miss megads386) ----------------------
@pytest.mark.parametrize(
    "said",
    [
        # deepspeed/__init__.py initialize, 0.3 to 0.19.8 (cut by the user after `deepspeed.`)
        "I meet an assertion error：Not sure how to proceed, we were given deepspeed configs in the deepspeed "
        "arguments and deepspeed. the script I used is run.sh",
        # (the release whose string continued with a backslash: its blanks inside the message)
        "Not sure how to proceed, we were given deepspeed configs in the deepspeed             arguments and "
        "deepspeed.initialize() function call",
        "Not sure how to proceed, we were given both a deepscale_config and deepspeed_config",
        "DeepSpeed requires --deepspeed_config to specify configuration file",
    ],
)
def test_deepspeed_initialize_config_assertions_are_named(tmp_path, said):
    top = _top(tmp_path, f"hello, when I run the script to train a gpt model: {said}\n")
    # (an assertion inside DeepSpeed; where its message names the config, DeepSpeed's refusal of the configuration)
    assert top.id in ("class:library-assertion", "class:config-rejected"), top
    assert top.data["phase"] == "engine_init", top


def test_a_deepspeed_initialize_assertion_quoted_before_a_finished_run_is_no_failure(tmp_path):
    # (negative: the message quoted as the problem of an earlier attempt, then a run that finished)
    text = "Fixed 'Not sure how to proceed, we were given both a deepscale_config and deepspeed_config' by dropping args\n"
    d = _run(tmp_path, text + RUN_START + RUN_END)
    assert all(f.severity != Severity.ERROR for f in d.findings), d.findings
