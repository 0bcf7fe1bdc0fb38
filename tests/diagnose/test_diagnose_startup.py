"""What `zerodoctor diagnose LOG` loads at start: PyYAML and pydantic only when the knowledge-base cache misses,
rich only for text output, the config readers only when --config (or an option's choices) needs them; the options
still check their values."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from zerodoctor.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
LOG = ROOT / "tests/diagnose/corpus/healthy_hf_trainer_qwen2_1_5b_full_run.log"

_PROBE = (
    "import contextlib, io, sys\n"
    "from zerodoctor.cli.main import main\n"
    "with contextlib.redirect_stdout(io.StringIO()):\n"
    "    rc = main(['diagnose', '--format', 'json', '--fail-on', 'never', sys.argv[1]])\n"
    "print(rc, *(m in sys.modules for m in ('yaml', 'pydantic', 'rich', 'zerodoctor.setup.model')))\n"
)


def _loaded(cache: Path) -> list[str]:
    env = {**os.environ, "ZERODOCTOR_CACHE_DIR": str(cache)}
    p = subprocess.run(
        [sys.executable, "-c", _PROBE, str(LOG)], capture_output=True, text=True, env=env, timeout=120
    )
    assert p.returncode == 0, p.stderr
    return p.stdout.split()


def test_cache_hit_loads_neither_yaml_pydantic_rich_nor_the_config_readers(tmp_path: Path) -> None:
    # first run: the cache is empty, the YAML is parsed and validated
    assert _loaded(tmp_path) == ["0", "True", "True", "False", "False"]
    assert list(tmp_path.glob("kb-*.bin"))
    assert _loaded(tmp_path) == ["0", "False", "False", "False", "False"]  # from the cache


def test_kind_and_framework_still_checked_and_used(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diagnose", "--kind", "bogus", str(LOG)]) == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'bogus'" in err and "'deepspeed'" in err
    config = ROOT / "examples/healthy-hf-zero3/ds_z3_config.json"
    args = ["diagnose", "--format", "json", "--fail-on", "never", "--config", str(config)]
    assert main([*args, "--kind", "deepspeed", "--framework", "deepspeed", str(LOG)]) == 0
    assert '"findings"' in capsys.readouterr().out
    assert main(["diagnose", "--help"]) == 0
    out = capsys.readouterr().out
    assert "llamafactory" in out and "xtuner" in out  # the choices are listed in the help
