"""Launch `tiny_job` on N local ranks with torchrun and collect the per-rank results."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class JobResult:
    returncode: int
    ranks: list[dict[str, Any]]
    output: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and bool(self.ranks) and all(r.get("ok") for r in self.ranks)

    def first_error(self) -> dict[str, Any] | None:
        return next((r["error"] for r in self.ranks if r.get("error")), None)


def run_tiny_job(
    config: dict[str, Any],
    *,
    nproc: int = 2,
    steps: int = 2,
    timeout_s: int = 300,
    workdir: Path | None = None,
    client_optimizer: bool = False,
) -> JobResult:
    work = Path(workdir or tempfile.mkdtemp(prefix="zerodoctor-job-"))
    work.mkdir(parents=True, exist_ok=True)
    cfg = work / "ds_config.json"
    cfg.write_text(json.dumps(config))
    out = work / "out"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    cmd = torchrun_command(["-m", "zerodoctor.engine.tiny_job", str(cfg), str(out), "--steps", str(steps)], nproc)
    if client_optimizer:
        cmd.append("--client-optimizer")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=work)
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        end_launch(proc)  # never leave its ranks behind (subprocess.run would kill torchrun alone)
        raise
    ranks = [json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))] if out.exists() else []
    return JobResult(proc.returncode, ranks, stdout + stderr)


def torchrun_command(args: list[str], nproc: int = 2) -> list[str]:
    """`python -m torch.distributed.run` for `nproc` local ranks on a free port, then `args` (a script and its
    arguments, or `-m module ...`)."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        str(nproc),
        "--master_port",
        str(free_port()),
        *args,
    ]


def free_port() -> int:
    """A TCP port free on this machine now (for MASTER_PORT)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launched_processes(pid: int) -> list[Any]:
    """Every process under `pid` now (psutil.Process objects). Read it before ending a launcher: torchrun starts
    each rank in a session of its own (torch/distributed/elastic/multiprocessing/subprocess_handler/
    subprocess_handler.py: `start_new_session=True`), so its ranks are neither in its process group nor its
    children any more once it is gone."""
    import psutil  # type: ignore[import-untyped]

    try:
        return list(psutil.Process(pid).children(recursive=True))
    except psutil.Error:
        return []


def kill_leftovers(processes: list[Any], wait_s: float = 5.0) -> None:
    """SIGKILL whichever of `processes` still run (a rank stuck in a collective ignores nothing else reliably)."""
    import psutil

    alive = []
    for p in processes:
        try:
            p.send_signal(signal.SIGKILL)
            alive.append(p)
        except psutil.Error:  # already gone (or its pid reused by a process we may not signal)
            continue
    psutil.wait_procs(alive, timeout=wait_s)


def end_launch(proc: subprocess.Popen[Any], grace_s: float = 5.0) -> None:
    """End a launcher and every rank under it: SIGTERM first (torchrun then ends its ranks and writes its failure
    summary), SIGKILL after `grace_s`, then any rank it left behind. The launcher's process group is signalled when
    it leads one (started with `start_new_session=True`), else the launcher alone."""
    processes = launched_processes(proc.pid)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:  # no group of its own (or already gone: then send_signal does nothing)
            proc.send_signal(sig)
        except PermissionError:
            break
        try:
            proc.wait(timeout=grace_s)
            break
        except subprocess.TimeoutExpired:
            continue
    kill_leftovers(processes)
