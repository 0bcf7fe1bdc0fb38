"""What a framework's k-bit preparation leaves in fp32 in a QLoRA run without DeepSpeed or FSDP.

PEFT's `prepare_model_for_kbit_training` (peft utils/other.py, 0.4.0 to 0.21.2) casts every fp16/bf16 parameter that
is not a bitsandbytes `Params4bit` to fp32: the embedding, every norm, the unquantised `lm_head`, the biases (and the
fused MoE experts of transformers 5, which are not `nn.Linear`). What follows from it, each step read in source:

* the fp32 embedding returns fp32 hidden states, and an fp32 norm weight makes the norm's output fp32
  (transformers `LlamaRMSNorm.forward`: `self.weight * hidden_states.to(input_dtype)`; Qwen2 and Mistral copy it);
* bitsandbytes' `Linear4bit.forward` casts its input to the compute dtype for the matmul and returns the result in
  the INPUT's dtype (`inp_dtype = x.dtype` ... `.to(inp_dtype)`, 0.41 to 0.50), so every projection fed by an fp32
  norm returns fp32, and the residual additions promote the whole residual stream to fp32. `MatMul4Bit` itself saves
  no activation (`ctx.tensors = (None, B)`);
* under gradient checkpointing every decoder layer keeps its fp32 input instead of a 16-bit one, and the layer
  recomputed in backward works on fp32 tensors;
* the HF Trainer runs a bf16/fp16 model without DeepSpeed under `torch.autocast` (accelerate `prepare_model`): the
  `lm_head` matmul runs in 16-bit, so the logits stay 16-bit, but autocast casts the fp32 head weight to a 16-bit copy
  that the matmul saves for the hidden states' gradient until the head's backward.

Where it does not apply: DeepSpeed casts every floating parameter back to the bf16/fp16 dtype when the engine is
built (runtime/engine.py `_configure_distributed_model` -> `_cast_module_mixed_precision`; `module.bfloat16()` in
older releases), and the FSDP-QLoRA setups skip the preparation (TRL `is_sharded_qlora`; FSDP flattens one dtype per
unit). PEFT skips the cast for GPTQ models (`is_gptq_quantized`, from 0.6.0).

Which frameworks call it (read at their releases): TRL's SFTTrainer/DPOTrainer from 0.7 to 0.24 call PEFT's, and with
`bf16=True` then `peft_module_casting_to_bf16`, which puts `lm_head` and `embed_tokens` back in bf16 and keeps the
norms in fp32; TRL 0.25's own version upcasts only the norms, SFTTrainer from 0.26 none. XTuner's
`SupervisedFinetune._prepare_for_lora` calls PEFT's (0.1.0 to 1.0.1). LLaMA-Factory never does (its own
`prepare_model_for_training` upcasts norms only with `upcast_layernorm`, default off); ms-swift never calls it (1.5
to 4.5). The modes: "peft" (everything not quantised), "norms" (the norms, and the biases that bitsandbytes casts to
their fp32 input), "none".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from zerodoctor.errors import PlanError

if TYPE_CHECKING:
    from zerodoctor.plan.activations import ActivationEstimate
    from zerodoctor.plan.inputs import PlanInputs, Training

KBIT_PREP_MODES = ("peft", "norms", "none")
"""`Training.kbit_preparation` values (module docstring); None = what the run's framework does (`FRAMEWORK_MODE`)."""

MODE_TITLES = {
    "peft": "PEFT's prepare_model_for_kbit_training",
    "norms": "fp32 norms (TRL's bf16 recast, LLaMA-Factory's upcast_layernorm)",
}
"""What a user reads for a preparation mode."""
LAUNCHER_TITLES = {"hf": "HF Trainer", "accelerate": "an accelerate loop", "xtuner": "XTuner"}

FRAMEWORK_MODE = {
    "hf": "peft",
    "accelerate": "peft",
    "xtuner": "peft",
    "llamafactory": "none",
    "deepspeed": "none",
}
"""The k-bit preparation each framework applies to a QLoRA model. "hf"/"accelerate": an HF Trainer script written as
PEFT's and transformers' QLoRA guides write it (`prepare_model_for_kbit_training` before `get_peft_model`); a TRL
script with bf16 is "norms" (`Training.kbit_preparation` says so where known)."""

PEFT_SOURCE = (
    "peft utils/other.py prepare_model_for_kbit_training (`param.data = param.data.to(torch.float32)` for every "
    "fp16/bf16 parameter; Params4bit skipped from 0.10.0, GPTQ models from 0.6.0; read 0.4.0-0.21.2)"
)
NORMS_SOURCE = (
    "trl trainer/sft_trainer.py + utils.py peft_module_casting_to_bf16 (0.8-0.24, bf16: lm_head/embed_tokens back to "
    "bf16, norms fp32); trl models/utils.py prepare_model_for_kbit_training (0.25: norms only); "
    "bitsandbytes Linear4bit.forward (`bias.data = bias.data.to(x.dtype)`)"
)
STREAM_SOURCE = (
    "transformers models/llama/modeling_llama.py LlamaRMSNorm.forward (`self.weight * hidden_states.to(input_dtype)`); "
    "bitsandbytes nn/modules.py Linear4bit.forward (`.to(inp_dtype)`, 0.41-0.50); autograd/_functions.py MatMul4Bit "
    "(saves no activation)"
)
HEAD_COPY_SOURCE = (
    "accelerate accelerator.py prepare_model (model.forward under torch.autocast for bf16/fp16 without DeepSpeed); "
    "autocast casts the fp32 lm_head weight for F.linear and mm keeps the 16-bit copy for the input gradient"
)


