"""Round 3 of the failure forms read from the tools' sources (issue 10): how a line really reaches a log - tqdm's
carriage returns and bars with a message glued on, two ranks writing into one stream, rich's boxed tracebacks, a
paste cut right after a traceback's first frame, a stack dump of a hung process (CPython's faulthandler, py-spy),
the linker failing a JIT op build, PEFT refusing a LoRA config, DeepSpeed's comm assertion pasted alone. Each test
writes the lines as the source prints them (named beside it) and checks what diagnose makes of them."""

from __future__ import annotations

from pathlib import Path

import pytest

from zerodoctor.diagnose import diagnose

BAR = "  0%|          | 48/111262 [00:09<6:11:25,  4.99it/s]"
OOM_NEW = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.15 GiB "
    "of which 1.20 GiB is free. Including non-PyTorch memory, this process has 77.9 GiB memory in use."
)
OOM_OLD = (
    "RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU {gpu}; 39.59 GiB total capacity; 37.10 GiB "
    "already allocated; 5.19 MiB free; 38.00 GiB reserved in total by PyTorch)"
)
EVAL_TB = (
    "Traceback (most recent call last):\n"
    '  File "/env/lib/python3.10/site-packages/transformers/trainer.py", line 4327, in evaluation_loop\n'
    "    logits = self.accelerator.pad_across_processes(logits, dim=1, pad_index=-100)\n"
)


def _run(tmp_path: Path, text: str) -> tuple[str, dict[str, object], str]:
    log = tmp_path / "run.log"
    log.write_text(text, encoding="utf-8")
    d = diagnose([str(log)])
    top = d.findings[0]
    fc = top.data.get("failure_class") or {"id": top.id, **top.data}
    return top.id, fc, d.phase


# ---- a device OOM however the terminal delivered it ------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        # tqdm writes its bar with `\r` and no newline (tqdm/std.py status_printer): the traceback's lines land on it
        EVAL_TB + BAR + OOM_NEW + "\n",
        # a few bar updates separated by carriage returns, then the error
        EVAL_TB + BAR + "\r" + BAR + "\r" + OOM_NEW + "\n",
        # the bar ends the line and the traceback header is glued to it
        "Running loglikelihood requests\n" + BAR + EVAL_TB + OOM_NEW + "\n",
        # torchrun --tee's `[rankN]: ` prefix behind a bar (ms-swift's `Train:` bar)
        "[rank4]: Train:   0%|  | 1/594 [00:21<3:28:13, 21.07s/it]" + OOM_NEW + "\n",
        # the message cut by the terminal's width and wrapped under the bar
        BAR + "\n" + OOM_NEW[:60] + "\n" + OOM_NEW[60:] + "\n",
    ],
    ids=[
        "glued-to-bar",
        "after-carriage-returns",
        "header-glued-to-bar",
        "rank-prefix-behind-bar",
        "wrapped",
    ],
)
def test_an_oom_glued_to_a_progress_bar_is_a_gpu_oom(tmp_path: Path, text: str) -> None:
    top, fc, _ = _run(tmp_path, text)
    assert fc["id"] == "class:gpu-oom", top


def test_two_ranks_interleaving_their_tracebacks_name_the_oom(tmp_path: Path) -> None:
    # two processes writing one stream: rank 1's bar inside rank 0's traceback, each rank's exception line after
    text = (
        "Running loglikelihood requests\n" + BAR + "Traceback (most recent call last):\n"
        '  File "/x/gpt-neox/evaluate.py", line 75, in <module>\n'
        + BAR.replace("48", "95")
        + "\n    main()\n"
        "Traceback (most recent call last):\n"
        '  File "/x/gpt-neox/evaluate.py", line 75, in <module>\n'
        "    main()\n" + OOM_OLD.format(gpu=0) + "\n" + BAR + OOM_OLD.format(gpu=1) + "\n"
    )
    top, fc, _ = _run(tmp_path, text)
    assert fc["id"] == "class:gpu-oom", top


