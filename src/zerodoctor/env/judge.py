"""`judge_environment(env, facts)`: what in this environment will break a ZeRO run, as Findings.

Rules (ids never change):

    ENV001 env.small-dev-shm                    /dev/shm too small for NCCL on a multi-GPU node
    ENV002 env.low-memlock-with-pinned-offload  low `ulimit -l` while offload pins host memory
    ENV003 env.cuda-toolkit-mismatch            nvcc major.minor vs torch's CUDA: JIT op builds fail
    ENV004 env.cpu-adam-unavailable             offload_optimizer needs cpu_adam, which cannot be had here
    ENV005 env.deepspeed-missing-or-broken      deepspeed is installed but does not import
    ENV006 env.no-gpu                           no NVIDIA GPU (info)

plus the knowledge base's known-bad versions (`zerodoctor.kb.preflight.known_failures`).

No false alarms: a rule that lacks the facts it needs stays silent or says, at info level, that it could
not check. `facts` are the setup's facts (`ds.zero_optimization.offload_optimizer.device`, ...), when a
training config was given.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from zerodoctor.env.model import Environment
from zerodoctor.facts import truthy
from zerodoctor.findings import Evidence, Finding, Fix, Severity

MiB = 1024**2
GiB = 1024**3

SMALL_SHM_BYTES = 1 * GiB
"""NCCL's shared-memory transport allocates ~9.6 MB segments per peer and channel (NVIDIA/nccl#290); 1 GiB
is the usual safe minimum for 8 GPUs. Docker's default is 64 MiB."""
DOCKER_DEFAULT_SHM_BYTES = 64 * MiB

LOW_MEMLOCK_BYTES = 1 * GiB
"""Offload pins gigabytes of host memory; distro defaults are 64 KiB-8 MiB. Below 1 GiB counts as low."""

# NOTE: copied from deepspeed/ops/op_builder/builder.py (v0.19.8) `cuda_minor_mismatch_ok`: within these
# lists a minor mismatch between nvcc and torch's CUDA is accepted with a notice; any other mismatch raises
# CUDAMismatchException unless DS_SKIP_CUDA_CHECK=1. CUDA 13 is not listed there (yet).
CUDA_MINOR_MISMATCH_OK: dict[int, tuple[str, ...]] = {
    10: ("10.0", "10.1", "10.2"),
    11: ("11.0", "11.1", "11.2", "11.3", "11.4", "11.5", "11.6", "11.7", "11.8"),
    12: ("12.0", "12.1", "12.2", "12.3", "12.4", "12.5", "12.6", "12.8", "12.9"),
}

OFFLOAD_OPTIMIZER_DEVICE = "ds.zero_optimization.offload_optimizer.device"
OFFLOAD_OPTIMIZER_PIN = "ds.zero_optimization.offload_optimizer.pin_memory"
OFFLOAD_PARAM_DEVICE = "ds.zero_optimization.offload_param.device"
OFFLOAD_PARAM_PIN = "ds.zero_optimization.offload_param.pin_memory"
OPTIMIZER_TYPE = "ds.optimizer.type"

REFS_SHM = (
    "NVIDIA/nccl#290",
    "NVIDIA/nccl#342",
    "huggingface/transformers#11658",
    "WangRongsheng/XrayGLM#83",
)
REFS_PIN = ("deepspeedai/DeepSpeed#2977", "deepspeedai/DeepSpeed#7150", "oobabooga/textgen#969")
REFS_CPU_ADAM = (
    "deepspeedai/DeepSpeed#1846",
    "deepspeedai/DeepSpeed#2901",
    "deepspeedai/DeepSpeed#5677",
    "Coobiw/MPP-LLaVA#31",
)


