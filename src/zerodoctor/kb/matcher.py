"""The generic matcher: an entry against log lines, package versions and setup facts.

One matcher serves every command: `diagnose` feeds log lines, `env`/`lint`/`check` feed versions and facts
(the preflight reading). Verdicts are tri-state, so unknown facts never turn into false alarms or false
all-clears.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from zerodoctor.facts import Tri, all_of, evaluate_package, evaluate_predicate
from zerodoctor.kb.schema import Entry, Example
from zerodoctor.versions import describe_range, normalize_package


@dataclass(frozen=True)
class ConditionResult:
    description: str
    value: Tri


@dataclass(frozen=True)
class Verdict:
    entry_id: str
    symptoms: Tri  # UNKNOWN when no log was given
    conditions: Tri
    condition_results: tuple[ConditionResult, ...] = ()
    matched_signatures: tuple[str, ...] = ()
    evidence_lines: tuple[tuple[int, str, str], ...] = ()  # (line number, signature id, text)
    score: float = 0.0

    @property
    def log_match(self) -> bool:
        """Diagnose reading: the symptoms are there and no condition rules the entry out."""
        return self.symptoms is Tri.TRUE and self.conditions is not Tri.FALSE

    @property
    def preflight_match(self) -> bool:
        """Preflight reading: every condition is known and true."""
        return self.conditions is Tri.TRUE


@dataclass
class _Compiled:
    entry: Entry
    patterns: list[tuple[str, re.Pattern[str], float]] = field(default_factory=list)


# Re-checks a regex cannot express (no back-references in RE2/hyperscan), by (entry, signature): a signature line
# counts only when its check passes. transformers' HfTrainerDeepSpeedConfig.fill_match (integrations/deepspeed.py)
# records `- ds KEY=VALUE vs hf ARG=VALUE` when `ds_val != hf_val` in Python: a pair that prints the same value on
# both sides differs in type only (`"8"`, a string from an accelerate config or a quoted JSON number, against the
# int 8), which no batch arithmetic explains.
_PAIR = re.compile(r"- ds (?P<dk>[\w.]+)=(?P<dv>\S*) vs hf (?P<hk>\S+?)=(?P<hv>\S*)\s*$")


def _same_value_pair(line: str) -> bool:
    m = _PAIR.search(line)
    return m is not None and m.group("dv") == m.group("hv")


def _differing_pair(line: str) -> bool:
    m = _PAIR.search(line)
    return m is None or m.group("dv") != m.group("hv")


# A fragmented allocator cache holds at least this share of the memory allocated to tensors (PyTorch's older OOM hint:
# "If reserved memory is >> allocated memory try setting max_split_size_mb to avoid fragmentation"; a few per cent
# is slack on a full GPU - huggingface/peft#335, oobabooga/textgen#1490). diagnose's OomNumbers.verdict uses it too.
FRAGMENTED_SHARE = 0.25
_UNITS = {"bytes": 1 / 1024**3, "KiB": 1 / 1024**2, "MiB": 1 / 1024, "GiB": 1.0}
_SHARES = re.compile(
    r"Of the allocated memory (?P<a>[\d.]+) (?P<au>bytes|KiB|MiB|GiB) is allocated by PyTorch, and "
    r"(?P<u>[\d.]+) (?P<uu>bytes|KiB|MiB|GiB) is reserved by PyTorch but unallocated"
)


def _fragmented_share(line: str) -> bool:
    """torch's OOM message (c10/cuda/CUDACachingAllocator.cpp): the unallocated cache against the allocated memory."""
    m = _SHARES.search(line)
    if m is None:
        return True
    try:
        allocated = float(m.group("a")) * _UNITS[m.group("au")]
        cached = float(m.group("u")) * _UNITS[m.group("uu")]
    except ValueError:
        return True
    return cached >= FRAGMENTED_SHARE * allocated


