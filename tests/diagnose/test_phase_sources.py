"""Where a failure's phase comes from besides frame function names: the engine's and frameworks' own start, save
and resume lines, the runtime guard's line, the source lines of the frames, and IPython tracebacks; and one
exception printed by interleaved ranks read with every frame its copies hold."""

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
        # deepspeed.initialize's own lines, whoever calls it
        (
            "[2025-03-07 23:55:15,357] [INFO] [logging.py:128:log_dist] [Rank 0] DeepSpeed info: version=0.16.3, "
            "git-hash=unknown, git-branch=unknown\n",
            "engine_init",
        ),
        (
            "[2025-03-07 23:55:16,883] [INFO] [logging.py:128:log_dist] [Rank 0] Creating torch.bfloat16 ZeRO stage 2"
            " optimizer\n",
            "engine_init",
        ),
        ("Building extension module fused_adam...\n", "engine_init"),
        # XTuner / mmengine: the loop starts, saves, resumes
        (
            "05/11 14:58:00 - mmengine - INFO - Checkpoints will be saved to /work/out.\n",
            "first_optimizer_step",
        ),
        ("12/09 06:49:23 - mmengine - INFO - Saving checkpoint at 14 epochs\n", "checkpoint_save"),
        (
            "05/11 14:58:00 - mmengine - INFO - Resume checkpoint from /root/train/lora_output/iter_300.pth\n",
            "resume",
        ),
        # DeepSpeed's checkpoint engine writing the 16-bit weights
        (
            "[2023-02-06 16:37:18,583] [INFO] [engine.py:3500:save_16bit_model] Saving model weights to "
            "out/checkpoint-500/pytorch_model.bin\n",
            "checkpoint_save",
        ),
    ],
)
def test_phase_of_a_sigkill_from_engine_and_framework_lines(tmp_path: Path, before: str, phase: str) -> None:
    log = tmp_path / "run.log"
    log.write_text(before + KILL)
    d = diagnose([str(log)])
    assert d.first_failure is not None and d.first_failure.exit_code == -9
    assert d.phase == phase, d.findings[0].data


@pytest.mark.parametrize(
    ("guard_phase", "phase"),
    [("train", "training_step"), ("save", "checkpoint_save"), ("evaluation", "evaluation"), ("init", "engine_init")],
)
def test_the_guard_line_names_the_phase(tmp_path: Path, guard_phase: str, phase: str) -> None:
    """The runtime guard prints `zerodoctor guard [rank R, step S, PHASE]: ...` before the traceback (and its
    per-rank error file carries the same); a traceback with no telling frame takes the guard's phase."""
    log = tmp_path / "run.log"
    log.write_text(
        f"zerodoctor guard [rank 1, step 12, {guard_phase}]: Failure not in the knowledge base: RuntimeError\n"
        "[rank1]: Traceback (most recent call last):\n"
        '[rank1]:   File "/work/train.py", line 40, in <module>\n'
        "[rank1]:     helper(batch)\n"
        "[rank1]: RuntimeError: something unusual happened\n"
    )
    d = diagnose([str(log)])
    assert d.first_failure is not None and d.first_failure.rank == 1
    assert d.phase == phase, d.findings[0].data


def test_frame_source_lines_place_a_failure_inside_the_training_loop(tmp_path: Path) -> None:
    """The Trainer's loop frames alone say `training`; the source line of the innermost one says the engine was
    being prepared (a chained traceback of an op build under Trainer.train)."""
    log = tmp_path / "run.log"
    log.write_text(
        "Building extension module fused_adam...\n"
        "[rank1]: Traceback (most recent call last):\n"
        '[rank1]:   File "/venv/lib/python3.11/site-packages/torch/utils/cpp_extension.py", line 2105, in '
        "_run_ninja_build\n"
        "[rank1]:     subprocess.run(\n"
        "[rank1]: subprocess.CalledProcessError: Command '['ninja', '-v']' returned non-zero exit status 1.\n"
        "\n"
        "[rank1]: The above exception was the direct cause of the following exception:\n"
        "\n"
        "[rank1]: Traceback (most recent call last):\n"
        '[rank1]:   File "/work/trainer.py", line 163, in <module>\n'
        "[rank1]:     trainer.train()\n"
        '[rank1]:   File "/venv/lib/python3.11/site-packages/transformers/trainer.py", line 2325, in '
        "_inner_training_loop\n"
        "[rank1]:     model, self.optimizer, self.lr_scheduler = self.accelerator.prepare(\n"
    )
    d = diagnose([str(log)])
    assert d.findings[0].data["failure_class"]["id"] == "class:op-build-failure"
    assert d.phase == "engine_init", d.findings[0].data