def judge_environment(
    env: Environment, facts: Mapping[str, Any] | None = None, *, include_kb: bool = True
) -> list[Finding]:
    """Run every ENV rule, then (unless `include_kb=False`) the KB's known-bad versions, against `env`
    plus the setup's `facts`. A malformed KB raises KnowledgeBaseError (a bug to fix, not to hide)."""
    merged: dict[str, Any] = {**env.facts(), **(facts or {})}
    out: list[Finding] = []
    for rule in RULES.values():
        out.extend(rule(env, merged, facts is not None))
    if include_kb:
        from zerodoctor.kb.preflight import known_failures  # loads YAML + pydantic; only when judging

        out.extend(known_failures(env.versions(), merged))
    return out


# ---- helpers -------------------------------------------------------------------------------------------


def fmt_bytes(n: float | None) -> str:
    if n is None:
        return "unknown"
    if n == float("inf"):
        return "unlimited"
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", 1024)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


def _finding(code: str, name: str, severity: Severity, title: str, message: str, **kw: Any) -> Finding:
    return Finding(id=code, severity=severity, title=title, message=message, source="env", name=name, **kw)


def _device(facts: Mapping[str, Any], key: str) -> str | None:
    v = facts.get(key)
    return v.strip().lower() if isinstance(v, str) and v.strip().lower() != "auto" else None


def _mm(version: str | None) -> tuple[int, int] | None:
    if not version:
        return None
    parts = version.split(".")
    try:
        return int(parts[0]), int(parts[1]) if len(parts) > 1 else 0
    except ValueError:
        return None


# ---- rules ----------------------------------------------------------------------------------------------


def env001_small_dev_shm(env: Environment, facts: Mapping[str, Any], has_setup: bool) -> list[Finding]:
    """/dev/shm smaller than 1 GiB where NCCL will run between GPUs of one node.

    Fires: shm 64 MiB (Docker default) and 8 GPUs -> error. shm 512 MiB and 2 GPUs -> warning.
    GPU count unknown (pip freeze / NVML failed) but NCCL_* variables set -> warning.
    Silent: shm >= 1 GiB; 0 or 1 GPU; NCCL_SHM_DISABLE=1; shm size unknown.
    """
    shm = env.host.shm_total_bytes if env.host else None
    if shm is None or shm >= SMALL_SHM_BYTES:
        return []
    if env.env_vars.get("NCCL_SHM_DISABLE", "0").strip() == "1":
        return []
    gpus = facts.get("env.gpu_count")
    uses_nccl = any(k.startswith("NCCL_") for k in env.env_vars)
    if isinstance(gpus, int):
        if gpus <= 1:
            return []
        who = f"{gpus} GPUs on this node"
    elif uses_nccl:
        who = "NCCL is configured (NCCL_* variables) and the GPU count is unknown"
    else:
        return []
    severity = (
        Severity.ERROR if shm <= DOCKER_DEFAULT_SHM_BYTES and isinstance(gpus, int) else Severity.WARNING
    )
    return [
        _finding(
            "ENV001",
            "env.small-dev-shm",
            severity,
            "/dev/shm is too small for NCCL between GPUs",
            f"/dev/shm is {fmt_bytes(shm)} (Docker's default is 64 MiB) while {who}; NCCL puts ~9.6 MB shared-"
            "memory segments there per peer and fails with 'Error while creating shared memory segment "
            "/dev/shm/nccl-*' / 'No space left on device' at the first collective. "
            "Restart the container with `--shm-size=16g` (or `--ipc=host`).",
            fixes=(
                Fix(
                    "Give the container a bigger /dev/shm: `docker run --shm-size=16g ...` or `--ipc=host`.",
                    target="env",
                ),
                Fix("On Kubernetes mount an `emptyDir: {medium: Memory}` volume at /dev/shm.", target="env"),
                Fix(
                    "Last resort (slower): `export NCCL_SHM_DISABLE=1`.",
                    command="export NCCL_SHM_DISABLE=1",
                    target="env",
                ),
            ),
            evidence=(Evidence(key="host.shm_total_bytes", text=fmt_bytes(shm)),),
            references=REFS_SHM,
            data={"shm_bytes": shm, "gpu_count": gpus},
        )
    ]


