"""The guard's mmengine hook (XTuner's runner) on a real mmengine runner: FlexibleRunner + DeepSpeedStrategy with
ZeRO-3 (offload_optimizer + offload_param) on 2 gloo ranks (see conftest.mm_run), a plain single-process Runner
with gradient accumulation, and `zerodoctor guard --` adding the hook to an unmodified mmengine program."""

from __future__ import annotations

import json
import sys

import pytest

from zerodoctor.cli.main import main

from .conftest import MM_JOB, SHORT_OF_HOST_RAM, torchrun_cmd

mmengine = pytest.importorskip("mmengine")


# ---- FlexibleRunner + DeepSpeedStrategy, 2 ranks ----------------------------------------------------------------


@pytest.mark.engine
def test_hook_from_custom_hooks_writes_telemetry_with_saves_on_both_ranks(mm_run):
    for rank in (0, 1):
        done = json.loads((mm_run.out / f"done_rank{rank}.json").read_text())
        assert done["iters"] == 8 and done["global_steps"] == 4, mm_run.output[-3000:]
        assert done["hooks"].count("ZeroDoctorHook") == 1
        steps = sorted({s["step"] for s in mm_run.kinds(rank, "sample")})
        assert steps == [0, 1, 2, 3, 4]  # optimizer steps: 8 iterations of 2-step accumulation
        events = mm_run.events(rank)
        assert events[0] == "train_begin" and "first_optimizer_step" in events and "train_end" in events
        saves = [r for r in mm_run.kinds(rank, "event") if r["event"] == "save_end"]
        assert [r["step"] for r in saves] == [2, 4]  # CheckpointHook every 4 iterations = every 2 steps
        assert all("seconds" in r and "rss_hwm_before" in r for r in saves)
        assert events.count("save_begin") == 2 and "epoch_end" in events
        assert (mm_run.out / "iter_4.pth").is_dir()  # a DeepSpeed checkpoint (with optimizer state)


@pytest.mark.engine
def test_hook_train_begin_checks_see_the_deepspeed_engine(mm_run):
    for rank in (0, 1):
        placements = mm_run.kinds(rank, "placement")
        assert [p["when"] for p in placements] == ["train_begin", "first_optimizer_step"]
        assert all(p["ok"] for p in placements)
        first = placements[1]["summary"]
        assert first["parameter partition (ds_tensor)"] == {"cpu": 21}  # offload_param: cpu
        assert set(first["optimizer state"]) == {"cpu"} and set(first["fp32 master"]) == {"cpu"}
    ids = mm_run.kinds(0, "identities")[0]["identities"]
    assert sorted(i["rank"] for i in ids) == [0, 1]
    (steps,) = [f for f in mm_run.findings(0) if f["id"] == "guard.max-steps-below-epoch"]
    # 128 samples / (2 micro batch x 2 ranks) = 32 iterations per epoch; max_iters=8 stops at a quarter
    assert "train_cfg.max_iters=8 caps training at 8 iterations, 25.0% of one epoch" in steps["message"]
    pred = mm_run.kinds(0, "prediction")[0]
    assert pred["available"], pred  # the planner got the HF config from the model's `llm`
    assert [g["phase"] for g in mm_run.kinds(0, "gap")] == ["load", "first_step", "steady", "save", "save"]
    live = json.loads((mm_run.out / "zerodoctor" / "ds_config.live.json").read_text())
    assert live["zero_optimization"]["offload_param"]["device"] == "cpu"
    assert live["gradient_accumulation_steps"] == 2


@pytest.mark.engine
def test_hook_headline_figures_reach_mmengine_logs(mm_run):
    logged = json.loads((mm_run.out / "done_rank0.json").read_text())["logged"]
    assert "train/zerodoctor/host_rss_gib" in logged and "train/zerodoctor/step_s" in logged


@pytest.mark.engine
def test_hook_exception_is_diagnosed_and_reraised(mm_run):
    assert mm_run.returncode != 0
    err = json.loads((mm_run.out / "zerodoctor" / "error-rank1.json").read_text())
    assert err["rank"] == 1 and err["step"] == 4 and err["diagnosis"]["id"]
    assert "RuntimeError: Expected all tensors" in mm_run.output  # the original reaches the original hook
    assert not (mm_run.out / "zerodoctor" / "error-rank0.json").exists()


@pytest.mark.engine
def test_hook_internal_failure_does_not_stop_training(mm_run):
    for rank in (0, 1):
        (err,) = mm_run.kinds(rank, "guard_error")
        assert err["where"] == "before_train_epoch" and "injected guard fault" in err["error"]
        assert json.loads((mm_run.out / f"done_rank{rank}.json").read_text())["global_steps"] == 4


