"""`zerodoctor diagnose --format json` gives byte-identical output under any PYTHONHASHSEED (two processes)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

CORPUS = Path(__file__).parent / "corpus"


def _run(seed: str, logs: list[str], cache: Path) -> str:
    env = {**os.environ, "PYTHONHASHSEED": seed, "ZERODOCTOR_CACHE_DIR": str(cache)}
    p = subprocess.run(
        [sys.executable, "-m", "zerodoctor", "diagnose", "--format", "json", "--fail-on", "never", *logs],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=60,
    )
    assert p.returncode == 0, p.stderr
    return p.stdout


def test_json_identical_under_two_hash_seeds(tmp_path: Path) -> None:
    # The healthy log has the trace-cache warning that two KB entries' signatures match (the id flipped with
    # the seed); the multi-rank log has echoes, ranks and a first failure to choose.
    logs = [
        str(CORPUS / "healthy_deepspeed_zero3_offload_ds0144_warnings_and_save.log"),
        str(CORPUS / "multirank_rank5_sigkill_then_nccl_broken_pipe_echoes.log"),
    ]
    a = _run("1", logs, tmp_path)
    b = _run("4242", logs, tmp_path)
    assert a == b
    assert '"trace-cache' in a or "Invalidate trace cache" in a