def env002_low_memlock(env: Environment, facts: Mapping[str, Any], has_setup: bool) -> list[Finding]:
    """Low locked-memory limit (`ulimit -l`) while offload pins host memory.

    Fires: memlock 8 MiB + offload_optimizer cpu + pin_memory true -> warning (confidence 0.4: low memlock is
    general CUDA behaviour, not confirmed in a DeepSpeed report). Without a setup -> info.
    Silent: unlimited / >= 1 GiB; the setup has no pinned offload; limit unknown.
    """
    h = env.host
    if (
        h is None
        or not h.memlock_known
        or h.memlock_soft_bytes is None
        or h.memlock_soft_bytes >= LOW_MEMLOCK_BYTES
    ):
        return []
    soft = h.memlock_soft_bytes
    pinned = [
        key.rsplit(".", 2)[-2]
        for dev_key, key in (
            (OFFLOAD_OPTIMIZER_DEVICE, OFFLOAD_OPTIMIZER_PIN),
            (OFFLOAD_PARAM_DEVICE, OFFLOAD_PARAM_PIN),
        )
        if _device(facts, dev_key) in ("cpu", "nvme") and truthy(facts.get(key)) is True
    ]
    hard = "unlimited" if h.memlock_hard_bytes is None else fmt_bytes(h.memlock_hard_bytes)
    common: dict[str, Any] = {
        "fixes": (
            Fix(
                "Raise the limit: `ulimit -l unlimited` in the launch script, or `docker run --ulimit memlock=-1`.",
                target="env",
            ),
            Fix(
                "Or turn pinning off: `pin_memory: false` under offload_optimizer/offload_param (slower host-GPU copies).",
                target="deepspeed",
                patch={"zero_optimization.offload_optimizer.pin_memory": False},
            ),
        ),
        "evidence": (Evidence(key="host.memlock_soft_bytes", text=fmt_bytes(soft)),),
        "references": REFS_PIN,
        "data": {"memlock_soft_bytes": soft, "memlock_hard_bytes": h.memlock_hard_bytes, "confirmed": False},
    }
    if pinned:
        return [
            _finding(
                "ENV002",
                "env.low-memlock-with-pinned-offload",
                Severity.WARNING,
                "Locked-memory limit is low while offload pins host memory",
                f"`ulimit -l` is {fmt_bytes(soft)} (hard limit {hard}) and the setup pins host memory for "
                f"{' and '.join(pinned)} (pin_memory: true). Pinning gigabytes under a low limit can fail as "
                "'CUDA error: out of memory' / 'invalid argument' in pin_memory() although the GPU is free "
                "(general CUDA behaviour, not confirmed as a DeepSpeed report). Run `ulimit -l unlimited` "
                "before launching, or set pin_memory: false.",
                confidence=0.4,
                **common,
            )
        ]
    if _no_pinned_offload(facts):
        return []  # the setup is known and pins nothing: nothing to say
    return [
        _finding(
            "ENV002",
            "env.low-memlock-with-pinned-offload",
            Severity.INFO,
            "Locked-memory limit is low (matters only for pinned offload)",
            f"`ulimit -l` is {fmt_bytes(soft)} (hard limit {hard}). If the run offloads with pin_memory: true "
            "and pinning fails, raise it with `ulimit -l unlimited`; give the DeepSpeed config to check.",
            confidence=0.4,
            **common,
        )
    ]


def _no_pinned_offload(facts: Mapping[str, Any]) -> bool:
    """True when the setup's facts show that neither offload pins host memory."""
    for dev_key, pin_key in (
        (OFFLOAD_OPTIMIZER_DEVICE, OFFLOAD_OPTIMIZER_PIN),
        (OFFLOAD_PARAM_DEVICE, OFFLOAD_PARAM_PIN),
    ):
        device = _device(facts, dev_key)
        if device is not None and device not in ("cpu", "nvme"):
            continue
        if pin_key in facts and truthy(facts[pin_key]) is False:
            continue
        return False
    return True


