"""The README's two commands and CI install the same way."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    return re.findall(r"```bash\n(python3 -m venv .venv && [^\n]+)\n```", text)


def test_readme_has_exactly_two_setup_commands():
    assert len(_commands()) == 2


def test_ci_installs_as_the_readme_says():
    ci = (ROOT / ".ci" / "run").read_text()
    test_command = _commands()[1]
    steps = [s.strip() for s in test_command.split("&&")]
    for step in steps:
        if step.startswith("pip install") or step.startswith("python -m pytest"):
            assert step in ci, f"README step not in .ci/run: {step}"
