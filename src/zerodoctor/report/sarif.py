"""SARIF 2.1.0 for GitHub code scanning (and any SARIF viewer).

- `ruleId`s are the stable check ids (DS002, ENV001, PLAN001); a knowledge-base match is `KB001/<entry id>`
  (entry ids never change), so code scanning tracks each known failure on its own.
- Every rule carries its help (the rule's documentation, the entry's summary and root cause).
- Levels from severities (error, warning, note).
- `partialFingerprints` from file + rule + key path, not line numbers: moving a key does not make a new alert.
- Paths are relative to the repository root (`uriBaseId` %SRCROOT%).
- Every result is located in a file. A finding about the machine or the installed stack is located at the
  config line that makes it matter when there is one; otherwise it goes to the run's notifications
  (`invocations[0].toolExecutionNotifications`), which code scanning shows beside the results.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

from zerodoctor import __version__
from zerodoctor.findings import Evidence, Finding, Severity

SARIF_SCHEMA = "https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json"
INFORMATION_URI = "https://github.com/zerodoctor/zerodoctor"
_LEVEL = {Severity.ERROR: "error", Severity.WARNING: "warning", Severity.INFO: "note"}


def rule_id(f: Finding) -> str:
    kb = f.data.get("kb_id")
    return f"{f.id}/{kb}" if kb else f.id


def _rule_help(f: Finding) -> tuple[str, str]:
    """(short, full help) of the rule behind a finding: the lint rule's docs, the KB entry, else the title."""
    kb = f.data.get("kb_id")
    if kb:
        from zerodoctor.kb.loader import get_entry

        entry = get_entry(str(kb))
        return entry.title, f"{entry.summary}\n\nRoot cause: {entry.root_cause}".strip()
    from zerodoctor.lint.rules import RULES

    module = RULES.get(f.id)
    if module is not None:
        from zerodoctor.lint.rule import rule_doc

        return module.RULE.title, rule_doc(module)
    return f.title, f"{f.title}. {f.message}"


def _relative(file: str, root: Path) -> str:
    path = Path(file).resolve()
    try:
        return path.relative_to(root.resolve()).as_posix()
    except ValueError:
        return os.path.relpath(path, root.resolve()).replace(os.sep, "/")


def _fingerprint(f: Finding, ev: Evidence, root: Path) -> str:
    key = "|".join((rule_id(f), _relative(ev.file or "", root), ev.key or ""))
    return hashlib.sha256(key.encode()).hexdigest()[:32]


def _message(f: Finding) -> str:
    fixes = "; ".join(x.text for x in f.fixes[:3])
    return f"{f.title}: {f.message}" + (f" Fix: {fixes}" if fixes else "")


def to_sarif(findings: list[Finding] | tuple[Finding, ...], *, root: Path) -> dict[str, Any]:
    rules: dict[str, dict[str, Any]] = {}
    results: list[dict[str, Any]] = []
    notes: list[dict[str, Any]] = []
    for f in findings:
        located = next((e for e in f.evidence if e.file and Path(e.file).is_file()), None)
        if located is None:
            notes.append(
                {
                    "level": _LEVEL[f.severity],
                    "message": {"text": f"{rule_id(f)}: {_message(f)}"},
                    "descriptor": {"id": rule_id(f)},
                }
            )
            continue
        rid = rule_id(f)
        if rid not in rules:
            short, full = _rule_help(f)
            rules[rid] = {
                "id": rid,
                "name": (f.name or f.id).replace(":", "/"),
                "shortDescription": {"text": short},
                "fullDescription": {"text": full.split("\n\n")[0][:1000]},
                "help": {"text": full, "markdown": full},
                "defaultConfiguration": {"level": _LEVEL[f.severity]},
                "properties": {"references": list(f.references)},
            }
        region: dict[str, int] = {"startLine": located.line or 1}
        if located.column:
            region["startColumn"] = located.column
        results.append(
            {
                "ruleId": rid,
                "ruleIndex": list(rules).index(rid),
                "level": _LEVEL[f.severity],
                "message": {"text": _message(f)},
                "locations": [
                    {
                        "physicalLocation": {
                            "artifactLocation": {
                                "uri": _relative(located.file or "", root),
                                "uriBaseId": "%SRCROOT%",
                            },
                            "region": region,
                        }
                    }
                ],
                "partialFingerprints": {"zerodoctor/v1": _fingerprint(f, located, root)},
            }
        )
    return {
        "$schema": SARIF_SCHEMA,
        "version": "2.1.0",
        "runs": [
            {
                "tool": {
                    "driver": {
                        "name": "zerodoctor",
                        "version": __version__,
                        "informationUri": INFORMATION_URI,
                        "rules": list(rules.values()),
                    }
                },
                "originalUriBaseIds": {"%SRCROOT%": {"uri": root.resolve().as_uri() + "/"}},
                "invocations": [{"executionSuccessful": True, "toolExecutionNotifications": notes}],
                "results": results,
            }
        ],
    }


def repository_root(start: Path) -> Path:
    """The git work tree that holds `start` (what code scanning resolves paths against), else `start`."""
    for d in (start.resolve(), *start.resolve().parents):
        if (d / ".git").exists():
            return d
    return start.resolve()
