"""Options and output shared by the commands."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zerodoctor.errors import UsageError
from zerodoctor.findings import Finding, Severity

if TYPE_CHECKING:
    from zerodoctor.env.model import Environment

EXIT_CLEAN, EXIT_FINDINGS, EXIT_USAGE, EXIT_INTERNAL = 0, 1, 2, 3


def add_output_options(p: argparse.ArgumentParser, *, fail_on: bool = True) -> None:
    p.add_argument(
        "--format",
        choices=("text", "json", "markdown"),
        default="text",
        help="output format (json is versioned: schema_version)",
    )
    if fail_on:
        p.add_argument(
            "--fail-on",
            choices=("error", "warning", "info", "never"),
            default="error",
            help="exit 1 when a finding is at or above this severity (default: error)",
        )


def add_env_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--env",
        metavar="FILE",
        help="environment snapshot: `zerodoctor env --format json` output, or a `pip freeze` listing",
    )


def load_env_option(path: str | None) -> Environment | None:
    if not path:
        return None
    from zerodoctor.env.snapshot import load_env

    return load_env(Path(path))


def exit_code(findings: Sequence[Finding], fail_on: str) -> int:
    if fail_on == "never":
        return EXIT_CLEAN
    threshold = Severity.parse(fail_on)
    return EXIT_FINDINGS if any(f.severity >= threshold for f in findings) else EXIT_CLEAN


def emit(
    args: argparse.Namespace,
    command: str,
    findings: Sequence[Finding],
    *,
    title: str,
    header: str | None = None,
    extra: dict[str, Any] | None = None,
    clean_message: str = "No problems found.",
) -> None:
    from zerodoctor.report.render import envelope, render_markdown, render_text, to_json

    out = sys.stdout
    if args.format == "json":
        out.write(to_json(envelope(command, findings, **(extra or {}))))
    elif args.format == "markdown":
        out.write(render_markdown(findings, title=title))
    else:
        out.write(render_text(findings, header=header, color=out.isatty(), clean_message=clean_message))


def require(condition: bool, message: str) -> None:
    if not condition:
        raise UsageError(message)
