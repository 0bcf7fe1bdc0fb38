"""`zerodoctor env`: probe the installed stack and machine and judge it against the knowledge base."""

from __future__ import annotations

import argparse
import sys

from zerodoctor.cli.common import add_env_option, add_output_options, emit, exit_code, load_env_option
from zerodoctor.report.env import environment_table


def add_parser(sub: argparse._SubParsersAction, epilog: str) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "env",
        help="probe the stack and machine, match against known-bad versions",
        description="Probe Python packages, DeepSpeed ops, GPUs, host RAM, /dev/shm, memlock, CUDA "
        "toolkit and environment variables, and judge them. `--format json > env.json` "
        "writes a snapshot every other command accepts with --env.",
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_output_options(p)
    add_env_option(p)
    p.add_argument(
        "--no-deep",
        action="store_true",
        help="skip the DeepSpeed op-compatibility probe (a subprocess that imports deepspeed, a few s)",
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from zerodoctor.env.judge import judge_environment

    env = load_env_option(args.env)
    if env is None:
        from zerodoctor.env.collect import collect

        env = collect(deep=not args.no_deep)
    findings = judge_environment(env)
    header = environment_table(env) if args.format == "text" else None
    emit(
        args,
        "env",
        findings,
        title="zerodoctor env",
        header=header,
        extra={"environment": env.to_dict()},
        clean_message="No known problem with this stack.",
    )
    if args.format == "text":
        sys.stdout.flush()
    return exit_code(findings, args.fail_on)
