"""Result types of the selftest: one verdict per phase, one per positive check, and the findings."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from zerodoctor.findings import Finding, Severity
from zerodoctor.selftest.shrink import Adaptation

PHASES = (
    "distributed-init",
    "model-build",
    "engine-init",
    "forward-backward",
    "clip-step",
    "optimizer-steps",
    "inspect",
    "checkpoint-save",
    "reload",
    "reference",
)
PHASE_TITLES = {
    "distributed-init": "distributed init",
    "model-build": "zero.Init + model build",
    "engine-init": "engine init (deepspeed.initialize)",
    "forward-backward": "forward/backward",
    "clip-step": "first optimizer step, clipping forced",
    "optimizer-steps": "optimizer steps",
    "inspect": "partition and placement inspection",
    "checkpoint-save": "checkpoint save",
    "reload": "reload + zero_to_fp32",
    "reference": "single-process reference",
}

PASSED, FAILED, TIMED_OUT, INTERRUPTED, NOT_REACHED, SKIPPED = (
    "passed",
    "failed",
    "timed out",
    "interrupted",
    "not reached",
    "skipped",
)
NOT_CHECKED, NOT_APPLICABLE = "not checked", "not applicable"


@dataclass(frozen=True)
class PhaseResult:
    name: str
    status: str
    seconds: float | None
    detail: str = ""
    rank: int | None = None  # the rank that failed, when one did

    @property
    def title(self) -> str:
        return PHASE_TITLES.get(self.name, self.name)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "title": self.title,
            "status": self.status,
            "seconds": self.seconds,
            "detail": self.detail,
            "rank": self.rank,
        }


@dataclass(frozen=True)
class CheckResult:
    """A positive check: what was measured, what was expected, the verdict."""

    name: str
    status: str
    detail: str
    values: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "status": self.status, "detail": self.detail, "values": self.values}


@dataclass(frozen=True)
class SelftestResult:
    """Everything one selftest found. `ok` is true when no finding is an error."""

    findings: tuple[Finding, ...]
    phases: tuple[PhaseResult, ...]
    checks: tuple[CheckResult, ...]
    path: str  # which path ran, in words ("gloo + DeepSpeed CPU accelerator, 2 ranks")
    limits: tuple[str, ...]  # what that path cannot show
    adaptations: tuple[Adaptation, ...]
    model: str
    wall_seconds: float
    log_path: str
    workdir: str
    # time spent JIT-building DeepSpeed ops during this run (DeepSpeed's cost, not the selftest's)
    jit_build_seconds: float = 0.0
    versions: dict[str, str] = field(default_factory=dict, compare=False, hash=False)
    first_error: dict[str, Any] | None = field(default=None, compare=False, hash=False)

    @property
    def ok(self) -> bool:
        return not any(f.severity >= Severity.ERROR for f in self.findings)

    def phase(self, name: str) -> PhaseResult:
        return next(p for p in self.phases if p.name == name)

    def check(self, name: str) -> CheckResult:
        return next(c for c in self.checks if c.name == name)

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "path": self.path,
            "limits": list(self.limits),
            "model": self.model,
            "wall_seconds": self.wall_seconds,
            "jit_build_seconds": self.jit_build_seconds,
            "phases": [p.to_dict() for p in self.phases],
            "checks": [c.to_dict() for c in self.checks],
            "adaptations": [a.to_dict() for a in self.adaptations],
            "versions": self.versions,
            "first_error": self.first_error,
            "log": self.log_path,
            "workdir": self.workdir,
        }
