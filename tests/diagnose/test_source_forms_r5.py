"""Round 5 of the failure forms read from the tools' sources (issue 10): Python's import failures quoted inside a
sentence, `pip install deepspeed` stopping in setup.py's CUDA check (no op built), NCCL's unique-id exchange through
the store cut after `got error`, and phases from the run's own lines: litgpt's `iter I step S` progress, ZeRO-3's
prefetch trace check, a save marker printed behind a progress bar (fast-stable-diffusion). Each test writes the
lines as the source prints them (named beside it) and checks what diagnose makes of them."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_source_forms_r3 import _run  # (pytest puts this directory on sys.path)

from zerodoctor.diagnose import diagnose
from zerodoctor.diagnose.patterns import parse_progress
from zerodoctor.kb.loader import load_entries
from zerodoctor.kb.matcher import Tri, match_symptoms

# ---- Python's own import failures, quoted in a sentence -----------------------------------------------------------
# CPython Lib/importlib/_bootstrap.py: _ERR_MSG_PREFIX = 'No module named ' -> ModuleNotFoundError(f"No module named
# {name!r}"); Python/ceval.c import_from: "cannot import name %R from %R (%S)" (ImportError)


@pytest.mark.parametrize(
    ("line", "missing"),
    [
        # transformers#34582: the user's one line of error
        (
            "error info: ModuleNotFoundError: No module named 'transformers.deepspeed' ",
            "transformers.deepspeed",
        ),
        # LlamaFactory#4271: the exception in inline code inside the user's prose
        (
            "The `ImportError: cannot import name 'log'` error originates from the deepspeed library, specifically "
            "in the `elastic_agent.py file`.",
            "log",
        ),
        # the full form of import_from's message, behind a logger's prefix
        (
            "2024-06-01 10:00:00 | ERROR | ImportError: cannot import name 'log' from "
            "'torch.distributed.elastic.agent.server.api' (/usr/lib/python3/torch/distributed/elastic/agent/server/"
            "api.py)",
            "log",
        ),
    ],
    ids=["prose-prefix", "inline-code", "logger-prefix"],
)
def test_an_import_failure_quoted_in_a_sentence_is_an_import_error(
    tmp_path: Path, line: str, missing: str
) -> None:
    top, fc, phase = _run(tmp_path, "### Reproduction\n\n" + line + "\n")
    assert fc["id"] == "class:import-error", top
    assert fc["missing"] == missing
    assert phase == "unknown"


@pytest.mark.parametrize(
    "line",
    [
        # words, not Python's messages: no failure named
        "We saw an ImportError last week, it is fixed now.",
        "ModuleNotFoundError handling: see the FAQ for No module named errors",
        # a dotted name that merely ends in ImportError is not Python's exception
        "note: mylib.FakeImportError: cannot import name",
    ],
)
def test_prose_about_import_errors_is_no_failure(tmp_path: Path, line: str) -> None:
    top, fc, _ = _run(tmp_path, line + "\n")
    assert fc["id"] != "class:import-error", top


def test_an_import_failure_logged_by_a_run_that_went_on_is_no_failure(tmp_path: Path) -> None:
    # a library logging a failed optional import and carrying on (the run trains after it)
    text = (
        "[WARNING] xformers not available: ModuleNotFoundError: No module named 'xformers'\n"
        "***** Running training *****\n"
        "{'loss': 1.2345, 'grad_norm': 0.5, 'learning_rate': 1e-05, 'epoch': 0.1}\n"
    )
    top, fc, _ = _run(tmp_path, text)
    assert fc["id"] != "class:import-error", top
    assert top == "no-known-failure"


# ---- pip installing deepspeed from its sdist without CUDA_HOME ------------------------------------------------------
# DeepSpeed setup.py (v0.12.4 line 100, the cupy extra for the 1-bit optimizers): cuda_major_ver, cuda_minor_ver =
# installed_cuda_version(); op_builder/builder.py installed_cuda_version: raise MissingCUDAException("CUDA_HOME does not
# exist, unable to compile CUDA op(s)") (an assert before 0.9). pip wraps the child's output
# (pip/_internal/operations/build/metadata_legacy.py, exceptions.py MetadataGenerationFailed).
def _pip_log(exc_line: str, raise_line: str) -> str:
    return (
        "Collecting deepspeed==0.12.4 (from resemble-enhance)\n"
        "  Using cached deepspeed-0.12.4.tar.gz (1.2 MB)\n"
        "  Preparing metadata (setup.py) ... error\n"
        "  error: subprocess-exited-with-error\n\n"
        "  × python setup.py egg_info did not run successfully.\n"
        "  │ exit code: 1\n"
        "  ╰─> [8 lines of output]\n"
        "      Traceback (most recent call last):\n"
        '        File "<string>", line 2, in <module>\n'
        '        File "<pip-setuptools-caller>", line 34, in <module>\n'
        '        File "/tmp/pip-install-h8_p2s8f/deepspeed_914d9f3c80434ef18a62bcb9b7387387/setup.py", line 100, in '
        "<module>\n"
        "          cuda_major_ver, cuda_minor_ver = installed_cuda_version()\n"
        '        File "/tmp/pip-install-h8_p2s8f/deepspeed_914d9f3c80434ef18a62bcb9b7387387/op_builder/builder.py", '
        "line 50, in installed_cuda_version\n"
        f"          {raise_line}\n"
        f"      {exc_line}\n"
        "      [end of output]\n\n"
        "  note: This error originates from a subprocess, and is likely not a problem with pip.\n"
        "error: metadata-generation-failed\n"
    )


@pytest.mark.parametrize(
    ("exc_line", "raise_line"),
    [
        (
            "op_builder.builder.MissingCUDAException: CUDA_HOME does not exist, unable to compile CUDA op(s)",
            'raise MissingCUDAException("CUDA_HOME does not exist, unable to compile CUDA op(s)")',
        ),
        (
            "AssertionError: CUDA_HOME does not exist, unable to compile CUDA op(s)",
            'assert cuda_home is not None, "CUDA_HOME does not exist, unable to compile CUDA op(s)"',
        ),
    ],
    ids=["MissingCUDAException", "assert-before-0.9"],
)
def test_pip_install_stopping_in_setup_py_is_an_install_not_the_cpu_adam_build(
    tmp_path: Path, exc_line: str, raise_line: str
) -> None:
    top, fc, phase = _run(tmp_path, _pip_log(exc_line, raise_line))
    assert top == "class:op-build-failure", top
    assert fc["install"] == "deepspeed"
    assert phase == "unknown"  # an install: no phase of a run
    finding = diagnose([str(tmp_path / "run.log")]).findings[0]
    assert finding.title.startswith("Installing deepspeed stopped in its setup.py")
    assert "CUDA_HOME" in finding.fixes[0].text and "DS_BUILD_" not in finding.fixes[0].text


def test_the_cpu_adam_entry_is_not_claimed_by_pips_metadata_step() -> None:
    (entry,) = [e for e in load_entries() if e.id == "cpu-adam-build-failure"]
    text = _pip_log(
        "op_builder.builder.MissingCUDAException: CUDA_HOME does not exist, unable to compile CUDA op(s)",
        'raise MissingCUDAException("CUDA_HOME does not exist, unable to compile CUDA op(s)")',
    )
    assert match_symptoms(entry, text.splitlines())[0] is Tri.FALSE
    # the same check failing inside a run's JIT build of cpu_adam still is the entry
    run = (
        '  File "/usr/lib/python3/site-packages/deepspeed/ops/adam/cpu_adam.py", line 94, in __init__\n'
        "    self.ds_opt_adam = CPUAdamBuilder().load()\n"
        "deepspeed.ops.op_builder.builder.MissingCUDAException: CUDA_HOME does not exist, unable to compile CUDA op(s)\n"
    )
    assert match_symptoms(entry, run.splitlines())[0] is Tri.TRUE


# ---- NCCL's unique-id exchange through the store ------------------------------------------------------------------
# torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp broadcastUniqueNCCLID: "[R] is setting up NCCL communicator and
# retrieving ncclUniqueId from [0] via c10d key-value store by key 'K', but store->get('K') got error: " + e.what()
# (older torch spelled it "retreiving")
NCCL865 = (
    "Running tokenizer on dataset:  47%|███████████████▊                  | 3169000/6811963 [30:11<38:27, 1578.58 "
    "examples/s]Traceback (most recent call last):\n"
    '  File "/home/u/src/train_sft.py", line 25, in main\n'
    '    dataset = preprocess_data(dataset, tokenizer, data_args, training_args, stage="sft")\n'
    '  File "/home/u/env/lib/python3.9/site-packages/transformers/training_args.py", line 1891, in '
    "main_process_first\n"
    "    torch.distributed.barrier()\n"
    '  File "/home/u/env/lib/python3.9/site-packages/torch/distributed/distributed_c10d.py", line 3328, in barrier\n'
    "    work = default_pg.barrier(opts=opts)\n"
    "RuntimeError: [1] is setting up NCCL communicator and retrieving ncclUniqueId from [0] via c10d key-value store "
    "by key '0', but store->get('0') got error{tail}\n"
)


@pytest.mark.parametrize("tail", ["", ": Socket Timeout", " "])
def test_the_unique_id_store_read_failing_is_a_set_up_timeout(tmp_path: Path, tail: str) -> None:
    top, fc, phase = _run(tmp_path, NCCL865.format(tail=tail))
    assert fc["id"] == "class:collective-timeout", top
    assert fc["setup"] is True
    assert phase == "tokenization"  # rank 1 waited in main_process_first while rank 0 tokenized


def test_the_unique_id_store_read_failing_for_a_dead_peer_is_no_timeout(tmp_path: Path) -> None:
    top, fc, _ = _run(tmp_path, NCCL865.format(tail=": Connection reset by peer"))
    assert fc["id"] != "class:collective-timeout", top


# ---- phases from the run's own lines --------------------------------------------------------------------------------
# litgpt finetune/adapter.py, lora.py, full.py, pretrain.py: fabric.print(f"iter {iter_num} step {step_count}: loss
# {loss.item():.4f}, iter time: {(t1 - iter_t0) * 1000:.2f}ms{' (optimizer.step)' if not is_accumulating else ''}")
# (older: `train time:`); step_count counts optimizer steps
OOM = (
    "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 8.06 GiB. GPU 0 has a total capacty of 23.70 "
    "GiB of which 1.27 GiB is free. Including non-PyTorch memory, this process has 22.43 GiB memory in use. Of the "
    "allocated memory 12.62 GiB is allocated by PyTorch, and 8.65 GiB is reserved by PyTorch but unallocated."
)


@pytest.mark.parametrize(
    ("progress", "phase"),
    [
        ("iter 3436 step 53: loss 2.9911, iter time: 400.10ms", "training_step"),
        ("iter 16 step 4: loss 2.1043, train time: 512.33ms (optimizer.step)", "training_step"),
        ("iter 4 step 0: loss 2.6297, iter time: 827.80ms", "first_optimizer_step"),
        (
            "Epoch 1 | iter 120 step 30 | loss train: 1.873, val: n/a | iter time: 301.22 ms (step)",
            "training_step",
        ),
    ],
)
def test_litgpt_progress_places_a_failure(tmp_path: Path, progress: str, phase: str) -> None:
    top, fc, got = _run(tmp_path, f"{progress}\nTraceback (most recent call last):\n{OOM}\n")
    assert fc["id"] == "class:gpu-oom", top
    assert got == phase


def test_litgpt_progress_is_parsed() -> None:
    assert parse_progress("iter 3436 step 53: loss 2.9911, iter time: 400.10ms") == ("litgpt", 53, None, None)
    assert parse_progress("the iter time: was long") is None


# deepspeed/runtime/zero/partitioned_param_coordinator.py fetch_sub_module (0.19.8 line 437): raised only when the
# trace is complete (after a first forward/backward was recorded), inside a sub-module's forward or backward hook
TRACE = (
    "RuntimeError: tracing error at step 603: \n"
    "module id: 1, training: True\n"
    "expected the next 1 parameters in the parameter fetch queue to be ({'id': 'name=transformer.visual.conv1.weight "
    "id=194', 'status': 'AVAILABLE', 'numel': 752640, 'ds_numel': 752640}) \n"
    "but got \n ({'id': 'name=transformer.h.2.attn.c_attn.bias id=19', 'status': 'AVAILABLE', 'numel': 6144}).\n"
)


def test_zero3s_trace_check_is_a_forward_or_backward_pass(tmp_path: Path) -> None:
    _top, _fc, phase = _run(tmp_path, "### Current Behavior\n\n" + TRACE)
    assert phase == "training_step"
    # the same check inside an evaluation loop (its own bar open) is evaluation
    _top, _fc, phase = _run(tmp_path, "***** Running Evaluation *****\n  Num examples = 40\n" + TRACE)
    assert phase == "evaluation"


# TheLastBen fast-stable-diffusion train_dreambooth.py: print(" SAVING CHECKPOINT...") behind the tqdm bar, then
# save_pretrained and the convertosdv2.py subprocess, then print("Done, resuming training ...")
BAR = (
    "Progress:|██████                   | 25% 1999/8000 [1:02:25<3:07:25,  1.87s/it, loss=0.296, lr=7.75e-7]"
)


def test_a_save_marker_printed_behind_the_bar_places_a_kill_in_the_save(tmp_path: Path) -> None:
    top, fc, phase = _run(tmp_path, f"{BAR} SAVING CHECKPOINT...\nConverting to CKPT ...\nKilled\n")
    assert fc["id"] == "class:host-oom-kill", top
    assert phase == "checkpoint_save"


def test_a_kill_after_the_save_is_done_is_in_training(tmp_path: Path) -> None:
    text = f"{BAR} SAVING CHECKPOINT...\nDone, resuming training ...\nKilled\n"
    _top, _fc, phase = _run(tmp_path, text)
    assert phase == "training_step"


def test_a_bar_after_the_save_marker_is_training_again(tmp_path: Path) -> None:
    later = BAR.replace("1999/8000", "2000/8000")
    _top, _fc, phase = _run(tmp_path, f"{BAR} SAVING CHECKPOINT...\n{later}\nKilled\n")
    assert phase == "training_step"


# ---- a hang's stack dump placed by the main thread -------------------------------------------------------------------
# py-spy dump (src/dump.rs print_trace): `Thread 46 (idle): "MainThread"`, then `func (file.py:line)` innermost first
PYSPY = (
    'Thread 46 (idle): "MainThread"\n'
    "    backward (torch/autograd/__init__.py:266)\n"
    "    backward (deepspeed/runtime/zero/stage3.py:2213)\n"
    "    backward (deepspeed/runtime/engine.py:1976)\n"
    "    backward (accelerate/accelerator.py:2126)\n"
    "    training_loop (scripts/fine_tune_accelerate.py:410)\n"
    "    <module> (scripts/fine_tune_accelerate.py:587)\n"
    'Thread 931 (idle): "Thread-1"\n'
    "    wait (threading.py:324)\n"
    "    run (tqdm/_monitor.py:60)\n"
    "Thread 4068 (active)\n"
    "    all_gather_into_tensor (torch/distributed/distributed_c10d.py:2709)\n"
    "    wrapper (torch/distributed/c10d_logger.py:72)\n"
    "    all_gather_into_tensor (deepspeed/comm/torch.py:219)\n"
)


def test_a_py_spy_hang_is_placed_by_the_main_threads_stack(tmp_path: Path) -> None:
    top, fc, phase = _run(tmp_path, PYSPY)
    assert fc["id"] == "class:collective-timeout", top
    assert phase == "training_step"  # the main thread waits in backward (accelerate's, DeepSpeed's)


def test_a_py_spy_hang_without_the_main_thread_stays_unplaced(tmp_path: Path) -> None:
    only = PYSPY[PYSPY.index("Thread 4068") :]
    _top, _fc, phase = _run(tmp_path, only)
    assert phase == "unknown"


# ---- a bare assertion beside another rank's cut traceback ------------------------------------------------------------
# Sa2VA#138 (XTuner / mmengine DeepSpeed strategy): rank 1's frames are cut from the paste, rank 0's traceback is cut
# before its exception line; ranks fail together, each printing part
SA2VA = (
    "[rank1]:            ^^^^^^^^^^^^^^^^^^^^^^^\n"
    "[rank1]: AssertionError\n"
    "04/10 17:22:29 - mmengine - INFO - Resume checkpoint from work_dirs/sa2va/iter_94000.pth\n"
    "[rank0]: Traceback (most recent call last):\n"
    '[rank0]:   File "/w/tools/train.py", line 65, in <module>\n'
    "[rank0]:     train.main()\n"
    '[rank0]:   File "/w/.venv/lib/python3.11/site-packages/mmengine/runner/_flexible_runner.py", line 1456, in '
    "resume\n"
    "[rank0]:     checkpoint = self.strategy.resume(\n"
    '[rank0]:   File "/w/.venv/lib/python3.11/site-packages/xtuner/engine/_strategy/deepspeed.py", line 60, in '
    "resume\n"
    "[rank0]:     checkpoint = super().resume(*args, **kwargs)\n"
)


def test_a_bare_assertion_beside_another_ranks_cut_library_traceback_is_a_library_assertion(
    tmp_path: Path,
) -> None:
    top, fc, phase = _run(tmp_path, SA2VA)
    assert fc["id"] == "class:library-assertion", top
    assert fc["library_frame"] == "xtuner/engine/_strategy/deepspeed.py:60 in resume"
    assert fc["rank"] == 1
    assert phase == "resume"


def test_a_bare_assertion_with_no_traceback_beside_it_stays_a_crash(tmp_path: Path) -> None:
    text = (
        SA2VA.split("[rank0]: Traceback")[0]
        + "\n" * 6
        + "[rank0]: Traceback"
        + SA2VA.split("[rank0]: Traceback")[1]
    )
    top, fc, _ = _run(tmp_path, text)
    assert fc["id"] == "class:crash", top


# ---- save and resume lines of litgpt, transformers and accelerate ---------------------------------------------------
@pytest.mark.parametrize(
    ("before", "phase"),
    [
        # litgpt pretrain.py / finetune: fabric.print(f"Saving checkpoint to {str(checkpoint_file)!r}")
        ("Saving checkpoint to 'out/pretrain/step-00001000/lit_model.pth'", "checkpoint_save"),
        ("Saving LoRA weights to 'out/lora/iter-002000-ckpt.pth'", "checkpoint_save"),
        # transformers modeling_utils.py save_pretrained, writing a sharded checkpoint
        (
            "[INFO|modeling_utils.py:2698] 2024-08-13 07:27:01,945 >> The model is bigger than the maximum size per "
            "checkpoint (5GB) and is going to be split in 4 checkpoint shards. You can find where each parameters has "
            "been saved in the index located at /content/out/model.safetensors.index.json.",
            "checkpoint_save",
        ),
        # accelerate checkpointing.py load_accelerator_state
        ("INFO     All model weights loaded successfully", "resume"),
        ("INFO     All optimizer states loaded successfully", "resume"),
        # litgpt: fabric.print(f"Resuming training from {resume}")
        ("Resuming training from out/pretrain/step-00001000/lit_model.pth", "resume"),
    ],
)
def test_save_and_resume_lines_place_a_kill(tmp_path: Path, before: str, phase: str) -> None:
    progress = "iter 3436 step 53: loss 2.9911, iter time: 400.10ms"
    _top, fc, got = _run(tmp_path, f"{progress}\n{before}\nKilled\n")
    assert fc["id"] == "class:host-oom-kill"
    assert got == phase
    # training progress printed after the line closes that phase
    _top, _fc, got = _run(tmp_path, f"{before}\n{progress}\nKilled\n")
    assert got == "training_step"


# ---- a traceback header glued behind a progress bar takes that bar ----------------------------------------------------
# tqdm (tqdm/std.py status_printer) writes the bar with `\r` and no newline; a rank's traceback printed next starts on
# the bar's line (ms-swift#4023: `Train:   0%| | 1/594 [00:21<3:28:13, 21.07s/it][rank4]: Traceback ...`)
@pytest.mark.parametrize(("done", "phase"), [(1, "training_step"), (0, "first_optimizer_step")])
def test_a_cut_traceback_glued_behind_a_bar_takes_that_bars_progress(
    tmp_path: Path, done: int, phase: str
) -> None:
    text = (
        f"Train:   0%|          | {done}/594 [00:21<3:28:13, 21.07s/it][rank4]: Traceback (most recent call last):\n"
        '[rank4]:   File "/home/user/ms-swift/swift/cli/rlhf.py", line 5, in <module>\n'
        "[rank4]:     rlhf_main()\n"
    )
    top, fc, got = _run(tmp_path, text)
    assert fc["id"] == "class:crash", top
    assert got == phase
