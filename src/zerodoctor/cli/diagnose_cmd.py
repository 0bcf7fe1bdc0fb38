"""`zerodoctor diagnose LOG... | -`: name the failure in a run's logs, with evidence, root cause and fixes."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from zerodoctor.cli.common import add_env_option, add_output_options, exit_code, load_env_option


def add_parser(sub: argparse._SubParsersAction, epilog: str) -> None:  # type: ignore[type-arg]
    from zerodoctor.setup.document import KINDS
    from zerodoctor.setup.model import FRAMEWORKS

    p = sub.add_parser(
        "diagnose",
        help="read the logs of a failed run and name the failure, the evidence and the fixes",
        description="Read training logs (plain, .gz, or - for stdin; any size, multi-rank) and match them "
        "against the knowledge base: the first failure, its phase, the root cause and the ranked fixes. "
        "--env and --config sharpen the verdict (version and config conditions).",
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("logs", nargs="+", metavar="LOG", help="log files (plain or .gz), or - for stdin")
    add_output_options(p)
    add_env_option(p)
    p.add_argument("--config", nargs="+", metavar="FILE", help="the run's training configs (as for lint)")
    p.add_argument("--kind", choices=sorted(KINDS), help="with --config: read every FILE as this kind")
    p.add_argument("--framework", choices=FRAMEWORKS, help="with --config: how the job was launched")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from zerodoctor.diagnose import diagnose
    from zerodoctor.errors import UsageError

    if args.logs.count("-") > 1:
        raise UsageError("stdin (-) can be given only once")
    env = load_env_option(args.env)
    versions: dict[str, str] = env.versions() if env is not None else {}
    facts: dict[str, Any] = env.facts() if env is not None else {}
    if args.config:
        from zerodoctor.setup.load import load_setup

        setup = load_setup(args.config, kind=args.kind, env=env, framework=args.framework)
        facts.update(setup.facts())
    elif args.kind or args.framework:
        raise UsageError("--kind and --framework only make sense with --config")
    result = diagnose(args.logs, versions=versions, config_facts=facts)
    ff = result.first_failure
    extra: dict[str, Any] = {
        "logs": [{"path": k, "lines": v} for k, v in result.stats.lines.items()],
        "engine": result.stats.engine,
        "notes": result.stats.notes,
        "versions": result.versions,
        "timeline": {
            "first_failure": None if ff is None else ff.describe(),
            "phase": None if ff is None else ff.phase,
            "echoes": [e.describe() for e in result.echoes[:20]],
            "warnings": [
                {"entry": entry, "location": line.location(), "text": line.text.strip()[:300]}
                for entry, line in result.facts.warnings
            ],
            "last_progress": None
            if result.facts.last_progress is None
            else {
                "kind": result.facts.last_progress.kind,
                "step": result.facts.last_progress.step,
                "total": result.facts.last_progress.total,
                "epoch": result.facts.last_progress.epoch,
            },
        },
    }
    findings = result.findings
    if args.format == "json":
        from zerodoctor.report.render import envelope, to_json

        sys.stdout.write(to_json(envelope("diagnose", findings, **extra)))
    elif args.format == "markdown":
        from zerodoctor.report.render import render_markdown

        sys.stdout.write(render_markdown(findings, title="zerodoctor diagnose"))
    else:
        sys.stdout.write(_text(result, extra))
    return exit_code(findings, args.fail_on)


def _text(result: Any, extra: dict[str, Any]) -> str:
    from zerodoctor.report.render import render_text

    findings = result.findings
    out: list[str] = []
    for note in result.stats.notes:
        out.append(f"note: {note}\n")
    if findings:
        out.append(render_text(findings[:1], header="Verdict:", color=sys.stdout.isatty()))
    if len(findings) > 1:
        out.append("\n")
        out.append(render_text(findings[1:], header="Other candidates (less evidence):", color=False))
    tl = extra["timeline"]
    out.append("\nTimeline:\n")
    out.append(f"  first failure: {tl['first_failure'] or 'none found'}\n")
    out.append(f"  phase: {(tl['phase'] or 'unknown').replace('_', ' ')}\n")
    lp = tl["last_progress"]
    if lp:
        step = (
            f"step {lp['step']}" + (f" of {lp['total']}" if lp["total"] else "")
            if lp["step"] is not None
            else ""
        )
        epoch = f"epoch {lp['epoch']}" if lp["epoch"] is not None else ""
        out.append(f"  last progress: {', '.join(x for x in (step, epoch) if x)}\n")
    for e in tl["echoes"][:10]:
        out.append(f"  then: {e}\n")
    for w in tl["warnings"][:10]:
        out.append(f"  warning at {w['location']} ({w['entry']}): {w['text']}\n")
    if extra["versions"]:
        out.append(
            "  versions: " + ", ".join(f"{k} {v}" for k, v in sorted(extra["versions"].items())) + "\n"
        )
    lines = sum(x["lines"] for x in extra["logs"])
    out.append(f"  read {lines} lines from {len(extra['logs'])} log(s)\n")
    return "".join(out)
