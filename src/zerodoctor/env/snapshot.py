"""`load_env(path)`: an Environment from what a user can attach instead of running the live probe.

Accepted, detected from the content (not the file name):

1. the JSON printed by `zerodoctor env --format json` (an object whose "environment" key holds
   `Environment.to_dict()`), or that bare object;
2. `pip freeze` / `pip list --format=freeze` text: `name==version`, `name @ url` (the version is read from a
   wheel/sdist file name when it shows one), `-e git+...#egg=name`, comments, blank lines;
3. the `pip list` table (`Package  Version` header, a dashes line, then rows);
4. `pip list --format=json` (a list of {"name", "version"} objects).

A pip listing holds every installed distribution, so a tracked package missing from it is recorded as
known-absent (version ""). It says nothing about GPUs, host memory or DeepSpeed's compiled ops, so those
stay unknown. Bad input raises `EnvError` naming file:line and what to attach instead; never a traceback.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from zerodoctor.env.model import DeepSpeedInfo, Environment, PackageInfo, TorchInfo
from zerodoctor.env.probes import TRACKED_PACKAGES
from zerodoctor.errors import EnvError, InputError
from zerodoctor.safeio import load_json, read_bytes, shown
from zerodoctor.versions import normalize_package, parse_version

ACCEPTED_FORMATS = (
    "`zerodoctor env --format json` output, `pip freeze` (or `pip list --format=freeze`), "
    "the `pip list` table, or `pip list --format=json`"
)

_NAME = r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?"
_PINNED = re.compile(rf"^(?P<name>{_NAME})(?:\[[^\]]*\])?\s*===?\s*(?P<version>[^\s;#]+)\s*(?:;.*)?$")
_DIRECT = re.compile(rf"^(?P<name>{_NAME})(?:\[[^\]]*\])?\s*@\s*(?P<url>\S+)\s*(?:;.*)?$")
_EGG = re.compile(r"[#&]egg=(?P<name>[A-Za-z0-9._-]+?)(?:-(?P<version>\d[^&#]*))?(?:$|&)")
_EDITABLE_COMMENT = re.compile(rf"^#\s*Editable.*\((?P<name>{_NAME})==(?P<version>[^)\s]+)\)")
_TABLE_HEADER = re.compile(r"^Package\s+Version(\s|$)")
_DASHES = re.compile(r"^-+(\s+-+)+\s*$")
_PIP_NOISE = ("WARNING:", "DEPRECATION:", "[notice]", "ERROR: Pipe")
_TORCH_LABEL = re.compile(r"\+(?:cu(?P<cu>\d+)|rocm(?P<rocm>[\d.]+)|(?P<cpu>cpu))")


def load_env(path: str | Path) -> Environment:
    """Read a snapshot or pip listing (see the module docstring), "-" for stdin, through the bounded input
    layer (`zerodoctor.safeio`). Raises EnvError on anything else."""
    p = Path(path)
    try:
        raw = read_bytes(p, what="an environment snapshot")
    except InputError as err:
        hint = err.hint
        if "no such file" in err.message:
            hint = "give the path of `zerodoctor env --format json` output or a `pip freeze`"
        raise EnvError(err.message, hint=hint) from None
    if b"\x00" in raw[:8192] and not raw.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise EnvError(f"{shown(p)}: a binary file, not a text listing", hint=f"accepted: {ACCEPTED_FORMATS}")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        try:
            text = raw.decode("utf-16")  # `pip freeze > f` in Windows PowerShell writes UTF-16
        except UnicodeDecodeError:
            raise EnvError(f"{shown(p)}: not a text file", hint=f"accepted: {ACCEPTED_FORMATS}") from None
    stripped = text.lstrip()
    if not stripped:
        raise EnvError(f"{p}: the file is empty", hint=f"accepted: {ACCEPTED_FORMATS}")
    if stripped[0] in "{[":
        return _load_json(p, text)
    return parse_pip_listing(text, str(p))


# ---- JSON ---------------------------------------------------------------------------------------------


def _load_json(p: Path, text: str) -> Environment:
    try:
        data = load_json(text, p)
    except InputError as err:
        raise EnvError(
            err.message,
            hint=err.hint
            if "invalid JSON" not in err.message
            else "write it again with `zerodoctor env --format json > env.json` (redirect stdout only)",
        ) from None
    if isinstance(data, list):
        return _from_pip_json(p, data)
    if isinstance(data, dict):
        inner = data.get("environment", data)
        if isinstance(inner, dict) and "schema_version" in inner:
            _check_snapshot_packages(p, inner.get("packages"))
            try:
                env = Environment.from_dict(inner)
            except EnvError as exc:
                raise EnvError(f"{p}: {exc.message}", hint=exc.hint) from None
            return _with_source(env, f"snapshot:{p}")
    raise EnvError(
        f"{p}:1: JSON, but not an environment snapshot (no 'environment' object with a 'schema_version')",
        hint=f"accepted: {ACCEPTED_FORMATS}",
    )


def _check_snapshot_packages(p: Path, packages: Any) -> None:
    """The package records a snapshot holds: strings where `Environment` keeps strings."""
    if not isinstance(packages, dict):
        return  # Environment.from_dict names a wrong container itself
    for key, info in packages.items():
        if not isinstance(info, dict):
            continue
        for field in ("name", "version", "url"):
            value = info.get(field)
            if value is not None and not isinstance(value, str):
                raise EnvError(
                    f"{shown(p)}: packages.{_show(str(key))}.{field} must be a string, found {type(value).__name__}",
                    hint="write it again with `zerodoctor env --format json > env.json`",
                )
        if isinstance(info.get("version"), str):
            _version(info["version"], shown(p), f": packages.{_show(str(key))}")


def _from_pip_json(p: Path, data: list[Any]) -> Environment:
    packages: dict[str, PackageInfo] = {}
    for i, item in enumerate(data):
        if not (
            isinstance(item, dict)
            and isinstance(item.get("name"), str)
            and isinstance(item.get("version"), str)
        ):
            raise EnvError(
                f'{p}: item {i} is not a {{"name": ..., "version": ...}} object',
                hint=f"accepted: {ACCEPTED_FORMATS}",
            )
        packages[normalize_package(item["name"])] = PackageInfo(
            name=item["name"],
            version=_version(item["version"], str(p), f": item {i}"),
            editable=bool(item.get("editable_project_location")),
        )
    return _environment(packages, f"pip-freeze:{p}")


def _with_source(env: Environment, source: str) -> Environment:
    import dataclasses

    return dataclasses.replace(env, source=source)


# ---- pip freeze / pip list -----------------------------------------------------------------------------


def parse_pip_listing(text: str, origin: str = "<text>") -> Environment:
    """Parse `pip freeze` or the `pip list` table. `origin` names the file in errors and in `source`."""
    lines = text.splitlines()
    first = next((i for i, ln in enumerate(lines) if ln.strip()), None)
    if first is not None and _TABLE_HEADER.match(lines[first].strip()):
        packages = _parse_table(lines, first, origin)
    else:
        packages = _parse_freeze(lines, origin)
    if not packages:
        raise EnvError(f"{origin}: no packages found", hint=f"accepted: {ACCEPTED_FORMATS}")
    return _environment(packages, f"pip-freeze:{origin}")


def _parse_table(lines: list[str], header: int, origin: str) -> dict[str, PackageInfo]:
    packages: dict[str, PackageInfo] = {}
    for lineno, line in enumerate(lines[header + 1 :], start=header + 2):
        s = line.strip()
        if not s or _DASHES.match(s) or s.startswith(_PIP_NOISE):
            continue
        parts = s.split()
        if len(parts) < 2 or not re.fullmatch(_NAME, parts[0]):
            raise EnvError(
                f"{origin}:{lineno}: expected a `pip list` row 'name version', got {_show(s)}",
                hint="attach the unmodified output of `pip list` or `pip freeze`",
            )
        packages[normalize_package(parts[0])] = PackageInfo(
            name=parts[0], version=_version(parts[1], origin, f":{lineno}"), editable=len(parts) > 2
        )
    return packages


def _parse_freeze(lines: list[str], origin: str) -> dict[str, PackageInfo]:
    packages: dict[str, PackageInfo] = {}
    seen_valid = False
    pending: tuple[str, str] | None = None  # from "# Editable install with no version control (name==1.0)"
    for lineno, line in enumerate(lines, start=1):
        s = line.strip()
        if not s:
            continue
        if s.startswith("#"):
            m = _EDITABLE_COMMENT.match(s)
            pending = (m.group("name"), m.group("version")) if m else None
            continue
        if s.startswith(_PIP_NOISE):
            continue
        s = re.sub(r"\s+#.*$", "", s)  # inline comment
        if s.startswith(("-e ", "--editable ", "--editable=")):
            info = _parse_editable(s, pending)
            if info is not None and info.version:
                _version(info.version, origin, f":{lineno}")
            pending = None
            if info is not None:
                packages[normalize_package(info.name)] = info
                seen_valid = True
            continue
        if s.startswith("-"):  # -i/--index-url/-f/-r/--hash and other pip options
            continue
        pending = None
        m = _PINNED.match(s)
        if m:
            packages[normalize_package(m.group("name"))] = PackageInfo(
                name=m.group("name"), version=_version(m.group("version"), origin, f":{lineno}")
            )
            seen_valid = True
            continue
        m = _DIRECT.match(s)
        if m:
            packages[normalize_package(m.group("name"))] = PackageInfo(
                name=m.group("name"),
                version=_version_from_url(m.group("name"), m.group("url")),
                url=m.group("url"),
            )
            seen_valid = True
            continue
        if not seen_valid:
            raise EnvError(
                f"{origin}:{lineno}: not a recognised environment file (first line {_show(s)})",
                hint=f"accepted: {ACCEPTED_FORMATS}",
            )
        hint = "attach the unmodified output of `pip freeze`"
        if re.match(rf"^{_NAME}\s*(?:[<>!~]=?|$)", s):
            hint = "this looks like a requirements file, not an installed set: attach `pip freeze` from the training environment"
        raise EnvError(
            f"{origin}:{lineno}: expected 'name==version', 'name @ url' or '-e ...', got {_show(s)}",
            hint=hint,
        )
    return packages


def _parse_editable(line: str, pending: tuple[str, str] | None) -> PackageInfo | None:
    target = re.sub(r"^(-e|--editable)[\s=]+", "", line).strip()
    m = _EGG.search(target)
    if m:
        return PackageInfo(
            name=m.group("name"), version=m.group("version") or None, editable=True, url=target
        )
    if pending is not None:
        return PackageInfo(name=pending[0], version=pending[1], editable=True, url=target)
    return None  # `-e /some/path` without a name: nothing to record


def _version_from_url(name: str, url: str) -> str | None:
    """`torch @ file:///w/torch-2.1.0%2Bcu121-cp310-...whl` -> '2.1.0+cu121'; None when the URL does not say."""
    from urllib.parse import unquote

    filename = unquote(url.split("#", 1)[0].split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1])
    stem = normalize_package(name).replace("-", "_")
    for suffix in (".whl", ".tar.gz", ".zip", ".tar.bz2"):
        if filename.endswith(suffix):
            base = filename[: -len(suffix)]
            head, _, rest = base.partition("-")
            if normalize_package(head).replace("-", "_") != stem or not rest:
                return None
            version = rest.split("-", 1)[0] if suffix == ".whl" else rest
            return version if parse_version(version) is not None else None
    return None


MAX_VERSION_CHARS = 128
"""Longest version string read (PEP 440 versions are short; 5,000 digits would overflow Python's int parsing)."""


def _version(version: str, origin: str, where: str) -> str:
    if len(version) > MAX_VERSION_CHARS:
        raise EnvError(
            f"{origin}{where}: a version string of {len(version):,} characters ({_show(version)})",
            hint="attach the unmodified output of `pip freeze`",
        )
    return version


def _show(s: str) -> str:
    return repr(s if len(s) <= 60 else s[:57] + "...")


# ---- assembling ----------------------------------------------------------------------------------------


def _environment(packages: dict[str, PackageInfo], source: str) -> Environment:
    """A listing of every installed distribution: tracked packages missing from it are known absent."""
    for name in TRACKED_PACKAGES:
        packages.setdefault(normalize_package(name), PackageInfo(name=name, version=""))
    torch = _torch_from_version(packages.get("torch"), packages)
    ds_pkg = packages.get("deepspeed")
    deepspeed = None
    if ds_pkg is not None and ds_pkg.installed:
        deepspeed = DeepSpeedInfo(
            version=ds_pkg.version,
            probe_note="from a package listing: prebuilt and compatible ops are unknown",
        )
    return Environment(
        python="",
        platform="",
        packages=packages,
        packages_complete=True,
        torch=torch,
        deepspeed=deepspeed,
        gpus_probed=False,
        gpu_probe_note="unknown: a package listing does not describe GPUs",
        source=source,
        notes=[
            "from a package listing: GPUs, host memory, /dev/shm, memlock, nvcc and DeepSpeed ops were not checked"
        ],
    )


def _torch_from_version(pkg: PackageInfo | None, packages: dict[str, PackageInfo]) -> TorchInfo | None:
    """The CUDA build from a local version label (`2.1.0+cu121` -> CUDA 12.1); unknown without one."""
    if pkg is None or not pkg.installed:
        return None
    cudnn = next(
        (p.version for k, p in sorted(packages.items()) if k.startswith("nvidia-cudnn") and p.version), None
    )
    m = _TORCH_LABEL.search(pkg.version or "")
    if m is None:
        # NOTE: the default PyPI Linux wheel (no label) is a CUDA build whose toolkit version depends on the
        # torch release; we do not guess.
        return TorchInfo(version=pkg.version, cudnn=cudnn, build_known=False)
    cuda = hip = None
    if m.group("cu"):
        digits = m.group("cu")
        cuda = f"{digits[:-1]}.{digits[-1]}"  # cu121 -> 12.1, cu118 -> 11.8, cu130 -> 13.0
    elif m.group("rocm"):
        hip = m.group("rocm")
    return TorchInfo(version=pkg.version, cuda=cuda, hip=hip, cudnn=cudnn, build_known=True)
