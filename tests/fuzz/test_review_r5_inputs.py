"""Review R5 (session 12): odd inputs that crashed, hung or passed silently; each now gets a clear answer.

Every case runs through `zerodoctor.cli.main.main([...])` on files written to tmp_path; no engine runs.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from zerodoctor.cli.main import main


def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize("value", ["[1, 2]", "'zero3'", "5", "true"])
@pytest.mark.parametrize("command", [["lint"], ["plan", "--model", "llama-3-8b"]])
def test_accelerate_deepspeed_config_not_a_mapping(tmp_path, capsys, value, command):
    """Item 3: `deepspeed_config:` that is not a mapping was an AttributeError (exit 3) in zero3_init_flag."""
    cfg = _write(
        tmp_path / "acc.yaml",
        f"compute_environment: LOCAL_MACHINE\ndistributed_type: DEEPSPEED\ndeepspeed_config: {value}\nnum_processes: 2\n",
    )
    rc = main([command[0], str(cfg), *command[1:]])
    err = capsys.readouterr().err
    assert rc == 2
    assert f"{cfg}:3: deepspeed_config: expected a mapping" in err
    assert "Traceback" not in err
