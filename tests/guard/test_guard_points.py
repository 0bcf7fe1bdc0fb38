"""The guard's judgements and hot-path promises, point by point, without an engine: what the hot path may touch,
prediction against measurement per phase, the learned hang timeouts, the host-RAM trend outside spike phases,
the live config through lint, and the flight recorder `zerodoctor guard` arms. The real-engine runs are in
test_guard_engine.py, test_guard_cli.py and test_guard_mmengine.py."""

from __future__ import annotations

import gc
import json
import sys
import types
from pathlib import Path

import pytest

from zerodoctor.cli.main import main
from zerodoctor.guard.adapter import headline
from zerodoctor.guard.monitor import Monitor
from zerodoctor.guard.options import GuardOptions
from zerodoctor.guard.session import begin_checks

GIB = 1 << 30
MIB = 1 << 20


def _records(run_dir: Path, rank: int = 0) -> list[dict]:
    path = run_dir / "zerodoctor" / f"rank{rank}.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _kinds(run_dir: Path, kind: str) -> list[dict]:
    return [r for r in _records(run_dir) if r["kind"] == kind]


def _monitor(tmp_path: Path, **kw) -> Monitor:
    return Monitor(GuardOptions(run_dir=tmp_path, watchdog=False, **kw), rank=0, local_rank=0, world_size=2)


# ---- the hot path ----------------------------------------------------------------------------------------------


class _Forbidden(AssertionError):
    pass


def _forbid(name: str):
    def call(*a, **k):
        raise _Forbidden(f"the guard called {name} on the hot path")

    return call


def _fake_torch_with_cuda() -> types.ModuleType:
    """A CUDA device as torch.cuda shows it to the probes (no GPU is lent to CI): counters answer, and every
    call that synchronizes, resets peaks or frees the cache fails the test."""
    stats = {
        "allocated_bytes.all.current": 30 * GIB,
        "allocated_bytes.all.peak": 33 * GIB,
        "active_bytes.all.current": 29 * GIB,
        "active_bytes.all.peak": 32 * GIB,
        "reserved_bytes.all.current": 36 * GIB,
        "reserved_bytes.all.peak": 38 * GIB,
        "num_alloc_retries": 2,
        "num_ooms": 0,
    }
    cuda = types.SimpleNamespace(
        is_available=lambda: True,
        is_initialized=lambda: True,
        memory_stats=lambda *a, **k: dict(stats),
        mem_get_info=lambda *a, **k: (40 * GIB, 80 * GIB),
        host_memory_stats=lambda: {"allocated_bytes.current": 3 * GIB},
        current_device=lambda: 0,
        get_device_properties=lambda i: types.SimpleNamespace(
            name="NVIDIA H100 80GB HBM3", uuid="GPU-5e1f", total_memory=80 * GIB
        ),
        synchronize=_forbid("torch.cuda.synchronize"),
        reset_peak_memory_stats=_forbid("torch.cuda.reset_peak_memory_stats"),
        reset_max_memory_allocated=_forbid("torch.cuda.reset_max_memory_allocated"),
        empty_cache=_forbid("torch.cuda.empty_cache"),
        memory_summary=_forbid("torch.cuda.memory_summary"),
    )
    torch = types.ModuleType("torch")
    torch.__version__ = "9.9.9"  # type: ignore[attr-defined]
    torch.cuda = cuda  # type: ignore[attr-defined]
    return torch


