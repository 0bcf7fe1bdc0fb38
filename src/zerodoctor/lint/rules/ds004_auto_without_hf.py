"""DS004 deepspeed.auto-without-hf-integration: "auto" values that nothing will fill.

Why it matters: "auto" is a convention of HF Trainer and accelerate (and XTuner's launcher): they replace it
with concrete values before DeepSpeed starts. A config with "auto" handed to a plain `deepspeed.initialize`
(or registered through a bare `HfDeepSpeedConfig` for zero.Init) reaches DeepSpeed unresolved and fails
late, e.g. `if self.gradient_clipping() > 0.0: TypeError: '>' not supported between instances of 'str' and
'float'` (deepspeedai/DeepSpeed#1270, huggingface/accelerate#1644).

Example (fails under `deepspeed train.py --deepspeed_config ds.json`):

    {"train_micro_batch_size_per_gpu": "auto", "gradient_clipping": "auto"}

Use instead: concrete values when no HF integration is involved. When only the DeepSpeed JSON is given,
zerodoctor cannot know the launcher and reports this as information; say `--framework deepspeed` (or give
the training arguments) to get a definite answer. No automatic fix (the values are the user's choice).
"""

from __future__ import annotations

from collections.abc import Iterator

from zerodoctor.findings import Finding, Fix, Severity
from zerodoctor.lint.rule import Rule
from zerodoctor.lint.rules._common import auto_keys
from zerodoctor.setup.run import RunDescription


def check(run: RunDescription) -> Iterator[Finding]:
    setup = run.files
    if setup.ds_doc is None or setup.ds_written is None:
        return
    keys = auto_keys(setup.ds_doc.data)
    if not keys or setup.uses_hf_integration:
        return
    shown = ", ".join(keys[:6]) + (f" and {len(keys) - 6} more" if len(keys) > 6 else "")
    evidence = [setup.ds_doc.evidence(tuple(k.split("."))) for k in keys[:10]]
    fix = Fix(
        'Replace every "auto" with a concrete value (or launch through HF Trainer / accelerate, which fill them)'
    )
    if setup.framework == "deepspeed":
        # DeepSpeed reads top-level keys raw (a string reaches its arithmetic and fails), while its pydantic
        # models for zero_optimization / fp16 / bf16 drop "auto" and silently use the default.
        crash = [k for k in keys if k.split(".")[0] not in ("zero_optimization", "fp16", "bf16", "bfloat16")]
        dropped = [k for k in keys if k not in crash]
        parts = []
        if crash:
            parts.append(
                f"{', '.join(crash[:6])} reach DeepSpeed as strings and fail (e.g. \"TypeError: '>' not "
                "supported between instances of 'str' and 'float'\")"
            )
        if dropped:
            parts.append(
                f"{', '.join(dropped[:6])} are silently dropped by DeepSpeed's config models, which use "
                'their defaults (bf16/fp16 "auto" means off)'
            )
        yield RULE.finding(
            f'{len(keys)} value(s) are "auto", but this setup launches DeepSpeed directly, which does not fill '
            '"auto": ' + "; ".join(parts) + ".",
            evidence=evidence,
            fixes=[fix],
            severity=Severity.ERROR if crash else Severity.WARNING,
        )
    else:
        yield RULE.finding(
            f'{len(keys)} value(s) are "auto" ({shown}). That is right with HF Trainer, accelerate or XTuner, '
            "which fill them; with a plain deepspeed.initialize script DeepSpeed receives the strings and fails. "
            "Give the training arguments (or --framework) to check the pair.",
            evidence=evidence[:1],
            fixes=[fix],
            severity=Severity.INFO,
        )


RULE = Rule(
    code="DS004",
    name="deepspeed.auto-without-hf-integration",
    title='"auto" values that no framework will fill',
    severity=Severity.ERROR,
    references=("deepspeedai/DeepSpeed#1270", "huggingface/accelerate#1644"),
    check=check,
)
