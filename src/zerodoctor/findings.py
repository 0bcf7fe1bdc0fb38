"""The one result type of every judge: lint rules, KB matches, env checks, plan verdicts, diagnoses.

Findings are frozen; derive variants with `dataclasses.replace`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any


class Severity(enum.IntEnum):
    """Ordered so that `severity >= Severity.WARNING` reads naturally."""

    INFO = 10
    WARNING = 20
    ERROR = 30

    @property
    def label(self) -> str:
        return self.name.lower()

    @classmethod
    def parse(cls, text: str) -> Severity:
        try:
            return cls[text.strip().upper()]
        except KeyError:
            raise ValueError(f"unknown severity {text!r}; use one of: info, warning, error") from None


@dataclass(frozen=True)
class Evidence:
    """Where a finding comes from: a key in a config file, a line in a log, or a probed fact."""

    file: str | None = None
    line: int | None = None
    column: int | None = None
    key: str | None = None
    text: str | None = None

    def location(self) -> str:
        """`file:line:col` (what editors and CI annotations understand), or the key alone."""
        parts = [self.file or ""]
        if self.line is not None:
            parts.append(str(self.line))
            if self.column is not None:
                parts.append(str(self.column))
        loc = ":".join(p for p in parts if p)
        if self.key:
            loc = f"{loc} ({self.key})" if loc else self.key
        return loc

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v is not None}


@dataclass(frozen=True)
class Fix:
    """One remedy. `patch` maps dotted key paths to new values (None removes the key) in `target` kind of file."""

    text: str
    command: str | None = None
    target: str | None = None
    patch: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v is not None}


@dataclass(frozen=True)
class Finding:
    """A judgement with its evidence, ranked fixes and upstream references (`owner/repo#N` or URLs)."""

    id: str
    severity: Severity
    title: str
    message: str
    fixes: tuple[Fix, ...] = ()
    evidence: tuple[Evidence, ...] = ()
    references: tuple[str, ...] = ()
    source: str = "lint"
    name: str | None = None
    confidence: float | None = None
    data: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id,
            "severity": self.severity.label,
            "title": self.title,
            "message": self.message,
            "fixes": [f.text for f in self.fixes],
            "fix_details": [f.to_dict() for f in self.fixes],
            "evidence": [e.to_dict() for e in self.evidence],
            "references": list(self.references),
            "source": self.source,
        }
        if self.name:
            out["name"] = self.name
        if self.confidence is not None:
            out["confidence"] = round(self.confidence, 3)
        if self.data:
            out["data"] = self.data
        return out


def worst(findings: list[Finding] | tuple[Finding, ...]) -> Severity | None:
    return max((f.severity for f in findings), default=None)


def sort_findings(findings: list[Finding]) -> list[Finding]:
    """Most severe first, then by file and line so output is stable."""

    def key(f: Finding) -> tuple[int, str, int, int, str]:
        ev = f.evidence[0] if f.evidence else Evidence()
        return (-int(f.severity), ev.file or "", ev.line or 0, ev.column or 0, f.id)

    return sorted(findings, key=key)
