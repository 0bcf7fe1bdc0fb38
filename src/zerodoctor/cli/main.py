"""`zerodoctor` entry point. Commands are functions returning an exit code; exceptions become exit codes here,
in exactly one place: ZeroDoctorError -> one line on stderr and 2; anything else -> a bug report and 3."""

from __future__ import annotations

import argparse
import importlib
import sys
import traceback
from collections.abc import Sequence
from types import ModuleType
from typing import NoReturn

from zerodoctor import __version__
from zerodoctor.cli.common import EXIT_INTERNAL, EXIT_USAGE
from zerodoctor.errors import ZeroDoctorError

# Command name -> module with `add_parser(subparsers, epilog)` and `run(args) -> int`. Imported only when needed:
# a command's module imports its whole machinery (`diagnose` the knowledge base, `selftest` the engine launcher),
# and `zerodoctor diagnose LOG` should not pay for the others (its cold start target is 0.5 s).
COMMANDS = {
    "check": "zerodoctor.cli.check_cmd",
    "lint": "zerodoctor.cli.lint_cmd",
    "env": "zerodoctor.cli.env_cmd",
    "kb": "zerodoctor.cli.kb_cmd",
    "diagnose": "zerodoctor.cli.diagnose_cmd",
    "plan": "zerodoctor.cli.plan_cmd",
    "selftest": "zerodoctor.cli.selftest_cmd",
    "guard": "zerodoctor.cli.guard_cmd",
    "report": "zerodoctor.cli.report_cmd",
}


def command_module(name: str) -> ModuleType:
    return importlib.import_module(COMMANDS[name])


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


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole parser, or with `only` a command's own (what parsing that command's arguments needs)."""
    parser = _Parser(
        prog="zerodoctor",
        description="Make DeepSpeed ZeRO fine-tuning runs predictable: check the stack and configs before launch.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"zerodoctor {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name in COMMANDS if only is None else (only,):
        command_module(name).add_parser(sub, EPILOG)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(argv[0] if argv and argv[0] in COMMANDS else None)
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
