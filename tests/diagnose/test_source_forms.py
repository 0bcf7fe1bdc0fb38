"""Failure and phase forms read from the frameworks' sources rather than from one thread's log: each test writes
the lines as the source prints them (the function or file named beside it) and checks what diagnose makes of them."""

from __future__ import annotations

from pathlib import Path

import pytest

from zerodoctor.diagnose import diagnose
from zerodoctor.diagnose.extract import OomNumbers
from zerodoctor.diagnose.reader import LogLine


def _top(tmp_path: Path, text: str) -> tuple[str, dict[str, object], str]:
    log = tmp_path / "run.log"
    log.write_text(text)
    d = diagnose([str(log)])
    top = d.findings[0]
    fc = top.data.get("failure_class") or {"id": top.id, **top.data}
    return top.id, fc, d.phase


def test_watchdog_thread_ending_on_a_cuda_fault_is_that_fault_not_a_timeout(tmp_path: Path) -> None:
    # ProcessGroupNCCL.cpp ncclCommWatchdog: LOG(ERROR) << "Process group watchdog thread terminated with exception: "
    top, fc, _ = _top(
        tmp_path,
        "[rank1]:[E107 10:50:18.780482185 ProcessGroupNCCL.cpp:1504] [PG 0 (default_pg) Rank 1] Process group "
        "watchdog thread terminated with exception: CUDA error: an illegal memory access was encountered\n"
        "CUDA kernel errors might be asynchronously reported at some other API call\n",
    )
    assert fc["id"] == "class:crash", top
    assert "illegal memory access" in str(fc["message"])


def test_watchdog_thread_ending_on_a_timeout_stays_a_collective_timeout(tmp_path: Path) -> None:
    _top_id, fc, _ = _top(
        tmp_path,
        "[rank0]:[E ProcessGroupNCCL.cpp:1316] [PG 0 Rank 0] Process group watchdog thread terminated with exception: "
        "[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=11, OpType=ALLREDUCE, NumelIn=1, "
        "NumelOut=1, Timeout(ms)=600000) ran for 600012 milliseconds before timing out.\n",
    )
    assert fc["id"] == "class:collective-timeout"


def test_ninja_stopping_a_jit_build_names_the_op_from_its_compile_line(tmp_path: Path) -> None:
    # torch/utils/cpp_extension.py: -DTORCH_EXTENSION_NAME={name} on each compile line; ninja's own stop line; the
    # paste ends inside _run_ninja_build's traceback (before `Error building extension`)
    top, fc, phase = _top(
        tmp_path,
        "[1/3] c++ -MMD -MF cpu_adam_impl.o.d -DTORCH_EXTENSION_NAME=transformer_inference -DTORCH_API_INCLUDE_EXTENSION_H "
        "-c /x/deepspeed/ops/csrc/transformer/inference/csrc/pt_binding.cpp -o pt_binding.o\n"
        "ninja: build stopped: subcommand failed.\n"
        "Traceback (most recent call last):\n"
        '  File "/x/torch/utils/cpp_extension.py", line 1893, in _run_ninja_build\n'
        "    subprocess.run(\n",
    )
    assert fc["id"] == "class:op-build-failure", top
    assert fc["op"] == "transformer_inference"
    assert phase == "engine_init"


@pytest.mark.parametrize(
    "failed",
    [
        "FAILED: multi_tensor_adam.cuda.o",  # ninja < 1.12 (src/build.cc)
        "FAILED: [code=1] multi_tensor_adam.cuda.o",  # ninja >= 1.12 (src/status_printer.cc BuildEdgeFinished)
        "\x1b[31mFAILED: [code=1] \x1b[0mmulti_tensor_adam.cuda.o",  # the same, coloured on a smart terminal
        "FAILED: fused_adam.so",  # the link step
    ],
)
def test_ninja_failed_step_is_an_op_build_failure_named_from_torch_lines(tmp_path: Path, failed: str) -> None:
    # torch/utils/cpp_extension.py _jit_compile logs `Building extension module NAME...`; ninja prints the failed step
    # (then its command), and the paste may end there, before `ninja: build stopped` and torch's RuntimeError
    top, fc, phase = _top(
        tmp_path,
        "Using /root/.cache/torch_extensions/py310_cu121 as PyTorch extensions root...\n"
        "Building extension module fused_adam...\n"
        f"{failed}\n"
        "/usr/local/cuda/bin/nvcc -c multi_tensor_adam.cu -o multi_tensor_adam.cuda.o\n",
    )
    assert fc["id"] in ("class:op-build-failure", "fused-adam-build-failure"), (top, fc)
    assert top != "cpu-adam-build-failure"
    assert phase == "engine_init"