@pytest.mark.parametrize("exc", ["OutOfMemoryError", "RuntimeError"])
def test_rich_boxed_traceback_then_the_oom_is_a_gpu_oom(tmp_path: Path, exc: str) -> None:
    # rich/traceback.py (accelerate and diffusers scripts install it): frames `│ PATH:LINE in FUNC │` inside a box,
    # then the exception line below the box as `TYPE: message` without its module
    text = (
        "╭───── Traceback (most recent call last) ─────╮\n"
        "│ /x/train_dreambooth.py:828 in <module>   │\n"
        "│                                            │\n"
        "│ /x/accelerate/accelerator.py:872 in prepare │\n"
        "╰────────────────────────────────────────────╯\n"
        f"{exc}: CUDA out of memory. Tried to allocate 3.20 GiB (GPU 0; 23.70 GiB total capacity; 19.10 GiB already "
        "allocated; 2.10 GiB free; 19.40 GiB reserved in total by PyTorch)\n"
    )
    top, fc, _ = _run(tmp_path, text)
    assert fc["id"] == "class:gpu-oom", top


# ---- a paste cut right after a traceback's first frame ---------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        # Python's own header, the paste ends after the first frame (its source line cut too)
        'Traceback (most recent call last):\n  File "/home/user/ms-swift/swift/cli/rlhf.py", line 5, in <module>\n'
        '    rlhf_main()\n  File "/home/user/',
        # rich's box, cut after its first frame (diffusers' train_dreambooth.py installs rich tracebacks)
        "╭──────── Traceback (most recent call last) ────────╮\n"
        "│ /home/user/diffusers/examples/dreambooth/train_dreambooth.py:828 in <module>  │\n"
        "│                                                    │\n"
        "│   825 │                                            │\n",
        # torchrun's `[rank4]: ` header glued behind a tqdm bar (two writers, one line), then the prefixed frame
        "Train:   0%|    | 1/594 [00:21<3:28:13, 21.07s/it][rank4]: Traceback (most recent call last):\n"
        '[rank4]:   File "/home/user/ms-swift/swift/cli/rlhf.py", line 5, in <module>\n'
        '[rank4]:     rlhf_main()\n[rank4]:   File "/home/user/',
    ],
    ids=["python", "rich", "rank-prefixed-glued"],
)
def test_a_traceback_cut_after_its_first_frame_is_a_crash(tmp_path: Path, text: str) -> None:
    top, fc, _ = _run(tmp_path, text)
    assert fc["id"] == "class:crash", top


def test_a_lone_frame_line_without_a_header_is_no_failure(tmp_path: Path) -> None:
    # a frame quoted in prose or a warning (no `Traceback` header above it) proves nothing failed
    top, _fc, _ = _run(tmp_path, 'see  File "/x/train.py", line 12, in main\nstep 10 loss 1.2\n')
    assert top == "no-known-failure"


def test_a_cut_save_traceback_is_a_crash_not_the_optimizer_shard_entry(tmp_path: Path) -> None:
    # ChatGLM-6B#1166: the paste ends inside DeepSpeed's _save_zero_checkpoint (the error was a file write that
    # failed): frames say where, not what, so no entry that matches only frames is claimed
    text = (
        "Traceback (most recent call last):\n"
        '  File "/x/ChatGLM-6B/ptuning/trainer.py", line 2303, in _save_checkpoint\n'
        "    self.deepspeed.save_checkpoint(output_dir)\n"
        '  File "/env/site-packages/deepspeed/runtime/engine.py", line 2894, in save_checkpoint\n'
        "    self._save_zero_checkpoint(save_dir, tag)\n"
        '  File "/env/site-packages/deepspeed/runtime/engine.py", line 3223, in _save_zero_checkpoint\n'
        "    self.checkpoint_engine.save(zero_sd, zero_checkpoint_name)\n"
        '  File "/env/site-packages/deepspeed/runtime/checkpoint_engine/torch_checkpoint_engine.py", line 22, in s'
    )
    top, fc, phase = _run(tmp_path, text)
    assert top == "class:crash", top
    assert phase == "checkpoint_save"


