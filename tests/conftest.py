"""Shared fixtures. Tests run the real libraries; nothing here mocks DeepSpeed, transformers or torch."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


@pytest.fixture
def run_cli(capsys):
    """Run `zerodoctor ...` through main(argv); returns (exit code, stdout, stderr)."""
    from zerodoctor.cli.main import main

    def _run(*argv: str) -> tuple[int, str, str]:
        code = main(list(argv))
        out, err = capsys.readouterr()
        return code, out, err

    return _run


@pytest.fixture(autouse=True)
def _stable_env(monkeypatch):
    # Rich reads the terminal size and colour settings from the environment: keep output stable.
    monkeypatch.setenv("COLUMNS", "100")
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    monkeypatch.setenv("NO_COLOR", "1")
    yield


def python_exe() -> str:
    return sys.executable


os.environ.setdefault("PYTHONHASHSEED", "0")