VALUE_CHECKS: dict[tuple[str, str], Callable[[str], bool]] = {
    ("hf-ds-config-mismatch", "type-only-pair"): _same_value_pair,
    ("batch-size-assertion", "hf-batch-mismatch"): _differing_pair,
    ("cuda-oom-fragmentation", "frag-larger-unit"): _fragmented_share,
    ("cuda-oom-fragmentation", "frag-more-digits"): _fragmented_share,
    ("cuda-oom-fragmentation", "frag-larger-leading-digit"): _fragmented_share,
}


def passes_value_check(entry_id: str, sig_id: str, line: str) -> bool:
    check = VALUE_CHECKS.get((entry_id, sig_id))
    return check is None or check(line)


def _compile(entry: Entry) -> _Compiled:
    c = _Compiled(entry)
    for s in entry.symptoms.signatures:
        c.patterns.append((s.id, re.compile(s.pattern), s.weight))
    return c


def match_symptoms(
    entry: Entry, lines: Iterable[str], max_evidence: int = 20
) -> tuple[Tri, tuple[str, ...], tuple[tuple[int, str, str], ...], float]:
    """Scan lines once; return (symptoms verdict, matched signature ids, evidence lines, score)."""
    sym = entry.symptoms
    if not sym.signatures:
        return Tri.UNKNOWN, (), (), 0.0
    compiled = _compile(entry)
    hits: dict[str, int] = {}
    evidence: list[tuple[int, str, str]] = []
    for lineno, line in enumerate(lines, start=1):
        for sig_id, rx, _w in compiled.patterns:
            if rx.search(line) and passes_value_check(entry.id, sig_id, line):
                hits[sig_id] = hits.get(sig_id, 0) + 1
                if len(evidence) < max_evidence:
                    evidence.append((lineno, sig_id, line.rstrip("\n")))
    matched = set(hits)
    ok = (not sym.require_any or bool(matched & set(sym.require_any))) and set(sym.require_all) <= matched
    if matched & set(sym.exclude):
        ok = False
    score = sum(w for sid, _rx, w in compiled.patterns if sid in matched)
    return Tri.of(ok), tuple(sorted(matched)), tuple(evidence), score


def evaluate_conditions(
    entry: Entry, versions: Mapping[str, str], facts: Mapping[str, Any]
) -> tuple[Tri, tuple[ConditionResult, ...]]:
    results: list[ConditionResult] = []
    norm_versions = {normalize_package(k): v for k, v in versions.items()}
    for pc in entry.conditions.packages:
        ranges = [(r.introduced, r.fixed, r.last_affected) for r in pc.ranges]
        text = " or ".join(describe_range(*r) for r in ranges)
        installed = norm_versions.get(normalize_package(pc.package))
        shown = installed if installed else ("not installed" if installed == "" else "unknown")
        results.append(
            ConditionResult(
                f"{pc.package} {text} (have {shown})", evaluate_package(norm_versions, pc.package, ranges)
            )
        )
    for pred in entry.conditions.config:
        want = "" if pred.op in ("truthy", "falsy", "present", "absent") else f" {pred.value!r}"
        have = facts.get(pred.key, "unknown")
        results.append(
            ConditionResult(
                f"{pred.key} {pred.op}{want} (have {have!r})",
                evaluate_predicate(facts, pred.key, pred.op, pred.value),
            )
        )
    return all_of([r.value for r in results]), tuple(results)


def evaluate(
    entry: Entry,
    *,
    lines: Iterable[str] | None = None,
    versions: Mapping[str, str] | None = None,
    facts: Mapping[str, Any] | None = None,
) -> Verdict:
    if lines is not None:
        sym, matched, evidence, score = match_symptoms(entry, lines)
    else:
        sym, matched, evidence, score = Tri.UNKNOWN, (), (), 0.0
    cond, results = evaluate_conditions(entry, versions or {}, facts or {})
    return Verdict(entry.id, sym, cond, results, matched, evidence, score)


def evaluate_example(entry: Entry, example: Example) -> Verdict:
    lines = example.log.splitlines() if example.log is not None else None
    return evaluate(entry, lines=lines, versions=example.env, facts=example.facts)


def example_matches(entry: Entry, example: Example) -> bool:
    v = evaluate_example(entry, example)
    return v.log_match if example.log is not None else v.preflight_match
