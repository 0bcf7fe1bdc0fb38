"""What `zerodoctor env` knows about a machine and its Python stack, as frozen data.

The same `Environment` comes from three sources: a live probe (`collect()`), a JSON snapshot written by
`zerodoctor env --format json` on a cluster node, or a plain `pip freeze` a user attached. Each source
knows different things, so every field that a source cannot know is None (or empty) instead of a guess:
judges must stay silent on what is unknown rather than raise false alarms.

Only the standard library and `zerodoctor.errors`/`zerodoctor.versions` are imported here, so reading a
snapshot never imports torch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from zerodoctor.errors import EnvError
from zerodoctor.versions import normalize_package

SCHEMA_VERSION = 1
"""Bumped when a field changes meaning; `from_dict` refuses snapshots from a newer schema."""


@dataclass(frozen=True)
class PackageInfo:
    """One distribution.

    `version` is the installed version; `""` means *known not installed* (so a KB version condition
    evaluates FALSE, not UNKNOWN); None means installed but the version is not known (a `name @ file://...`
    or `-e git+...` line of a pip freeze).
    """

    name: str
    version: str | None
    editable: bool = False
    url: str | None = None

    @property
    def installed(self) -> bool:
        return self.version != ""


@dataclass(frozen=True)
class TorchInfo:
    """torch's build, read from the installed `torch/version.py` (never by importing torch).

    `cuda`/`hip` are the toolkit versions torch was compiled with (None for a CPU build). `build_known`
    is False when the source could not tell (a pip freeze line `torch==2.1.0` without a `+cu121` label),
    in which case `cuda is None` must not be read as "CPU build".
    """

    version: str | None
    cuda: str | None = None
    hip: str | None = None
    cudnn: str | None = None
    build_known: bool = True


@dataclass(frozen=True)
class DeepSpeedInfo:
    """DeepSpeed's ops, as `ds_report` shows them, without importing DeepSpeed in-process.

    `installed_ops` (prebuilt at install time) comes from `deepspeed/git_version_info_installed.py`;
    `compatible_ops` (could be JIT-built here) only from the deep probe subprocess, empty when it did not
    run. `import_ok` is True/False when the deep probe imported deepspeed or failed to, None when it was not
    tried or could not finish; `probe_note` says why something is unknown.
    """

    version: str | None
    installed_ops: dict[str, bool] = field(default_factory=dict)
    compatible_ops: dict[str, bool] = field(default_factory=dict)
    compat_errors: dict[str, str] = field(default_factory=dict)
    accelerator: str | None = None
    installed_accelerator: str | None = None
    torch_info: dict[str, Any] = field(default_factory=dict)
    import_ok: bool | None = None
    import_error: str | None = None
    ninja_available: bool | None = None
    torch_cuda_home: str | None = None
    extensions_root: str | None = None
    cpu_adam_cached: bool | None = None
    probe_note: str | None = None

    def op_prebuilt(self, op: str) -> bool:
        """ds_report's "installed" column: prebuilt, and for the accelerator that is live here."""
        if not self.installed_ops.get(op, False):
            return False
        return not (
            self.accelerator and self.installed_accelerator and self.accelerator != self.installed_accelerator
        )

    def op_compatible(self, op: str) -> bool | None:
        """ds_report's "compatible" column, or None when the deep probe did not answer."""
        if op not in self.compatible_ops:
            return None
        return self.compatible_ops[op]


@dataclass(frozen=True)
class GpuInfo:
    """One NVIDIA GPU as NVML sees it (NVML ignores CUDA_VISIBLE_DEVICES)."""

    index: int
    name: str
    memory_total_bytes: int | None
    driver_version: str | None = None
    cuda_driver_version: str | None = None


@dataclass(frozen=True)
class HostInfo:
    """Host memory and limits. None means not known, except memlock: None there means unlimited and
    `memlock_known` says whether the limit was read at all."""

    ram_total_bytes: int | None = None
    ram_available_bytes: int | None = None
    swap_total_bytes: int | None = None
    shm_total_bytes: int | None = None
    shm_free_bytes: int | None = None
    memlock_soft_bytes: int | None = None
    memlock_hard_bytes: int | None = None
    memlock_known: bool = False
    cpu_count: int | None = None


