"""The `env` subsystem: probe (or load) the machine and Python stack, then judge it.

    collect(deep=True) -> Environment          live probe (env/collect.py, env/probes.py)
    load_env(path) -> Environment              JSON snapshot or pip freeze (env/snapshot.py)
    judge_environment(env, facts) -> [Finding] ENV rules + known-bad versions (env/judge.py)

Importing this package imports neither torch nor deepspeed.
"""

from __future__ import annotations

from zerodoctor.env.collect import collect
from zerodoctor.env.judge import judge_environment
from zerodoctor.env.model import DeepSpeedInfo, Environment, GpuInfo, HostInfo, PackageInfo, TorchInfo
from zerodoctor.env.snapshot import load_env

__all__ = [
    "DeepSpeedInfo",
    "Environment",
    "GpuInfo",
    "HostInfo",
    "PackageInfo",
    "TorchInfo",
    "collect",
    "judge_environment",
    "load_env",
]
