"""The guard on the real engine: HF Trainer + DeepSpeed ZeRO-3 (offload_optimizer + offload_param) and a
plain deepspeed.initialize loop, 2 gloo ranks on CPU, tiny Llama from a config. One run per adapter, shared
by the assertions below (see conftest.py): both runs grow host memory from step 2, move a ZeRO-3 partition to
the wrong device after training, raise on rank 1 at the end, and inject one internal guard fault."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.engine

RUNS = ["hf_run", "ds_run"]


@pytest.fixture(params=RUNS)
def run(request):
    return request.getfixturevalue(request.param)


def test_both_ranks_write_telemetry_with_step_and_save_events(run):
    for rank in (0, 1):
        assert (run.out / f"done_rank{rank}.json").exists(), run.output[-4000:]
        samples = run.kinds(rank, "sample")
        steps = sorted({s["step"] for s in samples})
        assert steps[-1] == 8 and len(steps) >= 6, steps
        events = run.events(rank)
        assert "train_begin" in events and "first_optimizer_step" in events
        assert events.count("save_begin") >= 2 and events.count("save_end") >= 2, events
        s = samples[-1]
        assert s["rss"] > 0 and s["node_total"] > 0 and "shm_total" in s
        assert "gpu_allocated" not in s  # CPU: no GPU fields at all ...
        meta = run.kinds(rank, "meta")[0]
        assert any(na["what"] == "gpu" for na in meta["not_available"])  # ... and a typed "not available"
        saves = [r for r in run.kinds(rank, "event") if r["event"] == "save_end"]
        assert all("seconds" in r and "rss_hwm_before" in r for r in saves)


def test_hf_events_include_evaluation_and_epochs_and_trainer_logs(hf_run):
    events = hf_run.events(0)
    assert "evaluation_begin" in events and "evaluation_end" in events and "epoch_end" in events
    reported = json.loads((hf_run.out / "done_rank0.json").read_text())["reported"]
    assert any("zerodoctor/host_rss_gib" in h and "loss" in h for h in reported), reported


def test_device_checks_pass_at_train_begin_and_after_first_step(run):
    for rank in (0, 1):
        placements = run.kinds(rank, "placement")
        assert [p["when"] for p in placements] == ["train_begin", "first_optimizer_step"]
        assert all(p["ok"] for p in placements)
        first = placements[1]["summary"]
        assert first["parameter partition (ds_tensor)"] == {"cpu": 21}  # offload_param: cpu
        assert set(first["optimizer state"]) == {"cpu"} and set(first["fp32 master"]) == {"cpu"}
        assert not [f for f in run.findings(rank) if f["id"] == "guard.tensor-wrong-device"]


def test_identities_gathered_once_on_rank0(hf_run):
    ids = hf_run.kinds(0, "identities")[0]["identities"]
    assert sorted(i["rank"] for i in ids) == [0, 1] and {i["device"] for i in ids} == {"cpu"}


def test_tensor_moved_to_wrong_device_is_reported(run):
    res = json.loads((run.out / "wrong_device_rank0.json").read_text())
    assert res["before"] == []
    (f,) = res["after"]
    assert f["id"] == "guard.tensor-wrong-device" and f["severity"] == "error"
    assert res["moved"] in f["message"] and "is on meta, expected cpu" in f["message"]
    assert "offload_param.device=cpu" in f["message"]


def test_growing_host_allocation_triggers_trend_warning(run):
    for rank in (0, 1):
        trend = [f for f in run.findings(rank) if f["id"] == "guard.host-ram-trend"]
        assert len(trend) == 1, run.findings(rank)
        assert trend[0]["data"]["slope_bytes_per_step"] > 30 * 2**20  # the job adds 48 MiB per step


def test_step_count_and_prediction_recorded(run):
    ids = {f["id"] for f in run.findings(0)}
    assert "guard.max-steps-below-epoch" in ids  # 8 steps of a 16-step epoch
    pred = run.kinds(0, "prediction")[0]
    assert pred["available"] and set(pred["phases"]) >= {"first_step", "steady", "save"}
    assert pred["phases"]["steady"]["gpu_bytes"] is None  # no GPU: nothing to compare on the GPU side
    assert pred["seq_len"] == 2048 and "default" in pred["seq_len_from"]  # no sequence cap in these arguments
    assert pred["phases"]["steady"]["host_items"]["process baseline"] > 0  # what the figure is made of
    gaps = run.kinds(0, "gap")
    assert [g["phase"] for g in gaps if g["phase"] != "save"] == ["load", "first_step", "steady"]
    assert [g["step"] for g in gaps if g["phase"] == "save"] == [4, 8]  # every save against the save phase
    for g in gaps:  # on CPU: this rank's RSS against its share of the per-node host prediction
        assert g["predicted_gpu"] is None and "measured_gpu" not in g
        assert g["predicted_host_rank_share"] == g["predicted_host_node"] // 2
        assert g["measured_rss_peak"] >= g["measured_rss"] > 0


def test_hf_live_config_lint_knows_the_trainer(hf_run):
    assert "DS009" not in {f["id"] for f in hf_run.findings(0)}  # HF builds the optimizer itself
    live = json.loads((hf_run.out / "zerodoctor" / "ds_config.live.json").read_text())
    assert live["zero_optimization"]["offload_param"]["device"] == "cpu"
    assert "steps_per_print" not in live  # HF's inf ("never") cannot be JSON: dropped
    assert not [r for r in hf_run.kinds(0, "guard_error") if r["where"] == "lint"]


def test_injected_exception_is_diagnosed_and_reraised(run):
    assert run.returncode != 0  # re-raised: the failing rank exits non-zero
    err = json.loads((run.out / "zerodoctor" / "error-rank1.json").read_text())
    assert err["rank"] == 1 and err["time"].endswith("Z") and err["step"] == 8
    assert err["diagnosis"]["id"]
    assert "zerodoctor guard [rank 1, step 8" in run.output
    # the original exception reaches the original hook unchanged
    assert ("OutOfMemoryError: CUDA out of memory" in run.output) or (
        "RuntimeError: Expected all tensors" in run.output
    )
    assert not (run.out / "zerodoctor" / "error-rank0.json").exists()
    # the collective flight recorder (gloo records too on this torch) dumped next to the error file
    assert err["flight_recorder"] == "flight-recorder-rank1.json"
    trace = json.loads((run.out / "zerodoctor" / "flight-recorder-rank1.json").read_text())
    assert trace["entries"] and all(e["profiling_name"].startswith("gloo:") for e in trace["entries"])


def test_hf_oom_is_diagnosed_as_cuda_oom(hf_run):
    err = json.loads((hf_run.out / "zerodoctor" / "error-rank1.json").read_text())
    d = err["diagnosis"]
    text = (d["title"] + " " + d["message"]).lower()
    assert "out of memory" in text and "3.39 gib" in text, d  # diagnose read the OOM numbers
    assert "allocator" in err  # the cheap allocator summary (empty on CPU: no CUDA allocator)


def test_guard_internal_failure_does_not_stop_training(run):
    for rank in (0, 1):
        errors = run.kinds(rank, "guard_error")
        assert len(errors) == 1 and "injected guard fault" in errors[0]["error"]
        assert json.loads((run.out / f"done_rank{rank}.json").read_text())["global_step"] == 8


def test_report_of_the_real_run_renders_offline(hf_run, tmp_path, capsys):
    """`zerodoctor report` on the real 2-rank run: JSON with both ranks, and the page in headless Chromium."""
    pytest.importorskip("matplotlib")
    from report.chromium import open_in_chromium
    from zerodoctor.cli.main import main

    assert main(["report", str(hf_run.out), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [r["rank"] for r in doc["ranks"]] == [0, 1] and doc["has_gpu"] is False
    assert doc["markers"]["save"] == [4, 8] and doc["markers"]["first_optimizer_step"] == [1]
    ids = {f["id"] for f in doc["findings"]}
    assert {"guard.host-ram-trend", "report.rank-failed"} <= ids
    out = tmp_path / "page"
    assert main(["report", str(hf_run.out), "--out", str(out)]) == 0
    assert sorted(p.name for p in out.glob("*.png")) == ["host_nodes.png", "host_per_rank.png"]
    html = (out / "index.html").read_text()
    assert "GPU telemetry not available" in html
    dom, console = open_in_chromium(out / "index.html", tmp_path / "profile")
    assert console == [] and 'data-charts="2/2"' in dom


def test_rank_late_to_a_collective_leaves_stack_dumps_from_every_rank(ds_run, capsys):
    """Rank 1 is elsewhere (sleeping) while rank 0 waits in a barrier: both watchdogs dump, and the report
    says where each rank stood."""
    from zerodoctor.report.run_report import load_run

    report = load_run(ds_run.out)
    stacks = {s["rank"]: s["top_frames"] for s in report.stacks}
    assert set(stacks) == {0, 1}, ds_run.output[-3000:]
    assert any(f.startswith("barrier") for f in stacks[0]), stacks[0]
    assert any(f.startswith("busy_elsewhere") for f in stacks[1]), stacks[1]
    (hang,) = [f for f in report.findings if f.id == "report.hang-stacks"]
    assert hang.data["ranks_dumped"] == [0, 1]


def test_diagnose_merges_the_real_stack_dumps_into_who_waits_and_who_never_arrived(ds_run, capsys):
    """`zerodoctor diagnose RUN_DIR` on the real run: rank 0 waits in the barrier, rank 1 never arrived."""
    from zerodoctor.cli.main import main

    assert main(["diagnose", str(ds_run.out), "--format", "json"]) == 1
    findings = json.loads(capsys.readouterr().out)["findings"]
    (hang,) = [f for f in findings if f["id"] == "guard.hang"]
    assert hang["title"] == "rank(s) [0] wait in barrier for rank(s) [1]", hang
    assert hang["data"]["ranks_waiting"] == [0] and hang["data"]["ranks_elsewhere"] == [1]
    assert "rank 0 waits in barrier (torch/distributed/distributed_c10d.py:" in hang["message"]
    assert "called from run_ds (guard_job.py:" in hang["message"]
    assert "rank 1 never arrived: it was in busy_elsewhere (guard_job.py:" in hang["message"]
    # both went on after the dump (rank 1 only slept), so it is a warning after rank 1's real exception
    assert hang["severity"] == "warning" and findings[0]["severity"] == "error"


def test_hf_rank_held_up_inside_the_trainer_is_named_by_diagnose(hf_run, capsys):
    """Inside HF Trainer: rank 1 is held up after step 6 while rank 0 goes on into step 7, where ZeRO-3 gathers
    the parameters: both watchdogs dump; diagnose says rank 0 waits in a collective for rank 1."""
    from zerodoctor.cli.main import main
    from zerodoctor.report.run_report import load_run

    stacks = {s["rank"]: s["top_frames"] for s in load_run(hf_run.out).stacks}
    assert set(stacks) == {0, 1}, hf_run.output[-3000:]
    assert any(f.startswith("busy_elsewhere") for f in stacks[1]), stacks[1]
    assert main(["diagnose", str(hf_run.out), "--format", "json"]) == 1
    (hang,) = [f for f in json.loads(capsys.readouterr().out)["findings"] if f["id"] == "guard.hang"]
    assert hang["data"]["ranks_waiting"] == [0] and hang["data"]["ranks_elsewhere"] == [1], hang
    assert "rank 1 never arrived: it was in busy_elsewhere (guard_job.py:" in hang["message"]


@pytest.mark.engine
def test_real_hang_is_diagnosed_as_stuck_with_the_rank_that_never_arrived(tmp_path, capsys):
    """A launch that never ends: rank 0 waits in a barrier rank 1 never joins. Both watchdogs dump; the launch is
    killed (as a scheduler's time limit would); `diagnose` says rank 0 waits for rank 1 and that it was stuck."""
    import os
    import signal
    import subprocess
    import time

    from zerodoctor.cli.main import main
    from zerodoctor.engine.launch import kill_leftovers, launched_processes

    from .conftest import HANG_JOB, torchrun_cmd

    out = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        torchrun_cmd([str(HANG_JOB), str(out)]),
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    stacks = [out / "zerodoctor" / f"stacks-rank{r}.txt" for r in (0, 1)]
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not all(p.exists() and p.stat().st_size for p in stacks):
            time.sleep(0.5)
        time.sleep(1.0)  # the dump is complete and nothing follows it
    finally:
        ranks = launched_processes(proc.pid)  # torchrun runs each rank in a session of its own
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        kill_leftovers(ranks)
    assert main(["diagnose", str(out), "--format", "json"]) == 1
    (hang,) = [f for f in json.loads(capsys.readouterr().out)["findings"] if f["id"] == "guard.hang"]
    assert hang["severity"] == "error" and hang["data"]["ranks_stuck"] == [0, 1]
    assert hang["title"] == "rank(s) [0] wait in barrier for rank(s) [1]"
    assert "rank 1 never arrived: it was in stuck_elsewhere (hang_job.py:" in hang["message"]
    assert "the run was stuck there" in hang["message"]
    assert not any(p.is_running() and p.status() != "zombie" for p in ranks), "ranks left running after the launch"
