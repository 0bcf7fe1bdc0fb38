"""`collect()`: the live probe of this machine, assembled from the probes in `env/probes.py`.

Collect only: nothing here judges or prints. Every probe that cannot answer leaves a note in
`Environment.notes`, so the report can say what was not checked and why.
"""

from __future__ import annotations

import platform
import sys

from zerodoctor.env import probes
from zerodoctor.env.model import Environment, GpuInfo


def collect(deep: bool = True, deep_timeout_s: float = probes.DEEP_PROBE_TIMEOUT_S) -> Environment:
    """Probe this machine and Python stack.

    `deep=True` (the CLI default) also runs the DeepSpeed ops subprocess (imports torch and deepspeed there,
    a few seconds, up to `deep_timeout_s`), which is what tells whether ops such as cpu_adam can be
    JIT-built here. With `deep=False` nothing is imported or executed except `nvcc --version`.
    """
    notes: list[str] = []

    def note(text: str | None) -> None:
        if text:
            notes.append(text)

    packages, n = probes.safe(probes.probe_packages, "installed packages")
    note(n)
    packages = packages or {}

    torch_result, n = probes.safe(lambda: probes.probe_torch(packages), "torch's build")
    note(n)
    torch, n = torch_result if torch_result else (None, None)
    note(n)

    ds_result, n = probes.safe(lambda: probes.probe_deepspeed_installed(packages), "DeepSpeed's prebuilt ops")
    note(n)
    ds, n = ds_result if ds_result else (None, None)
    note(n)
    if deep and ds is not None:
        deep_result, failure, crashed = probes.run_deep_probe(deep_timeout_s)
        ds = probes.merge_deep_probe(ds, ds.version, deep_result, failure, crashed)
        note(failure)
    elif ds is not None and not ds.compatible_ops:
        note(
            "DeepSpeed ops compatibility not checked (deep probe off); run `zerodoctor env` without --no-deep"
        )

    gpu_result, n = probes.safe(probes.probe_gpus, "GPUs")
    gpus: list[GpuInfo]
    if gpu_result is None:
        gpus, gpus_probed, gpu_note = [], False, n
        note(n)
    else:
        gpus, gpus_probed, gpu_note = gpu_result
        if not gpus_probed:
            note(gpu_note)  # "could not check"; a probed "no GPU" is an answer, not a note
    if torch is not None and torch.hip and not gpus:
        # NVML only sees NVIDIA GPUs; with a ROCm torch an empty list says nothing.
        gpus_probed = False
        gpu_note = (gpu_note or "") + " (this torch is a ROCm build; AMD GPUs are not counted by NVML)"

    host_result, n = probes.safe(probes.probe_host, "host memory")
    note(n)
    host = None
    if host_result:
        host, host_notes = host_result
        notes.extend(host_notes)

    cuda_home, n = probes.safe(probes.find_cuda_home, "CUDA_HOME")
    note(n)
    nvcc_result, n = probes.safe(lambda: probes.probe_nvcc(cuda_home), "nvcc")
    note(n)
    nvcc_version, n = nvcc_result if nvcc_result else (None, None)
    note(n)

    env_vars, n = probes.safe(probes.probe_env_vars, "environment variables")
    note(n)

    return Environment(
        python=platform.python_version(),
        platform=f"{platform.system()} {platform.release()} {platform.machine()}".strip() or sys.platform,
        packages=packages,
        packages_complete=bool(packages),
        torch=torch,
        deepspeed=ds,
        gpus=list(gpus),
        gpus_probed=gpus_probed,
        gpu_probe_note=gpu_note,
        host=host,
        cuda_home=cuda_home,
        nvcc_version=nvcc_version,
        env_vars=env_vars or {},
        source="live",
        notes=notes,
    )
