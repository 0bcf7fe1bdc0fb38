"""One function per thing `zerodoctor env` looks at. Each returns a value and/or a note; none raises.

Why so careful: `zerodoctor env` is run when something is already wrong (a broken CUDA install, a DeepSpeed
that crashes on import, a container without /dev/shm). A probe that crashes would hide the very thing the
user needs to see, so every probe turns failure into a "could not check X, because Y" note.

Nothing here imports torch, deepspeed or transformers in this process. Versions come from
importlib.metadata; torch's CUDA build from `torch/version.py` and DeepSpeed's prebuilt ops from
`deepspeed/git_version_info_installed.py`, both read with `ast`. Questions that need the libraries
themselves (which ops are compatible, is a JIT-built op cached) go to a subprocess with a timeout.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import importlib.metadata as md
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from zerodoctor.env.model import DeepSpeedInfo, GpuInfo, HostInfo, PackageInfo, TorchInfo
from zerodoctor.versions import normalize_package

T = TypeVar("T")

TRACKED_PACKAGES: tuple[str, ...] = (
    "torch",
    "deepspeed",
    "transformers",
    "accelerate",
    "peft",
    "bitsandbytes",
    "trl",
    "llamafactory",
    "xtuner",
    "mmengine",
    "flash-attn",
    "ninja",
    "nvidia-ml-py",
    "safetensors",
)
"""Always reported, with "" when absent, so KB conditions on them evaluate to FALSE instead of UNKNOWN."""

ENV_VAR_NAMES: frozenset[str] = frozenset(
    {
        "CUDA_VISIBLE_DEVICES",
        "PYTORCH_CUDA_ALLOC_CONF",
        "PYTORCH_ALLOC_CONF",
        "CUDA_HOME",
        "CUDA_PATH",
        "TORCH_CUDA_ARCH_LIST",
        "TORCH_EXTENSIONS_DIR",
        "OMP_NUM_THREADS",
        "LOCAL_RANK",
        "RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
        "HIP_VISIBLE_DEVICES",
        "ROCR_VISIBLE_DEVICES",
        "ACCELERATE_USE_DEEPSPEED",
        # LLaMA-Factory's parser switches (hparams/parser.py): extra YAML keys allowed, the Megatron (mcore) and v1
        # argument sets -- they decide which keys a training YAML may hold (lint HF004)
        "ALLOW_EXTRA_ARGS",
        "USE_MCA",
        "USE_V1",
    }
)
ENV_VAR_PREFIXES: tuple[str, ...] = ("NCCL_", "TORCH_NCCL_", "DS_")
"""Only variables that change how ZeRO runs are recorded; a snapshot must not carry tokens or paths of
unrelated tools."""

DEEP_PROBE_TIMEOUT_S = 90.0
"""Importing DeepSpeed probes every op builder; on a cold shared filesystem that can take a minute."""

NVCC_TIMEOUT_S = 20.0


def safe(probe: Callable[[], T], what: str) -> tuple[T | None, str | None]:
    """Run a probe; an unexpected exception becomes a note instead of a traceback."""
    try:
        return probe(), None
    except Exception as exc:  # a probe must never take `zerodoctor env` down
        return None, f"could not check {what}, because {type(exc).__name__}: {exc}"


# ---- packages ----------------------------------------------------------------------------------------


def probe_packages() -> dict[str, PackageInfo]:
    """Every installed distribution, plus the tracked ones that are absent (version "")."""
    out: dict[str, PackageInfo] = {}
    for dist in md.distributions():
        try:
            name = dist.metadata["Name"]
            version = dist.version
        except Exception:  # a broken .dist-info must not hide the rest
            continue
        if not name:
            continue
        key = normalize_package(name)
        if key in out:  # the first one on sys.path wins, as for import
            continue
        out[key] = PackageInfo(name=name, version=version or None, editable=_is_editable(dist))
    for name in TRACKED_PACKAGES:
        out.setdefault(normalize_package(name), PackageInfo(name=name, version=""))
    return out


def _is_editable(dist: md.Distribution) -> bool:
    try:
        text = dist.read_text("direct_url.json")
        return bool(text and json.loads(text).get("dir_info", {}).get("editable"))
    except Exception:
        return False


def _package_file(dist_name: str, import_name: str, relative: str) -> Path | None:
    """A file inside an installed package, found without importing it."""
    try:
        candidate = Path(str(md.distribution(dist_name).locate_file(f"{import_name}/{relative}")))
        if candidate.is_file():
            return candidate
    except md.PackageNotFoundError:
        pass
    spec = importlib.util.find_spec(import_name)  # top-level: finds, does not execute
    if spec is not None and spec.submodule_search_locations:
        for base in spec.submodule_search_locations:
            candidate = Path(base) / relative
            if candidate.is_file():
                return candidate
    return None


def read_module_constants(path: Path) -> dict[str, Any]:
    """Top-level `NAME = <literal>` (and `NAME: T = <literal>`) assignments of a Python file, via ast."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    out: dict[str, Any] = {}
    for node in tree.body:
        targets: list[ast.expr] = []
        value: ast.expr | None = None
        if isinstance(node, ast.Assign):
            targets, value = list(node.targets), node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        for t in targets:
            if isinstance(t, ast.Name) and value is not None:
                try:
                    out[t.id] = ast.literal_eval(value)
                except ValueError:
                    continue
    return out


