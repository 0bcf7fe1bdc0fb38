"""Shared real-engine runs for the guard tests: each job runs once per session and many tests read it."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from zerodoctor.engine.launch import torchrun_command

JOB = Path(__file__).parent / "jobs" / "guard_job.py"
MM_JOB = Path(__file__).parent / "jobs" / "mmengine_job.py"
HANG_JOB = Path(__file__).parent / "jobs" / "hang_job.py"


@dataclass
class Run:
    out: Path
    returncode: int
    output: str

    def records(self, rank: int) -> list[dict]:
        path = self.out / "zerodoctor" / f"rank{rank}.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def kinds(self, rank: int, kind: str) -> list[dict]:
        return [r for r in self.records(rank) if r["kind"] == kind]

    def events(self, rank: int) -> list[str]:
        return [r["event"] for r in self.kinds(rank, "event")]

    def findings(self, rank: int) -> list[dict]:
        return [r["finding"] for r in self.kinds(rank, "finding")]


def torchrun_cmd(script_args: list[str]) -> list[str]:
    return torchrun_command(script_args, 2)


# `zerodoctor guard` options that make every save look short of host memory (a limit below what each rank
# already uses) and opt in to saving those checkpoints without optimizer state
SHORT_OF_HOST_RAM = ["--host-measure", "rss", "--host-limit-gib", "0.25", "--save-without-optimizer"]


def torchrun(
    mode: str, out: Path, *flags: str, env: dict | None = None, prefix: list[str] | None = None
) -> Run:
    return launch([str(JOB), mode, str(out), *flags], out, env=env, prefix=prefix)


def launch(
    script_args: list[str], out: Path, *, env: dict | None = None, prefix: list[str] | None = None
) -> Run:
    """2 ranks of a job script under torchrun (gloo, CPU)."""
    cmd = [*(prefix or []), *torchrun_cmd(script_args)]
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", **(env or {})}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=400, env=full_env, cwd=out.parent)
    return Run(out, proc.returncode, proc.stdout + proc.stderr)


ENGINE_FLAGS = ("--grow", "--wrong-device", "--raise-on-rank", "1", "--hang-seconds", "8")
# rank 1 stays 8 s away from a collective rank 0 waits in: with a 2 s hang timeout both watchdogs dump
ENGINE_ENV = {
    "ZERODOCTOR_GUARD_HOST_MEASURE": "rss",
    "ZERODOCTOR_GUARD_HANG_MIN_S": "2",
    "ZERODOCTOR_GUARD_HANG_FACTOR": "1",
}


@pytest.fixture(scope="session")
def hf_run(tmp_path_factory) -> Run:
    pytest.importorskip("deepspeed")
    pytest.importorskip("transformers")
    out = tmp_path_factory.mktemp("hf") / "run"
    return torchrun("hf", out, *ENGINE_FLAGS, env={**ENGINE_ENV, "ZERODOCTOR_GUARD_FAULT": "on_epoch_begin"})


@pytest.fixture(scope="session")
def ds_run(tmp_path_factory) -> Run:
    pytest.importorskip("deepspeed")
    out = tmp_path_factory.mktemp("ds") / "run"
    return torchrun("ds", out, *ENGINE_FLAGS, env={**ENGINE_ENV, "ZERODOCTOR_GUARD_FAULT": "ds_step"})


@pytest.fixture(scope="session")
def mm_run(tmp_path_factory) -> Run:
    """mmengine's FlexibleRunner + DeepSpeedStrategy (XTuner's runner) with the hook named in the config's
    custom_hooks: 8 iterations of 2-step accumulation (4 optimizer steps) of a 32-iteration epoch, a save every
    4 iterations, an injected guard fault, and rank 1 raising after training."""
    pytest.importorskip("deepspeed")
    pytest.importorskip("mmengine")
    out = tmp_path_factory.mktemp("mm") / "run"
    env = {**ENGINE_ENV, "ZERODOCTOR_GUARD_FAULT": "before_train_epoch"}
    flags = ["--samples", "128", "--accum", "2", "--raise-on-rank", "1"]
    return launch([str(MM_JOB), str(out), *flags], out, env=env)