def test_hot_path_reads_counters_only_no_sync_gc_peak_reset_or_collective(tmp_path, monkeypatch):
    import torch.distributed as dist

    for name in ("all_reduce", "all_gather", "all_gather_object", "broadcast", "barrier", "reduce_scatter"):
        monkeypatch.setattr(dist, name, _forbid(f"torch.distributed.{name}"))
    monkeypatch.setattr(gc, "collect", _forbid("gc.collect"))
    monkeypatch.setitem(sys.modules, "torch", _fake_torch_with_cuda())
    mon = _monitor(tmp_path)
    mon.train_begin(max_steps=10)
    for step in range(1, 6):
        mon.step_end(step, epoch=step / 10)
    mon.save_begin(5)
    mon.save_end(5)
    mon.phase_begin("evaluation")
    mon.phase_end("evaluation")
    mon.train_end()
    assert _kinds(tmp_path, "guard_error") == []  # the guard swallows its own errors: none may have happened
    samples = _kinds(tmp_path, "sample")
    assert [s["step"] for s in samples] == [0, 1, 2, 3, 4, 5, 5, 5, 5]
    s = samples[-1]
    assert (s["gpu_allocated"], s["gpu_allocated_peak"]) == (30 * GIB, 33 * GIB)
    assert (s["gpu_active"], s["gpu_active_peak"]) == (29 * GIB, 32 * GIB)
    assert (s["gpu_reserved"], s["gpu_reserved_peak"]) == (36 * GIB, 38 * GIB)
    assert (s["gpu_alloc_retries"], s["gpu_ooms"]) == (2, 0)
    assert s["gpu_non_pytorch"] == 80 * GIB - 40 * GIB - 36 * GIB  # total - free - reserved: context, NCCL
    assert s["pinned_host"] == 3 * GIB
    assert {"rss", "rss_hwm", "node_used", "node_total", "shm_total"} <= set(s)
    assert s["optimizer_step"] == 5 and s["epoch"] == 0.5
    logged = headline(mon)  # what the Trainer's / mmengine's log receives
    assert logged["gpu_peak_allocated_gib"] == 33.0 and logged["gpu_alloc_retries"] == 2


def test_identity_and_oom_summary_read_the_device_without_touching_it(tmp_path, monkeypatch):
    from zerodoctor.guard.devices import rank_identity
    from zerodoctor.guard.probes import oom_summary

    monkeypatch.setitem(sys.modules, "torch", _fake_torch_with_cuda())
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    ident = rank_identity(local_rank=0)  # what the one gather at train begin carries
    assert ident["device"] == "cuda:0" and ident["gpu_uuid"] == "GPU-5e1f" and ident["gpu_total"] == 80 * GIB
    assert ident["visible_devices"] == "0,1,2,3" and ident["local_rank"] == 0 and ident["host"]
    summary = oom_summary()  # written into error-rank{R}.json on a CUDA OOM
    assert summary["fragmentation"] == 6 * GIB and summary["gpu_alloc_retries"] == 2


