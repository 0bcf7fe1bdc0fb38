"""zerodoctor: make DeepSpeed ZeRO fine-tuning runs predictable.

Before launch (`env`, `lint`, `plan`, `check`), after a failure (`diagnose`) and during a run (the guard).
The library returns values; only `zerodoctor.cli` prints.
"""

from __future__ import annotations

__version__ = "0.1.0"