# ---- torch -------------------------------------------------------------------------------------------


def probe_torch(packages: dict[str, PackageInfo]) -> tuple[TorchInfo | None, str | None]:
    """torch's version and CUDA/HIP build from `torch/version.py`, cuDNN from an nvidia-cudnn-* wheel."""
    pkg = packages.get("torch")
    if pkg is None or not pkg.installed:
        return None, None
    cudnn = next(
        (p.version for k, p in sorted(packages.items()) if k.startswith("nvidia-cudnn") and p.version),
        None,
    )
    path = _package_file("torch", "torch", "version.py")
    if path is None:
        return TorchInfo(version=pkg.version, cudnn=cudnn, build_known=False), (
            "could not check torch's CUDA build, because torch/version.py was not found in the installed package"
        )
    try:
        consts = read_module_constants(path)
    except (OSError, SyntaxError, ValueError) as exc:
        return TorchInfo(version=pkg.version, cudnn=cudnn, build_known=False), (
            f"could not check torch's CUDA build, because {path} could not be parsed: {exc}"
        )
    return (
        TorchInfo(
            version=str(consts.get("__version__") or pkg.version),
            cuda=_opt_str(consts.get("cuda")),
            hip=_opt_str(consts.get("hip")),
            cudnn=cudnn,
        ),
        None,
    )


def _opt_str(value: Any) -> str | None:
    return None if value is None else str(value)


# ---- DeepSpeed ---------------------------------------------------------------------------------------


def probe_deepspeed_installed(packages: dict[str, PackageInfo]) -> tuple[DeepSpeedInfo | None, str | None]:
    """DeepSpeed's version and prebuilt ops from `git_version_info_installed.py`, without importing it."""
    pkg = packages.get("deepspeed")
    if pkg is None or not pkg.installed:
        return None, None
    path = _package_file("deepspeed", "deepspeed", "git_version_info_installed.py")
    if path is None:
        # NOTE: source checkouts and some editable installs have no such file; ds_report then treats every
        # op as not installed (deepspeed/git_version_info.py fallback), and so do we.
        return DeepSpeedInfo(
            version=pkg.version, probe_note="git_version_info_installed.py not found: no op is prebuilt"
        ), None
    try:
        c = read_module_constants(path)
    except (OSError, SyntaxError, ValueError) as exc:
        return DeepSpeedInfo(
            version=pkg.version
        ), f"could not check DeepSpeed's prebuilt ops, because {path}: {exc}"
    return (
        DeepSpeedInfo(
            version=str(c.get("version") or pkg.version),
            installed_ops={str(k): bool(v) for k, v in dict(c.get("installed_ops") or {}).items()},
            # Older DeepSpeed releases also wrote the build machine's compatible_ops; the live answer
            # (deep probe) replaces it.
            compatible_ops={str(k): bool(v) for k, v in dict(c.get("compatible_ops") or {}).items()},
            installed_accelerator=_opt_str(c.get("accelerator_name")) or None,
            torch_info=dict(c.get("torch_info") or {}),
        ),
        None,
    )


