"""What stops the real run before it trains: the selftest does not launch a setup its framework or DeepSpeed
would refuse at start-up.

The selftest runs the setup's config in miniature after the framework's "auto" filling. When the files
contradict each other the way HF Trainer refuses (`Please correct the following DeepSpeed config values that
mismatch TrainingArguments values`, HF001), or DeepSpeed's config model or batch assertion rejects a value
(DS001-DS004), or the argument parser refuses a key (HF004), the real launch ends there. A miniature run that
passes would then say the opposite of what the real one does: it would have run values the framework never
accepts. `check` reports these as launch errors; `selftest` reads them the same way and stops before starting
any rank.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from zerodoctor.findings import Finding, Severity

if TYPE_CHECKING:
    from zerodoctor.setup.run import RunDescription

LAUNCH = "launch"


def launch_refusals(run: RunDescription) -> list[Finding]:
    """The lint errors that bite at launch (no later phase: a known bug of the first optimizer step, a save
    that will not fit, are what the selftest is there to show, so they do not stop it)."""
    from zerodoctor.lint.engine import lint_run

    return [f for f in lint_run(run) if is_launch_refusal(f)]


def is_launch_refusal(f: Finding) -> bool:
    return f.source == "lint" and f.severity >= Severity.ERROR and str(f.data.get("phase", LAUNCH)) == LAUNCH


def not_launched_note(refusals: list[Finding]) -> str:
    ids = ", ".join(dict.fromkeys(f.id for f in refusals))
    return (
        f"not launched: the real run is refused at launch ({ids}); a miniature run of values the framework "
        "never accepts would prove nothing. Fix these, then run the selftest again."
    )
