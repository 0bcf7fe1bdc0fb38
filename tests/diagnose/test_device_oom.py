"""A device out of memory is named on every accelerator and framework, from each one's own message text.

One line per form, as the allocator or runtime prints it (the sources are listed at extract.DEVICE_OOM); each is
put in a real run's surroundings (a training progress line before it) and must come back as the GPU OOM class,
with the numbers where the message gives them. Triton's OutOfResources is no allocation failure and must not.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from zerodoctor.diagnose import diagnose
from zerodoctor.diagnose.extract import device_oom

_TB = (
    "Traceback (most recent call last):\n"
    '  File "/opt/train.py", line 88, in <module>\n'
    "    loss.backward()\n"
)
_PROGRESS = " 12%|#2        | 120/1000 [02:00<14:40,  1.00s/it]\n"

# (name, log text after the progress line, numbers the class must carry: {field: GiB})
FORMS: list[tuple[str, str, dict[str, float]]] = [
    (
        "torch CUDA caching allocator",
        _TB + "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity "
        "of 79.15 GiB of which 1.02 GiB is free. Of the allocated memory 75.00 GiB is allocated by PyTorch, and "
        "0.50 GiB is reserved by PyTorch but unallocated.\n",
        {"tried_gib": 2.0, "free_gib": 1.02},
    ),
    (
        "ROCm (hipified allocator)",
        _TB + "torch.OutOfMemoryError: HIP out of memory. Tried to allocate 1.50 GiB. GPU 0 has a total capacity of "
        "63.98 GiB of which 0.20 GiB is free.\n",
        {"tried_gib": 1.5, "total_gib": 63.98},
    ),
    (
        "HIP runtime error",
        _TB + "RuntimeError: HIP error: out of memory\n",
        {},
    ),
    (
        "CUDA runtime error (cudaErrorMemoryAllocation)",
        _TB + "RuntimeError: CUDA error: out of memory\n",
        {},
    ),
    (
        "CUDA driver API",
        _TB + "RuntimeError: CUDA driver error: out of memory\n",
        {},
    ),
    (
        "Ascend torch_npu",
        _TB + "RuntimeError: NPU out of memory. Tried to allocate 260.00 MiB (NPU 0; 28.50 GiB total capacity; "
        "10.24 GiB already allocated; 10.24 GiB current active; 149.57 MiB free; 10.28 GiB reserved in total by "
        "PyTorch)\n",
        {"tried_gib": 0.25, "total_gib": 28.5, "gpu": 0},
    ),
    (
        "Intel XPU",
        _TB + "torch.OutOfMemoryError: XPU out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity "
        "of 11.93 GiB of which 5.62 MiB is free.\n",
        {"total_gib": 11.93},
    ),
    (
        "Apple MPS",
        _TB + "RuntimeError: MPS backend out of memory (MPS allocated: 17.21 GiB, other allocations: 1.05 GiB, max "
        "allowed: 20.13 GiB). Tried to allocate 256.00 MiB on private pool.\n",
        {"tried_gib": 0.25},
    ),
    (
        "cuBLAS handle",
        _TB + "RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`\n",
        {},
    ),
    (
        "cuDNN handle",
        _TB + "RuntimeError: cuDNN error: CUDNN_STATUS_ALLOC_FAILED\n",
        {},
    ),
    (
        "NCCL's CUDA check (WARN line)",
        "node1:1234:1300 [0] include/alloc.h:99 NCCL WARN Cuda failure 'out of memory'\n",
        {},
    ),
    (
        "NCCL's unhandled CUDA error, message on the next lines",
        _TB + "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:275, "
        "unhandled cuda error (run with NCCL_DEBUG=INFO for details), NCCL version 2.19.3\n"
        "ncclUnhandledCudaError: Call to CUDA function failed.\n"
        "Last error:\n"
        "Cuda failure 'out of memory'\n",
        {},
    ),
    (
        "PaddlePaddle 2.x allocator",
        _TB + "ResourceExhaustedError: \n\n"
        "Out of memory error on GPU 0. Cannot allocate 27.000000MB memory on GPU 0, 10.906372GB memory has been "
        "allocated and available memory is only 4.062500MB.\n",
        {"tried_gib": 27 / 1024, "gpu": 0},
    ),
    (
        "PaddlePaddle legacy glog check",
        "F0109 01:49:19.022586   845 hl_cuda_device.cc:273] Check failed: cudaSuccess == cudaStat (0 vs. 2) Cuda "
        "Error: out of memory\n"
        "*** Check failure stack trace: ***\n",
        {},
    ),
    (
        "JAX / XLA BFC allocator",
        _TB + "jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate "
        "17179869184 bytes.\n",
        {"tried_gib": 16.0},
    ),
    (
        "JAX / XLA request",
        _TB + "jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Failed to allocate request for 1.00GiB "
        "(1073741824B) on device ordinal 0\n",
        {"tried_gib": 1.0},
    ),
    (
        "TensorFlow",
        _TB + "tensorflow.python.framework.errors_impl.ResourceExhaustedError: OOM when allocating tensor with "
        "shape[32,1024,1024] and type float on /job:localhost/replica:0/task:0/device:GPU:0 by allocator GPU_0_bfc\n",
        {},
    ),
    (
        "DeepSpeed inference workspace",
        _TB + "RuntimeError: Workspace can't be allocated, no enough memory.\n",
        {},
    ),
]


@pytest.mark.parametrize(("name", "text", "numbers"), FORMS, ids=[f[0] for f in FORMS])
def test_every_device_oom_form_is_a_gpu_oom(
    tmp_path: Path, name: str, text: str, numbers: dict[str, float]
) -> None:
    log = tmp_path / "run.log"
    log.write_text(_PROGRESS + text)
    top = diagnose([str(log)]).findings[0]
    fc = top.data.get("failure_class") or {"id": top.id, **top.data}
    assert fc["id"] == "class:gpu-oom", (name, top.id, top.title)
    for key, gib in numbers.items():
        assert fc[key] == pytest.approx(gib, abs=0.01), (name, key, fc)


def test_triton_out_of_resources_is_not_a_gpu_oom(tmp_path: Path) -> None:
    """A kernel whose block needs more shared memory than the SM has: no allocation failed."""
    msg = (
        "out of resource: shared memory, Required: 98304, Hardware limit: 65536. Reducing block sizes or "
        "`num_stages` may help."
    )
    assert not device_oom("triton.runtime.errors.OutOfResources", msg)
    log = tmp_path / "run.log"
    log.write_text(_PROGRESS + _TB + f"triton.runtime.errors.OutOfResources: {msg}\n")
    top = diagnose([str(log)]).findings[0]
    assert "gpu-oom" not in top.id and (top.data.get("failure_class") or {}).get("id") != "class:gpu-oom"


def test_ray_host_memory_kill_is_not_a_device_oom() -> None:
    assert not device_oom(
        "ray.exceptions.OutOfMemoryError", "Task was killed due to the node running low on memory."
    )
