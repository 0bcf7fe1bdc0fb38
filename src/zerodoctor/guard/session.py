"""What every adapter does at train begin, once: device consistency across ranks, where ZeRO placed the
tensors, the step count, the live DeepSpeed config through the lint rules, and the planner's prediction.
Each check is independent and guarded: one that fails is logged once and the others still run."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from zerodoctor.guard.monitor import Monitor
from zerodoctor.guard.probes import gpu_identity, host_limit


def ds_config_of(engine: Any) -> dict[str, Any] | None:
    """The engine's final config as DeepSpeed parsed it (after HF/accelerate filled "auto")."""
    cfg = getattr(getattr(engine, "_config", None), "_param_dict", None)
    if isinstance(cfg, Mapping):
        return dict(cfg)
    cfg = getattr(engine, "config", None)
    return dict(cfg) if isinstance(cfg, Mapping) else None


def check_placement(
    monitor: Monitor, module: Any, optimizer: Any, ds_config: Mapping[str, Any] | None, *, when: str
) -> None:
    with monitor.safe(f"placement:{when}"):
        from zerodoctor.guard.devices import check_tensors_device, placement

        findings = check_tensors_device(module, optimizer=optimizer, config=ds_config)
        rows = placement(module, optimizer=optimizer, config=ds_config)
        summary: dict[str, dict[str, int]] = {}
        for what, _n, actual, _e in rows:
            summary.setdefault(what, {}).setdefault(actual, 0)
            summary[what][actual] += 1
        monitor.write("placement", when=when, step=monitor.step, summary=summary, ok=not findings)
        for f in findings:
            monitor.add_finding(f)


def begin_checks(
    monitor: Monitor,
    *,
    module: Any,
    optimizer: Any,
    ds_config: Mapping[str, Any] | None,
    micro_batch: int | None = None,
    grad_accum: int | None = None,
    samples: int | None = None,
    max_steps: int | None = None,
    epochs: float | None = None,
    max_steps_key: str = "max_steps",
    step_unit: str = "optimizer steps",
    seq_len: int | None = None,
    framework: str = "deepspeed",
    model_config: Mapping[str, Any] | None = None,
) -> None:
    """`model_config`: the model's config as a dict for the planner (default: `module.config.to_dict()`; an
    mmengine model holds its HF model in an attribute, e.g. XTuner's `llm`)."""
    opts = monitor.options
    if opts.check_devices:
        with monitor.safe("identities"):
            from zerodoctor.guard.devices import gather_identities, judge_identities

            ids = gather_identities(monitor.local_rank)
            if monitor.rank == 0:
                monitor.write("identities", identities=ids)
            for f in judge_identities(ids):
                if monitor.rank == 0:
                    monitor.add_finding(f)
        check_placement(monitor, module, optimizer, ds_config, when="train_begin")
    cfg = ds_config or {}
    micro = micro_batch or _int(cfg.get("train_micro_batch_size_per_gpu")) or 1
    accum = grad_accum or _int(cfg.get("gradient_accumulation_steps")) or 1
    with monitor.safe("step_count"):
        from zerodoctor.guard.checks import check_step_count

        for f in check_step_count(
            max_steps=max_steps,
            samples=samples,
            micro_batch=micro,
            data_parallel=monitor.world_size,
            grad_accum=accum,
            epochs=epochs,
            max_steps_key=max_steps_key,
            unit=step_unit,
        ):
            if monitor.rank == 0:
                monitor.add_finding(f)
    if opts.lint_config and ds_config and monitor.rank == 0:
        with monitor.safe("lint"):
            from zerodoctor.guard.checks import lint_live_config

            for f in lint_live_config(
                ds_config, monitor.dir, world_size=monitor.world_size, framework=framework
            ):
                monitor.add_finding(f, announce=False)
    if opts.predict:
        with monitor.safe("predict"):
            from zerodoctor.guard.prediction import predict_for_run

            ident = gpu_identity()
            sample = monitor.last_sample or monitor.host_probe.sample()
            _used, limit, _what = host_limit(sample)
            if model_config is None:
                to_dict = getattr(getattr(module, "config", None), "to_dict", None)
                model_config = to_dict() if callable(to_dict) else None
            monitor.set_prediction(
                predict_for_run(
                    guard_dir=monitor.dir,
                    model_config=dict(model_config) if model_config is not None else None,
                    ds_config=ds_config,
                    world_size=monitor.world_size,
                    gpus_per_node=_int(os.environ.get("LOCAL_WORLD_SIZE")) or monitor.world_size,
                    gpu_memory_bytes=ident.get("gpu_total"),
                    host_ram_bytes=limit,
                    seq_len=seq_len,
                    samples=samples,
                )
            )


def _int(v: Any) -> int | None:
    try:
        return int(v) if v is not None and str(v) != "auto" else None
    except (TypeError, ValueError):
        return None
