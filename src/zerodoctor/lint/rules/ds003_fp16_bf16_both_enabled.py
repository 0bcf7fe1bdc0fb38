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
from zerodoctor.setup.run import RunDescription


def check(run: RunDescription) -> Iterator[Finding]:
    setup = run.files
    if setup.ds_written is None:
        return
    fp16 = truthy(setup.ds_value("fp16.enabled"))
    bf16 = truthy(setup.ds_value("bf16.enabled"))
    if fp16 and bf16:
        if setup.args.get("fp16") is True and setup.args.get("bf16") is True:
            yield RULE.finding(
                "The training arguments set both fp16 and bf16: transformers stops before training with 'At most "
                "one of fp16 and bf16 can be True, but not both' (and DeepSpeed would refuse both blocks too).",
                evidence=[setup.arg_evidence("fp16"), setup.arg_evidence("bf16")],
                fixes=[Fix("Keep bf16 and drop fp16 from the arguments", target="hf", patch={"fp16": False})],
            )
            return
        mp = setup.mixed_precision_evidence
        if (
            mp is not None
            and setup.accelerate_doc is not None
            and mp.file == setup.accelerate_doc.display
            and setup.ds_doc
        ):
            mixed = str(setup.accelerate_doc.get("mixed_precision"))
            other = "bf16" if mixed == "fp16" else "fp16"
            if setup.ds_doc.has((other,)):
                # accelerate DeepSpeedPlugin.set_mixed_precision refuses the pair before DeepSpeed sees it
                yield RULE.finding(
                    f"accelerate's mixed_precision is {mixed} but the DeepSpeed file enables {other}: accelerate stops "
                    f"with '`--mixed_precision` arg cannot be set to `{mixed}` when `{other}` is set in the DeepSpeed "
                    "config file.'",
                    evidence=[mp, setup.ds_doc.evidence((other,))],
                    fixes=[
                        Fix(
                            f"Set mixed_precision: {other} in the accelerate config",
                            target="accelerate",
                            patch={"mixed_precision": other},
                        )
                    ],
                )
                return
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
