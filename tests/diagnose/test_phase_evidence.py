"""Phase and class from evidence the log carries even without a phase marker, and `unknown` where it carries none.

- a NCCL watchdog timeout of a gradient-sized reduction (ALLREDUCE / REDUCE_SCATTER of >= 1M elements) is a
  backward pass; a 1-element ALLREDUCE (a save's or an evaluation's barrier-like reduction) or a parameter
  ALLGATHER says nothing;
- DeepSpeed's launcher tearing the job down while the ranks load shards or ZeRO states, with no rank printing an
  error, is a rank killed by a signal (host memory), not an unnamed crash.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from zerodoctor.diagnose import diagnose
from zerodoctor.diagnose.extract import Extractor, Facts
from zerodoctor.diagnose.reader import LogLine
from zerodoctor.diagnose.scan import Hit, Progress


def _watchdog(op: str, numel: int) -> str:
    return (
        f"[rank0]:[E217 07:24:07.938443115 ProcessGroupNCCL.cpp:616] [Rank 0] Watchdog caught collective operation "
        f"timeout: WorkNCCL(SeqNum=54053, OpType={op}, NumelIn={numel}, NumelOut={numel}, Timeout(ms)=600000) ran "
        "for 600087 milliseconds before timing out.\n"
        "[rank0]:[E217 07:24:07.938551513 ProcessGroupNCCL.cpp:1785] [PG ID 1 PG GUID 1 Rank 0] Exception (either "
        "an error or timeout) detected by watchdog at work: 54053, last enqueued NCCL work: 54054, last completed "
        "NCCL work: 54052.\n"
    )


@pytest.mark.parametrize(
    ("before", "op", "numel", "phase"),
    [
        # DDP / ZeRO-1/2 gradient bucket, ZeRO-3 / FSDP gradient reduce-scatter: a backward pass
        ("", "ALLREDUCE", 497464352, "training_step"),
        ("", "_REDUCE_SCATTER_BASE", 131072000, "training_step"),
        # a 1-element reduction happens in saves and evaluations alike; parameter gathers in every phase
        ("", "ALLREDUCE", 1, "unknown"),
        ("", "_ALLGATHER_BASE", 50823168, "unknown"),
        ("", "ALLTOALL", 46684160, "unknown"),
        # a marker before the timeout says more than the collective
        ("Saving model checkpoint to out/checkpoint-500\n", "ALLREDUCE", 497464352, "checkpoint_save"),
        ("***** Running Evaluation *****\n", "_ALLGATHER_BASE", 50823168, "evaluation"),
    ],
)
def test_watchdog_phase_from_the_collective_only_when_it_is_evidence(
    tmp_path: Path, before: str, op: str, numel: int, phase: str
) -> None:
    log = tmp_path / "run.log"
    log.write_text(before + _watchdog(op, numel))
    d = diagnose([str(log)])
    assert d.findings[0].id in ("class:collective-timeout", "nccl-timeout-save-eval"), d.findings[0].id
    assert d.phase == phase, d.findings[0].data


_TEARDOWN = (
    "[2023-07-25 00:38:05,103] [INFO] [launch.py:315:sigkill_handler] Killing subprocess 230\n"
    "[2023-07-25 00:38:08,243] [INFO] [launch.py:315:sigkill_handler] Killing subprocess 231\n"
)


@pytest.mark.parametrize(
    ("before", "class_id", "phase"),
    [
        (
            "Loading checkpoint shards:  50%|#####     | 1/2 [00:10<00:10, 10.36s/it]\n",
            "class:host-oom-kill",
            "load",
        ),
        (
            "[2023-07-25 00:37:49,180] [INFO] [torch_checkpoint_engine.py:27:load] [Torch] Loading checkpoint from "
            "/out/checkpoint-10/global_step10/bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt...\n",
            "class:host-oom-kill",
            "resume",
        ),
        # the same silent teardown in the middle of training: nothing says why the rank exited
        ("{'loss': 1.02, 'learning_rate': 1e-05, 'epoch': 0.5}\n", "class:crash", "training_step"),
        # a rank that printed its own error while loading is that error, not a kill
        (
            "Loading checkpoint shards:  50%|#####     | 1/2 [00:10<00:10, 10.36s/it]\n"
            "Traceback (most recent call last):\n"
            '  File "/x/train.py", line 3, in <module>\n'
            "    model = AutoModelForCausalLM.from_pretrained(path)\n"
            "OSError: Unable to load weights from pytorch checkpoint file\n",
            "class:crash",
            "load",
        ),
    ],
)
def test_silent_teardown_while_loading_is_a_kill(
    tmp_path: Path, before: str, class_id: str, phase: str
) -> None:
    log = tmp_path / "run.log"
    log.write_text(before + _TEARDOWN)
    d = diagnose([str(log)])
    assert d.findings[0].id == class_id, [f.id for f in d.findings]
    assert d.phase == phase, d.findings[0].data
    if class_id == "class:host-oom-kill":
        text = d.findings[0].message
        # what the log proves and what it does not: no exit code is in it
        assert "no rank printed a Python traceback" in text and "not in these logs" in text


def test_a_traceback_whose_newlines_were_lost_is_read_as_printed(tmp_path: Path) -> None:
    """A paste in one backtick span: the traceback is one physical line, cut before its exception line."""
    log = tmp_path / "run.log"
    log.write_text(
        "`[2021-03-16 13:01:52,899] [INFO] [engine.py:1284:_load_checkpoint] rank: 0 loading checkpoint: "
        "/x/checkpoint-20/global_step20/mp_rank_00_model_states.pt Traceback (most recent call last): "
        'File "run_mlm.py", line 592, in <module> main() File "run_mlm.py", line 558, in main train_result = '
        'trainer.train(resume_from_checkpoint=checkpoint) File "/x/trainer.py", line 1169, in '
        "_load_optimizer_and_scheduler self.deepspeed.load_checkpoint(checkpoint) "
        'File "/x/deepspeed/runtime/engine.py", line 1265, in load_checkpoint load_optimizer_states=True) File\n'
    )
    d = diagnose([str(log)])
    assert d.findings[0].id == "class:crash", [(f.id, f.title) for f in d.findings]
    assert d.phase == "resume"
    # one frame header per line: a single frame in a normal line is not split
    one = tmp_path / "one.log"
    one.write_text('warning: File "a.py", line 3, in f is deprecated\n')
    assert diagnose([str(one)]).first_failure is None


# The extractor's reading of marker keys the scan hands it (patterns.py names them): fed directly, so the rule is
# tested whatever the patterns' spelling.
def _facts(lines: list[tuple[str, set[str], Progress | None]]) -> Facts:
    ex = Extractor()
    for i, (text, keys, progress) in enumerate(lines, start=1):
        ex.feed(Hit(LogLine("run.log", i, text), frozenset(keys), i, 0, progress))
    return ex.finish()


_KILLED = ("Killed", {"x:launch-shell-killed"}, None)


@pytest.mark.parametrize(
    ("lines", "phase"),
    [
        # an evaluation loop's own header (Lightning's validation bar, `Evaluating`, lm-eval's requests)...
        (
            [
                (
                    "Validation DataLoader 0:  40%|####      | 4/10 [00:01<00:02, 3.1it/s]",
                    {"x:phase-eval-open"},
                    None,
                )
            ],
            "evaluation",
        ),
        # ...is over once training progress is printed after it
        (
            [
                ("Evaluating the results...", {"x:phase-eval-open"}, None),
                (
                    "{'loss': 0.5, 'learning_rate': 1e-05, 'epoch': 1.3}",
                    set(),
                    Progress("trainer", None, None, 1.3, 2),
                ),
            ],
            "training_step",
        ),
    ],
)
def test_an_open_evaluation_marker_closes_on_training_progress(
    lines: list[tuple[str, set[str], Progress | None]], phase: str
) -> None:
    last = lines[-1][2]
    killed = (_KILLED[0], _KILLED[1], last)
    facts = _facts([*lines, killed])
    ev = next(e for e in facts.events if e.kind == "exit")
    assert ev.phase == phase


def test_a_size_mismatch_list_without_its_runtime_error_line_is_one_failure() -> None:
    mismatch = (
        "size mismatch for model.norm.weight: copying a param with shape torch.Size([1024]) from checkpoint"
    )
    facts = _facts(
        [
            (mismatch, {"x:load-size-mismatch"}, None),
            (mismatch.replace("norm", "head"), {"x:load-size-mismatch"}, None),
        ]
    )
    assert [e.kind for e in facts.events] == ["exception"]
    assert facts.events[0].detail.startswith(
        "RuntimeError: Error(s) in loading state_dict: size mismatch for model.norm"
    )
    # under its RuntimeError line the list adds nothing
    header = "RuntimeError: Error(s) in loading state_dict for BoringModel:"
    facts = _facts([(header, {"x:tb-exception"}, None), (mismatch, {"x:load-size-mismatch"}, None)])
    assert len(facts.events) == 1 and facts.events[0].line.lineno == 1


_PIN_MEMORY_FAILURE = (
    "Exception in thread Thread-1:\n"
    "Traceback (most recent call last):\n"
    '  File "/usr/lib/python3.7/threading.py", line 926, in _bootstrap_inner\n'
    "    self.run()\n"
    '  File "/env/site-packages/torch/utils/data/_utils/pin_memory.py", line 28, in _pin_memory_loop\n'
    "    idx, data = r\n"
    "ValueError: not enough values to unpack (expected 2, got 0)\n"
)


@pytest.mark.parametrize(
    ("before", "after", "phase"),
    [
        # mmengine/mmcv save at an epoch's end; a DataLoader failing after it is the next epoch's start
        ("INFO:mmcls:Saving checkpoint at 1 epochs\n", _PIN_MEMORY_FAILURE, "epoch_end"),
        ("Saving model checkpoint to out/checkpoint-500\n", _PIN_MEMORY_FAILURE, "training_step"),
        # a kill with no frames after the save line: the save may still run
        ("INFO:mmcls:Saving checkpoint at 1 epochs\n", "Killed\n", "checkpoint_save"),
    ],
)
def test_a_dataloader_failure_after_a_save_is_past_it(
    tmp_path: Path, before: str, after: str, phase: str
) -> None:
    log = tmp_path / "run.log"
    log.write_text("INFO:mmcls:Epoch [1][12/13]  lr: 1.000e-01, loss: 9.0995\n" + before + after)
    assert diagnose([str(log)]).phase == phase


@pytest.mark.parametrize(
    ("launcher", "rank"),
    [
        (
            "[2023-07-04 17:31:27,755] [ERROR] [launch.py:321:sigkill_handler] ['/usr/bin/python3', '-u', 'infer.py', "
            "'--local_rank=0'] exits with return code = 1\n",
            0,
        ),
        (
            "ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: 1) local_rank: 3 (pid: 91809) of "
            "binary: /usr/bin/python3\n",
            3,
        ),
        # two ranks reported: which one printed the unprefixed line is not known
        (
            "[launch.py:321:sigkill_handler] ['/usr/bin/python3', '-u', 'a.py', '--local_rank=0'] exits with return "
            "code = 1\n[launch.py:321:sigkill_handler] ['/usr/bin/python3', '-u', 'a.py', '--local_rank=1'] exits "
            "with return code = 1\n",
            None,
        ),
    ],
)
def test_an_unprefixed_failure_takes_the_rank_the_launcher_reports(
    tmp_path: Path, launcher: str, rank: int | None
) -> None:
    log = tmp_path / "run.log"
    log.write_text(
        "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 978.00 MiB (GPU 0; 4.00 GiB total "
        "capacity; 1.68 GiB already allocated; 0 bytes free; 2.72 GiB reserved in total by PyTorch)\n"
        + launcher
    )
    d = diagnose([str(log)])
    assert d.first_failure is not None and d.first_failure.kind == "cuda-oom"
    assert d.first_failure.rank == rank


_SIGKILL = (
    "[2024-06-21 14:00:00,003] [ERROR] [launch.py:434:sigkill_handler] ['/usr/bin/python3', '-u', 'train.py', "
    "'--local_rank=1'] exits with return code = -9\n"
)
_TIMEOUT = _watchdog("ALLREDUCE", 1)


@pytest.mark.parametrize(
    ("before", "failure", "phase"),
    [
        # HF datasets' bars (hf_tqdm unit " examples"): any map/filter, with or without a description
        ("Map:  45%|####5     | 450/1000 [00:01<00:01, 400.00 examples/s]\n", _SIGKILL, "tokenization"),
        (
            "Tokenizing train dataset (num_proc=8):  12%|#2  | 1200/10000 [00:03<00:22, 391.2 examples/s]\n",
            _SIGKILL,
            "tokenization",
        ),
        # SentencePiece training a tokenizer
        ("trainer_interface.cc(137) LOG(INFO) Loaded 108000000 lines\n", "Killed\n", "tokenization"),
        # transformers >= 5 loads weights under a "Loading weights" bar: a load, not a finished training epoch
        ("Loading weights: 100%|##########| 291/291 [00:02<00:00, 120.5it/s]\n", _SIGKILL, "load"),
        # DeepSpeed's engine writing its model states; transformers >= 5 save_pretrained's bar
        (
            "[INFO] [engine.py:3526:_save_checkpoint] Saving model checkpoint: out/global_step500/mp_rank_00_model_states.pt\n",
            _SIGKILL,
            "checkpoint_save",
        ),
        ("Writing model shards:  50%|#####     | 2/4 [00:09<00:09, 4.6s/it]\n", _SIGKILL, "checkpoint_save"),
        # DeepSpeed reading ZeRO partitions back; accelerate's load_state
        (
            "[INFO] [engine.py:4770:_load_zero_checkpoint] loading 8 zero partition checkpoints for rank 0\n",
            _SIGKILL,
            "resume",
        ),
        ("INFO:accelerate.accelerator:Loading states from out/step_1000\n", _SIGKILL, "resume"),
        # evaluation loops' own lines
        ("Validation DataLoader 0:  40%|####      | 4/10 [00:01<00:02,  3.10it/s]\n", _SIGKILL, "evaluation"),
        ("Evaluating the results...\n", _TIMEOUT, "evaluation"),
        ("INFO:lm-eval:Running loglikelihood requests\n", _TIMEOUT, "evaluation"),
        ("***** Evaluating perplexity, Epoch 1/1 *****\n", _TIMEOUT, "evaluation"),
        # Lightning's validation is over once the training bar moves again
        (
            "Validation DataLoader 0: 100%|##########| 10/10 [00:02<00:00,  4.10it/s]\n"
            "Epoch 1:   5%|5         | 11/209 [00:20<06:12,  1.78s/it, loss=0.0685, v_num=0]\n",
            _SIGKILL,
            "training_step",
        ),
    ],
)
def test_framework_markers_place_a_failure_without_frames(
    tmp_path: Path, before: str, failure: str, phase: str
) -> None:
    log = tmp_path / "run.log"
    log.write_text(before + failure)
    d = diagnose([str(log)])
    assert d.first_failure is not None
    assert d.phase == phase, d.findings[0].data


def test_a_pasted_size_mismatch_list_is_a_load_failure(tmp_path: Path) -> None:
    log = tmp_path / "run.log"
    log.write_text(
        "[rank1]:        size mismatch for model.norm.weight: copying a param with shape torch.Size([1024]) from "
        "checkpoint, the shape in current model is torch.Size([4096]).\n"
        "[rank1]:        size mismatch for lm_head.weight: copying a param with shape torch.Size([151936, 1024]) from "
        "checkpoint, the shape in current model is torch.Size([151936, 4096]).\n"
        "W0527 01:21:26.844000 140472356030272 torch/distributed/elastic/multiprocessing/api.py:851] Sending process "
        "1056309 closing signal SIGTERM\n"
    )
    d = diagnose([str(log)])
    assert d.findings[0].id == "class:crash", [f.id for f in d.findings]
    assert d.first_failure is not None and d.first_failure.rank == 1


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("Segmentation fault (core dumped)", -11),
        ("Aborted (core dumped)", -6),
        ("[1]    26478 segmentation fault  python train.py", -11),
        ("Terminated", -15),
    ],
)
def test_the_shells_report_of_a_signal_is_the_exit_it_stands_for(text: str, code: int) -> None:
    facts = _facts([(text, {"x:launch-shell-signal"}, None)])
    assert [(e.kind, e.exit_code) for e in facts.events] == [("exit", code)]


@pytest.mark.parametrize(
    ("tail", "top", "code"),
    [
        ("died with <Signals.SIGKILL: 9>.", "host-oom-sigkill", -9),
        ("returned non-zero exit status -9.", "host-oom-sigkill", -9),
        ("died with <Signals.SIGSEGV: 11>.", "class:crash", -11),
    ],
)
def test_a_subprocess_launchers_report_of_a_signal_is_the_childs_exit(
    tmp_path: Path, tail: str, top: str, code: int
) -> None:
    log = tmp_path / "run.log"
    log.write_text(f"subprocess.CalledProcessError: Command '['/usr/bin/python3', 'train.py']' {tail}\n")
    d = diagnose([str(log)])
    assert d.first_failure is not None and d.first_failure.kind == "exit"
    assert d.first_failure.exit_code == code
    assert d.findings[0].id == top, [f.id for f in d.findings]


def test_a_build_commands_exit_status_stays_the_exception_it_is(tmp_path: Path) -> None:
    log = tmp_path / "run.log"
    log.write_text(
        "subprocess.CalledProcessError: Command '['ninja', '-v']' returned non-zero exit status 1.\n"
    )
    d = diagnose([str(log)])
    assert d.first_failure is not None and d.first_failure.kind == "exception"


def test_a_known_failure_message_with_no_failure_event_takes_the_phase_the_markers_end_in(
    tmp_path: Path,
) -> None:
    """A KB message that is no extractor event (a DataLoader worker's SIGBUS report): no progress was printed, so
    the last marker says where the log ends."""
    log = tmp_path / "run.log"
    log.write_text(
        "***** Running Evaluation *****\n  Num examples = 1000\n"
        "ERROR: Unexpected bus error encountered in worker. This might be caused by insufficient shared memory (shm).\n"
    )
    d = diagnose([str(log)])
    assert d.findings[0].id == "fw-exitcode-7-sigbus-shm"
    assert d.phase == "evaluation"


@pytest.mark.parametrize(
    ("text", "top", "code"),
    [
        ("Segmentation fault (core dumped)\n", "class:crash", -11),
        ("[1]    26478 segmentation fault  python train.py\n", "class:crash", -11),
        ("ERROR: Unexpected segmentation fault encountered in worker.\n", "class:crash", -11),
        ("Aborted (core dumped)\n", "class:crash", -6),
    ],
)
def test_the_shells_signal_report_is_a_failure(tmp_path: Path, text: str, top: str, code: int) -> None:
    log = tmp_path / "run.log"
    log.write_text("{'loss': 1.02, 'learning_rate': 1e-05, 'epoch': 0.5}\n" + text)
    d = diagnose([str(log)])
    assert d.first_failure is not None and d.first_failure.exit_code == code
    assert d.findings[0].id == top, [f.id for f in d.findings]
    assert d.phase == "training_step"


def test_a_watchdog_paste_of_only_its_cpp_frames_is_a_collective_timeout(tmp_path: Path) -> None:
    log = tmp_path / "run.log"
    log.write_text(
        "frame #1: c10d::ProcessGroupNCCL::WorkNCCL::checkTimeout(std::optional<std::chrono::duration<long, "
        "std::ratio<1l, 1000l> > >) + 0x1d2 (0x1554e9e0f8f2 in /env/lib/python3.11/site-packages/torch/lib/"
        "libtorch_cuda.so)\n"
        "frame #2: c10d::ProcessGroupNCCL::watchdogHandler() + 0x233 (0x1554e9e16333 in /env/torch/lib/libtorch_cuda.so)\n"
        "Exception raised from ncclCommWatchdog at ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1521 (most "
        "recent call first):\n"
    )
    d = diagnose([str(log)])
    assert d.findings[0].id == "class:collective-timeout", [f.id for f in d.findings]