def test_ninja_failed_cpu_adam_object_is_the_cpu_adam_entry(tmp_path: Path) -> None:
    # RTL-Coder#13: verbose compile line of cpu_adam.cpp, then `FAILED: cpu_adam.o`, and the paste ends
    top, fc, _ = _top(
        tmp_path,
        "Building extension module cpu_adam...\n"
        "[1/3] c++ -MMD -MF cpu_adam.o.d -DTORCH_EXTENSION_NAME=cpu_adam -c /x/deepspeed/ops/csrc/adam/cpu_adam.cpp "
        "-o cpu_adam.o\n"
        "FAILED: cpu_adam.o\n",
    )
    assert top == "cpu-adam-build-failure", fc
    assert fc["op"] == "cpu_adam"


def test_progress_meter_steps_place_a_kill_in_training(tmp_path: Path) -> None:
    # pytorch/examples imagenet/main.py ProgressMeter: `Epoch: [0][ 415/1736]`
    _top_id, fc, phase = _top(
        tmp_path,
        "Epoch: [0][415/1736]\t Loss 0.5844 MAE 0.6568\n"
        "Epoch: [0][447/1736]\t Loss 0.5504 MAE 0.6353\n"
        "Killed\n",
    )
    assert fc["id"] in ("host-oom-sigkill", "class:host-oom-kill")
    assert phase == "training_step"


def test_autograd_engine_source_line_is_a_backward_pass(tmp_path: Path) -> None:
    # torch/autograd/graph.py _engine_run_backward's source line, pasted without its frame
    _top_id, fc, phase = _top(
        tmp_path,
        "Variable._execution_engine.run_backward(  # Calls into the C++ engine to run the backward pass\n"
        "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 732.00 MiB (GPU 0; 24.00 GiB total "
        "capacity; 20.62 GiB already allocated; 0 bytes free; 22.68 GiB reserved in total by PyTorch)\n",
    )
    assert fc["id"] == "class:gpu-oom"
    assert phase == "training_step"


def test_ray_actor_died_fields_belong_to_its_exception(tmp_path: Path) -> None:
    # ray/exceptions.py ActorDiedError: the fields, then the cause, under the exception line
    top, _fc, _ = _top(
        tmp_path,
        "ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task.\n"
        "        class_name: WorkerDict\n"
        "        pid: 1504364\n"
        "The actor is dead because its worker process has died. Worker exit type: SYSTEM_ERROR Worker exit detail: "
        "Worker unexpectedly exits with a connection error code 2. End of file.\n",
    )
    assert top == "fw-ray-worker-died-system-error"


def test_ddp_wrapping_in_accelerate_prepare_is_engine_init(tmp_path: Path) -> None:
    _top_id, fc, phase = _top(
        tmp_path,
        "Traceback (most recent call last):\n"
        '  File "/x/accelerate/accelerator.py", line 1433, in prepare_model\n'
        "    model = torch.nn.parallel.DistributedDataParallel(\n"
        '  File "/x/torch/nn/parallel/distributed.py", line 1100, in _ddp_init_helper\n'
        "    self.reducer = dist.Reducer(\n"
        "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 25.10 GiB. GPU 0 has a total capacity of "
        "39.39 GiB of which 13.58 GiB is free.\n",
    )
    assert fc["id"] == "class:gpu-oom"
    assert phase == "engine_init"


def _oom(tried: float, cached: float, total: float) -> OomNumbers:
    return OomNumbers(tried, total, 0.0, total - cached, cached, None, 0, LogLine("x", 1, "", None, None, None))


