"""Train-begin judgements that need the live run: the step count and the engine's final DeepSpeed config."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from zerodoctor.findings import Evidence, Finding, Fix, Severity


def expected_optimizer_steps(
    samples: int, micro_batch: int, data_parallel: int, grad_accum: int, epochs: float = 1.0
) -> int:
    """Optimizer steps of `epochs` passes: samples / (micro_bs x dp x grad_accum) per epoch (ceil per rank,
    as a distributed sampler pads, then floor by accumulation as the Trainer does)."""
    per_rank = -(-samples // max(micro_batch * data_parallel, 1))
    return max(int(per_rank // max(grad_accum, 1) * epochs), 1)


def check_step_count(
    *,
    max_steps: int | None,
    samples: int | None,
    micro_batch: int,
    data_parallel: int,
    grad_accum: int,
    epochs: float | None,
    max_steps_key: str = "max_steps",
    unit: str = "optimizer steps",
) -> list[Finding]:
    """The XTuner `max_iters` case: a configured step cap that ends training long before one epoch. `unit`
    names what the cap counts (mmengine's `max_iters` counts iterations, one micro batch each: pass
    grad_accum=1 and unit="iterations")."""
    if not max_steps or max_steps <= 0 or not samples:
        return []
    one_epoch = expected_optimizer_steps(samples, micro_batch, data_parallel, grad_accum)
    wanted = expected_optimizer_steps(samples, micro_batch, data_parallel, grad_accum, epochs or 1.0)
    if max_steps >= min(one_epoch, wanted) or max_steps >= 0.5 * wanted:
        return []
    share = 100.0 * max_steps / one_epoch
    short = unit.split()[-1]  # "steps", "iterations"
    formula = f"{samples} samples / ({micro_batch} micro batch x {data_parallel} data-parallel x {grad_accum} accumulation)"
    return [
        Finding(
            id="guard.max-steps-below-epoch",
            severity=Severity.WARNING,
            title="training will stop long before one epoch",
            message=(
                f"{max_steps_key}={max_steps} caps training at {max_steps} {unit}, {share:.1f}% of one "
                f"epoch ({one_epoch} {short} = {formula}); "
                f"{'the requested ' + format(epochs, 'g') + ' epochs need ' + str(wanted) + ' ' + short + '; ' if epochs else ''}"
                "a step cap wins over the epoch count"
            ),
            fixes=(
                Fix(f"remove {max_steps_key} (or set it to -1) to train by epochs, or set it to {wanted}"),
            ),
            evidence=(Evidence(key=max_steps_key, text=str(max_steps)),),
            references=("InternLM/xtuner#589",),
            data={"max_steps": max_steps, "one_epoch_steps": one_epoch, "expected_steps": wanted},
        )
    ]


def finite_config(obj: Any) -> Any:
    """The config as plain JSON: non-finite floats are dropped (HF writes steps_per_print=inf for "never",
    which JSON cannot hold), other objects become strings."""
    if isinstance(obj, Mapping):
        return {str(k): finite_config(v) for k, v in obj.items() if not _non_finite(v)}
    if isinstance(obj, list | tuple):
        return [finite_config(v) for v in obj if not _non_finite(v)]
    if isinstance(obj, str | int | float | bool) or obj is None:
        return obj
    return str(obj)


def _non_finite(v: Any) -> bool:
    return isinstance(v, float) and not math.isfinite(v)


def write_live_config(ds_config: Mapping[str, Any], guard_dir: Path) -> Path:
    guard_dir.mkdir(parents=True, exist_ok=True)
    path = guard_dir / "ds_config.live.json"
    path.write_text(json.dumps(finite_config(ds_config), indent=1))
    return path


def lint_live_config(
    ds_config: Mapping[str, Any], guard_dir: Path, *, world_size: int, framework: str = "deepspeed"
) -> list[Finding]:
    """Judge the engine's final DeepSpeed config (after HF/accelerate filled "auto") with the lint rules;
    warnings and errors only."""
    from zerodoctor.lint.engine import lint_setup
    from zerodoctor.setup.load import load_setup

    path = write_live_config(ds_config, guard_dir)
    setup = load_setup([path], kind="deepspeed", framework=framework, world_size=world_size)
    return [f for f in lint_setup(setup) if f.severity >= Severity.WARNING]
