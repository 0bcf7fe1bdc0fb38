"""Schema of a knowledge-base entry (`kb/entries/<id>.yaml`): the runtime types every command reads.

Modelled on pypa/advisory-database: one file per fact, an id that never changes once published, version
ranges as `introduced`/`fixed`, typed references, and examples that the tests run.

An entry is checked once, by the pydantic models of `kb.validate`, when it is read from its YAML (a cache miss,
and in CI); the validated data is cached as JSON and read back into these plain immutable records
(`entry_from_data`), so a start that finds the cache does not import pydantic. The field names and types are
those of `kb.validate` (whose defaults have been filled in by then).

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

from typing import Any, Literal, NamedTuple

ENTRY_ID = r"^[a-z0-9][a-z0-9.-]*[a-z0-9]$"
REFERENCE = r"^([A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+(#\d+|@[0-9a-f]{7,40}|:[^\s]+)|https?://\S+)$"

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
SignatureKind = Literal["message", "frame", "launcher", "warning", "context", "version"]
FixTarget = Literal["deepspeed", "hf", "accelerate", "llamafactory", "xtuner", "env", "code"]
ReferenceKind = Literal["issue", "pr", "doc", "source", "commit", "thread"]
Severity = Literal["error", "warning", "info"]
Status = Literal["verified", "partly-unconfirmed", "unconfirmed"]


# The runtime types are NamedTuples: light, immutable records whose classes cost about a tenth of a frozen
# dataclass's to create at import (a start of `diagnose` creates every class of every module it imports). Every
# field is given when an entry is built (`entry_from_data`): no defaults, so no list is shared between entries.


class VersionRange(NamedTuple):
    """Affected if introduced <= v < fixed (or v <= last_affected). `introduced: "0"` means every release."""

    introduced: str
    fixed: str | None
    last_affected: str | None


class PackageCondition(NamedTuple):
    package: str
    ranges: list[VersionRange]
    note: str | None


class ConfigPredicate(NamedTuple):
    key: str
    op: Op
    value: Any


class Conditions(NamedTuple):
    """All listed conditions must hold (AND). Empty means the entry is recognised from logs alone."""

    packages: list[PackageCondition]
    config: list[ConfigPredicate]
    note: str | None


class Signature(NamedTuple):
    """A regex matched against single log lines (after rank prefixes, ANSI codes and timestamps are removed)."""

    id: str
    pattern: str
    kind: SignatureKind
    weight: float


class Symptoms(NamedTuple):
    """`require_any`: at least one of these signature ids must appear; `require_all`: every one must;
    `exclude`: if any of these appears the entry does not match (it is a look-alike)."""

    signatures: list[Signature]
    require_any: list[str]
    require_all: list[str]
    exclude: list[str]


class KbFix(NamedTuple):
    """A ranked remedy; `patch` maps dotted keys of the `target` file kind to new values (null removes);
    `first_for`: signature ids of the entry whose match ranks this fix first (the remedy for that cause)."""

    text: str
    command: str | None
    target: FixTarget | None
    patch: dict[str, Any] | None
    caveat: str | None
    first_for: list[str]


class Reference(NamedTuple):
    ref: str
    kind: ReferenceKind
    note: str | None


class Example(NamedTuple):
    """A case the tests run. With `log`, it matches when the symptoms match and no condition is false.
    Without `log`, it matches when every condition is known and true (the preflight reading)."""

    name: str
    log: str | None
    facts: dict[str, Any]
    env: dict[str, str]


class Examples(NamedTuple):
    match: list[Example]
    no_match: list[Example]


class Entry(NamedTuple):
    id: str
    title: str
    severity: Severity
    phase: Phase
    summary: str
    status: Status
    symptoms: Symptoms
    conditions: Conditions
    root_cause: str
    fixes: list[KbFix]
    references: list[Reference]
    unconfirmed: list[str]
    related: list[str]
    seed_cases: list[int]
    examples: Examples


def _example(d: dict[str, Any]) -> Example:
    return Example(d["name"], d["log"], d["facts"], d["env"])


def entry_from_data(d: dict[str, Any]) -> Entry:
    """An entry from its validated data (`kb.validate.Entry.model_dump(mode="json")`, every field present), as
    read back from the cache. It does not validate: only data pydantic has checked may come here."""
    sym, cond, ex = d["symptoms"], d["conditions"], d["examples"]
    return Entry(
        id=d["id"],
        title=d["title"],
        severity=d["severity"],
        phase=d["phase"],
        summary=d["summary"],
        status=d["status"],
        symptoms=Symptoms(
            [Signature(s["id"], s["pattern"], s["kind"], s["weight"]) for s in sym["signatures"]],
            sym["require_any"],
            sym["require_all"],
            sym["exclude"],
        ),
        conditions=Conditions(
            [
                PackageCondition(
                    p["package"],
                    [VersionRange(r["introduced"], r["fixed"], r["last_affected"]) for r in p["ranges"]],
                    p["note"],
                )
                for p in cond["packages"]
            ],
            [ConfigPredicate(c["key"], c["op"], c["value"]) for c in cond["config"]],
            cond["note"],
        ),
        root_cause=d["root_cause"],
        fixes=[
            KbFix(f["text"], f["command"], f["target"], f["patch"], f["caveat"], f["first_for"])
            for f in d["fixes"]
        ],
        references=[Reference(r["ref"], r["kind"], r["note"]) for r in d["references"]],
        unconfirmed=d["unconfirmed"],
        related=d["related"],
        seed_cases=d["seed_cases"],
        examples=Examples([_example(x) for x in ex["match"]], [_example(x) for x in ex["no_match"]]),
    )


def _data(value: Any) -> Any:
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # one of the records above
        return {name: _data(v) for name, v in zip(value._fields, value, strict=True)}
    if isinstance(value, list):
        return [_data(v) for v in value]
    if isinstance(value, dict):
        return {k: _data(v) for k, v in value.items()}
    return value


def entry_data(entry: Entry) -> dict[str, Any]:
    """The entry as plain JSON-ready data (copies), every field in the schema's order: the inverse of
    `entry_from_data`, and what `zerodoctor kb ID --format json` prints."""
    data: dict[str, Any] = _data(entry)
    return data