# The subprocess: imports torch and deepspeed (only there), asks every op builder is_compatible() as
# ds_report does, and looks for a JIT-built cpu_adam. Everything it prints while importing goes to stderr;
# the one JSON line goes to the original stdout.
_DEEP_PROBE_SCRIPT = r"""
import glob, json, os, sys
out_fd = os.dup(1)
os.dup2(2, 1)
sys.stdout = sys.stderr
res = {"stage": "import torch"}
try:
    import torch
    res["torch_version"] = str(torch.__version__)
    res["torch_cuda"] = getattr(torch.version, "cuda", None)
    res["torch_hip"] = getattr(torch.version, "hip", None)
    res["stage"] = "import deepspeed"
    import deepspeed
    res["deepspeed_version"] = str(getattr(deepspeed, "__version__", ""))
    res["import_ok"] = True
    res["stage"] = "accelerator"
    from deepspeed.accelerator import get_accelerator
    res["accelerator"] = str(get_accelerator()._name)
    res["stage"] = "op builders"
    from deepspeed.ops.op_builder.all_ops import ALL_OPS
    compat, errors = {}, {}
    for name, builder in ALL_OPS.items():
        try:
            compat[name] = bool(builder.is_compatible(False))
        except Exception as exc:
            compat[name] = False
            errors[name] = "%s: %s" % (type(exc).__name__, exc)
    res["compatible_ops"], res["compat_errors"] = compat, errors
    try:
        from deepspeed.git_version_info import installed_ops, accelerator_name
        res["installed_ops"] = {str(k): bool(v) for k, v in installed_ops.items()}
        res["installed_accelerator"] = str(accelerator_name)
    except Exception as exc:
        errors["git_version_info"] = "%s: %s" % (type(exc).__name__, exc)
    res["stage"] = "torch extensions"
    import torch.utils.cpp_extension as ce
    res["ninja_available"] = bool(ce.is_ninja_available())
    res["torch_cuda_home"] = ce.CUDA_HOME
    root = os.environ.get("TORCH_EXTENSIONS_DIR") or ce.get_default_build_root()
    res["extensions_root"] = root
    dirs = glob.glob(os.path.join(root, "*", "cpu_adam")) + glob.glob(os.path.join(root, "cpu_adam"))
    res["cpu_adam_cache_dirs"] = sorted(dirs)
    res["cpu_adam_cached"] = any(glob.glob(os.path.join(d, "*.so")) for d in dirs)
    res["stage"] = "done"
except BaseException as exc:
    res["error"] = "%s: %s" % (type(exc).__name__, exc)
    if res["stage"] in ("import torch", "import deepspeed"):
        res["import_ok"] = False
os.write(out_fd, ("ZERODOCTOR_DEEP_PROBE " + json.dumps(res, default=str) + "\n").encode())
"""

_MARKER = "ZERODOCTOR_DEEP_PROBE "


