"""Facts: the flat, typed view of a setup that KB conditions and rules are evaluated against.

A fact that is not known is absent, and a predicate on an absent fact is UNKNOWN, never FALSE: zerodoctor
must not rule out a failure (or raise an alarm) on information it does not have.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from typing import Any

from zerodoctor.versions import in_range, normalize_package, parse_version


class Tri(enum.Enum):
    TRUE = "true"
    FALSE = "false"
    UNKNOWN = "unknown"

    @staticmethod
    def of(value: bool) -> Tri:
        return Tri.TRUE if value else Tri.FALSE

    def __and__(self, other: Tri) -> Tri:  # Kleene logic
        if Tri.FALSE in (self, other):
            return Tri.FALSE
        if Tri.UNKNOWN in (self, other):
            return Tri.UNKNOWN
        return Tri.TRUE


def all_of(values: list[Tri]) -> Tri:
    out = Tri.TRUE
    for v in values:
        out = out & v
    return out


AUTO = "auto"


def is_auto(value: Any) -> bool:
    """HF's placeholder: "auto" in any case and spacing."""
    return isinstance(value, str) and value.strip().lower() == AUTO


def as_number(value: Any) -> float | None:
    """A config value as a number: 5e8, "5e8" and 500000000 alike; None for anything else (bools too), and
    for what no count or size can be: NaN, infinities ("inf", 1e999) and integers too large for a float."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | float):
        number = value
    elif isinstance(value, str):
        text = value.strip()
        if len(text) > 400:  # no real number is spelled this long; float() of 5,000 digits is just slow
            return None
        try:
            number = float(text)
        except ValueError:
            return None
    else:
        return None
    try:
        out = float(number)
    except OverflowError:  # an int beyond 1.8e308
        return None
    return out if math.isfinite(out) else None


def _loose_equal(a: Any, b: Any) -> bool:
    """1e9 == 1000000000, "cpu" == "CPU", True == "true": configs write the same value in many ways."""
    if isinstance(a, str) and isinstance(b, str):
        return a.strip().lower() == b.strip().lower()
    if isinstance(a, bool) or isinstance(b, bool):
        return truthy(a) == truthy(b) if truthy(a) is not None and truthy(b) is not None else False
    na, nb = as_number(a), as_number(b)
    if na is not None and nb is not None:
        return na == nb
    return bool(a == b)


def truthy(value: Any) -> bool | None:
    """A config value as a boolean the way the frameworks' parsers read it: true/"yes"/1 -> True,
    false/"no"/0/None -> False, anything else ("auto") -> None (unknown)."""
    if isinstance(value, bool):
        return value
    if value is None:
        return False
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, int | float):
        return value != 0
    if isinstance(value, str):
        low = value.strip().lower()
        if low in ("true", "yes", "on", "1"):
            return True
        if low in ("false", "no", "off", "0", "", "none", "null"):
            return False
        return None
    return bool(value)


def evaluate_predicate(facts: Mapping[str, Any], key: str, op: str, expected: Any = None) -> Tri:
    """Evaluate one `conditions.config` predicate. The value "auto" (unresolved) is unknown."""
    present = key in facts
    if op == "present":
        return Tri.of(present) if present else Tri.UNKNOWN
    if op == "absent":
        return Tri.FALSE if present else Tri.UNKNOWN
    if not present:
        return Tri.UNKNOWN
    value = facts[key]
    if is_auto(value):
        return Tri.UNKNOWN
    if op == "truthy" or op == "falsy":
        t = truthy(value)
        if t is None:
            return Tri.UNKNOWN
        return Tri.of(t if op == "truthy" else not t)
    if op == "eq":
        return Tri.of(_loose_equal(value, expected))
    if op == "ne":
        return Tri.of(not _loose_equal(value, expected))
    if op in ("in", "not_in"):
        hit = any(_loose_equal(value, e) for e in expected)
        return Tri.of(hit if op == "in" else not hit)
    a, b = as_number(value), as_number(expected)
    if a is None or b is None:
        return Tri.UNKNOWN
    return Tri.of({"gt": a > b, "ge": a >= b, "lt": a < b, "le": a <= b}[op])


def evaluate_package(
    versions: Mapping[str, str], package: str, ranges: list[tuple[str, str | None, str | None]]
) -> Tri:
    """TRUE if the installed version of `package` is inside one of the (introduced, fixed, last_affected)
    ranges, FALSE if it is installed and outside all of them or known to be absent, UNKNOWN otherwise."""
    name = normalize_package(package)
    if name not in versions:
        return Tri.UNKNOWN
    raw = versions[name]
    if raw == "":  # known not installed
        return Tri.FALSE
    v = parse_version(raw)
    if v is None:
        return Tri.UNKNOWN
    return Tri.of(any(in_range(v, i, f, la) for i, f, la in ranges))