def test_fragmentation_needs_a_cache_that_holds_several_more_such_allocations() -> None:
    assert _oom(0.71, 2.06, 24.0).verdict == "lack"  # 2.9x: the next allocations fail after it
    assert _oom(0.02, 3.10, 79.32).verdict == "lack"  # 155x, but 4 % of the allocated memory: slack
    assert _oom(0.02, 23.10, 79.32).verdict == "fragmentation"  # 41 % of it
    assert _oom(2.32, 9.96, 23.69).verdict == "fragmentation"  # 4.3x


_TB = 'Traceback (most recent call last):\n  File "/x/train.py", line 5, in <module>\n    main()\n'


@pytest.mark.parametrize(
    ("text", "class_id", "setup"),
    [
        # gloo's transport (gloo/transport/tcp/unbound_buffer.cc): a peer stopped sending
        (
            _TB + "RuntimeError: [../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting "
            "1800000ms for recv operation to complete\n",
            "class:collective-timeout",
            False,
        ),
        # TCPStore client (c10d/socket.cpp), raised as DistNetworkError
        (
            _TB + "torch.distributed.DistNetworkError: The client socket has timed out after 900s while trying to "
            "connect to (10.0.0.1, 29500).\n",
            "class:collective-timeout",
            True,
        ),
        # only the c10d log line, the traceback cut before its exception
        (
            "[E socket.cpp:957] [c10d] The client socket has timed out after 900s while trying to connect to "
            "(10.0.0.181, 60994).\n" + _TB,
            "class:collective-timeout",
            True,
        ),
        # distributed_c10d.py _store_based_barrier
        (
            _TB + "RuntimeError: Timed out initializing process group in store based barrier on rank: 3, for key: "
            "store_based_barrier_key:1 (world_size=8, worker_count=4, timeout=0:30:00)\n",
            "class:collective-timeout",
            True,
        ),
        (_TB + "torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError\n", "class:collective-timeout", True),
        (
            _TB + "torch.distributed.DistStoreError: Timed out after 901 seconds waiting for clients. 1/2 clients "
            "joined.\n",
            "class:collective-timeout",
            True,
        ),
        # Kubernetes' container status
        ("    Last State:     Terminated\n      Reason:       OOMKilled\n      Exit Code:    137\n", "", None),
    ],
)
def test_distributed_timeouts_and_kills_by_their_source_words(
    tmp_path: Path, text: str, class_id: str, setup: bool | None
) -> None:
    _top_id, fc, _ = _top(tmp_path, text)
    if setup is None:
        assert fc["id"] in ("class:host-oom-kill", "host-oom-sigkill"), fc["id"]
        return
    assert fc["id"] == class_id
    assert fc["setup"] is setup


def test_store_barrier_says_how_many_joined(tmp_path: Path) -> None:
    _top_id, fc, _ = _top(
        tmp_path,
        _TB + "RuntimeError: Timed out initializing process group in store based barrier on rank: 3, for key: "
        "store_based_barrier_key:1 (world_size=8, worker_count=4, timeout=0:30:00)\n",
    )
    assert (fc["world_size"], fc["joined"]) == (8, 4)


@pytest.mark.parametrize(("sig", "interrupt"), [(15, False), (2, True)])
def test_torchrun_agent_death_signal_is_a_stop_from_outside(tmp_path: Path, sig: int, interrupt: bool) -> None:
    # torch/distributed/elastic/agent/server/api.py: `Received %s death signal, shutting down workers`
    _top_id, fc, _ = _top(
        tmp_path,
        "[default0]:12:13:46    INFO Starting training step 0\n"
        f"W1130 12:13:49.388000 124326 torch/distributed/elastic/agent/server/api.py:723] Received {sig} death signal, "
        "shutting down workers\n"
        "W1130 12:13:49.389000 124326 torch/distributed/elastic/multiprocessing/api.py:900] Sending process 124533 "
        "closing signal SIGTERM\n",
    )
    assert fc["id"] == "class:terminated"


def test_kernel_assertion_with_padded_coordinates_and_translated_words(tmp_path: Path) -> None:
    _top_id, fc, _ = _top(
        tmp_path,
        "../aten/src/ATen/native/cuda/Indexing.cu:1146: indexSelectLargeIndex: block: [355,0,0], thread: [ 123,0,0] "
        "断言`srcIndex < srcSelectDimSize`失败。\n",
    )
    assert fc["id"] == "class:crash"
    assert "indexSelectLargeIndex" in str(fc["message"])