@dataclass(frozen=True)
class Environment:
    """The machine and Python stack a training run would use.

    `packages` is keyed by PEP 503 name. A package with version `""` is known NOT installed; that is only
    recorded when the source really knows it: a live probe asks importlib.metadata, and a pip freeze lists
    every installed distribution, so a package absent from it is absent (`packages_complete` is True for
    both). A JSON snapshot keeps what its live probe knew.

    `gpus_probed` is True when the GPU probe answered (an empty `gpus` then means "no NVIDIA GPU", a normal
    answer); a pip freeze knows nothing about GPUs. `python` and `platform` are "" when unknown.
    """

    python: str
    platform: str
    packages: dict[str, PackageInfo] = field(default_factory=dict)
    packages_complete: bool = False
    torch: TorchInfo | None = None
    deepspeed: DeepSpeedInfo | None = None
    gpus: list[GpuInfo] = field(default_factory=list)
    gpus_probed: bool = False
    gpu_probe_note: str | None = None
    host: HostInfo | None = None
    cuda_home: str | None = None
    nvcc_version: str | None = None
    env_vars: dict[str, str] = field(default_factory=dict)
    source: str = "live"
    notes: list[str] = field(default_factory=list)

    # ---- views for the judges -------------------------------------------------------------------------

    def versions(self) -> dict[str, str]:
        """normalized name -> version for `kb.matcher`; "" = known absent; unknown versions are left out."""
        return {k: p.version for k, p in self.packages.items() if p.version is not None}

    def version_of(self, package: str) -> str | None:
        """Installed version, "" if known absent, None if unknown."""
        p = self.packages.get(normalize_package(package))
        return None if p is None else p.version

    def visible_gpu_count(self) -> int | None:
        """GPUs a launcher would use: NVML's count narrowed by CUDA_VISIBLE_DEVICES when that is a plain
        list of indices (UUID lists are counted as given). None when GPUs were not probed."""
        if not self.gpus_probed:
            return None
        n = len(self.gpus)
        cvd = self.env_vars.get("CUDA_VISIBLE_DEVICES")
        if cvd is None:
            return n
        items = [x.strip() for x in cvd.split(",") if x.strip()]
        count = 0
        for item in items:
            if item.lstrip("-").isdigit():
                if int(item) < 0:
                    break  # CUDA stops at the first invalid index
                if int(item) < n:
                    count += 1
            else:
                count += 1
        return min(count, n)

    def facts(self) -> dict[str, Any]:
        """The env.* facts that KB conditions and rules are evaluated against; only the known ones."""
        out: dict[str, Any] = {}
        count = self.visible_gpu_count()
        if count is not None:
            out["env.gpu_count"] = count
        mems = [g.memory_total_bytes for g in self.gpus if g.memory_total_bytes is not None]
        if mems:
            out["env.gpu_memory_bytes"] = min(mems)
        h = self.host
        if h is not None:
            if h.shm_total_bytes is not None:
                out["env.shm_bytes"] = h.shm_total_bytes
            if h.memlock_known:
                out["env.memlock_bytes"] = math.inf if h.memlock_soft_bytes is None else h.memlock_soft_bytes
            if h.ram_total_bytes is not None:
                out["env.host_ram_bytes"] = h.ram_total_bytes
            if h.ram_available_bytes is not None:
                out["env.host_ram_available_bytes"] = h.ram_available_bytes
            if h.swap_total_bytes is not None:
                out["env.swap_bytes"] = h.swap_total_bytes
            if h.cpu_count is not None:
                out["env.cpu_count"] = h.cpu_count
        if not self.source.startswith("pip-freeze"):
            # a probed environment records the variable when it is set; unset, DeepSpeed's JIT builder takes the
            # GPUs' own capabilities ("9.0"), which never carry a suffix (op_builder/builder.py)
            out["env.torch_cuda_arch_suffix"] = arch_list_has_suffix(self.env_vars.get("TORCH_CUDA_ARCH_LIST", ""))
        return out

    # ---- serialisation ----------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready; `from_dict(to_dict())` gives an equal Environment."""
        d = asdict(self)
        d["packages"] = {k: asdict(v) for k, v in sorted(self.packages.items())}
        return {"schema_version": SCHEMA_VERSION, **d}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Environment:
        """Rebuild from `to_dict()` output. Raises EnvError (without a file name; the caller adds it)."""
        if not isinstance(data, Mapping):
            raise EnvError("environment snapshot must be a JSON object")
        version = data.get("schema_version")
        if not isinstance(version, int):
            raise EnvError("environment snapshot has no integer 'schema_version'")
        if version > SCHEMA_VERSION:
            raise EnvError(
                f"environment snapshot has schema_version {version}, this zerodoctor reads up to {SCHEMA_VERSION}",
                hint="upgrade zerodoctor, or write the snapshot with the same zerodoctor version",
            )
        try:
            packages_raw = data.get("packages") or {}
            if not isinstance(packages_raw, Mapping):
                raise TypeError("'packages' must be an object")
            packages = {
                normalize_package(k): _build(PackageInfo, v, "packages." + k) for k, v in packages_raw.items()
            }
            torch = _build(TorchInfo, data["torch"], "torch") if data.get("torch") is not None else None
            ds = (
                _build(DeepSpeedInfo, data["deepspeed"], "deepspeed")
                if data.get("deepspeed") is not None
                else None
            )
            host = _build(HostInfo, data["host"], "host") if data.get("host") is not None else None
            gpus_raw = data.get("gpus") or []
            if not isinstance(gpus_raw, list):
                raise TypeError("'gpus' must be a list")
            gpus = [_build(GpuInfo, g, f"gpus[{i}]") for i, g in enumerate(gpus_raw)]
            env_vars = data.get("env_vars") or {}
            notes = data.get("notes") or []
            if not isinstance(env_vars, Mapping) or not isinstance(notes, list):
                raise TypeError("'env_vars' must be an object and 'notes' a list")
            return cls(
                python=str(data.get("python") or ""),
                platform=str(data.get("platform") or ""),
                packages=packages,
                packages_complete=bool(data.get("packages_complete", False)),
                torch=torch,
                deepspeed=ds,
                gpus=gpus,
                gpus_probed=bool(data.get("gpus_probed", False)),
                gpu_probe_note=_opt_str(data.get("gpu_probe_note")),
                host=host,
                cuda_home=_opt_str(data.get("cuda_home")),
                nvcc_version=_opt_str(data.get("nvcc_version")),
                env_vars={str(k): str(v) for k, v in env_vars.items()},
                source=str(data.get("source") or "snapshot"),
                notes=[str(n) for n in notes],
            )
        except (TypeError, KeyError, ValueError) as exc:
            raise EnvError(
                f"environment snapshot is malformed: {exc}",
                hint="write it again with `zerodoctor env --format json > env.json`",
            ) from None