# ---- PEFT refusing a LoRA config -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("frame", "line"),
    [
        # PEFT <= 0.4: each tuner's _find_and_replace (peft/tuners/lora.py at v0.4.0)
        (
            '  File "/app/env/lib/python3.10/site-packages/peft/tuners/lora.py", line 200, in _find_and_replace\n',
            "ValueError: Target modules ['q_proj', 'v_proj'] not found in the base model. Please check the target "
            "modules and try again.",
        ),
        # PEFT >= 0.5: BaseTuner.inject_adapter (peft/tuners/tuners_utils.py), NoMatchingPeftModuleError from 0.14
        (
            '  File "/env/site-packages/peft/tuners/tuners_utils.py", line 1073, in inject_adapter\n',
            "peft.tuners.tuners_utils.NoMatchingPeftModuleError: Target modules {'qkv'} not found in the base model. "
            "Please check the target modules and try again.",
        ),
        # the same message pasted without its frames
        (
            "",
            "ValueError: Target modules {'c_attn'} not found in the base model. Please check the target modules and try again.",
        ),
        ("", "ValueError: Please specify `target_modules` in `peft_config`"),
        # LoraModel._create_new_module (PEFT >= 0.5): a target whose type LoRA cannot wrap
        (
            "",
            "ValueError: Target module Qwen2VLVisionBlock() is not supported. Currently, only the following modules "
            "are supported: `torch.nn.Linear`, `torch.nn.Embedding`, `torch.nn.Conv2d`, `transformers.pytorch_utils.Conv1D`.",
        ),
    ],
    ids=[
        "peft-0.4-find-and-replace",
        "peft-inject-adapter",
        "frameless",
        "frameless-specify",
        "frameless-type",
    ],
)
def test_peft_refusing_the_target_modules_is_config_rejected(tmp_path: Path, frame: str, line: str) -> None:
    head = (
        "Traceback (most recent call last):\n"
        '  File "/app/src/autotrain/trainers/clm/main.py", line 226, in train\n'
        "    model = get_peft_model(model, peft_config)\n" + frame + "    raise ValueError(\n"
        if frame
        else ""
    )
    top, fc, _ = _run(tmp_path, head + line + "\n")
    assert fc["id"] == "class:config-rejected", top
    if frame:
        assert str(fc["judged_by"]).startswith("peft/tuners/")


# ---- DeepSpeed's comm assertion pasted alone -------------------------------------------------------------------


@pytest.mark.parametrize(
    "line",
    [
        "DeepSpeed backend not set, please initialize it using init_process_group()",
        "AssertionError: DeepSpeed backend not set, please initialize it using init_process_group()",
        "[rank0]: DeepSpeed backend not set, please initialize it using init_process_group()",
    ],
)
def test_deepspeed_comm_backend_assertion_is_a_library_assertion(tmp_path: Path, line: str) -> None:
    # deepspeed/comm/comm.py: `assert cdb is not None and cdb.is_initialized(), 'DeepSpeed backend not set, ...'`
    top, fc, _ = _run(tmp_path, line + "\n")
    assert fc["id"] == "class:library-assertion", top
    assert fc.get("library") in ("deepspeed", None)


# ---- the linker failing a JIT op build -------------------------------------------------------------------------

JIT = (
    "Using /home/user/.cache/torch_extensions/py310_cu118 as PyTorch extensions root...\n"
    "Building extension module cpu_adam...\n"
    "[1/3] c++ -MMD -MF cpu_adam.o.d -DTORCH_EXTENSION_NAME=cpu_adam -c cpu_adam.cpp -o cpu_adam.o\n"
    "[3/3] c++ cpu_adam.o cpu_adam_impl.o -shared -lcurand -L/usr/local/cuda/lib64 -o cpu_adam.so\n"
)


@pytest.mark.parametrize(
    "ld",
    [
        "/usr/bin/ld: cannot find -lcurand\ncollect2: error: ld returned 1 exit status\n",  # GNU ld < 2.40
        "/usr/bin/ld: cannot find -lcurand: No such file or directory\n",  # GNU ld >= 2.40
        "ld.lld: error: unable to find library -lcurand\n",  # LLVM lld
        "collect2: error: ld returned 1 exit status\n",  # gcc's driver only
    ],
    ids=["gnu-ld", "gnu-ld-2.40", "lld", "collect2"],
)
def test_the_linker_failing_a_jit_build_is_an_op_build_failure(tmp_path: Path, ld: str) -> None:
    top, fc, phase = _run(tmp_path, JIT + ld)
    assert fc["id"] == "class:op-build-failure", top
    assert fc["op"] == "cpu_adam"
    assert phase == "engine_init"


