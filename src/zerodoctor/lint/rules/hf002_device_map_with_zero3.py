"""HF002 hf.device-map-with-zero3: a `device_map` together with ZeRO-3.

Why it matters: ZeRO-3 places parameters itself (zero.Init partitions them at load). transformers refuses the
combination: "ValueError: DeepSpeed Zero-3 is not compatible with `low_cpu_mem_usage=True` or with passing a
`device_map`." (newer: "...with passing a `device_map`."). A `device_map="auto"` also turns training into
naive pipeline placement, which some QLoRA guides recommend instead of fixing ZeRO-3.

Example (fails): `model_init_kwargs: {device_map: auto}` with a ZeRO-3 DeepSpeed config.
Use instead: no `device_map` under ZeRO-3 (the fix removes it; safe).
"""

from __future__ import annotations

from collections.abc import Iterator

from zerodoctor.findings import Finding, Fix, Severity
from zerodoctor.lint.rule import Rule
from zerodoctor.setup.run import RunDescription


def check(run: RunDescription) -> Iterator[Finding]:
    setup = run.files
    ev = setup.device_map_evidence
    if ev is None or setup.zero_stage != 3:
        return
    yield RULE.finding(
        f"{ev.key} is set while ZeRO-3 is on: transformers raises 'DeepSpeed Zero-3 is not compatible with passing a "
        "`device_map`' when the model loads.",
        evidence=[ev, setup.ds_evidence("zero_optimization.stage")],
        fixes=[
            Fix(
                "Remove device_map (and low_cpu_mem_usage); zero.Init places the parameters",
                target="hf",
                patch={ev.key or "device_map": None},
            )
        ],
    )


RULE = Rule(
    code="HF002",
    name="hf.device-map-with-zero3",
    title="device_map with ZeRO-3",
    severity=Severity.ERROR,
    references=("hiyouga/LlamaFactory#199", "hiyouga/LlamaFactory#3949", "huggingface/peft#306"),
    check=check,
    fix_safety="safe",
)
