"""HF001 hf.ds-args-mismatch: DeepSpeed values that contradict the training arguments HF Trainer is given.

Why it matters: HF Trainer fills "auto" from TrainingArguments, but a *concrete* DeepSpeed value that differs
from the argument is recorded as a mismatch, and `trainer_config_finalize` raises "Please correct the following
DeepSpeed config values that mismatch TrainingArguments values: - ds train_micro_batch_size_per_gpu=1 vs hf
per_device_train_batch_size=8" (transformers `integrations/deepspeed.py`). It fires after the model is built.
LLaMA-Factory uses the same Trainer path. Arguments that are not given count with their defaults
(per_device_train_batch_size 8, max_grad_norm 1.0, learning_rate 5e-5, ...), which is how a DeepSpeed file
with `"train_micro_batch_size_per_gpu": 1` fails next to arguments that never mention the batch size.

Example (fails):

    ds.json: {"train_micro_batch_size_per_gpu": 1, ...}      args.yaml: per_device_train_batch_size: 8

Use instead: "auto" in the DeepSpeed file for every value HF also has (the fix, safe: HF then uses the
argument, which is what training would have used anyway).
"""

from __future__ import annotations

from collections.abc import Iterator

from zerodoctor.findings import Finding, Fix, Severity
from zerodoctor.lint.rule import Rule
from zerodoctor.setup.run import RunDescription


def check(run: RunDescription) -> Iterator[Finding]:
    setup = run.files
    if setup.resolution is None or not setup.resolution.mismatches:
        return
    lines = [f"- ds {k}={dv} vs hf {hk}={hv}" for k, dv, hk, hv in setup.resolution.mismatches]
    patch = {k: "auto" for k, _dv, _hk, _hv in setup.resolution.mismatches}
    evidence = [setup.ds_evidence(k) for k, *_ in setup.resolution.mismatches]
    for _k, _dv, hk, _hv in setup.resolution.mismatches:
        first = hk.split("|")[0].split(" ")[0].split("+")[0]
        if setup.args_doc is not None and setup.args_doc.has((first,)):
            evidence.append(setup.arg_evidence(first))
    yield RULE.finding(
        "HF Trainer will stop after building the model with 'Please correct the following DeepSpeed config values "
        "that mismatch TrainingArguments values:' " + "; ".join(lines) + ".",
        evidence=evidence,
        fixes=[
            Fix(
                'Set these DeepSpeed values to "auto" so HF uses the training arguments',
                target="deepspeed",
                patch=patch,
            )
        ],
    )


RULE = Rule(
    code="HF001",
    name="hf.ds-args-mismatch",
    title="DeepSpeed config contradicts the HF training arguments",
    severity=Severity.ERROR,
    references=("huggingface/transformers#27830", "CarperAI/trlx#376"),
    check=check,
    fix_safety="safe",
)
