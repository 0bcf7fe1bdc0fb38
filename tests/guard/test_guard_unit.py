"""The guard's parts without an engine: options, probes, trend, step count, identities, hooks, watchdog."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from zerodoctor.errors import UsageError
from zerodoctor.guard.checks import check_step_count, expected_optimizer_steps
from zerodoctor.guard.devices import judge_identities
from zerodoctor.guard.monitor import Monitor
from zerodoctor.guard.options import GuardOptions
from zerodoctor.guard.probes import Cgroup, HostProbe, NotAvailable, find_cgroup, gpu_sample

MIB = 1 << 20


def test_options_from_env_and_back():
    env = {
        "ZERODOCTOR_GUARD_EVERY": "5",
        "ZERODOCTOR_GUARD_WATCHDOG": "off",
        "ZERODOCTOR_GUARD_RUN_DIR": "/x",
        "ZERODOCTOR_GUARD_HANG_FACTOR": "4.5",
    }
    o = GuardOptions.from_env(env)
    assert (o.every, o.watchdog, o.run_dir, o.hang_factor) == (5, False, Path("/x"), 4.5)
    assert GuardOptions.from_env(o.to_env()) == o
    assert GuardOptions.from_env(env, every=2).every == 2
    with pytest.raises(UsageError, match="ZERODOCTOR_GUARD_EVERY='x' is not a valid int"):
        GuardOptions.from_env({"ZERODOCTOR_GUARD_EVERY": "x"})


def _fake_cgroup(tmp_path: Path, version: int) -> tuple[Path, Path]:
    root = tmp_path / "cg"
    proc = tmp_path / "cgroup"
    if version == 2:
        job = root / "slurm" / "job_7"
        job.mkdir(parents=True)
        (job / "memory.current").write_text("1073741824\n")
        (job / "memory.max").write_text("2147483648\n")
        (job / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n")
        (job / "memory.pressure").write_text(
            "some avg10=1.50 avg60=0 avg300=0 total=1\nfull avg10=0.25 avg60=0 avg300=0 total=1\n"
        )
        proc.write_text("0::/slurm/job_7\n")
    else:
        mem = root / "memory" / "job"
        mem.mkdir(parents=True)
        (mem / "memory.usage_in_bytes").write_text("500\n")
        (mem / "memory.limit_in_bytes").write_text("9223372036854771712\n")
        proc.write_text("4:memory:/job\n0::/\n")
    return root, proc


def test_cgroup_v2_usage_limit_oom_kills_and_psi(tmp_path):
    root, proc = _fake_cgroup(tmp_path, 2)
    cg = find_cgroup(root, proc)
    assert isinstance(cg, Cgroup) and cg.version == 2
    s = HostProbe(cg).sample()
    assert s["cgroup_usage"] == 1 << 30 and s["cgroup_limit"] == 2 << 30 and s["cgroup_oom_kills"] == 1
    assert s["psi_some_avg10"] == 1.5 and s["psi_full_avg10"] == 0.25
    assert s["rss"] > 0 and s["node_total"] > 0


def test_cgroup_v1_unlimited_has_no_limit(tmp_path):
    root, proc = _fake_cgroup(tmp_path, 1)
    cg = find_cgroup(root, proc)
    assert isinstance(cg, Cgroup) and cg.version == 1
    s = HostProbe(cg).sample()
    assert s["cgroup_usage"] == 500 and "cgroup_limit" not in s


def test_no_cgroup_is_a_typed_record(tmp_path):
    (tmp_path / "cgroup").write_text("0::/\n")
    na = find_cgroup(tmp_path / "none", tmp_path / "cgroup")
    assert isinstance(na, NotAvailable) and na.what == "cgroup"


def test_gpu_sample_is_empty_without_cuda():
    assert gpu_sample() == {}


def _monitor(tmp_path, **kw) -> Monitor:
    return Monitor(GuardOptions(run_dir=tmp_path, watchdog=False, **kw), rank=0, local_rank=0, world_size=1)


def _feed(mon: Monitor, values: list[int], t0: float = 1000.0, dt: float = 10.0) -> None:
    import zerodoctor.guard.monitor as m

    for i, v in enumerate(values):
        mon.step = i + 1
        real = m.time.time
        m.time.time = lambda i=i: t0 + i * dt  # type: ignore[assignment]
        try:
            mon._trend_update({"node_used": v, "node_total": 100 << 30, "rss": v})
        finally:
            m.time.time = real  # type: ignore[assignment]


def test_trend_warns_once_with_projection(tmp_path):
    mon = _monitor(tmp_path, host_measure="node", host_limit_bytes=4 << 30)
    _feed(mon, [(1 << 30) + i * 100 * MIB for i in range(8)])
    (f,) = mon.findings
    assert f.id == "guard.host-ram-trend"
    # judged from the 5th point: 100 MiB per 10 s = 10 MiB/s; 4 GiB - 1.39 GiB = 2672 MiB left -> 267 s, step 5 + 26
    assert f.data["slope_bytes_per_step"] == pytest.approx(100 * MIB)
    assert f.data["eta_s"] == pytest.approx(267.2) and f.data["projected_step"] == 5 + 26
    assert "about 4 min" in f.message and "around step 31" in f.message and "steps 1-5" in f.message
    _feed(mon, [(2 << 30) + i * 100 * MIB for i in range(8)])
    assert len(mon.findings) == 1


def test_flat_or_far_trend_is_quiet(tmp_path):
    mon = _monitor(tmp_path, host_measure="node", host_limit_bytes=4 << 30)
    _feed(mon, [1 << 30] * 10)
    far = _monitor(tmp_path, host_measure="node", host_limit_bytes=1 << 40)
    _feed(far, [(1 << 30) + i * 100 * MIB for i in range(10)])
    assert mon.findings == [] and far.findings == []


def test_step_count_xtuner_case():
    # XTuner seed case: 50000 samples, micro 1, 16 GPUs with sequence parallel 1, accumulation 1, max_iters 32
    assert expected_optimizer_steps(50000, 1, 16, 1) == 3125
    (f,) = check_step_count(
        max_steps=32,
        samples=50000,
        micro_batch=1,
        data_parallel=16,
        grad_accum=1,
        epochs=1,
        max_steps_key="max_iters",
    )
    assert "max_iters=32" in f.message and "3125 steps = 50000 samples / (1 micro batch x 16" in f.message
    assert (
        check_step_count(
            max_steps=3125, samples=50000, micro_batch=1, data_parallel=16, grad_accum=1, epochs=1
        )
        == []
    )


def test_identities_two_ranks_one_gpu():
    ids = [
        {
            "rank": 0,
            "host": "n1",
            "local_rank": 0,
            "device": "cuda:0",
            "gpu_uuid": "GPU-a",
            "visible_devices": None,
        },
        {
            "rank": 1,
            "host": "n1",
            "local_rank": 1,
            "device": "cuda:0",
            "gpu_uuid": "GPU-a",
            "visible_devices": None,
        },
    ]
    found = {f.id for f in judge_identities(ids)}
    assert found == {"guard.ranks-share-gpu", "guard.device-not-local-rank"}
    ok = [{**ids[0]}, {**ids[1], "device": "cuda:1", "gpu_uuid": "GPU-b"}]
    assert judge_identities(ok) == []


def test_guard_errors_are_logged_once_and_swallowed(tmp_path):
    mon = _monitor(tmp_path, fault="sample")
    mon.sample()
    mon.sample()
    recs = [json.loads(x) for x in (tmp_path / "zerodoctor" / "rank0.jsonl").read_text().splitlines()]
    assert [r["where"] for r in recs if r["kind"] == "guard_error"] == ["sample"]
    assert len([r for r in recs if r["kind"] == "sample"]) == 2


HOOK_SCRIPT = textwrap.dedent("""
    import sys, threading
    from zerodoctor.guard.monitor import Monitor
    from zerodoctor.guard.options import GuardOptions
    from zerodoctor.guard.crash import install_hooks
    seen = []
    prev = lambda t, e, tb: (seen.append(e), sys.stderr.write("USER HOOK " + str(e) + "\\n"))
    sys.excepthook = prev
    mon = Monitor(GuardOptions(run_dir=sys.argv[1], watchdog=False), rank=3, local_rank=3, world_size=4)
    install_hooks(mon)
    t = threading.Thread(target=lambda: 1 / 0, name="loader"); t.start(); t.join()
    raise ValueError("Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!")
