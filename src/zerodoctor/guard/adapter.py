"""What every framework adapter (HF callback, mmengine hook, DeepSpeed engine watcher) shares: the "never
raise" wrapper for its entry points, the pre-save headroom check and the headline figures it hands to the
framework's own logger. The adapters only translate their framework's events into `Monitor` calls."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any, TypeVar

from zerodoctor.findings import Evidence, Finding, Fix, Severity
from zerodoctor.guard.monitor import GIB, MIB, Monitor
from zerodoctor.guard.probes import host_limit

F = TypeVar("F", bound=Callable[..., Any])


def guarded(fn: F) -> F:
    """An adapter method never raises: the guard's own errors are logged once and training goes on. The
    adapter has `monitor` (None before train begin) and `_early_error` (one warning before there is one)."""

    @functools.wraps(fn)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        mon: Monitor | None = self.monitor
        try:
            if mon is not None:
                mon.fault_point(fn.__name__)
            return fn(self, *args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - never stop the run
            if mon is not None:
                mon.guard_error(fn.__name__, exc)
            elif not self._early_error:
                self._early_error = True
                logging.getLogger("zerodoctor.guard").warning(
                    "zerodoctor guard: internal error in %s ignored: %s", fn.__name__, exc
                )
            return None

    return wrapper  # type: ignore[return-value]


def size_text(n: int) -> str:
    return f"{n / GIB:.2f} GiB" if abs(n) >= GIB else f"{n / MIB:.1f} MiB"


def headline(mon: Monitor) -> dict[str, float | int | None]:
    """The few figures an adapter adds to the framework's own log (TensorBoard, W&B, MLflow see them)."""
    s = mon.last_sample
    out: dict[str, float | int | None] = {}
    if "gpu_allocated_peak" in s:
        out["gpu_peak_allocated_gib"] = round(s["gpu_allocated_peak"] / GIB, 3)
        out["gpu_reserved_gib"] = round(s["gpu_reserved"] / GIB, 3)
        out["gpu_alloc_retries"] = s["gpu_alloc_retries"]
    if "rss" in s:
        out["host_rss_gib"] = round(s["rss"] / GIB, 3)
        used, limit, _w = host_limit(s)
        out["host_used_of_limit"] = round(used / limit, 4) if limit else None
    if mon.step_times:
        out["step_s"] = round(mon.step_times[-1], 4)
    return out


class SaveGuard:
    """Before each checkpoint save: the predicted save spike against free GPU and host memory (one warning
    per run), and the opt-in `save_without_optimizer`; then the save's begin and end events."""

    def __init__(self, monitor: Monitor) -> None:
        self.monitor = monitor
        self._warned = False

    def before(
        self, step: int, *, optimizer_state_saved: bool = True, can_skip_optimizer: bool = False
    ) -> bool:
        """Record the save's start; True when this save should leave out optimizer state (the user opted in,
        the adapter can do it, and the predicted spike does not fit)."""
        mon = self.monitor
        spike = self.predicted_spike()
        skip = False
        if mon.options.save_headroom and spike:
            short = self.shortfall(spike)
            if short:
                skip = mon.options.save_without_optimizer and optimizer_state_saved and can_skip_optimizer
                if skip:
                    mon.event("save_without_optimizer", reason="; ".join(short))
                if not self._warned:
                    self._warned = True
                    mon.add_finding(headroom_finding(mon, spike, short, skip))
        mon.save_begin(step, predicted_spike=spike)
        return skip

    def after(self, step: int) -> None:
        self.monitor.save_end(step)

    def predicted_spike(self) -> dict[str, int] | None:
        """The save's extra memory: the planner's save phase minus steady, else the largest save seen."""
        mon = self.monitor
        pred = mon.prediction or {}
        spike: dict[str, int] = {}
        if pred.get("available"):
            s = pred.get("save_spike") or {}
            if s.get("host_bytes_per_node") is not None:
                spike["host"] = max(int(s["host_bytes_per_node"]), 0)
            if pred.get("gpu_is_real") and s.get("gpu_bytes") is not None:
                spike["gpu"] = max(int(s["gpu_bytes"]), 0)
        for past in mon.save_peaks:
            d = past.get("cgroup_usage_delta", past.get("node_used_delta"))
            if d is not None:
                spike["host"] = max(spike.get("host", 0), int(d))
        return spike or None

    def shortfall(self, spike: dict[str, int]) -> list[str]:
        """What does not fit, in words with the user's numbers (empty when the save fits)."""
        mon = self.monitor
        s = mon.last_sample
        short: list[str] = []
        if "gpu" in spike and "gpu_free" in s:
            free_gpu = int(s["gpu_free"]) + int(s.get("gpu_reserved", 0)) - int(s.get("gpu_allocated", 0))
            if spike["gpu"] > free_gpu:
                short.append(
                    f"GPU: needs {size_text(spike['gpu'])} more, {size_text(free_gpu)} free on rank {mon.rank}"
                )
        measure = mon.host_measure(s) if "node_used" in s else None
        if "host" in spike and measure is not None:
            used, limit, what = measure
            free = limit - used
            if spike["host"] > free:
                room = (
                    f"{size_text(free)} free" if free >= 0 else f"already {size_text(-free)} over the limit"
                )
                short.append(
                    f"host ({what}): needs {size_text(spike['host'])} more, {room} "
                    f"({size_text(used)} used of {size_text(limit)})"
                )
        return short


def headroom_finding(mon: Monitor, spike: dict[str, int], short: list[str], skipped: bool) -> Finding:
    return Finding(
        id="guard.save-headroom",
        severity=Severity.WARNING,
        title="the next checkpoint save may not fit in memory",
        message=f"before the save at step {mon.step}: "
        + "; ".join(short)
        + (
            " -- saving this checkpoint without optimizer state (save_without_optimizer is on)"
            if skipped
            else ""
        ),
        fixes=(
            Fix(
                "save without optimizer state (HF: save_only_model: true; mmengine/XTuner: "
                "default_hooks.checkpoint.save_optimizer=False; resuming then restarts the optimizer), or pass "
                "save_without_optimizer=True to the guard to do it only when needed"
            ),
            Fix(
                "with ZeRO-3, set stage3_gather_16bit_weights_on_model_save: false and consolidate offline "
                "with zero_to_fp32.py"
            ),
        ),
        evidence=(Evidence(key="save", text=f"step {mon.step}, predicted spike {spike}"),),
        references=("hiyouga/LlamaFactory#7532", "deepspeedai/DeepSpeed#6598"),
        data={"spike": spike, "short": short, "saved_without_optimizer": skipped, "mib": MIB},
    )
