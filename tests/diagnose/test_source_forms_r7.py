"""Round 7 (issue 10): each failure class's messages, enumerated from the source that prints them.

Every case is a one-to-three-line log in the form the text really prints (after a traceback, behind a `[rankN]:`
prefix, glued to a tqdm bar), with the class and the log's own values it must be named with. Sources, by family:

- GPU OOM: c10/cuda/CUDACachingAllocator.cpp - torch 1.8-2.0 `(GPU N; X GiB total capacity; ...)`, torch 2.1.0-2.1.2
  `GPU N has a total capacty of` (misspelt), 2.2+ `total capacity of ... Including non-PyTorch memory`; HIP (the
  hipified copy), torch_npu NPUCachingAllocator.cpp, c10/xpu/XPUCachingAllocator.cpp; C10_CUDA_CHECK `CUDA error: out
  of memory` (c10/cuda/CUDAException.cpp); CublasHandlePool.cpp `CUBLAS_STATUS_ALLOC_FAILED`; NCCL's CUDACHECK
  `Cuda failure 'out of memory'` (src/include/checks.h).
- Host memory: the kernel's OOM killer (mm/oom_kill.c: `Out of memory: Kill process N (x) score S or sacrifice child`
  and `Killed process N (x) total-vm:` before 5.0, `Out of memory: Killed process N (x) total-vm:... UID:`  since,
  `oom_reaper: reaped process` since 4.6); Slurm (task/cgroup `Detected N oom-kill event(s)`, cgroup/v2 `Detected N
  oom_kill event in StepId=...`, src/common/slurm_jobacct_gather.c `exceeded memory limit (A > B), being killed`, srun
  `task N: Out Of Memory`, sacct's OUT_OF_MEMORY state); exit status 137 as kubectl, docker compose and PyCharm print
  it; torch's CPU allocator (c10/core/impl/alloc_cpu.cpp `DefaultCPUAllocator: can't allocate memory` / `not enough
  memory`), Python's MemoryError.
- Collectives: ProcessGroupNCCL.cpp (the watchdog's `Watchdog caught collective operation timeout` in torch 1.13 and
  2.4 forms, `NCCL communicator was aborted on rank R. Original reason for failure was: ...`, torch 2.2+'s heartbeat
  monitor `Heartbeat monitor timed out! Process will be terminated after dumping debug info.`); torch 1.x c10d socket
  helpers (torch/lib/c10d/Utils.cpp `connect() timed out. Original timeout was N ms.`, Utils.hpp `Socket Timeout`);
  distributed_c10d.py's store barrier; TCPStore.cpp; gloo transport/tcp/unbound_buffer.cc and pair.cc.
- NCCL errors: torch's DistBackendError / RuntimeError `NCCL error in: ..., unhandled cuda error|unhandled system
  error|internal error|invalid usage|remote process exited` and the result names NCCL prints under it
  (ncclUnhandledCudaError, ncclSystemError, ncclInternalError, ncclInvalidUsage) - cut pastes keep
  `UnhandledCudaError: Call to CUDA function failed.`
- Op builds: DeepSpeed op_builder/builder.py (MissingCUDAException `CUDA_HOME does not exist`, CUDAMismatchException
  `Installed CUDA version X does not match the version torch was compiled with Y`), torch/utils/cpp_extension.py
  (`Error compiling objects for extension`, CUDA_MISMATCH_MESSAGE below a bare `RuntimeError:`, `CUDA_HOME environment
  variable is not set`), setuptools' distutils spawn (`error: command '.../nvcc' failed with exit code 1`), pip's
  wheel builder (`Failed building wheel for X`, `Could not build wheels for X`).
- Import / version: transformers utils/versions.py require_version (`X>=V is required for a normal functioning of
  this module, but found X==W.`), importlib.metadata PackageNotFoundError, setuptools pkg_resources VersionConflict,
  a shared library dlopen cannot open (`libcudart.so.11.0: cannot open shared object file`).
- Config: DeepSpeed's pydantic models (v2 `Extra inputs are not permitted`, `Input should be ...`; v1 `extra fields not
  permitted`), TrainingArguments.__post_init__ (`Your setup doesn't support bf16/gpu.`), Trainer.__init__ (`Either set
  `args.eval_strategy` to `no` or pass an `eval_dataset`.`), PEFT's inject_adapter, TRL's trainers.
"""

from __future__ import annotations

import pytest
from test_source_forms_r6 import _top  # the top finding of `diagnose --format json` on one log

TB = 'Traceback (most recent call last):\n  File "/w/train.py", line 10, in <module>\n    main()\n'
HF_TB = (
    "Traceback (most recent call last):\n"
    '  File "/opt/conda/lib/python3.10/site-packages/transformers/trainer.py", line 1859, in train\n'
    "    return inner_training_loop(\n"
)
GPU = ("class:gpu-oom",)
HOST = ("class:host-oom-kill", "host-oom-sigkill")
COLL = ("class:collective-timeout",)
NCCL = ("class:nccl-error",)
BUILD = ("class:op-build-failure",)
IMPORT = ("class:import-error",)
CONFIG = ("class:config-rejected",)

