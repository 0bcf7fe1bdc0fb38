"""Round 9 (issue 10): batches 40-41's tune misses, each generalised to its family from the source that prints it.

Sources, by family:

- An exception quoted inside prose, not at a line's start: a Markdown code span (CommonMark; the last `Type: message`
  in the span, so a flattened traceback line `raise RuntimeError('...'.format( RuntimeError: Error(s) in loading
  state_dict for Sequential:` is read), a name right after CJK text (no space before a Latin word), and OSError's own
  str() (CPython Objects/exceptions.c OSError_str: `[Errno N] strerror: 'f'` and ` -> 'f2'` for os.rename/os.replace).
- CPython's keyword refusal (`%U() got an unexpected keyword argument '%S'`, Python/ceval.c; the qualified name from
  3.10 on) logged with no traceback: an argument the callee refuses, the caller and library at versions that disagree.
- A ValueError a training library raises itself (its raise read in the library's source by library_messages): the
  value the user's settings gave, refused - transformers' Trainer `You cannot perform fine-tuning on purely quantized
  models`, `Can't find a valid checkpoint at X`.
- DeepSpeed's op builder checks shared by every JIT-built op (op_builder/builder.py: `Installed CUDA version X does
  not match the version torch was compiled with Y, unable to compile cuda/cpp extensions without a matching cuda
  version.` - a plain Exception in 0.3-0.5, CUDAMismatchException with `>- DeepSpeed Op Builder: ` from 0.6;
  `CUDA_HOME does not exist, unable to compile CUDA op(s)`, MissingCUDAException): an op build failure, and the
  cpu_adam entry only where the cpu_adam frame (`self.ds_opt_adam = CPUAdamBuilder().load()`) or build is in the log.
- gcc's fatal diagnostic and its notice (gcc/diagnostic.cc, DK_FATAL: `compilation terminated.`): the compiler stopped.
- vLLM refusing to start without GPU memory for its KV cache (ValueErrors: `No available memory for the cache blocks`,
  worker.py 0.2-0.6 / v1 kv_cache_utils.py; `... KV cache is needed, which is larger than the available KV cache
  memory`, v1; `Free memory on device (X/Y GiB) on startup is less than desired GPU memory utilization`, v1
  gpu_worker.py): a GPU out of memory.
- bitsandbytes' native library that did not load at import (cextension.py 0.37-0.41, `CUDA Setup failed despite GPU
  being available. Inspect the CUDA SETUP outputs above ...` / `... Please run the following command ...: python -m
  bitsandbytes`): an import failure, no compiler ran.
- torch's elastic agent handing a death signal on (elastic/multiprocessing/api.py installs _terminate_process_handler
  for SIGTERM, SIGINT, SIGHUP, SIGQUIT; agent/server/api.py `Received N death signal, shutting down workers`): a stop
  from outside for every one of them.
- NCCL's verbs wrappers (src/misc/ibvwrap.cc IBV_*_CHECK_ERRNO: `WARN("Call to " name " failed with error %s",
  strerror(errno))`, returning ncclSystemError): `Connection timed out` there is ETIMEDOUT of an InfiniBand/RoCE call,
  an NCCL error, not a collective timeout.
"""

from __future__ import annotations

import pytest
from test_source_forms_r6 import _top  # the top finding of `diagnose --format json` on one log
from test_source_forms_r8 import _phase  # the timeline's phase of the first failure

from zerodoctor.diagnose.extract import device_oom, quoted_exception

HEALTHY_END = "{'loss': 1.2, 'epoch': 0.5}\n{'train_runtime': 100.0, 'train_loss': 1.1, 'epoch': 1.0}\n"
SITE = "/env/lib/python3.10/site-packages"
CRASH = ("class:crash",)
BUILD = ("class:op-build-failure",)
CONFIG = ("class:config-rejected",)
OOM = ("class:gpu-oom",)
BUILDER_MISMATCH = (
    "Installed CUDA version 9.1 does not match the version torch was compiled with 11.8, unable to compile cuda/cpp "
    "extensions without a matching cuda version."
)

