"""`zerodoctor` entry point. Commands are functions returning an exit code; exceptions become exit codes here,
in exactly one place: ZeroDoctorError -> one line on stderr and 2; anything else -> a bug report and 3."""

from __future__ import annotations

import argparse
import sys
import traceback
from collections.abc import Sequence
from typing import NoReturn

import zerodoctor.cli.guard_cmd as guard_cmd
import zerodoctor.cli.report_cmd as report_cmd
from zerodoctor import __version__
from zerodoctor.cli import check_cmd, diagnose_cmd, env_cmd, kb_cmd, lint_cmd, plan_cmd, selftest_cmd
from zerodoctor.cli.common import EXIT_INTERNAL, EXIT_USAGE
from zerodoctor.errors import ZeroDoctorError

# Command name -> module with `add_parser(subparsers)` and `run(args) -> int`. Later: check, plan, diagnose,
# selftest, report.
COMMANDS = {
    "check": check_cmd,
    "lint": lint_cmd,
    "env": env_cmd,
    "kb": kb_cmd,
    "diagnose": diagnose_cmd,
    "plan": plan_cmd,
    "selftest": selftest_cmd,
}
COMMANDS["guard"] = guard_cmd
COMMANDS["report"] = report_cmd

EPILOG = """exit codes:
  0  clean: no finding at or above --fail-on
  1  findings at or above --fail-on (default: error)
  2  usage or input error (a file that cannot be read or parsed, a bad option)
  3  internal error (a bug in zerodoctor: please report it with the traceback)
"""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # argparse exits 2 on its own; keep our one-line style
        self.print_usage(sys.stderr)
        sys.stderr.write(f"zerodoctor: error: {message}\n")
        raise SystemExit(EXIT_USAGE)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="zerodoctor",
        description="Make DeepSpeed ZeRO fine-tuning runs predictable: check the stack and configs before launch.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"zerodoctor {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for module in COMMANDS.values():
        module.add_parser(sub, EPILOG)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help / --version (0) or a usage error (2)
        return int(exc.code or 0)
    if not args.command:
        parser.print_help()
        return EXIT_USAGE
    try:
        return int(args.run(args))
    except ZeroDoctorError as exc:
        sys.stderr.write(f"zerodoctor: error: {exc}\n")
        return EXIT_USAGE
    except KeyboardInterrupt:
        sys.stderr.write("zerodoctor: interrupted\n")
        return 130
    except BrokenPipeError:
        return 0
    except Exception:  # the one place a bug becomes an exit code
        sys.stderr.write(
            "zerodoctor: internal error (a bug in zerodoctor; please report it with this output)\n"
        )
        traceback.print_exc(file=sys.stderr)
        return EXIT_INTERNAL


def entry_point() -> None:
    sys.exit(main())