def run_deep_probe(timeout_s: float = DEEP_PROBE_TIMEOUT_S) -> tuple[dict[str, Any] | None, str | None, bool]:
    """Run the DeepSpeed probe in `sys.executable`.

    Returns (result, None, False), or (None, why it failed, crashed): `crashed` is True when the process
    died without answering (a segfault in a CUDA library, say), which means importing deepspeed is broken;
    a timeout only means we do not know.
    """
    try:
        proc = subprocess.run(
            [sys.executable, "-c", _DEEP_PROBE_SCRIPT],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        return (
            None,
            f"could not check DeepSpeed's ops, because the probe did not finish in {timeout_s:.0f} s",
            False,
        )
    except OSError as exc:
        return (
            None,
            f"could not check DeepSpeed's ops, because {sys.executable} could not be started: {exc}",
            False,
        )
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(_MARKER):
            try:
                data = json.loads(line[len(_MARKER) :])
            except json.JSONDecodeError:
                break
            if isinstance(data, dict):
                return data, None, False
    tail = " | ".join(proc.stderr.strip().splitlines()[-3:])
    return (
        None,
        f"could not check DeepSpeed's ops, because the probe process exited with code {proc.returncode} "
        f"without an answer (it probably crashed inside torch or deepspeed){': ' + tail if tail else ''}",
        True,
    )


def merge_deep_probe(
    ds: DeepSpeedInfo | None,
    version: str | None,
    result: dict[str, Any] | None,
    failure: str | None,
    crashed: bool = False,
) -> DeepSpeedInfo:
    """Fold the subprocess answer into what the installed files said."""
    base = ds or DeepSpeedInfo(version=version)
    if result is None:
        return _replace(
            base,
            import_ok=False if crashed else None,
            import_error=failure if crashed else None,
            probe_note=failure,
        )
    changes: dict[str, Any] = {
        "import_ok": result.get("import_ok"),
        "compatible_ops": {str(k): bool(v) for k, v in (result.get("compatible_ops") or {}).items()}
        or base.compatible_ops,
        "compat_errors": {str(k): str(v) for k, v in (result.get("compat_errors") or {}).items()},
        "accelerator": result.get("accelerator") or base.accelerator,
        "ninja_available": result.get("ninja_available"),
        "torch_cuda_home": result.get("torch_cuda_home"),
        "extensions_root": result.get("extensions_root"),
        "cpu_adam_cached": result.get("cpu_adam_cached"),
    }
    if result.get("installed_ops") and not base.installed_ops:
        changes["installed_ops"] = result["installed_ops"]
        changes["installed_accelerator"] = result.get("installed_accelerator")
    if result.get("error"):
        stage = result.get("stage", "?")
        note = f"deep probe stopped at '{stage}': {result['error']}"
        changes["probe_note"] = note
        if result.get("import_ok") is False:
            changes["import_error"] = f"{stage} failed: {result['error']}"
    else:
        changes["probe_note"] = None
    return _replace(base, **changes)


def _replace(obj: DeepSpeedInfo, **changes: Any) -> DeepSpeedInfo:
    return dataclasses.replace(obj, **changes)


# ---- GPUs --------------------------------------------------------------------------------------------


def probe_gpus() -> tuple[list[GpuInfo], bool, str | None]:
    """(GPUs, probed, note) via nvidia-ml-py. A machine without an NVIDIA driver is a normal answer:
    no GPUs, probed=True, and a note that says why."""
    try:
        import pynvml  # nvidia-ml-py: a thin ctypes binding, cheap to import
    except ImportError:
        return [], False, "could not check GPUs, because nvidia-ml-py (pynvml) is not installed"
    try:
        pynvml.nvmlInit()
    except Exception as exc:
        return [], True, f"no GPU: NVML could not start ({exc}); no NVIDIA driver is usable on this machine"
    try:
        driver = _text(pynvml.nvmlSystemGetDriverVersion())
        cuda_driver: str | None
        try:
            v = int(pynvml.nvmlSystemGetCudaDriverVersion_v2())
            cuda_driver = f"{v // 1000}.{(v % 1000) // 10}"
        except Exception:
            cuda_driver = None
        gpus: list[GpuInfo] = []
        for i in range(int(pynvml.nvmlDeviceGetCount())):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            try:
                mem: int | None = int(pynvml.nvmlDeviceGetMemoryInfo(h).total)
            except Exception:
                mem = None
            gpus.append(GpuInfo(i, _text(pynvml.nvmlDeviceGetName(h)), mem, driver, cuda_driver))
        return gpus, True, None if gpus else "no GPU: the NVIDIA driver reports 0 devices"
    except Exception as exc:
        return [], False, f"could not check GPUs, because NVML failed after starting: {exc}"
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


# ---- host --------------------------------------------------------------------------------------------


def probe_host(shm_path: str = "/dev/shm") -> tuple[HostInfo, list[str]]:
    """RAM and swap (psutil, else /proc/meminfo), /dev/shm size, `ulimit -l`, usable CPUs."""
    notes: list[str] = []
    ram_total = ram_avail = swap = None
    try:
        import psutil  # type: ignore[import-untyped]

        vm = psutil.virtual_memory()
        ram_total, ram_avail = int(vm.total), int(vm.available)
        swap = int(psutil.swap_memory().total)
    except Exception as exc:
        meminfo, note = safe(_read_meminfo, "host RAM")
        if meminfo:
            ram_total, ram_avail, swap = (
                meminfo.get("MemTotal"),
                meminfo.get("MemAvailable"),
                meminfo.get("SwapTotal"),
            )
        else:
            notes.append(note or f"could not check host RAM, because psutil failed: {exc}")
    shm_total = shm_free = None
    if os.path.isdir(shm_path):
        try:
            usage = shutil.disk_usage(shm_path)
            shm_total, shm_free = int(usage.total), int(usage.free)
        except OSError as exc:
            notes.append(f"could not check {shm_path} size, because {exc}")
    else:
        notes.append(f"could not check /dev/shm size, because {shm_path} does not exist on this system")
    soft = hard = None
    memlock_known = False
    try:
        import resource

        s, h = resource.getrlimit(resource.RLIMIT_MEMLOCK)
        soft = None if s == resource.RLIM_INFINITY else int(s)
        hard = None if h == resource.RLIM_INFINITY else int(h)
        memlock_known = True
    except Exception as exc:  # no `resource` on Windows
        notes.append(f"could not check the locked-memory limit (ulimit -l), because {exc}")
    try:
        cpus: int | None = len(os.sched_getaffinity(0))  # respects cgroup/taskset pinning
    except (AttributeError, OSError):
        cpus = os.cpu_count()
    return (
        HostInfo(
            ram_total_bytes=ram_total,
            ram_available_bytes=ram_avail,
            swap_total_bytes=swap,
            shm_total_bytes=shm_total,
            shm_free_bytes=shm_free,
            memlock_soft_bytes=soft,
            memlock_hard_bytes=hard,
            memlock_known=memlock_known,
            cpu_count=cpus,
        ),
        notes,
    )


def _read_meminfo() -> dict[str, int]:
    out: dict[str, int] = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            out[key] = int(parts[0]) * (1024 if parts[1:2] == ["kB"] else 1)
    return out


# ---- CUDA toolkit ------------------------------------------------------------------------------------


def find_cuda_home(environ: dict[str, str] | None = None) -> str | None:
    """The toolkit a JIT build would use, found the way torch.utils.cpp_extension._find_cuda_home does:
    CUDA_HOME, CUDA_PATH, the directory above `nvcc` on PATH, then /usr/local/cuda."""
    env = os.environ if environ is None else environ
    home = env.get("CUDA_HOME") or env.get("CUDA_PATH")
    if home:
        return home
    nvcc = shutil.which("nvcc", path=env.get("PATH"))
    if nvcc:
        return os.path.dirname(os.path.dirname(nvcc))
    if os.path.isdir("/usr/local/cuda"):
        return "/usr/local/cuda"
    return None


_RELEASE = re.compile(r"release (\d+)\.(\d+)")


def parse_nvcc_version(output: str) -> str | None:
    """'Cuda compilation tools, release 12.1, V12.1.105' -> '12.1' (major.minor, as DeepSpeed compares)."""
    m = _RELEASE.search(output)
    return f"{m.group(1)}.{m.group(2)}" if m else None


def probe_nvcc(cuda_home: str | None) -> tuple[str | None, str | None]:
    """Run `nvcc --version` from CUDA_HOME/bin (what DeepSpeed's op builder runs), else from PATH."""
    candidates = []
    if cuda_home:
        candidates.append(os.path.join(cuda_home, "bin", "nvcc"))
    on_path = shutil.which("nvcc")
    if on_path:
        candidates.append(on_path)
    exe = next((c for c in candidates if os.path.isfile(c) and os.access(c, os.X_OK)), None)
    if exe is None:
        return None, "no nvcc found (CUDA_HOME/bin/nvcc or PATH): JIT builds of CUDA ops are not possible"
    try:
        proc = subprocess.run(
            [exe, "--version"],
            capture_output=True,
            text=True,
            timeout=NVCC_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        return (
            None,
            f"could not check nvcc's version, because `{exe} --version` did not finish in {NVCC_TIMEOUT_S:.0f} s",
        )
    except OSError as exc:
        return None, f"could not check nvcc's version, because `{exe}` could not run: {exc}"
    version = parse_nvcc_version(proc.stdout)
    if version is None:
        return (
            None,
            f"could not check nvcc's version, because `{exe} --version` printed no 'release X.Y' (exit {proc.returncode})",
        )
    return version, None


# ---- environment variables ---------------------------------------------------------------------------


def probe_env_vars(environ: dict[str, str] | None = None) -> dict[str, str]:
    """Only the variables that change how ZeRO/NCCL/CUDA runs (see ENV_VAR_NAMES/ENV_VAR_PREFIXES)."""
    env = os.environ if environ is None else environ
    return {k: v for k, v in sorted(env.items()) if k in ENV_VAR_NAMES or k.startswith(ENV_VAR_PREFIXES)}