def test_transformers_lazy_import_failure_is_an_import_error(tmp_path: Path) -> None:
    # transformers/utils/import_utils.py _LazyModule._get_module
    _top_id, fc, _ = _top(
        tmp_path,
        _TB + "RuntimeError: Failed to import transformers.trainer because of the following error (look up to see its "
        "traceback):\ncannot import name 'is_npu_available' from 'accelerate.utils'\n",
    )
    assert fc["id"] == "class:import-error"


def test_rich_boxed_frames_are_frames(tmp_path: Path) -> None:
    # rich/traceback.py _render_stack: `│ /path/file.py:LINE in FUNC │` inside the box
    _top_id, fc, phase = _top(
        tmp_path,
        "╭───────────────────── Traceback (most recent call last) ─────────────────────╮\n"
        "│ /x/deepspeed/runtime/engine.py:1008 in _do_sanity_check                       │\n"
        "│                                                                               │\n"
        "│ ❱ 1008 │   │   │   │   assert self._is_supported_optimizer(                    │\n"
        "╰───────────────────────────────────────────────────────────────────────────────╯\n"
        "AssertionError: Adafactor is not a supported DeepSpeed Optimizer\n",
    )
    assert fc["id"] == "class:config-rejected"
    assert fc["judged_by"] == "deepspeed/runtime/engine.py:1008 in _do_sanity_check"
    assert phase == "engine_init"


def test_load_state_dict_refusal_without_frames_is_a_load(tmp_path: Path) -> None:
    # torch/nn/modules/module.py Module.load_state_dict
    _top_id, _fc, phase = _top(
        tmp_path,
        "RuntimeError: Error(s) in loading state_dict for Qwen2ForCausalLM:\n"
        "\tsize mismatch for model.layers.26.self_attn.k_proj.weight: copying a param with shape torch.Size([512, "
        "3584]) from checkpoint, the shape in current model is torch.Size([512, 2048]).\n",
    )
    assert phase == "load"


def test_latent_diffusion_save_on_exit_is_a_save(tmp_path: Path) -> None:
    # CompVis latent-diffusion main.py melk(): print("Summoning checkpoint.") then trainer.save_checkpoint
    _top_id, _fc, phase = _top(
        tmp_path,
        "Epoch 0: 100%|#| 209/209 [06:12<00:00,  1.78s/it, loss=0.0685, v_num=0]\nSummoning checkpoint.\nKilled\n",
    )
    assert phase == "checkpoint_save"


def test_rlhf_rollout_frames_are_a_training_step(tmp_path: Path) -> None:
    # DeepSpeed-Chat step3 ppo_trainer.py generate_experience -> self.eval() (a mode switch, not evaluation)
    _top_id, _fc, phase = _top(
        tmp_path,
        "Traceback (most recent call last):\n"
        '  File "/x/step3_rlhf_finetuning/ppo_trainer.py", line 97, in generate_experience\n'
        "    self.eval()\n"
        '  File "/x/deepspeed/runtime/hybrid_engine.py", line 379, in eval\n'
        "    f'|CurSamplesPerSec={(1 / latency * self._total_batch_size):.2f} ' + \\\n"
        "TypeError: unsupported operand type(s) for *: 'float' and 'NoneType'\n",
    )
    assert phase == "training_step"


def test_loguru_named_function_places_a_logged_failure(tmp_path: Path) -> None:
    # loguru's default format names the function that logged the caught error (loguru/_defaults.py LOGURU_FORMAT)
    _top_id, fc, phase = _top(
        tmp_path,
        " 100%|##########| 200/200 [16:11<00:00,  4.86s/it]\n"
        "2023-04-18 20:39:29.054 | INFO     | __main__:save_weights:34 - Error saving model: CUDA out of memory. Tried "
        "to allocate 16.00 MiB (GPU 0; 10.00 GiB total capacity; 9.80 GiB already allocated; 0 bytes free; 9.81 GiB "
        "reserved in total by PyTorch)\n",
    )
    assert fc["id"] == "class:gpu-oom"
    assert phase == "checkpoint_save"