# name -> (log text, accepted finding ids, text the finding's title or message must hold)
CASES: dict[str, tuple[str, tuple[str, ...], str]] = {
    # ---- exceptions quoted inside prose -------------------------------------------------------------------------
    "oserror-rename-after-cjk": (
        "报错如下FileNotFoundError: [Errno 2] No such file or directory: '/data/out/tmp-checkpoint-950' -> "
        "'/data/out/checkpoint-950'\n\n训练参数如下：\n--save_strategy epoch\n",
        CRASH,
        "FileNotFoundError",
    ),
    "oserror-errno-in-a-sentence": (
        "the save stops with PermissionError: [Errno 13] Permission denied: '/mnt/ckpt/global_step100'\n",
        CRASH,
        "Permission denied",
    ),
    "code-span-flattened-traceback": (
        "when I run finetune_lora.sh it raises an error about the projector:\n"
        "`raise RuntimeError('Error(s) in loading state_dict for {}:\\n\\t{}'.format( RuntimeError: Error(s) in "
        "loading state_dict for Sequential:`\n\nA few changes later it worked.\n",
        CRASH,
        "Error(s) in loading state_dict for Sequential",
    ),
    "code-span-in-a-sentence": (
        "after a few steps I get `KeyError: 'input_ids'` from my collator, what is wrong?\n",
        CRASH,
        "KeyError",
    ),
    "value-error-after-cjk": (
        "训练时报错ValueError: Expected input batch_size (16) to match target batch_size (8).\n",
        CRASH,
        "batch_size (16)",
    ),
    # ---- a library's own ValueError on the user's settings ------------------------------------------------------
    "transformers-cant-find-checkpoint-in-code-span": (
        "resume_from_checkpoint 会提示 `ValueError: Can't find a valid checkpoint at /out/checkpoint-200` 错误。\n",
        CONFIG,
        "Can't find a valid checkpoint",
    ),
    "transformers-purely-quantized-in-code-span": (
        "`ValueError: You cannot perform fine-tuning on purely quantized models. Please attach trainable adapters on "
        "top of the quantized model to correctly perform fine-tuning. Please see: "
        "https://huggingface.co/docs/transformers/peft for more details`\n",
        CONFIG,
        "purely quantized",
    ),
    # ---- CPython's keyword refusal with no frame --------------------------------------------------------------
    "kwarg-logged-by-a-ui": (
        "Initializing dreambooth training...\nException initializing accelerator: Accelerator.__init__() got an "
        "unexpected keyword argument 'project_dir'\nRestored system models.\n",
        CONFIG,
        "'project_dir'",
    ),
    "kwarg-bare-typeerror-line": (
        "TypeError: SFTTrainer.__init__() got an unexpected keyword argument 'tokenizer'\n",
        CONFIG,
        "'tokenizer'",
    ),
    "kwarg-python39-bare-name": (
        "error: __init__() got an unexpected keyword argument 'evaluation_strategy'\n",
        CONFIG,
        "evaluation_strategy",
    ),
    # ---- DeepSpeed's op builder checks, shared by every op ------------------------------------------------------
    "builder-mismatch-ds0.3-plain-exception": (
        f"Exception: {BUILDER_MISMATCH}\n",
        BUILD,
        "does not match the version torch was compiled with",
    ),
    "builder-mismatch-ds0.6-prefixed": (
        f"Exception: >- DeepSpeed Op Builder: {BUILDER_MISMATCH}\nTraceback (most recent call last):\n"
        '  File "/home/u/dolly/training/trainer.py", line 281, in train\n    trainer.train\n',
        BUILD,
        "unable to compile cuda/cpp extensions",
    ),
    "builder-mismatch-exception-class": (
        "Traceback (most recent call last):\n"
        f'  File "{SITE}/deepspeed/ops/op_builder/builder.py", line 100, in assert_no_cuda_mismatch\n'
        "    raise CUDAMismatchException(\n"
        "deepspeed.ops.op_builder.builder.CUDAMismatchException: >- DeepSpeed Op Builder: Installed CUDA version "
        "11.7 does not match the version torch was compiled with 12.1, unable to compile cuda/cpp extensions without "
        "a matching cuda version.\n",
        BUILD,
        "CUDAMismatchException",
    ),
    "builder-cuda-home-loading-a-tts-model": (
        "While I was loading the model, I encountered the following problem:\n```\n"
        f'File "{SITE}/deepspeed/ops/op_builder/builder.py", line 51, in installed_cuda_version\n'
        '    raise MissingCUDAException("CUDA_HOME does not exist, unable to compile CUDA op(s)")\n'
        "deepspeed.ops.op_builder.builder.MissingCUDAException: CUDA_HOME does not exist, unable to compile CUDA "
        "op(s)\n```\n",
        BUILD,
        "CUDA_HOME does not exist",
    ),
    "builder-cuda-home-under-the-cpu-adam-frame": (
        "Traceback (most recent call last):\n"
        f'  File "{SITE}/deepspeed/ops/adam/cpu_adam.py", line 94, in __init__\n'
        "    self.ds_opt_adam = CPUAdamBuilder().load()\n"
        f'  File "{SITE}/deepspeed/ops/op_builder/builder.py", line 51, in installed_cuda_version\n'
        '    raise MissingCUDAException("CUDA_HOME does not exist, unable to compile CUDA op(s)")\n'
        "deepspeed.ops.op_builder.builder.MissingCUDAException: CUDA_HOME does not exist, unable to compile CUDA "
        "op(s)\n",
        ("cpu-adam-build-failure",),
        "cpu_adam",
    ),
    # ---- gcc stopping on a fatal error ----------------------------------------------------------------------------
    "gcc-python-h-one-line": (
        f"{SITE}/torch/include/torch/csrc/python_headers.h:12:10: fatal error: Python.h: No such file or directory "
        "12 | #include <Python.h> |          ^~~~~~~~~~ compilation terminated.\n",
        BUILD,
        "Python.h",
    ),
    "gcc-header-then-notice-lines": (
        "csrc/flash_attn/flash_api.cpp:6:10: fatal error: cuda_runtime_api.h: No such file or directory\n"
        "    6 | #include <cuda_runtime_api.h>\n      |          ^~~~~~~~~~~~~~~~~~~~\ncompilation terminated.\n",
        BUILD,
        "cuda_runtime_api.h",
    ),
    # ---- vLLM without GPU memory for its KV cache ----------------------------------------------------------------
    "vllm-no-cache-blocks-v1-engine-core": (
        "(EngineCore_DP0 pid=38456) ERROR 03-11 11:58:53 [core.py:1100]   File "
        f'"{SITE}/vllm/v1/core/kv_cache_utils.py", line 623, in _check_enough_kv_cache_memory\n'
        "(EngineCore_DP0 pid=38456) ERROR 03-11 11:58:53 [core.py:1100]     raise ValueError(\n"
        "(EngineCore_DP0 pid=38456) ERROR 03-11 11:58:53 [core.py:1100] ValueError: No available memory for the "
        "cache blocks. Try increasing `gpu_memory_utilization` when initializing the engine.\n",
        OOM,
        "No available memory for the cache blocks",
    ),
    "vllm-0.x-logger-prefix-on-every-line": (
        "ERROR 06-30 06:10:12 worker_base.py:145] Traceback (most recent call last):\n"
        f'ERROR 06-30 06:10:12 worker_base.py:145]   File "{SITE}/vllm/worker/worker.py", line 298, in '
        "raise_if_cache_size_invalid\n"
        'ERROR 06-30 06:10:12 worker_base.py:145]     raise ValueError("No available memory for the cache blocks. "\n'
        "ERROR 06-30 06:10:12 worker_base.py:145] ValueError: No available memory for the cache blocks. Try "
        "increasing `gpu_memory_utilization` when initializing the engine.\n",
        OOM,
        ":4: ValueError: No available memory",  # the exception line itself, its prefix read off
    ),
    "vllm-no-cache-blocks-0.x-worker": (
        "Traceback (most recent call last):\n"
        f'  File "{SITE}/vllm/worker/worker.py", line 298, in raise_if_cache_size_invalid\n'
        '    raise ValueError("No available memory for the cache blocks. "\n'
        "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when "
        "initializing the engine.\n",
        OOM,
        "cache blocks",
    ),
    "vllm-v1-kv-cache-needed": (
        "ValueError: To serve at least one request with the models's max seq len (131072), (7.0 GiB KV cache is "
        "needed, which is larger than the available KV cache memory (2.39 GiB). Based on the available memory, the "
        "estimated maximum model length is 44336. Try increasing `gpu_memory_utilization` or decreasing "
        "`max_model_len` when initializing the engine.\n",
        OOM,
        "KV cache memory",
    ),
    "vllm-0.x-max-seq-len-kv-cache": (
        "ValueError: The model's max seq len (32768) is larger than the maximum number of tokens that can be stored "
        "in KV cache (20512). Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when "
        "initializing the engine.\n",
        OOM,
        "stored in KV cache",
    ),
    "vllm-v1-free-memory-on-startup": (
        "ValueError: Free memory on device (6.9/79.1 GiB) on startup is less than desired GPU memory utilization "
        "(0.9, 71.2 GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes.\n",
        OOM,
        "Free memory on device",
    ),
    # ---- bitsandbytes' library that did not load ----------------------------------------------------------------
    "bnb-0.41-run-python-m-bitsandbytes": (
        "Traceback (most recent call last):\n"
        f'  File "{SITE}/bitsandbytes/cextension.py", line 20, in <module>\n'
        "    raise RuntimeError('''\nRuntimeError: \n        CUDA Setup failed despite GPU being available. Please run "
        "the following command to get more information:\n\n        python -m bitsandbytes\n",
        ("class:import-error",),
        "bitsandbytes",
    ),
    "bnb-0.38-inspect-the-outputs": (
        "RuntimeError: \n        CUDA Setup failed despite GPU being available. Inspect the CUDA SETUP outputs above "
        "to fix your environment!\n",
        ("class:import-error",),
        "CUDA Setup failed",
    ),
    # ---- NCCL's verbs wrappers failing with an errno -------------------------------------------------------------
    "nccl-ibv-modify-qp-etimedout": (
        "(LLMRayActor pid=1112, ip=10.0.5.7) job-worker-0:1112:13532 [0] ibvwrap.c:160 NCCL WARN Call to "
        "ibv_modify_qp failed with error Connection timed out\n"
        "(LLMRayActor pid=1112, ip=10.0.5.7) ERROR 06-30 06:10:12 worker_base.py:145] Error executing method "
        "update_weight. This might cause deadlock in distributed execution.\n",
        ("class:nccl-error",),
        "ibv_modify_qp",
    ),
    "nccl-mlx5-errno-timed-out": (
        "node1:77:90 [3] NCCL WARN NET/MLX5: Call to mlx5dv_devx_obj_create failed with error Connection timed out\n",
        ("class:nccl-error",),
        "mlx5dv_devx_obj_create",
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_family_form_is_named_with_its_class(tmp_path, run_cli, name):
    text, accepted, said = CASES[name]
    top = _top(tmp_path, run_cli, text)
    assert top["id"] in accepted, (name, top["id"], top["title"])
    assert top["severity"] == "error", (name, top["severity"])
    assert said in top["title"] + top["message"], (name, top["title"], top["message"])


TORCHRUN = f"{SITE}/torch/distributed/elastic"


@pytest.mark.parametrize("sig,name", [(1, "SIGHUP"), (3, "SIGQUIT"), (15, "SIGTERM"), (2, "SIGINT")])
def test_every_death_signal_torchrun_hands_on_is_a_stop_from_outside(tmp_path, run_cli, sig, name):
    text = (
        "Train:  72%|███████▏  | 482/672 [6:32:43<2:52:41, 54.53s/it]"
        f"W0722 21:16:14.716000 3681165 {TORCHRUN}/agent/server/api.py:739] Received {sig} death signal, shutting "
        "down workers\n"
        f"W0722 21:16:14.717000 3681165 {TORCHRUN}/multiprocessing/api.py:1012] Sending process 3681211 closing "
        f"signal {name}\n"
    )
    top = _top(tmp_path, run_cli, text)
    assert top["id"] == "class:terminated", (name, top["id"], top["title"])


def test_a_nccl_watchdog_timeout_is_still_a_collective_timeout(tmp_path, run_cli):
    text = (
        "[rank1]:[E ProcessGroupNCCL.cpp:563] [Rank 1] Watchdog caught collective operation timeout: "
        "WorkNCCL(SeqNum=5, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600095 "
        "milliseconds before timing out.\n"
    )
    assert _top(tmp_path, run_cli, text)["id"] == "class:collective-timeout"


def test_a_vllm_kv_cache_refusal_is_a_device_oom():
    assert device_oom("ValueError", "No available memory for the cache blocks. Try increasing")
    assert not device_oom("ValueError", "Maximum number of blocks reached for the cache")


def test_the_quoted_exception_reader_reads_each_form_and_nothing_else():
    assert quoted_exception("x `ValueError: bad value` y") == ("ValueError", "bad value")
    # the raw line keeps a whole-line code span the reader took off the text
    raw = "`raise RuntimeError('a {}'.format( RuntimeError: Error(s) in loading state_dict for X:`"
    assert quoted_exception(raw[1:-1], raw) == ("RuntimeError", "Error(s) in loading state_dict for X:")
    assert quoted_exception("报错OSError: [Errno 28] No space left on device") == (
        "OSError",
        "[Errno 28] No space left on device",
    )
    assert quoted_exception("see the ValueError: docs") is None  # a Latin word before it, no span, no errno
    assert quoted_exception("`ValueError` is raised when") is None  # a name in a span, no message
    assert quoted_exception("the error code [Errno 2] is ENOENT") is None


NEGATIVES = {
    # a quoted exception the run went on after (advice, a handled error logged)
    "code-span-then-training": "Note: `ValueError: Can't find a valid checkpoint at /out` means no resume.\n"
    "***** Running training *****\n" + HEALTHY_END,
    "errno-logged-then-training": "warning: could not copy the tokenizer, OSError: [Errno 18] Invalid cross-device "
    "link: '/tmp/a' -> '/out/a'\n***** Running training *****\n" + HEALTHY_END,
    "kwarg-logged-then-training": "fallback: Accelerator.__init__() got an unexpected keyword argument "
    "'project_dir', retrying without it\n***** Running training *****\n" + HEALTHY_END,
    # DeepSpeed's async_io compatibility check compiles a test program against libaio and fails harmlessly
    "async-io-test-compile-then-training": "/tmp/tmpx/test.c:1:10: fatal error: libaio.h: No such file or "
    "directory\n    1 | #include <libaio.h>\ncompilation terminated.\n"
    " [WARNING]  async_io requires the dev libaio .so object and headers but these were not found.\n"
    "***** Running training *****\n" + HEALTHY_END,
    # a same-major CUDA minor mismatch is only the builder's notice
    "builder-minor-mismatch-notice": "Installed CUDA version 12.2 does not match the version torch was compiled "
    "with 12.1 but since the APIs are compatible, accepting this combination\n" + HEALTHY_END,
}


@pytest.mark.parametrize("name", sorted(NEGATIVES))
def test_lines_that_only_name_a_failure_are_no_error(tmp_path, run_cli, name):
    top = _top(tmp_path, run_cli, NEGATIVES[name])
    assert top["severity"] != "error", (name, top["id"], top["title"])


def test_a_keyword_refused_inside_a_traceback_keeps_its_frames(tmp_path, run_cli):
    # the frames say whose call it was: read as before (a crash placed by them), not as a frameless refusal
    text = (
        "Traceback (most recent call last):\n"
        '  File "/w/train.py", line 40, in <module>\n'
        "    trainer = SFTTrainer(model=model, tokenizer=tok, args=args)\n"
        "TypeError: SFTTrainer.__init__() got an unexpected keyword argument 'tokenizer'\n"
    )
    top = _top(tmp_path, run_cli, text)
    assert top["severity"] == "error" and "train.py" in top["title"] + top["message"], top


# ---- phases: the Trainer's save interval, its staging folder, a model being placed on the device ------------------
SIGKILL_TEARDOWN = (
    "[2023-10-16 05:05:57,961] [INFO] [launch.py:315:sigkill_handler] Killing subprocess 44150\n"
    "[2023-10-16 05:06:02,579] [ERROR] [launch.py:321:sigkill_handler] ['python', '-u', 'src/train_bash.py'] exits "
    "with return code = -9\n"
)


@pytest.mark.parametrize(
    "interval",
    [
        "deepspeed --num_gpus 2 src/train_bash.py \\\n    --save_steps 1000 \\\n    --fp16\n",  # a command line
        "TrainingArguments(output_dir=out, save_steps=1000, save_strategy=steps, logging_steps=10)\n",  # the repr
        '{"save_steps": 500, "logging_steps": 10}\n',  # a JSON config, 1000 a multiple of 500
        "save_steps: 1000\nlogging_steps: 10\n",  # a LLaMA-Factory YAML
    ],
)
def test_a_failure_right_at_a_save_step_is_in_the_checkpoint_save(tmp_path, run_cli, interval):
    bar = " 17%|█▋        | 1000/6060 [6:44:48<34:21:44, 24.45s/it]\n"
    assert _phase(tmp_path, run_cli, interval + bar + SIGKILL_TEARDOWN) == "checkpoint_save"


@pytest.mark.parametrize(
    "interval",
    [
        "--save_steps 1000\n",  # no save at step 999
        "--save_steps 1000 --eval_steps 500\n",  # the eval interval divides 1000: the Trainer evaluates first
        "--save_steps 0.1\n",  # a ratio of the total, no step count
    ],
)
def test_a_failure_off_the_save_step_is_not_placed_in_the_save(tmp_path, run_cli, interval):
    step = "999" if interval.startswith("--save_steps 1000\n") else "1000"
    bar = f" 17%|█▋        | {step}/6060 [6:44:48<34:21:44, 24.45s/it]\n"
    assert _phase(tmp_path, run_cli, interval + bar + SIGKILL_TEARDOWN) != "checkpoint_save"


def test_an_error_naming_the_trainers_staging_folder_is_in_the_save(tmp_path, run_cli):
    text = "FileNotFoundError: [Errno 2] No such file or directory: '/out/tmp-checkpoint-950' -> '/out/checkpoint-950'\n"
    assert _phase(tmp_path, run_cli, text) == "checkpoint_save"


def test_a_model_moved_to_the_gpu_fails_while_loading(tmp_path, run_cli):
    torch = f"{SITE}/torch/nn/modules/module.py"
    text = (
        "Traceback (most recent call last):\n"
        '  File "train_prompts.py", line 32, in main\n    actor = GPTActor().cuda()\n'
        f'  File "{torch}", line 688, in cuda\n    return self._apply(lambda t: t.cuda(device))\n'
        f'  File "{torch}", line 601, in _apply\n    param_applied = fn(param)\n'
        "RuntimeError: CUDA error: out of memory\n"
    )
    assert _phase(tmp_path, run_cli, text) == "load"
