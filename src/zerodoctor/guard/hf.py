"""`ZeroDoctorCallback`: the guard as a `transformers.TrainerCallback` (LLaMA-Factory, TRL, LLaVA and
MiniCPM-V trainers are Trainer subclasses, so it works for them too).

    from zerodoctor.guard import ZeroDoctorCallback
    trainer = Trainer(..., callbacks=[ZeroDoctorCallback()])   # or ZeroDoctorCallback.attach(trainer)

`attach()` puts the callback right after the Trainer's flow callback, before the reporting integrations,
so the headline figures it adds in `on_log` reach TensorBoard / W&B / MLflow in the same log call.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

from transformers import TrainerCallback

from zerodoctor.findings import Evidence, Finding, Fix, Severity
from zerodoctor.guard.crash import install_hooks
from zerodoctor.guard.monitor import GIB, MIB, Monitor
from zerodoctor.guard.options import GuardOptions
from zerodoctor.guard.probes import host_limit
from zerodoctor.guard.session import begin_checks, check_placement

F = TypeVar("F", bound=Callable[..., Any])


def _guarded(fn: F) -> F:
    """A callback method never raises: the guard's own errors are logged once and training goes on."""

    @functools.wraps(fn)
    def wrapper(self: ZeroDoctorCallback, *args: Any, **kwargs: Any) -> Any:
        mon = self.monitor
        try:
            if mon is not None:
                mon.fault_point(fn.__name__)
            return fn(self, *args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - never stop the run
            if mon is not None:
                mon.guard_error(fn.__name__, exc)
            elif not self._early_error:
                self._early_error = True
                import logging

                logging.getLogger("zerodoctor.guard").warning(
                    "zerodoctor guard: internal error in %s ignored: %s", fn.__name__, exc
                )
            return None

    return wrapper  # type: ignore[return-value]


def _size(n: int) -> str:
    return f"{n / GIB:.2f} GiB" if abs(n) >= GIB else f"{n / MIB:.1f} MiB"


class ZeroDoctorCallback(TrainerCallback):
    """Runtime guard for HF Trainer. Keyword arguments are `GuardOptions` fields; unset ones come from
    `ZERODOCTOR_GUARD_*` environment variables, then the defaults."""

    def __init__(self, **options: Any) -> None:
        self._overrides = options
        self.options = GuardOptions.from_env(**options)
        self.monitor: Monitor | None = None
        self._early_error = False
        self._saving = False
        self._restore_save_only_model: bool | None = None
        self._pending_save = False
        self._module: Any = None
        self._optimizer: Any = None
        self._ds_config: dict[str, Any] | None = None
        self._save_warned = False

    @classmethod
    def attach(cls, trainer: Any, **options: Any) -> ZeroDoctorCallback:
        """Add a guard to an existing Trainer, right after its flow callback (see the module docstring)."""
        cb = cls(**options)
        handler = trainer.callback_handler
        handler.callbacks.insert(min(1, len(handler.callbacks)), cb)
        return cb

    # ---- train begin ---------------------------------------------------------------------------------------

    @_guarded
    def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        from pathlib import Path

        opts = self.options
        if opts.run_dir is None and getattr(args, "output_dir", None):
            from dataclasses import replace

            opts = self.options = replace(opts, run_dir=Path(args.output_dir))
        self.monitor = mon = Monitor(
            opts,
            rank=getattr(args, "process_index", None),
            local_rank=getattr(args, "local_process_index", None),
            world_size=getattr(args, "world_size", None),
        )
        if opts.exception_hooks:
            install_hooks(mon)
        model = kw.get("model")
        optimizer = kw.get("optimizer")
        optimizer = getattr(optimizer, "optimizer", optimizer)  # accelerate's wrapper -> DeepSpeed's
        hf_ds = getattr(args, "hf_deepspeed_config", None)
        ds_config = getattr(hf_ds, "config", None)
        self._module, self._optimizer = model, optimizer
        self._ds_config = dict(ds_config) if isinstance(ds_config, dict) else None
        dl = kw.get("train_dataloader")
        samples = None
        try:
            samples = len(dl.dataset) if dl is not None else None
        except TypeError:  # an iterable dataset
            samples = None
        mon.train_begin(max_steps=state.max_steps, epochs=args.num_train_epochs, samples=samples)
        begin_checks(
            mon,
            module=model,
            optimizer=optimizer,
            ds_config=self._ds_config,
            micro_batch=args.per_device_train_batch_size,
            grad_accum=args.gradient_accumulation_steps,
            samples=samples,
            max_steps=args.max_steps if args.max_steps and args.max_steps > 0 else None,
            epochs=args.num_train_epochs,
            framework="hf",
        )

    # ---- hot path ------------------------------------------------------------------------------------------

    @_guarded
    def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        mon = self.monitor
        if mon is None:
            return
        first = mon.optimizer_steps == 0
        mon.step_end(state.global_step, epoch=state.epoch)
        if first and mon.options.check_devices:  # the lazily created optimizer states exist now
            check_placement(mon, self._module, self._optimizer, self._ds_config, when="first_optimizer_step")
        if control.should_evaluate:
            mon.phase_begin("evaluation")
            self._pending_save = bool(control.should_save)
        elif control.should_save:
            self._before_save(args, state)

    @_guarded
    def on_evaluate(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        mon = self.monitor
        if mon is None:
            return
        metrics = kw.get("metrics") or {}
        mon.phase_end(
            "evaluation",
            metrics={
                k: v
                for k, v in metrics.items()
                if isinstance(v, int | float) and not k.startswith("zerodoctor/")
            },
        )
        if self._pending_save:
            self._pending_save = False
            self._before_save(args, state)

    @_guarded
    def on_save(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        mon = self.monitor
        if mon is None:
            return
        if not self._saving:  # a save the flow did not announce (e.g. the final save)
            mon.save_begin(state.global_step)
        self._saving = False
        mon.save_end(state.global_step)
        if self._restore_save_only_model is not None:
            args.save_only_model = self._restore_save_only_model
            self._restore_save_only_model = None

    def _before_save(self, args: Any, state: Any) -> None:
        mon = self.monitor
        assert mon is not None
        spike = self._predicted_save_spike()
        if mon.options.save_headroom and spike:
            self._headroom(args, spike)
        self._saving = True
        mon.save_begin(state.global_step, predicted_spike=spike)

    def _predicted_save_spike(self) -> dict[str, int] | None:
        """The save's extra memory: the planner's save phase minus steady, else the largest save seen."""
        mon = self.monitor
        assert mon is not None
        pred = mon.prediction or {}
        spike: dict[str, int] = {}
        if pred.get("available"):
            s = pred.get("save_spike") or {}
            if s.get("host_bytes_per_node") is not None:
                spike["host"] = max(int(s["host_bytes_per_node"]), 0)
            if pred.get("gpu_is_real") and s.get("gpu_bytes") is not None:
                spike["gpu"] = max(int(s["gpu_bytes"]), 0)
        for past in mon.save_peaks:
            d = past.get("cgroup_usage_delta", past.get("node_used_delta"))
            if d is not None:
                spike["host"] = max(spike.get("host", 0), int(d))
        return spike or None

    def _headroom(self, args: Any, spike: dict[str, int]) -> None:
        mon = self.monitor
        assert mon is not None
        s = mon.last_sample
        short: list[str] = []
        if "gpu" in spike and "gpu_free" in s:
            free_gpu = int(s["gpu_free"]) + int(s.get("gpu_reserved", 0)) - int(s.get("gpu_allocated", 0))
            if spike["gpu"] > free_gpu:
                short.append(
                    f"GPU: needs {_size(spike['gpu'])} more, {_size(free_gpu)} free on rank {mon.rank}"
                )
        measure = mon.host_measure(s) if "node_used" in s else None
        if "host" in spike and measure is not None:
            used, limit, what = measure
            if spike["host"] > limit - used:
                short.append(
                    f"host ({what}): needs {_size(spike['host'])} more, {_size(limit - used)} free "
                    f"({_size(used)} used of {_size(limit)})"
                )
        if not short:
            return
        skip_opt = mon.options.save_without_optimizer and not args.save_only_model
        if skip_opt:
            self._restore_save_only_model = bool(args.save_only_model)
            args.save_only_model = True
        if skip_opt:
            mon.event("save_without_optimizer", reason="; ".join(short))
        if self._save_warned:
            return
        self._save_warned = True
        mon.add_finding(
            Finding(
                id="guard.save-headroom",
                severity=Severity.WARNING,
                title="the next checkpoint save may not fit in memory",
                message=f"before the save at step {mon.step}: "
                + "; ".join(short)
                + (
                    " -- saving this checkpoint without optimizer state (save_without_optimizer is on)"
                    if skip_opt
                    else ""
                ),
                fixes=(
                    Fix(
                        "set save_only_model: true (no optimizer state in checkpoints; resuming then restarts the "
                        "optimizer), or pass save_without_optimizer=True to the guard to do it only when needed"
                    ),
                    Fix(
                        "with ZeRO-3, set stage3_gather_16bit_weights_on_model_save: false and consolidate offline "
                        "with zero_to_fp32.py"
                    ),
                ),
                evidence=(Evidence(key="save", text=f"step {mon.step}, predicted spike {spike}"),),
                references=("hiyouga/LlamaFactory#7532", "deepspeedai/DeepSpeed#6598"),
                data={"spike": spike, "short": short, "saved_without_optimizer": skip_opt, "mib": MIB},
            )
        )

    # ---- events --------------------------------------------------------------------------------------------

    @_guarded
    def on_epoch_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if self.monitor is not None:
            self.monitor.event("epoch_begin", epoch_index=int(state.epoch or 0))

    @_guarded
    def on_epoch_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if self.monitor is not None:
            self.monitor.event("epoch_end")

    @_guarded
    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kw: Any
    ) -> None:
        mon = self.monitor
        if mon is None or logs is None or not mon.options.log_to_trainer:
            return
        s = mon.last_sample
        if "gpu_allocated_peak" in s:
            logs["zerodoctor/gpu_peak_allocated_gib"] = round(s["gpu_allocated_peak"] / GIB, 3)
            logs["zerodoctor/gpu_reserved_gib"] = round(s["gpu_reserved"] / GIB, 3)
            logs["zerodoctor/gpu_alloc_retries"] = s["gpu_alloc_retries"]
        if "rss" in s:
            logs["zerodoctor/host_rss_gib"] = round(s["rss"] / GIB, 3)
            used, limit, _w = host_limit(s)
            logs["zerodoctor/host_used_of_limit"] = round(used / limit, 4) if limit else None
        if mon.step_times:
            logs["zerodoctor/step_s"] = round(mon.step_times[-1], 4)

    @_guarded
    def on_train_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if self.monitor is not None:
            self.monitor.train_end()
