"""Round 8 (issue 10): batches 37-38's tune misses, each generalised to its family from the source that prints it.

Sources, by family:

- bash's job report of a non-interactive shell (bash 5.2 jobs.c notify_of_job_status -> pretty_print_job with
  JLIST_NONINTERACTIVE: `SCRIPT: line N: PID <strsignal> [(core dumped)] COMMAND`; the words are strsignal(3)'s, bash
  siglist.c / glibc sysdeps/generic/siglist.h: Segmentation fault, Aborted, Floating point exception, Illegal
  instruction). `Killed` in the same form was round 6's.
- torch's dtype-mismatch refusals, as ATen builds them (strings read in libtorch_cpu.so of torch 2.13.0; older forms
  from the 1.x sources): `expected scalar type X but found Y` (TensorBase data_ptr checks), `Expected object of scalar
  type X but got scalar type Y for argument #2 'mat2'` (torch <= 1.5 TH), `expected mat1 and mat2 to have the same
  dtype, but got: float != c10::BFloat16` (native/cuda/Blas.cpp, 1.x-2.0), `mat1 and mat2 must have the same dtype,
  but got Float and BFloat16` (native/LinearAlgebra.cpp, 2.1+), `Input type (torch.cuda.HalfTensor) and weight type
  (torch.cuda.FloatTensor) should be the same` (native/Convolution.cpp), `Found dtype Float but expected Half`
  (csrc/autograd/engine.cpp validate_outputs), `Expected query, key, and value to have the same dtype`
  (native/transformers/sdp_utils_cpp.h) - quoted inside a sentence they are failures unless the run went on.
- torch 1.x's own NCCL calls (torch/csrc/cuda/nccl.cpp throw_nccl_error: `NCCL Error <ncclResult_t>:
  <ncclGetErrorString>` thrown as std::runtime_error, printed by std::terminate as `what(): NCCL Error 1: unhandled
  cuda error`).
- Ascend CANN device-memory error codes (hiascend.com, CANN 9.0.0 maintenref/troubleshooting "Error Codes"): EL0004
  Memory_Allocation_Failure and EL0019 Resource_Error_Insufficient_Device_Memory (driver), EI0011 (HCCL, `Failed to
  allocate [N] bytes of NPU memory`), EN0012 (DVPP device memory), printed `<code>: <YYYY-MM-DD-hh:mm:ss.mmm.uuu>
  <message>`; the runtime's `reason=[driver error:out of memory]`. EN0010 / EN0011 (DVPP host memory) are not device
  OOMs.
- CPython's unraisable-exception report (Python/errors.c format_unraisable, the default sys.unraisablehook,
  3.8-3.13): `Exception ignored in: <finalize object ...>` then a traceback of an exception the process went on
  after - no failure; the watchdog timeout that follows it is.
"""

from __future__ import annotations

import json

import pytest
from test_source_forms_r6 import _top  # the top finding of `diagnose --format json` on one log

HEALTHY_END = "{'loss': 1.2, 'epoch': 0.5}\n{'train_runtime': 100.0, 'train_loss': 1.1, 'epoch': 1.0}\n"
CRASH = ("class:crash",)

