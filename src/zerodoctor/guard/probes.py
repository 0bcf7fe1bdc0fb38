"""Cheap per-step probes of GPU and host memory. Each returns a flat dict of numbers; a probe that cannot
measure (no CUDA, no cgroup v2, no PSI) returns a typed "not available" record instead of raising.

Hot-path rules (they are why this module exists instead of DeepSpeed's `see_memory_usage`): no collective,
no device synchronize, no `gc.collect()`, no `reset_peak_memory_stats()`. Everything here reads the caching
allocator's host-side counters, `cudaMemGetInfo` (a driver query, not a synchronize) and small files in
/proc and /sys.
"""

from __future__ import annotations

import os
import resource
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_GPU_KEYS = {
    "allocated_bytes.all.current": "gpu_allocated",
    "allocated_bytes.all.peak": "gpu_allocated_peak",
    "active_bytes.all.current": "gpu_active",
    "active_bytes.all.peak": "gpu_active_peak",
    "reserved_bytes.all.current": "gpu_reserved",
    "reserved_bytes.all.peak": "gpu_reserved_peak",
    "num_alloc_retries": "gpu_alloc_retries",
    "num_ooms": "gpu_ooms",
}


@dataclass(frozen=True)
class NotAvailable:
    """A measurement that does not exist here, and why (e.g. no CUDA device on a CPU machine)."""

    what: str
    reason: str

    def to_dict(self) -> dict[str, str]:
        return {"what": self.what, "reason": self.reason}


