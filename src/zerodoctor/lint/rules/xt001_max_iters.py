"""XT001 xtuner.max-iters: an XTuner run capped by `max_iters`, and the number of steps it will really do.

Why it matters: `train_cfg = dict(type=TrainLoop, max_iters=32)` ends training after 32 *iterations*
(dataloader batches, not optimizer steps) however large the dataset is; `xtuner train` never touches
`train_cfg`, so the cap from a speed benchmark config goes through silently (InternLM/xtuner#589: a 50k-sample
Yi-34B run did 32 iterations; maintainer HIT-cwh pointed at `max_iters`). With `accumulative_counts` 8 that is
only 4 optimizer steps.

Expected numbers (XTuner's `SequenceParallelSampler` shards data over the data-parallel group, world size /
sequence_parallel_size; `accumulative_counts` is not scaled by XTuner itself, configs do it by convention):
iterations per epoch = ceil(samples / (world / sp)) / batch_size, optimizer steps = iterations /
accumulative_counts. Give `--samples N` and `--world-size` to get them; packing (`pack_to_max_length`) changes
the sample count, and XTuner's packing drops the tail of each 1000-sample map shard (xtuner#589).

Use instead: `max_epochs` (the fix replaces `max_iters` with `max_epochs`; unsafe: it changes run length).
"""

from __future__ import annotations

import math
from collections.abc import Iterator

from zerodoctor.findings import Finding, Fix, Severity
from zerodoctor.lint.rule import Rule
from zerodoctor.setup.python_reader import Symbol
from zerodoctor.setup.run import RunDescription


def _int(value: object) -> int | None:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def expected_steps(samples: int, world: int, sp: int, batch: int, accum: int) -> tuple[int, int]:
    """(iterations per epoch, optimizer steps per epoch) as XTuner's sampler and loop count them."""
    dp = max(1, world // max(1, sp))
    iters = math.ceil(math.ceil(samples / dp) / max(1, batch))
    return iters, iters // max(1, accum)


def check(run: RunDescription) -> Iterator[Finding]:
    setup = run.files
    doc = setup.xtuner_doc
    if doc is None:
        return
    train_cfg = doc.get("train_cfg")
    if not isinstance(train_cfg, dict):
        return
    max_iters = _int(train_cfg.get("max_iters"))
    max_epochs = train_cfg.get("max_epochs")
    batch = _int(doc.get(("train_dataloader", "batch_size"))) or _int(doc.get("batch_size"))
    accum = (
        _int(doc.get(("optim_wrapper", "accumulative_counts"))) or _int(doc.get("accumulative_counts")) or 1
    )
    sp = _int(doc.get("sequence_parallel_size")) or 1
    samples = getattr(setup, "dataset_samples", None)
    steps_text = ""
    if samples and setup.world_size and batch:
        iters, steps = expected_steps(samples, setup.world_size, sp, batch, accum)
        steps_text = (
            f" One epoch of {samples:,} samples on {setup.world_size} GPUs (sequence parallel {sp}, "
            f"data-parallel {max(1, setup.world_size // sp)}) is {iters:,} iterations = {steps:,} optimizer "
            f"steps."
        )
    if max_iters is not None and max_epochs is not None:
        yield RULE.finding(
            "train_cfg sets both max_iters and max_epochs: XTuner's TrainLoop refuses to start with "
            "'RuntimeError: Only one of max_iters or max_epochs can exist in train_cfg.'",
            evidence=[doc.evidence(("train_cfg", "max_iters")), doc.evidence(("train_cfg", "max_epochs"))],
            fixes=[
                Fix(
                    "Keep max_epochs and remove max_iters",
                    target="xtuner",
                    patch={"train_cfg.max_iters": None},
                )
            ],
            severity=Severity.ERROR,
        )
    elif max_iters is not None:
        opt_steps = max_iters // accum
        ev = doc.evidence(("train_cfg", "max_iters"))
        yield RULE.finding(
            f"train_cfg sets max_iters={max_iters}: training stops after {max_iters} iterations "
            f"(dataloader batches), which with accumulative_counts {accum} is {opt_steps} optimizer step(s), however "
            f"large the dataset is.{steps_text}",
            evidence=[ev],
            fixes=[
                Fix(
                    "Train by epochs: train_cfg = dict(type=TrainLoop, max_epochs=max_epochs)",
                    target="xtuner",
                    patch={"train_cfg.max_iters": None, "train_cfg.max_epochs": Symbol("max_epochs")},
                )
            ],
            severity=Severity.WARNING,
        )
    elif steps_text:
        yield RULE.finding(
            "Expected run length." + steps_text,
            evidence=[doc.evidence(("train_cfg",))],
            severity=Severity.INFO,
        )
    if sp > 1 and accum % sp:
        accum_key = (
            ("optim_wrapper", "accumulative_counts")
            if doc.has(("optim_wrapper", "accumulative_counts")) and not doc.has(("accumulative_counts",))
            else ("accumulative_counts",)
        )
        yield RULE.finding(
            f"sequence_parallel_size is {sp} but accumulative_counts is {accum}, not a multiple of it: XTuner does not "
            f"scale accumulation itself, and its configs use accumulative_counts = k * sequence_parallel_size to keep "
            f"the global batch of the non-SP run (data-parallel size shrinks {sp}x with sequence parallel).",
            evidence=[doc.evidence(accum_key)],
            severity=Severity.INFO,
        )


RULE = Rule(
    code="XT001",
    name="xtuner.max-iters",
    title="XTuner run capped by max_iters / expected steps",
    severity=Severity.WARNING,
    references=("InternLM/xtuner#589",),
    check=check,
    fix_safety="unsafe",
)
