"""`watch(engine)`: the guard for a plain `deepspeed.initialize` loop, without changing the loop.

    engine, optimizer, _, _ = deepspeed.initialize(model=model, config=ds_config, ...)
    guard = zerodoctor.guard.watch(engine, run_dir="out", samples=len(dataset))
    with guard:                      # optional: records, diagnoses and re-raises an exception
        for batch in loader:
            loss = engine(batch); engine.backward(loss); engine.step()
        engine.save_checkpoint("out/ckpt")
    guard.close()

It wraps the engine instance's `step` (an optimizer-step boundary is where `global_steps` advances) and
`save_checkpoint` (a save event with its real peak); both call the original and return its value unchanged.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any, Literal

from zerodoctor.guard.adapter import SaveGuard
from zerodoctor.guard.crash import install_hooks, record_exception
from zerodoctor.guard.monitor import Monitor
from zerodoctor.guard.options import GuardOptions
from zerodoctor.guard.session import begin_checks, check_placement, ds_config_of

_ATTR = "_zerodoctor_watcher"


class Watcher:
    def __init__(self, engine: Any, monitor: Monitor) -> None:
        self.engine = engine
        self.monitor = monitor
        self._orig_step = engine.step
        self._orig_save = engine.save_checkpoint
        self._active = True
        self._saves = SaveGuard(monitor)
        engine.__dict__["step"] = self._step
        engine.__dict__["save_checkpoint"] = self._save
        engine.__dict__[_ATTR] = self

    def _step(self, *args: Any, **kwargs: Any) -> Any:
        before = getattr(self.engine, "global_steps", None)
        out = self._orig_step(*args, **kwargs)
        if self._active:
            mon = self.monitor
            with mon.safe("ds_step"):
                mon.fault_point("ds_step")
                after = getattr(self.engine, "global_steps", None)
                if after is not None and after != before:
                    first = mon.optimizer_steps == 0
                    mon.step_end(int(after))
                    if first and mon.options.check_devices:
                        check_placement(
                            mon,
                            self.engine.module,
                            self.engine.optimizer,
                            ds_config_of(self.engine),
                            when="first_optimizer_step",
                        )
        return out

    def _save(self, *args: Any, **kwargs: Any) -> Any:
        mon = self.monitor
        step = int(getattr(self.engine, "global_steps", 0) or 0)
        if self._active:
            with mon.safe("save"):
                self._saves.before(step)  # pre-save headroom; DeepSpeed's save has no "without optimizer"
        out = self._orig_save(*args, **kwargs)
        if self._active:
            self._saves.after(step)
        return out

    def __enter__(self) -> Watcher:
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> Literal[False]:
        if e is not None:
            record_exception(self.monitor, e, tb)
        return False  # re-raise unchanged

    def close(self) -> None:
        """Stop watching: restore the engine's methods and finish the per-rank file."""
        if not self._active:
            return
        self._active = False
        for name in ("step", "save_checkpoint", _ATTR):
            self.engine.__dict__.pop(name, None)
        self.monitor.train_end()


def watch(
    engine: Any,
    *,
    samples: int | None = None,
    max_steps: int | None = None,
    epochs: float | None = None,
    seq_len: int | None = None,
    **options: Any,
) -> Watcher:
    """Start guarding a DeepSpeed engine (see the module docstring). Keyword options are `GuardOptions`
    fields; `samples`/`max_steps`/`epochs` enable the step-count check (expected = samples / (micro batch x
    data-parallel x accumulation))."""
    existing = engine.__dict__.get(_ATTR)
    if isinstance(existing, Watcher):
        return existing
    opts = GuardOptions.from_env(**options)
    mon = Monitor(opts, world_size=_world(engine))
    if opts.exception_hooks:
        install_hooks(mon)
    w = Watcher(engine, mon)
    cfg = ds_config_of(engine)
    mon.train_begin(max_steps=max_steps, samples=samples)
    with mon.safe("begin"):
        begin_checks(
            mon,
            module=engine.module,
            optimizer=engine.optimizer,
            ds_config=cfg,
            micro_batch=_call(engine, "train_micro_batch_size_per_gpu"),
            grad_accum=_call(engine, "gradient_accumulation_steps"),
            samples=samples,
            max_steps=max_steps,
            epochs=epochs,
            seq_len=seq_len,
        )
    return w


def unwatch(engine: Any) -> None:
    w = engine.__dict__.get(_ATTR)
    if isinstance(w, Watcher):
        w.close()


def _call(engine: Any, name: str) -> int | None:
    fn = getattr(engine, name, None)
    try:
        return int(fn()) if callable(fn) else None
    except Exception:  # noqa: BLE001
        return None


def _world(engine: Any) -> int | None:
    try:
        import torch.distributed as dist

        return dist.get_world_size() if dist.is_initialized() else None
    except Exception:  # noqa: BLE001
        return None