def test_a_backward_source_line_places_a_frameless_exception(tmp_path: Path) -> None:
    log = tmp_path / "run.log"
    log.write_text(
        "[rank0]:     self.deepspeed_engine_wrapped.backward(loss, **kwargs)\n"
        "[rank0]: AttributeError: 'Accelerator' object has no attribute 'deepspeed_engine_wrapped'\n"
    )
    d = diagnose([str(log)])
    assert d.findings[0].id == "class:crash"
    assert d.phase == "training_step"


def test_an_ipython_traceback_cut_before_its_last_line(tmp_path: Path) -> None:
    """A notebook paste: the header names the exception, frames are `path.py in func(...)`."""
    log = tmp_path / "run.log"
    log.write_text(
        "Building extension module fused_adam...\n"
        "---------------------------------------------------------------------------\n"
        "CalledProcessError                        Traceback (most recent call last)\n"
        "~/.local/lib/python3.6/site-packages/torch/utils/cpp_extension.py in _run_ninja_build(build_directory, "
        "verbose, error_prefix)\n"
        "   1672             check=True,\n"
        "-> 1673             env=env)\n"
    )
    d = diagnose([str(log)])
    assert d.findings[0].data["failure_class"]["id"] == "class:op-build-failure"
    assert d.phase == "engine_init"


def test_one_exception_printed_by_interleaved_ranks_keeps_all_its_frames(tmp_path: Path) -> None:
    """Two ranks raise the same ValueError; the lines interleave so the first parsed traceback holds only the
    script's frame, the second the frames in accelerate/transformers: it is a config refused, not a crash."""
    log = tmp_path / "run.log"
    log.write_text(
        "Traceback (most recent call last):\n"
        '  File "/work/train.py", line 182, in <module>\n'
        '    raise ValueError("Please specify the ZeRO optimization config in the DeepSpeed config.")\n'
        "ValueError: Please specify the ZeRO optimization config in the DeepSpeed config.\n"
        "    self.deepspeed_plugin = DeepSpeedPlugin(hf_ds_config=self.hf_deepspeed_config)\n"
        '  File "/venv/lib/python3.9/site-packages/accelerate/utils/dataclasses.py", line 601, in __post_init__\n'
        '  File "/venv/lib/python3.9/site-packages/transformers/training_args.py", line 1661, in __post_init__\n'
        "ValueError: Please specify the ZeRO optimization config in the DeepSpeed config.\n"
    )
    d = diagnose([str(log)])
    assert d.findings[0].id == "class:config-rejected"


def test_rays_memory_monitor_is_a_host_oom_not_a_gpu_oom(tmp_path: Path) -> None:
    log = tmp_path / "run.log"
    log.write_text(
        "ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on memory.\n"
        "Memory on the node (IP: 10.0.0.1, ID: 3f2a) where the task was running was 1007.24GB / 1007.74GB (0.999507),"
        " which exceeds the memory usage threshold of 0.95.\n"
    )
    d = diagnose([str(log)])
    assert d.findings[0].data["failure_class"]["id"] == "class:host-oom-kill"


def test_a_paste_ending_in_a_library_assert_line_is_an_assertion(tmp_path: Path) -> None:
    """No `AssertionError` line: the last frame is DeepSpeed's and its source line is an `assert`."""
    log = tmp_path / "run.log"
    log.write_text(
        "Traceback (most recent call last):\n"
        '  File "/venv/lib/python3.10/site-packages/deepspeed/runtime/zero/stage3.py", line 435, in defragment\n'
        "    assert len(set(t.dtype for t in tensors)) == 1\n"
    )
    d = diagnose([str(log)])
    fclass = d.findings[0].data.get("failure_class") or {"id": d.findings[0].id}
    assert fclass["id"] == "class:library-assertion"
    assert d.phase == "engine_init"  # ZeRO-3's optimizer constructor defragments the fp16 partitions


def test_the_first_optimizer_step_from_the_loops_source_line(tmp_path: Path) -> None:
    log = tmp_path / "run.log"
    log.write_text(
        "Traceback (most recent call last):\n"
        '  File "/venv/lib/python3.11/site-packages/transformers/trainer.py", line 1881, in _inner_training_loop\n'
        "    self.optimizer.step()\n"
        "AttributeError: 'DummyOptim' object has no attribute 'step'\n"
    )
    d = diagnose([str(log)])
    assert d.phase == "first_optimizer_step"