# name -> (log text, accepted finding ids, text the finding's message must hold)
CASES: dict[str, tuple[str, tuple[str, ...], str]] = {
    # ---- bash's job report of a signal (jobs.c, JLIST_NONINTERACTIVE) -------------------------------------------
    "bash-segfault-core-dumped": (
        "bash train_gen.sh\n\ntrain_gen.sh: line 29: 3411753 Segmentation fault      (core dumped) python main.py "
        "--version 2 --max_epochs 100 --accelerator gpu\n",
        CRASH,
        "SIGSEGV",
    ),
    "bash-segfault-no-core": (
        "/bin/bash: line 4: 1201 Segmentation fault      python train.py --bf16\n",
        CRASH,
        "line 4: 1201 Segmentation fault",
    ),
    "bash-aborted-core-dumped": (
        "run.sh: line 12: 88 Aborted                 (core dumped) torchrun --nproc_per_node 2 train.py\n",
        CRASH,
        "SIGABRT",
    ),
    "bash-floating-point": (
        "job.sh: line 7: 4242 Floating point exception(core dumped) python train.py\n",
        CRASH,
        "SIGFPE",
    ),
    "bash-illegal-instruction": (
        "start.sh: line 3: 901 Illegal instruction     (core dumped) python -c 'import torch'\n",
        CRASH,
        "SIGILL",
    ),
    # ---- torch's dtype mismatches quoted in a sentence -----------------------------------------------------------
    "dtype-expected-scalar-type-zh-prose": (
        "grpo-qlora训练时报错RuntimeError: expected scalar type Float but found BFloat16\n请问怎么解决？\n",
        CRASH,
        "expected scalar type Float but found BFloat16",
    ),
    "dtype-expected-scalar-type-half": (
        "with fp16: RuntimeError: expected scalar type Float but found Half\n",
        CRASH,
        "found Half",
    ),
    "dtype-torch1.4-object-of-scalar-type": (
        "I get RuntimeError: Expected object of scalar type Float but got scalar type Half for argument #2 'mat2' "
        "in call to _th_mm\n",
        CRASH,
        "Expected object of scalar type Float",
    ),
    "dtype-mat1-mat2-torch2.0": (
        "it fails with RuntimeError: expected mat1 and mat2 to have the same dtype, but got: float != c10::BFloat16\n",
        CRASH,
        "mat1 and mat2",
    ),
    "dtype-mat1-mat2-torch2.1": (
        "then RuntimeError: mat1 and mat2 must have the same dtype, but got Float and BFloat16\n",
        CRASH,
        "must have the same dtype",
    ),
    "dtype-conv-input-weight": (
        "error: RuntimeError: Input type (torch.cuda.HalfTensor) and weight type (torch.cuda.FloatTensor) should be "
        "the same\n",
        CRASH,
        "should be the same",
    ),
    "dtype-autograd-validate-outputs": (
        "backward says RuntimeError: Found dtype Float but expected Half\n",
        CRASH,
        "Found dtype Float",
    ),
    "dtype-sdpa": (
        "RuntimeError: Expected query, key, and value to have the same dtype, but got query.dtype: float key.dtype: "
        "c10::BFloat16 and value.dtype: c10::BFloat16 instead.\n",
        CRASH,
        "query, key, and value",
    ),
    # ---- torch 1.x's NCCL Error N ---------------------------------------------------------------------------------
    "nccl-error-1-what": (
        "terminate called after throwing an instance of 'std::runtime_error'\n"
        "  what():  NCCL Error 1: unhandled cuda error\n./run.sh: line 5: 77 Aborted (core dumped) python run.py\n",
        ("class:nccl-error",),
        "NCCL Error 1: unhandled cuda error",
    ),
    "nccl-error-2-prose": (
        "I ran into an instance of 'std::runtime_error'\nwhat(): NCCL Error 2: unhandled system error\n",
        ("class:nccl-error",),
        "unhandled system error",
    ),
    # ---- Ascend CANN device memory -----------------------------------------------------------------------------------
    "cann-el0004": (
        "[ERROR] 2024-08-28-16:15:00 (PID:15597, Device:2, RankID:2) ERR00100 PTA call acl api failed\n"
        "EL0004: 2024-08-28-16:15:00.358.141 Failed to allocate memory.\n"
        "        Possible Cause: Available memory is insufficient.\n",
        ("class:gpu-oom",),
        "Failed to allocate memory",
    ),
    "cann-el0019": (
        "EL0019: 2025-01-02-10:00:00.123.456 Failed to allocate 2097152 device memory requested by the DRV(ascend) "
        "module.\n",
        ("class:gpu-oom",),
        "device memory",
    ),
    "cann-ei0011-hccl": (
        "EI0011: 2025-01-02-10:00:00.123.456 Failed to allocate [1073741824] bytes of NPU memory.\n",
        ("class:gpu-oom",),
        "bytes of NPU memory",
    ),
    "cann-driver-reason-only": (
        "        rtMalloc execute failed, reason=[driver error:out of memory][FUNC:FuncErrorReason]"
        "[FILE:error_message_manage.cc][LINE:53]\n",
        ("class:gpu-oom",),
        "driver error:out of memory",
    ),
    # ---- an ignored (unraisable) exception before the real failure -----------------------------------------------
    "unraisable-then-watchdog": (
        "Exception ignored in: <finalize object at 0x7f7d7b9bc920; dead>\nTraceback (most recent call last):\n"
        '  File "/env/lib/python3.12/weakref.py", line 585, in __call__\n    def __call__(self, _=None):\n'
        '  File "/env/lib/python3.12/site-packages/math_verify/utils.py", line 43, in handler\n'
        '    raise TimeoutError("Operation timed out!")\nTimeoutError: Operation timed out!\n'
        "[rank2]:[E516 06:09:16.295666043 ProcessGroupNCCL.cpp:629] [Rank 2] Watchdog caught collective operation "
        "timeout: WorkNCCL(SeqNum=49296, OpType=_ALLGATHER_BASE, NumelIn=192, NumelOut=576, Timeout(ms)=1800000) "
        "ran for 1800076 milliseconds before timing out.\n",
        ("class:collective-timeout",),
        "_ALLGATHER_BASE",
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_family_form_is_named_with_its_class(tmp_path, run_cli, name):
    text, accepted, said = CASES[name]
    top = _top(tmp_path, run_cli, text)
    assert top["id"] in accepted, (name, top["id"], top["title"])
    assert top["severity"] == "error", (name, top["severity"])
    assert said in top["title"] + top["message"], (name, top["title"], top["message"])


NEGATIVES = {
    # a shell's report of a job that ended normally, and prose naming a signal
    "bash-done-line": "[1]+  Done                    python train.py\n" + HEALTHY_END,
    "segfault-in-prose": "If you see a line 3: Segmentation fault, reinstall the driver.\n" + HEALTHY_END,
    # advice quoting a dtype mismatch in a run that went on
    "dtype-quoted-in-advice": "Tip: RuntimeError: expected scalar type Float but found BFloat16 means autocast "
    "is off.\n***** Running training *****\n" + HEALTHY_END,
    # a dtype word without torch's sentence
    "dtype-word-only": "Casting model to dtype BFloat16; expected scalar type is Float for the head.\n"
    + HEALTHY_END,
    # NCCL's info lines and a version print
    "nccl-version-info": "NCCL version 2.18.1+cuda12.1\nNCCL INFO Bootstrap : Using eth0\n" + HEALTHY_END,
    # CANN's host-memory codes and a non-memory code are not device OOMs
    "cann-host-memory-en0010": "EN0010: 2025-01-02-10:00:00.123.456 Failed to allocate 4096 host memory for DVPP.\n"
    + HEALTHY_END,
    # an ignored exception at interpreter exit of a healthy run
    "unraisable-at-exit": HEALTHY_END
    + "Exception ignored in: <function _MultiProcessingDataLoaderIter.__del__ at 0x7f>\n"
    "Traceback (most recent call last):\n"
    '  File "/env/site-packages/torch/utils/data/dataloader.py", line 1479, in __del__\n'
    "    self._shutdown_workers()\nAttributeError: '_MultiProcessingDataLoaderIter' object has no attribute "
    "'_workers'\n",
}


@pytest.mark.parametrize("name", sorted(NEGATIVES))
def test_lines_that_only_name_a_failure_are_no_error(tmp_path, run_cli, name):
    top = _top(tmp_path, run_cli, NEGATIVES[name])
    assert top["severity"] != "error", (name, top["id"], top["title"])


# ---- review finding 8: stragglers are named only when the log holds their output ---------------------------------
WATCHDOG = (
    "[rank{r}]:[E ProcessGroupNCCL.cpp:563] [Rank {r}] Watchdog caught collective operation timeout: "
    "WorkNCCL(SeqNum=211067, OpType=_ALLGATHER_BASE, NumelIn=2359296, NumelOut=18874368, Timeout(ms)=1800000) ran "
    "for 1800095 milliseconds before timing out.\n"
)


def test_one_ranks_paste_names_no_straggler_and_says_which_ranks_it_holds(tmp_path, run_cli):
    top = _top(tmp_path, run_cli, WATCHDOG.format(r=5))
    assert top["data"]["failure_class"]["id"] == "class:collective-timeout"
    assert "stragglers" not in top["message"], top["message"]
    assert "rank(s) 5 only" in top["message"] and "0, 1, 2, 3, 4 are not in it" in top["message"]


def test_interleaved_ranks_that_printed_no_timeout_are_the_likely_stragglers(tmp_path, run_cli):
    # rank 0 printed (its own warning line, prefixed) but no timeout; ranks 1 and 2 timed out
    text = (
        "[rank0]:[W ProcessGroupNCCL.cpp:1000] Warning: TORCH_NCCL_AVOID_RECORD_STREAMS=1 has no effect\n"
        "[rank0]: Traceback (most recent call last):\n" + WATCHDOG.format(r=1) + WATCHDOG.format(r=2)
    )
    top = _top(tmp_path, run_cli, text)
    fc = top["data"]["failure_class"]
    assert fc["id"] == "class:collective-timeout" and fc["silent_ranks"] == [0]
    assert "Ranks 0 printed other lines here but no timeout" in top["message"], top["message"]


def test_a_run_directory_with_a_file_per_rank_holds_every_ranks_output(tmp_path, run_cli):
    run = tmp_path / "run"
    run.mkdir()
    (run / "rank0.log").write_text("{'loss': 1.2, 'epoch': 0.5}\n", encoding="utf-8")
    (run / "rank1.log").write_text(WATCHDOG.format(r=1), encoding="utf-8")
    code, out, err = run_cli("diagnose", str(run), "--format", "json")
    assert code == 1, err
    top = json.loads(out)["findings"][0]
    assert "Ranks 0 printed other lines here but no timeout" in top["message"], top["message"]


# ---- review finding 2: a crash raised in the user's own file is titled after it -----------------------------------
def _tb(*frames: tuple[str, int, str], exc: str) -> str:
    rows = "".join(f'  File "{f}", line {n}, in {fn}\n    x = 1\n' for f, n, fn in frames)
    return "Traceback (most recent call last):\n" + rows + exc + "\n"


SITE = "/env/lib/python3.10/site-packages"


def test_a_crash_in_the_users_collate_is_titled_after_the_users_file(tmp_path, run_cli):
    text = _tb(
        ("/work/sft.py", 90, "<module>"),
        (f"{SITE}/transformers/trainer.py", 1859, "train"),
        (f"{SITE}/torch/utils/data/dataloader.py", 701, "__next__"),
        ("/work/sft.py", 61, "collate"),
        exc="KeyError: 'input_ids'",
    )
    top = _top(tmp_path, run_cli, text)
    fc = top["data"]["failure_class"]
    assert top["title"].startswith("KeyError in the training script (sft.py:61)"), top["title"]
    assert fc["user_frame"] == "/work/sft.py:61 in collate"
    assert fc["library_frame"] == "torch/utils/data/dataloader.py:701 in __next__"  # kept as context
    assert "read your code at /work/sft.py:61" in top["message"]


def test_an_assert_in_the_users_loss_called_by_trainer_is_a_crash_of_the_script(tmp_path, run_cli):
    text = _tb(
        (f"{SITE}/transformers/trainer.py", 3600, "training_step"),
        ("/home/u/proj/my_trainer.py", 40, "compute_loss"),
        exc="AssertionError: labels missing",
    )
    top = _top(tmp_path, run_cli, text)
    assert top["data"]["failure_class"]["id"] == "class:crash"
    assert "my_trainer.py:40" in top["title"]


def test_an_assert_inside_an_installed_package_stays_a_library_assertion(tmp_path, run_cli):
    text = _tb(
        ("/work/train.py", 10, "<module>"),
        (f"{SITE}/deepspeed/runtime/zero/stage3.py", 1200, "step"),
        exc="AssertionError: the number of parameters does not match",
    )
    top = _top(tmp_path, run_cli, text)
    assert top["data"]["failure_class"]["id"] == "class:library-assertion"


def test_stdlib_and_library_checkout_frames_are_not_the_users_code(tmp_path, run_cli):
    for last in ("/usr/lib/python3.10/json/decoder.py", "/src/transformers/src/transformers/trainer.py"):
        text = _tb(
            ("/work/train.py", 10, "<module>"), (last, 355, "raw_decode"), exc="ValueError: bad value x"
        )
        top = _top(tmp_path, run_cli, text)
        assert "user_frame" not in top["data"].get("failure_class", {}), (last, top["data"])


def test_interleaved_ranks_repeating_an_outer_frame_keep_the_library_assertion(tmp_path, run_cli):
    # two ranks' tracebacks interleaved: the last row is the other rank's `main` frame again, not where it raised
    text = _tb(
        ("run_clm.py", 376, "main"),
        (f"{SITE}/deepspeed/runtime/lr_schedules.py", 728, "get_last_lr"),
        ("run_clm.py", 376, "main"),
        exc="AssertionError: need to call step() first",
    )
    top = _top(tmp_path, run_cli, text)
    assert top["data"]["failure_class"]["id"] == "class:library-assertion", top["title"]


# ---- review finding 5: a healthy full fine-tune save with stage3_gather_16bit_weights_on_model_save=false ---------
# (transformers 5.23.0 trainer.py Trainer.save_model, lines 4114-4122: the warning, a dummy state dict that
# remove_dummy_checkpoint deletes, then model_wrapped.save_checkpoint writes the full ZeRO checkpoint)
HEALTHY_SAVE = (
    "{'loss': 1.2, 'grad_norm': 0.5, 'learning_rate': 1e-05, 'epoch': 0.5}\n"
    " 50%|█████     | 100/200 [01:00<01:00,  1.66it/s]\n"
    "[INFO|trainer.py:3719] 2024-10-18 08:00:01,226 >> Saving model checkpoint to output/checkpoint-100\n"
    "[WARNING|trainer.py:3733] 2024-10-18 08:00:01,230 >>  stage3_gather_16bit_weights_on_model_save=false. Saving "
    "the full checkpoint instead, use zero_to_fp32.py to recover weights\n"
    "{'loss': 1.1, 'grad_norm': 0.4, 'learning_rate': 5e-06, 'epoch': 1.0}\n"
    "100%|██████████| 200/200 [02:00<00:00,  1.66it/s]\n"
    "{'train_runtime': 120.0, 'train_samples_per_second': 3.3, 'train_loss': 1.15, 'epoch': 1.0}\n"
)


def test_a_healthy_gather_false_save_is_no_error_and_the_views_agree(tmp_path, run_cli):
    log = tmp_path / "run.log"
    log.write_text(HEALTHY_SAVE, encoding="utf-8")
    code, out, err = run_cli("diagnose", str(log), "--format", "json")
    assert code == 0, err
    doc = json.loads(out)
    assert all(f["severity"] != "error" for f in doc["findings"])
    tl = doc["timeline"]
    assert tl["last_progress"]["step"] == 200 and tl["last_progress"]["total"] == 200, tl
    # one entry per line: a warning a finding quotes is named by that finding in the timeline too
    quoted = {
        (e["file"], e["line"]): f["id"] for f in doc["findings"] for e in f.get("evidence", []) if "line" in e
    }
    assert tl["warnings"], tl
    for w in tl["warnings"]:
        path, line = w["location"].rsplit(":", 1)
        assert quoted.get((path, int(line)), w["entry"]) == w["entry"], (w, quoted)


def test_the_empty_weights_entry_still_names_a_load_of_an_empty_checkpoint(tmp_path, run_cli):
    text = (
        "[WARNING|trainer.py:3733] >>  stage3_gather_16bit_weights_on_model_save=false. Saving the full checkpoint "
        "instead, use zero_to_fp32.py to recover weights\n"
        'ValueError: Trying to set a tensor of shape torch.Size([0]) in "weight" (which has shape '
        "torch.Size([64000, 7168])), this look incorrect.\n"
    )
    assert _top(tmp_path, run_cli, text)["id"] == "z3-save-empty-weights"


# ---- phases from the frame that was making the call ----------------------------------------------------------------
def _phase(tmp_path, run_cli, text: str) -> str:
    log = tmp_path / "run.log"
    log.write_text(text, encoding="utf-8")
    code, out, err = run_cli("diagnose", str(log), "--format", "json")
    assert code in (0, 1), err
    return json.loads(out)["timeline"]["phase"]


TORCH_LOAD_OOM = (
    f'  File "{SITE}/torch/serialization.py", line 387, in load\n    return _load(f, map_location)\n'
    f'  File "{SITE}/torch/serialization.py", line 99, in _cuda_deserialize\n    return storage_type(obj.size())\n'
    "RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 11.17 GiB total capacity; 962.69 MiB "
    "already allocated; 17.19 MiB free; 1.02 GiB reserved in total by PyTorch)\n"
)


@pytest.mark.parametrize(
    "call",
    [
        "optimizer.load_state_dict(torch.load(optimizer_path))",
        "self.lr_scheduler.load_state_dict(torch.load(path))",
        "engine.load_checkpoint(args.resume_dir)",
        "self._load_from_checkpoint(resume_from_checkpoint)",
    ],
)
def test_a_frame_reading_training_state_back_is_a_resume(tmp_path, run_cli, call):
    text = (
        'Traceback (most recent call last):\n  File "/w/lm/main.py", line 136, in load_model\n'
        f"    {call}\n" + TORCH_LOAD_OOM
    )
    assert _phase(tmp_path, run_cli, text) == "resume"


def test_loading_model_weights_is_not_a_resume(tmp_path, run_cli):
    text = (
        'Traceback (most recent call last):\n  File "/w/lm/main.py", line 136, in load_model\n'
        "    model.load_state_dict(torch.load(model_path))\n" + TORCH_LOAD_OOM
    )
    assert _phase(tmp_path, run_cli, text) != "resume"


def test_a_frame_inside_main_process_first_is_the_dataset_preprocessing(tmp_path, run_cli):
    text = (
        "Traceback (most recent call last):\n"
        '  File "/w/src/llmtuner/dsets/preprocess.py", line 216, in preprocess_dataset\n'
        '    with training_args.main_process_first(desc="dataset map pre-processing"):\n'
        '  File "/env/lib/python3.10/contextlib.py", line 142, in __exit__\n    next(self.gen)\n'
        f'  File "{SITE}/transformers/training_args.py", line 2009, in main_process_first\n'
        "    dist.barrier()\n"
        "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:219, "
        "unhandled cuda error, NCCL version 2.14.3\n"
    )
    assert _phase(tmp_path, run_cli, text) == "tokenization"


# ---- a run that stops mid-bar with no failure line, and the paste says it hung --------------------------------------
BAR = "".join(f" 96%|█████████▌| {n}/64146 [4:33:5{n % 10}<19:03, 2.38it/s]\n" for n in range(61430, 61440))


def test_an_unfinished_bar_then_the_words_it_stuck_is_a_hang_warning(tmp_path, run_cli):
    top = _top(
        tmp_path,
        run_cli,
        BAR
        + "\nAnd then it stuck here with gpu util 100% and didn't log out anything, didn't save checkpoints.\n",
    )
    assert top["id"] == "class:collective-timeout" and top["severity"] == "warning", top
    assert "61439/64146 (96 %)" in top["title"]
    assert "does not prove: which collective or rank" in top["message"]


@pytest.mark.parametrize(
    "text",
    [
        BAR,  # no words: a paste or a log read while the run goes on ends the same way
        "it stuck here for a minute, then went on\n" + BAR,  # the words before the last progress
        BAR.replace("/64146", "/61439") + "it got stuck at the end\n",  # the bar finished
        "100%|██████████| 200/200 [02:00<00:00]\nThe training hangs? No, it finished.\n" + HEALTHY_END,
    ],
)
def test_stalled_words_without_an_unfinished_bar_after_them_name_no_hang(tmp_path, run_cli, text):
    top = _top(tmp_path, run_cli, text)
    assert top["id"] != "class:collective-timeout", top


@pytest.mark.parametrize(
    "name", ["cann-el0004", "cann-el0019", "cann-ei0011-hccl", "cann-driver-reason-only"]
)
def test_an_ascend_device_oom_is_titled_for_the_npu(tmp_path, run_cli, name):
    assert _top(tmp_path, run_cli, CASES[name][0])["title"].startswith("NPU out of memory")
