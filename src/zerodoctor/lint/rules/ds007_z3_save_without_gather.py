"""DS007 deepspeed.z3-save-without-16bit-gather: ZeRO-3 saves that do not produce usable weights.

Why it matters: under ZeRO-3 every rank holds only a shard of each parameter. With
`stage3_gather_16bit_weights_on_model_save: false` (DeepSpeed's default; accelerate `zero3_save_16bit_model:
false`), HF Trainer's `save_model` cannot build a state dict and saves a full DeepSpeed checkpoint instead
("stage3_gather_16bit_weights_on_model_save=false. Saving the full checkpoint instead, use zero_to_fp32.py to
recover weights"): the output folder has no `model.safetensors`, and `from_pretrained` fails or loads
`torch.Size([0])` tensors until you run `zero_to_fp32.py` (host RAM about 4 bytes per parameter, one process).
It also means `save_only_model` does not skip optimizer states (see HF002).

Example (weights not loadable after training):

    {"zero_optimization": {"stage": 3}}

Not reported for LoRA/QLoRA through HF Trainer or LLaMA-Factory on transformers >= 5.0: under ZeRO-3,
Trainer.save_model gathers the trainable adapter weights itself
(`_zero3_consolidated_16bit_state_dict(exclude_frozen_parameters=True)`, read in 5.17.0-5.23.0), whatever this
flag says. On 4.x (read in 4.57.6) or an unknown version it is worse than for a full model: the Trainer first writes
`_save(output_dir, state_dict={})`, an EMPTY adapter_model.safetensors (huggingface/trl#4416,
huggingface/peft#2892), so the fix is the gather on or transformers >= 5.0.

Use instead: `"stage3_gather_16bit_weights_on_model_save": true` (the fix, safe for correctness; for very large
models weigh rank-0 host RAM, DS008), or keep it off on purpose and plan the zero_to_fp32 conversion.
When the model and node 0's host RAM are known and the gather would not fit (the same arithmetic as DS008 and
`zerodoctor plan`, which then emits the config with the gather off), this is reported as information that
keeping it off is right, with only the conversion as the fix.
"""

from __future__ import annotations

from collections.abc import Iterator

from zerodoctor.findings import Finding, Fix, Severity
from zerodoctor.lint.rule import Rule
from zerodoctor.lint.rules._common import (
    HOST_HEADROOM,
    gib,
    save_gather,
    trainer_peft_save,
    transformers_shown,
    truthy,
)
from zerodoctor.setup.run import RunDescription

KEY = "zero_optimization.stage3_gather_16bit_weights_on_model_save"


def check(run: RunDescription) -> Iterator[Finding]:
    setup = run.files
    peft_save = trainer_peft_save(run)
    if setup.ds_written is None or setup.zero_stage != 3 or peft_save == "adapters":
        return
    gather = truthy(setup.ds_flat().get(KEY))
    if gather is not False:
        return
    explicit = setup.ds_written_value(KEY) is not None
    where = setup.ds_evidence(KEY) if explicit else setup.ds_evidence("zero_optimization")
    how = "is false" if explicit else "is not set (DeepSpeed's default is false)"
    cost = save_gather(run) if peft_save is None else None
    if cost is not None and cost.fits is False and cost.ram:
        # Turning the gather on would not fit node 0 (what DS008 and the planner say): keeping it off is the
        # right choice here, so this is information, and the only fix is the offline conversion.
        yield RULE.finding(
            f"ZeRO-3 with stage3_gather_16bit_weights_on_model_save {how}: saves write a sharded DeepSpeed "
            f"checkpoint, not model weights. Keep it so: gathering the 16-bit model at save would put about "
            f"{gib(cost.spike)} on node 0's host on top of about {gib(cost.held)} it already holds, more than "
            f"{HOST_HEADROOM:.0%} of its {gib(cost.ram)}. Convert the final checkpoint offline with zero_to_fp32.py.",
            evidence=[where],
            fixes=[Fix("Convert afterwards: python zero_to_fp32.py <checkpoint_dir> <output_dir>")],
            severity=Severity.INFO,
        )
        return
    if peft_save is not None:
        message = (
            f"ZeRO-3 with stage3_gather_16bit_weights_on_model_save {how}, a LoRA/QLoRA run saved by HF Trainer "
            f"on {transformers_shown(run)}: before transformers 5.0, save_model then writes an EMPTY "
            "adapter_model.safetensors (`_save(state_dict={})`) beside the ZeRO shards, and the adapters come "
            "back only through zero_to_fp32.py. transformers 5.0 and later save the adapters whatever the flag."
        )
        other = "Or upgrade transformers to 5.0 or later (its save gathers only the adapters)"
    else:
        message = (
            f"ZeRO-3 with stage3_gather_16bit_weights_on_model_save {how}: saving the model writes a sharded "
            "DeepSpeed checkpoint instead of model weights, so the result cannot be loaded with from_pretrained "
            "until zero_to_fp32.py converts it (about 4 bytes of host RAM per parameter)."
        )
        other = "Or keep it and convert afterwards: python zero_to_fp32.py <checkpoint_dir> <output_dir>"
    yield RULE.finding(
        message,
        evidence=[where],
        fixes=[Fix("Gather the 16-bit weights at save", target="deepspeed", patch={KEY: True}), Fix(other)],
        severity=Severity.WARNING,
    )


RULE = Rule(
    code="DS007",
    name="deepspeed.z3-save-without-16bit-gather",
    title="ZeRO-3 save without 16-bit gather: weights need zero_to_fp32",
    severity=Severity.WARNING,
    references=(
        "huggingface/transformers#20082",
        "deepspeedai/DeepSpeed#2413",
        "hiyouga/LlamaFactory#253",
        "huggingface/peft#453",
        "huggingface/trl#4416",
    ),
    check=check,
    fix_safety="safe",
)
