"""One error boundary: every expected failure is a ZeroDoctorError; the CLI turns it into one line and exit 2.

Anything else reaching the CLI is a bug in zerodoctor (exit 3).
"""

from __future__ import annotations


class ZeroDoctorError(Exception):
    """Base class. `str(err)` is the one-line message shown to the user; `hint` says what to do."""

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message} ({self.hint})" if self.hint else self.message


class InputError(ZeroDoctorError):
    """A user file cannot be read or parsed. Carries file:line:col."""

    def __init__(
        self,
        path: str,
        message: str,
        *,
        line: int | None = None,
        column: int | None = None,
        hint: str | None = None,
    ) -> None:
        loc = path
        if line is not None:
            loc += f":{line}"
            if column is not None:
                loc += f":{column}"
        super().__init__(f"{loc}: {message}", hint=hint)
        self.path = path
        self.line = line
        self.column = column


class UsageError(ZeroDoctorError):
    """Bad command-line usage."""


class OutputError(ZeroDoctorError):
    """An output cannot be written (standard output on a full disk, $GITHUB_STEP_SUMMARY a directory)."""


class SetupError(ZeroDoctorError):
    """The files given do not form a usable training setup."""


class KnowledgeBaseError(ZeroDoctorError):
    """A knowledge-base entry is malformed or an id is unknown."""


class EnvError(ZeroDoctorError):
    """An environment snapshot (`--env`) cannot be read."""


class PlanError(ZeroDoctorError):
    """The memory planner was given an impossible or incomplete question."""


class DiagnoseError(ZeroDoctorError):
    """A log cannot be read."""