def env003_cuda_toolkit_mismatch(
    env: Environment, facts: Mapping[str, Any], has_setup: bool
) -> list[Finding]:
    """nvcc (the toolkit JIT builds use) vs the CUDA torch was built with, judged as DeepSpeed's
    `assert_no_cuda_mismatch` does.

    Fires: nvcc 12.1 with torch cu118 -> error when offload_optimizer needs a JIT-built cpu_adam, warning
    otherwise or when cpu_adam is prebuilt. nvcc 12.1 / torch 12.4 -> info (DeepSpeed accepts it).
    Silent: same major.minor; CPU/ROCm torch; nvcc or torch build unknown; DS_SKIP_CUDA_CHECK=1 -> info.
    """
    t = env.torch
    have, want = _mm(env.nvcc_version), _mm(t.cuda if t else None)
    if have is None or want is None or have == want or t is None:
        return []
    sys_v, torch_v = f"{have[0]}.{have[1]}", f"{want[0]}.{want[1]}"
    ds = env.deepspeed
    prebuilt = ds is not None and ds.op_prebuilt("cpu_adam")
    offload = _device(facts, OFFLOAD_OPTIMIZER_DEVICE) in ("cpu", "nvme")
    accepted = (
        have[0] == want[0]
        and sys_v in CUDA_MINOR_MISMATCH_OK.get(have[0], ())
        and torch_v in CUDA_MINOR_MISMATCH_OK.get(have[0], ())
    )
    skip = env.env_vars.get("DS_SKIP_CUDA_CHECK") == "1"
    evidence = (
        Evidence(key="nvcc_version", text=f"{sys_v} ({env.cuda_home or 'nvcc on PATH'})"),
        Evidence(key="torch.cuda", text=t.cuda),
    )
    fixes = (
        Fix(
            f"Use a CUDA {torch_v} toolkit for builds: point CUDA_HOME at it (e.g. /usr/local/cuda-{torch_v}).",
            target="env",
        ),
        Fix(
            f"Or install a torch built for CUDA {sys_v[: sys_v.index('.')]}.x that matches nvcc {sys_v}.",
            target="env",
        ),
        Fix(
            "Or prebuild the op where versions match: `DS_BUILD_CPU_ADAM=1 pip install deepspeed --no-cache-dir`.",
            command="DS_BUILD_CPU_ADAM=1 pip install deepspeed --no-cache-dir",
            target="env",
        ),
    )
    if accepted or skip:
        why = (
            "DS_SKIP_CUDA_CHECK=1 forces DeepSpeed to accept it"
            if skip and not accepted
            else "DeepSpeed accepts this minor mismatch within CUDA " + str(have[0])
        )
        return [
            _finding(
                "ENV003",
                "env.cuda-toolkit-mismatch",
                Severity.INFO,
                "CUDA toolkit and torch's CUDA differ in the minor version",
                f"nvcc is CUDA {sys_v} and torch was built with CUDA {t.cuda}; {why}, so JIT builds of DeepSpeed "
                f"ops proceed. If a build misbehaves, point CUDA_HOME at a CUDA {torch_v} toolkit.",
                fixes=fixes,
                evidence=evidence,
                references=REFS_CPU_ADAM,
            )
        ]
    if prebuilt:
        severity, consequence = (
            Severity.WARNING,
            (
                "cpu_adam is prebuilt so offload works, but any other op DeepSpeed JIT-builds here (fused_adam, ...) "
                "will fail with CUDAMismatchException"
            ),
        )
    elif offload:
        severity, consequence = (
            Severity.ERROR,
            (
                "offload_optimizer needs cpu_adam, which is not prebuilt, so its JIT build will fail with "
                "'CUDAMismatchException: ... Installed CUDA version "
                f"{sys_v} does not match the version torch was compiled with {t.cuda}' and the run stops at init "
                "(often followed by the red herring \"'DeepSpeedCPUAdam' object has no attribute 'ds_opt_adam'\")"
            ),
        )
    else:
        severity, consequence = (
            Severity.WARNING,
            (
                "every DeepSpeed op that has to be JIT-built here (cpu_adam for offload_optimizer, fused_adam, ...) "
                "will fail with CUDAMismatchException"
            ),
        )
    return [
        _finding(
            "ENV003",
            "env.cuda-toolkit-mismatch",
            severity,
            "CUDA toolkit (nvcc) does not match torch's CUDA: DeepSpeed op builds will fail",
            f"nvcc is CUDA {sys_v} but torch was built with CUDA {t.cuda}; {consequence}. "
            f"Point CUDA_HOME at a CUDA {torch_v} toolkit, or prebuild the ops with matching versions.",
            fixes=fixes,
            evidence=evidence,
            references=REFS_CPU_ADAM,
            data={"nvcc": sys_v, "torch_cuda": t.cuda, "cpu_adam_prebuilt": prebuilt},
        )
    ]


