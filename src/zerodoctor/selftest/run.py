"""Launch the selftest on N local ranks with torchrun, under a watchdog, and judge what the ranks recorded.

The watchdog reads each rank's phase log while the job runs. A phase that runs past its limit on any rank,
or ranks still running long after another rank failed or died, end the whole process group (SIGTERM, then
SIGKILL): no rank is left waiting in a collective for a partner that is gone. Before it ends a run that is
still going, it asks every live rank for its Python stacks (SIGUSR1, answered by `faulthandler` even inside
a collective), so the judge can tell the rank that hung from the ranks that were waiting for it.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zerodoctor.engine.launch import end_launch, torchrun_command
from zerodoctor.errors import UsageError
from zerodoctor.selftest.result import SelftestResult
from zerodoctor.selftest.shrink import TINY_VOCAB
from zerodoctor.selftest.spec import SelftestSpec, run_config

DEFAULT_TIMEOUT_S = 600
PHASE_LIMITS_S = {"distributed-init": 420.0, "model-build": 120.0, "engine-init": 420.0}
"""Per-phase limits of the setup phases. Both can include a JIT build of a DeepSpeed op: the CPU
accelerator builds its shared-memory collectives op in distributed init, CPU Adam is built in engine init
(each one to two minutes on a busy 2-core machine)."""
DEFAULT_PHASE_LIMIT_S = 120.0
AFTER_FAILURE_GRACE_S = 15.0
"""How long the other ranks may run on after one rank failed or died, before the watchdog ends them."""


@dataclass
class RankLog:
    """What one rank wrote to its phase log so far."""

    rank: int
    events: list[dict[str, Any]] = field(default_factory=list)
    stack: str = ""  # Python stacks dumped on the watchdog's SIGUSR1 (the rank ran on)
    term: str = ""  # Python stacks dumped on SIGTERM: the rank was ended by torchrun or the watchdog

    @property
    def pid(self) -> int | None:
        hello = next((e for e in self.events if e.get("event") == "hello"), None)
        return int(hello["pid"]) if hello and isinstance(hello.get("pid"), int) else None

    @property
    def progress(self) -> int:
        """How far this rank got: phases started plus steps marked (every rank runs the same sequence)."""
        return sum(1 for e in self.events if e.get("event") in ("start", "mark"))

    @property
    def last_mark(self) -> dict[str, Any] | None:
        return next((e for e in reversed(self.events) if e.get("event") == "mark"), None)

    @property
    def last_time(self) -> float | None:
        return max((float(e["t"]) for e in self.events if "t" in e), default=None)

    def current(self) -> tuple[str, float] | None:
        """(phase, start time) of the phase this rank is in, or None."""
        open_: dict[str, float] = {}
        for e in self.events:
            if e.get("event") == "start":
                open_[e["phase"]] = e["t"]
            elif e.get("event") in ("end", "error"):
                open_.pop(e.get("phase", ""), None)
        if not open_:
            return None
        phase = max(open_, key=lambda k: open_[k])
        return phase, open_[phase]

    @property
    def done(self) -> bool:
        return any(e.get("event") == "done" for e in self.events)

    @property
    def error(self) -> dict[str, Any] | None:
        return next((e for e in self.events if e.get("event") == "error"), None)

    def data(self, phase: str) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for e in self.events:
            if e.get("event") == "data" and e.get("phase") == phase:
                out.update(e.get("values") or {})
        return out


@dataclass
class Launch:
    """What the launcher saw: per-rank logs, the exit code, the watchdog's intervention, timing."""

    ranks: list[RankLog]
    returncode: int | None
    log_path: Path
    workdir: Path
    wall_seconds: float
    watchdog: dict[str, Any] | None = None
    output_tail: str = ""
    # torchrun's failure summary: exit code (negative: the signal) per rank, and its "first observed failure"
    exit_codes: dict[int, int] = field(default_factory=dict)
    root_cause_rank: int | None = None


def read_rank_logs(out: Path, nranks: int) -> list[RankLog]:
    logs = []
    for r in range(nranks):
        path = out / f"rank{r}.jsonl"
        events: list[dict[str, Any]] = []
        if path.exists():
            for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
                try:
                    events.append(json.loads(line))
                except json.JSONDecodeError:
                    continue  # a line cut by a kill
        logs.append(RankLog(r, events, _read(out / f"rank{r}.stack"), _read(out / f"rank{r}.term")))
    return logs


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")[:200_000]
    except OSError:
        return ""


