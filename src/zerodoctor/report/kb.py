"""Renderings of the knowledge base and the lint rules (`zerodoctor kb`)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from zerodoctor.versions import describe_range

if TYPE_CHECKING:
    from zerodoctor.kb.schema import Entry


def rule_dict(code: str) -> dict[str, Any]:
    from zerodoctor.lint.rule import rule_doc
    from zerodoctor.lint.rules import RULES

    module = RULES[code]
    r = module.RULE
    return {
        "code": r.code,
        "name": r.name,
        "title": r.title,
        "severity": r.severity.label,
        "fix_safety": r.fix_safety,
        "references": list(r.references),
        "doc": rule_doc(module),
    }


def entry_summary(e: Entry) -> dict[str, Any]:
    return {
        "id": e.id,
        "title": e.title,
        "severity": e.severity,
        "phase": e.phase,
        "status": e.status,
        "summary": e.summary,
    }


def entry_text(e: Entry) -> str:
    lines = [
        f"{e.id}: {e.title}",
        f"severity {e.severity}, phase {e.phase}, status {e.status}",
        "",
        e.summary,
        "",
    ]
    if e.conditions.packages or e.conditions.config:
        lines.append("When it happens:")
        for pc in e.conditions.packages:
            ranges = " or ".join(describe_range(r.introduced, r.fixed, r.last_affected) for r in pc.ranges)
            lines.append(f"  - {pc.package} {ranges}" + (f" ({pc.note})" if pc.note else ""))
        for c in e.conditions.config:
            val = "" if c.op in ("truthy", "falsy", "present", "absent") else f" {json.dumps(c.value)}"
            lines.append(f"  - {c.key} {c.op}{val}")
        if e.conditions.note:
            lines.append(f"  {e.conditions.note}")
        lines.append("")
    if e.symptoms.signatures:
        lines.append("What the logs show:")
        for s in e.symptoms.signatures:
            lines.append(f"  - [{s.kind}] {s.pattern}")
        lines.append("")
    lines += [
        "Why it happens:",
        *("  " + ln for ln in e.root_cause.strip().splitlines()),
        "",
        "How to fix it:",
    ]
    for i, f in enumerate(e.fixes, 1):
        lines.append(f"  {i}. {f.text}" + (f"  $ {f.command}" if f.command else ""))
        if f.patch:
            lines.append("     patch: " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in f.patch.items()))
        if f.caveat:
            lines.append(f"     caveat: {f.caveat}")
        if f.first_for:
            lines.append("     first when it shows: " + ", ".join(f.first_for))
    if e.unconfirmed:
        lines += ["", "Not confirmed:", *(f"  - {u}" for u in e.unconfirmed)]
    if e.related:
        lines += ["", "Look-alikes: " + ", ".join(e.related)]
    lines += [
        "",
        "Sources:",
        *(f"  - {r.ref} ({r.kind})" + (f": {r.note}" if r.note else "") for r in e.references),
    ]
    return "\n".join(lines) + "\n"
