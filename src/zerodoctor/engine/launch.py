"""Launch `tiny_job` on N local ranks with torchrun and collect the per-rank results."""

from __future__ import annotations

import json
import os
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
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env, cwd=work)
    ranks = [json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))] if out.exists() else []
    return JobResult(proc.returncode, ranks, proc.stdout + proc.stderr)


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
