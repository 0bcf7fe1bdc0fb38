"""`zerodoctor guard -- torchrun ...`: the guard on every rank of an unmodified HF Trainer script."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from zerodoctor.cli.main import main
from zerodoctor.engine.launch import free_port

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


def _records(out, rank: int) -> list[dict]:
    return [json.loads(x) for x in (out / "zerodoctor" / f"rank{rank}.jsonl").read_text().splitlines()]


def _findings(recs: list[dict], fid: str) -> list[dict]:
    return [r["finding"] for r in recs if r["kind"] == "finding" and r["finding"]["id"] == fid]


def _device_checks_pass_and_wrong_device_is_reported(out, recs: list[dict]) -> None:
    placements = [r for r in recs if r["kind"] == "placement"]
    assert [p["when"] for p in placements] == ["train_begin", "first_optimizer_step"]
    assert all(p["ok"] for p in placements)
    assert placements[1]["summary"]["parameter partition (ds_tensor)"] == {"cpu": 21}
    res = json.loads((out / "wrong_device_rank0.json").read_text())
    assert res["before"] == [] and res["after"][0]["id"] == "guard.tensor-wrong-device"
    assert (
        f"{res['moved']}" in res["after"][0]["message"]
        and "is on meta, expected cpu" in res["after"][0]["message"]
    )


@pytest.mark.engine
def test_guard_instruments_an_unmodified_trainer_on_every_rank(tmp_path, monkeypatch):
    """HF Trainer without the callback in its code: telemetry and saves on both ranks, device checks, the trend
    warning for a growing host allocation, the opt-in save without optimizer state, an internal guard fault
    that does not stop training, and the exception diagnosed and re-raised."""
    pytest.importorskip("deepspeed")
    pytest.importorskip("transformers")
    out = tmp_path / "run"
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("ZERODOCTOR_GUARD_FAULT", "on_epoch_begin")
    job = [str(JOB), "hf", str(out), "--no-callback", "--grow", "--wrong-device", "--raise-on-rank", "0"]
    rc = main(["guard", "--run-dir", str(out), *SHORT_OF_HOST_RAM, "--", *torchrun_cmd(job)])
    assert rc != 0  # the injected exception on rank 0 fails the launch, as it would without the guard
    for rank in (0, 1):
        recs = _records(out, rank)
        events = [r["event"] for r in recs if r["kind"] == "event"]
        assert "train_begin" in events and events.count("save_end") >= 2, events
        assert "evaluation_end" in events and "epoch_end" in events
        assert max(r["step"] for r in recs if r["kind"] == "sample") == 8
        meta = recs[0]
        assert meta["options"]["host_measure"] == "rss" and meta["flight_recorder"]["available"] is True
        (headroom,) = _findings(recs, "guard.save-headroom")
        assert headroom["data"]["saved_without_optimizer"] is True
        (trend,) = _findings(recs, "guard.host-ram-trend")
        assert "already over the 0.25 GiB limit" in trend["message"]  # rss against the --host-limit-gib
        (fault,) = [r for r in recs if r["kind"] == "guard_error"]
        assert fault["where"] == "on_epoch_begin" and "injected guard fault" in fault["error"]
        assert json.loads((out / f"done_rank{rank}.json").read_text())["global_step"] == 8
    _device_checks_pass_and_wrong_device_is_reported(out, _records(out, 0))
    ckpts = sorted(out.glob("checkpoint-*"))
    assert ckpts and all(
        not list(c.glob("global_step*")) for c in ckpts
    )  # no DeepSpeed optimizer state saved
    err = json.loads((out / "zerodoctor" / "error-rank0.json").read_text())
    assert "out of memory" in (err["diagnosis"]["title"] + err["diagnosis"]["message"]).lower()
    assert not (out / "zerodoctor" / "error-rank1.json").exists()


@pytest.mark.engine
def test_guard_watches_an_unmodified_deepspeed_loop_on_every_rank(tmp_path, monkeypatch, capsys):
    """A plain deepspeed.initialize loop without zerodoctor in its code: the launcher wrapper watches the
    engine on both ranks; device checks, trend warning, guard fault, the exception (with the flight
    recorder's last collectives), and rank 1 late to a barrier: both ranks dump stacks, diagnose names it."""
    pytest.importorskip("deepspeed")
    out = tmp_path / "run"
    for var, value in {
        "OMP_NUM_THREADS": "1",
        "ZERODOCTOR_GUARD_FAULT": "ds_step",
        "ZERODOCTOR_GUARD_HANG_MIN_S": "2",
        "ZERODOCTOR_GUARD_HOST_MEASURE": "rss",
    }.items():
        monkeypatch.setenv(var, value)
    job = [str(JOB), "ds", str(out), "--no-watch", "--grow", "--wrong-device", "--raise-on-rank", "1"]
    job += ["--hang-seconds", "8"]
    rc = main(["guard", "--run-dir", str(out), "--hang-factor", "1", "--", *torchrun_cmd(job)])
    assert rc != 0
    for rank in (0, 1):
        recs = _records(out, rank)
        events = [r["event"] for r in recs if r["kind"] == "event"]
        assert events.count("save_begin") == 2 and events.count("save_end") == 2, events
        assert sorted({r["step"] for r in recs if r["kind"] == "sample"})[-1] == 8
        assert len(_findings(recs, "guard.host-ram-trend")) == 1
        (fault,) = [r for r in recs if r["kind"] == "guard_error"]
        assert fault["where"] == "ds_step"
        assert json.loads((out / f"done_rank{rank}.json").read_text())["global_step"] == 8
    _device_checks_pass_and_wrong_device_is_reported(out, _records(out, 0))
    err = json.loads((out / "zerodoctor" / "error-rank1.json").read_text())
    assert (
        err["rank"] == 1 and err["diagnosis"]["id"] and err["flight_recorder"] == "flight-recorder-rank1.json"
    )
    trace = json.loads((out / "zerodoctor" / "flight-recorder-rank1.json").read_text())
    assert "gloo:barrier" in [e.get("profiling_name") for e in trace["entries"]]
    assert not (out / "zerodoctor" / "error-rank0.json").exists()
    assert main(["diagnose", str(out), "--format", "json"]) == 1
    (hang,) = [f for f in json.loads(capsys.readouterr().out)["findings"] if f["id"] == "guard.hang"]
    assert hang["title"] == "rank(s) [0] wait in barrier for rank(s) [1]", hang
    assert "rank 1 never arrived: it was in busy_elsewhere (guard_job.py:" in hang["message"]


@pytest.mark.engine
def test_guard_under_the_deepspeed_launcher_writes_the_error_file_it_does_not(tmp_path, monkeypatch):
    """The `deepspeed` launcher records nothing about a failed rank (no torchrun error file): the guard's per-rank
    error file names the rank, the time and the diagnosis."""
    pytest.importorskip("deepspeed")
    launcher = Path(sys.executable).parent / "deepspeed"
    if not launcher.exists():
        pytest.skip("the deepspeed launcher is not installed next to this Python")
    out = tmp_path / "run"
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    job = [
        str(JOB),
        "ds",
        str(out),
        "--no-watch",
        "--steps",
        "4",
        "--save-steps",
        "2",
        "--raise-on-rank",
        "1",
    ]
    launch = [str(launcher), "--num_gpus", "2", "--master_port", str(free_port()), *job]
    assert main(["guard", "--run-dir", str(out), "--", *launch]) != 0
    for rank in (0, 1):
        recs = _records(out, rank)
        assert recs[0]["world_size"] == 2 and recs[0]["local_rank"] == rank
        assert [r["event"] for r in recs if r["kind"] == "event"].count("save_end") == 2
    err = json.loads((out / "zerodoctor" / "error-rank1.json").read_text())
    assert err["rank"] == 1 and err["time"].endswith("Z") and err["step"] == 4 and err["diagnosis"]["id"]
    assert not (out / "zerodoctor" / "error-rank0.json").exists()