def test_placement_is_judged_against_the_offload_settings():
    """Where the optimizer states and parameters are, against offload_optimizer / offload_param: the same
    CPU tensors are right with offload to cpu and wrong when the config keeps them on the GPU."""
    import torch

    from zerodoctor.guard import check_tensors_device
    from zerodoctor.guard.devices import placement

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    model.register_buffer("table", torch.zeros(3))
    opt = torch.optim.AdamW(model.parameters())
    model(torch.ones(2, 4)).sum().backward()
    opt.step()  # Adam's exp_avg / exp_avg_sq exist now, on the CPU
    offload = {"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}}}
    on_gpu = {"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "none"}}}
    assert check_tensors_device(model, optimizer=opt, config=offload, device="cpu") == []
    (f,) = check_tensors_device(model, optimizer=opt, config=on_gpu, device="cuda:0")
    assert f.id == "guard.tensor-wrong-device" and f.severity.label == "error"
    assert f.data["counts"] == {"parameter": 4, "buffer": 1, "optimizer state": 8}
    assert "offload_param.device=none, offload_optimizer.device=none" in f.message
    assert "0.weight is on cpu, expected cuda:0" in f.message and "(and 8 more)" in f.message
    # a ZeRO-3 partition is judged by its ds_tensor (offload_param), not by the empty param.data
    p = model[0].weight
    p.ds_tensor = p.data.clone()  # type: ignore[attr-defined]
    p.data = torch.empty(0)
    cfg = {"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}}}
    rows = {r[1]: r for r in placement(model, config=cfg, device="cuda:0")}
    assert rows["0.weight"] == ("parameter partition (ds_tensor)", "0.weight", "cpu", "cpu")


def test_meta_says_what_cannot_be_measured_and_whether_the_flight_recorder_exists(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", _fake_torch_with_cuda())
    _monitor(tmp_path).close()
    meta = _kinds(tmp_path, "meta")[0]
    assert meta["flight_recorder"] == {
        "available": False,
        "reason": "torch 9.9.9 has no collective flight recorder",
    }


def test_flight_recorder_dump_never_raises_nor_leaves_a_thread_error(tmp_path, monkeypatch):
    import threading

    import zerodoctor.guard.probes as probes
    from zerodoctor.guard.crash import dump_flight_recorder

    target = tmp_path / "flight-recorder-rank0.json"
    assert dump_flight_recorder(target) is None  # no process group in this process
    fake_dist = types.SimpleNamespace(is_available=lambda: True, is_initialized=lambda: True)
    monkeypatch.setitem(sys.modules, "torch.distributed", fake_dist)
    seen: list = []
    monkeypatch.setattr(threading, "excepthook", seen.append)

    def broken():
        raise RuntimeError("communicator aborted")

    monkeypatch.setattr(probes, "flight_recorder", lambda: (broken, {"available": True}))
    assert dump_flight_recorder(target) is None and seen == [] and not target.exists()
    monkeypatch.setattr(probes, "flight_recorder", lambda: (lambda: b'{"entries": []}', {"available": True}))
    assert dump_flight_recorder(target) == "flight-recorder-rank0.json"
    assert json.loads(target.read_text()) == {"entries": []}


# ---- prediction against measurement ----------------------------------------------------------------------------


PREDICTION = {
    "available": True,
    "strategy": "ZeRO-3 + offload",
    "gpu_is_real": True,
    "ranks_per_node": 2,
    "phases": {
        "load": {"gpu_bytes": 20 * GIB, "host_bytes_per_node": 8 * GIB},
        "first_step": {"gpu_bytes": 30 * GIB, "host_bytes_per_node": 4 * GIB},
        "steady": {"gpu_bytes": 30 * GIB, "host_bytes_per_node": 4 * GIB},
        "save": {"gpu_bytes": 40 * GIB, "host_bytes_per_node": 6 * GIB},
    },
    "save_spike": {"gpu_bytes": 10 * GIB, "host_bytes_per_node": 2 * GIB},
}


def _sample(gpu_peak: int, rss_peak: int) -> dict:
    return {
        "gpu_allocated_peak": gpu_peak,
        "gpu_reserved_peak": gpu_peak,
        "rss": rss_peak - 100 * MIB,
        "rss_hwm": rss_peak,
        "node_used": 10 * GIB,
        "node_total": 64 * GIB,
        "cgroup_usage": 9 * GIB,
        "cgroup_limit": 32 * GIB,
    }


def test_each_phase_is_held_against_the_plan_and_warns_once_when_above(tmp_path):
    mon = _monitor(tmp_path)
    mon.last_sample = _sample(19 * GIB, 3 * GIB)  # the train-begin sample: after load
    mon.set_prediction(PREDICTION)
    mon.step = 1
    mon.compare_prediction("first_step", _sample(36 * GIB, 3 * GIB))  # GPU 36 > 30 x 1.1 + 0.25
    mon.compare_prediction("first_step", _sample(37 * GIB, 3 * GIB))  # again: recorded, not warned twice
    mon.step = 2
    mon.compare_prediction("steady", _sample(31 * GIB, 1.5 * GIB))  # within 10 %: quiet
    gaps = _kinds(tmp_path, "gap")
    assert [g["phase"] for g in gaps] == ["load", "first_step", "first_step", "steady"]
    load = gaps[0]
    assert load["predicted_gpu"] == 20 * GIB and load["measured_gpu"] == 19 * GIB
    assert load["predicted_host_node"] == 8 * GIB and load["predicted_host_rank_share"] == 4 * GIB
    assert load["measured_rss_peak"] == 3 * GIB
    assert load["measured_host_node"] == 9 * GIB and load["host_measure"] == "cgroup"
    first = gaps[1]
    # 2 GiB per rank predicted (4 GiB per node, 2 ranks); 3 GiB measured: above 2 x 1.1 + 0.25
    assert first["predicted_host_rank_share"] == 2 * GIB and first["measured_rss_peak"] == 3 * GIB
    warned = [(f.id, f.data["phase"]) for f in mon.findings]
    assert warned == [
        ("guard.gpu-above-prediction", "first_step"),
        ("guard.host-above-prediction", "first_step"),
    ]
    gpu, host = mon.findings
    assert "rank 0 reserved 36.00 GiB at its peak up to the first step phase" in gpu.message
    assert "predicted 30.00 GiB per GPU" in gpu.message
    assert (
        "RSS reached 3.00 GiB" in host.message and "4.00 GiB per node for 2 rank(s) per node" in host.message
    )


def test_a_save_is_held_against_the_save_phase(tmp_path, monkeypatch):
    mon = _monitor(tmp_path)
    mon.set_prediction(PREDICTION)
    values = iter([_sample(30 * GIB, 1 * GIB), _sample(46 * GIB, 1 * GIB)])
    monkeypatch.setattr(mon.host_probe, "sample", lambda: next(values))
    mon.save_begin(4)
    out = mon.save_end(4)
    assert out is not None and out["gpu_allocated_peak"] == 46 * GIB  # the save set a new peak
    (gap,) = _kinds(tmp_path, "gap")
    assert gap["phase"] == "save" and gap["predicted_gpu"] == 40 * GIB and gap["measured_gpu"] == 46 * GIB
    assert [f.id for f in mon.findings] == ["guard.gpu-above-prediction"]


def test_no_prediction_no_gap(tmp_path):
    mon = _monitor(tmp_path)
    mon.set_prediction({"available": False, "reason": "no DeepSpeed config (not a ZeRO run)"})
    mon.compare_prediction("steady", _sample(99 * GIB, 9 * GIB))
    assert _kinds(tmp_path, "gap") == [] and mon.findings == []


def test_the_trainers_sequence_cap_reaches_the_planner():
    from zerodoctor.guard.hf import seq_len_of

    assert seq_len_of(types.SimpleNamespace(max_length=4096, max_seq_length=512)) == 4096  # TRL's SFTConfig
    assert seq_len_of(types.SimpleNamespace(max_seq_length=1024)) == 1024  # older TRL
    assert seq_len_of(types.SimpleNamespace(max_length=None, model_max_length=True)) is None
    assert seq_len_of(types.SimpleNamespace()) is None  # a plain TrainingArguments: the planner's default


# ---- hang watchdog timeouts -----------------------------------------------------------------------------------


def test_hang_timeout_is_learned_from_the_longest_step_and_looser_first_and_around_saves(
    tmp_path, monkeypatch
):
    import zerodoctor.guard.monitor as m

    clock = iter([0.0, 50.0, 51.0, 53.0, 53.5])  # train begin; steps end at 50 (first), 51, 53, 53.5
    monkeypatch.setattr(m.time, "perf_counter", lambda: next(clock))
    armed: list[float] = []
    mon = Monitor(
        GuardOptions(run_dir=tmp_path, hang_factor=10, hang_min_s=5, hang_first_s=900), rank=0, world_size=1
    )
    monkeypatch.setattr(mon, "arm_watchdog", armed.append)
    mon.train_begin()
    assert armed[-1] == 900  # before the first optimizer step: model load, first Adam allocation
    mon.step_end(1)
    assert mon.longest_step_s == 0.0 and armed[-1] == 5  # the first step (50 s) does not teach the timeout
    mon.step_end(2)
    mon.step_end(3)
    mon.step_end(4)
    assert mon.longest_step_s == 2.0 and armed[-1] == 20.0  # 10 x the longest step (2 s)
    assert mon._hang_timeout(looser=True) == 60.0  # saves and evaluations: 3 x
    mon.close()


# ---- host RAM trend -------------------------------------------------------------------------------------------


def test_host_trend_leaves_out_the_first_step_spike(tmp_path, monkeypatch):
    """The first optimizer step allocates the Adam states (a jump); steady steps after it are flat: no warning.
    Had the first step's sample been in the fit, 2 GiB of growth would have been projected to the limit."""
    values = iter([1 * GIB, 1 * GIB] + [3 * GIB + i * MIB for i in range(8)])
    mon = _monitor(tmp_path, host_measure="node", host_limit_bytes=4 * GIB)
    monkeypatch.setattr(
        mon.host_probe, "sample", lambda: {"node_used": next(values), "node_total": 64 * GIB, "rss": GIB}
    )
    mon.train_begin()  # 1 GiB
    for step in range(1, 10):  # the first step's sample: 1 GiB taken before the states landed ... then 3 GiB
        mon.step_end(step)
    assert [s["phase"] for s in _kinds(tmp_path, "sample")][:2] == [
        "first_optimizer_step",
        "first_optimizer_step",
    ]
    assert [f.id for f in mon.findings] == []


def test_host_trend_already_over_the_limit_says_so(tmp_path):
    mon = _monitor(tmp_path, host_measure="rss", host_limit_bytes=256 * MIB)
    for i in range(6):
        mon.step = i + 2
        mon._trend_update({"rss": 600 * MIB + i * 48 * MIB, "node_used": GIB, "node_total": 64 * GIB})
    (f,) = mon.findings
    assert f.id == "guard.host-ram-trend" and f.data["eta_s"] == 0.0
    assert "already over the 0.25 GiB limit" in f.message


# ---- the live DeepSpeed config through lint ------------------------------------------------------------------


def test_live_config_is_judged_by_the_lint_rules(tmp_path):
    mon = _monitor(tmp_path, check_devices=False, predict=False)
    live = {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 1,
        "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}},
        "steps_per_print": float("inf"),
    }
    begin_checks(mon, module=None, optimizer=None, ds_config=live, framework="hf")
    ids = [f.id for f in mon.findings]
    assert "DS007" in ids  # ZeRO-3 without stage3_gather_16bit_weights_on_model_save: sharded checkpoints
    written = json.loads((tmp_path / "zerodoctor" / "ds_config.live.json").read_text())
    assert written["zero_optimization"]["stage"] == 3 and "steps_per_print" not in written


# ---- `zerodoctor guard`: options and the flight recorder reach every process -----------------------------------


ENV_PRINTER = (
    "import json, os; print('ENV=' + json.dumps({k: v for k, v in os.environ.items() "
    "if k.startswith(('TORCH_NCCL_', 'TORCH_FR_', 'ZERODOCTOR_GUARD_'))}))"
)


def _child_env(capfd) -> dict[str, str]:
    out = capfd.readouterr().out
    (line,) = [x for x in out.splitlines() if x.startswith("ENV=")]
    return json.loads(line[4:])


def test_guard_arms_the_flight_recorder_into_the_run_dir_and_passes_options(tmp_path, monkeypatch, capfd):
    for var in (
        "TORCH_NCCL_TRACE_BUFFER_SIZE",
        "TORCH_NCCL_DUMP_ON_TIMEOUT",
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE",
    ):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("ZERODOCTOR_GUARD_HANG_MIN_S", "30")
    argv = [
        "guard",
        "--run-dir",
        str(tmp_path),
        "--every",
        "5",
        "--hang-factor",
        "4",
        "--save-without-optimizer",
    ]
    assert main([*argv, "--", sys.executable, "-c", ENV_PRINTER]) == 0
    env = _child_env(capfd)
    assert env["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "2000" and env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    assert env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == str(
        tmp_path.resolve() / "zerodoctor" / "nccl_trace_rank_"
    )
    assert env["ZERODOCTOR_GUARD_ENABLE"] == "1" and env["ZERODOCTOR_GUARD_EVERY"] == "5"
    assert env["ZERODOCTOR_GUARD_HANG_FACTOR"] == "4.0" and env["ZERODOCTOR_GUARD_HANG_MIN_S"] == "30.0"
    assert env["ZERODOCTOR_GUARD_SAVE_WITHOUT_OPTIMIZER"] == "1"
    assert env["ZERODOCTOR_GUARD_RUN_DIR"] == str(tmp_path.resolve())


def test_guard_keeps_the_users_flight_recorder_settings_or_leaves_it_off(tmp_path, monkeypatch, capfd):
    monkeypatch.setenv("TORCH_NCCL_TRACE_BUFFER_SIZE", "50")
    monkeypatch.delenv("TORCH_NCCL_DEBUG_INFO_TEMP_FILE", raising=False)
    assert main(["guard", "--run-dir", str(tmp_path), "--", sys.executable, "-c", ENV_PRINTER]) == 0
    assert _child_env(capfd)["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "50"
    monkeypatch.delenv("TORCH_NCCL_TRACE_BUFFER_SIZE")
    argv = ["guard", "--run-dir", str(tmp_path), "--no-flight-recorder", "--"]
    assert main([*argv, sys.executable, "-c", ENV_PRINTER]) == 0
    assert not [k for k in _child_env(capfd) if k.startswith(("TORCH_NCCL_", "TORCH_FR_"))]


@pytest.mark.parametrize(
    ("bad", "says"),
    [
        (["--every", "0", "--", "true"], "argument --every: expected a number above 0, got 0"),
        (["--", ""], "no command to run"),
        (["--", "."], ".: cannot run: Permission denied"),
    ],
)
def test_guard_bad_arguments_are_one_line_errors(tmp_path, bad, says, capsys):
    assert main(["guard", "--run-dir", str(tmp_path), *bad]) == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err
