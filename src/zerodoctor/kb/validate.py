"""Validation of a knowledge-base entry as written in YAML (`kb/entries/<id>.yaml`): the pydantic models of the
schema, run when the entries are read from their YAML (`kb.loader`: a cache miss, and in CI).

Every check of an entry lives here. What the rest of zerodoctor reads are the plain runtime types of
`kb.schema`, built from the validated data (`kb.schema.entry_from_data`), so a start that finds the validated
copy in the cache does not import pydantic (about 0.1 s of CPU). The field names, types and defaults here and
there are the same; `tests/kb/test_schema_runtime.py` checks that they stay so.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from zerodoctor.kb.schema import ENTRY_ID, REFERENCE, Op, Phase

# Patterns must stay within what RE2/hyperscan accept, so the log reader can use a multi-pattern engine.
_FORBIDDEN_REGEX = re.compile(r"\(\?[=!<]|\\[1-9]")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class VersionRange(_Strict):
    """Affected if introduced <= v < fixed (or v <= last_affected). `introduced: "0"` means every release."""

    introduced: str = "0"
    fixed: str | None = None
    last_affected: str | None = None

    @model_validator(mode="after")
    def _one_end(self) -> VersionRange:
        if self.fixed and self.last_affected:
            raise ValueError("give either fixed or last_affected, not both")
        return self


class PackageCondition(_Strict):
    package: str
    ranges: list[VersionRange] = Field(min_length=1)
    note: str | None = None


class ConfigPredicate(_Strict):
    key: str = Field(pattern=r"^(ds|hf|quant|setup|env)\.[A-Za-z0-9_.]+$")
    op: Op
    value: Any = None


class Conditions(_Strict):
    """All listed conditions must hold (AND). Empty means the entry is recognised from logs alone."""

    packages: list[PackageCondition] = []
    config: list[ConfigPredicate] = []
    note: str | None = None


class Signature(_Strict):
    """A regex matched against single log lines (after rank prefixes, ANSI codes and timestamps are removed)."""

    id: str = Field(pattern=r"^[a-z0-9-]+$")
    pattern: str
    kind: Literal["message", "frame", "launcher", "warning", "context", "version"]
    weight: float = 1.0

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, v: str) -> str:
        if _FORBIDDEN_REGEX.search(v):
            raise ValueError("no lookaround or back-references: patterns must be RE2/hyperscan compatible")
        re.compile(v)
        return v


class Symptoms(_Strict):
    """`require_any`: at least one of these signature ids must appear; `require_all`: every one must;
    `exclude`: if any of these appears the entry does not match (it is a look-alike)."""

    signatures: list[Signature] = []
    require_any: list[str] = []
    require_all: list[str] = []
    exclude: list[str] = []

    @model_validator(mode="after")
    def _ids_exist(self) -> Symptoms:
        ids = [s.id for s in self.signatures]
        if len(ids) != len(set(ids)):
            raise ValueError("signature ids must be unique")
        for name in (*self.require_any, *self.require_all, *self.exclude):
            if name not in ids:
                raise ValueError(f"unknown signature id {name!r}")
        if self.signatures and not (self.require_any or self.require_all):
            raise ValueError("signatures given but neither require_any nor require_all")
        return self


class KbFix(_Strict):
    """A ranked remedy; `patch` maps dotted keys of the `target` file kind to new values (null removes)."""

    text: str
    command: str | None = None
    target: Literal["deepspeed", "hf", "accelerate", "llamafactory", "xtuner", "env", "code"] | None = None
    patch: dict[str, Any] | None = None
    caveat: str | None = None
    # signature ids of the entry: when one of them matched, this fix is ranked first (an entry with several causes
    # whose remedies differ)
    first_for: list[str] = []


class Reference(_Strict):
    ref: str = Field(pattern=REFERENCE)
    kind: Literal["issue", "pr", "doc", "source", "commit", "thread"]
    note: str | None = None


class Example(_Strict):
    """A case the tests run. With `log`, it matches when the symptoms match and no condition is false.
    Without `log`, it matches when every condition is known and true (the preflight reading)."""

    name: str
    log: str | None = None
    facts: dict[str, Any] = {}
    env: dict[str, str] = {}


class Examples(_Strict):
    match: list[Example] = Field(min_length=1)
    no_match: list[Example] = Field(min_length=1)


class Entry(_Strict):
    id: str = Field(pattern=ENTRY_ID)
    title: str
    severity: Literal["error", "warning", "info"]
    phase: Phase
    summary: str
    status: Literal["verified", "partly-unconfirmed", "unconfirmed"]
    symptoms: Symptoms = Symptoms()
    conditions: Conditions = Conditions()
    root_cause: str
    fixes: list[KbFix] = Field(min_length=1)
    references: list[Reference] = Field(min_length=1)
    unconfirmed: list[str] = []
    related: list[str] = []
    seed_cases: list[int] = []
    examples: Examples

    @model_validator(mode="after")
    def _recognisable(self) -> Entry:
        if not self.symptoms.signatures and not (self.conditions.packages or self.conditions.config):
            raise ValueError("an entry needs log signatures or conditions, or nothing can ever match it")
        sig_ids = {s.id for s in self.symptoms.signatures}
        for fix in self.fixes:
            if unknown := [i for i in fix.first_for if i not in sig_ids]:
                raise ValueError(f"fix `first_for` names signatures the entry does not have: {unknown}")
        if self.status != "verified" and not self.unconfirmed:
            raise ValueError(
                f"status {self.status!r} needs an `unconfirmed` list saying what is not confirmed"
            )
        return self
