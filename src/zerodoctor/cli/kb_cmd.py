"""`zerodoctor kb [ID]`: browse the knowledge base and the lint rules, each with why, how to fix, and sources."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from zerodoctor.cli.common import EXIT_CLEAN, add_output_options
from zerodoctor.errors import KnowledgeBaseError
from zerodoctor.report.render import JSON_SCHEMA_VERSION
from zerodoctor.versions import describe_range

if TYPE_CHECKING:
    from zerodoctor.kb.schema import Entry


def add_parser(sub: argparse._SubParsersAction, epilog: str) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "kb",
        help="browse known failures and lint rules",
        description="Without ID: list knowledge-base entries and lint rules. With an entry id "
        "(ds-z3-offload-clipgrad-device-mismatch) or a rule code/name (DS002, "
        "deepspeed.batch-size-mismatch): show it in full.",
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("id", nargs="?", help="entry id or rule code")
    add_output_options(p, fail_on=False)
    p.set_defaults(run=run)


def _rule_dict(code: str) -> dict[str, Any]:
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


def _entry_summary(e: Entry) -> dict[str, Any]:
    return {
        "id": e.id,
        "title": e.title,
        "severity": e.severity,
        "phase": e.phase,
        "status": e.status,
        "summary": e.summary,
        "seed_cases": e.seed_cases,
    }


def _find_rule(key: str) -> str | None:
    from zerodoctor.lint.rules import RULES

    for code, module in RULES.items():
        if key.upper() == code or key.lower() == module.RULE.name:
            return code
    return None


def _entry_text(e: Entry) -> str:
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


def run(args: argparse.Namespace) -> int:
    from zerodoctor.kb.loader import load_entries
    from zerodoctor.lint.rules import RULES

    entries = load_entries()
    out = sys.stdout
    if args.id:
        code = _find_rule(args.id)
        if code:
            d = _rule_dict(code)
            if args.format == "json":
                out.write(json.dumps({"schema_version": JSON_SCHEMA_VERSION, "rule": d}, indent=2) + "\n")
            else:
                sep = "#" if args.format == "markdown" else ""
                head = f"{sep} {d['code']} {d['name']}: {d['title']}".strip()
                out.write(
                    f"{head}\n\ndefault severity: {d['severity']}; automatic fix: {d['fix_safety'] or 'none'}\n\n"
                    f"{d['doc']}\n\nSources: {', '.join(d['references'])}\n"
                )
            return EXIT_CLEAN
        match = [e for e in entries if e.id == args.id]
        if not match:
            import difflib

            names = [e.id for e in entries] + list(RULES) + [m.RULE.name for m in RULES.values()]
            near = difflib.get_close_matches(args.id, names, n=3, cutoff=0.5)
            raise KnowledgeBaseError(
                f"no knowledge-base entry or rule {args.id!r}",
                hint=(f"did you mean {', '.join(near)}? " if near else "") + "`zerodoctor kb` lists them",
            )
        e = match[0]
        if args.format == "json":
            out.write(
                json.dumps(
                    {"schema_version": JSON_SCHEMA_VERSION, "entry": e.model_dump(mode="json")},
                    indent=2,
                    ensure_ascii=False,
                )
                + "\n"
            )
        elif args.format == "markdown":
            body = _entry_text(e).split("\n", 1)[1]
            out.write(f"# {e.id}: {e.title}\n{body}")
        else:
            out.write(_entry_text(e))
        return EXIT_CLEAN
    if args.format == "json":
        doc = {
            "schema_version": JSON_SCHEMA_VERSION,
            "entries": [_entry_summary(e) for e in entries],
            "rules": [_rule_dict(c) for c in RULES],
        }
        out.write(json.dumps(doc, indent=2, ensure_ascii=False) + "\n")
        return EXIT_CLEAN
    bullet = "- " if args.format == "markdown" else "  "
    out.write(("## " if args.format == "markdown" else "") + f"Known failures ({len(entries)})\n")
    for e in entries:
        out.write(f"{bullet}{e.id:<48} {e.severity:<8} {e.title}\n")
    out.write(("\n## " if args.format == "markdown" else "\n") + f"Lint rules ({len(RULES)})\n")
    for code, module in RULES.items():
        r = module.RULE
        out.write(f"{bullet}{code} {r.name:<40} {r.severity.label:<8} {r.title}\n")
    out.write("\n`zerodoctor kb ID` shows one in full.\n")
    return EXIT_CLEAN