def _torch_cuda() -> Any | None:
    """torch.cuda when torch is already imported by the run and CUDA is initialised; never imports torch."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        cuda = torch.cuda
        if cuda.is_available() and cuda.is_initialized():
            return cuda
    except Exception:  # noqa: BLE001 - a probe never raises
        return None
    return None


def gpu_availability() -> NotAvailable | None:
    """None when GPU telemetry can be read, else why not."""
    if "torch" not in sys.modules:
        return NotAvailable("gpu", "torch is not imported in this process")
    if _torch_cuda() is None:
        return NotAvailable("gpu", "no CUDA device initialised in this process (CPU run)")
    return None


def gpu_sample() -> dict[str, int]:
    """Allocator counters of the current device plus memory outside PyTorch's allocator
    (device total - free - reserved: CUDA context, NCCL buffers, other libraries). Empty without CUDA."""
    cuda = _torch_cuda()
    if cuda is None:
        return {}
    stats = cuda.memory_stats()
    out = {short: int(stats.get(key, 0)) for key, short in _GPU_KEYS.items()}
    free, total = cuda.mem_get_info()
    out["gpu_free"] = int(free)
    out["gpu_total"] = int(total)
    out["gpu_non_pytorch"] = max(int(total) - int(free) - out["gpu_reserved"], 0)
    host_stats = getattr(cuda, "host_memory_stats", None)
    if host_stats is not None:
        try:
            hs = host_stats()
            if "allocated_bytes.current" in hs:  # bytes of page-locked host memory in use (not a count)
                out["pinned_host"] = int(hs["allocated_bytes.current"])
        except Exception:  # noqa: BLE001 - older torch: no pinned-host counters
            pass
    return out


def gpu_identity() -> dict[str, Any]:
    """Current device, its UUID and CUDA_VISIBLE_DEVICES (for the one gather at train begin)."""
    out: dict[str, Any] = {"visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}
    cuda = _torch_cuda()
    if cuda is None:
        out["device"] = "cpu"
        return out
    idx = cuda.current_device()
    out["device"] = f"cuda:{idx}"
    try:
        props = cuda.get_device_properties(idx)
        out["gpu_name"] = props.name
        uuid = getattr(props, "uuid", None)
        out["gpu_uuid"] = str(uuid) if uuid is not None else None
        out["gpu_total"] = int(props.total_memory)
    except Exception:  # noqa: BLE001
        out["gpu_uuid"] = None
    return out


_FR_DUMPS = ("_dump_fr_trace_json", "_dump_nccl_trace_json")
"""PyTorch's collective flight recorder, newest name first. Which backends it records depends on the torch
version: torch 2.13 records gloo collectives as well as NCCL."""


def flight_recorder() -> tuple[Any, dict[str, Any]]:
    """(the recorder's JSON dump function or None, a record of its state for `meta`). Never imports torch."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None, {"available": False, "reason": "torch is not imported in this process"}
    try:
        c10d = torch._C._distributed_c10d
    except Exception:  # noqa: BLE001 - a torch built without distributed
        c10d = None
    fn = next((getattr(c10d, n) for n in _FR_DUMPS if hasattr(c10d, n)), None)
    if fn is None:
        version = getattr(torch, "__version__", "?")
        return None, {"available": False, "reason": f"torch {version} has no collective flight recorder"}
    env = os.environ
    return fn, {
        "available": True,
        "buffer_size": env.get("TORCH_FR_BUFFER_SIZE", env.get("TORCH_NCCL_TRACE_BUFFER_SIZE")),
        "dump_on_timeout": env.get("TORCH_FR_DUMP_TEMP_FILE", env.get("TORCH_NCCL_DEBUG_INFO_TEMP_FILE")),
    }


def oom_summary() -> dict[str, Any]:
    """A cheap allocator summary for a CUDA OOM: counters and the largest gap (reserved - allocated)."""
    cuda = _torch_cuda()
    if cuda is None:
        return {}
    sample = gpu_sample()
    sample["fragmentation"] = sample.get("gpu_reserved", 0) - sample.get("gpu_allocated", 0)
    return sample


# ---- host --------------------------------------------------------------------------------------------------


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if text == "max":
        return None
    try:
        value = int(text)
    except ValueError:
        return None
    return None if value >= 1 << 60 else value  # cgroup v1 "unlimited" is 2**63 rounded to pages


@dataclass(frozen=True)
class Cgroup:
    """Where the job's memory cgroup lives. The kernel kills at its limit, not at the host's RAM."""

    version: int
    path: Path

    @property
    def usage_file(self) -> Path:
        return self.path / ("memory.current" if self.version == 2 else "memory.usage_in_bytes")

    @property
    def limit_file(self) -> Path:
        return self.path / ("memory.max" if self.version == 2 else "memory.limit_in_bytes")


def find_cgroup(
    root: Path = Path("/sys/fs/cgroup"), proc: Path = Path("/proc/self/cgroup")
) -> Cgroup | NotAvailable:
    """The memory cgroup of this process: v2 (`0::/path`) first, then the v1 memory controller."""
    try:
        lines = proc.read_text().splitlines()
    except OSError as exc:
        return NotAvailable("cgroup", f"cannot read {proc}: {exc.strerror}")
    v1: str | None = None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hid, controllers, rel = parts
        if hid == "0" and controllers == "":
            cand = root / rel.lstrip("/")
            if (cand / "memory.current").exists():
                return Cgroup(2, cand)
            if (root / "memory.current").exists():  # inside a container the namespace root is the job
                return Cgroup(2, root)
        elif "memory" in controllers.split(","):
            v1 = rel
    if v1 is not None:
        for cand in (root / "memory" / v1.lstrip("/"), root / "memory"):
            if (cand / "memory.usage_in_bytes").exists():
                return Cgroup(1, cand)
    return NotAvailable("cgroup", "no memory cgroup found (not in a container or Slurm/Kubernetes job)")


def _oom_kills(cg: Cgroup) -> int | None:
    name = "memory.events" if cg.version == 2 else "memory.oom_control"
    try:
        for line in (cg.path / name).read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
    except (OSError, ValueError):
        return None
    return None


def _psi(path: Path) -> dict[str, float]:
    """`some avg10` and `full avg10` of a PSI file (share of the last 10 s stalled on memory)."""
    out: dict[str, float] = {}
    try:
        for line in path.read_text().splitlines():
            kind, *fields = line.split()
            for f in fields:
                if f.startswith("avg10="):
                    out[f"psi_{kind}_avg10"] = float(f[6:])
    except (OSError, ValueError):
        return {}
    return out


class HostProbe:
    """Reads host memory of this process, its node and its cgroup. Built once; `sample()` is the hot path."""

    def __init__(self, cgroup: Cgroup | NotAvailable | None = None) -> None:
        self.cgroup = find_cgroup() if cgroup is None else cgroup
        self._statm = Path("/proc/self/statm")
        self._page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
        psi = self.cgroup.path / "memory.pressure" if isinstance(self.cgroup, Cgroup) else None
        self._psi = psi if psi is not None and psi.exists() else Path("/proc/pressure/memory")

    def unavailable(self) -> list[NotAvailable]:
        out = []
        if isinstance(self.cgroup, NotAvailable):
            out.append(self.cgroup)
        if not self._psi.exists():
            out.append(NotAvailable("psi", "no pressure stall information (kernel without PSI)"))
        return out

    def rss(self) -> int:
        try:
            return int(self._statm.read_text().split()[1]) * self._page
        except (OSError, IndexError, ValueError):
            import psutil  # type: ignore[import-untyped]

            return int(psutil.Process().memory_info().rss)

    def sample(self) -> dict[str, Any]:
        import psutil

        vm = psutil.virtual_memory()
        rss = self.rss()
        out: dict[str, Any] = {
            "rss": rss,
            # the kernel updates maxrss lazily: it can trail the RSS just read from statm
            "rss_hwm": max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, rss),
            "node_used": int(vm.total - vm.available),
            "node_total": int(vm.total),
        }
        cg = self.cgroup
        if isinstance(cg, Cgroup):
            usage = _read_int(cg.usage_file)
            if usage is not None:
                out["cgroup_usage"] = usage
            limit = _read_int(cg.limit_file)
            if limit is not None:
                out["cgroup_limit"] = limit
            kills = _oom_kills(cg)
            if kills is not None:
                out["cgroup_oom_kills"] = kills
        out.update(_psi(self._psi))
        try:
            st = os.statvfs("/dev/shm")
            out["shm_used"] = (st.f_blocks - st.f_bfree) * st.f_frsize
            out["shm_total"] = st.f_blocks * st.f_frsize
        except OSError:
            pass
        return out


def host_limit(sample: dict[str, Any]) -> tuple[int, int, str]:
    """(used, limit, what) for the node: the cgroup when it has a limit (that is where the kernel kills),
    else the node's RAM."""
    if "cgroup_limit" in sample and "cgroup_usage" in sample:
        return int(sample["cgroup_usage"]), int(sample["cgroup_limit"]), "cgroup"
    return int(sample["node_used"]), int(sample["node_total"]), "node"