def test_a_frame_line_cut_before_file_still_counts(tmp_path: Path) -> None:
    log = tmp_path / "run.log"
    log.write_text(
        'deepspeed/runtime/zero/partitioned_param_coordinator.py", line 194, in record_parameters\n'
        "    step_id = self.__step_id_module_fetched_for[sub_module.id].popleft()\n"
        "IndexError: pop from an empty deque\n"
    )
    d = diagnose([str(log)])
    assert d.phase == "training_step"  # ZeRO-3 records the module order inside forward


@pytest.mark.parametrize(
    "text",
    [
        # bash, glued to the loading bar
        "Loading checkpoint shards:   0%|          | 0/2 [00:00<?, ?it/s]Killed\n",
        # zsh's job line
        "Loading checkpoint shards:   0%|          | 0/3 [00:00<?, ?it/s][1]    26478 killed     python test.py\n",
    ],
)
def test_the_shells_killed_line_is_a_sigkill_in_the_phase_it_is_glued_to(tmp_path: Path, text: str) -> None:
    log = tmp_path / "run.log"
    log.write_text(text)
    d = diagnose([str(log)])
    assert d.first_failure is not None and d.first_failure.exit_code == -9
    assert d.findings[0].data["failure_class"]["id"] == "class:host-oom-kill"
    assert d.phase == "load"


def test_killed_inside_a_sentence_is_no_kill(tmp_path: Path) -> None:
    log = tmp_path / "run.log"
    log.write_text("[INFO] worker 3 was not killed by the scheduler\n{'loss': 1.0, 'epoch': 0.1}\n")
    d = diagnose([str(log)])
    assert d.first_failure is None


@pytest.mark.parametrize(
    ("text", "entry", "phase"),
    [
        (
            "ValueError: ZeRO inference only makes sense with ZeRO Stage 3 - please adjust your config\n",
            "hf-zero-inference-needs-stage3",
            "evaluation",
        ),
        (
            "ValueError: Please correct the following DeepSpeed config values that mismatch TrainingArguments values:\n"
            "- ds fp16.enabled=True vs hf fp16|fp16_full_eval+fp16_backend(amp)=False\n"
            "The easiest method is to set these DeepSpeed config values to 'auto'.\n",
            "hf-ds-config-mismatch",
            "engine_init",
        ),
    ],
)
def test_a_bare_error_takes_the_phase_its_entry_is_raised_in(
    tmp_path: Path, text: str, entry: str, phase: str
) -> None:
    """No frame, marker or progress: the knowledge-base entry knows where its error is raised."""
    log = tmp_path / "run.log"
    log.write_text(text)
    d = diagnose([str(log)])
    assert d.findings[0].id == entry
    assert d.findings[0].data["phase"] == phase


def test_a_bare_deepspeed_assertion_line_is_a_library_assertion(tmp_path: Path) -> None:
    log = tmp_path / "run.log"
    log.write_text(
        "AssertionError: no_sync context manager is incompatible with gradient partitioning logic of ZeRO stage 3\n"
    )
    d = diagnose([str(log)])
    fclass = d.findings[0].data.get("failure_class") or {"id": d.findings[0].id}
    assert fclass["id"] == "class:library-assertion"


def test_a_bare_assertion_of_the_users_own_code_stays_a_crash(tmp_path: Path) -> None:
    log = tmp_path / "run.log"
    log.write_text("AssertionError: expected 3 labels, got 2\n")
    d = diagnose([str(log)])
    fclass = d.findings[0].data.get("failure_class") or {"id": d.findings[0].id}
    assert fclass["id"] == "class:crash"


def test_torchs_per_parameter_load_error_is_a_load_failure(tmp_path: Path) -> None:
    log = tmp_path / "run.log"
    log.write_text(
        'stderr: [rank0]:        While copying the parameter named "model.layers.28.self_attn.q_proj.weight", whose'
        " dimensions in the model are torch.Size([576, 576]) and whose dimensions in the checkpoint are"
        " torch.Size([576, 576]), an exception occurred : ('Cannot copy out of meta tensor; no data!',).\n"
    )
    d = diagnose([str(log)])
    assert d.first_failure is not None
    assert d.phase == "load"


