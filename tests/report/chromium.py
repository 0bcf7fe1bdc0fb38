"""Open a page in headless Chromium (Debian's package) with a fresh profile; skip when it is not installed."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def find_chromium() -> str | None:
    for cand in ("/usr/bin/chromium", shutil.which("chromium") or "", shutil.which("chromium-browser") or ""):
        if cand and os.access(cand, os.X_OK):
            return cand
    return None


def open_in_chromium(page: Path, profile: Path) -> tuple[str, list[str]]:
    """(the DOM after scripts ran, console lines) from a fresh headless Chromium profile."""
    exe = find_chromium()
    if exe is None:
        pytest.skip("headless Chromium not found (/usr/bin/chromium; .ci/run installs Debian's chromium)")
    proc = subprocess.run(
        [
            exe,
            *CHROMIUM_FLAGS,
            f"--user-data-dir={profile}",
            "--enable-logging=stderr",
            "--v=0",
            "--virtual-time-budget=5000",
            "--dump-dom",
            page.resolve().as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    console = [line for line in proc.stderr.splitlines() if ":CONSOLE" in line]
    return proc.stdout, console
