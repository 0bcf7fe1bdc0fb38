"""`zerodoctor diagnose LOG|RUN_DIR... | -`: name the failure in a run's logs, with evidence, root cause and fixes."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Iterator, Sequence
from typing import Any, overload

from zerodoctor.cli.common import add_env_option, add_output_options, exit_code, load_env_option


class _LazyChoices(Sequence[str]):
    """An option's choices read from the module that defines them the first time argparse looks at them (the
    option given, or --help). `zerodoctor.setup.model` loads the config readers: 15-25 ms of a cold start that
    `diagnose LOG` without --config never uses."""

    def __init__(self, module: str, name: str) -> None:
        self._module, self._name = module, name
        self._values: tuple[str, ...] | None = None

    def _get(self) -> tuple[str, ...]:
        if self._values is None:
            self._values = tuple(sorted(getattr(importlib.import_module(self._module), self._name)))
        return self._values

    @overload
    def __getitem__(self, i: int) -> str: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[str]: ...
    def __getitem__(self, i: int | slice) -> str | Sequence[str]:
        return self._get()[i]

    def __len__(self) -> int:
        return len(self._get())

    def __iter__(self) -> Iterator[str]:
        return iter(self._get())

    def __contains__(self, value: object) -> bool:
        return value in self._get()


def add_parser(sub: argparse._SubParsersAction, epilog: str) -> None:  # type: ignore[type-arg]
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
    # (a metavar, so that building the parser does not list the choices: they are read when used)
    p.add_argument(
        "--kind",
        choices=_LazyChoices("zerodoctor.setup.document", "KINDS"),
        metavar="KIND",
        help="with --config: read every FILE as this kind (%(choices)s)",
    )
    p.add_argument(
        "--framework",
        choices=_LazyChoices("zerodoctor.setup.model", "FRAMEWORKS"),
        metavar="FRAMEWORK",
        help="with --config: how the job was launched (%(choices)s)",
    )
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
