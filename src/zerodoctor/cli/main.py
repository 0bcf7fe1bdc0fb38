"""`zerodoctor` entry point. Commands are functions returning an exit code; exceptions become exit codes here,
in exactly one place: ZeroDoctorError -> one line on stderr and 2; anything else -> a bug report and 3."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys
import traceback
from collections.abc import Sequence
from types import ModuleType
from typing import Any, NoReturn, TextIO

from zerodoctor import __version__
from zerodoctor.cli.common import EXIT_INTERNAL, EXIT_USAGE
from zerodoctor.errors import OutputError, ZeroDoctorError
from zerodoctor.textutil import printable

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


class _Output:
    """Standard output while a command runs: a write or flush that fails (a full disk, a closed or broken
    descriptor) becomes an OutputError (exit 2, one line) instead of an internal error. A broken pipe stays a
    BrokenPipeError: `zerodoctor ... | head` is a normal way to stop reading."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        try:
            return self.stream.write(text)
        except BrokenPipeError:
            raise
        except OSError as err:
            raise _stdout_error(err) from None

    def flush(self) -> None:
        try:
            self.stream.flush()
        except BrokenPipeError:
            raise
        except OSError as err:
            raise _stdout_error(err) from None

    def __getattr__(self, name: str) -> Any:  # isatty, encoding, fileno ...: the stream's own
        return getattr(self.stream, name)


def _stdout_error(err: OSError) -> OutputError:
    return OutputError(
        f"cannot write standard output: {err.strerror or err}",
        hint="check the disk or file that standard output is redirected to",
    )


def _tolerant_terminal() -> None:
    """Text that the terminal's encoding cannot show (a Chinese file name on an ASCII or Latin-1 console, a
    file name's undecodable bytes) is written as backslash escapes instead of raising UnicodeEncodeError."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None and getattr(stream, "errors", None) != "backslashreplace":
            with contextlib.suppress(ValueError, OSError):  # a closed or detached stream: nothing to write to
                reconfigure(errors="backslashreplace")


def _discard_stdout() -> None:
    """After standard output failed: point its descriptor at /dev/null, so that Python's flush at exit does
    not fail again with "Exception ignored" noise and exit status 120."""
    if sys.__stdout__ is None:
        return
    with contextlib.suppress(OSError, ValueError):
        fd = os.open(os.devnull, os.O_WRONLY)
        os.dup2(fd, sys.__stdout__.fileno())
        os.close(fd)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if sys.stderr is None:  # started with stderr closed (2>&-): errors go nowhere, but must not crash
        sys.stderr = open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115 - lives as long as the process
    if sys.stdout is None:  # started with stdout closed (>&-)
        sys.stderr.write(
            "zerodoctor: error: cannot write standard output: it is closed "
            "(redirect it to a file or /dev/null instead of closing it)\n"
        )
        return EXIT_USAGE
    _tolerant_terminal()
    parser = build_parser(argv[0] if argv and argv[0] in COMMANDS else None)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help / --version (0) or a usage error (2)
        return int(exc.code or 0)
    if not args.command:
        parser.print_help()
        return EXIT_USAGE
    stdout = sys.stdout
    sys.stdout = _Output(stdout)
    try:
        code = int(args.run(args))
        sys.stdout.flush()  # a full disk shows here, not in Python's flush at exit
        return code
    except OutputError as exc:
        sys.stderr.write(f"zerodoctor: error: {printable(str(exc))}\n")
        if stdout is sys.__stdout__:
            _discard_stdout()
        return EXIT_USAGE
    except ZeroDoctorError as exc:  # the message may quote a user's value: its control characters escaped
        sys.stderr.write(f"zerodoctor: error: {printable(str(exc))}\n")
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
    finally:
        sys.stdout = stdout


def entry_point() -> None:
    sys.exit(main())
