"""Freeze tuning keeps activations only where gradients flow: measured with saved-tensor hooks on a real
transformers model (bf16, CPU), the way LLaMA-Factory and plain HF Trainer set it up."""

from __future__ import annotations

import importlib.util
import sys
from functools import WRAPPER_ASSIGNMENTS, partial, wraps
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from zerodoctor.plan.activations import activation_bytes

ROOT = Path(__file__).resolve().parents[2]


def _bench() -> ModuleType:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    spec = importlib.util.spec_from_file_location(
        "plan_activations", ROOT / "benchmarks" / "plan_activations.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("plan_activations", module)
    spec.loader.exec_module(module)
    return module


def _freeze(model: Any, trainable_layers: int) -> None:
    """LLaMA-Factory `_setup_freeze_tuning`: only the last N decoder layers train."""
    layers = model.model.layers
    for p in model.parameters():
        p.requires_grad_(False)
    for layer in list(layers)[len(layers) - trainable_layers :]:
        for p in layer.parameters():
            p.requires_grad_(True)


def _llamafactory_checkpointing(model: Any) -> None:
    """What LLaMA-Factory's `get_custom_gradient_checkpointing_func` does (model_utils/checkpointing.py): layers
    with a trainable parameter are checkpointed with their input marked as requiring grad; the others run
    plainly. It replaces `gradient_checkpointing_enable`, so `enable_input_require_grads` is never called."""
    import torch.utils.checkpoint

    inner = partial(torch.utils.checkpoint.checkpoint, use_reentrant=False)

    @wraps(inner, assigned=(*WRAPPER_ASSIGNMENTS, "__self__"))
    def custom(func: Any, *args: Any, **kwargs: Any) -> Any:
        # transformers 5.23 GradientCheckpointingLayer passes partial(forward, self, **kwargs): the module is
        # the partial's first argument (older releases passed the bound __call__).
        if isinstance(func, partial):
            module = getattr(func.func, "__self__", None) or func.args[0]
        else:
            module = func.__self__
        if any(p.requires_grad for p in module.parameters()):
            for arg in args:
                if hasattr(arg, "is_floating_point") and arg.is_floating_point():
                    arg.requires_grad_(True)
                    break
            return inner(func, *args, **kwargs)
        return func(*args, **kwargs)

    model._set_gradient_checkpointing(enable=True, gradient_checkpointing_func=custom)


@pytest.mark.parametrize(
    ("gc", "how"),
    [(False, "none"), (True, "llamafactory"), (True, "transformers")],
)
def test_freeze_tuning_saved_bytes_match(gc: bool, how: str) -> None:
    bench = _bench()
    for trainable in (1, 2):
        model, spec = bench.build("llama-gqa", "sdpa", bench.torch.bfloat16)
        _freeze(model, trainable)
        if how == "llamafactory":
            _llamafactory_checkpointing(model)
        elif how == "transformers":
            # transformers 5.23 activation_checkpointing_enable -> enable_input_require_grads()
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        batch, seq = 2, 64
        got = bench.measure(model, batch, seq, False, spec.params.vocab_size)["total"]
        est = activation_bytes(
            spec,
            micro_batch=batch,
            seq_len=seq,
            attn_impl="sdpa",
            gradient_checkpointing=gc,
            trainable_layers=trainable,
            frozen_layers_keep_inputs=how == "transformers",
        )
        assert abs(est.saved_total / got - 1) <= 0.05, (trainable, gc, how, est.saved_total, got)
        full = activation_bytes(
            spec, micro_batch=batch, seq_len=seq, attn_impl="sdpa", gradient_checkpointing=gc
        )
        assert est.saved_total < full.saved_total


def test_frozen_prefix_is_free_and_trainable_layers_cost_full_layers() -> None:
    from zerodoctor.models.spec import resolve_model

    spec = resolve_model("llama-3.1-8b")
    kw: dict[str, Any] = {"micro_batch": 1, "seq_len": 4096, "gradient_checkpointing": False}
    full = activation_bytes(spec, **kw)
    two = activation_bytes(spec, trainable_layers=2, **kw)
    four = activation_bytes(spec, trainable_layers=4, **kw)
    assert four.saved_total - two.saved_total == 2 * full.per_layer_saved
    assert two.saved_total < full.saved_total / 6
    assert any("freeze tuning: 2 of 32 layers train" in n for n in two.notes)
