"""The README's two commands and CI install the same way."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

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
        if step.startswith(("pip install", "python -m pytest", "ruff check", "mypy")):
            assert step in ci, f"README step not in .ci/run: {step}"


def _example_commands() -> list[str]:
    """The `zerodoctor ...` lines of the README's bash blocks other than the two set-up commands."""
    text = (ROOT / "README.md").read_text()
    out = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for line in block.splitlines():
            line = line.strip()
            if line and not line.startswith("python3 -m venv") and "zerodoctor " in line:
                out.append(line)
    return out


def test_readme_main_command_is_check_on_a_seed_setup():
    main = _commands()[0]
    assert "zerodoctor check examples/" in main


@pytest.mark.parametrize("command", _example_commands())
def test_every_readme_command_runs_as_written(command, tmp_path):
    """Run from a copy of the repository's examples and logs, so commands that write never touch the repo."""
    (tmp_path / "tests" / "diagnose").mkdir(parents=True)
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    (tmp_path / "tests" / "diagnose" / "corpus").symlink_to(ROOT / "tests" / "diagnose" / "corpus")
    (tmp_path / "tests" / "guard").symlink_to(ROOT / "tests" / "guard")
    bindir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}"}
    proc = subprocess.run(
        command, shell=True, cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env
    )
    assert proc.returncode in (0, 1), (command, proc.stdout[-2000:], proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.stdout.strip(), command


def test_pre_commit_hook_runs_check():
    import yaml

    hooks = yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())
    hook = next(h for h in hooks if h["id"] == "zerodoctor-check")
    assert hook["entry"] == "zerodoctor check" and hook["pass_filenames"] is False
    # the entry is the installed console script
    assert "zerodoctor = " in (ROOT / "pyproject.toml").read_text()
