"""`zerodoctor kb [ID]`: browse the knowledge base and the lint rules, each with why, how to fix, and sources."""

from __future__ import annotations

import argparse
import json
import sys

from zerodoctor.cli.common import EXIT_CLEAN, add_output_options
from zerodoctor.errors import KnowledgeBaseError
from zerodoctor.report.kb import entry_summary, entry_text, rule_dict
from zerodoctor.report.render import JSON_SCHEMA_VERSION

KB_EPILOG = """exit codes:
  0  the list or the entry was shown
  2  usage error (an id or rule that does not exist, a bad option)
  3  internal error (a bug in zerodoctor: please report it with the traceback)
"""
"""kb judges nothing, so it has no --fail-on; the shared epilog's exit codes 0/1 speak of it."""


def add_parser(sub: argparse._SubParsersAction, epilog: str) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "kb",
        help="browse known failures and lint rules",
        description="Without ID: list knowledge-base entries and lint rules. With an entry id "
        "(ds-z3-offload-clipgrad-device-mismatch) or a rule code/name (DS002, "
        "deepspeed.batch-size-mismatch): show it in full.",
        epilog=KB_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("id", nargs="?", help="entry id or rule code")
    add_output_options(p, fail_on=False)
    p.set_defaults(run=run)


def _find_rule(key: str) -> str | None:
    from zerodoctor.lint.rules import RULES

    for code, module in RULES.items():
        if key.upper() == code or key.lower() == module.RULE.name:
            return code
    return None


def run(args: argparse.Namespace) -> int:
    from zerodoctor.kb.loader import load_entries
    from zerodoctor.kb.schema import entry_data
    from zerodoctor.lint.rules import RULES

    entries = load_entries()
    out = sys.stdout
    if args.id:
        code = _find_rule(args.id)
        if code:
            d = rule_dict(code)
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
                    {"schema_version": JSON_SCHEMA_VERSION, "entry": entry_data(e)},
                    indent=2,
                    ensure_ascii=False,
                )
                + "\n"
            )
        elif args.format == "markdown":
            body = entry_text(e).split("\n", 1)[1]
            out.write(f"# {e.id}: {e.title}\n{body}")
        else:
            out.write(entry_text(e))
        return EXIT_CLEAN
    if args.format == "json":
        doc = {
            "schema_version": JSON_SCHEMA_VERSION,
            "entries": [entry_summary(e) for e in entries],
            "rules": [rule_dict(c) for c in RULES],
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
