"""The bundled seed setups produce the findings their expected.yaml documents, through the real CLI."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
FOLDERS = sorted(p.parent for p in EXAMPLES.glob("*/expected.yaml"))


def test_every_example_has_expectations():
    folders = [p for p in EXAMPLES.iterdir() if p.is_dir()]
    assert len(FOLDERS) >= 8 and set(FOLDERS) == set(folders)


@pytest.mark.parametrize("folder", FOLDERS, ids=[f.name for f in FOLDERS])
def test_example(folder, run_cli, monkeypatch):
    exp = yaml.safe_load((folder / "expected.yaml").read_text())
    monkeypatch.chdir(folder)
    code, out, err = run_cli(*exp["command"], "--format", "json")
    assert code == exp["exit_code"], (out, err)
    doc = json.loads(out)
    labels = {f["id"] for f in doc["findings"]} | {f.get("name", "") for f in doc["findings"]}
    for want in exp["must_include"]:
        assert want in labels, (want, sorted(labels))
    for banned in exp["must_not_include"]:
        assert not any(label == banned or label.startswith(banned + ":") for label in labels), (
            banned,
            sorted(labels),
        )
    assert os.getcwd() == str(folder)
