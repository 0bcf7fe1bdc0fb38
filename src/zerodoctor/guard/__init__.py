"""The runtime guard: per-rank memory telemetry, device and placement checks, host-RAM trend, pre-save
headroom, hang watchdog and crash diagnosis for a live ZeRO run.

Importing this package imports neither torch, DeepSpeed nor transformers; `ZeroDoctorCallback` imports
transformers and `ZeroDoctorHook` (mmengine, XTuner) imports mmengine when first accessed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from zerodoctor.guard.devices import check_tensors_device
from zerodoctor.guard.ds_watch import Watcher, unwatch, watch
from zerodoctor.guard.monitor import Monitor
from zerodoctor.guard.options import GuardOptions

if TYPE_CHECKING:
    from zerodoctor.guard.hf import ZeroDoctorCallback
    from zerodoctor.guard.mmengine_hook import ZeroDoctorHook

__all__ = [
    "GuardOptions",
    "Monitor",
    "Watcher",
    "ZeroDoctorCallback",
    "ZeroDoctorHook",
    "check_tensors_device",
    "unwatch",
    "watch",
]


def __getattr__(name: str) -> Any:
    if name == "ZeroDoctorCallback":
        from zerodoctor.guard.hf import ZeroDoctorCallback

        return ZeroDoctorCallback
    if name == "ZeroDoctorHook":
        from zerodoctor.guard.mmengine_hook import ZeroDoctorHook

        return ZeroDoctorHook
    raise AttributeError(f"module 'zerodoctor.guard' has no attribute {name!r}")
