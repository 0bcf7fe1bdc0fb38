"""`ZeroDoctorHook`: the guard as an mmengine `Hook`, for XTuner (whose runner is mmengine's, a
`FlexibleRunner` with a `DeepSpeedStrategy` under `xtuner train --deepspeed`) and any mmengine training.

Importing this module registers the hook in mmengine's HOOKS registry, so a config can name it:

    # a plain mmengine config
    custom_imports = dict(imports=["zerodoctor.guard.mmengine_hook"], allow_failed_imports=False)
    custom_hooks = [dict(type="ZeroDoctorHook")]

    # an XTuner config (it imports the classes it names)
    from zerodoctor.guard.mmengine_hook import ZeroDoctorHook
    custom_hooks = [..., dict(type=ZeroDoctorHook, save_without_optimizer=True)]

or, without editing the config, `zerodoctor guard -- xtuner train CONFIG --deepspeed ...` adds it to every
runner the program creates. Keyword arguments are `GuardOptions` fields; unset ones come from
`ZERODOCTOR_GUARD_*` environment variables, then the defaults.

What it records is what the HF callback records (see `Monitor`): the step of a record is the optimizer step
(the DeepSpeed engine's `global_steps`; without DeepSpeed, the optim wrapper's updates), so with
`accumulative_counts` N an iteration-numbered event such as the first optimizer step lands at iteration N.
A checkpoint save is seen by wrapping this runner's `save_checkpoint` (the FlexibleRunner never calls
`before_save_checkpoint` with DeepSpeed, and no runner has an after-save hook); the opt-in
`save_without_optimizer` passes `save_optimizer=False` to that one save. The headline figures go to the
runner's message hub as `train/zerodoctor/*` scalars, so LoggerHook prints them and the visualizer backends
(TensorBoard, W&B, MLflow) receive them.
"""

from __future__ import annotations

import functools
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from mmengine.hooks import Hook  # type: ignore[import-untyped]
from mmengine.registry import HOOKS  # type: ignore[import-untyped]

from zerodoctor.guard.adapter import SaveGuard, guarded, headline
from zerodoctor.guard.crash import install_hooks
from zerodoctor.guard.monitor import Monitor
from zerodoctor.guard.options import GuardOptions
from zerodoctor.guard.session import begin_checks, check_placement, ds_config_of

HF_MODEL_ATTRS = ("llm", "model", "language_model")
"""Where an mmengine model keeps its HF model (XTuner's SupervisedFinetune and LLaVAModel: `llm`)."""