_TORCHRUN_FAILURE = re.compile(
    r"rank\s*:\s*(?P<rank>\d+)\s*\(local_rank:\s*\d+\)\s*\n\s*exitcode\s*:\s*(?P<code>-?\d+)"
)
_TORCHRUN_ROOT = re.compile(
    r"Root Cause \(first observed failure\):\s*\n\s*\[\d+\]:\s*\n(?P<block>(?:.*\n){0,4})"
)


def torchrun_failures(text: str) -> tuple[dict[int, int], int | None]:
    """Exit code per rank and the rank of the "first observed failure" from torchrun's ChildFailedError
    summary (torch/distributed/elastic/multiprocessing/errors): e.g. rank 1 exitcode 17, rank 0 -15 (SIGTERM,
    which torchrun sent it after rank 1 failed)."""
    codes = {int(m["rank"]): int(m["code"]) for m in _TORCHRUN_FAILURE.finditer(text)}
    root = _TORCHRUN_ROOT.search(text)
    first = _TORCHRUN_FAILURE.search(root["block"]) if root else None
    return codes, int(first["rank"]) if first else None


STACK_WAIT_S = 3.0
"""How long the watchdog waits for the ranks' stacks (SIGUSR1) before it ends them."""


def _ask_for_stacks(logs: list[RankLog], out: Path) -> None:
    """SIGUSR1 to every rank still running; wait until each has written its stacks (or STACK_WAIT_S)."""
    asked = []
    sigusr1 = getattr(signal, "SIGUSR1", None)
    for rl in logs:
        if sigusr1 is None or rl.pid is None or rl.done or rl.error is not None:
            continue
        try:
            os.kill(rl.pid, sigusr1)
            asked.append(out / f"rank{rl.rank}.stack")
        except (ProcessLookupError, PermissionError):
            continue
    deadline = time.time() + STACK_WAIT_S
    while asked and time.time() < deadline:
        time.sleep(0.1)
        if all(p.exists() and p.stat().st_size > 0 for p in asked):
            time.sleep(0.2)  # let the dump finish
            return


