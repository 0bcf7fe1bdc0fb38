"""Schema of a knowledge-base entry (`kb/entries/<id>.yaml`), checked by pydantic when loaded and in CI.

Modelled on pypa/advisory-database: one file per fact, an id that never changes once published, version
ranges as `introduced`/`fixed`, typed references, and examples that the tests run.

Fact keys used by `conditions.config` (see `zerodoctor.facts`):
  ds.<dotted.path>   the effective DeepSpeed config (HF "auto" resolved where the framework would resolve it;
                     DeepSpeed's code defaults applied for keys that are absent)
  hf.<argument>      HF TrainingArguments / LLaMA-Factory arguments as the framework would see them
  quant.<field>      load_in_4bit, load_in_8bit, bnb_4bit_quant_storage, bnb_4bit_compute_dtype
  setup.<fact>       framework, method (full|lora|qlora|freeze), model_type, world_size, zero3_init,
                     num_local_ranks, is_moe, is_multimodal
  env.<fact>         gpu_count, shm_bytes, memlock_bytes, host_ram_bytes
A key whose value is not known evaluates to "unknown", never to false: unknown facts do not rule an entry out.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

ENTRY_ID = r"^[a-z0-9][a-z0-9.-]*[a-z0-9]$"
REFERENCE = r"^([A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+(#\d+|@[0-9a-f]{7,40}|:[^\s]+)|https?://\S+)$"
# Patterns must stay within what RE2/hyperscan accept, so the log reader can use a multi-pattern engine.
_FORBIDDEN_REGEX = re.compile(r"\(\?[=!<]|\\[1-9]")

Phase = Literal[
    "config",
    "install",
    "load",
    "init",
    "forward",
    "backward",
    "optimizer_step",
    "checkpoint_save",
    "resume",
    "eval",
    "data",
    "any",
]
Op = Literal["eq", "ne", "in", "not_in", "gt", "ge", "lt", "le", "truthy", "falsy", "present", "absent"]


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
    def _compiles(cls, v: str, info: ValidationInfo) -> str:
        if info.context and info.context.get("from_cache"):
            return (
                v  # checked when the cache was written from the YAML (kb.loader); compiling costs the start
            )
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
        if self.status != "verified" and not self.unconfirmed:
            raise ValueError(
                f"status {self.status!r} needs an `unconfirmed` list saying what is not confirmed"
            )
        return self