@dataclass(frozen=True)
class KbitPreparation:
    """What the preparation changes in one run: `upcast_params` elements held in fp32 instead of 16-bit,
    `fp32_layers` decoder layers whose input (the residual stream) is fp32, `head_copy` elements of the fp32 output
    layer that autocast copies to 16-bit and keeps for backward. `why` says how the mode was decided."""

    mode: str
    why: str
    upcast_params: int
    fp32_layers: int
    head_copy: int


def _mode(inputs: PlanInputs, t: Training) -> tuple[str, str]:
    if t.kbit_preparation is not None:
        if t.kbit_preparation not in KBIT_PREP_MODES:
            raise PlanError(
                f"k-bit preparation {t.kbit_preparation!r} is not one of {', '.join(KBIT_PREP_MODES)}",
                hint="peft (prepare_model_for_kbit_training), norms (TRL with bf16) or none",
            )
        return t.kbit_preparation, "as the run's arguments choose"
    if inputs.framework is None:
        # No framework (PlanInputs built directly: a library call, a litgpt/torchtune run of the published-runs
        # benchmark; the CLI's inputs_from_run names "hf" instead): the preparation is the framework's choice, not the
        # model's (litgpt, torchtune, unsloth, ms-swift and LLaMA-Factory never call PEFT's), so none is assumed.
        return "none", "no framework named"
    who = LAUNCHER_TITLES.get(inputs.framework, inputs.framework)
    return FRAMEWORK_MODE.get(inputs.framework, "none"), (
        f"what {who} does by default; pass --framework if another launcher prepares the model"
    )


def kbit_preparation(
    inputs: PlanInputs, t: Training, *, plain: bool, unquantised: int
) -> KbitPreparation | None:
    """The k-bit preparation of a QLoRA run that keeps its upcasts, or None: `plain` = no DeepSpeed and no FSDP
    (`phases.without_engine`), `unquantised` = the parameters the 4-bit base leaves unquantised
    (`phases.qlora_unquantised_params`)."""
    if t.method != "qlora" or t.precision == "fp32" or not plain:
        return None
    mode, why = _mode(inputs, t)
    if mode == "none" or (mode == "peft" and t.quant_method == "gptq"):
        return None
    spec = inputs.model
    p = spec.params
    head = next((m for m in spec.modules if m.name in ("lm_head", "output")), None)
    embed_head = sum(m.total for m in spec.modules if m.kind == "embedding") + (head.total if head else 0)
    if mode == "peft":
        # The fp32 embedding output is layer 0's input; the head is fp32 and copied by autocast.
        head_numel = head.numel if head is not None else p.vocab_size * p.hidden_size
        return KbitPreparation(mode, why, unquantised, p.num_layers, head_numel)
    # norms: the embedding stays 16-bit, so layer 0's input is 16-bit; its first norm makes the rest fp32. Every
    # unquantised weight but the embedding and the head stays fp32 after TRL 0.8-0.24's recast; TRL 0.25 and
    # LLaMA-Factory's upcast_layernorm cast only the norms, so fused MoE experts (unquantised in transformers 5) are
    # over-counted for them.
    return KbitPreparation(mode, why, max(unquantised - embed_head, 0), max(p.num_layers - 1, 0), 0)


@dataclass(frozen=True)
class StreamCost:
    """What the fp32 residual stream adds to the activation peak (`stream_cost`): `saved` = the layers' extra saved
    bytes, `recompute` = the recomputed layer's (and its gradients') extra in backward, `head_copy` = autocast's 16-bit
    head copy held from the head's forward to its backward, `rise` = the resulting rise of the activation peak."""

    saved: int
    recompute: int
    head_copy: int
    rise: int


def stream_cost(
    act16: ActivationEstimate,
    act32: ActivationEstimate,
    prep: KbitPreparation,
    *,
    checkpointing: bool,
    dtype_bytes: int,
) -> StreamCost:
    """The rise of the activation peak when `prep.fp32_layers` layers see an fp32 residual stream: `act16` is the
    run's estimate, `act32` the same run as an fp32 model (every layer tensor in fp32 -- an upper bound for the
    recomputed layer, whose matmuls and SDPA autocast runs in 16-bit). Checkpointed, a layer keeps only its input;
    without checkpointing, what the fp32 model saves per layer."""
    layers = prep.fp32_layers
    per_layer = (
        act32.checkpointed_input - act16.checkpointed_input
        if checkpointing
        else act32.per_layer_saved - act16.per_layer_saved
    )
    saved = max(per_layer, 0) * layers
    recompute = max(act32.backward_transient - act16.backward_transient, 0) if layers else 0
    head_copy = prep.head_copy * dtype_bytes
    peak = max(act16.at_loss + saved + head_copy, act16.in_backward + saved + recompute)
    return StreamCost(saved, recompute, head_copy, max(peak - act16.peak, 0))
