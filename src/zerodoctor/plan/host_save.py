"""What HF Trainer's `save_model` holds on rank 0's host when a LoRA/QLoRA (PEFT) run saves under ZeRO-3, by
transformers version.

Read in source (every constant names its file at the version it was read in) and measured on the real DeepSpeed
engine on CPU (tests/plan/test_host_save_p24.py, tests/plan/zero3_peft_save_job.py). Pure arithmetic: no torch,
transformers or DeepSpeed import.

Two save paths:
- **transformers 4.x** (read in 4.57.6): `Trainer.save_model` under DeepSpeed calls
  `accelerator.get_state_dict(self.deepspeed)`, which under ZeRO-3 with `stage3_gather_16bit_weights_on_model_save`
  calls `engine._zero3_consolidated_16bit_state_dict()` -- every parameter, the frozen base included, gathered layer
  by layer and copied to rank 0's host (`param.detach().cpu()`); only then does `PeftModel.save_pretrained` pick the
  adapter keys out of it. A LoRA run of a 32B model holds the whole 16-bit model (~61 GiB) on rank 0's host at every
  save. With the flag false, `get_state_dict` raises ValueError and the Trainer writes `self._save(output_dir,
  state_dict={})` -- for a PEFT model an EMPTY adapter file (`remove_dummy_checkpoint` removes only the model weight
  files; huggingface/trl#4416, huggingface/peft#2892) -- then the ZeRO shards (`engine.save_checkpoint`), from
  which zero_to_fp32.py recovers the weights.
- **transformers 5.0 and later** (read in 5.17.0, 5.18.0 and 5.23.0; 5.0.0 per huggingface/trl#4416, where a TRL
  maintainer names huggingface/transformers#41416, released in 5.0.0): a PEFT model under ZeRO-3 takes
  `self.deepspeed._zero3_consolidated_16bit_state_dict(exclude_frozen_parameters=True)` (DeepSpeed >= 0.13.2,
  deepspeedai/DeepSpeed#4999): only the trainable (adapter) weights reach the host, whatever the flag says.
  An unknown version is charged the 4.x whole-model gather, the larger case.
"""

from __future__ import annotations

from zerodoctor.versions import in_range, parse_version

TRANSFORMERS_PEFT_Z3_ADAPTERS_ONLY_FROM = "5.0"
"""transformers trainer.py `save_model`, DeepSpeed branch: `if accept_exclude_frozen_parameters and
_is_peft_model(self.model) and zero3_sharding: state_dict =
self.deepspeed._zero3_consolidated_16bit_state_dict(exclude_frozen_parameters=True)`. Present in 5.17.0, 5.18.0 and
5.23.0, absent in 4.57.6 (`state_dict = self.accelerator.get_state_dict(self.deepspeed)` for every model); introduced
by huggingface/transformers#41416, released in 5.0.0 (huggingface/trl#4416). A 5.0 pre-release counts as 4.x."""

SOURCE_FULL_GATHER = (
    "transformers 4.57.6 trainer.py save_model (accelerator.get_state_dict(self.deepspeed) for a PEFT model too); "
    "accelerate accelerator.py get_state_dict (ZeRO-3: model._zero3_consolidated_16bit_state_dict()); "
    "deepspeed/runtime/engine.py _zero3_consolidated_16bit_state_dict (param.detach().cpu() on rank 0, frozen "
    "parameters included)"
)
SOURCE_ADAPTERS_ONLY = (
    "transformers 5.17.0 / 5.18.0 / 5.23.0 trainer.py save_model (_zero3_consolidated_16bit_state_dict("
    "exclude_frozen_parameters=True) for a PEFT model under ZeRO-3)"
)


def peft_z3_save_gathers_adapters_only(transformers_version: str | None) -> bool:
    """Whether HF Trainer saving a PEFT model under ZeRO-3 gathers only the trainable weights to rank 0's host.
    False for 4.x and for an unknown version: the whole 16-bit model is gathered -- and with
    `stage3_gather_16bit_weights_on_model_save: false` the adapter file written is empty."""
    v = parse_version(transformers_version)
    return v is not None and in_range(v, introduced=TRANSFORMERS_PEFT_Z3_ADAPTERS_ONLY_FROM)


HF_TRAINER_FRAMEWORKS = ("hf", "llamafactory")
"""Frameworks whose checkpoints go through `Trainer.save_model` (LLaMA-Factory's trainers subclass it)."""


def trainer_peft_z3_gathers_whole_model(
    framework: str | None, is_peft: bool, stage: int, transformers_version: str | None
) -> bool:
    """HF Trainer saving a PEFT model under ZeRO-3 with transformers < 5.0 or an unknown version: the save gathers
    the whole 16-bit model to rank 0's host (16-bit gather on) or writes an empty adapter file (gather off), so
    turning the gather off is never the way out of its save spike."""
    return (
        framework in HF_TRAINER_FRAMEWORKS
        and is_peft
        and stage == 3
        and not peft_z3_save_gathers_adapters_only(transformers_version)
    )
