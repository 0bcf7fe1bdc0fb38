"""What HF Trainer's `save_model` holds on rank 0's host when a LoRA/QLoRA (PEFT) run saves under ZeRO-3, by
transformers version.

Read in source (every constant names its file at the version it was read in) and measured on the real DeepSpeed
engine on CPU (tests/plan/test_zero3_peft_save_engine.py). Pure arithmetic: no torch, transformers or DeepSpeed
import.

Two save paths:
- **transformers 4.x** (read in 4.57.6): `Trainer.save_model` under DeepSpeed calls
  `accelerator.get_state_dict(self.deepspeed)`, which under ZeRO-3 with `stage3_gather_16bit_weights_on_model_save`
  calls `engine._zero3_consolidated_16bit_state_dict()` -- every parameter, the frozen base included, gathered layer
  by layer and copied to rank 0's host (`param.detach().cpu()`); only then does `PeftModel.save_pretrained` pick the
  adapter keys out of it. A LoRA run of a 32B model holds the whole 16-bit model (~61 GiB) on rank 0's host at every
  save. With the flag false, `get_state_dict` raises ValueError and the Trainer falls back to
  `engine.save_checkpoint` (the ZeRO shards).
- **transformers 5.18.0 and later** (read in 5.18.0 and 5.23.0): a PEFT model under ZeRO-3 takes
  `self.deepspeed._zero3_consolidated_16bit_state_dict(exclude_frozen_parameters=True)` (DeepSpeed >= 0.13.2,
  deepspeedai/DeepSpeed#4999): only the trainable (adapter) weights reach the host, whatever the flag says.
  The first 5.x release with that branch is not pinned here (4.57.6 lacks it, 5.18.0 has it): releases between are
  charged the whole model, the larger case, as is an unknown version.
"""

from __future__ import annotations

from zerodoctor.versions import parse_version

TRANSFORMERS_PEFT_Z3_ADAPTERS_ONLY_FROM = (5, 18)
"""transformers trainer.py `save_model`, DeepSpeed branch: `if accept_exclude_frozen_parameters and
_is_peft_model(self.model) and zero3_sharding: state_dict =
self.deepspeed._zero3_consolidated_16bit_state_dict(exclude_frozen_parameters=True)`. Present in 5.18.0 and 5.23.0,
absent in 4.57.6 (`state_dict = self.accelerator.get_state_dict(self.deepspeed)` for every model); the release that
introduced it between the two is not pinned, so 5.0-5.17 are treated as 4.x (the larger host copy)."""

SOURCE_FULL_GATHER = (
    "transformers 4.57.6 trainer.py save_model (accelerator.get_state_dict(self.deepspeed) for a PEFT model too); "
    "accelerate accelerator.py get_state_dict (ZeRO-3: model._zero3_consolidated_16bit_state_dict()); "
    "deepspeed/runtime/engine.py _zero3_consolidated_16bit_state_dict (param.detach().cpu() on rank 0, frozen "
    "parameters included)"
)
SOURCE_ADAPTERS_ONLY = (
    "transformers 5.18.0 / 5.23.0 trainer.py save_model (_zero3_consolidated_16bit_state_dict("
    "exclude_frozen_parameters=True) for a PEFT model under ZeRO-3)"
)


def peft_z3_save_gathers_adapters_only(transformers_version: str | None) -> bool:
    """Whether HF Trainer saving a PEFT model under ZeRO-3 gathers only the trainable weights to rank 0's host.
    False for 4.x, for 5.0-5.17 (not read) and for an unknown version: the whole 16-bit model is gathered."""
    v = parse_version(transformers_version)
    return v is not None and tuple(v.release) >= TRANSFORMERS_PEFT_Z3_ADAPTERS_ONLY_FROM
