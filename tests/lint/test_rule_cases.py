"""Every lint rule's case file (tests/lint/cases/<CODE>.yaml), run through one parametrized test.

A case writes its files into a temporary folder, optionally an environment (`pip freeze` text), lints them
with only that rule, and compares the findings with `expect` (in the engine's order: severity, file, line).
Cases with `expect: []` are the no-false-alarm cases.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from zerodoctor.env.snapshot import load_env
from zerodoctor.lint.engine import lint_setup, select_rules
from zerodoctor.lint.rules import RULES
from zerodoctor.setup.load import load_setup

CASES_DIR = Path(__file__).parent / "cases"


def _load_cases() -> list[tuple[str, dict]]:
    out = []
    for path in sorted(CASES_DIR.glob("*.yaml")):
        doc = yaml.safe_load(path.read_text())
        assert doc["rule"] == path.stem, f"{path}: rule {doc['rule']} does not match the file name"
        for case in doc["cases"]:
            out.append((doc["rule"], case))
    return out


CASES = _load_cases()


def test_every_rule_has_a_case_file_with_pass_and_fail_cases():
    by_rule: dict[str, list[dict]] = {}
    for code, case in CASES:
        by_rule.setdefault(code, []).append(case)
    assert set(by_rule) == set(RULES), f"rules without case files: {set(RULES) - set(by_rule)}"
    for code, cases in by_rule.items():
        assert any(c["expect"] for c in cases), f"{code} has no case where it fires"
        assert any(not c["expect"] for c in cases), f"{code} has no case where it must stay silent"


def run_case(code: str, case: dict, tmp_path: Path):
    for name, content in case["files"].items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(content)
    env = None
    if "env" in case:
        (tmp_path / "env.txt").write_text(case["env"])
        env = load_env(tmp_path / "env.txt")
    args = case.get("args", list(case["files"]))
    opts = case.get("options", {})
    setup = load_setup([tmp_path / a for a in args], env=env, **opts)
    return lint_setup(setup, select_rules([code]))


@pytest.mark.parametrize(("code", "case"), CASES, ids=[f"{c}::{case['name']}" for c, case in CASES])
def test_rule_case(code, case, tmp_path):
    findings = run_case(code, case, tmp_path)
    got = [
        f"{f.severity.label} {f.evidence[0].location() if f.evidence else ''}: {f.message}" for f in findings
    ]
    assert len(findings) == len(case["expect"]), "\n".join(got) or "no findings"
    for f, want in zip(findings, case["expect"], strict=True):
        assert f.id == code
        assert f.severity.label == want["severity"], got
        ev = f.evidence[0] if f.evidence else None
        if "file" in want:
            assert ev is not None and ev.file and Path(ev.file).name == want["file"], got
        if "line" in want:
            assert ev is not None and ev.line == want["line"], got
        if "key" in want:
            assert ev is not None and ev.key == want["key"], got
        for text in want.get("contains", []):
            assert text in f.message, f"{text!r} not in {f.message!r}"
        if "fix_patch" in want:
            patches = [fx.patch for fx in f.fixes if fx.patch]
            assert want["fix_patch"] in patches, patches
        for text in want.get("fix_contains", []):
            assert any(text in fx.text for fx in f.fixes), [fx.text for fx in f.fixes]
        for banned in want.get("no_fix_patch_key", []):
            assert not any(banned in str(fx.patch) for fx in f.fixes if fx.patch), [fx.patch for fx in f.fixes]
