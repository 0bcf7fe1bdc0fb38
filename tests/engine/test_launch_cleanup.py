"""Ending a launch leaves no rank behind, though each rank runs in a session of its own (as torchrun starts them)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil

from zerodoctor.engine.launch import end_launch

# A launcher like torchrun: two "ranks" in sessions of their own that ignore SIGTERM and never end, and the
# launcher itself ignores SIGTERM too (a launcher that is stuck), so only the kill of the leftovers ends them.
LAUNCHER = """
import signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
rank = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN)\\nwhile True: time.sleep(0.2)"
for _ in range(2):
    subprocess.Popen([sys.executable, "-c", rank], start_new_session=True)
print("started", flush=True)
while True:
    time.sleep(0.2)
"""


def _start_launcher(tmp_path: Path, *, own_session: bool) -> tuple[subprocess.Popen[str], list[psutil.Process]]:
    script = tmp_path / "launcher.py"
    script.write_text(LAUNCHER)
    proc = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, text=True, start_new_session=own_session
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "started"
    deadline = time.monotonic() + 10
    ranks: list[psutil.Process] = []
    while time.monotonic() < deadline and len(ranks) < 2:
        ranks = psutil.Process(proc.pid).children(recursive=True)
        time.sleep(0.05)
    assert len(ranks) == 2
    return proc, ranks


def test_end_launch_ends_ranks_that_run_in_sessions_of_their_own(tmp_path: Path) -> None:
    proc, ranks = _start_launcher(tmp_path, own_session=True)
    assert all(os.getsid(r.pid) == r.pid != os.getsid(proc.pid) for r in ranks)  # outside the launcher's group

    end_launch(proc, grace_s=0.5)

    assert proc.poll() is not None
    assert not [r for r in ranks if r.is_running() and r.status() != psutil.STATUS_ZOMBIE]


def test_end_launch_ends_a_launcher_that_leads_no_process_group(tmp_path: Path) -> None:
    """`run_tiny_job` starts torchrun in the caller's group: the launcher itself is signalled, then its ranks."""
    proc, ranks = _start_launcher(tmp_path, own_session=False)

    end_launch(proc, grace_s=0.5)

    assert proc.poll() is not None
    assert not [r for r in ranks if r.is_running() and r.status() != psutil.STATUS_ZOMBIE]
