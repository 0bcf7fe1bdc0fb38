"""DS002 deepspeed.batch-size-mismatch: train_batch_size must equal micro batch x accumulation x world size.

Why it matters: DeepSpeed asserts `train_batch_size == train_micro_batch_size_per_gpu *
gradient_accumulation_steps * world_size` in `runtime/config.py::_batch_assertion`
("Check batch related parameters. train_batch_size is not equal to micro_batch_per_gpu * gradient_acc_step *
world_size 64 != 4 * 8 * 1"). A hard-coded `train_batch_size` pins the job to one GPU count: the same file
fails on 7 usable GPUs (OpenRLHF#346: 256 != 2 * 18 * 7), under `python` instead of a launcher (world size 1),
or when `zero.Init` runs before the distributed backend is initialised.

Example (fails on 2 GPUs):

    {"train_batch_size": 64, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 8}

Use instead: `"train_batch_size": "auto"` with HF Trainer / accelerate (HF computes world x micro x
accumulation), or leave `train_batch_size` out and DeepSpeed derives it. `--fix` sets it to "auto" when a
framework fills it, otherwise removes it (safe: DeepSpeed derives the same value on the intended world size).
"""

from __future__ import annotations

from collections.abc import Iterator

from zerodoctor.findings import Finding, Fix, Severity
from zerodoctor.lint.rule import Rule
from zerodoctor.lint.rules._common import as_number, is_auto
from zerodoctor.setup.run import RunDescription


def _int(value: object) -> int | None:
    n = as_number(value)
    return int(n) if n is not None and n.is_integer() else None


def check(run: RunDescription) -> Iterator[Finding]:
    setup = run.files
    if setup.ds_written is None or setup.ds_from_accelerate_plugin:
        return
    tbs_raw = setup.ds_value("train_batch_size")
    mbs_raw = setup.ds_value("train_micro_batch_size_per_gpu")
    gas_raw = setup.ds_value("gradient_accumulation_steps")
    tbs, mbs, gas = _int(tbs_raw), _int(mbs_raw), _int(gas_raw)
    fix_value = "auto" if setup.uses_hf_integration else None
    fix = Fix(
        'Let the framework compute train_batch_size ("auto")'
        if fix_value
        else "Remove train_batch_size; DeepSpeed derives it from micro batch x accumulation x world size",
        target="deepspeed",
        patch={"train_batch_size": fix_value},
    )
    ev = setup.ds_evidence("train_batch_size")
    # DeepSpeed's own first three assertions (runtime/config.py::_batch_assertion, in its order): a value that
    # is not positive is refused before any arithmetic, so no GPU count is derived from it.
    for key, value, label in (
        ("train_batch_size", tbs, "Train batch size"),
        ("train_micro_batch_size_per_gpu", mbs, "Micro batch size per gpu"),
        ("gradient_accumulation_steps", gas, "Gradient accumulation steps"),
    ):
        if value is not None and value <= 0:
            yield RULE.finding(
                f"{key} is {value}; DeepSpeed stops at launch with '{label}: {value} has to be greater than 0'. "
                f"Set {key} to a whole number of 1 or more.",
                evidence=[setup.ds_evidence(key)],
            )
            return
    if tbs is None or is_auto(setup.ds_written_value("train_batch_size")) and setup.uses_hf_integration:
        return  # nothing hard-coded, or the framework computes it
    if mbs is None or gas is None:
        return  # DeepSpeed derives the missing one; only an impossible world size is checkable below
    ws = setup.world_size
    if setup.resolution and any(k == "train_batch_size" for k, *_ in setup.resolution.mismatches):
        return  # HF Trainer rejects it first, with its own message (HF001)
    if ws:
        if tbs != mbs * gas * ws:
            yield RULE.finding(
                f"train_batch_size is {tbs} but micro batch x accumulation x world size is {mbs} * {gas} * {ws} = "
                f"{mbs * gas * ws} (world size from {setup.world_size_source}); DeepSpeed stops at launch with "
                f"'train_batch_size is not equal to micro_batch_per_gpu * gradient_acc_step * world_size "
                f"{tbs} != {mbs} * {gas} * {ws}'.",
                evidence=[ev],
                fixes=[fix],
            )
        return
    per_rank = mbs * gas
    if tbs % per_rank:
        yield RULE.finding(
            f"train_batch_size {tbs} is not a multiple of micro batch x accumulation ({mbs} * {gas} = {per_rank}), "
            "so no number of GPUs satisfies DeepSpeed's batch assertion.",
            evidence=[ev],
            fixes=[fix],
        )
    else:
        yield RULE.finding(
            f"train_batch_size {tbs} with micro batch {mbs} and accumulation {gas} only works on exactly "
            f"{tbs // per_rank} GPU(s); on any other count DeepSpeed stops with '{tbs} != {mbs} * {gas} * N'.",
            evidence=[ev],
            fixes=[fix],
            severity=Severity.WARNING,
        )


RULE = Rule(
    code="DS002",
    name="deepspeed.batch-size-mismatch",
    title="Batch size triple does not match the world size",
    severity=Severity.ERROR,
    references=("deepspeedai/DeepSpeed#6914", "OpenRLHF/OpenRLHF#346", "hiyouga/LlamaFactory#2574"),
    check=check,
    fix_safety="safe",
)