class ZeroDoctorHook(Hook):  # type: ignore[misc]
    """Runtime guard for mmengine runners (see the module docstring)."""

    priority = "NORMAL"  # before LoggerHook (BELOW_NORMAL): the headline figures reach the same log line

    def __init__(self, **options: Any) -> None:
        self.options = GuardOptions.from_env(**options)
        self.monitor: Monitor | None = None
        self._early_error = False
        self._engine: Any = None
        self._module: Any = None
        self._optimizer: Any = None
        self._ds_config: dict[str, Any] | None = None
        self._saves: SaveGuard | None = None
        self._last_global: int | None = None
        self._updates = 0
        self._iters_per_epoch: int | None = None

    # ---- train begin ---------------------------------------------------------------------------------------

    @guarded
    def before_train(self, runner: Any) -> None:
        from mmengine.dist import get_rank, get_world_size  # type: ignore[import-untyped]
        from mmengine.runner import EpochBasedTrainLoop  # type: ignore[import-untyped]

        opts = self.options
        if opts.run_dir is None and getattr(runner, "work_dir", None):
            opts = self.options = replace(opts, run_dir=Path(runner.work_dir))
        # the local rank comes from LOCAL_RANK: mmengine's get_local_rank needs a local group torchrun does not make
        self.monitor = mon = Monitor(opts, rank=get_rank(), world_size=get_world_size())
        if opts.exception_hooks:
            install_hooks(mon)
        self._saves = SaveGuard(mon)
        self._engine = engine = deepspeed_engine(runner.model)
        if engine is not None:
            self._module, self._optimizer = engine.module, engine.optimizer
            self._ds_config = ds_config_of(engine)
            self._last_global = int(getattr(engine, "global_steps", 0) or 0)
        else:
            self._module = unwrap(runner.model)
            self._optimizer = getattr(getattr(runner, "optim_wrapper", None), "optimizer", None)
        self._wrap_save(runner)
        loader = runner.train_dataloader
        samples = _len(getattr(loader, "dataset", None))
        self._iters_per_epoch = _len(loader)
        loop = runner.train_loop
        by_epoch = isinstance(loop, EpochBasedTrainLoop)  # else iteration-based (XTuner's TrainLoop too)
        max_iters = int(loop.max_iters) if getattr(loop, "max_iters", None) else None
        epochs = float(loop.max_epochs) if by_epoch else None
        mon.train_begin(
            max_steps=max_iters, epochs=epochs, samples=samples, iterations_per_epoch=self._iters_per_epoch
        )
        begin_checks(
            mon,
            module=self._module,
            optimizer=self._optimizer,
            ds_config=self._ds_config,
            micro_batch=getattr(loader, "batch_size", None),
            grad_accum=1,  # mmengine counts iterations: one micro batch each (XTuner's TrainLoop too)
            samples=samples,
            max_steps=None if by_epoch else max_iters,
            epochs=epochs,
            max_steps_key="train_cfg.max_iters",
            step_unit="iterations",
            framework="xtuner",
            model_config=hf_config(self._module),
        )

    # ---- hot path ------------------------------------------------------------------------------------------

    @guarded
    def after_train_iter(
        self, runner: Any, batch_idx: int, data_batch: Any = None, outputs: Any = None
    ) -> None:
        mon = self.monitor
        if mon is None or mon.closed:
            return
        engine = self._engine
        if engine is not None:  # an optimizer step is where DeepSpeed's global_steps advances
            now = int(engine.global_steps)
            if now == self._last_global:
                return
            self._last_global = step = now
        else:
            should_update = getattr(getattr(runner, "optim_wrapper", None), "should_update", None)
            if callable(should_update) and not should_update():
                return  # a gradient-accumulation iteration
            self._updates += 1
            step = self._updates
        first = mon.optimizer_steps == 0
        per_epoch = self._iters_per_epoch
        mon.step_end(step, epoch=round((runner.iter + 1) / per_epoch, 4) if per_epoch else None)
        if first and mon.options.check_devices:  # the lazily created optimizer states exist now
            check_placement(mon, self._module, self._optimizer, self._ds_config, when="first_optimizer_step")
        if mon.options.log_to_trainer:
            hub = runner.message_hub
            for key, value in headline(mon).items():
                if value is not None:
                    hub.update_scalar(f"train/zerodoctor/{key}", value)

    # ---- saves ---------------------------------------------------------------------------------------------

    def _wrap_save(self, runner: Any) -> None:
        """Wrap this runner's `save_checkpoint` (CheckpointHook calls it by attribute): headroom before, the
        save's real peak after; it calls the original and returns its value unchanged."""
        orig = runner.save_checkpoint
        if getattr(orig, "_zerodoctor", False):
            return
        hook = self

        @functools.wraps(orig)
        def save_checkpoint(*args: Any, **kwargs: Any) -> Any:
            mon, saves = hook.monitor, hook._saves
            active = mon is not None and saves is not None and not mon.closed
            if active:
                assert mon is not None and saves is not None
                with mon.safe("save"):
                    wants_optimizer = bool(args[3] if len(args) > 3 else kwargs.get("save_optimizer", True))
                    skip = saves.before(
                        mon.step,
                        optimizer_state_saved=wants_optimizer,
                        can_skip_optimizer=len(args) <= 3 and hook._can_save_without_optimizer(),
                    )
                    if skip:
                        kwargs["save_optimizer"] = False
            out = orig(*args, **kwargs)
            if active:
                assert saves is not None and mon is not None
                saves.after(mon.step)
            return out

        save_checkpoint._zerodoctor = True  # type: ignore[attr-defined]
        runner.save_checkpoint = save_checkpoint

    def _can_save_without_optimizer(self) -> bool:
        """mmengine's DeepSpeedStrategy saves the optimizer anyway under ZeRO-3 unless 16-bit weights are
        gathered on save (mmengine/_strategy/deepspeed.py save_checkpoint, v0.10.7)."""
        engine = self._engine
        if engine is None:
            return True
        try:
            partitioned = bool(engine.zero_optimization_partition_weights())
            return not partitioned or bool(engine.zero_gather_16bit_weights_on_model_save())
        except Exception:  # noqa: BLE001 - an engine without these methods: do not promise
            return False

    # ---- events --------------------------------------------------------------------------------------------

    @guarded
    def before_train_epoch(self, runner: Any) -> None:
        if self.monitor is not None:
            self.monitor.event("epoch_begin", epoch_index=int(runner.epoch))

    @guarded
    def after_train_epoch(self, runner: Any) -> None:
        if self.monitor is not None:
            self.monitor.event("epoch_end")

    @guarded
    def before_val(self, runner: Any) -> None:
        mon = self.monitor
        if mon is not None and not mon.closed:
            mon.phase_begin("evaluation")

    @guarded
    def after_val_epoch(self, runner: Any, metrics: dict[str, Any] | None = None) -> None:
        mon = self.monitor
        if mon is not None and not mon.closed:
            mon.phase_end(
                "evaluation",
                metrics={k: v for k, v in (metrics or {}).items() if isinstance(v, int | float)},
            )

    @guarded
    def after_train(self, runner: Any) -> None:
        if self.monitor is not None:
            self.monitor.train_end()


HOOKS.register_module(name="ZeroDoctorHook", module=ZeroDoctorHook, force=True)


def deepspeed_engine(model: Any) -> Any:
    """The DeepSpeed engine behind an mmengine model (MMDeepSpeedEngineWrapper keeps it in `.model`)."""
    ds = sys.modules.get("deepspeed")
    engine_cls = getattr(ds, "DeepSpeedEngine", None) if ds is not None else None
    if engine_cls is None:
        return None
    for candidate in (model, vars(model).get("model") if hasattr(model, "__dict__") else None):
        if isinstance(candidate, engine_cls):
            return candidate
    return None


def unwrap(model: Any) -> Any:
    """The user's model inside an mmengine model wrapper (DDP, FSDP)."""
    from mmengine.model import is_model_wrapper  # type: ignore[import-untyped]

    return model.module if is_model_wrapper(model) else model


def hf_config(module: Any) -> dict[str, Any] | None:
    """The HF config of the model the planner should predict for: the module's own, else its `llm`."""
    for holder in (module, *(getattr(module, a, None) for a in HF_MODEL_ATTRS)):
        to_dict = getattr(getattr(holder, "config", None), "to_dict", None)
        if callable(to_dict):
            cfg = to_dict()
            if isinstance(cfg, dict):
                return cfg
    return None


def _len(obj: Any) -> int | None:
    try:
        return len(obj) if obj is not None else None
    except TypeError:  # an iterable dataset
        return None