def test_the_linker_line_says_why_under_ninjas_failed_step(tmp_path: Path) -> None:
    top, fc, _ = _run(
        tmp_path,
        JIT
        + "FAILED: cpu_adam.so\n/usr/bin/ld: cannot find -lcurand\ncollect2: error: ld returned 1 exit status\n",
    )
    assert fc["id"] == "class:op-build-failure", top
    assert "cannot find -lcurand" in str(fc["message"])


@pytest.mark.parametrize(
    "text",
    [
        # no JIT build in the log: a test compile (DeepSpeed's op compatibility checks against -laio) is no failure
        "/usr/bin/ld: cannot find -laio\ncollect2: error: ld returned 1 exit status\n"
        " [WARNING]  async_io requires the dev libaio .so object and headers but these were not found.\n",
        # the run trained after it
        JIT + "/usr/bin/ld: cannot find -laio\n***** Running training *****\n"
        "{'loss': 1.2, 'learning_rate': 1e-05, 'epoch': 0.1}\n 10%|█         | 10/100 [00:10<01:30,  1.00s/it]\n",
    ],
    ids=["no-jit-build", "trained-after"],
)
def test_a_linker_line_the_run_outlived_is_no_failure(tmp_path: Path, text: str) -> None:
    top, _fc, _ = _run(tmp_path, text)
    assert top == "no-known-failure", top


# ---- a stack dump of a hung run --------------------------------------------------------------------------------

FH_FRAMES = (
    '  File "/env/site-packages/torch/distributed/distributed_c10d.py", line 2050 in all_reduce\n'
    '  File "/env/site-packages/deepspeed/comm/torch.py", line 117 in all_reduce\n'
    '  File "/env/site-packages/deepspeed/runtime/engine.py", line 1456 in _checkpoint_tag_validation\n'
    '  File "/env/site-packages/deepspeed/runtime/engine.py", line 1489 in save_checkpoint\n'
    '  File "/env/site-packages/transformers/trainer.py", line 1212 in _save_checkpoint\n'
    '  File "/env/site-packages/transformers/trainer.py", line 1094 in train\n'
)


@pytest.mark.parametrize(
    "head",
    [
        "Thread 0x00007f3b2a5fe700 (most recent call first):\n",  # faulthandler.dump_traceback(all_threads=True)
        "Current thread 0x00007f3b2a5fe700 (most recent call first):\n",
        "Stack (most recent call first):\n",  # all_threads=False
        "Timeout (0:30:00)!\nThread 0x00007f3b2a5fe700 (most recent call first):\n",  # dump_traceback_later
        "",  # the paste starts at the frames
    ],
    ids=["thread", "current-thread", "stack", "dump-later", "headless"],
)
def test_a_faulthandler_dump_of_a_run_that_did_not_fail_is_a_hang(tmp_path: Path, head: str) -> None:
    # CPython Python/traceback.c dump_frame: `  File "%s", line %d in %s` (no comma before `in`), innermost first
    top, fc, phase = _run(tmp_path, "Saving model checkpoint to out/checkpoint-500\n" + head + FH_FRAMES)
    assert fc["id"] == "class:collective-timeout", top
    assert fc["collective"] == "all_reduce"
    assert phase == "checkpoint_save"


def test_a_dump_the_run_outlived_is_no_hang(tmp_path: Path) -> None:
    # faulthandler.dump_traceback_later(repeat=True) dumps on a timer; the run saved and finished after it
    text = "Thread 0x00007f3b2a5fe700 (most recent call first):\n" + FH_FRAMES
    text += "Saving model checkpoint to out/checkpoint-500\n{'train_runtime': 812.3, 'train_loss': 1.2}\n"
    top, _fc, _ = _run(tmp_path, text)
    assert top == "no-known-failure", top


