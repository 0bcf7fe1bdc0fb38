"""`zerodoctor selftest`: run the user's own ZeRO setup for real, in miniature, on the installed stack.

spec (read the setup once: `spec_from_setup`) -> run (torchrun + watchdog, one worker per rank) -> judge
(phases, positive checks, findings; `zerodoctor.diagnose` on failure). torch and DeepSpeed load only in the
worker processes.
"""

from __future__ import annotations

from zerodoctor.selftest.result import CheckResult, PhaseResult, SelftestResult
from zerodoctor.selftest.run import run_selftest
from zerodoctor.selftest.shrink import Adaptation
from zerodoctor.selftest.spec import SelftestSpec, default_spec, spec_from_run, spec_from_setup

__all__ = [
    "Adaptation",
    "CheckResult",
    "PhaseResult",
    "SelftestResult",
    "SelftestSpec",
    "default_spec",
    "run_selftest",
    "spec_from_run",
    "spec_from_setup",
]
