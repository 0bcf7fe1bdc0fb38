"""The guard's settings: keyword arguments of the adapters, or `ZERODOCTOR_GUARD_*` environment variables
(what `zerodoctor guard -- CMD` sets). Defaults watch and warn; nothing changes the run unless asked."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

ENV_PREFIX = "ZERODOCTOR_GUARD_"


@dataclass(frozen=True)
class GuardOptions:
    run_dir: Path | None = None
    """Where the per-rank files go (a `zerodoctor/` folder inside it). Default: the Trainer's output_dir,
    else the current directory."""
    every: int = 1
    """Write a sample every N optimizer steps (events are always written)."""
    host_measure: str = "auto"
    """What the host-RAM trend watches: auto (the cgroup when it has a limit, else the node), node, rss."""
    host_limit_bytes: int | None = None
    """Override the host limit the trend is projected against (default: the cgroup limit, else node RAM)."""
    trend_window: int = 30
    trend_min_points: int = 5
    trend_min_growth_bytes: int = 64 << 20
    trend_horizon_s: float = 2 * 3600.0
    """Warn when the projected time to the host limit is shorter than this."""
    watchdog: bool = True
    hang_factor: float = 10.0
    """A step is declared hung after this many times the longest step seen (and at least hang_min_s)."""
    hang_min_s: float = 600.0
    hang_first_s: float = 1800.0
    """Timeout before the first optimizer step completes (model load, first Adam allocation, compile)."""
    check_devices: bool = True
    lint_config: bool = True
    predict: bool = True
    save_headroom: bool = True
    save_without_optimizer: bool = False
    """Opt in: when a save's predicted spike does not fit, save that checkpoint without optimizer state."""
    log_to_trainer: bool = True
    exception_hooks: bool = True
    diagnose_on_error: bool = True
    fault: str | None = None
    """Testing the guard itself: raise inside the named guard method once ("step_end", "sample", ...)."""

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> GuardOptions:
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        for f in fields(cls):
            raw = env.get(ENV_PREFIX + f.name.upper())
            if raw is None or raw == "":
                continue
            values[f.name] = _parse(f.name, str(f.type), raw)
        opts = cls(**values)
        given = {k: v for k, v in overrides.items() if v is not None}
        if "run_dir" in given:
            given["run_dir"] = Path(given["run_dir"])
        return replace(opts, **given) if given else opts

    def to_env(self) -> dict[str, str]:
        """The environment variables that reproduce these options in a child process."""
        out: dict[str, str] = {}
        default = GuardOptions()
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None or value == getattr(default, f.name):
                continue
            out[ENV_PREFIX + f.name.upper()] = (
                ("1" if value else "0") if isinstance(value, bool) else str(value)
            )
        return out


def _parse(name: str, typ: str, raw: str) -> Any:
    from zerodoctor.errors import UsageError
    from zerodoctor.safeio import MAX_MAGNITUDE, MAX_SECONDS, shown

    try:
        if typ.startswith("bool"):
            low = raw.strip().lower()
            if low not in ("1", "0", "true", "false", "yes", "no", "on", "off"):
                raise ValueError(raw)
            return low in ("1", "true", "yes", "on")
        if typ.startswith(("int", "float")):
            value = float(raw)  # every number of the guard is a count, a size, seconds or a factor: above 0
            top = MAX_MAGNITUDE if typ.startswith("int") else MAX_SECONDS  # a timer overflows near 1e12 s
            if not math.isfinite(value) or value <= 0 or value > top:
                raise ValueError(raw)
            return int(value) if typ.startswith("int") else value
        if typ.startswith("Path"):
            return Path(raw)
        if name == "host_measure" and raw not in ("auto", "node", "rss"):
            raise ValueError(raw)
    except ValueError:
        raise UsageError(
            f"{ENV_PREFIX}{name.upper()}={shown(raw, 40)!r} is not a valid {typ.split(' ')[0]}"
            + (" above 0" if typ.startswith(("int", "float")) else "")
            + (": one of auto, node, rss" if name == "host_measure" else ""),
            hint="fix or unset the variable",
        ) from None
    return raw
