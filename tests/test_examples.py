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


CHECKED = sorted(
    p.parent for p in EXAMPLES.glob("*/expected.yaml") if "check" in yaml.safe_load(p.read_text())
)


def test_every_example_has_a_check_verdict():
    assert set(CHECKED) == set(FOLDERS)
    verdicts = {yaml.safe_load((f / "expected.yaml").read_text())["check"]["verdict"] for f in CHECKED}
    assert {"ready", "will fail"} <= verdicts


@pytest.mark.parametrize("folder", CHECKED, ids=[f.name for f in CHECKED])
def test_check_verdict(folder, run_cli):
    """`zerodoctor check FOLDER` names the scenario's failure from the setup alone, and passes healthy ones."""
    want = yaml.safe_load((folder / "expected.yaml").read_text())["check"]
    code, out, err = run_cli("check", str(folder), *want["args"], "--format", "json")
    doc = json.loads(out)
    assert doc["verdict"] == want["verdict"], (
        doc["verdict"],
        [(f["id"], f["title"]) for f in doc["findings"]],
    )
    assert code == (0 if want["verdict"].startswith("ready") else 1), err
    labels = {f["id"] for f in doc["findings"]} | {f.get("name", "") for f in doc["findings"]}
    labels |= {x for f in doc["findings"] for x in f.get("data", {}).get("also_found_by", [])}
    for needle in want["must_include"]:
        assert needle in labels, (needle, sorted(labels))
    for banned in want["must_not_include"]:
        assert not any(label == banned or label.startswith(banned + ":") for label in labels), (
            banned,
            sorted(labels),
        )
    errors = [f for f in doc["findings"] if f["severity"] == "error"]
    if "first_error_phase" in want:
        assert errors and errors[0]["data"]["phase"] == want["first_error_phase"], errors[:1]
    else:
        assert not errors
    # every finding ends in an action
    assert all(f["fixes"] for f in doc["findings"] if f["severity"] != "info"), doc["findings"]