def _opt_str(value: Any) -> str | None:
    return None if value is None else str(value)


def _build(cls: type[Any], raw: Any, where: str) -> Any:
    """Construct a dataclass from a dict, ignoring unknown keys (forward compatibility within a schema)."""
    if not isinstance(raw, Mapping):
        raise TypeError(f"{where!r} must be an object, got {type(raw).__name__}")
    names = {f.name for f in fields(cls)}
    from pydantic import TypeAdapter, ValidationError  # types of every field checked (a hand-edited snapshot)

    try:
        return TypeAdapter(cls).validate_python({k: v for k, v in raw.items() if k in names})
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(x) for x in err["loc"])
        raise TypeError(f"{where}.{loc}: {err['msg']} (got {err.get('input')!r})"[:300]) from None


def arch_list_has_suffix(arch_list: str) -> bool:
    """Whether a TORCH_CUDA_ARCH_LIST holds an entry DeepSpeed >= 0.19's op builder cannot sort: it splits each
    entry on '.', drops a '+PTX' and calls int() on the rest (op_builder/builder.py compute_capability_args), so
    `9.0a` / `10.0f` raise while `8.0+PTX` does not."""
    entries = [e.strip() for e in arch_list.replace(" ", ";").split(";") if e.strip()]
    return any(not part.split("+")[0].isdigit() for e in entries for part in e.split("."))