def test_a_cpp_abort_with_no_python_traceback_is_a_failure(tmp_path: Path) -> None:
    log = tmp_path / "run.log"
    log.write_text(
        "terminate called after throwing an instance of 'c10::Error'\n"
        "  what():  CUDA error: an illegal memory access was encountered\n"
        "Exception raised from c10_cuda_check_implementation at ../c10/cuda/CUDAException.cpp:44 (most recent call first):\n"
    )
    d = diagnose([str(log)])
    assert d.first_failure is not None and "c10::Error" in d.first_failure.detail
    assert d.findings[0].data["failure_class"]["id"] == "class:crash"


def test_a_paste_cut_after_a_raise_line_is_that_exception(tmp_path: Path) -> None:
    log = tmp_path / "run.log"
    log.write_text(
        '[rank6]:   File "/opt/conda/lib/python3.11/site-packages/transformers/trainer.py", line 2393, in '
        "_inner_training_loop\n"
        "[rank6]:     deepspeed_load_checkpoint(\n"
        '[rank6]:   File "/opt/conda/lib/python3.11/site-packages/transformers/integrations/deepspeed.py", line 504,'
        " in deepspeed_load_checkpoint\n"
        '[rank6]:     raise ValueError(f"Can\'t find a valid checkpoint at {checkpoint_path}")\n'
    )
    d = diagnose([str(log)])
    assert d.first_failure is not None and d.first_failure.rank == 6
    assert d.phase == "resume"
    # reading a checkpoint back is not a configuration refused
    assert d.findings[0].data["failure_class"]["id"] == "class:crash"


def test_a_bare_oserror_line_is_a_failure_but_not_inside_a_message(tmp_path: Path) -> None:
    log = tmp_path / "run.log"
    log.write_text("[Errno 2] No such file or directory: 'ckpt/global_step001/zero_pp_rank_0_mp_rank_03_optim_states.pt'\n")
    d = diagnose([str(log)])
    assert d.first_failure is not None and d.first_failure.detail.startswith("OSError")
    quiet = tmp_path / "quiet.log"
    quiet.write_text("[WARNING] could not read cache ([Errno 2] No such file or directory: 'x'), rebuilding\n")
    assert diagnose([str(quiet)]).first_failure is None


def test_a_launchers_exit_code_1_is_a_ranks_own_error_not_a_stop_from_outside(tmp_path: Path) -> None:
    log = tmp_path / "run.log"
    log.write_text(
        "[2024-03-20 20:31:29,269] [ERROR] [launch.py:321:sigkill_handler] ['/usr/bin/python', '-u', 'train.py',"
        " '--local_rank=4'] exits with return code = 1\n"
    )
    d = diagnose([str(log)])
    assert d.findings[0].id == "class:crash" and d.first_failure is not None and d.first_failure.rank == 4


def test_hf_resume_line_is_a_resume_marker(tmp_path: Path) -> None:
    log = tmp_path / "run.log"
    log.write_text("[INFO|deepspeed.py:449] 2022-05-15 00:12:20,447 >> Attempting to resume from out/checkpoint-22\n" + KILL)
    assert diagnose([str(log)]).phase == "resume"


def test_deepspeeds_launcher_teardown_alone_is_a_rank_failure(tmp_path: Path) -> None:
    log = tmp_path / "run.log"
    log.write_text(
        "[2022-05-15 00:12:57,785] [INFO] [launch.py:178:sigkill_handler] Killing subprocess 97277\n"
        "[2022-05-15 00:12:57,786] [INFO] [launch.py:178:sigkill_handler] Killing subprocess 97278\n"
    )
    d = diagnose([str(log)])
    assert d.findings[0].id == "class:crash" and "not in these logs" in d.findings[0].title


def test_a_cuda_kernel_assertion_is_a_crash_printed_once(tmp_path: Path) -> None:
    """Every GPU thread prints the assertion; the `CUDA error: device-side assert` line may be missing."""
    line = (
        "/pytorch/aten/src/ATen/native/cuda/IndexKernel.cu:92: operator(): block: [7,0,0], thread: [{t},0,0] "
        'Assertion `-sizes[i] <= index && index < sizes[i] && "index out of bounds"` failed.\n'
    )
    log = tmp_path / "run.log"
    log.write_text("".join(line.format(t=t) for t in range(40)))
    d = diagnose([str(log)])
    assert d.findings[0].id == "class:crash"
    assert d.first_failure is not None and "device-side assertion in operator()" in d.first_failure.detail
    assert d.first_failure.line.lineno == 1
