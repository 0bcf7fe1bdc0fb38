"""`zerodoctor diagnose LOG|RUN_DIR... | -`: name the failure in a run's logs, with evidence, root cause and fixes."""

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
        description="Read training logs (plain, .gz, or - for stdin; any size, multi-rank; a run directory "
        "is read as its per-rank logs and torchrun error files) and match them "
        "against the knowledge base: the first failure, its phase, the root cause and the ranked fixes. "
        "--env and --config sharpen the verdict (version and config conditions).",
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "logs",
        nargs="+",
        metavar="LOG",
        help="log files (plain or .gz), run directories (per-rank logs, torchrun error.json files), or - for stdin",
    )
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
    if args.format == "json":
        from zerodoctor.report.diagnose import render_json

        sys.stdout.write(render_json(result))
    elif args.format == "markdown":
        from zerodoctor.report.diagnose import render_diagnosis_markdown

        sys.stdout.write(render_diagnosis_markdown(result))
    else:
        from zerodoctor.report.diagnose import render_diagnosis_text

        sys.stdout.write(render_diagnosis_text(result, color=sys.stdout.isatty()))
    return exit_code(result.findings, args.fail_on)
