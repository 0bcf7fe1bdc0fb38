"""DS005 deepspeed.offload-settings: offload blocks that DeepSpeed ignores or cannot run.

Why it matters: `offload_param` only exists in ZeRO-3 (only `DeepSpeedZeRoOffload` / the stage-3 optimizer
read it; the stage-1/2 optimizer in `runtime/engine.py` is built without it), so with stage 1 or 2 the
parameters stay whole on every GPU although the file says they are offloaded; likewise stage 0 builds no ZeRO
optimizer and ignores `offload_optimizer`. `device: nvme` needs an `nvme_path` for its swap files. A partial
optimizer offload (`ratio` < 1) is asserted to be ZeRO-3 only ("Partial offloading only supported for ZeRO
Stage 3.", `runtime/zero/config.py`).

What is *not* a problem: offloading parameters without the optimizer, or the optimizer without parameters.
Both are valid, and `offload_param: cpu` with `offload_optimizer: none` is the documented workaround for the
DeepSpeed 0.14.1/0.14.2 clip-grad bug. (Some write-ups of that bug suggest checking that the two devices
"agree"; the bug is in the clip coefficient, deepspeedai/DeepSpeed#5461, and unrelated to that.)

Example (silently not offloaded):

    {"zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}}

Use instead: ZeRO-3 if parameters must leave the GPU, or drop the block. No automatic fix.
"""

from __future__ import annotations

from collections.abc import Iterator

from zerodoctor.findings import Finding, Fix, Severity
from zerodoctor.lint.rule import Rule
from zerodoctor.lint.rules._common import as_number, offload_device
from zerodoctor.setup.run import RunDescription


def check(run: RunDescription) -> Iterator[Finding]:
    setup = run.files
    if setup.ds_written is None:
        return
    stage = setup.zero_stage
    flat = setup.ds_flat()
    param, opt = offload_device(setup, "param"), offload_device(setup, "optimizer")
    if stage is not None and stage < 3 and param != "none":
        yield RULE.finding(
            f"offload_param.device is {param!r} but ZeRO stage is {stage}: only ZeRO-3 offloads parameters, so "
            "DeepSpeed ignores this block and every GPU keeps the whole 16-bit model.",
            evidence=[
                setup.ds_evidence("zero_optimization.offload_param.device"),
                setup.ds_evidence("zero_optimization.stage"),
            ],
            fixes=[
                Fix(
                    "Use ZeRO stage 3 to offload parameters",
                    target="deepspeed",
                    patch={"zero_optimization.stage": 3},
                ),
                Fix(
                    "Or remove offload_param",
                    target="deepspeed",
                    patch={"zero_optimization.offload_param": None},
                ),
            ],
            severity=Severity.WARNING,
        )
    if stage == 0 and opt != "none":
        yield RULE.finding(
            f"offload_optimizer.device is {opt!r} but ZeRO stage is 0: stage 0 builds no ZeRO optimizer, so nothing "
            "is offloaded and the optimizer states stay on the GPU.",
            evidence=[
                setup.ds_evidence("zero_optimization.offload_optimizer.device"),
                setup.ds_evidence("zero_optimization.stage"),
            ],
            fixes=[
                Fix(
                    "Use ZeRO stage 1, 2 or 3 with optimizer offload",
                    target="deepspeed",
                    patch={"zero_optimization.stage": 2},
                )
            ],
            severity=Severity.WARNING,
        )
    for part, dev in (("optimizer", opt), ("param", param)):
        if dev == "nvme" and not flat.get(f"zero_optimization.offload_{part}.nvme_path"):
            yield RULE.finding(
                f'offload_{part}.device is "nvme" without an nvme_path: DeepSpeed has nowhere to put its swap '
                "files and fails when it creates the swapper.",
                evidence=[setup.ds_evidence(f"zero_optimization.offload_{part}.device")],
                fixes=[Fix(f"Set offload_{part}.nvme_path to a folder on a local NVMe drive")],
            )
    ratio = as_number(flat.get("zero_optimization.offload_optimizer.ratio"))
    # DeepSpeed asserts this whenever the offload_optimizer block exists, whatever its device.
    if ratio is not None and ratio < 1.0 and stage is not None and stage != 3:
        yield RULE.finding(
            f"offload_optimizer.ratio is {ratio} (partial offload) with ZeRO stage {stage}; DeepSpeed asserts "
            "'Partial offloading only supported for ZeRO Stage 3.'",
            evidence=[setup.ds_evidence("zero_optimization.offload_optimizer.ratio")],
            fixes=[
                Fix(
                    "Remove ratio, or use ZeRO-3",
                    target="deepspeed",
                    patch={"zero_optimization.offload_optimizer.ratio": None},
                )
            ],
        )


RULE = Rule(
    code="DS005",
    name="deepspeed.offload-settings",
    title="Offload settings DeepSpeed ignores or cannot run",
    severity=Severity.ERROR,
    references=(
        "deepspeedai/DeepSpeed:deepspeed/runtime/engine.py",
        "deepspeedai/DeepSpeed:deepspeed/runtime/zero/config.py",
    ),
    check=check,
)