def test_a_py_spy_dump_is_read_like_faulthandlers(tmp_path: Path) -> None:
    # py-spy dump --pid: `Thread N (idle): "MainThread"`, frames `    FUNC (FILE:LINE)`, innermost first
    text = (
        "Process 4242: python train.py\nPython v3.10.12 (/usr/bin/python3.10)\n\n"
        'Thread 4242 (idle): "MainThread"\n'
        "    barrier (torch/distributed/distributed_c10d.py:3439)\n"
        "    wrapper (torch/distributed/c10d_logger.py:47)\n"
        "    evaluation_loop (transformers/trainer.py:3200)\n"
        "    evaluate (transformers/trainer.py:3010)\n"
        'Thread 4300 (idle): "Thread-1 (_pin_memory_loop)"\n'
        "    wait (threading.py:324)\n"
    )
    top, fc, phase = _run(tmp_path, text)
    assert fc["id"] == "class:collective-timeout", top
    assert fc["collective"] in ("barrier", "wrapper")
    assert phase == "evaluation"


def test_a_dump_under_a_fatal_error_is_a_crash_not_a_hang(tmp_path: Path) -> None:
    # faulthandler's crash handler: `Fatal Python error: Segmentation fault`, then the stack
    text = (
        "Fatal Python error: Segmentation fault\n\nCurrent thread 0x00007f1b (most recent call first):\n"
        '  File "/env/site-packages/torch/nn/functional.py", line 2233 in embedding\n'
        '  File "/x/train.py", line 80 in main\n'
    )
    top, fc, phase = _run(tmp_path, text)
    assert fc["id"] == "class:crash", top
    assert phase == "unknown"  # an embedding called from main: no phase in those frames
    text = text.replace(
        '"/x/train.py", line 80 in main',
        '"/env/site-packages/transformers/trainer.py", line 3669 in training_step',
    )
    _top, _fc, phase = _run(tmp_path, text)
    assert phase == "training_step"  # the dumped stack places the death


def test_a_dump_beside_a_real_failure_adds_nothing(tmp_path: Path) -> None:
    text = "Stack (most recent call first):\n" + FH_FRAMES + OOM_NEW + "\n"
    top, fc, _ = _run(tmp_path, text)
    assert fc["id"] == "class:gpu-oom", top


# ---- phase markers ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "warning",
    [
        # transformers 4.x PretrainedConfig.from_pretrained (configuration_utils.py)
        "You are using a model of type llama to instantiate a model of type llava. This is not supported for all "
        "configurations of models and can yield errors.",
        # transformers 5.x: the types backticked
        "You are using a model of type `llama` to instantiate a model of type `llava`. This may be expected if you "
        "are loading a checkpoint that shares a subset of the architecture",
    ],
)
def test_a_config_read_by_from_pretrained_places_a_load(tmp_path: Path, warning: str) -> None:
    text = (
        warning
        + "\n"
        + warning
        + "\nERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: -9) "
    )
    text += "local_rank: 4 (pid: 39413)\n"
    _top, fc, phase = _run(tmp_path, text)
    assert fc["id"] == "class:host-oom-kill"
    assert phase == "load"


@pytest.mark.parametrize(
    "save",
    [
        "2026-02-18 10:28:25,496 - root - INFO - Saving latest checkpoint model trained for 3 complete epochs",
        "Saving best checkpoint to out/best.pt",
        "Saving the final checkpoint",
    ],
)
def test_a_loop_naming_the_checkpoint_it_saves_places_a_save(tmp_path: Path, save: str) -> None:
    text = (
        save
        + "\n[rank7]:[E218 10:48:25.033625188 ProcessGroupNCCL.cpp:632] [Rank 7] Watchdog caught collective "
        "operation timeout: WorkNCCL(SeqNum=1512677, OpType=ALLREDUCE, NumelIn=306176, NumelOut=306176, "
        "Timeout(ms)=1200000) ran for 1200020 milliseconds before timing out.\n"
    )
    _top, fc, phase = _run(tmp_path, text)
    assert fc["id"] == "class:collective-timeout"
    assert phase == "checkpoint_save"


