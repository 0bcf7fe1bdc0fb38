"""Review R9 of the robustness fixes: `--format json` stays valid JSON on a terminal that cannot encode all of
Unicode (the process-wide `backslashreplace` would write `\\xe9`, not a JSON escape), and `lint --fix` fixes every
finding of a rule, not only the 50 a rule shows."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.parametrize("encoding", ["ascii", "cp1252"])
def test_json_output_parses_on_a_non_utf8_terminal(tmp_path: Path, encoding: str) -> None:
    cfg = tmp_path / "配置.json"
    cfg.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3, "é😀": 1}}))
    env = {**os.environ, "PYTHONIOENCODING": encoding}
    proc = subprocess.run(
        [sys.executable, "-m", "zerodoctor", "lint", str(cfg), "--format", "json"],
        capture_output=True, env=env, timeout=120,
    )
    assert proc.returncode in (0, 1), proc.stderr
    doc = json.loads(proc.stdout.decode(encoding))
    assert any("é😀" in json.dumps(f, ensure_ascii=False) for f in doc["findings"]), doc["findings"]


def test_lint_fix_fixes_every_finding_of_a_rule_past_the_shown_cap(run_cli, tmp_path: Path) -> None:
    import dataclasses

    from transformers import TrainingArguments

    from zerodoctor.lint.engine import MAX_FINDINGS_PER_RULE

    want = MAX_FINDINGS_PER_RULE + 15
    names = sorted(f.name for f in dataclasses.fields(TrainingArguments) if len(f.name) > 8 and f.init)[:want]
    assert len(names) == want
    body = "model_name_or_path: meta-llama/Meta-Llama-3-8B\noutput_dir: out\n"
    body += "".join(f"{n}zz: null\n" for n in names)  # each one misspelt argument name
    (tmp_path / "hf.yaml").write_text(body)
    code, out, _ = run_cli("lint", str(tmp_path / "hf.yaml"), "--fix")
    fixed = [line for line in out.splitlines() if line.startswith("fixed:")]
    assert any("further" in line and "not shown" in line for line in out.splitlines()), out[-2000:]
    assert len(fixed) > MAX_FINDINGS_PER_RULE, f"{len(fixed)} fixed: {out[-2000:]}"
    written = (tmp_path / "hf.fixed.yaml").read_text()
    assert "zz:" not in written, written


def test_optimizer_params_auto_is_one_error(run_cli, tmp_path: Path) -> None:
    cfg = tmp_path / "ds.json"
    cfg.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "AdamW", "params": "auto"}}))
    code, out, _ = run_cli("lint", str(cfg))
    assert code == 1 and out.count("error DS001") == 1, out
