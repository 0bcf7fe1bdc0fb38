"""Read user files into one TrainingSetup: DeepSpeed JSON, HF args, LLaMA-Factory YAML, accelerate YAML and
XTuner Python configs (ast only), with line numbers for every key.

The package itself imports nothing heavy: `zerodoctor diagnose` reads only `setup.document.KINDS` and
`setup.model.FRAMEWORKS` for its options, and must not pay for the readers (its cold start target is 0.5 s).
The names below are loaded on first use."""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "KINDS": "zerodoctor.setup.document",
    "ConfigDocument": "zerodoctor.setup.document",
    "load_setup": "zerodoctor.setup.load",
    "TrainingSetup": "zerodoctor.setup.model",
    "build_setup": "zerodoctor.setup.model",
    "read_document": "zerodoctor.setup.reader",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