def test_a_traceback_header_glued_to_a_bar_without_its_rank_prefix_joins_that_ranks_frames(
    tmp_path: Path,
) -> None:
    # TRL#2877's form: the header lost its `[rank0]: ` (glued behind the bar another process drew), the frames and
    # the exception keep theirs; one traceback, read to its innermost library frame
    text = (
        " 46%|████▋     | 464/1000 [7:43:51<13:16:21, 89.14s/it]Traceback (most recent call last):\n"
        '[rank0]:   File "/env/site-packages/transformers/trainer.py", line 3669, in training_step\n'
        "[rank0]:     inputs = self._prepare_inputs(inputs)\n"
        '[rank0]:   File "/env/site-packages/trl/trainer/grpo_trainer.py", line 490, in _move_model_to_vllm\n'
        "[rank0]:     with unwrap_model_for_generation(\n"
        "[rank0]: AssertionError\n"
    )
    top, fc, phase = _run(tmp_path, text)
    assert fc["id"] == "class:library-assertion", top
    assert "trl/trainer/grpo_trainer.py:490" in str(fc["library_frame"])
    assert phase == "training_step"


def test_a_cut_traceback_after_a_progress_bar_is_placed_in_training(tmp_path: Path) -> None:
    # the bar printed before the traceback began is the run's progress (the frames alone say only `<module>`)
    text = (
        BAR
        + '\nTraceback (most recent call last):\n  File "/home/user/swift/cli/rlhf.py", line 5, in <module>\n'
    )
    text += '    rlhf_main()\n  File "/home/user/'
    top, _fc, phase = _run(tmp_path, text)
    assert top == "class:crash"
    assert phase == "training_step"


@pytest.mark.parametrize(
    "frame",
    [
        '  File "/env/site-packages/deepspeed/runtime/zero/stage_1_and_2.py", line 525, in __init__\n',
        '  File "/env/site-packages/deepspeed/runtime/zero/stage3.py", line 310, in __init__\n',
        '  File "/env/site-packages/deepspeed/runtime/bf16_optimizer.py", line 96, in __init__\n',
        '  File "/env/site-packages/deepspeed/runtime/engine.py", line 310, in __init__\n',
    ],
)
def test_an_oom_in_the_constructor_deepspeed_initialize_builds_is_engine_init(
    tmp_path: Path, frame: str
) -> None:
    text = "Traceback (most recent call last):\n" + frame + "    self.x()\n" + OOM_NEW + "\n"
    _top, fc, phase = _run(tmp_path, text)
    assert fc["id"] == "class:gpu-oom"
    assert phase == "engine_init"


@pytest.mark.parametrize(
    ("line", "said"),
    [
        # gcc/nvcc: a header the build needs is not installed (python3-dev, the CUDA toolkit's headers)
        ("/x/cpu_adam.cpp:1:10: fatal error: Python.h: No such file or directory", "fatal error: Python.h"),
        # nvcc refusing the architecture list
        ("nvcc fatal   : Unsupported gpu architecture 'compute_90'", "nvcc fatal"),
        # CUDA's crt/host_config.h refusing a newer host compiler
        (
            "/usr/local/cuda/include/crt/host_config.h:132:2: error: #error -- unsupported GNU version! gcc versions "
            "later than 12 are not supported!",
            "#error -- unsupported GNU version!",
        ),
    ],
    ids=["missing-header", "nvcc-fatal", "host-compiler"],
)
def test_the_compiler_failing_a_jit_build_is_an_op_build_failure(
    tmp_path: Path, line: str, said: str
) -> None:
    top, fc, _ = _run(tmp_path, JIT + line + "\ncompilation terminated.\n")
    assert fc["id"] == "class:op-build-failure", top
    assert fc["op"] == "cpu_adam"
    assert said in str(fc["message"]) or said in top


def test_the_latest_build_names_the_toolchain_failure(tmp_path: Path) -> None:
    # an earlier test compile against -laio (DeepSpeed's async_io check) failed harmlessly; the JIT build after it
    # failed on a missing header: that one is quoted
    text = (
        "/usr/bin/ld: cannot find -laio\n" + JIT + "fatal error: cuda_runtime.h: No such file or directory\n"
        "FAILED: cpu_adam.o\n"
    )
    top, fc, _ = _run(tmp_path, text)
    assert fc["id"] == "class:op-build-failure", top
    assert "cuda_runtime.h" in str(fc["message"])
    assert "-laio" not in str(fc["message"])