@pytest.mark.engine
def test_guard_cli_adds_the_hook_to_an_unmodified_mmengine_runner(tmp_path):
    """`zerodoctor guard -- torchrun job` on a config that does not name the hook: the hook is on every rank,
    once; with a host limit below what each rank uses and the opt-in, saves leave out optimizer state."""
    pytest.importorskip("deepspeed")
    out = tmp_path / "run"
    rc = main(
        [
            "guard",
            "--run-dir",
            str(out),
            *SHORT_OF_HOST_RAM,
            "--",
            *torchrun_cmd([str(MM_JOB), str(out), "--no-hook"]),
        ]
    )
    assert rc == 0
    assert "ZeroDoctorHook" not in (out / "tiny_config_rank0.py").read_text()
    for rank in (0, 1):
        done = json.loads((out / f"done_rank{rank}.json").read_text())
        assert done["hooks"].count("ZeroDoctorHook") == 1
        recs = [json.loads(x) for x in (out / "zerodoctor" / f"rank{rank}.jsonl").read_text().splitlines()]
        events = [r["event"] for r in recs if r["kind"] == "event"]
        assert events.count("save_end") == 2 and events.count("save_without_optimizer") == 2, events
        assert not [r for r in recs if r["kind"] == "guard_error"]
        # one guard per rank: the strategy's deepspeed.initialize is not watched a second time
        assert sum(r["kind"] == "meta" for r in recs) == 1
    # mmengine saved the consolidated 16-bit weights as one file, not a DeepSpeed checkpoint with optimizer state
    assert (out / "iter_4.pth").is_file() and (out / "iter_8.pth").is_file()


# ---- plain Runner, one process -------------------------------------------------------------------------------


def _runner(tmp_path, **kw):
    import torch
    from mmengine.model import BaseModel
    from mmengine.runner import Runner

    class Tiny(BaseModel):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(4, 1)

        def forward(self, x, y, mode="loss"):
            return {"loss": ((self.lin(x).squeeze(-1) - y) ** 2).mean()}

    import zerodoctor.guard.mmengine_hook  # noqa: F401  registers "ZeroDoctorHook"

    data = [{"x": torch.randn(4), "y": torch.randn(())} for _ in range(16)]
    return Runner(
        model=Tiny(),
        work_dir=str(tmp_path),
        train_dataloader={
            "dataset": data,
            "batch_size": 2,
            "sampler": {"type": "DefaultSampler", "shuffle": False},
            "collate_fn": {"type": "default_collate"},
        },
        optim_wrapper={"optimizer": {"type": "SGD", "lr": 0.01}, "accumulative_counts": 2},
        train_cfg={"by_epoch": True, "max_epochs": 1},
        default_hooks={"checkpoint": {"type": "CheckpointHook", "interval": 1, "by_epoch": True}},
        log_level="WARNING",
        **kw,
    )


QUIET = {"type": "ZeroDoctorHook", "exception_hooks": False, "watchdog": False, "predict": False}


def test_plain_runner_counts_optimizer_updates_and_the_epoch_save(tmp_path):
    runner = _runner(tmp_path, custom_hooks=[QUIET])
    runner.train()
    recs = [json.loads(x) for x in (tmp_path / "zerodoctor" / "rank0.jsonl").read_text().splitlines()]
    steps = sorted({r["step"] for r in recs if r["kind"] == "sample"})
    assert steps == [0, 1, 2, 3, 4]  # 8 iterations, accumulative_counts=2
    events = [r["event"] for r in recs if r["kind"] == "event"]
    assert events.count("save_begin") == 1 and events.count("save_end") == 1 and events[-1] == "train_end"
    placements = [r for r in recs if r["kind"] == "placement"]
    assert [p["when"] for p in placements] == ["train_begin", "first_optimizer_step"]
    assert "train/zerodoctor/step_s" in runner.message_hub.log_scalars
    assert not [r for r in recs if r["kind"] == "guard_error"]


def test_guard_autoinstall_adds_the_hook_once_to_each_runner(tmp_path, monkeypatch):
    from mmengine.runner import Runner

    from zerodoctor.guard import autoinstall
    from zerodoctor.guard.mmengine_hook import ZeroDoctorHook

    monkeypatch.setattr(Runner, "__init__", Runner.__init__)  # restored after the test
    monkeypatch.setitem(autoinstall._state, "adapter_seen", False)
    autoinstall._patch_mmengine_runner(sys.modules["mmengine.runner.runner"])
    autoinstall._patch_mmengine_runner(sys.modules["mmengine.runner.runner"])  # idempotent
    plain = _runner(tmp_path / "a")
    named = _runner(tmp_path / "b", custom_hooks=[QUIET])
    for r in (plain, named):
        assert sum(isinstance(h, ZeroDoctorHook) for h in r.hooks) == 1
    assert autoinstall._state["adapter_seen"] is True