@pytest.mark.parametrize(
    ("line", "class_id", "missing"),
    [
        # bash, from a script and interactively (execute_cmd.c: `%s: command not found`)
        ("run_1.3b.sh: line 18: deepspeed: command not found", "class:import-error", "deepspeed"),
        ("bash: torchrun: command not found", "class:import-error", "torchrun"),
        # zsh (Src/exec.c), dash (src/exec.c), fish
        ("zsh: command not found: accelerate", "class:import-error", "accelerate"),
        ("sh: 1: llamafactory-cli: not found", "class:import-error", "llamafactory-cli"),
        ("./train.sh: 12: deepspeed: not found", "class:import-error", "deepspeed"),
        ("fish: Unknown command: deepspeed", "class:import-error", "deepspeed"),
        # a launcher script whose #! interpreter is gone (a removed environment), coreutils and BSD env
        (
            "bash: /home/u/.local/bin/deepspeed: /opt/conda/envs/old/bin/python: bad interpreter: No such file or "
            "directory",
            "class:import-error",
            "/opt/conda/envs/old/bin/python",
        ),
        ("/usr/bin/env: \u2018python\u2019: No such file or directory", "class:import-error", "python"),
        ("env: python3: No such file or directory", "class:import-error", "python3"),
        # a build tool: the op build cannot run
        ("/bin/sh: 1: /usr/local/cuda/bin/nvcc: not found", "class:op-build-failure", "/usr/local/cuda/bin/nvcc"),
    ],
)
def test_a_shell_that_cannot_run_a_command_names_the_missing_program(
    tmp_path: Path, line: str, class_id: str, missing: str
) -> None:
    top, fc, _ = _top(tmp_path, "+ export CUDA_VISIBLE_DEVICES=0\n" + line + "\n")
    assert fc["id"] == class_id, (top, fc)
    assert fc["missing"] == missing


def test_a_command_not_found_that_the_run_outlived_is_no_failure(tmp_path: Path) -> None:
    # a setup line of a script without `set -e`; training ran after it
    top, _fc, _ = _top(
        tmp_path,
        "setup.sh: line 3: nvidia-smi: command not found\n"
        "***** Running training *****\n"
        " 50%|█████     | 5/10 [00:05<00:05,  1.00s/it]\n"
        "{'train_runtime': 10.1, 'train_samples_per_second': 1.0, 'epoch': 1.0}\n",
    )
    assert top == "no-known-failure"


@pytest.mark.parametrize(
    "frame",
    [
        # LLaMA-Factory src/llamafactory/data/aligner.py convert_sharegpt (LlamaFactory#6878), processors, loader
        '  File "/x/LLaMA-Factory/src/llamafactory/data/aligner.py", line 153, in convert_sharegpt\n',
        '  File "/x/src/llamafactory/data/processor/supervised.py", line 99, in preprocess_dataset\n',
        # XTuner xtuner/dataset/huggingface.py process_hf_dataset; TRL SFTTrainer._prepare_dataset
        '  File "/x/xtuner/dataset/huggingface.py", line 180, in process\n',
        '  File "/x/trl/trainer/sft_trainer.py", line 812, in _prepare_dataset\n',
    ],
)
def test_a_framework_preparing_its_dataset_is_tokenization(tmp_path: Path, frame: str) -> None:
    _top_id, _fc, phase = _top(
        tmp_path,
        "Traceback (most recent call last):\n"
        '  File "/x/train.py", line 5, in <module>\n    main()\n' + frame + "    x = m[k]\nKeyError: 'user'\n",
    )
    assert phase == "tokenization"


def test_a_frame_line_wrapped_after_its_line_number_is_read(tmp_path: Path) -> None:
    # a terminal 88 columns wide cut `line 153` into `line 15` / `3, in convert_sharegpt` padded with blanks
    top, fc, phase = _top(
        tmp_path,
        '[rank0]:   File "/home/xxx/LLaMA-Factory/src/llamafactory/data/aligner.py", line 15\n'
        "3, in convert_sharegpt" + " " * 66 + "\n"
        "[rank0]: KeyError: 'user'\n",
    )
    assert phase == "tokenization", (top, fc)
    assert fc["library_frame"] == "llamafactory/data/aligner.py:153 in convert_sharegpt"
