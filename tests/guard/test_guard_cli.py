"""`zerodoctor guard -- torchrun ...`: the guard on every rank of an unmodified HF Trainer script."""

from __future__ import annotations

import json
import os
import sys

import pytest

from zerodoctor.cli.main import main

from .conftest import JOB, SHORT_OF_HOST_RAM, torchrun_cmd


def test_guard_needs_a_command(capsys):
    assert main(["guard"]) == 2
    assert "no command to run" in capsys.readouterr().err


def test_guard_missing_program_is_a_usage_error(tmp_path, capsys):
    assert main(["guard", "--run-dir", str(tmp_path), "--", "no-such-program-zd"]) == 2
    assert "no-such-program-zd: command not found" in capsys.readouterr().err


def test_guard_passes_exit_code_and_chains_existing_sitecustomize(tmp_path, monkeypatch):
    user = tmp_path / "user"
    user.mkdir()
    (user / "sitecustomize.py").write_text("import os\nos.environ['USER_SITE_RAN'] = '1'\n")
    monkeypatch.setenv("PYTHONPATH", str(user))
    code = (
        "import os, sys; sys.exit(5 if os.environ.get('USER_SITE_RAN') == '1' and "
        "'zerodoctor.guard.autoinstall' in sys.modules else 9)"
    )
    assert main(["guard", "--run-dir", str(tmp_path), "--", sys.executable, "-c", code]) == 5


@pytest.mark.engine
def test_guard_instruments_an_unmodified_trainer_on_every_rank(tmp_path):
    pytest.importorskip("deepspeed")
    pytest.importorskip("transformers")
    out = tmp_path / "run"
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    job = [
        str(JOB),
        "hf",
        str(out),
        "--no-callback",
        "--steps",
        "4",
        "--save-steps",
        "2",
        "--raise-on-rank",
        "0",
    ]
    rc = main(["guard", "--run-dir", str(out), *SHORT_OF_HOST_RAM, "--", *torchrun_cmd(job)])
    assert rc != 0  # the injected exception on rank 0 fails the launch, as it would without the guard
    for rank in (0, 1):
        recs = [json.loads(x) for x in (out / "zerodoctor" / f"rank{rank}.jsonl").read_text().splitlines()]
        events = [r["event"] for r in recs if r["kind"] == "event"]
        assert "train_begin" in events and events.count("save_end") >= 2, events
        assert max(r["step"] for r in recs if r["kind"] == "sample") == 4
        meta = recs[0]
        assert meta["options"]["host_measure"] == "rss"
        (headroom,) = [
            r["finding"]
            for r in recs
            if r["kind"] == "finding" and r["finding"]["id"] == "guard.save-headroom"
        ]
        assert headroom["data"]["saved_without_optimizer"] is True
    ckpts = sorted(out.glob("checkpoint-*"))
    assert ckpts and all(
        not list(c.glob("global_step*")) for c in ckpts
    )  # no DeepSpeed optimizer state saved
    err = json.loads((out / "zerodoctor" / "error-rank0.json").read_text())
    assert "out of memory" in (err["diagnosis"]["title"] + err["diagnosis"]["message"]).lower()
