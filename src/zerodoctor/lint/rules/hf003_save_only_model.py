"""HF003 hf.save-only-model: what `save_only_model` really skips, and what each checkpoint costs.

Why it matters: HF Trainer's `_save_checkpoint` writes the DeepSpeed optimizer state (fp32 master weights and
Adam moments, about 12 bytes per trainable parameter: 2.8 TB for a 236B full fine-tune) unless
`save_only_model: true` (hiyouga/LlamaFactory#7532: a 236B run on 48 GPUs; DeepSpeed#6598: a 90 GB optimizer file for 8B).
But under ZeRO-3 with `stage3_gather_16bit_weights_on_model_save: false`, `save_model` itself falls back to
`save_checkpoint`, so the optimizer state is written anyway and `save_only_model` saves nothing
(transformers trainer.py `save_model`; docs/framework-facts.md a). Trade-off: without optimizer state a run
cannot resume exactly.

Fixes: `save_only_model: true` together with the 16-bit gather for large full fine-tunes (mind rank-0 host RAM,
DS008); keep optimizer checkpoints only when you need exact resume.
"""

from __future__ import annotations

from collections.abc import Iterator

from zerodoctor.findings import Finding, Fix, Severity
from zerodoctor.lint.rule import Rule
from zerodoctor.lint.rules._common import gib, truthy
from zerodoctor.setup.run import RunDescription

GATHER = "zero_optimization.stage3_gather_16bit_weights_on_model_save"
OPTIMIZER_STATE_BYTES = 12  # fp32 master 4 + Adam exp_avg 4 + exp_avg_sq 4, per trainable parameter
LARGE_FULL_FT = 100e9  # above this a full fine-tune's optimizer state is terabytes per checkpoint (hiyouga/LlamaFactory#7532)


def check(run: RunDescription) -> Iterator[Finding]:
    setup = run.files
    if setup.args_doc is None or setup.ds_written is None:
        return
    save_only = truthy(setup.args.get("save_only_model")) is True
    if str(setup.args.get("save_strategy", "steps")).lower() == "no":
        return
    if save_only and setup.zero_stage == 3 and truthy(setup.ds_flat().get(GATHER)) is False:
        yield RULE.finding(
            "save_only_model is true, but with ZeRO-3 and stage3_gather_16bit_weights_on_model_save false HF Trainer "
            "saves the model through DeepSpeed's save_checkpoint, which writes the optimizer state anyway: "
            "checkpoints stay full size.",
            evidence=[setup.arg_evidence("save_only_model"), setup.ds_evidence(GATHER)],
            fixes=[Fix("Also gather 16-bit weights at save", target="deepspeed", patch={GATHER: True})],
            severity=Severity.WARNING,
        )
    # Only a full fine-tune's trainable count is known here (freeze/LoRA train a part whose size we do not read).
    if save_only or setup.method != "full" or setup.total_params is None:
        return
    opt_bytes = setup.total_params * OPTIMIZER_STATE_BYTES
    large = setup.total_params >= LARGE_FULL_FT
    yield RULE.finding(
        f"Every checkpoint writes the optimizer state: about {gib(opt_bytes)} ({OPTIMIZER_STATE_BYTES} B x "
        f"{setup.total_params / 1e9:,.1f}B parameters) plus the weights, from every rank at once."
        + (
            " At this size saves are slow, fill disks and can stall other ranks into an NCCL timeout."
            if large
            else ""
        )
        + " save_only_model: true skips it (you lose exact resume).",
        evidence=[setup.arg_evidence("save_only_model")],
        fixes=[Fix("Set save_only_model: true", target="hf", patch={"save_only_model": True})],
        severity=Severity.WARNING if large else Severity.INFO,
    )


RULE = Rule(
    code="HF003",
    name="hf.save-only-model",
    title="Checkpoint size and what save_only_model skips",
    severity=Severity.WARNING,
    references=("hiyouga/LlamaFactory#7532", "deepspeedai/DeepSpeed#6598", "deepspeedai/DeepSpeed#3820"),
    check=check,
    fix_safety="unsafe",
)
