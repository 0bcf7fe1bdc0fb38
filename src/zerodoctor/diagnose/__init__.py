"""`zerodoctor diagnose`: read the logs of a failed run and name the failure, its evidence and its fixes.

reader (bytes -> normalised lines) -> scan (one multi-pattern pass) -> extract (tracebacks, OOM numbers,
launcher exits, NCCL, versions, phases) -> judge (KB entries ranked by evidence).
"""

from __future__ import annotations

from zerodoctor.diagnose.judge import Diagnosis, diagnose

__all__ = ["Diagnosis", "diagnose"]
