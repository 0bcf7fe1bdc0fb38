"""What a lint rule is: a small module with one `RULE` (its metadata and `check`) and a docstring that is its
documentation (why it matters, an example, what to use instead, whether `--fix` is safe), like ruff's rule
pages. Each rule ships a case file, tests/lint/cases/<CODE>.yaml, run by one parametrized test."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING

from zerodoctor.findings import Evidence, Finding, Fix, Severity

if TYPE_CHECKING:
    from zerodoctor.setup.run import RunDescription


@dataclass(frozen=True)
class Rule:
    code: str  # DS002: never changes once published
    name: str  # deepspeed.batch-size-mismatch
    title: str
    severity: Severity  # the default; a finding may be milder when facts are incomplete
    references: tuple[str, ...]
    check: Callable[[RunDescription], Iterable[Finding]]
    fix_safety: str | None = None  # "safe", "unsafe" (changes semantics), or None (no automatic fix)

    def finding(
        self,
        message: str,
        *,
        evidence: Iterable[Evidence] = (),
        fixes: Iterable[Fix] = (),
        severity: Severity | None = None,
        title: str | None = None,
        data: dict[str, object] | None = None,
    ) -> Finding:
        return Finding(
            id=self.code,
            name=self.name,
            severity=severity or self.severity,
            title=title or self.title,
            message=message,
            fixes=tuple(fixes),
            evidence=tuple(evidence),
            references=self.references,
            source="lint",
            data=data or {},
        )


def rule_doc(module: ModuleType) -> str:
    return inspect.cleandoc(module.__doc__ or "")