_OPTIMIZER_OPS = {"adam": "cpu_adam", "adamw": "cpu_adam", "adagrad": "cpu_adagrad", "lion": "cpu_lion"}


def env004_cpu_adam_unavailable(env: Environment, facts: Mapping[str, Any], has_setup: bool) -> list[Finding]:
    """Optimizer offload needs DeepSpeed's CPU optimizer op (cpu_adam, or cpu_lion/cpu_adagrad), and here it
    is neither prebuilt nor JIT-buildable (the deep probe's `is_compatible()`).

    Fires: offload_optimizer cpu + cpu_adam not installed + compatible False -> warning; same without a
    setup -> info; offload cpu, not prebuilt and compatibility unknown (no deep probe) -> info.
    Silent: prebuilt; compatible; the setup does not offload the optimizer; DeepSpeed not installed.
    """
    ds = env.deepspeed
    if ds is None or ds.import_ok is False:
        return []  # ENV005 says it
    device = _device(facts, OFFLOAD_OPTIMIZER_DEVICE)
    if device is not None and device not in ("cpu", "nvme"):
        return []
    opt = facts.get(OPTIMIZER_TYPE)
    op = _OPTIMIZER_OPS.get(opt.strip().lower(), "cpu_adam") if isinstance(opt, str) else "cpu_adam"
    if ds.op_prebuilt(op):
        return []
    compatible = ds.op_compatible(op)
    offload = device in ("cpu", "nvme")
    evidence = (
        Evidence(key=f"deepspeed.installed_ops.{op}", text=str(ds.installed_ops.get(op, False))),
        Evidence(
            key=f"deepspeed.compatible_ops.{op}", text="unknown" if compatible is None else str(compatible)
        ),
    )
    fixes = (
        Fix(
            f"Run `ds_report` and fix what makes {op} incompatible (CUDA_HOME/nvcc, python3-dev headers, ninja).",
            command="ds_report",
            target="env",
        ),
        Fix(
            f"Prebuild it: `DS_BUILD_{op.upper()}=1 pip install deepspeed --no-cache-dir`.",
            command=f"DS_BUILD_{op.upper()}=1 pip install deepspeed --no-cache-dir",
            target="env",
        ),
        Fix(
            "Or do not offload the optimizer (needs GPU memory for optimizer states; check with `zerodoctor plan`).",
            target="deepspeed",
            patch={"zero_optimization.offload_optimizer.device": "none"},
        ),
    )
    if compatible is None:
        if not offload:
            return []
        return [
            _finding(
                "ENV004",
                "env.cpu-adam-unavailable",
                Severity.INFO,
                f"Could not check whether {op} can be built here",
                f"The setup offloads the optimizer to {device}, which needs DeepSpeed's {op} op; it is not "
                "prebuilt and whether it can be JIT-built was not checked"
                f"{' (' + ds.probe_note + ')' if ds.probe_note else ''}. Run `zerodoctor env` (deep probe) or `ds_report` on the training node.",
                fixes=fixes,
                evidence=evidence,
                references=REFS_CPU_ADAM,
            )
        ]
    if compatible:
        return []
    why = ds.compat_errors.get(op)
    detail = f" ({why})" if why else ""
    if offload:
        return [
            _finding(
                "ENV004",
                "env.cpu-adam-unavailable",
                Severity.WARNING,
                f"offload_optimizer needs {op}, which is neither prebuilt nor buildable here",
                f"The setup offloads the optimizer to {device}; DeepSpeed will construct DeepSpeedCPUAdam, whose {op} "
                f"op is not prebuilt and is reported not compatible (ds_report: installed NO, compatible NO){detail}. "
                f"The run will fail at init. Fix the toolchain `ds_report` complains about, or prebuild {op}.",
                fixes=fixes,
                evidence=evidence,
                references=REFS_CPU_ADAM,
            )
        ]
    return [
        _finding(
            "ENV004",
            "env.cpu-adam-unavailable",
            Severity.INFO,
            f"{op} is neither prebuilt nor buildable here (matters only for optimizer offload)",
            f"DeepSpeed's {op} op is not prebuilt and is reported not compatible{detail}; a run with "
            "offload_optimizer would fail at init. Give the DeepSpeed config to check, or fix what `ds_report` shows.",
            fixes=fixes,
            evidence=evidence,
            references=REFS_CPU_ADAM,
        )
    ]


