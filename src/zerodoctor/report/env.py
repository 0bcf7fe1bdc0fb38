"""Text rendering of an Environment (what `zerodoctor env` shows above its findings)."""

from __future__ import annotations

import io
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

from zerodoctor.env.probes import TRACKED_PACKAGES

if TYPE_CHECKING:
    from zerodoctor.env.model import Environment

# The packages `env` reports by name (all others are in the JSON snapshot).
SHOWN_PACKAGES = TRACKED_PACKAGES
SHOWN_OPS = ("cpu_adam", "cpu_adagrad", "cpu_lion", "fused_adam", "async_io", "transformer_inference")


def _gib(n: int | None) -> str:
    return "?" if n is None else f"{n / 2**30:,.1f} GiB"


def environment_table(env: Environment) -> str:
    # record into a buffer: printing to stdout as well would show the table twice
    console = Console(
        width=100, no_color=True, highlight=False, file=io.StringIO(), force_terminal=False, record=True
    )
    t = Table(title=f"Environment ({env.source})", show_header=False, box=None, pad_edge=False)
    t.add_column("what", style="bold")
    t.add_column("value")
    t.add_row("python", env.python or "?")
    t.add_row("platform", env.platform or "?")
    versions = env.versions()
    for name in SHOWN_PACKAGES:
        v = versions.get(name)
        t.add_row(name, v if v else ("not installed" if v == "" else "?"))
    if env.torch is not None:
        build = (
            "CPU build"
            if env.torch.build_known and not env.torch.cuda and not env.torch.hip
            else (
                f"CUDA {env.torch.cuda}"
                if env.torch.cuda
                else (f"HIP {env.torch.hip}" if env.torch.hip else "build unknown")
            )
        )
        t.add_row("torch build", build + (f", cuDNN {env.torch.cudnn}" if env.torch.cudnn else ""))
    ds = env.deepspeed
    if ds is not None and ds.version:
        ops = []
        for op in SHOWN_OPS:
            pre = "prebuilt" if ds.op_prebuilt(op) else "jit"
            comp = ds.op_compatible(op)
            ops.append(
                f"{op}: {pre}/{'compatible' if comp else ('NOT compatible' if comp is False else '?')}"
            )
        t.add_row("deepspeed ops", "; ".join(ops))
        if ds.accelerator:
            t.add_row("deepspeed accelerator", ds.accelerator)
        if ds.probe_note:
            t.add_row("deepspeed probe", ds.probe_note)
    if env.gpus_probed:
        if env.gpus:
            for g in env.gpus:
                t.add_row(
                    f"gpu {g.index}",
                    f"{g.name}, {_gib(g.memory_total_bytes)}, driver {g.driver_version}, "
                    f"CUDA driver {g.cuda_driver_version}",
                )
        else:
            t.add_row("gpus", "none" + (f" ({env.gpu_probe_note})" if env.gpu_probe_note else ""))
    if env.host is not None:
        h = env.host
        t.add_row(
            "host RAM",
            f"{_gib(h.ram_total_bytes)} total, {_gib(h.ram_available_bytes)} available, "
            f"swap {_gib(h.swap_total_bytes)}",
        )
        t.add_row("/dev/shm", _gib(h.shm_total_bytes))
        if h.memlock_known:
            t.add_row(
                "ulimit -l",
                "unlimited" if h.memlock_soft_bytes is None else f"{h.memlock_soft_bytes / 2**20:,.0f} MiB",
            )
    if env.cuda_home or env.nvcc_version:
        t.add_row("CUDA_HOME / nvcc", f"{env.cuda_home or '?'} / {env.nvcc_version or 'not found'}")
    for k, v in sorted(env.env_vars.items()):
        t.add_row(k, v)
    for n in env.notes:
        t.add_row("note", n)
    console.print(t)
    return console.export_text()