def _die_with_parent() -> None:
    """In the torchrun child, before exec: get SIGTERM when the launching process dies (Linux), so a killed
    `zerodoctor selftest` (a CI timeout) does not leave ranks behind holding DeepSpeed's JIT build lock."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGTERM)
    except Exception:  # noqa: BLE001 - not Linux: the watchdog still ends the group while we live
        pass


def stale_build_locks(older_than: float) -> list[tuple[Path, float]]:
    """torch's JIT-build lock files (TORCH_EXTENSIONS_DIR or ~/.cache/torch_extensions) created before
    `older_than` (a time): a build killed while holding one leaves every later DeepSpeed op load waiting on
    it forever (torch.utils.file_baton.FileBaton)."""
    root = Path(os.environ.get("TORCH_EXTENSIONS_DIR") or Path.home() / ".cache" / "torch_extensions")
    found = []
    for lock in list(root.glob("*/*/lock")) + list(root.glob("*/lock")):
        try:
            mtime = lock.stat().st_mtime
        except OSError:
            continue
        if mtime < older_than:
            found.append((lock, mtime))
    return found




def launch(
    worker_spec: Mapping[str, Any],
    *,
    ranks: int,
    timeout_s: float,
    phase_limits: Mapping[str, float],
    default_limit_s: float,
    workdir: Path,
) -> Launch:
    out = workdir / "ranks"  # `workdir` is a directory this run claimed (see `claim_workdir`): nothing in it yet
    out.mkdir(parents=True)
    spec_path = workdir / "selftest_spec.json"
    spec_path.write_text(json.dumps(worker_spec, indent=1, default=str))
    log_path = workdir / "selftest.log"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"}
    cmd = torchrun_command(
        ["--tee", "3", "--log-dir", str(workdir / "torchrun"), "-m", "zerodoctor.selftest.worker", str(spec_path), str(out)],
        ranks,
    )
    t0 = time.time()
    watchdog: dict[str, Any] | None = None
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=workdir,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        try:
            first_failure_at: float | None = None
            while proc.poll() is None:
                time.sleep(0.25)
                now = time.time()
                logs = read_rank_logs(out, ranks)
                for rl in logs:
                    cur = rl.current()
                    if cur is None:
                        continue
                    phase, started = cur
                    limit = phase_limits.get(phase, default_limit_s)
                    if now - started > limit:
                        watchdog = {
                            "reason": "phase-limit",
                            "phase": phase,
                            "rank": rl.rank,
                            "seconds": round(now - started, 1),
                            "limit_s": limit,
                        }
                        break
                if watchdog is None:
                    failed = any(rl.error for rl in logs) or any(rl.done for rl in logs)
                    if failed and not all(rl.done or rl.error for rl in logs):
                        first_failure_at = first_failure_at or now
                        if now - first_failure_at > AFTER_FAILURE_GRACE_S and any(rl.error for rl in logs):
                            stuck = [rl for rl in logs if not (rl.done or rl.error)]
                            cur = stuck[0].current() if stuck else None
                            watchdog = {
                                "reason": "after-failure",
                                "rank": stuck[0].rank if stuck else None,
                                "phase": cur[0] if cur else None,
                                "seconds": round(now - first_failure_at, 1),
                                "limit_s": AFTER_FAILURE_GRACE_S,
                            }
                if watchdog is None and now - t0 > timeout_s:
                    watchdog = {
                        "reason": "total-timeout",
                        "seconds": round(now - t0, 1),
                        "limit_s": timeout_s,
                    }
                if watchdog is not None:
                    _ask_for_stacks(logs, out)
                    end_launch(proc)
                    break
        finally:
            if proc.poll() is None:
                end_launch(proc)
    wall = round(time.time() - t0, 2)
    if watchdog is not None and watchdog.get("phase") in ("distributed-init", "engine-init"):
        watchdog["stale_locks"] = [(str(p), m) for p, m in stale_build_locks(t0)]
    text = log_path.read_bytes().decode("utf-8", errors="replace")
    codes, root = torchrun_failures(text[-200_000:])
    return Launch(
        read_rank_logs(out, ranks),
        proc.returncode,
        log_path,
        workdir,
        wall,
        watchdog,
        text[-6000:],
        codes,
        root,
    )


DEFAULT_RANKS = 2


@dataclass(frozen=True)
class LocalDevices:
    """What the ranks will run on: `gpus` CUDA devices torch can see (the nccl path), or none (gloo with
    DeepSpeed's CPU accelerator on `cores` usable cores)."""

    gpus: int
    cores: int
    note: str = ""  # how that was decided, when it is not plain

    @property
    def max_ranks(self) -> int:
        # nccl: one rank per GPU (two ranks on one GPU fail in NCCL: "Duplicate GPU detected");
        # CPU: one gloo rank per core (more only makes every collective wait on the slowest rank, until the
        # phase limits end a run that is merely slow); two are always allowed, as the default needs them
        return self.gpus if self.gpus else max(DEFAULT_RANKS, self.cores)

    @property
    def default_ranks(self) -> int:
        return min(DEFAULT_RANKS, self.gpus) if self.gpus else DEFAULT_RANKS


def local_devices(environ: Mapping[str, str] | None = None) -> LocalDevices:
    """The devices the selftest's ranks would use, decided as DeepSpeed decides its accelerator: a
    `DS_ACCELERATOR` the user set, else CUDA when torch sees a GPU, else the CPU. torch is imported only on a
    machine with a GPU driver (/dev/nvidiactl, or /dev/kfd for ROCm), so the CPU path stays light."""
    env = os.environ if environ is None else environ
    try:
        cores = len(os.sched_getaffinity(0))  # respects cgroup/taskset pinning
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    forced = env.get("DS_ACCELERATOR", "").strip().lower()
    if forced == "cpu":
        return LocalDevices(0, cores, "DS_ACCELERATOR=cpu")
    if not forced and not (Path("/dev/nvidiactl").exists() or Path("/dev/kfd").exists()):
        return LocalDevices(0, cores)
    try:
        import torch

        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception as exc:  # noqa: BLE001 - the worker then says what torch does; do not guess here
        return LocalDevices(0, cores, f"could not ask torch for GPUs: {type(exc).__name__}: {exc}")
    visible = env.get("CUDA_VISIBLE_DEVICES")
    return LocalDevices(gpus, cores, f"CUDA_VISIBLE_DEVICES={visible}" if visible is not None else "")


def check_ranks(ranks: int | None, devices: LocalDevices) -> int:
    """The number of ranks to run: `ranks` when this machine can run them, the default when None.
    Raises UsageError, before anything is launched, for a number the machine cannot run."""
    if ranks is None:
        return devices.default_ranks
    if ranks < 1:
        raise UsageError(f"--ranks must be at least 1, got {ranks}")
    if ranks <= devices.max_ranks:
        return ranks
    note = f" ({devices.note})" if devices.note else ""
    if devices.gpus:
        raise UsageError(
            f"--ranks {ranks}: torch sees {devices.gpus} CUDA GPU{'s' if devices.gpus != 1 else ''} here{note}, "
            "and the selftest runs one rank per GPU (nccl cannot put two ranks on one GPU): pass --ranks "
            f"{devices.gpus} or fewer"
        )
    raise UsageError(
        f"--ranks {ranks}: no CUDA GPU here{note}, so the ranks run on the CPU path (gloo), and this machine "
        f"has {devices.cores} usable CPU core{'s' if devices.cores != 1 else ''}: more ranks than cores only "
        "makes every collective wait on the slowest rank until the phase limits end a run that is merely "
        f"slow. Pass --ranks {devices.max_ranks} or fewer (the ZeRO code paths are the same with 2 ranks)"
    )


WORKDIR_MARK = ".zerodoctor-selftest"
"""The file that marks a --workdir directory as claimed by a selftest run."""


def claim_workdir(workdir: Path) -> Path:
    """A directory for this run's files that holds nothing yet, so that nothing of the user's is deleted or
    overwritten: `workdir` itself when it is new or empty (claimed by creating WORKDIR_MARK in it, exclusively,
    so two runs cannot share it), else a new subdirectory `workdir/zerodoctor-selftest-N` (N = 1, 2, ...)."""
    from zerodoctor.safeio import shown

    def refuse(exc: OSError) -> UsageError:  # a file of that name, not writable, a name too long
        return UsageError(
            f"--workdir {shown(workdir, 80)}: cannot make the run's directory there: {exc.strerror or exc}",
            hint="name a new or existing writable directory",
        )

    try:
        workdir.mkdir(parents=True, exist_ok=True)
        if not any(workdir.iterdir()):
            try:
                os.close(os.open(workdir / WORKDIR_MARK, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
                return workdir
            except FileExistsError:  # another run claimed it first
                pass
        for i in range(1, 10_000):
            sub = workdir / f"zerodoctor-selftest-{i}"
            try:
                sub.mkdir()
            except FileExistsError:
                continue
            os.close(os.open(sub / WORKDIR_MARK, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
            return sub
    except OSError as exc:
        raise refuse(exc) from None
    raise UsageError(
        f"--workdir {shown(workdir, 80)}: holds 9,999 earlier zerodoctor-selftest-N runs",
        hint="remove old runs or name another directory",
    )


def run_selftest(
    spec: SelftestSpec,
    *,
    ranks: int | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    phase_timeout_s: float | None = None,
    workdir: Path | None = None,
) -> SelftestResult:
    """Run `spec` for real on `ranks` local processes and judge it (see `zerodoctor.selftest.judge`).

    `ranks`: default 2, or 1 on a machine with one GPU; more than the GPUs torch sees (nccl) or than the
    usable cores (CPU path) is a UsageError, raised before anything is launched. `phase_timeout_s` is the
    limit of each phase after engine init (default 120 s); the setup phases keep theirs (engine init allows a
    JIT build of DeepSpeed's CPU Adam).
    """
    ranks = check_ranks(ranks, local_devices())
    from zerodoctor.selftest.judge import judge

    work = claim_workdir(Path(workdir)) if workdir else Path(tempfile.mkdtemp(prefix="zerodoctor-selftest-"))
    config, rank_changes = run_config(spec, ranks)
    _nvme_paths(config, work)
    text = spec.model_config.get("text_config") if spec.builder == "image-text-to-text" else spec.model_config
    vocab = int((text or {}).get("vocab_size", TINY_VOCAB))
    worker_spec = {
        **spec.to_dict(),
        "ds_config": config,
        "vocab_size": vocab - 1,
        "collective_timeout_s": max(30.0, min(timeout_s, 2 * (phase_timeout_s or timeout_s))),
    }
    limits = dict(PHASE_LIMITS_S)  # the setup phases keep theirs: imports and a JIT build are slow
    default_limit = phase_timeout_s or DEFAULT_PHASE_LIMIT_S
    result = launch(
        worker_spec,
        ranks=ranks,
        timeout_s=timeout_s,
        phase_limits=limits,
        default_limit_s=default_limit,
        workdir=work,
    )
    return judge(spec, result, ranks=ranks, rank_changes=rank_changes)


def _nvme_paths(config: dict[str, Any], work: Path) -> None:
    zero = config.get("zero_optimization")
    if not isinstance(zero, dict):
        return
    for part in ("offload_optimizer", "offload_param"):
        block = zero.get(part)
        if isinstance(block, dict) and block.get("nvme_path") == "<NVME>":
            path = work / "nvme"
            path.mkdir(exist_ok=True)
            block["nvme_path"] = str(path)
