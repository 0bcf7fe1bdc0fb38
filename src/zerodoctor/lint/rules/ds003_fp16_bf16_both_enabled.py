"""DS003 deepspeed.fp16-bf16-both-enabled: fp16 and bf16 cannot both be on.

Why it matters: DeepSpeed asserts "bfloat16 and fp16 modes cannot be simultaneously enabled"
(`runtime/config.py`) at `deepspeed.initialize`, after the model is loaded. It happens when both blocks say
`"enabled": true`, or when "auto" resolves to true for both (`--fp16` plus `--bf16`, or a config that hard-codes
one while the arguments pick the other). accelerate refuses `--mixed_precision` that contradicts the file.

Example (fails):

    {"fp16": {"enabled": true}, "bf16": {"enabled": true}}

Use instead: enable exactly one; prefer bf16 on Ampere or newer (fp16 overflows models pretrained in bf16,
see `fp16-loss-scale-min`). `--fix` turns fp16 off (safe only on bf16-capable GPUs, hence marked unsafe).
"""

from __future__ import annotations

from collections.abc import Iterator

from zerodoctor.findings import Finding, Fix, Severity
from zerodoctor.lint.rule import Rule
from zerodoctor.lint.rules._common import truthy
from zerodoctor.setup.model import TrainingSetup


def check(setup: TrainingSetup) -> Iterator[Finding]:
    if setup.ds_written is None:
        return
    fp16 = truthy(setup.ds_value("fp16.enabled"))
    bf16 = truthy(setup.ds_value("bf16.enabled"))
    if fp16 and bf16:
        how = ""
        if setup.resolution and (
            "fp16.enabled" in setup.resolution.filled or "bf16.enabled" in setup.resolution.filled
        ):
            how = ' (after HF filled "auto" from fp16/bf16 in the training arguments)'
        yield RULE.finding(
            f"Both fp16.enabled and bf16.enabled are true{how}; DeepSpeed stops at initialize with "
            "'bfloat16 and fp16 modes cannot be simultaneously enabled'.",
            evidence=[setup.ds_evidence("fp16.enabled"), setup.ds_evidence("bf16.enabled")],
            fixes=[
                Fix(
                    "Disable fp16 and keep bf16 (Ampere or newer GPUs)",
                    target="deepspeed",
                    patch={"fp16.enabled": False},
                ),
                Fix(
                    "On GPUs without bf16 (V100, T4), disable bf16 instead",
                    target="deepspeed",
                    patch={"bf16.enabled": False},
                ),
            ],
        )


RULE = Rule(
    code="DS003",
    name="deepspeed.fp16-bf16-both-enabled",
    title="fp16 and bf16 both enabled",
    severity=Severity.ERROR,
    references=("deepspeedai/DeepSpeed:deepspeed/runtime/config.py",),
    check=check,
    fix_safety="unsafe",
)