# name -> (log text, accepted finding ids, values the class finding must carry)
CASES: dict[str, tuple[str, tuple[str, ...], dict]] = {
    # ---- GPU OOM -------------------------------------------------------------------------------------------
    "oom-torch1.8-parenthesised": (
        HF_TB
        + "RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 15.78 GiB total capacity; "
        "14.24 GiB already allocated; 1.94 MiB free; 14.40 GiB reserved in total by PyTorch)\n",
        GPU,
        {"gpu": 0, "total_gib": 15.78, "allocated_gib": 14.24},
    ),
    "oom-torch2.1-capacty": (
        HF_TB
        + "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 224.00 MiB. GPU 0 has a total "
        "capacty of 14.75 GiB of which 11.06 MiB is free. Process 3258 has 14.73 GiB memory in use. Of the allocated "
        "memory 14.04 GiB is allocated by PyTorch, and 509.85 MiB is reserved by PyTorch but unallocated.\n",
        GPU,
        {"gpu": 0, "total_gib": 14.75, "allocated_gib": 14.04},
    ),
    "oom-torch2.6-rank-prefixed": (
        '[rank3]: Traceback (most recent call last):\n[rank3]:   File "/w/train.py", line 10, in <module>\n'
        "[rank3]:     loss.backward()\n[rank3]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.95 "
        "GiB. GPU 3 has a total capacity of 23.65 GiB of which 1.23 GiB is free. Including non-PyTorch memory, this "
        "process has 22.41 GiB memory in use. Of the allocated memory 21.60 GiB is allocated by PyTorch, and 383.81 "
        "MiB is reserved by PyTorch but unallocated.\n",
        GPU,
        {"rank": 3, "gpu": 3, "tried_gib": 1.95, "total_gib": 23.65, "phase": "training_step"},
    ),
    "oom-hip": (
        "torch.OutOfMemoryError: HIP out of memory. Tried to allocate 4.00 GiB. GPU 0 has a total capacity of 191.98 "
        "GiB of which 2.11 GiB is free. Of the allocated memory 180.10 GiB is allocated by PyTorch, and 5.02 GiB is "
        "reserved by PyTorch but unallocated.\n",
        GPU,
        {"gpu": 0, "total_gib": 191.98},
    ),
    "oom-npu": (
        "RuntimeError: NPU out of memory. Tried to allocate 2.00 GiB (NPU 0; 60.97 GiB total capacity; 56.38 GiB "
        "already allocated; 56.38 GiB current active; 1.02 GiB free; 58.95 GiB reserved in total by PyTorch)\n",
        GPU,
        {"gpu": 0, "tried_gib": 2.0, "total_gib": 60.97},
    ),
    "oom-xpu": (
        "torch.OutOfMemoryError: XPU out of memory. Tried to allocate 256.00 MiB. GPU 0 has a total capacity of "
        "15.11 GiB. Of the allocated memory 14.53 GiB is allocated by PyTorch, and 128.00 MiB is reserved by PyTorch "
        "but unallocated.\n",
        GPU,
        {"total_gib": 15.11, "allocated_gib": 14.53},
    ),
    "oom-cuda-error": (
        HF_TB
        + "RuntimeError: CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported at "
        "some other API call, so the stacktrace below might be incorrect.\n",
        GPU,
        {},
    ),
    "oom-cublas-handle": (
        HF_TB + "RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`\n",
        GPU,
        {},
    ),
    "oom-glued-to-tqdm": (
        " 12%|█▏        | 120/1000 [01:02<07:40,  1.91it/s]torch.cuda.OutOfMemoryError: CUDA out of memory. Tried "
        "to allocate 500.00 MiB. GPU 1 has a total capacity of 79.15 GiB of which 12.25 MiB is free.\n",
        GPU,
        {"gpu": 1, "total_gib": 79.15},
    ),
    "oom-nccl-cuda-failure": (
        "node1:1234:1290 [0] include/alloc.h:48 NCCL WARN Cuda failure 'out of memory'\n"
        + TB
        + "torch.distributed."
        "DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1691, unhandled cuda "
        "error (run with NCCL_DEBUG=INFO for details), NCCL version 2.19.3\nncclUnhandledCudaError: Call to CUDA "
        "function failed.\nLast error:\nCuda failure 'out of memory'\n",
        GPU,
        {},
    ),
    # ---- host memory ---------------------------------------------------------------------------------------
    "kernel-before-5.0-two-lines": (
        "[1234567.123] Out of memory: Kill process 23456 (python) score 912 or sacrifice child\n"
        "[1234567.124] Killed process 23456 (python) total-vm:123456789kB, anon-rss:98765432kB, file-rss:0kB, "
        "shmem-rss:0kB\n",
        HOST,
        {"killed_pid": 23456, "anon_rss_gib": 94.19},
    ),
    "kernel-rhel7-uid": (
        "Mar 14 16:55:03 node1 kernel: Killed process 21945 (python), UID 1000, total-vm:33027492kB, "
        "anon-rss:31303276kB, file-rss:0kB, shmem-rss:0kB\n",
        HOST,
        {"killed_pid": 21945},
    ),
    "kernel-oom-reaper-only": (
        "[ 9876.6] oom_reaper: reaped process 4242 (python3), now anon-rss:0kB, file-rss:0kB, shmem-rss:0kB\n",
        HOST,
        {},
    ),
    "slurm-cgroup-v1": (
        "slurmstepd: error: Detected 1 oom-kill event(s) in StepId=123456.0. Some of your processes may have been "
        "killed by the cgroup out-of-memory handler.\n",
        HOST,
        {},
    ),
    "slurm-cgroup-v2": (
        "[2024-09-14T17:14:38.784] error: Detected 1 oom_kill event in StepId=22035606.1. Some of the step tasks "
        "have been OOM Killed.\nsrun: error: nid005475: tasks 0-2,5,7: Terminated\n",
        HOST,
        {},
    ),
    "srun-task-out-of-memory": (
        "{'loss': 1.2, 'epoch': 0.3}\nsrun: error: node12: task 3: Out Of Memory\n",
        HOST,
        {"rank": 3, "phase": "training_step"},
    ),
    "slurm-jobacct-limit": (
        "slurmstepd: error: StepId=7.batch exceeded memory limit (734003200 > 52428800), being killed\n",
        HOST,
        {},
    ),
    "sacct-state": (
        "       JobID    JobName      State ExitCode\n------------ ---------- ---------- --------\n"
        "123456        train.sh OUT_OF_ME+    0:125\n",
        HOST,
        {},
    ),
    "kubectl-137": (
        "{'loss': 1.2, 'epoch': 0.3}\ncommand terminated with exit code 137\n",
        HOST,
        {"exit_code": 137},
    ),
    "pycharm-137": (
        "{'loss': 1.2, 'epoch': 0.3}\n\nProcess finished with exit code 137 (interrupted by signal 9: SIGKILL)\n",
        HOST,
        {"exit_code": 137},
    ),
    "compose-137": ("trainer-1 exited with code 137\n", HOST, {"exit_code": 137}),
    "cpu-allocator-posix": (
        TB
        + "RuntimeError: [enforce fail at alloc_cpu.cpp:117] err == 0. DefaultCPUAllocator: can't allocate "
        "memory: you tried to allocate 34359738368 bytes. Error code 12 (Cannot allocate memory)\n",
        HOST,
        {"tried_gib": 32.0},
    ),
    "cpu-allocator-other": (
        TB
        + "RuntimeError: [enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: not enough memory: you "
        "tried to allocate 11141120 bytes.\n",
        HOST,
        {"tried_gib": 0.01},
    ),
    "python-memoryerror": (TB + "MemoryError\n", HOST, {}),
    "errno-12-enomem": (TB + "OSError: [Errno 12] Cannot allocate memory\n", HOST, {}),
    "torch-shared-mmap-enomem": (
        TB
        + "RuntimeError: unable to mmap 1048576 bytes from file </torch_1234_5678_0>: Cannot allocate memory (12)\n",
        HOST,
        {"tried_gib": 0.0},
    ),
    # ---- collectives ----------------------------------------------------------------------------------------
    "watchdog-torch1.13": (
        "[E ProcessGroupNCCL.cpp:821] [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=12345, "
        "OpType=ALLREDUCE, Timeout(ms)=1800000) ran for 1800520 milliseconds before timing out.\n",
        COLL,
        {"ranks": [1], "collective": "ALLREDUCE", "timeout_ms": 1800000},
    ),
    "watchdog-torch2.4": (
        "[rank1]:[E1015 10:00:00.123456 140 torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:616] [Rank 1] Watchdog "
        "caught collective operation timeout: WorkNCCL(SeqNum=57, OpType=_ALLGATHER_BASE, NumelIn=1024, "
        "NumelOut=8192, Timeout(ms)=600000) ran for 600045 milliseconds before timing out.\n",
        COLL,
        {"ranks": [1], "collective": "_ALLGATHER_BASE", "timeout_ms": 600000},
    ),
    "communicator-aborted-after-timeout": (
        TB
        + "RuntimeError: NCCL communicator was aborted on rank 3.  Original reason for failure was: [Rank 3] "
        "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=9, OpType=BROADCAST, Timeout(ms)=1800000) "
        "ran for 1800333 milliseconds before timing out.\n",
        COLL,
        {"collective": "BROADCAST", "timeout_ms": 1800000},
    ),
    "heartbeat-monitor": (
        "[rank25]:[E ProcessGroupNCCL.cpp:1316] [PG 0 Rank 25] Heartbeat monitor timed out! Process will be "
        "terminated after dumping debug info. workMetaList_.size()=2\n",
        COLL,
        {"ranks": [25]},
    ),
    "c10d-connect-timed-out-torch1": (
        TB + "RuntimeError: connect() timed out. Original timeout was 1800000 ms.\n",
        COLL,
        {"setup": True},
    ),
    "c10d-socket-timeout-torch1": (TB + "RuntimeError: Socket Timeout\n", COLL, {"setup": True}),
    "store-based-barrier": (
        TB + "RuntimeError: Timed out initializing process group in store based barrier on rank: 3, for key: "
        "store_based_barrier_key:1 (world_size=4, worker_count=2, timeout=0:30:00)\n",
        COLL,
        {"setup": True, "world_size": 4, "joined": 2},
    ),
    "gloo-recv-timeout": (
        TB + "RuntimeError: [../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting "
        "1800000ms for recv operation to complete\n",
        COLL,
        {"setup": False},
    ),
    "uniqueid-store-wait-timeout": (
        "[rank1]: torch.distributed.DistBackendError: [1] is setting up NCCL communicator and retrieving "
        "ncclUniqueId from [0] via c10d key-value store by key '0', but store->get('0') got error: wait timeout "
        "after 600000ms, keys: /default_pg/0//cuda//0\n",
        COLL,
        {"setup": True, "rank": 1},
    ),
    "monitored-barrier-stragglers": (
        TB + "RuntimeError: [Rank 0]: Ranks 1, 3 failed to pass monitoredBarrier in 1800000 ms\n",
        COLL,
        {"silent_ranks": [1, 3], "timeout_ms": 1800000},
    ),
    "collective-fingerprint-mismatch": (
        TB + "RuntimeError: Detected mismatch between collectives on ranks. Rank 0 is running collective: "
        "CollectiveFingerPrint(SequenceNumber=12, OpType=ALLREDUCE, TensorShape=[1024], TensorDtypes=Float, "
        "TensorDeviceTypes=TensorOptions(dtype=float (default), device=cuda, layout=Strided (default), "
        "requires_grad=false (default), pinned_memory=false (default), memory_format=(nullopt))), but Rank 1 is "
        "running collective: CollectiveFingerPrint(SequenceNumber=12, OpType=BROADCAST).\n",
        COLL,
        {"ranks": [0, 1], "collective": "ALLREDUCE", "other_collective": "BROADCAST"},
    ),
    # ---- NCCL / communication errors ---------------------------------------------------------------------
    "gloo-peer-closed": (
        TB
        + "RuntimeError: [/opt/conda/conda-bld/pytorch_1/work/third_party/gloo/gloo/transport/tcp/pair.cc:598] "
        "Connection closed by peer [10.0.0.2]:25931\n",
        NCCL,
        {"backend": "gloo"},
    ),
    "distbackend-unhandled-cuda-cut": (
        "torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL."
        "cpp:3699, unhandled cuda error (run with NCCL_DEBUG=INFO for details), NCCL version 2.27.3\n--\n"
        "UnhandledCudaError: Call to CUDA function failed.\n",
        NCCL,
        {"line_no": 1},
    ),
    "nccl-internal": (
        TB
        + "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:275, "
        "internal error - please report this issue to the NCCL developers, NCCL version 2.18.1\nncclInternalError: "
        "Internal check failed.\n",
        NCCL,
        {},
    ),
    "nccl-invalid-usage-rank-prefixed": (
        '[rank1]: Traceback (most recent call last):\n[rank1]:   File "/w/train.py", line 5, in <module>\n'
        "[rank1]:     dist.barrier()\n[rank1]: torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/"
        "distributed/c10d/ProcessGroupNCCL.cpp:1691, invalid usage (run with NCCL_DEBUG=WARN for details), NCCL "
        "version 2.19.3\n[rank1]: ncclInvalidUsage: This usually reflects invalid usage of NCCL library.\n",
        NCCL,
        {"ranks": [1]},
    ),
    "nccl-torch1.7-system-error": (
        TB
        + "RuntimeError: NCCL error in: /pytorch/torch/lib/c10d/ProcessGroupNCCL.cpp:784, unhandled system "
        "error, NCCL version 2.7.8\n",
        NCCL,
        {},
    ),
    "nccl-torch1.0-error-2": (TB + "RuntimeError: NCCL Error 2: unhandled system error\n", NCCL, {}),
    # ---- op builds -----------------------------------------------------------------------------------------
    "torch-error-compiling-objects": (
        TB + "RuntimeError: Error compiling objects for extension\n",
        BUILD,
        {},
    ),
    "torch-cuda-mismatch-below-bare-runtimeerror": (
        TB
        + "RuntimeError: \nThe detected CUDA version (11.8) mismatches the version that was used to compile\n"
        "PyTorch (12.1). Please make sure to use the same CUDA versions.\n",
        BUILD,
        {"message_has": "(11.8)"},
    ),
    "torch-ninja-missing": (TB + "RuntimeError: Ninja is required to load C++ extensions\n", BUILD, {}),
    "bitsandbytes-cuda-setup-below-bare-runtimeerror": (
        TB
        + "RuntimeError: \n        CUDA Setup failed despite GPU being available. Please run the following "
        "command to get more information:\n\n        python -m bitsandbytes\n",
        ("class:import-error",),  # (round 9: its library failed to load at import, no compiler ran)
        {"message_has": "CUDA Setup failed"},
    ),
    "setuptools-nvcc-exit": (
        "error: command '/usr/local/cuda/bin/nvcc' failed with exit code 1\n",
        BUILD,
        {},
    ),
    "pip-wheel-flash-attn": (
        "  Building wheel for flash-attn (setup.py) ... error\n  error: subprocess-exited-with-error\n"
        "  error: command '/usr/bin/g++' failed with exit status 1\n  ERROR: Failed building wheel for flash-attn\n",
        BUILD,
        {"package": "flash-attn"},
    ),
    "ds-cuda-home": (
        TB
        + "deepspeed.ops.op_builder.builder.MissingCUDAException: CUDA_HOME does not exist, unable to compile "
        "CUDA op(s)\n",
        (*BUILD, "cpu-adam-build-failure"),
        {},
    ),
    # ---- imports / versions ------------------------------------------------------------------------------
    "shared-object-missing": (
        TB + "OSError: libcudart.so.11.0: cannot open shared object file: No such file or directory\n",
        IMPORT,
        {"missing": "libcudart.so.11.0"},
    ),
    "package-metadata-missing": (
        TB + "importlib.metadata.PackageNotFoundError: No package metadata was found for bitsandbytes\n",
        IMPORT,
        {"missing": "bitsandbytes"},
    ),
    "pkg-resources-version-conflict": (
        TB + "pkg_resources.VersionConflict: (tokenizers 0.14.1 (/x/site-packages), "
        "Requirement.parse('tokenizers<0.14,>=0.11.1'))\n",
        IMPORT,
        {"missing": "tokenizers<0.14,>=0.11.1"},
    ),
    "require-version-tokenizers": (
        TB
        + "ImportError: tokenizers>=0.11.1,!=0.11.3,<0.14 is required for a normal functioning of this module, "
        "but found tokenizers==0.14.1.\n",
        IMPORT,
        {"missing": "tokenizers>=0.11.1,!=0.11.3,<0.14", "found": "tokenizers==0.14.1"},
    ),
    # ---- configs -------------------------------------------------------------------------------------------
    "hf-bf16-unsupported-frameless": (
        "ValueError: Your setup doesn't support bf16/gpu. You need torch>=1.10, using Ampere GPU with cuda>=11.0\n",
        CONFIG,
        {},
    ),
    "trainer-eval-strategy-without-dataset": (
        "ValueError: You have set `args.eval_strategy` to steps but you didn't pass an `eval_dataset` to `Trainer`. "
        "Either set `args.eval_strategy` to `no` or pass an `eval_dataset`. \n",
        CONFIG,
        {"keys_has": "args.eval_strategy"},
    ),
    "hf-argparser-unused-arguments": (
        TB
        + '  File "/x/site-packages/transformers/hf_argparser.py", line 348, in parse_args_into_dataclasses\n'
        '    raise ValueError(f"Some specified arguments are not used by the HfArgumentParser: {remaining_args}")\n'
        "ValueError: Some specified arguments are not used by the HfArgumentParser: ['--lora_rank', '8']\n",
        CONFIG,
        {"keys_has": "lora_rank"},
    ),
    "argparse-unrecognized-local-rank": (
        "usage: train.py [-h] [--local_rank LOCAL_RANK]\ntrain.py: error: unrecognized arguments: --local-rank=0\n",
        CONFIG,
        {"keys_has": "--local-rank", "program": "train.py"},
    ),
    "argparse-required": (
        "usage: train.py [-h] --model_name_or_path MODEL_NAME_OR_PATH\ntrain.py: error: the following arguments "
        "are required: --model_name_or_path\n",
        CONFIG,
        {"keys_has": "--model_name_or_path"},
    ),
    "argparse-invalid-value": (
        "usage: train.py [-h] [--epochs EPOCHS]\ntrain.py: error: argument --epochs: invalid int value: 'three'\n",
        CONFIG,
        {"keys_has": "--epochs"},
    ),
    "accelerate-launch-argparse": (
        "accelerate <command> [<args>] launch: error: unrecognized arguments: --zero_stage 3\n",
        CONFIG,
        {"keys_has": "--zero_stage"},
    ),
    "ds-duplicate-keys-script-frame-only": (
        TB + "ValueError: Duplicate keys in DeepSpeed config: ['fp16']\n",
        CONFIG,
        {"keys_has": "fp16"},
    ),
    "ds-pydantic-v2-extra": (
        "pydantic_core._pydantic_core.ValidationError: 1 validation error for DeepSpeedZeroConfig\n"
        "offload_optimizer.pin_memroy\n  Extra inputs are not permitted [type=extra_forbidden, input_value=True, "
        "input_type=bool]\n",
        CONFIG,
        {},
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_source_form_is_named_with_its_class_and_values(tmp_path, run_cli, name):
    text, accepted, values = CASES[name]
    top = _top(tmp_path, run_cli, text)
    assert top["id"] in accepted, (name, top["id"], top["title"])
    assert top["severity"] == "error", (name, top["severity"])
    if not top["id"].startswith("class:"):
        return
    fc = top["data"]["failure_class"]
    for key, want in values.items():
        if key == "line_no":
            assert fc["line"].endswith(f":{want}"), (name, fc["line"])
        elif key == "message_has":
            assert want in top["message"], (name, top["message"])
        elif key == "keys_has":
            assert want in fc.get("keys", []), (name, fc.get("keys"))
        elif key == "rank" and "rank" not in fc:
            assert top["data"]["first_failure"]["rank"] == want, (name, top["data"]["first_failure"])
        else:
            assert fc.get(key) == want, (name, key, fc.get(key), want)


def test_the_launchers_rank_flag_refused_gets_its_own_fix(tmp_path, run_cli):
    top = _top(tmp_path, run_cli, CASES["argparse-unrecognized-local-rank"][0])
    assert "--local-rank', '--local_rank'" in top["fixes"][0], top["fixes"]


def test_a_srun_task_report_names_the_task_as_the_rank(tmp_path, run_cli):
    top = _top(tmp_path, run_cli, CASES["srun-task-out-of-memory"][0])
    assert top["data"]["first_failure"]["rank"] == 3


def test_a_version_requirement_is_titled_as_one(tmp_path, run_cli):
    top = _top(tmp_path, run_cli, CASES["require-version-tokenizers"][0])
    assert top["title"].startswith("Version requirement not met: tokenizers>=0.11.1"), top["title"]


def test_a_gloo_peer_closing_is_named_for_gloo_not_nccl(tmp_path, run_cli):
    top = _top(tmp_path, run_cli, CASES["gloo-peer-closed"][0])
    assert "gloo" in top["title"] and "NCCL" not in top["title"], top["title"]


def test_a_cpp_exception_keeps_its_namespace(tmp_path, run_cli):
    # ProcessGroupNCCL's watchdog ending on a CUDA fault it surfaced (`... terminated with exception: ` + e.what())
    text = (
        "[rank0]:[E ProcessGroupNCCL.cpp:1316] [PG 0 Rank 0] Process group watchdog thread terminated with "
        "exception: CUDA error: an illegal memory access was encountered\n"
    )
    top = _top(tmp_path, run_cli, text)
    assert top["data"]["failure_class"]["exception"] == "c10::Error", top["data"]["failure_class"]


# Lines that name a failure's words without one happening: prose, warnings, healthy runs' own lines.
HEALTHY_END = "{'loss': 1.2, 'epoch': 0.5}\n{'train_runtime': 100.0, 'train_loss': 1.1, 'epoch': 1.0}\n"
NEGATIVES = {
    "cpu-adam-warning": "[WARNING]  cpu_adam cuda is missing or is incompatible with installed torch, only cpu ops "
    "can be compiled!\n" + HEALTHY_END,
    "exit-137-in-prose": "Note: exit code 137 usually means the OOM killer.\n" + HEALTHY_END,
    "pycharm-exit-0": "Process finished with exit code 0\n",
    "compose-exit-0": "trainer-1 exited with code 0\n",
    # pip < 23 installs with `setup.py install` after a failed wheel build
    "pip-wheel-then-installed": "  ERROR: Failed building wheel for flash-attn\n  Running setup.py install for "
    "flash-attn ... done\nSuccessfully installed flash-attn-2.5.6\n" + HEALTHY_END,
    "slurm-debug-count-zero": "slurmstepd: debug:  task_g_post_term: oom_kill event count: 0\n" + HEALTHY_END,
    "store-barrier-waiting-then-completed": "INFO:torch.distributed.distributed_c10d:Waiting in store based barrier "
    "to initialize process group for rank: 0, key: store_based_barrier_key:1 (world_size=2, worker_count=1, "
    "timeout=0:30:00)\nINFO:torch.distributed.distributed_c10d:Rank 0: Completed store-based barrier for "
    "key:store_based_barrier_key:1 with 2 nodes.\n" + HEALTHY_END,
    "nccl-info-lines": "node1:1:1 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.1<0>\nnode1:1:1 [0] NCCL INFO comm "
    "0x1 rank 0 nranks 2 cudaDev 0 busId 1000 - Init COMPLETE\n" + HEALTHY_END,
    # advice quoting the OOM message in a run that finished
    "oom-quoted-in-advice": "If you see `CUDA out of memory`, lower the batch size.\n" + HEALTHY_END,
    "oom-reaper-in-prose": "The kernel log had no oom_reaper lines; training finished.\n" + HEALTHY_END,
    # a script of several commands that goes on after one was refused
    "argparse-then-training": "eval.py: error: unrecognized arguments: --fast\n***** Running training *****\n"
    + HEALTHY_END,
    # torch's warning for a CUDA minor version apart (cpp_extension.py _check_cuda_version), a build that goes on
    "cuda-minor-mismatch-warning": "/x/site-packages/torch/utils/cpp_extension.py:424: UserWarning: The detected "
    "CUDA version (12.1) has a minor version mismatch with the version that was used to compile PyTorch (12.4). "
    "Most likely this shouldn't be a problem.\n" + HEALTHY_END,
    "version-word-in-prose": "Requirement already satisfied: tokenizers>=0.11.1 in /x/site-packages (0.13.3)\n"
    + HEALTHY_END,
}


@pytest.mark.parametrize("name", sorted(NEGATIVES))
def test_lines_that_only_name_a_failure_are_no_error(tmp_path, run_cli, name):
    top = _top(tmp_path, run_cli, NEGATIVES[name])
    assert top["severity"] != "error", (name, top["id"], top["title"])


def test_a_logged_oom_in_a_run_that_did_not_finish_is_still_a_failure(tmp_path, run_cli):
    # the rule above needs the run's own end after the line: a bare logged OOM that ends the log stays one
    top = _top(
        tmp_path, run_cli, "{'loss': 1.2, 'epoch': 0.5}\nCUDA out of memory. Tried to allocate 2.00 GiB\n"
    )
    assert top["id"] == "class:gpu-oom", top["id"]


def test_triton_out_of_resources_is_no_device_oom(tmp_path, run_cli):
    # triton/runtime/errors.py OutOfResources: a kernel's block size exceeds the SM's shared memory, nothing allocated
    text = TB + (
        "triton.runtime.errors.OutOfResources: out of resource: shared memory, Required: 98304, Hardware limit: "
        "65536. Reducing block sizes or `num_stages` may help.\n"
    )
    top = _top(tmp_path, run_cli, text)
    assert top["id"] not in GPU, top["id"]


# A log that stops right after the distributed set-up (DeepSpeed's comm/comm.py `Initializing TorchBackend in
# DeepSpeed with backend nccl`, NCCL's init.cc `... - Init COMPLETE`): nothing failed in it, and the answer says what
# that proves (no error, nothing after the set-up) and what not (a hang: a paste can end there too).
INIT_ONLY = (
    "[2024-01-01 10:00:00,000] [INFO] [comm.py:637:init_distributed] Initializing TorchBackend in DeepSpeed with "
    "backend nccl\nnode1:11:11 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.1<0>\n"
    "node1:11:40 [0] NCCL INFO comm 0x5613 rank 0 nranks 16 cudaDev 0 busId 1000 - Init COMPLETE\n"
)


def test_a_log_ending_right_after_the_distributed_set_up_says_so_without_claiming_a_hang(tmp_path, run_cli):
    top = _top(tmp_path, run_cli, INIT_ONLY)
    assert top["id"] == "no-known-failure" and top["severity"] == "info", top
    assert "ends right after the distributed set-up" in top["title"], top["title"]
    assert "does not prove" in top["message"] and "Init COMPLETE" in top["message"], top["message"]
    assert top["data"]["ends_after_init"].endswith(":3"), top["data"]


def test_a_set_up_followed_by_training_is_not_reported_as_ending_there(tmp_path, run_cli):
    top = _top(tmp_path, run_cli, INIT_ONLY + "  5%|▌         | 5/100 [00:10<03:10,  2.00s/it]\n")
    assert "ends_after_init" not in (top.get("data") or {}), top


# The same texts as they reach a log: behind pdsh's host, torchrun's `[rankN]:` / `--tee`'s `[defaultN]:`, glued behind
# a tqdm bar, in a journal line, inside Markdown emphasis.
AS_PRINTED = {
    "pdsh-kernel-before-5.0": (
        "node3: [1234567.123] Out of memory: Kill process 23456 (python) score 912 or sacrifice child\n",
        HOST,
    ),
    "journal-oom-reaper": (
        "Mar 27 01:15:36 ip-10-0-1-103 kernel: oom_reaper: reaped process 16883 (python), now anon-rss:0kB, "
        "file-rss:1240kB, shmem-rss:0kB\n",
        HOST,
    ),
    "tee-monitored-barrier": (
        "[default0]:RuntimeError: [Rank 0]: Rank 1 failed to pass monitoredBarrier in 2000 ms\n",
        COLL,
    ),
    "rank-connect-timed-out": (
        "[rank3]: RuntimeError: connect() timed out. Original timeout was 1800000 ms.\n",
        COLL,
    ),
    "heartbeat-behind-tqdm": (
        " 45%|████▌     | 450/1000 [10:00<12:00,  1.31s/it][rank0]:[E1015 10:00:00.000000 140 ProcessGroupNCCL.cpp:"
        "1306] [PG 0 (default_pg) Rank 0] Heartbeat monitor timed out! Process will be terminated after dumping debug "
        "info. workMetaList_.size()=1\n",
        COLL,
    ),
    "pdsh-pip-wheel": ("node1: ERROR: Failed building wheel for apex\n", BUILD),
    "rank-enomem": ("[rank1]: OSError: [Errno 12] Cannot allocate memory\n", HOST),
    "tee-argparse": (
        "[default1]:usage: train.py [-h] [--local_rank LOCAL_RANK]\n[default1]:train.py: error: unrecognized "
        "arguments: --local-rank=1\n",
        CONFIG,
    ),
    "markdown-slurm-v2": (
        "**slurmstepd: error: Detected 1 oom_kill event in StepId=1054.0. Some of the step tasks have been OOM "
        "Killed.**\n",
        HOST,
    ),
}


@pytest.mark.parametrize("name", sorted(AS_PRINTED))
def test_the_forms_as_they_reach_a_log(tmp_path, run_cli, name):
    text, accepted = AS_PRINTED[name]
    top = _top(tmp_path, run_cli, text)
    assert top["id"] in accepted and top["severity"] == "error", (name, top["id"], top["title"])


# bitsandbytes' kernels check CUDA calls with the CUDA_CHECK_RETURN macro of NVIDIA's samples (csrc/ops.cuh:
# `Error %s at line %d in file %s` with cudaGetErrorString, then exit(1)): out of memory is a GPU OOM, `named symbol
# not found` a binary built for another CUDA than the one it runs on.
def test_bitsandbytes_cuda_check_return_out_of_memory_is_a_gpu_oom(tmp_path, run_cli):
    text = "{'loss': 1.1, 'epoch': 0.2}\nError out of memory at line 74 in file /x/bitsandbytes/csrc/ops.cu\n"
    top = _top(tmp_path, run_cli, text)
    assert top["id"] == "class:gpu-oom" and top["data"]["phase"] == "training_step", top


def test_bitsandbytes_named_symbol_not_found_is_a_native_library_that_did_not_load(tmp_path, run_cli):
    text = "Error named symbol not found at line 74 in file /x/bitsandbytes/csrc/ops.cu\n"
    top = _top(tmp_path, run_cli, text)
    assert top["id"] == "class:op-build-failure", top["id"]


# TRL's constructors and configs (and the libraries' own) refusing a setting, pasted as the one exception line (trl/trainer/*_trainer.py
# __init__ and *_config.py __post_init__ at v1.9.0; with their frames pasted, the frame judges them already). The whole
# set was swept: 94 of its 122 ValueError/TypeError/NotImplementedError messages come back as config refusals pasted
# alone (61 before); the rest name no setting (`Entropy bonus is not supported with Liger kernel.`) or are TypeErrors.
TRL_REFUSALS = {
    "dpo_trainer.py:543": "ValueError: `train_dataset` is required\n",
    "dpo_trainer.py:585": "ValueError: `model` and `ref_model` cannot be the same object. In most cases you should omit "
    "`ref_model` and we'll initialize it to a copy of `model` for you.\n",
    "dpo_config.py:347": "ValueError: `loss_weights` must have the same length as `loss_type` when combining multiple "
    "losses. Got 2 weights for 3 loss types.\n",
    "grpo_config.py:1093": "ValueError: 'generation_batch_size' and 'steps_per_generation' can not be both configured "
    "at the same time\n",
    "grpo_config.py:1117": "ValueError: GRPO requires at least 2 generations per prompt to calculate the advantages. "
    "You provided 1, which is less than the minimum required.\n",
    "grpo_trainer.py:1153": "ValueError: You passed `sync_ref_model=True` while using a PEFT model, which is currently "
    "not supported. With PEFT, GRPOTrainer does not keep a separate reference model in memory.\n",
    "kto_trainer.py:968": "ValueError: You cannot use `sync_ref_model=True` together with "
    "`precompute_ref_log_probs=True`.\n",
    # (the same words in transformers' TrainingArguments.__post_init__, accelerate's Accelerator.__init__ and PEFT's
    # LoraConfig.__post_init__ at the installed 5.23.0 / 1.15.0 / 0.21.2)
    "transformers/training_args.py": "ValueError: At most one of fp16 and bf16 can be True, but not both\n",
    "accelerate/accelerator.py": "ValueError: You can only pass one of `gradient_accumulation_steps` and "
    "`gradient_accumulation_plugin`. Please only pass in the created `GradientAccumulationPlugin` object.\n",
    "peft/tuners/lora/config.py": "ValueError: When `layers_pattern` is specified, `layers_to_transform` must also be "
    "specified.\n",
    "grpo_config.py:1060": "ValueError: log_completions_hub_repo is set, but log_completions is False. Enable "
    "log_completions to upload completions to the Hub, or unset log_completions_hub_repo.\n",
}


@pytest.mark.parametrize("site", sorted(TRL_REFUSALS))
def test_trl_refusals_pasted_alone_are_config_refusals(tmp_path, run_cli, site):
    top = _top(tmp_path, run_cli, TRL_REFUSALS[site])
    assert top["id"] == "class:config-rejected", (site, top["id"])


# Frameless ValueErrors that refuse nothing: they stay crashes
NOT_REFUSALS = {
    "unpack": "ValueError: not enough values to unpack (expected 2, got 1)\n",
    "tokenizer-class": "ValueError: Tokenizer class LlamaTokenizer does not exist or is not currently imported.\n",
    "tensor-create": "ValueError: Unable to create tensor, you should probably activate truncation and/or padding "
    "with 'padding=True' 'truncation=True' to have batched tensors with the same length.\n",
}


@pytest.mark.parametrize("name", sorted(NOT_REFUSALS))
def test_frameless_errors_that_refuse_no_setting_stay_crashes(tmp_path, run_cli, name):
    top = _top(tmp_path, run_cli, NOT_REFUSALS[name])
    assert top["id"] != "class:config-rejected", (name, top["id"])
