"""`ZeroDoctorCallback`: the guard as a `transformers.TrainerCallback` (LLaMA-Factory, TRL, LLaVA and
MiniCPM-V trainers are Trainer subclasses, so it works for them too).

    from zerodoctor.guard import ZeroDoctorCallback
    trainer = Trainer(..., callbacks=[ZeroDoctorCallback()])   # or ZeroDoctorCallback.attach(trainer)

`attach()` puts the callback right after the Trainer's flow callback, before the reporting integrations,
so the headline figures it adds in `on_log` reach TensorBoard / W&B / MLflow in the same log call.
"""

from __future__ import annotations

from typing import Any

from transformers import TrainerCallback

from zerodoctor.guard.adapter import SaveGuard, guarded, headline
from zerodoctor.guard.crash import install_hooks
from zerodoctor.guard.monitor import Monitor
from zerodoctor.guard.options import GuardOptions
from zerodoctor.guard.session import begin_checks, check_placement


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
        self._saves: SaveGuard | None = None

    @classmethod
    def attach(cls, trainer: Any, **options: Any) -> ZeroDoctorCallback:
        """Add a guard to an existing Trainer, right after its flow callback (see the module docstring)."""
        cb = cls(**options)
        handler = trainer.callback_handler
        handler.callbacks.insert(min(1, len(handler.callbacks)), cb)
        return cb

    # ---- train begin ---------------------------------------------------------------------------------------

    @guarded
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
        self._saves = SaveGuard(mon)
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
            seq_len=seq_len_of(args),
            framework="hf",
        )

    # ---- hot path ------------------------------------------------------------------------------------------

    @guarded
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

    @guarded
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

    @guarded
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
        assert self._saves is not None
        skip = self._saves.before(
            state.global_step, optimizer_state_saved=not args.save_only_model, can_skip_optimizer=True
        )
        if skip:  # restored in on_save, after this one checkpoint
            self._restore_save_only_model = bool(args.save_only_model)
            args.save_only_model = True
        self._saving = True

    # ---- events --------------------------------------------------------------------------------------------

    @guarded
    def on_epoch_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if self.monitor is not None:
            self.monitor.event("epoch_begin", epoch_index=int(state.epoch or 0))

    @guarded
    def on_epoch_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if self.monitor is not None:
            self.monitor.event("epoch_end")

    @guarded
    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kw: Any
    ) -> None:
        mon = self.monitor
        if mon is None or logs is None or not mon.options.log_to_trainer:
            return
        for key, value in headline(mon).items():
            logs[f"zerodoctor/{key}"] = value

    @guarded
    def on_train_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if self.monitor is not None:
            self.monitor.train_end()


SEQ_LEN_ARGS = ("max_length", "max_seq_length", "cutoff_len", "model_max_length")
"""Where a Trainer's arguments carry the sequence cap the planner's activation term needs (TRL's SFTConfig:
`max_length`, older `max_seq_length`); a plain TrainingArguments has none and the planner uses its default."""


def seq_len_of(args: Any) -> int | None:
    for name in SEQ_LEN_ARGS:
        value = getattr(args, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None
