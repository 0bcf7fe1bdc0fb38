"""Switch the guard on inside a program without editing it (what `zerodoctor guard -- CMD` does).

`zerodoctor guard` writes a `sitecustomize.py` into the guard folder, puts that folder first on
PYTHONPATH and sets ZERODOCTOR_GUARD_ENABLE=1; every Python process of the launch (the launcher and each rank)
then runs `install()` at start-up. `install()` imports nothing heavy: it registers an import hook that, when
the program itself imports `transformers.trainer`, mmengine's runners or `deepspeed`, adds `ZeroDoctorCallback`
to every Trainer and `ZeroDoctorHook` to every mmengine `Runner` / `FlexibleRunner` (XTuner's) the program
creates, and `watch()`es every engine a plain `deepspeed.initialize` returns (not the ones a Trainer or an
mmengine runner creates: the callback or the hook already guards those). An existing sitecustomize further down the path still
runs.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

ENABLE_VAR = "ZERODOCTOR_GUARD_ENABLE"
_state = {"adapter_seen": False}
"""Set once a Trainer or an mmengine runner exists: its engines are guarded by the callback or the hook."""

SITECUSTOMIZE = """\
# written by `zerodoctor guard`: switches the runtime guard on in every Python process of the launch
import os as _os
import sys as _sys

if _os.environ.get("ZERODOCTOR_GUARD_ENABLE") == "1":
    try:
        from zerodoctor.guard.autoinstall import install as _zd_install

        _zd_install()
    except Exception as _exc:  # never stop the program
        _sys.stderr.write(f"zerodoctor guard: not active in this process: {_exc}\\n")

def _zd_chain():
    import importlib.machinery
    import importlib.util

    here = _os.path.dirname(_os.path.abspath(__file__))
    rest = [p for p in _sys.path if _os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        mod = importlib.util.module_from_spec(spec)
        _sys.modules["_zerodoctor_next_sitecustomize"] = mod
        spec.loader.exec_module(mod)

try:
    _zd_chain()
except Exception as _exc:
    _sys.stderr.write(f"zerodoctor guard: the next sitecustomize failed: {_exc}\\n")
"""


def _patch_trainer(module: ModuleType) -> None:
    trainer_cls = getattr(module, "Trainer", None)
    if trainer_cls is None or getattr(trainer_cls.__init__, "_zerodoctor", False):
        return
    orig = trainer_cls.__init__

    @functools.wraps(orig)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        orig(self, *args, **kwargs)
        _state["adapter_seen"] = True
        try:
            from zerodoctor.guard.hf import ZeroDoctorCallback

            if not any(isinstance(cb, ZeroDoctorCallback) for cb in self.callback_handler.callbacks):
                ZeroDoctorCallback.attach(self)
        except Exception as exc:  # noqa: BLE001
            sys.stderr.write(f"zerodoctor guard: could not attach to the Trainer: {exc}\n")

    __init__._zerodoctor = True  # type: ignore[attr-defined]
    trainer_cls.__init__ = __init__


def _patch_deepspeed(module: ModuleType) -> None:
    init = getattr(module, "initialize", None)
    if init is None or getattr(init, "_zerodoctor", False):
        return

    @functools.wraps(init)
    def initialize(*args: Any, **kwargs: Any) -> Any:
        out = init(*args, **kwargs)
        if not _state["adapter_seen"]:  # a Trainer's or runner's engine is guarded by its adapter
            try:
                from zerodoctor.guard.ds_watch import watch

                watch(out[0])
            except Exception as exc:  # noqa: BLE001
                sys.stderr.write(f"zerodoctor guard: could not watch the engine: {exc}\n")
        return out

    initialize._zerodoctor = True  # type: ignore[attr-defined]
    module.initialize = initialize  # type: ignore[attr-defined]


def _patch_mmengine_runner(module: ModuleType) -> None:
    """Add `ZeroDoctorHook` to every runner built from this module's class (`Runner` in
    mmengine.runner.runner, `FlexibleRunner` in mmengine.runner._flexible_runner), unless its config already
    names the hook. The hook module is imported when a runner is built, never while mmengine is importing."""
    for name in ("Runner", "FlexibleRunner"):
        runner_cls = getattr(module, name, None)
        if runner_cls is None or getattr(runner_cls.__init__, "_zerodoctor", False):
            continue
        orig = runner_cls.__init__

        def __init__(self: Any, *args: Any, _orig: Any = orig, **kwargs: Any) -> None:
            _state["adapter_seen"] = True  # before the strategy's deepspeed.initialize (in train())
            _orig(self, *args, **kwargs)
            try:
                from zerodoctor.guard.mmengine_hook import ZeroDoctorHook

                if not any(isinstance(h, ZeroDoctorHook) for h in self.hooks):
                    self.register_hook(ZeroDoctorHook())
            except Exception as exc:  # noqa: BLE001
                sys.stderr.write(f"zerodoctor guard: could not add the hook to the mmengine runner: {exc}\n")

        functools.update_wrapper(__init__, orig)
        __init__._zerodoctor = True  # type: ignore[attr-defined]
        runner_cls.__init__ = __init__


_PATCHES = {
    "transformers.trainer": _patch_trainer,
    "deepspeed": _patch_deepspeed,
    "mmengine.runner.runner": _patch_mmengine_runner,
    "mmengine.runner._flexible_runner": _patch_mmengine_runner,
}


class _Loader(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader, patch: Any) -> None:
        self.inner = inner
        self.patch = patch

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.inner.exec_module(module)
        try:
            self.patch(module)
        except Exception as exc:  # noqa: BLE001
            sys.stderr.write(f"zerodoctor guard: could not instrument {module.__name__}: {exc}\n")


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(
        self,
        name: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        patch = _PATCHES.get(name)
        if patch is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _Loader(spec.loader, patch)
        return spec


def install() -> None:
    """Instrument Trainers and DeepSpeed engines of this process (idempotent)."""
    for name, patch in _PATCHES.items():
        if name in sys.modules:
            patch(sys.modules[name])
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