""")


def test_exception_hooks_chain_record_diagnose_and_reraise(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-c", HOOK_SCRIPT, str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 1
    assert "USER HOOK Expected all tensors" in proc.stderr  # the user's hook still runs, with the same error
    assert "ZeroDivisionError" in proc.stderr  # threading's default hook still prints
    err = json.loads((tmp_path / "zerodoctor" / "error-rank3.json").read_text())
    assert err["rank"] == 3 and err["type"] == "builtins.ValueError" and err["diagnosis"]["id"]
    assert "zerodoctor guard [rank 3" in proc.stderr
    thread = json.loads((tmp_path / "zerodoctor" / "error-rank3-thread-loader.json").read_text())
    assert thread["type"] == "builtins.ZeroDivisionError" and thread["where"] == "thread loader"


WATCHDOG_SCRIPT = textwrap.dedent("""
    import sys, time
    from zerodoctor.guard.monitor import Monitor
    from zerodoctor.guard.options import GuardOptions
    mon = Monitor(GuardOptions(run_dir=sys.argv[1], hang_first_s=0.5), rank=0, local_rank=0, world_size=1)
    mon.train_begin()
    def stuck_in_collective():
        time.sleep(2)
    stuck_in_collective()
""")


def test_watchdog_dumps_stacks_when_a_step_does_not_end(tmp_path):
    subprocess.run([sys.executable, "-c", WATCHDOG_SCRIPT, str(tmp_path)], check=True, timeout=60)
    text = (tmp_path / "zerodoctor" / "stacks-rank0.txt").read_text()
    assert "Timeout" in text and "stuck_in_collective" in text


def test_guard_import_stays_light():
    code = (
        "import sys, zerodoctor.guard, zerodoctor.plan.inputs, zerodoctor.lint.engine, zerodoctor.cli.main;"
        "print(sorted(m for m in ('torch','deepspeed','transformers','matplotlib') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_threading_hook_unchanged_without_guard():
    assert threading.excepthook is threading.__excepthook__ or callable(threading.excepthook)
