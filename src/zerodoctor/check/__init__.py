"""`zerodoctor check`: one preflight of a whole training setup (environment + configs + memory plan) on one
description of the run, with one verdict.

    discover (setup/discover.py) -> describe the run once (setup/run.py) -> judges (env rules, lint rules
    incl. the knowledge base, the memory plan) -> merge (one finding per problem, ordered by when it bites)
    -> verdict; rendering lives in report/.
"""

from __future__ import annotations

from zerodoctor.check.pipeline import CheckOptions, CheckReport, run_check
from zerodoctor.check.registry import CheckInfo, all_checks, resolve_check_ids

__all__ = ["CheckInfo", "all_checks", "CheckOptions", "CheckReport", "resolve_check_ids", "run_check"]