def env005_deepspeed_broken(env: Environment, facts: Mapping[str, Any], has_setup: bool) -> list[Finding]:
    """deepspeed is installed but importing it (in the deep probe subprocess) failed or crashed.

    Fires: import_ok False. Silent: import_ok True or unknown (no deep probe, timeout), not installed.
    """
    ds = env.deepspeed
    if ds is None or ds.import_ok is not False:
        return []
    version = env.version_of("deepspeed")
    if not version and version is not None:
        return []
    err = ds.import_error or ds.probe_note or "unknown error"
    return [
        _finding(
            "ENV005",
            "env.deepspeed-missing-or-broken",
            Severity.ERROR,
            "DeepSpeed is installed but cannot be imported",
            f"deepspeed {ds.version or version or '?'} is installed, but `import deepspeed` failed in a fresh "
            f"Python ({err}). Every ZeRO run will fail before training. Run `python -c 'import deepspeed'` to see "
            "the full error, then reinstall the matching torch/deepspeed pair.",
            fixes=(
                Fix("See the full error.", command="python -c 'import deepspeed'", target="env"),
                Fix(
                    "Reinstall DeepSpeed against the installed torch.",
                    command="pip install --force-reinstall --no-cache-dir deepspeed",
                    target="env",
                ),
            ),
            evidence=(Evidence(key="deepspeed.import_error", text=err),),
        )
    ]


def env006_no_gpu(env: Environment, facts: Mapping[str, Any], has_setup: bool) -> list[Finding]:
    """No NVIDIA GPU (a normal answer on a login node or CI; never an error). Silent when GPUs were not
    probed (pip freeze) or some were found."""
    if not env.gpus_probed or env.gpus:
        return []
    note = (env.gpu_probe_note or "NVML reports no devices").removeprefix("no GPU: ")
    return [
        _finding(
            "ENV006",
            "env.no-gpu",
            Severity.INFO,
            "No NVIDIA GPU on this machine",
            f"No GPU found ({note}). Fine for `plan`, `lint` and CPU tests; for GPU checks run "
            "`zerodoctor env --format json > env.json` on a training node and pass `--env env.json`.",
            evidence=(Evidence(key="gpus", text=note),),
        )
    ]


Rule = Callable[[Environment, Mapping[str, Any], bool], list[Finding]]

RULES: dict[str, Rule] = {
    "ENV001": env001_small_dev_shm,
    "ENV002": env002_low_memlock,
    "ENV003": env003_cuda_toolkit_mismatch,
    "ENV004": env004_cpu_adam_unavailable,
    "ENV005": env005_deepspeed_broken,
    "ENV006": env006_no_gpu,
}
"""The registry, in report order."""
