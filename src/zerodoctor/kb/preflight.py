"""The preflight reading of the knowledge base: which known failures does this stack (and setup) walk into?

Only entries with package-version conditions are judged here; failures that depend on configuration alone
are the lint rules' job (they can point at the exact key). An entry whose versions match and whose config
conditions all hold is reported at its own severity; one whose versions match but whose config conditions
are not known yet is reported as a warning that names what would trigger it. A false condition is silence.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from zerodoctor.facts import Tri
from zerodoctor.findings import Evidence, Finding, Fix, Severity
from zerodoctor.kb.loader import load_entries
from zerodoctor.kb.matcher import evaluate
from zerodoctor.kb.schema import Entry


def entry_fixes(entry: Entry, matched: Collection[str] = ()) -> tuple[Fix, ...]:
    """The entry's fixes in its order, except that a fix `first_for` a signature that matched comes first."""
    ranked = sorted(entry.fixes, key=lambda f: not any(i in matched for i in f.first_for))
    return tuple(Fix(text=f.text, command=f.command, target=f.target, patch=f.patch) for f in ranked)


def entry_references(entry: Entry) -> tuple[str, ...]:
    return tuple(r.ref for r in entry.references)


def known_failures(versions: Mapping[str, str], facts: Mapping[str, Any]) -> list[Finding]:
    out: list[Finding] = []
    for entry in load_entries():
        if not entry.conditions.packages:
            continue
        verdict = evaluate(entry, versions=versions, facts=facts)
        n_pkg = len(entry.conditions.packages)
        pkg_results = verdict.condition_results[:n_pkg]
        cfg_results = verdict.condition_results[n_pkg:]
        if not all(r.value is Tri.TRUE for r in pkg_results):
            continue
        if any(r.value is Tri.FALSE for r in cfg_results):
            continue
        if any(r.value is Tri.UNKNOWN and r.description.startswith("env.") for r in cfg_results):
            # a fact of the machine (an environment variable, /dev/shm) that this snapshot does not hold: no
            # training config can settle it, so a warning would reach every user of the version
            continue
        unknown = [r.description for r in cfg_results if r.value is Tri.UNKNOWN]
        have = "; ".join(r.description for r in pkg_results)
        if unknown:
            severity = Severity.WARNING
            message = (
                f"{entry.summary} Installed: {have}. It applies if: "
                + "; ".join(u.split(" (have")[0] for u in unknown)
                + ". Give the training configs (lint/check) to know for sure."
            )
        else:
            severity = Severity.parse(entry.severity)
            met = "; ".join(r.description for r in cfg_results)
            message = f"{entry.summary} Installed: {have}." + (f" Setup: {met}." if met else "")
        out.append(
            Finding(
                id=entry.id,
                severity=severity,
                title=entry.title,
                message=message,
                fixes=entry_fixes(entry),
                evidence=tuple(
                    Evidence(key=r.description.split(" ")[0], text=r.description)
                    for r in verdict.condition_results
                    if r.value is Tri.TRUE
                ),
                references=entry_references(entry),
                source="kb",
                data={"unknown_conditions": unknown} if unknown else {},
            )
        )
    return out
