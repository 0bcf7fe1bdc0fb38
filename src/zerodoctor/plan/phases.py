"""Memory per phase of a ZeRO fine-tuning run, for one strategy: load, first optimizer step, steady step, save.

Per GPU the sum of named items: model states (`model_states.model_state_components`), ZeRO-3 gathered
parameters and prefetch, activations and logits/loss (`activations.activation_bytes`), bitsandbytes
dequantisation temporaries, the framework reserve. Per node host RAM: offloaded model states x local
ranks with PyTorch's pinned-memory rounding, a per-process baseline, model-loading transients and, on
node 0, the checkpoint-save spike. Every constant is named and cited; the formulas are docs/memory-model.md

The phases:

* ``load``: from `from_pretrained` to the end of `deepspeed.initialize` (no optimizer state yet).
* ``first_step``: the first optimizer step, at micro-step `gradient_accumulation_steps - 1`: the lazily
  allocated optimizer state appears, plus the step's transients (docs/known-failures.md).
* ``steady``: forward/backward of a later step, with all model states resident.
* ``save``: a checkpoint save (HF Trainer `_save_checkpoint`, docs/memory-model.md).

Pure arithmetic: no torch, transformers or DeepSpeed import.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field, replace
from typing import Any

from zerodoctor.models.spec import LINEAR, ModuleShape, is_output_layer, with_transformers_layout
from zerodoctor.plan import host_load as hl
from zerodoctor.plan import host_save as hs
from zerodoctor.plan import kbit_prep as kbit
from zerodoctor.plan import model_states as ms
from zerodoctor.plan.activations import (
    NORM_HEAD_SOURCE,
    ActivationEstimate,
    EvalForward,
    activation_bytes,
    eval_forward_bytes,
    loss_shift_for,
    vision_activation_bytes,
)
from zerodoctor.plan.cce import CCE_PATCH_TYPES, CCE_SOURCE, CutCrossEntropy
from zerodoctor.plan.inputs import GIB, Cluster, PlanInputs, Training, ZeroSettings
from zerodoctor.plan.kbit_prep import KbitPreparation, kbit_preparation
from zerodoctor.plan.liger import (
    LIGER_CONFIG_KEYS,
    LIGER_SOURCE,
    NORM_SWIGLU_SOURCE,
    TRANSFORMERS_PATCHES_PEFT_FROM,
    LigerKernels,
    liger_kernels,
    trainer_patches_peft_model,
)
from zerodoctor.versions import in_range, parse_version

PHASES = ("load", "first_step", "steady", "eval", "save")
"""The phases a plan can have; "eval" only when the run evaluates (`Training.eval_micro_batch`)."""
PHASE_TITLES = {
    "load": "load",
    "first_step": "first optimizer step",
    "steady": "steady step",
    "eval": "evaluation",
    "save": "checkpoint save",
}

CUDA_CONTEXT_BYTES = int(1.3 * GIB)
"""Per process, outside PyTorch's allocator: the CUDA context, loaded kernels (torch, cuBLAS, flash-attn)
and cuBLAS workspaces (docs/memory-model.md; gpu_poor budgets 650 MB for "cuda + other overhead" on one GPU).
Measured on an H100 (torch 2.11 + CUDA 13, DeepSpeed 0.19.8, one rank; benchmarks/plan_gpu.py, device total -
free - reserved at each phase's end): 0.98 GiB right after CUDA and NCCL init, before any tensor, then
1.16-1.76 GiB (median 1.30) once training has run: CUDA loads kernel images lazily (CUDA_MODULE_LOADING=LAZY,
the default since CUDA 11.7) and cuBLAS/cuBLASLt create their handles and workspaces at the first matmuls."""

NCCL_BUFFER_BYTES = int(0.5 * GIB)
"""Per process when the world has more than one rank: NCCL's communicator buffers (NCCL_BUFFSIZE 4 MiB per
channel and peer connection, several channels) plus the communicator's own device state (docs/memory-model.md).
Not calibrated on a GPU here."""

ALLOCATOR_SLACK_BYTES = int(1.5 * GIB)
"""PyTorch's caching allocator keeps freed blocks reserved, rounds large requests up to 2 MiB multiples and
splits 20 MiB / 2 MiB segments (c10/cuda/CUDACachingAllocator.cpp): what an OOM message calls "reserved by
PyTorch but unallocated" and what nvidia-smi counts on top of `max_memory_allocated`. With
`PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` segments grow in place and most of this slack goes away
(`EXPANDABLE_SLACK_BYTES`). Not calibrated on a GPU here."""

EXPANDABLE_SLACK_BYTES = int(0.5 * GIB)
"""The allocator slack with expandable segments: block rounding only."""

FRAMEWORK_RESERVE_BYTES = CUDA_CONTEXT_BYTES + NCCL_BUFFER_BYTES + ALLOCATOR_SLACK_BYTES
"""The three per-GPU items above for a multi-rank run (3.3 GiB): between gpu_poor's 650 MB single-GPU constant
and the ~5 GiB per GPU EleutherAI's calculator cannot explain on Megatron-DeepSpeed (docs/memory-model.md)."""

PER_RANK_HOST_BASELINE_BYTES = int(2.0 * GIB)
"""Host RSS of one process while the model loads, before any model state: Python + torch + CUDA context host side +
NCCL host buffers, "typically 1-3 GB RSS per rank" (docs/memory-model.md); a rank that loads nothing (FSDP
cpu_ram_efficient_loading) was read at 1506 MiB over from_pretrained (huggingface/blog ram-efficient-pytorch-fsdp.md)."""

PER_RANK_TRAIN_HOST_BASELINE_BYTES = int(3.8 * GIB)
"""Host RSS of one process once it trains, beside its model states: the load baseline plus what the first steps map
in (the CUDA kernels and cuBLAS workspaces the GPU work loads lazily, autograd, the dataloader's Python state). Read,
not derived: the PEFT README's bloomz-7b1 LoRA on one A100 without DeepSpeed (huggingface/peft 73d7224 README.md,
"CPU Peak Memory" 3.8 GB = psutil RSS sampled over the training epoch, when no model state is on the host) and
huggingface/peft#76 (the same script family: 4080 MiB). The smaller reading is taken."""

LOAD_SHARD_BYTES = 5 * 10**9
"""One safetensors shard being read: transformers' `save_pretrained(max_shard_size="5GB")` (docs/memory-model.md,
§12) -- what a streaming load holds per rank (QLoRA loads with a device_map, shard by shard)."""

BNB_BLOCKSIZE = 64
"""bitsandbytes 4-bit blocksize: one absmax per 64 weights (bitsandbytes functional.quantize_4bit)."""
BNB_NESTED_BLOCKSIZE = 256
"""Double quantisation: 8-bit absmax with one fp32 scale per 256 absmax values."""

DEFAULT_SAFETY_MARGIN = 0.10
"""A strategy fits when every phase stays under (1 - margin) of GPU memory and of host RAM."""


@dataclass(frozen=True)
class Item:
    """One named amount of memory in a phase. `bytes` is per GPU for GPU items and per node for host
    items (already multiplied by the local ranks that hold it); `detail` says how it was computed."""

    name: str
    bytes: int
    detail: str = ""
    source: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "bytes": self.bytes,
            "gib": round(self.bytes / GIB, 2),
            "detail": self.detail,
            "source": self.source,
        }


@dataclass(frozen=True)
class Phase:
    name: str
    gpu: tuple[Item, ...]
    host: tuple[Item, ...]
    note: str = ""

    @property
    def gpu_bytes(self) -> int:
        return sum(i.bytes for i in self.gpu)

    @property
    def host_bytes(self) -> int:
        return sum(i.bytes for i in self.host)

    @property
    def title(self) -> str:
        return PHASE_TITLES[self.name]

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "title": self.title,
            "gpu_bytes": self.gpu_bytes,
            "host_bytes_per_node": self.host_bytes,
            "gpu": [i.to_dict() for i in self.gpu],
            "host": [i.to_dict() for i in self.host],
            **({"note": self.note} if self.note else {}),
        }


@dataclass(frozen=True)
class Checkpoint:
    """Bytes a checkpoint writes, and what `save_only_model` really skips under these settings."""

    weights_bytes: int
    weights_kind: str
    optimizer_bytes: int
    save_only_model_skips_optimizer: bool
    explanation: str

    @property
    def full_bytes(self) -> int:
        return self.weights_bytes + self.optimizer_bytes

    @property
    def save_only_model_bytes(self) -> int:
        return self.weights_bytes + (0 if self.save_only_model_skips_optimizer else self.optimizer_bytes)

    def to_dict(self) -> dict[str, Any]:
        return {
            "weights_bytes": self.weights_bytes,
            "weights_kind": self.weights_kind,
            "optimizer_bytes": self.optimizer_bytes,
            "total_bytes": self.full_bytes,
            "total_bytes_with_save_only_model": self.save_only_model_bytes,
            "save_only_model_skips_optimizer": self.save_only_model_skips_optimizer,
            "explanation": self.explanation,
        }


@dataclass(frozen=True)
class StrategyPlan:
    """One strategy evaluated: phases, peaks, fit against the cluster, checkpoint sizes."""

    zero: ZeroSettings
    training: Training
    cluster: Cluster
    trainable_params: int
    frozen_params: int
    phases: tuple[Phase, ...]
    checkpoint: Checkpoint
    components: tuple[ms.Component, ...]
    activation_notes: tuple[str, ...] = ()
    margin: float = DEFAULT_SAFETY_MARGIN
    label: str = ""
    notes: tuple[str, ...] = field(default_factory=tuple)

    def phase(self, name: str) -> Phase:
        return next(p for p in self.phases if p.name == name)

    @property
    def name(self) -> str:
        method = self.training.method
        if method == "qlora" and self.training.quant_method in ("gptq", "awq"):
            method += f" ({self.training.quant_method} 4-bit base)"  # packed int32 weights: no quant_storage
        elif method == "qlora":
            method += f" (quant_storage {self.training.quant_storage})"
        return f"{self.label or self.zero.label} [{method}]"

    def gpu_peak(self, *, include_save: bool = True) -> tuple[int, str]:
        phases = [p for p in self.phases if include_save or p.name != "save"]
        best = max(phases, key=lambda p: p.gpu_bytes)
        return best.gpu_bytes, best.name

    def host_peak(self, *, include_save: bool = True) -> tuple[int, str]:
        phases = [p for p in self.phases if include_save or p.name != "save"]
        best = max(phases, key=lambda p: p.host_bytes)
        return best.host_bytes, best.name

    def gpu_limit(self) -> int:
        return int(self.cluster.gpu_memory_bytes * (1 - self.margin))

    def host_limit(self) -> int:
        return int(self.cluster.host_ram_bytes * (1 - self.margin))

    def failing_phases(self, *, with_margin: bool = True) -> list[tuple[str, str, int, int]]:
        """(phase, "gpu"|"host", need, capacity) for every phase that does not fit."""
        gpu_cap = self.gpu_limit() if with_margin else self.cluster.gpu_memory_bytes
        host_cap = self.host_limit() if with_margin else self.cluster.host_ram_bytes
        out = []
        for p in self.phases:
            if p.gpu_bytes > gpu_cap:
                out.append((p.name, "gpu", p.gpu_bytes, gpu_cap))
            if p.host_bytes > host_cap:
                out.append((p.name, "host", p.host_bytes, host_cap))
        return out

    @property
    def fits(self) -> bool:
        return not self.failing_phases()

    @property
    def fits_except_save(self) -> bool:
        return all(ph == "save" for ph, *_ in self.failing_phases())

    @property
    def status(self) -> str:
        if self.fits:
            # a plan that leaves part of the run out (online RL) is a lower bound: it cannot say "fits"
            return "lower bound" if self.training.lower_bound else "fits"
        if not self.failing_phases(with_margin=False):
            return "tight"
        if self.fits_except_save:
            return "save spike"
        return "does not fit"

    def to_dict(self) -> dict[str, Any]:
        gpu, gpu_phase = self.gpu_peak()
        host, host_phase = self.host_peak()
        return {
            "name": self.name,
            "strategy": "fsdp" if self.zero.fsdp is not None else "deepspeed",
            **({"fsdp": dataclasses.asdict(self.zero.fsdp)} if self.zero.fsdp is not None else {}),
            "zero_stage": self.zero.stage,
            "offload_optimizer": self.zero.offload_optimizer,
            "offload_param": self.zero.offload_param,
            "pin_memory": self.zero.pin_memory,
            "method": self.training.method,
            "status": self.status,
            "fits": self.fits,
            **({"lower_bound": self.training.lower_bound} if self.training.lower_bound else {}),
            "trainable_params": self.trainable_params,
            "frozen_params": self.frozen_params,
            "gpu_peak_bytes": gpu,
            "gpu_peak_phase": gpu_phase,
            "gpu_margin_bytes": self.cluster.gpu_memory_bytes - gpu,
            "host_peak_bytes_per_node": host,
            "host_peak_phase": host_phase,
            "host_margin_bytes": self.cluster.host_ram_bytes - host,
            "save_spike": {
                "gpu_bytes": self.phase("save").gpu_bytes - self.phase("steady").gpu_bytes,
                "host_node0_bytes": self.phase("save").host_bytes - _steady_host(self),
            },
            "failing": [
                {"phase": ph, "where": where, "need_bytes": need, "limit_bytes": cap}
                for ph, where, need, cap in self.failing_phases()
            ],
            "phases": [p.to_dict() for p in self.phases],
            "checkpoint": self.checkpoint.to_dict(),
            "model_state_components": [
                {
                    "name": c.name,
                    "bytes": c.bytes,
                    "device": c.device,
                    "pinned": c.pinned,
                    "lazy": c.lazy,
                    "transient": c.transient,
                    "source": c.source,
                }
                for c in self.components
            ],
            "activation_notes": list(self.activation_notes),
        }


MASTER_CLONE_ON_GPU_WITH_OFFLOAD = "0.18.3"
"""From this DeepSpeed release on, ZeRO-1/2 clones the 16-bit partition on the GPU before moving the fp32 master to
the host (`.detach().clone().to(device=self.device, ...)`, deepspeedai/DeepSpeed#7700, first in v0.18.3); before,
`.to(self.device).clone().float()` moved it to the host first when offloading, so no GPU copy was made."""


def _master_cloned_on_gpu(zero: ZeroSettings, deepspeed_version: str | None) -> bool:
    """Whether ZeRO-1/2's init clones the rank's 16-bit partition on the GPU (always without optimizer offload; with
    it only from DeepSpeed 0.18.3; an unknown version is taken as a current one)."""
    if zero.offload_optimizer == "none":
        return True
    version = parse_version(deepspeed_version)
    return version is None or not in_range(version, fixed=MASTER_CLONE_ON_GPU_WITH_OFFLOAD)


DTYPE_AUTO_DEFAULT = "5.0.0"
"""From transformers 5, `from_pretrained` loads `dtype="auto"` when no dtype is given: the checkpoint's own dtype
(modeling_utils.py `if dtype is None: dtype = "auto"`, read in 5.23); up to 4.x it built the model in torch's default
dtype, fp32, unless `torch_dtype` was passed."""


def without_engine(inputs: PlanInputs, zero: ZeroSettings) -> bool:
    """Whether this strategy runs without DeepSpeed and FSDP (HF Trainer / DDP / plain PyTorch): the planner's
    stage 0 when the user gave no DeepSpeed configuration. A DeepSpeed config with stage 0 is DeepSpeed's
    FP16/BF16 optimizer, with its fp32 master (`model_states._stage0`)."""
    return zero.stage == 0 and zero.fsdp is None and inputs.zero is None and inputs.framework != "deepspeed"


def loaded_weight_bytes(inputs: PlanInputs, t: Training) -> tuple[int, str]:
    """Bytes per weight as the model is loaded, and why: the run's own dtype when it states one, else what the
    installed (or, unknown, the current) transformers loads by default. Only a run without DeepSpeed or FSDP keeps
    these weights as the ones its optimizer steps."""
    if t.precision == "fp32":
        return ms.FP32_BYTES, "fp32 training"
    if t.weights_dtype == "auto":
        return 2, "loaded with torch_dtype 'auto': the checkpoint's dtype (assumed 16-bit)"
    if t.weights_dtype is not None:
        wb = ms.FP32_BYTES if t.weights_dtype == "fp32" else 2
        return wb, f"loaded in {t.weights_dtype} (the run's torch_dtype)"
    if inputs.framework == "llamafactory":
        # LLaMA-Factory passes torch_dtype="auto" itself (model/loader.py load_model), whatever transformers
        # would default to: the checkpoint's dtype.
        return 2, "LLaMA-Factory loads with torch_dtype 'auto': the checkpoint's dtype (assumed 16-bit)"
    version = parse_version(inputs.transformers_version)
    if version is not None and in_range(version, fixed=DTYPE_AUTO_DEFAULT):
        return ms.FP32_BYTES, (
            f"transformers {inputs.transformers_version} loads fp32 when no torch_dtype is given (assumed: none given)"
        )
    which = f"transformers {inputs.transformers_version}" if version is not None else "a current transformers"
    return 2, (
        f"{which} loads dtype='auto', the checkpoint's 16-bit dtype (assumed: no torch_dtype given, a 16-bit "
        "checkpoint)"
    )


def trainable_weight_bytes(inputs: PlanInputs, t: Training) -> tuple[int, str]:
    """Bytes per trainable weight in a run without DeepSpeed or FSDP, and why. PEFT keeps adapters of a 16-bit
    base in fp32 (`autocast_adapter_dtype=True`, peft tuners_utils `_cast_adapter_dtype`); LLaMA-Factory upcasts
    trainable parameters to fp32 unless `pure_bf16` (model/adapter.py `cast_trainable_params_to_fp32`)."""
    wb, why = loaded_weight_bytes(inputs, t)
    if wb == ms.FP32_BYTES:
        return wb, why
    if t.is_peft:
        return ms.FP32_BYTES, "PEFT adapters in fp32 (autocast_adapter_dtype)"
    if inputs.framework == "llamafactory" and not t.pure_bf16:
        return ms.FP32_BYTES, "LLaMA-Factory upcasts trainable parameters to fp32 (pure_bf16 off)"
    return wb, why


def plain_trainable_groups(inputs: PlanInputs, t: Training) -> tuple[tuple[int, int], ...]:
    """(elements, bytes per element) of the trainable weights of a run without DeepSpeed or FSDP, one group per
    dtype. PEFT upcasts only its adapter layers (`cast_adapter_dtype` walks `BaseTunerLayer` modules): the
    trainable copies of `modules_to_save` (`ModulesToSaveWrapper`, a deep copy of the original) keep the model's
    dtype. LLaMA-Factory upcasts every trainable parameter, copies included (`trainable_weight_bytes`); so does
    PEFT's k-bit preparation, which makes the originals fp32 before `get_peft_model` copies them (`kbit_prep`)."""
    trainable, _ = trainable_frozen(inputs, t)
    wb, _ = trainable_weight_bytes(inputs, t)
    saved = _module_numel(inputs, t.trainable_modules) if t.is_peft else 0
    load_b, _ = loaded_weight_bytes(inputs, t)
    prep = (
        kbit_preparation(inputs, t, plain=True, unquantised=qlora_unquantised_params(inputs, t))
        if saved and t.method == "qlora"
        else None
    )
    upcast_all = (inputs.framework == "llamafactory" and not t.pure_bf16) or (prep is not None and prep.mode == "peft")
    if not saved or wb == load_b or upcast_all:
        return ((trainable, wb),)
    return ((trainable - saved, wb), (saved, load_b))


def plain_trainable_bytes(inputs: PlanInputs, t: Training) -> int:
    """Bytes of the trainable weights of a run without DeepSpeed or FSDP (`plain_trainable_groups`); the same for
    their gradients."""
    return sum(n * b for n, b in plain_trainable_groups(inputs, t))


def _steady_host(plan: StrategyPlan) -> int:
    """Host of the steady state without the transient step buffers (the save happens between steps)."""
    return sum(i.bytes for i in plan.phase("steady").host)


# --------------------------------------------------------------------------------------------------
# Parameter bookkeeping
# --------------------------------------------------------------------------------------------------


def _step_moment(items: list[Item], step_extra: list[Item], zero: ZeroSettings) -> list[Item]:
    """The first step's model-state items with the flattened 16-bit gradient copy charged for what it adds.
    DeepSpeed flattens a (sub-)group's 16-bit gradients and casts the copy to fp32 (ZeRO-1/2 `step`:
    `flat_grad_partition.to(...)`, then `del flat_grad_partition`; ZeRO-3 `_prepare_fp32_grad_for_sub_group`:
    `self.flatten(...).to(...)`, a temporary) *before* `_optimizer_step` updates that group and, at the first step,
    creates its optimizer state: the copy and the new state never coexist, while the fp32 gradient is in both
    moments. So the copy counts only for what it exceeds the group's new state plus the update's temporary by
    (nothing with Adam: 8 B of state per element against 2 B of copy); the allocator replay has the same order."""
    by = {i.name: i for i in items}
    flat = by.get(f"model states: {ms.GRAD_FLAT_COPY}")
    states = by.get(f"model states: {ms.OPTIMIZER_STATES}")
    if flat is None or states is None or not flat.bytes:
        return items
    grad32 = by.get(f"model states: {ms.FP32_GRAD}")
    master = by.get(f"model states: {ms.FP32_MASTER}")
    share = min(1.0, grad32.bytes / master.bytes) if grad32 is not None and master is not None and master.bytes else 1.0
    update = int(states.bytes * share) + sum(i.bytes for i in step_extra)
    excess = max(0, flat.bytes - update)
    moment = Item(
        flat.name,
        excess,
        f"step transient: the flattened 16-bit gradients ({flat.bytes / GIB:.2f} GiB) are freed once cast to fp32, "
        f"before the optimizer creates that {'sub-group' if zero.stage == 3 else 'partition'}'s state "
        f"({update / GIB:.2f} GiB with the update's temporary): charged for what they exceed that moment by",
        "deepspeed/runtime/zero/stage_1_and_2.py step (flat_grad_partition.to(...); del flat_grad_partition; "
        "_optimizer_step); stage3.py _prepare_fp32_grad_for_sub_group, then _optimizer_step(sub_group_id)",
    )
    return [moment if i is flat else i for i in items]


def trainable_frozen(inputs: PlanInputs, training: Training) -> tuple[int, int]:
    """(trainable, frozen) parameters. LoRA/QLoRA: the adapters plus a trainable copy of every module in
    `trainable_modules` (PEFT ModulesToSaveWrapper keeps the original frozen); freeze tuning: the last
    `freeze_trainable_layers` decoder layers (LLaMA-Factory model/adapter.py _setup_freeze_tuning)."""
    p = inputs.model.params
    total = p.total
    if training.method == "full":
        return total, 0
    if training.method == "freeze":
        n = min(max(training.freeze_trainable_layers, 0), p.num_layers)
        per_layer = p.decoder_layers / max(p.num_layers, 1)
        trainable = round(per_layer * n)
        return trainable, total - trainable
    extra = _module_numel(inputs, training.trainable_modules)
    return inputs.model.lora_params(training.lora_rank, training.lora_targets) + extra, total


def _named_module(m: ModuleShape, wanted: set[str]) -> bool:
    """Is `m` one of the modules a run names (`trainable_modules`): by its last name component, its path, or a
    parent's path -- MiniCPM-V's finetune.py unfreezes whole sub-models by their attribute (`vpm`, `resampler`),
    whose parameters are the modules under that path."""
    return m.name in wanted or m.path in wanted or any(m.path.startswith(w + ".") for w in wanted)


def _module_numel(inputs: PlanInputs, names: tuple[str, ...]) -> int:
    """Parameters of the modules a run names (`_named_module`; tied heads count once)."""
    wanted = set(names)
    return sum(m.total for m in inputs.model.modules if _named_module(m, wanted))


def qlora_frozen_bytes(inputs: PlanInputs, training: Training) -> tuple[int, float]:
    """(bytes, bytes/param) of the frozen base under bitsandbytes 4-bit: every `nn.Linear` but `lm_head`
    packed to 0.5 B/weight + absmax constants (fp32 per 64 weights, or with double quantisation 1 byte per
    64 + fp32 per 64x256); embeddings, norms, fused MoE experts (not `nn.Linear` in transformers 5) and the
    output layer stay in the compute dtype."""
    spec = inputs.model
    rest = qlora_unquantised_params(inputs, training)
    quantized = spec.params.total - rest
    if training.quant_method in ("gptq", "awq"):
        # Pre-quantised checkpoints (auto-gptq / autoawq QuantLinear): qweight int32 packs eight 4-bit weights,
        # per group of `group_size` input rows one fp16 scale and one 4-bit zero per output column; g_idx
        # (GPTQ) is one int32 per input row, negligible per weight.
        g = max(training.quant_group_size, 1)
        const = 2 / g + 0.5 / g
    elif training.double_quant:
        const = 1 / BNB_BLOCKSIZE + 4 / (BNB_BLOCKSIZE * BNB_NESTED_BLOCKSIZE)
    else:
        const = 4 / BNB_BLOCKSIZE
    nbytes = math.ceil(quantized * (0.5 + const) + rest * training.param_bytes)
    return nbytes, nbytes / spec.params.total


def qlora_unquantised_params(inputs: PlanInputs, training: Training) -> int:
    """Parameters a 4-bit base leaves unquantised (`qlora_frozen_bytes`): embeddings, norms, biases, fused MoE
    experts and the output layer -- every weight but the decoder's `nn.Linear` matrices."""
    spec = inputs.model
    quantized = sum(
        lin.in_features * lin.out_features * lin.count
        for lin in spec.linear_modules()
        if not is_output_layer(lin.path)
    )
    return spec.params.total - quantized


def _head_largest_layer_tensor(inputs: PlanInputs, training: Training) -> int | None:
    """Full fine-tuning with Liger's fused loss whose largest trainable tensor is the head or the embedding: the
    largest decoder-layer Linear (`offload_norm_items`); None otherwise. Only under Liger (review R2 of issue 9):
    there the backward moment is the activation peak, so charging the head's slice beside the recomputed layer
    overcharges (Llama-3-8B full ZeRO-2 offload, 8 GPUs, mb4 x 4096: 3.91 GiB); without it the same change lowers
    Yi-34B ZeRO-2 offload plans, a reported OOM among them, by 1.7 GiB, and no GPU reading backs that."""
    p = inputs.model.params
    if training.method != "full" or _largest_trainable_tensor(inputs, training) not in (p.lm_head, p.embedding):
        return None
    kernels, _ = liger_plan(inputs, training)
    if kernels is None or not kernels.fused_linear_ce:
        return None
    return _largest_trainable_tensor(inputs, replace(training, method="freeze"))


def _largest_trainable_tensor(inputs: PlanInputs, training: Training) -> int:
    p = inputs.model.params
    if training.method == "full":
        return p.largest_module_numel
    if training.method == "freeze":  # a decoder layer's largest Linear
        return max(
            (lin.in_features * lin.out_features for lin in inputs.model.linear_modules()
             if not is_output_layer(lin.path)),
            default=0,
        )  # fmt: skip
    adapter = training.lora_rank * max(p.largest_linear_in, p.largest_linear_out)
    wanted = set(training.trainable_modules)
    saved = [m.numel for m in inputs.model.modules if _named_module(m, wanted)]
    return max([adapter, *saved])


def _pinned_host(c: ms.Component, zero: ZeroSettings, torch_version: str | None) -> tuple[int, str]:
    """Bytes PyTorch really reserves for a pinned component: per-sub-group fp32 gradient buffers are
    separate blocks (stage3.py initialize_optimizer_states), every other component is one block."""
    if not c.pinned:
        return c.bytes, ""
    if c.name == ms.FP32_GRAD and zero.stage == 3 and zero.sub_group_size > 0:
        block = zero.sub_group_size * ms.FP32_BYTES
        full, rest = divmod(c.bytes, block)
        rounded = full * ms.pinned_bytes(block, torch_version) + ms.pinned_bytes(rest, torch_version)
    else:
        rounded = ms.pinned_bytes(c.bytes, torch_version)
    return (
        rounded,
        f"pinned: {c.bytes / GIB:.1f} GiB requested -> {rounded / GIB:.1f} GiB (power-of-two blocks)",
    )


# --------------------------------------------------------------------------------------------------
# The plan of one strategy
# --------------------------------------------------------------------------------------------------


def with_moe_layout(inputs: PlanInputs) -> PlanInputs:
    """`inputs` with the model's MoE experts laid out as the run's transformers builds them (one module per layer
    from 5.0, one `nn.Linear` per expert before: `zerodoctor.models.spec.with_transformers_layout`); unchanged for
    an unknown version, a dense model, or a layout already converted."""
    model = with_transformers_layout(inputs.model, inputs.transformers_version)
    if model is inputs.model:
        return inputs
    return replace(inputs, model=model, notes=(*inputs.notes, model.notes.rsplit("; ", 1)[-1]))


def plan_strategy(
    inputs: PlanInputs,
    zero: ZeroSettings,
    training: Training | None = None,
    *,
    label: str = "",
    margin: float = DEFAULT_SAFETY_MARGIN,
) -> StrategyPlan:
    """Evaluate one ZeRO strategy for the model, cluster and recipe in `inputs` (`training` overrides the
    recipe, e.g. a LoRA variant of a full fine-tune)."""
    t = training or inputs.training
    inputs = with_moe_layout(inputs)
    if zero.fsdp is not None:
        from zerodoctor.plan.fsdp import plan_fsdp

        return plan_fsdp(inputs, zero, t, label=label, margin=margin)
    if zero.offload_optimizer != "none" and t.offload_swaps_optimizer and t.optimizer != "adamw":
        t = replace(t, optimizer="adamw")  # accelerate's DeepSpeedCPUAdam steps (Training.offload_swaps_optimizer)
    c = inputs.cluster
    spec = inputs.model
    p = spec.params
    n_local = c.gpus_per_node
    world = c.world_size
    pb = t.param_bytes
    trainable, frozen = trainable_frozen(inputs, t)
    if t.method == "qlora":
        frozen_total_bytes, fbp = qlora_frozen_bytes(inputs, t)
        # ZeRO-3 partitions bnb weights stored in a float dtype (bnb_4bit_quant_storage); GPTQ/AWQ int32
        # buffers are not parameters at all, so every GPU keeps the whole quantised base.
        frozen_partitioned = zero.stage == 3 and t.quant_storage != "uint8" and t.quant_method == "bnb"
    else:
        frozen_total_bytes, fbp = frozen * pb, float(pb)
        frozen_partitioned = True
    plain = without_engine(inputs, zero)
    if plain and t.method != "qlora":
        # The frozen weights stay in the dtype they were loaded in (fp32 from transformers 4 without torch_dtype).
        lb, _ = loaded_weight_bytes(inputs, t)
        frozen_total_bytes, fbp = frozen * lb, float(lb)
    components = ms.model_state_components(
        trainable=trainable,
        frozen=frozen,
        stage=zero.stage,
        world_size=world,
        offload_optimizer=zero.offload_optimizer,
        offload_param=zero.offload_param if zero.stage == 3 else "none",
        param_bytes=pb,
        frozen_bytes_per_param=fbp if frozen else None,
        frozen_partitioned=frozen_partitioned,
        optimizer=t.optimizer,
        pin_memory=zero.pin_memory,
        sub_group_size=max(zero.sub_group_size, 1),
        reduce_bucket_size=zero.reduce_bucket_size,
        overlap_comm=zero.overlap,
        gradient_accumulation_steps=t.grad_accum,
        deepspeed_version=inputs.deepspeed_version,
        largest_param_numel=_largest_trainable_tensor(inputs, t),
    )
    weights_note = ""
    if plain:
        wb, weights_note = trainable_weight_bytes(inputs, t)
        groups = plain_trainable_groups(inputs, t)
        if len(groups) > 1:
            weights_note += f"; the modules_to_save copies ({groups[1][0]:,}) keep the model's {groups[1][1]}-byte dtype"
        components = ms.torch_optimizer_components(
            trainable=trainable,
            frozen=frozen,
            trainable_bytes=wb,
            frozen_bytes_per_param=fbp,
            optimizer=t.optimizer,
            trainable_groups=groups,
        )
    act = activations_for(inputs, t, zero)
    prep = (
        kbit_preparation(inputs, t, plain=plain, unquantised=qlora_unquantised_params(inputs, t))
        if t.method == "qlora"
        else None
    )

    def gpu_states(*, lazy: bool, transient: bool) -> list[Item]:
        items = [kbit_params_item(prep, pb)] if prep is not None else []
        for comp in components:
            if comp.device != ms.GPU or (comp.lazy and not lazy) or (comp.transient and not transient):
                continue
            if comp.name == ms.OPTIMIZER_STATES and t.optimizer in ms.PAGED_OPTIMIZERS:
                items.append(paged_states_items(comp.bytes, n_local, t.optimizer)[0])
                continue
            tags = [
                x
                for x, on in (("allocated at first step", comp.lazy), ("step transient", comp.transient))
                if on
            ]
            if plain and comp.name in (ms.PARAM16, ms.FROZEN16):
                # which dtype the weights were taken in, and whether the config said it or it was assumed
                why = weights_note if comp.name == ms.PARAM16 else loaded_weight_bytes(inputs, t)[1]
                tags.append(f"no DeepSpeed: {why}")
            items.append(Item(f"model states: {comp.name}", comp.bytes, ", ".join(tags), comp.source))
        return items

    def host_states(*, lazy: bool, transient: bool) -> list[Item]:
        items = []
        if lazy and t.optimizer in ms.PAGED_OPTIMIZERS:
            paged = sum(cm.bytes for cm in components if cm.name == ms.OPTIMIZER_STATES and cm.device == ms.GPU)
            if paged:
                items.append(paged_states_items(paged, n_local, t.optimizer)[1])
        for comp in components:
            if comp.device != ms.HOST or (comp.lazy and not lazy) or (comp.transient and not transient):
                continue
            per_rank, pin_note = _pinned_host(comp, zero, inputs.torch_version)
            if comp.name == ms.FROZEN16 and comp.pinned and zero.stage == 3 and frozen_per_param_pinned:
                # zero.Init pins each frozen parameter's partition on its own (they never move to a flat buffer)
                per_rank = max(frozen_per_param_pinned, comp.bytes)
                pin_note = (
                    f"pinned per parameter: {comp.bytes / GIB:.1f} GiB requested -> {per_rank / GIB:.1f} GiB "
                    "(one power-of-two block each)"
                )
            detail = f"{n_local} ranks x {per_rank / GIB:.2f} GiB"
            if pin_note:
                detail += f"; {pin_note}"
            if comp.lazy:
                detail += "; allocated at the first optimizer step"
            items.append(Item(f"offloaded: {comp.name}", per_rank * n_local, detail, comp.source))
        return items

    reserve_items = reserve_items_for(inputs)
    baseline = host_baseline(inputs)
    # ZeRO-3 + offload_param to the CPU with pin_memory: zero.Init (or deepspeed.initialize's conversion) pins every
    # parameter's partition on its own (partition_parameters.py _partition_param: get_accelerator().pin_memory);
    # stage 3 then copies the trainable ones into one pinned flat buffer (stage3.py
    # _create_param_groups_fp16_flat_cpu_memory + _move_to_flat_buffer) and drops the per-parameter blocks, which
    # PyTorch's CachingHostAllocator keeps pinned and cached (DeepSpeed never empties the host cache).
    init_pinned = zero.stage == 3 and zero.offload_param == "cpu" and zero.pin_memory
    trainable_pp, frozen_pp = (
        _per_param_pinned(inputs, t, world, pb, inputs.torch_version) if init_pinned else (0, 0)
    )
    frozen_per_param_pinned = frozen_pp
    if trainable_pp:
        init_host = [
            Item(
                "zero.Init per-parameter pinned partitions (cached)",
                trainable_pp * n_local,
                f"{n_local} ranks x {trainable_pp / GIB:.2f} GiB: one pinned power-of-two block per trainable "
                "parameter's partition, freed into PyTorch's pinned-memory cache after the copy into stage 3's flat "
                "buffer, never returned",
                "deepspeed/runtime/zero/partition_parameters.py _partition_param (pin_memory per parameter); "
                "stage3.py _move_to_flat_buffer; aten CachingHostAllocator (freed blocks stay cached)",
            )
        ]
    else:
        init_host = []
    baseline_items = [baseline, *init_host]
    train_baseline_items = [host_baseline(inputs, training=True), *init_host]

    # ---- ZeRO-3 working set in forward/backward ----------------------------------------------------------
    fwd_extra: list[Item] = []
    gathered_bpp = fbp if t.method == "qlora" and frozen else float(pb)
    if zero.stage == 3 and world == 1 and zero.offload_param == "none":
        # One rank holds whole partitions: DeepSpeed does not gather, it views the GPU partition as the parameter
        # (partition_parameters.py all_gather_coalesced -> _no_gather_coalesced -> NoGatherHandle: `.to(device)`
        # of a tensor already there), so a fetch allocates nothing.
        fwd_extra.append(
            Item(
                "ZeRO-3 fetched parameters (working set)",
                0,
                "one rank without offload_param: no all-gather, each parameter is a view of its GPU partition",
                "deepspeed/runtime/zero/partition_parameters.py all_gather_coalesced, _no_gather_coalesced, "
                "NoGatherHandle",
            )
        )
    elif zero.stage == 3:
        persistent = _persistent_params(inputs, zero.param_persistence_threshold)
        largest_param = _largest_param(inputs)
        live = zero3_working_set_numel(
            partitioned=p.total - persistent,
            largest_module=p.largest_module_numel,
            max_live=zero.max_live_parameters,
            max_reuse=zero.max_reuse_distance,
            prefetch_bucket=zero.prefetch_bucket_size,
            gradient_checkpointing=t.gradient_checkpointing,
            largest_param=largest_param,
        )
        fwd_extra.append(
            Item(
                "ZeRO-3 fetched parameters (working set)",
                math.ceil(live * gathered_bpp),
                f"{live:,} elements x {gathered_bpp:.2f} B: max(largest module {p.largest_module_name} "
                f"{p.largest_module_numel:,}, max_reuse_distance {zero.max_reuse_distance:,} / "
                f"{3 if t.gradient_checkpointing else 2}, prefetch up to max_live_parameters "
                f"{zero.max_live_parameters:,} + the largest parameter {largest_param:,} that can cross it), "
                "at most the partitioned model"
                + (
                    " (H2D from the pinned host partitions: offload_param)"
                    if zero.offload_param != "none"
                    else ""
                ),
                "deepspeed/runtime/zero/partitioned_param_coordinator.py fetch_sub_module (prefetch whole "
                "parameters while the count is under max_live - available), __params_to_release (keep what recurs "
                "within max_reuse_distance); measured on the engine: benchmarks/plan_zero3_engine.py",
            )
        )
        if zero.offload_param == "cpu":
            # With offload_param the partitions live in the pinned host buffer; each fetch copies the partitions it
            # gathers to the GPU first (one temporary per parameter, freed after the cat into the all-gather
            # buffer). A fetch is one module's parameters, or one prefetch bucket.
            staged = -(-max(p.largest_module_numel, zero.prefetch_bucket_size) // world)
            fwd_extra.append(
                Item(
                    "offload_param: partitions staged on the GPU for an all-gather",
                    math.ceil(staged * gathered_bpp),
                    f"{staged:,} elements = max(largest module, stage3_prefetch_bucket_size) / {world} ranks, copied "
                    "host-to-device before each all-gather",
                    "deepspeed/runtime/zero/partition_parameters.py _all_gather_dtype "
                    "(torch.cat([p.ds_tensor.to(device) ...], out=...))",
                )
            )
        if persistent:
            fwd_extra.append(
                Item(
                    "persistent small parameters",
                    persistent * pb,
                    f"parameters with <= {zero.param_persistence_threshold:,} elements stay whole on every GPU",
                    "partition_parameters.py (ds_persist: ds_numel <= stage3_param_persistence_threshold)",
                )
            )
    if zero.stage >= 2:
        largest_grad = _largest_trainable_tensor(inputs, t)
        fwd_extra.append(
            Item(
                "full-size gradient before reduce-scatter",
                largest_grad * pb,
                f"autograd writes each parameter's whole {pb}-byte gradient ({largest_grad:,} elements for the "
                "largest trainable tensor) before the hook copies it into the reduce bucket and frees it",
                "deepspeed/runtime/zero/stage3.py reduce_ready_partitions_and_remove_grads -> "
                "__add_grad_to_ipg_bucket; stage_1_and_2.py reduce_ready_partitions_and_remove_grads",
            )
        )
    if zero.stage == 3 and trainable and zero.reduce_bucket_size > 0:
        # ZeRO-3 reduces a full IPG bucket with reduce_scatter_coalesced, which concatenates the bucket's
        # gradients, padded per rank, into a new flat tensor before the reduce-scatter (unless the bucket is a
        # single tensor divisible by the world size).
        bucket = min(zero.reduce_bucket_size, trainable)
        fwd_extra.append(
            Item(
                "reduce-scatter: flattened copy of the IPG bucket",
                bucket * pb,
                f"{bucket:,} elements (reduce_bucket_size {zero.reduce_bucket_size:,}, at most the trainable "
                f"parameters) in {pb} B",
                "deepspeed/runtime/comm/coalesced_collectives.py reduce_scatter_coalesced (torch.cat of the padded "
                "partitions); stage3.py __avg_scatter_grads",
            )
        )
    if t.method == "qlora":
        fwd_extra.append(dequantised_weight_item(inputs, t))
    if zero.stage in (1, 2) and zero.offload_optimizer == "cpu" and trainable:
        fwd_extra.extend(
            offload_norm_items(
                act, _largest_trainable_tensor(inputs, t), -(-trainable // world), _head_largest_layer_tensor(inputs, t)
            )
        )
    elif zero.stage == 3 and zero.offload_optimizer != "none" and trainable:
        fwd_extra.extend(zero3_offload_grad_items(act, -(-_largest_trainable_tensor(inputs, t) // world), pb))
    act_items = activation_items(act, t, inputs)
    if prep is not None:
        act_items.append(kbit_stream_item(inputs, t, zero, act, prep))
    if t.reference_model:
        held = next((i.bytes for i in fwd_extra if i.name == "ZeRO-3 fetched parameters (working set)"), 0)
        act_items.append(reference_forward_item(inputs, t, zero, act, held))
    ddp = (
        ddp_bucket_items(trainable, trainable_weight_bytes(inputs, t)[0], world, plain_trainable_bytes(inputs, t))
        if plain
        else []
    )

    # ---- DPO/KTO reference model ------------------------------------------------------------------------
    ref_host: list[Item] = []
    ref_gpu: list[Item] = []
    if t.reference_model:
        # TRL prepare_deepspeed: the frozen reference model gets the same ZeRO-3 config (partitioned, its
        # partitions on the host with offload_param), or stage 0 (whole per GPU) below ZeRO-3.
        ref_src = "trl/models/utils.py prepare_deepspeed (reference model: same ZeRO-3 config, else stage 0)"
        if zero.stage == 3 and zero.offload_param != "none":
            part = -(-p.total // world) * pb
            ref_host.append(
                Item(
                    "reference model partitions (offload_param)",
                    part * n_local,
                    f"{n_local} ranks x {part / GIB:.2f} GiB: frozen 16-bit copy of the model",
                    ref_src,
                )
            )
        else:
            ref_bytes = -(-p.total // world) * pb if zero.stage == 3 else p.total * pb
            ref_gpu.append(
                Item(
                    "reference model (frozen, 16-bit)",
                    ref_bytes,
                    "partitioned over the ranks (ZeRO-3)" if zero.stage == 3 else "whole on every GPU",
                    ref_src,
                )
            )

    context_item = reserve_items[0]
    reserve_items += ref_gpu
    allocator = allocator_items(inputs, zero, t)

    def reserve(phase: str) -> list[Item]:
        """The reserve items with the fixed allocator slack replaced by this phase's simulated one."""
        if allocator is None:
            return list(reserve_items)
        return [allocator[phase] if i.name == ALLOCATOR_ITEM else i for i in reserve_items]

    # ---- load -------------------------------------------------------------------------------------------
    before_cast, loaded_why = 0, ""  # a model loaded wider than 16-bit, on the host before the engine casts it
    load_gpu = [*reserve("load"), *gpu_states(lazy=False, transient=False)]
    load_host = [*baseline_items, *ref_host, *host_states(lazy=False, transient=False)]
    if zero.stage in (1, 2) and zero.offload_optimizer == "cpu" and zero.pin_memory:
        # initialize_optimizer_states builds the fp32 gradient partition as pageable zeros and pins a copy of it
        # (get_accelerator().pin_memory returns a new pinned tensor): both exist once every other buffer does.
        fp32_grad = next(
            (cm.bytes for cm in components if cm.name == ms.FP32_GRAD and cm.device == ms.HOST), 0
        )
        if fp32_grad:
            load_host.append(
                Item(
                    "pageable fp32 gradient partition being pinned",
                    fp32_grad * n_local,
                    f"{n_local} ranks x {fp32_grad / GIB:.2f} GiB: torch.zeros on the host, then its pinned copy",
                    "deepspeed/runtime/zero/stage_1_and_2.py initialize_optimizer_states (torch.zeros + pin_memory)",
                )
            )
    load_note = ""
    whole_model_bytes = frozen_total_bytes + trainable * pb if t.method != "full" else p.total * pb
    if plain:  # save_pretrained writes the weights in the dtype the run holds them in
        whole_model_bytes = frozen_total_bytes + plain_trainable_bytes(inputs, t)
    if t.method == "qlora":
        # transformers skips zero.Init for quantised models (docs/known-failures.md): each rank loads the whole 4-bit
        # model onto its GPU with a device_map, shard by shard; DeepSpeed partitions it only in initialize.
        whole = frozen_total_bytes + trainable * pb
        # This peak is inside from_pretrained, before deepspeed.initialize: no NCCL communicator yet
        # (ProcessGroupNCCL creates it at the first collective) and no allocator churn (weights are allocated
        # once), so only the CUDA context is there.
        load_gpu = [
            context_item,
            *ref_gpu,
            Item(
                "whole 4-bit model on every GPU",
                whole,
                f"{frozen_total_bytes / GIB:.1f} GiB quantised base + adapters: quantised loads skip zero.Init; "
                "partitioned (if at all) only in deepspeed.initialize",
                "transformers modeling_utils (is_deepspeed_zero3_enabled and not is_quantized)",
            ),
            # deepspeed.initialize creates the partitioned states only after this peak (first_step and
            # steady carry them), so they are not added here.
        ]
        load_host.append(
            Item(
                "checkpoint shards being read",
                LOAD_SHARD_BYTES * n_local,
                f"{n_local} ranks x one {LOAD_SHARD_BYTES / 10**9:.0f} GB safetensors shard",
                "phases.LOAD_SHARD_BYTES",
            )
        )
        load_note = "QLoRA: whole quantised model per GPU at load (no zero.Init)"
    elif zero.stage < 3 or not inputs.zero3_init:
        # Every local rank materialises the whole 16-bit model on the host (from_pretrained), and the engine moves
        # it to the GPU. ZeRO-1/2 then flattens the trainable parameters (stage_1_and_2.py __init__, DeepSpeed
        # 0.19.8 lines 449-524): on the GPU when its free memory holds the flat buffer -- the parameters and their
        # flat copy coexist until the parameters are re-pointed into it -- else through the host (each parameter
        # copied to `cpu_data`, flattened there, moved back). Versions up to 0.16.5 always went through the host.
        flat = trainable * pb if zero.stage in (1, 2) else 0
        used = sum(i.bytes for i in load_gpu)
        on_gpu = (
            bool(flat)
            and not ms._is_old_layout(inputs.deepspeed_version)
            and used + flat <= c.gpu_memory_bytes
        )
        load_b = loaded_weight_bytes(inputs, t)[0] if plain else pb
        per_rank = p.total * load_b if not flat or on_gpu else max(p.total * pb, 2 * flat)
        if not plain:
            # transformers materialises the model in the dtype it loads (fp32 from transformers 4 without
            # torch_dtype); DeepSpeed casts it to 16-bit only inside deepspeed.initialize (engine.py
            # _configure_distributed_model: the cast, then module.to(device)), before any ZeRO state exists.
            loaded_b, loaded_why = loaded_weight_bytes(inputs, t)
            before_cast = p.total * loaded_b * n_local if loaded_b > pb else 0
        mapped = (
            not plain and (not flat or on_gpu) and hl.loads_as_mapped_views(inputs.transformers_version)
        )
        if mapped and loaded_weight_bytes(inputs, t)[0] == 2:
            # transformers 5 leaves what it loads in the checkpoint's (16-bit) dtype as views of the safetensors
            # mapping, shared by the node's ranks; only converted MoE experts are private copies per rank.
            load_host += [Item(**dataclasses.asdict(a)) for a in hl.mapped_load(inputs.model, inputs.transformers_version, n_local)]
        else:
            load_host.append(
                Item(
                    "whole model loaded per rank",
                    per_rank * n_local,
                    f"{n_local} ranks x {per_rank / GIB:.1f} GiB: the {8 * load_b}-bit model"
                    + (
                        "; its trainable part flattened through the host (cpu_data + flat buffer)"
                        if flat and not on_gpu
                        else ""
                    ),
                    "transformers from_pretrained per rank; deepspeed/runtime/zero/stage_1_and_2.py __init__ "
                    "(flatten_on_accelerator)",
                )
            )
            if mapped:  # a dtype change copies every tensor, while the checkpoint stays mapped until the load ends
                load_host.append(Item(**dataclasses.asdict(hl.mapped_checkpoint(inputs.model, inputs.transformers_version))))
        if flat and _master_cloned_on_gpu(zero, inputs.deepspeed_version):
            # The fp32 master partition starts as a 16-bit clone of the rank's partition made on the GPU
            # (`parallel_partitioned_bit16_groups[i][partition_id].detach().clone().to(device, fp32)`, line 560).
            part16 = -(-trainable // world) * pb
            load_gpu.append(
                Item(
                    "16-bit partition cloned for the fp32 master",
                    part16,
                    f"{part16 / GIB:.1f} GiB on the GPU while the fp32 master partition is made from it",
                    "deepspeed/runtime/zero/stage_1_and_2.py __init__ (single_partition_of_fp32_groups: "
                    "detach().clone().to(device, dtype))",
                )
            )
        if on_gpu:
            # The original parameter tensors are freed once re-pointed into the flat buffer, but the caching
            # allocator keeps their blocks reserved; the buffers DeepSpeed allocates later in __init__ (gradient
            # staging, IPG bucket) are served from them.
            later = sum(
                cm.bytes
                for cm in components
                if cm.device == ms.GPU
                and cm.name not in (ms.PARAM16, ms.FROZEN16)
                and not (cm.lazy or cm.transient)
            )
            load_gpu.append(
                Item(
                    "16-bit parameters + their flat copy while flattening",
                    max(flat - later, 0),
                    f"{flat / GIB:.1f} GiB of parameters coexist with bit16_groups_flat on the GPU (flattened there "
                    f"because free memory holds the flat buffer); once freed their blocks stay reserved, "
                    f"{later / GIB:.2f} GiB of them reused by the buffers allocated after",
                    "deepspeed/runtime/zero/stage_1_and_2.py __init__ (flatten_on_accelerator, "
                    "flatten_dense_tensors_aligned, then _update_model_bit16_weights); c10 CUDACachingAllocator",
                )
            )
        load_note = "every rank loads the whole model (no zero.Init sharding)"
        if zero.stage == 3:
            # The engine moves the module to the GPU before ZeRO-3 partitions it.
            load_gpu.append(
                Item(
                    "whole 16-bit model on every GPU at deepspeed.initialize",
                    p.total * pb,
                    f"model not built under zero.Init: {p.total * pb / GIB:.1f} GiB lands on each GPU before "
                    "ZeRO-3 partitions it",
                    "deepspeed/runtime/engine.py DeepSpeedEngine._configure_distributed_model (module.to(device)); "
                    "stage3.py DeepSpeedZeroOptimizer_Stage3 -> parameter_offload._convert_to_zero_parameters",
                )
            )
    else:
        shard = min(LOAD_SHARD_BYTES, p.total * pb)
        load_host.append(
            Item(
                "checkpoint shards being read",
                shard * n_local,
                f"zero.Init: ranks read shards and keep 1/{world} each ({n_local} x one shard)",
                "transformers modeling_utils (zero.Init: shards read per rank, partitioned on load)",
            )
        )
        # Loading into zero.Init's placeholders gathers each module's own parameters on every rank's GPU while rank 0
        # copies the checkpoint values in, then partitions them again: the largest module is whole on every GPU.
        load_gpu.append(
            Item(
                "load: each module gathered to receive its checkpoint values",
                p.largest_module_numel * pb,
                f"{p.largest_module_name}: {p.largest_module_numel:,} params whole on every GPU, one module at a time"
                + (" (brought from the host first: offload_param)" if zero.offload_param != "none" else ""),
                "transformers integrations/deepspeed.py _load_state_dict_into_zero3_model "
                "(deepspeed.zero.GatheredParameters(params_to_gather, modifier_rank=0) per module)",
            )
        )
    if before_cast:
        # The loaded model is an earlier moment than the states deepspeed.initialize builds: charge what it (with
        # the process baseline) exceeds the rest of the load phase by.
        later = sum(i.bytes for i in load_host) - sum(i.bytes for i in baseline_items)
        load_host.append(
            Item(
                "the model in its loaded dtype, before deepspeed.initialize casts it",
                max(0, before_cast - later),
                f"{n_local} ranks x {before_cast // n_local / GIB:.1f} GiB ({loaded_why}) before the engine casts "
                f"it to {8 * pb}-bit: {max(0, before_cast - later) / GIB:.2f} GiB over the rest of the load phase",
                "transformers from_pretrained; deepspeed/runtime/engine.py _configure_distributed_model "
                "(_cast_module_mixed_precision, then module.to(device))",
            )
        )
    load = Phase("load", tuple(load_gpu), tuple(load_host), load_note)

    # ---- first optimizer step ---------------------------------------------------------------------------
    step_extra: list[Item] = []
    if zero.offload_optimizer == "none" and t.optimizer == "adamw" and trainable and not zero.optimizer_from_config:
        # torch.optim.AdamW (what HF Trainer hands DeepSpeed) builds a full-size fp32 temporary per tensor it
        # updates: `torch._foreach_sqrt(exp_avg_sqs)` (foreach, the CUDA default) or
        # `exp_avg_sq.sqrt() / bias_correction2_sqrt` (single-tensor). ZeRO-3 steps one sub-group at a time;
        # ZeRO-1/2 and no ZeRO step the whole fp32 partition as one tensor.
        # Without DeepSpeed the states and their temporary have the parameters' dtype.
        part = -(-trainable // (world if zero.stage >= 1 else 1))
        numel = min(max(zero.sub_group_size, 1), part) if zero.stage == 3 else part
        state_b = trainable_weight_bytes(inputs, t)[0] if plain else ms.FP32_BYTES
        temp = numel * state_b
        if plain:
            # foreach groups the tensors by dtype and makes one group's temporaries at a time
            # (torch/optim/optimizer.py _group_tensors_by_device_and_dtype)
            temp = max(n * b for n, b in plain_trainable_groups(inputs, t))
        step_extra.append(
            Item(
                "AdamW update temporary",
                temp,
                f"one {state_b}-byte tensor of {numel:,} elements (the "
                f"{'sub-group' if zero.stage == 3 else 'model' if plain else 'partition'} being updated)",
                "torch/optim/adamw.py _multi_tensor_adamw (torch._foreach_sqrt) / _single_tensor_adamw",
            )
        )
    first = Phase(
        "first_step",
        tuple([*reserve("first_step"), *_step_moment(gpu_states(lazy=True, transient=True), step_extra, zero), *ddp, *step_extra]),
        tuple([*train_baseline_items, *ref_host, *host_states(lazy=True, transient=True)]),
        "optimizer state allocated lazily + the step's fp32 transients",
    )

    # ---- steady forward/backward ------------------------------------------------------------------------
    steady = Phase(
        "steady",
        tuple([*reserve("steady"), *gpu_states(lazy=True, transient=False), *ddp, *fwd_extra, *act_items]),
        tuple([*train_baseline_items, *ref_host, *host_states(lazy=True, transient=False)]),
        "forward/backward with every model state resident",
    )

    # ---- checkpoint save --------------------------------------------------------------------------------
    checkpoint, save_gpu_items, save_host_items, save_note = _save(
        inputs, t, zero, trainable, frozen, whole_model_bytes, components
    )
    save = Phase(
        "save",
        tuple([*reserve("save"), *gpu_states(lazy=True, transient=False), *ddp, *save_gpu_items]),
        tuple([*train_baseline_items, *ref_host, *host_states(lazy=True, transient=False), *save_host_items]),
        save_note,
    )
    evaluation = eval_phase(inputs, t, zero, steady.gpu, steady.host)
    return StrategyPlan(
        zero=zero,
        training=t,
        cluster=c,
        trainable_params=trainable,
        frozen_params=frozen,
        phases=(load, first, steady, *((evaluation,) if evaluation else ()), save),
        checkpoint=checkpoint,
        components=tuple(components),
        activation_notes=tuple(getattr(act, "notes", ()) or ()),
        margin=margin,
        label=label,
    )


NORM_BYTES = 8
"""`get_norm_dtype()` is fp64 on CUDA (DeepSpeed <= 0.1x wrote `.double()`), 8 bytes per element."""


def _over_activation_peak(act: ActivationEstimate, transient: int, *, at_head: bool = False) -> tuple[int, str]:
    """What a tensor held during backward adds over the activation peak: backward holds the layers' saved tensors and
    the recomputed layer (`ActivationEstimate.in_backward`), not the loss's peak -- the head's saved tensors (the
    log-probabilities, the final norm's input, a NormHead copy) were freed when the head's backward ran, before any
    decoder-layer gradient reaches a bucket -- so only the excess over the peak is charged. `at_head`: the head's or
    the embedding's gradient, normed before the first layer is recomputed (the head's, when the final norm's gradient
    flushes the bucket) or after the last one (the embedding's): beside the layers' kept tensors only, without the
    recomputed layer. Returns the bytes and the detail's tail."""
    beside = act.in_backward - act.backward_transient if at_head else act.in_backward
    extra = max(0, beside + transient - act.peak)
    return extra, f"beside {beside / GIB:.2f} GiB of activations: {extra / GIB:.2f} GiB over the activation peak"


def offload_norm_items(
    act: ActivationEstimate, largest_trainable: int, partition: int, largest_layer_tensor: int | None = None
) -> list[Item]:
    """ZeRO-1/2 with `offload_optimizer`: when a gradient bucket is reduced during backward, each gradient's slice in
    this rank's partition is cast to fp64 on the GPU for its norm (`set_norm_for_param_grad_in_gpu`:
    `accumulated_grad.data.double().norm(2)`, 0.11; `.to(get_norm_dtype()).norm(2)` in `copy_grads_in_partition`,
    0.19) before its fp32 copy goes to the host. The largest one is the largest trainable tensor, or the partition
    when the tensor is larger. It happens during backward, where the activations are the saved tensors plus the
    recomputed layer, not at the loss: only what it adds over the activation peak is charged. `largest_layer_tensor`
    (full fine-tuning, where the largest tensor is the head or the embedding): that slice is normed outside any
    layer's backward (`_over_activation_peak` at_head), and the largest decoder-layer tensor's slice beside the
    recomputed layer; the larger of the two is charged."""
    slice_numel = min(largest_trainable, partition)
    extra, beside = _over_activation_peak(act, slice_numel * NORM_BYTES, at_head=largest_layer_tensor is not None)
    if largest_layer_tensor is not None:
        layer_slice = min(largest_layer_tensor, partition)
        layer_extra, layer_beside = _over_activation_peak(act, layer_slice * NORM_BYTES)
        if layer_extra > extra:
            slice_numel, extra, beside = layer_slice, layer_extra, layer_beside
    return [
        Item(
            "offload_optimizer: a gradient slice in fp64 for its norm",
            extra,
            f"{slice_numel:,} elements x {NORM_BYTES} B = {slice_numel * NORM_BYTES / GIB:.2f} GiB during backward, "
            + beside,
            "deepspeed/runtime/zero/stage_1_and_2.py reduce_ipg_grads -> copy_grads_in_partition "
            "(set_norm_for_param_grad_in_gpu / .to(get_norm_dtype()).norm(2))",
        )
    ]


ZERO3_NORM_CHUNK = 250_000_000
"""Elements per fp64 chunk of stage3.py `_constant_buffered_norm2` (buffer_size=250000000)."""


def zero3_offload_grad_items(act: ActivationEstimate, part: int, pb: int) -> list[Item]:
    """ZeRO-3 with `offload_optimizer`: at the accumulation boundary `partition_grads` brings each reduce-scattered
    gradient partition's buffer to the GPU (`grad_buffer.to(device)`), takes its norm in fp64 chunks of at most 250M
    elements (`_constant_buffered_norm2`) and casts it to fp32 for the host copy (`_offload_grad_partition_at_boundary`),
    one parameter at a time, during backward. The allocator replay (plan/allocator.py `_flush`) has the same
    sequence; here its largest moment, the largest trainable tensor's partition, is charged for what it adds over the
    activation peak (saved tensors + the recomputed layer at that moment)."""
    transient = part * pb + max(min(part, ZERO3_NORM_CHUNK) * NORM_BYTES, part * 4)
    extra, beside = _over_activation_peak(act, transient)
    return [
        Item(
            "offload_optimizer: a gradient partition on the GPU for its fp64 norm and fp32 copy",
            extra,
            f"{part:,}-element partition: {pb} B copy + max(fp64 chunk, fp32 cast) = {transient / GIB:.2f} GiB "
            "during backward, " + beside,
            "deepspeed/runtime/zero/stage3.py partition_grads (grad_buffer.to(device)), "
            "_offload_grad_partition_at_boundary, _constant_buffered_norm2",
        )
    ]


DDP_SOURCE = (
    "torch/csrc/distributed/c10d/reducer.cpp Reducer::initialize_buckets (bucket.gradients = at::empty(...) per "
    "bucket over the parameters that require grad); torch/nn/parallel/distributed.py (gradient_as_bucket_view=False, "
    "bucket_cap_mb 25, first bucket 1 MiB)"
)


def ddp_bucket_items(trainable: int, grad_bytes: int, world: int, total_bytes: int | None = None) -> list[Item]:
    """DistributedDataParallel's gradient buckets in a multi-GPU run without DeepSpeed or FSDP.

    The reducer allocates, when the model is wrapped, one flat `gradients` tensor per bucket over the parameters that
    require grad, in their dtype: together one more copy of every trainable gradient. With the default
    `gradient_as_bucket_view=False` (HF Trainer / accelerate pass no other) autograd's `param.grad` stays a separate
    tensor: each gradient is copied into its bucket, all-reduced there and copied back, so both exist from the first
    backward on. `bucket_cap_mb` only splits the copy into buckets, it does not bound it. One rank: no DDP wrap."""
    if world <= 1 or trainable <= 0:
        return []
    size = trainable * grad_bytes if total_bytes is None else total_bytes
    return [
        Item(
            "DDP gradient buckets",
            size,
            f"{trainable:,} trainable elements x {grad_bytes} B: the reducer's flat bucket copy of every gradient "
            "(gradient_as_bucket_view off), beside param.grad",
            DDP_SOURCE,
        )
    ]


def paged_states_items(per_rank: int, n_local: int, optimizer: str) -> tuple[Item, Item]:
    """A bitsandbytes paged optimizer's states (`ms.PAGED_OPTIMIZERS`): on the GPU they are no part of what the
    run needs -- the driver evicts them to the host when the GPU is full -- so the GPU item is 0 with their size in
    its detail; on the host they are charged whole (where they all go in the worst case)."""
    src = (
        "bitsandbytes functional.get_paged (cudaMallocManaged) in optim/optimizer.py init_state; Dettmers et al. "
        "2023 (QLoRA), Paged Optimizers"
    )
    gpu = Item(
        "paged optimizer states (unified memory)",
        0,
        f"{optimizer}: {per_rank / GIB:.2f} GiB per rank, resident while the GPU has room and evicted to the host by "
        "the driver when it is full (paged back for each update), so not part of what the GPU needs",
        src,
    )
    host = Item(
        "paged optimizer states evicted to the host (at most)",
        per_rank * n_local,
        f"{n_local} ranks x {per_rank / GIB:.2f} GiB: all of them when the GPU has no room left",
        src,
    )
    return gpu, host


def reserve_items_for(inputs: PlanInputs) -> list[Item]:
    """Per-GPU memory outside the model: CUDA context, NCCL buffers (more than one rank), allocator slack."""
    world = inputs.cluster.world_size
    items = [
        Item(
            "CUDA context",
            CUDA_CONTEXT_BYTES,
            "per process: context, kernels, cuBLAS workspaces (outside PyTorch's allocator)",
            "phases.CUDA_CONTEXT_BYTES (docs/memory-model.md)",
        )
    ]
    if world > 1:
        items.append(
            Item(
                "NCCL buffers",
                NCCL_BUFFER_BYTES,
                f"communicator buffers of a {world}-rank world",
                "phases.NCCL_BUFFER_BYTES (NCCL_BUFFSIZE; docs/memory-model.md)",
            )
        )
    slack = EXPANDABLE_SLACK_BYTES if inputs.expandable_segments else ALLOCATOR_SLACK_BYTES
    items.append(
        Item(
            ALLOCATOR_ITEM,
            slack,
            "caching allocator rounding and fragmentation"
            + (" (expandable_segments on)" if inputs.expandable_segments else ""),
            "c10/cuda/CUDACachingAllocator.cpp; phases.ALLOCATOR_SLACK_BYTES",
        )
    )
    return items


ALLOCATOR_ITEM = "allocator reserved but unallocated"


def allocator_items(inputs: PlanInputs, zero: ZeroSettings, t: Training) -> dict[str, Item] | None:
    """Per phase, what PyTorch's caching allocator holds reserved beyond the allocated bytes, from a replay of
    the run's allocation sequence (plan/allocator.py: the step derived from this plan's own shapes and model
    states, replayed with the rules of c10/cuda/CUDACachingAllocator.cpp): the reserved-minus-allocated peak of
    the phase on a GPU with room, what `max_memory_reserved` and nvidia-smi show. When the GPU is full the
    allocator frees its cached whole segments and retries before it raises an OOM, so a run may need less at
    the edge: the detail gives the lower bound (what stays inside segments in use). Where the real need falls
    between the two depends on details of the sequence -- for two of the three H100 runs it is at the upper
    bound (RESULTS.md "Allocator simulation") -- so the plan charges the upper one. None for stage 0 (plain
    PyTorch/DDP: no DeepSpeed sequence is modelled there; the fixed item stays)."""
    if zero.stage == 0:
        return None
    from zerodoctor.plan import allocator as al

    gaps = al.planner_phase_gaps(
        inputs, zero, t, al.AllocatorConfig(expandable_segments=inputs.expandable_segments)
    )
    mode = "expandable_segments on" if inputs.expandable_segments else "default allocator"
    return {
        phase: Item(
            ALLOCATOR_ITEM,
            g.gap,
            f"simulated ({mode}): cached blocks and split segments reserved beyond the allocated peak; when the "
            f"GPU is full the allocator frees its cached whole segments and retries first, and at least "
            f"{g.floor_gap / GIB:.2f} GiB of it stays (inside segments in use)",
            "c10/cuda/CUDACachingAllocator.cpp (malloc, get_free_block, should_split, release_cached_blocks); "
            "plan/allocator.py (checked on H100 readings: benchmarks/plan_allocator.py)",
        )
        for phase, g in gaps.items()
    }


def host_baseline(inputs: PlanInputs, *, training: bool = False) -> Item:
    """The per-process host RSS of every local rank: at load, or once it trains (first step, steady, save)."""
    n_local = inputs.cluster.gpus_per_node
    per_rank = PER_RANK_TRAIN_HOST_BASELINE_BYTES if training else PER_RANK_HOST_BASELINE_BYTES
    name = "PER_RANK_TRAIN_HOST_BASELINE_BYTES" if training else "PER_RANK_HOST_BASELINE_BYTES"
    return Item(
        "process baseline",
        per_rank * n_local,
        f"{n_local} ranks x {per_rank / GIB:.1f} GiB" + (" (a training process)" if training else " (while loading)"),
        f"phases.{name} (docs/memory-model.md)",
    )


def activations_for(inputs: PlanInputs, t: Training, zero: ZeroSettings) -> ActivationEstimate:
    """Activation bytes of one micro-batch for this recipe and strategy (`activations.activation_bytes`)."""
    spec = inputs.model
    pb = t.param_bytes
    return activation_bytes(
        spec,
        micro_batch=t.micro_batch * (2 if t.paired_inputs else 1),
        seq_len=min(t.seq_len, t.longest_sample_tokens or t.seq_len),
        attn_impl=t.attn,
        gradient_checkpointing=t.gradient_checkpointing,
        dtype_bytes=pb,
        lora_rank=t.lora_rank if t.is_peft else 0,
        lora_targets=_activation_targets(inputs, t),
        sequence_parallel=t.sequence_parallel,
        loss_dtype_bytes=pb if spec.loss_in_model_dtype and zero.stage >= 1 else ms.FP32_BYTES,
        # Without DeepSpeed or FSDP (stage 0 here = plain Trainer/DDP) PEFT keeps adapters in fp32
        # (autocast_adapter_dtype=True) and the loss runs under torch.autocast, which computes
        # log_softmax/nll_loss in fp32 whatever the model's own code does. FSDP's MixedPrecision casts
        # adapters to param_dtype like DeepSpeed does.
        lora_adapter_bytes=ms.FP32_BYTES if t.is_peft and zero.stage == 0 and zero.fsdp is None else None,
        trainable_layers=t.freeze_trainable_layers if t.method == "freeze" else None,
        lora_dropout=t.lora_dropout if t.is_peft else 0.0,
        # transformers' activation_checkpointing_enable makes the embedding output require grad, so checkpointed
        # frozen layers keep their input; LLaMA-Factory's own checkpointing function does not.
        frozen_layers_keep_inputs=inputs.framework != "llamafactory",
        loss_shift=loss_shift_for(inputs.transformers_version),
        liger=liger_for(inputs, t, zero),
        cut_ce=cce_for(inputs, t, zero),
    )


def _head_grad_charged(inputs: PlanInputs, t: Training, zero: ZeroSettings) -> bool:
    """Under ZeRO-2/3 a full fine-tune's head gradient is the very tensor the "full-size gradient before
    reduce-scatter" item charges when the head is the largest trainable tensor."""
    p = inputs.model.params
    head = p.embedding if p.tied_embeddings else p.lm_head
    trains = t.method == "full" or _head_saved(inputs, t)
    return zero.stage >= 2 and zero.fsdp is None and trains and head >= _largest_trainable_tensor(inputs, t)


def _head_saved(inputs: PlanInputs, t: Training) -> bool:
    """A LoRA run trains a copy of the output layer: `modules_to_save` names it (or the embedding it is tied to)."""
    if t.method == "full" or not t.trainable_modules:
        return False
    wanted, tied = set(t.trainable_modules), inputs.model.params.tied_embeddings
    return any(
        _named_module(m, wanted) and (is_output_layer(m.path) or (tied and m.kind == "embedding"))
        for m in inputs.model.modules
    )


def liger_for(inputs: PlanInputs, t: Training, zero: ZeroSettings) -> LigerKernels | None:
    """The Liger kernels of a run with `liger_kernel` on (`liger_plan`). Under ZeRO-2/3 the head's gradient that the
    fused loss makes in the forward is the very tensor the "full-size gradient before reduce-scatter" item charges
    when the head is the largest trainable tensor: it is charged there only."""
    kernels, _ = liger_plan(inputs, t)
    if kernels is None:
        return None
    return replace(kernels, head_grad_charged=kernels.fused_linear_ce and _head_grad_charged(inputs, t, zero))


def cce_for(inputs: PlanInputs, t: Training, zero: ZeroSettings) -> CutCrossEntropy | None:
    """Cut Cross-Entropy of a run with `cut_cross_entropy` on (`plan/cce.py`): None when it is off; when Liger's fused
    loss runs instead (`liger_for`: the HF Trainer applies Liger after the plugin's pre-model-load patch; in axolotl
    both plugins patch at pre_model_load and the one listed last wins, which the run reader resolves,
    `setup/run.py _axolotl_liger_after_cce`); for a remote-code
    model (`ModelSpec.remote_code`: patched only by axolotl >= 0.13.1 and only for its CCE fork's types, so the
    larger case with the release unknown); and for preference training, whose forward passes no labels (TRL's
    DPO/KTO compute the log-probabilities from the logits), so `use_lce` is false."""
    if not t.cut_cross_entropy or t.paired_inputs or t.reference_model:
        return None
    spec = inputs.model
    liger = liger_for(inputs, t, zero)
    if spec.remote_code or (liger is not None and liger.fused_linear_ce):
        return None
    return CutCrossEntropy(
        head_grad_charged=_head_grad_charged(inputs, t, zero), head_trains=_head_saved(inputs, t)
    )


def liger_plan(inputs: PlanInputs, t: Training) -> tuple[LigerKernels | None, str]:
    """The Liger kernels a run gets (`plan/liger.py`) and, for the activations item, why they differ from the type's
    defaults, in the run's own values. None when Liger is off, when liger_kernel has no patch for the model type, or
    when the HF Trainer of a transformers release before `TRANSFORMERS_PATCHES_PEFT_FROM` gets a PeftModel and patches
    nothing. An unknown transformers version is planned as such a release: the larger case, as `host_save` plans an
    unknown version's save (a wrong guess the other way would show a LoRA run fitting by the logits it really
    materialises, 16.9 against 42.1 GiB in review R2's Llama-3-8B case); `--env` gives the version. Paired and
    reference-model runs keep the logits: LLaMA-Factory turns the fused loss off for every stage but pt/sft
    (`require_logits`), TRL's DPO computes its log-probabilities from the logits (its own chunked Liger DPO loss is
    not modelled: the logits are its upper bound); the RMSNorm and SwiGLU patches stay."""
    if not t.liger_kernel:
        return None, ""
    mt = inputs.model.model_type
    v = inputs.transformers_version
    if t.is_peft and not t.liger_at_load and inputs.framework != "llamafactory" and not trainer_patches_peft_model(v):
        why = f"transformers {v}" if v else "transformers' version unknown (pass --env to read it), planned as"
        return None, (
            f"; Liger Kernel off: {why} before {TRANSFORMERS_PATCHES_PEFT_FROM}, whose Trainer patches only a "
            "PreTrainedModel, and a LoRA run hands it a PeftModel (\"No liger kernels will be applied\", "
            "huggingface/transformers#34016): planned as HF"
        )
    config = {k: on for k, on in t.liger_kernel_config if k in LIGER_CONFIG_KEYS}
    kernels = liger_kernels(mt, inputs.liger_version, config if inputs.framework != "llamafactory" else None)
    if kernels is None:
        return None, f"; Liger Kernel not applied: liger_kernel has no patch for model_type '{mt}': planned as HF"
    if (t.paired_inputs or t.reference_model) and kernels.fused_linear_ce:
        loss = "paired (chosen/rejected) inputs" if t.paired_inputs else "a reference model"
        return replace(kernels, fused_linear_ce=False), (
            f"; Liger fused loss off: a loss with {loss} needs the logits (LLaMA-Factory require_logits; TRL's own "
            "Liger preference loss is not modelled): logits planned, their upper bound"
        )
    if not kernels.fused_linear_ce:
        why = (
            "liger_kernel_config fused_linear_cross_entropy: false"
            if config.get("fused_linear_cross_entropy") is False
            else f"apply_liger_kernel_to_{mt} defaults to fused_linear_cross_entropy=False"
        )
        return kernels, f"; Liger fused loss off ({why}): logits planned"
    return kernels, ""


KBIT_PARAMS_ITEM = "k-bit preparation: unquantised weights upcast to fp32"
KBIT_STREAM_ITEM = "k-bit preparation: fp32 residual stream"


def kbit_params_item(prep: KbitPreparation, pb: int) -> Item:
    """What the k-bit preparation's fp32 casts add to the frozen base (`qlora_frozen_bytes` counts them 16-bit)."""
    what = (
        "embeddings, norms, biases and the output layer"
        if prep.mode == "peft"
        else "norms and the biases bitsandbytes casts to their fp32 input (embedding and head back in bf16)"
    )
    return Item(
        KBIT_PARAMS_ITEM,
        prep.upcast_params * (ms.FP32_BYTES - pb),
        f"{kbit.MODE_TITLES.get(prep.mode, prep.mode)} ({prep.why}): {prep.upcast_params:,} parameters ({what}) in fp32, "
        f"{ms.FP32_BYTES - pb} B more each; no DeepSpeed or FSDP casts them back",
        kbit.PEFT_SOURCE if prep.mode == "peft" else kbit.NORMS_SOURCE,
    )


def kbit_stream_item(
    inputs: PlanInputs, t: Training, zero: ZeroSettings, act: ActivationEstimate, prep: KbitPreparation
) -> Item:
    """The rise of the activation peak from the fp32 residual stream the k-bit preparation causes
    (`kbit_prep.stream_cost`), beside the 16-bit estimate of `activations_for`."""
    act32 = activations_for(inputs, replace(t, precision="fp32"), zero)
    cost = kbit.stream_cost(act, act32, prep, checkpointing=t.gradient_checkpointing, dtype_bytes=t.param_bytes)
    kept, bwd = (
        ("their checkpointed inputs", "the layer recomputed in backward and its gradients")
        if t.gradient_checkpointing
        else ("their saved tensors (as fp32 layers: at most)", "a layer's gradients in backward")
    )
    detail = (
        f"{prep.fp32_layers} of {inputs.model.params.num_layers} decoder layers keep {kept} in fp32 "
        f"(+{cost.saved / GIB:.2f} GiB); {bwd} in fp32, at most +{cost.recompute / GIB:.2f} GiB"
    )
    if cost.head_copy:
        detail += (
            f"; autocast's {t.param_bytes}-byte copy of the fp32 output layer kept until its backward "
            f"(+{cost.head_copy / GIB:.2f} GiB)"
        )
    source = f"{kbit.STREAM_SOURCE}; {kbit.HEAD_COPY_SOURCE}" if cost.head_copy else kbit.STREAM_SOURCE
    return Item(KBIT_STREAM_ITEM, cost.rise, detail + f": the activation peak rises {cost.rise / GIB:.2f} GiB", source)


LIGER_LOSS_ITEM = "Liger fused linear cross-entropy (no logits)"
"""`liger_loss_item`: training only (`lce_forward` materialises the logits outside training)."""
CCE_LOSS_ITEM = "Cut Cross-Entropy (no logits)"
"""`cce_loss_item`: the training step's; an evaluation forward runs CCE too (`eval_phase`, no logits there either)."""
NORM_HEAD_ITEM = "Baichuan2 NormHead: normalised copy of the head weight"
"""Only in training: `NormHead.forward` normalises the weight into a copy only `if self.training` (an evaluation's
first forward normalises the weight in place instead)."""

TRAINING_ONLY_ITEMS = frozenset(
    {
        "full-size gradient before reduce-scatter",
        "reduce-scatter: flattened copy of the IPG bucket",
        "offload_optimizer: a gradient slice in fp64 for its norm",
        "offload_optimizer: a gradient partition on the GPU for its fp64 norm and fp32 copy",
        "activations + logits/loss",
        "loss: shifted fp32 copy of the logits (transformers < 4.49)",
        NORM_HEAD_ITEM,
        LIGER_LOSS_ITEM,
        CCE_LOSS_ITEM,
        "vision tower + resampler activations (images)",
        KBIT_STREAM_ITEM,
    }
)
"""Steady-step GPU items of the backward pass (saved activations, gradients on their way to the reduce): an
evaluation forward under torch.no_grad() has none of them."""

EVAL_SOURCE = (
    "transformers trainer.py evaluation_loop / prediction_step (torch.no_grad(); the loss when the batch has labels; "
    "logits kept unless prediction_loss_only, moved to the host every eval_accumulation_steps), "
    "models/llama/modeling_llama.py (use_cache off only when gradient checkpointing and self.training); "
    "LLaMA-Factory model/model_utils patcher (use_cache False for training); plan/activations.py eval_forward_bytes"
)


def _no_grad_forward(
    inputs: PlanInputs,
    t: Training,
    zero: ZeroSettings,
    *,
    micro_batch: int,
    seq_len: int,
    keep_logits: bool = False,
    use_cache: bool = False,
    cut_cross_entropy: bool = False,
) -> EvalForward:
    """A forward under no_grad with labels in the batch (an evaluation step, a reference model's forward) in the run's
    dtypes: the loss in the model dtype only where the model computes it so under DeepSpeed; with
    `cut_cross_entropy`, the patched forward's Cut Cross-Entropy instead (`plan/cce.py`)."""
    spec = inputs.model
    return eval_forward_bytes(
        spec,
        micro_batch=micro_batch,
        seq_len=seq_len,
        attn_impl=t.attn,
        dtype_bytes=t.param_bytes,
        loss_dtype_bytes=t.param_bytes if spec.loss_in_model_dtype and zero.stage >= 1 else ms.FP32_BYTES,
        loss_shift=loss_shift_for(inputs.transformers_version),
        sequence_parallel=t.sequence_parallel,
        keep_logits=keep_logits,
        use_cache=use_cache,
        cut_cross_entropy=cut_cross_entropy,
    )


def eval_phase(
    inputs: PlanInputs, t: Training, zero: ZeroSettings, steady_gpu: tuple[Item, ...], steady_host: tuple[Item, ...]
) -> Phase | None:
    """The evaluation the run does during or after training (`t.eval_micro_batch`; None = none): every model state
    of the steady step stays resident (the optimizer states too; ZeRO-3 fetches the same working set), no tensor is
    saved for backward and no gradient moves, and the forward runs at the evaluation batch with the loss computed
    (`activations.eval_forward_bytes`). The allocator item is the steady step's (not replayed for evaluation)."""
    if not t.eval_micro_batch:
        return None
    pb = t.param_bytes
    seq = min(t.seq_len, t.longest_sample_tokens or t.seq_len)
    cut = cce_for(inputs, t, zero) is not None
    ev = _no_grad_forward(
        inputs,
        t,
        zero,
        micro_batch=t.eval_micro_batch,
        seq_len=seq,
        keep_logits=t.eval_keeps_logits,
        # LLaMA-Factory's patcher sets config.use_cache = False for training ("KV cache is disabled during
        # training"); HF Trainer leaves the model config's (true for the catalog's causal LMs) and eval mode uses it.
        use_cache=inputs.framework != "llamafactory",
        # CCE's `use_lce(labels, training)` is true in eval mode too (`train_only` off): no logits are made
        cut_cross_entropy=cut,
    )
    binding = "the loss" if ev.loss >= ev.layer else "one layer's tensors"
    item = Item(
        "evaluation forward (no_grad) at the eval batch",
        ev.peak,
        f"eval batch {t.eval_micro_batch} x seq {seq} = {ev.tokens:,} tokens, no saved tensors: max(one layer "
        f"{ev.layer / GIB:.2f} GiB, {'Cut Cross-Entropy (no logits)' if cut else 'logits + loss'} "
        f"{ev.loss / GIB:.2f} GiB) -- {binding} binds"
        + (
            f"; + the batch's {pb}-byte logits kept for metrics ({ev.kept_logits / GIB:.2f} GiB; every eval step "
            "adds one until eval_accumulation_steps moves them to the host: a lower bound)"
            if ev.kept_logits
            else "; only the loss is kept ("
            + ("Cut Cross-Entropy returns no logits" if cut else "prediction_loss_only, or no compute_metrics")
            + ")"
        )
        + (
            f"; + every layer's KV cache ({ev.kv_cache / GIB:.2f} GiB: use_cache, eval mode)"
            if ev.kv_cache
            else "; no KV cache (use_cache off for training)"
        ),
        EVAL_SOURCE,
    )
    gpu = [i for i in steady_gpu if i.name not in TRAINING_ONLY_ITEMS]
    if without_engine(inputs, zero):
        # A torch optimizer's param.grad: HF Trainer calls model.zero_grad() after every step, which frees them
        # (set_to_none, the default since torch 2.0); DeepSpeed's gradient partitions are persistent buffers.
        gpu = [i for i in gpu if i.name != f"model states: {ms.GRAD16}"]
    return Phase(
        "eval",
        (*gpu, item),
        steady_host,
        f"evaluation at per_device_eval_batch_size {t.eval_micro_batch}: model states resident, no saved activations",
    )


HOLDS_POLICY_LOGITS = ("llamafactory", "hf")
"""Frameworks whose DPO/KTO step keeps the policy's fp32 logits alive through the reference model's forward:
LLaMA-Factory's `concatenated_forward` returns `all_logits.to(torch.float32)` split into chosen/rejected, read by the
metrics after `compute_reference_log_probs` (train/dpo/trainer.py `get_batch_loss_metrics` at 3c4f8eaa); TRL's
DPOTrainer likewise keeps `policy_chosen_logits` for its metrics. OpenRLHF's `concatenated_forward` returns only the
log-probs (openrlhf/trainer/dpo_trainer.py at 6a13d95)."""


def reference_forward_item(
    inputs: PlanInputs, t: Training, zero: ZeroSettings, act: ActivationEstimate, working_set: int
) -> Item:
    """DPO/KTO with a reference model: the policy runs first, then the reference model's forward under no_grad
    (LLaMA-Factory `get_batch_loss_metrics`, TRL, OpenRLHF: the same order), while the policy's saved tensors (its
    fp32 log-probs among them) and -- in the frameworks of `HOLDS_POLICY_LOGITS` -- its fp32 logits are alive. The
    reference forward's own loss at that moment is the evaluation's (`activations.eval_forward_bytes`: the batch has
    labels in LLaMA-Factory, so the model computes its loss: 16-bit logits + fp32 upcast + log-probs, 3 fp32 tensors up
    to transformers 4.45), and after it the framework's log-probs of the reference logits (fp32 logits, the
    contiguous copy of their `[:, :-1]` slice that `log_softmax` makes, its output): the larger of the two. Under ZeRO-3 the reference engine (a second `deepspeed.initialize`, TRL
    `_prepare_deepspeed`) fetches its own output layer while the policy's coordinator still keeps its own (used first
    in backward, within max_reuse_distance): at least the two heads, the lower bound charged. The item is what that
    moment exceeds the activation peak by."""
    spec = inputs.model
    pb = t.param_bytes
    seq = min(t.seq_len, t.longest_sample_tokens or t.seq_len)
    rows = t.micro_batch * (2 if t.paired_inputs else 1)
    tokens = rows * -(-seq // max(t.sequence_parallel, 1))
    held = tokens * spec.params.vocab_size * ms.FP32_BYTES if inputs.framework in HOLDS_POLICY_LOGITS else 0
    ref = _no_grad_forward(inputs, t, zero, micro_batch=rows, seq_len=seq)
    # The framework's own log-probs of the reference logits (LLaMA-Factory get_batch_logps, TRL, OpenRLHF):
    # `logits.to(float32)`, then `log_softmax` of the `[:, :-1, :]` slice, which the kernel first makes contiguous:
    # three fp32 tensors of the logits' size at once (recorded on the CPU, tests/plan/test_reference_forward.py).
    logps = 3 * tokens * spec.params.vocab_size * ms.FP32_BYTES
    ref_part = max(ref.peak, logps)
    head = spec.params.lm_head or spec.params.embedding
    heads = max(0, 2 * head * pb - working_set) if zero.stage == 3 and working_set else 0
    moment = act.saved_total + held + ref_part + heads
    charged = max(0, moment - act.peak)
    return Item(
        "reference model forward while the policy's logits are held (DPO/KTO)",
        charged,
        f"policy saved tensors {act.saved_total / GIB:.2f} GiB + its fp32 logits held by the framework "
        f"{held / GIB:.2f} GiB + the reference forward's max(logits and loss {ref.peak / GIB:.2f}, fp32 logits + the "
        f"log_softmax's contiguous copy and output {logps / GIB:.2f}) GiB ({tokens:,} tokens)"
        + (f" + both engines' output layers over the working set {heads / GIB:.2f} GiB" if heads else "")
        + f" = {moment / GIB:.2f} GiB, {charged / GIB:.2f} GiB over the activation peak",
        "LLaMA-Factory src/llamafactory/train/dpo/trainer.py concatenated_forward / get_batch_loss_metrics / "
        "compute_reference_log_probs at 3c4f8eaa; TRL DPOTrainer (_prepare_deepspeed, concatenated_forward); "
        "openrlhf/trainer/dpo_trainer.py at 6a13d95 (logps only); DeepSpeed partitioned_param_coordinator.py "
        "__params_to_release",
    )


def dequantised_weight_item(inputs: PlanInputs, t: Training) -> Item:
    """QLoRA: the largest quantised Linear dequantised to the compute dtype during forward/backward."""
    # bitsandbytes quantises every nn.Linear but the output layer (transformers' bnb integration skips
    # `lm_head`, `_get_keys_to_not_convert`), so only a quantised Linear is ever dequantised; the output
    # layer is already counted at full precision in the frozen weights.
    pb = t.param_bytes
    qlin = max(
        (lin for lin in inputs.model.linear_modules() if not is_output_layer(lin.path)),
        key=lambda lin: lin.in_features * lin.out_features,
    )
    return Item(
        "bnb dequantised weight" if t.quant_method == "bnb" else f"{t.quant_method} dequantised weight",
        qlin.in_features * qlin.out_features * pb,
        f"largest quantised Linear {qlin.path} ({qlin.in_features} x {qlin.out_features}) dequantised "
        f"to {pb} B during forward/backward (lm_head stays unquantised)",
        "bitsandbytes functional.dequantize_4bit in MatMul4Bit; transformers integrations/bitsandbytes.py",
    )


def activation_item(act: ActivationEstimate, t: Training, inputs: PlanInputs) -> Item:
    liger = liger_plan(inputs, t)[1]
    if act.cut_loss is not None:  # Liger's fused loss is off, and Cut Cross-Entropy's runs (`cce_for`)
        liger = liger.replace(": planned as HF", ": planned as Cut Cross-Entropy").replace(
            ": logits planned", ": Cut Cross-Entropy planned"
        )
    if act.liger_layer_delta:
        liger += (
            f"; Liger RMSNorm and SwiGLU save {act.liger_layer_delta / GIB:.2f} GiB less than the HF modules at this "
            "moment (input + fp32 rstd per norm, gate and up outputs per MLP)"
        )
    return Item(
        "activations + logits/loss",
        int(act.peak - act.shifted_copy_peak - act.norm_head_peak - act.fused_loss_peak),
        f"micro batch {t.micro_batch} x seq {min(t.seq_len, t.longest_sample_tokens or t.seq_len)}, "
        f"{act.attention_used or t.attn}, "
        "gradient checkpointing "
        f"{'on' if t.gradient_checkpointing else 'off'}; saved {act.saved_total / GIB:.2f} GiB, "
        f"logits/loss {act.logits_and_loss / GIB:.2f} GiB" + liger + _cce_note(act, t, inputs),
        "plan/activations.py" + ("; " + NORM_SWIGLU_SOURCE if act.liger_layer_delta else ""),
    )


def _cce_note(act: ActivationEstimate, t: Training, inputs: PlanInputs) -> str:
    """Why `cut_cross_entropy` changed nothing, when it did not (`cce_for`): the one reason that applies."""
    if not t.cut_cross_entropy or act.cut_loss is not None:
        return ""
    if act.fused_loss is not None:
        return "; Cut Cross-Entropy not applied: Liger's fused loss replaces the same forward, later (Trainer init)"
    if t.paired_inputs or t.reference_model:
        why = "preference training: its forward passes no labels, so `use_lce` is false"
    elif inputs.model.model_type in CCE_PATCH_TYPES:
        why = (
            f"remote-code {inputs.model.model_type}: axolotl patches its remote modeling file from v0.13.1 only "
            "(#3257); with the release unknown, the larger case"
        )
    else:
        why = (
            f"remote-code {inputs.model.model_type}, not a type of the CCE fork: axolotl >= 0.13.1 stops at start "
            "(`patch_generic` raises), older releases never patch it"
        )
    return f"; Cut Cross-Entropy not applied ({why}): planned as HF"


def cce_loss_item(act: ActivationEstimate, inputs: PlanInputs) -> Item | None:
    """What Apple's Cut Cross-Entropy adds to the activation peak at the loss (`plan/cce.py`), in place of the logits,
    their fp32 upcast and the log-probabilities."""
    c = act.cut_loss
    if c is None:
        return None
    if c.grad_weight:
        weight = f" + dc (the head's gradient) {c.grad_weight / GIB:.2f} GiB"
    elif c.head_trainable:
        weight = " + dc (the head's gradient: charged as the full-size gradient before reduce-scatter)"
    else:
        weight = " (frozen head: no dc)"
    patch = (
        f"; {inputs.model.model_type} through axolotl's generic llama-like patch (>= 0.12.0, experimental)"
        if inputs.model.model_type not in CCE_PATCH_TYPES
        else ""
    )
    return Item(
        CCE_LOSS_ITEM,
        act.fused_loss_peak,
        f"no {c.tokens:,} x {inputs.model.params.vocab_size:,} logits: kept for the backward the final "
        f"hidden states {c.hidden_in / GIB:.2f} GiB, fp32 LSE + int64 label index per label row ({c.rows:,} rows) and "
        f"the fp32 logit average per vocabulary entry; in its backward de {c.grad_input / GIB:.2f} GiB{weight} + the "
        f"int32 vocabulary order{patch}; its rise of the activation peak at the loss",
        CCE_SOURCE,
    )


def liger_loss_item(act: ActivationEstimate, inputs: PlanInputs) -> Item | None:
    """What Liger's fused linear cross-entropy adds to the activation peak at the loss (`plan/liger.py`), in place
    of the logits, their fp32 upcast and the log-probabilities."""
    f = act.fused_loss
    if f is None:
        return None
    vocab = inputs.model.params.vocab_size
    if f.grad_weight:
        weight = f"grad_weight {f.grad_weight / GIB:.2f} GiB"
    elif f.head_trainable:
        weight = "the head's V x H gradient (charged as the full-size gradient before reduce-scatter)"
    else:
        weight = "no weight gradient (frozen head)"
    return Item(
        LIGER_LOSS_ITEM,
        act.fused_loss_peak,
        f"{f.chunks} chunk(s) of {f.chunk_rows} tokens (next_power_of_2(tokens / ceil(vocab / hidden))): kept for the "
        f"backward grad_input {f.grad_input / GIB:.2f} GiB + {weight}; inside its forward the final hidden states "
        f"{f.hidden_in / GIB:.2f} GiB + one {f.chunk_rows} x {vocab:,} logits chunk {f.chunk_logits / GIB:.2f} GiB + "
        f"{f.chunk_step / GIB:.2f} GiB per chunk step + per-token loss {f.loss_rows / GIB:.3f} GiB; "
        "its rise of the activation peak at the loss",
        LIGER_SOURCE,
    )


def activation_items(act: ActivationEstimate, t: Training, inputs: PlanInputs) -> list[Item]:
    """The activations item, and beside it what an older transformers adds to the activation peak at the loss
    (`activations.loss_shift_for`): the shifted contiguous fp32 copy of the logits before 4.49; and Baichuan2's
    normalised head copy (`activations.remote_norm_head`), alive at the loss on top of the (gathered) head."""
    items = [activation_item(act, t, inputs)]
    for fused in (liger_loss_item(act, inputs), cce_loss_item(act, inputs)):
        if fused is not None:
            items.append(fused)
    if act.norm_head_peak > 0:
        p = inputs.model.params
        items.append(
            Item(
                NORM_HEAD_ITEM,
                act.norm_head_peak,
                f"`F.normalize(self.weight)` in NormHead.forward every training step: a {p.vocab_size:,} x "
                f"{p.hidden_size:,} copy in {t.param_bytes} B, saved by `F.linear` for the hidden states' gradient "
                "from the head's forward to its backward (beside the head weight itself, gathered under ZeRO-3); "
                "its rise of the activation peak at the loss",
                NORM_HEAD_SOURCE,
            )
        )
    vision = vision_item(inputs, t)
    if vision is not None:
        items.append(vision)
    if act.shifted_copy_peak > 0:
        shift = loss_shift_for(inputs.transformers_version)
        items.append(
            Item(
                "loss: shifted fp32 copy of the logits (transformers < 4.49)",
                act.shifted_copy_peak,
                f"transformers {inputs.transformers_version}: `logits[..., :-1, :].contiguous()` on the fp32 logits "
                + (
                    "in ForCausalLMLoss, beside the 16-bit logits the caller still holds"
                    if shift == "loss_function"
                    else "in the model's forward, after the 16-bit logits were freed by the upcast"
                )
                + "; the rise of the activation peak over a current transformers",
                "transformers loss/loss_utils.py ForCausalLMLoss (4.46-4.48), models/llama/modeling_llama.py "
                "LlamaForCausalLM.forward (<= 4.45); removed by huggingface/transformers#35646 (4.49)",
            )
        )
    return items


def vision_item(inputs: PlanInputs, t: Training) -> Item | None:
    """MiniCPM-V's vision tower and resampler activations (`activations.vision_activation_bytes`), charged in the
    steady phase beside the language model's: they are saved before the LLM runs and freed by their own backward,
    after the LLM's. The tower keeps anything only when it trains (full fine-tuning, or `vpm` among the
    trainable modules: finetune.py `tune_vision`), the resampler likewise (`resampler`)."""
    named = set(t.trainable_modules)
    full = t.method == "full"
    vis = vision_activation_bytes(
        inputs.model,
        micro_batch=t.micro_batch,
        images_per_sample=t.images_per_sample,
        tower_trainable=full or "vpm" in named,
        resampler_trainable=full or "resampler" in named,
        gradient_checkpointing=t.gradient_checkpointing,
        dtype_bytes=t.param_bytes,
    )
    if vis is None or vis.total == 0:
        return None
    return Item(
        "vision tower + resampler activations (images)",
        vis.total,
        vis.detail,
        "OpenBMB/MiniCPM-V finetune/dataset.py (one image per sample, slice_image), finetune.py (tune_vision, "
        "resampler.requires_grad_); the model's get_vllm_embedding / Resampler.forward; transformers "
        "Idefics2VisionTransformer, torch nn.MultiheadAttention (saved tensors measured: "
        "tests/plan/test_vision_activations.py)",
    )


def _activation_targets(inputs: PlanInputs, t: Training) -> tuple[str, ...]:
    if not t.is_peft:
        return ()
    if isinstance(t.lora_targets, str):
        return tuple(
            sorted({lin.name for lin in inputs.model.linear_modules() if not is_output_layer(lin.path)})
        )
    return tuple(t.lora_targets)


def _param_sizes(inputs: PlanInputs) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """(elements, count) of every parameter tensor: (decoder-layer parameters, the rest); tied heads once."""
    layers: list[tuple[int, int]] = []
    rest: list[tuple[int, int]] = []
    for m in inputs.model.modules:
        if m.tied_to is not None:
            continue
        target = layers if "{i}" in m.path else rest
        if m.kind == LINEAR and m.in_features:
            target.append((m.in_features * m.out_features, m.count))
            if m.bias:
                target.append((m.out_features, m.count))
        elif m.numel:
            target.append((m.numel, m.count))
    return layers, rest


def _per_param_pinned(
    inputs: PlanInputs, t: Training, world: int, pb: int, torch_version: str | None
) -> tuple[int, int]:
    """Pinned bytes of one power-of-two block per parameter partition (ceil(numel / world) x pb): (trainable
    parameters of the base model, frozen ones). Full fine-tuning: all trainable; LoRA/QLoRA: the base is frozen
    (adapters, a few MB, are left out); freeze tuning: the last N layers train."""
    layers, rest = _param_sizes(inputs)
    n_layers = max(inputs.model.params.num_layers, 1)

    def blocks(sizes: list[tuple[int, int]], per: float = 1.0) -> int:
        return sum(
            ms.pinned_bytes(-(-numel // world) * pb, torch_version) * round(count * per)
            for numel, count in sizes
        )

    if t.method == "qlora":
        return 0, 0  # packed 4-bit storage: not modelled per parameter
    if t.method == "full":
        return blocks(layers) + blocks(rest), 0
    if t.method == "freeze":
        k = min(max(t.freeze_trainable_layers, 0), n_layers) / n_layers
        return blocks(layers, k), blocks(layers, 1 - k) + blocks(rest)
    return 0, blocks(layers) + blocks(rest)


def _persistent_params(inputs: PlanInputs, threshold: int) -> int:
    """Parameters small enough to stay un-partitioned: DeepSpeed decides per parameter
    (`ds_numel <= param_persistence_threshold`, partition_parameters.py), so a Linear's bias can persist
    while its weight is partitioned."""
    if threshold <= 0:
        return 0
    total = 0
    for m in inputs.model.modules:
        if m.tied_to is not None:
            continue
        if m.kind == LINEAR and m.in_features:
            weight = m.in_features * m.out_features
            bias = m.out_features if m.bias else 0
            total += m.count * (
                (weight if weight <= threshold else 0) + (bias if 0 < bias <= threshold else 0)
            )
        elif 0 < m.numel <= threshold:
            total += m.total
    return total


def zero3_working_set_numel(
    *,
    partitioned: int,
    largest_module: int,
    max_live: int,
    max_reuse: int,
    prefetch_bucket: int,
    gradient_checkpointing: bool,
    largest_param: int = 0,
) -> int:
    """Elements of ZeRO-3 parameters gathered whole (or being gathered) on a GPU at the peak of forward/backward.

    From DeepSpeed's PartitionedParameterCoordinator (partitioned_param_coordinator.py): a module's
    parameters are fetched whole before it runs (so never less than the largest module); after it runs they
    are kept if they recur within the next `max_reuse_distance` elements of the traced module order. A layer
    recurs in backward (and, with gradient checkpointing, in the recomputed forward first), so at the end of
    the forward pass about R/2 elements are kept (R/3 with checkpointing: each layer appears three times in
    the rest of the trace). Prefetch keeps gathering while fewer than `max_live_parameters` elements are
    available, in `prefetch_bucket_size` steps -- and its loop adds whole parameters until its count reaches
    the room left (`while numel_prefetching < max_params_to_prefetch`), so the set fills up to max_live plus
    the parameter that crosses it, at most `largest_param` (the embedding or head of a large-vocabulary model,
    which the prefetch window reaches at the end of the forward pass). Persistent parameters are not counted
    here. Measured on the engine (2 gloo ranks, parameters AVAILABLE or INFLIGHT):
    benchmarks/plan_zero3_engine.py.
    """
    reuse = max_reuse // (3 if gradient_checkpointing else 2)
    prefetch = max_live + largest_param if prefetch_bucket > 0 and max_live > 0 else 0
    return min(max(partitioned, largest_module), max(largest_module, reuse, prefetch))


def _largest_param(inputs: PlanInputs) -> int:
    """The largest single parameter tensor (a tied head counted once)."""
    layers, rest = _param_sizes(inputs)
    return max((n for n, _ in layers + rest), default=0)


SAFETENSORS_NO_BYTES_COPY = "0.8.0"
"""safetensors `save_file` stopped copying every tensor of a file into a Python `bytes` object before writing it
(`_flatten` / `_tobytes`, `data.tobytes()`, through 0.7.0) and hands the tensors' own memory to the writer
(`_flatten_as_ptr`, huggingface/safetensors#679, first released in 0.8.0)."""


def _shard_item(inputs: PlanInputs, whole_model_bytes: int) -> list[Item]:
    """Rank 0's bytes copy of one safetensors shard while `save_pretrained` writes a host state dict: through
    safetensors 0.7 (an unknown version is charged: the copy is the larger case); none from 0.8."""
    version = parse_version(inputs.safetensors_version)
    if version is not None and not in_range(version, fixed=SAFETENSORS_NO_BYTES_COPY):
        return []
    which = f"safetensors {inputs.safetensors_version}" if version is not None else "safetensors version unknown"
    return [
        Item(
            "safetensors shard being written",
            min(LOAD_SHARD_BYTES, whole_model_bytes),
            f"node 0 only ({which}): one shard of at most {LOAD_SHARD_BYTES / 10**9:.0f} GB (max_shard_size) "
            "copied to bytes",
            "transformers modeling_utils save_pretrained (one shard at a time); safetensors torch.py save_file -> "
            "_flatten/_tobytes (every tensor of the shard as bytes before serialize_file; up to 0.7.0)",
        )
    ]


def _save(
    inputs: PlanInputs,
    t: Training,
    zero: ZeroSettings,
    trainable: int,
    frozen: int,
    whole_model_bytes: int,
    components: list[ms.Component],
) -> tuple[Checkpoint, list[Item], list[Item], str]:
    """The save spike and the bytes on disk (docs/memory-model.md; transformers 5.23 Trainer._save_checkpoint)."""
    p = inputs.model.params
    pb = t.param_bytes
    n_local = inputs.cluster.gpus_per_node
    world = inputs.cluster.world_size
    hf_like = inputs.framework in ("hf", "llamafactory")
    hf_peft = hf_like and t.is_peft  # Trainer.save_model with a PEFT model: only the adapters are written
    # Under ZeRO-3, transformers >= 5.0 gathers only the adapters to rank 0's host; 4.x (and an unknown version)
    # consolidates the whole 16-bit model there first, or with the gather off writes an empty adapter file
    # (plan/host_save.py).
    z3_adapters_only = hf_peft and zero.stage == 3 and hs.peft_z3_save_gathers_adapters_only(inputs.transformers_version)
    plain = without_engine(inputs, zero)
    state_b = trainable_weight_bytes(inputs, t)[0] if plain else ms.FP32_BYTES
    # Without DeepSpeed the optimizer has no master copy: its state alone, in the parameters' dtype.
    opt_state = ms.optimizer_state_bytes_per_param(t.optimizer, state_b) + (0 if plain else ms.FP32_BYTES)
    optimizer_bytes = math.ceil(trainable * opt_state)
    if plain:
        optimizer_bytes = sum(
            math.ceil(n * ms.optimizer_state_bytes_per_param(t.optimizer, b)) for n, b in plain_trainable_groups(inputs, t)
        )
    gpu: list[Item] = []
    host: list[Item] = []
    gather_gpu_bpp = (whole_model_bytes / p.total) if t.method == "qlora" else float(pb)

    if plain:
        # HF Trainer without DeepSpeed: rank 0 alone saves (should_save); save_pretrained takes the model's own
        # state dict (GPU tensors) and safetensors moves each tensor of a shard to the host before writing it.
        weights = trainable * state_b if hf_peft else whole_model_bytes
        kind = "adapter weights only" if hf_peft else "model weights"
        host.append(
            Item(
                "rank 0: safetensors shard copied from the GPU",
                min(LOAD_SHARD_BYTES, weights),
                f"node 0 only: one shard of at most {LOAD_SHARD_BYTES / 10**9:.0f} GB (max_shard_size) on the host",
                "transformers trainer.py _save -> save_pretrained; safetensors torch.py (_tobytes / _to_ndarray: "
                "tensor.to('cpu') for every tensor of the shard)",
            )
        )
    elif zero.stage == 3 and zero.gather_16bit_on_save and not z3_adapters_only:
        gpu.append(
            Item(
                "16-bit gather of the largest module",
                math.ceil(p.largest_module_numel * gather_gpu_bpp),
                f"{p.largest_module_name}: {p.largest_module_numel:,} params, on every rank"
                + (" (brought from host first: offload_param)" if zero.offload_param != "none" else ""),
                "deepspeed/runtime/engine.py _zero3_consolidated_16bit_state_dict",
            )
        )
        if hf_peft:
            floor = hs.TRANSFORMERS_PEFT_Z3_ADAPTERS_ONLY_FROM
            version = (
                f"transformers {inputs.transformers_version} < {floor}"
                if inputs.transformers_version
                else f"transformers version unknown: taken as < {floor}; pass --env from `zerodoctor env`"
            )
            host.append(
                Item(
                    "rank 0: consolidated 16-bit state dict, frozen base included (PEFT)",
                    whole_model_bytes,
                    f"node 0 only: {whole_model_bytes / 10**9:,.0f} GB = the whole model, frozen base included, "
                    f"copied to rank 0's host before PEFT keeps the adapters ({version}; {floor} and later gather "
                    "only the adapters)",
                    hs.SOURCE_FULL_GATHER,
                )
            )
            host.extend(_shard_item(inputs, trainable * pb))
            weights, kind = trainable * pb, "adapter weights only (the whole 16-bit model consolidated on rank 0 first)"
        else:
            host.append(
                Item(
                    "rank 0: consolidated 16-bit state dict",
                    whole_model_bytes,
                    f"node 0 only: {whole_model_bytes / 10**9:,.0f} GB = the whole model copied to rank 0's host",
                    "deepspeed/runtime/engine.py _zero3_consolidated_16bit_state_dict (param.detach().cpu() on rank 0)",
                )
            )
            host.extend(_shard_item(inputs, whole_model_bytes))
            weights, kind = whole_model_bytes, "consolidated 16-bit weights (rank 0)"
    elif z3_adapters_only:
        gpu.append(
            Item(
                "16-bit gather of the adapters",
                math.ceil(trainable * pb / max(p.num_layers, 1)),
                "Trainer gathers only trainable weights (exclude_frozen_parameters=True), layer by layer",
                hs.SOURCE_ADAPTERS_ONLY,
            )
        )
        host.append(
            Item(
                "rank 0: adapter state dict",
                trainable * pb,
                f"node 0 only (transformers {inputs.transformers_version}: the frozen base is not gathered)",
                hs.SOURCE_ADAPTERS_ONLY,
            )
        )
        weights, kind = trainable * pb, "adapter weights only"
    elif zero.stage == 3 and hf_peft:
        # transformers < 5.0: get_state_dict raises ValueError, the Trainer writes `_save(state_dict={})` (an empty
        # adapter file: remove_dummy_checkpoint removes only the model weight files), then the ZeRO shards
        weights, kind = 0, (
            "EMPTY adapter file (gather_16bit_weights_on_model_save false with transformers < "
            f"{hs.TRANSFORMERS_PEFT_Z3_ADAPTERS_ONLY_FROM} or unknown: ZeRO shards only; zero_to_fp32.py recovers "
            "the adapters; huggingface/trl#4416)"
        )
    elif zero.stage == 3:
        weights, kind = 0, "no 16-bit weights (gather_16bit_weights_on_model_save false: ZeRO shards only)"
    elif inputs.framework == "deepspeed":
        # A plain DeepSpeed loop saves with engine.save_checkpoint only (the save_checkpoint moment below).
        weights, kind = trainable * pb, "16-bit weights in the engine checkpoint"
    else:
        # ZeRO-1/2: get_state_dict clones the whole 16-bit model to CPU on every rank.
        host.append(
            Item(
                "every rank: 16-bit state dict on CPU",
                whole_model_bytes * n_local,
                f"{n_local} ranks x {whole_model_bytes / GIB:.1f} GiB (clone_tensors_for_torch_save)",
                "accelerate accelerator.get_state_dict (ZeRO-1/2: clone_tensors_for_torch_save on every rank)",
            )
        )
        weights = trainable * pb if hf_peft else whole_model_bytes
        if not hf_peft:
            # Rank 0 writes that state dict with save_pretrained while it still holds it: safetensors turns every
            # tensor of a shard into bytes before serialising the shard (the same item as the ZeRO-3 save).
            host.extend(_shard_item(inputs, whole_model_bytes))
        kind = "adapter weights only" if hf_peft else "16-bit weights"

    # What save_only_model skips (docs/memory-model.md, docs/known-failures.md).
    gather_false_z3 = zero.stage == 3 and not zero.gather_16bit_on_save and not z3_adapters_only
    skips = not gather_false_z3
    if gather_false_z3:
        why = (
            "ZeRO-3 with stage3_gather_16bit_weights_on_model_save false: Trainer.save_model falls back to "
            "engine.save_checkpoint, which writes the optimizer states anyway; save_only_model only skips the "
            "second copy"
        )
    else:
        why = "save_only_model skips engine.save_checkpoint (optimizer states and ZeRO shards)"
    optimizer_written = optimizer_bytes if (not t.save_only_model or gather_false_z3) else 0
    # engine.save_checkpoint (or the Trainer's optimizer save) runs after save_model has returned and freed its
    # state dict: its host items are a second moment of the save, and the phase charges the larger of the two.
    ckpt: list[Item] = []
    if optimizer_written:
        # torch.save copies each non-CPU storage to the host one at a time (torch/serialization.py::_save).
        if plain:
            # Trainer._save_optimizer_and_scheduler: rank 0 torch.saves optimizer.state_dict(), one state tensor
            # per parameter, each copied to the host in turn.
            one = _largest_trainable_tensor(inputs, t) * state_b
            ckpt.append(
                Item(
                    "torch.save staging of the optimizer state",
                    one,
                    f"rank 0: its largest state tensor {one / GIB:.2f} GiB copied to host",
                    "transformers trainer.py _save_optimizer_and_scheduler; torch/serialization.py _save (each "
                    "non-CPU storage copied to the host)",
                )
            )
            largest = 0
        elif zero.offload_optimizer == "none":
            part = -(-trainable // world)
            largest = (
                ms.FP32_BYTES * min(max(zero.sub_group_size, 1), part)
                if zero.stage == 3
                else ms.FP32_BYTES * part
            )
        else:
            largest = 0
        flat = trainable * pb if zero.stage in (1, 2) and not plain else 0
        # dp rank 0 writes the module first (`_save_checkpoint`: torch.save of module_state_dict, whose ZeRO-1/2
        # parameters are views of the 16-bit flat GPU buffer -- one storage, copied to the host whole) while the
        # other local ranks write their optimizer partitions (`_save_zero_checkpoint`).
        if flat > largest:
            ckpt.append(
                Item(
                    "rank 0: torch.save copies the 16-bit flat parameters to the host",
                    flat,
                    f"node 0 only: bit16_groups_flat, {flat / GIB:.1f} GiB, one GPU storage behind every parameter",
                    "deepspeed/runtime/engine.py _save_checkpoint (module_state_dict); stage_1_and_2.py "
                    "_update_model_bit16_weights (parameters are views of the flat buffer); torch/serialization.py "
                    "_save (storage.cpu())",
                )
            )
        staging_ranks = n_local - (1 if flat > largest else 0)
        if largest and staging_ranks:
            ckpt.append(
                Item(
                    "torch.save staging of optimizer shards",
                    largest * staging_ranks,
                    f"{staging_ranks} ranks x largest GPU storage {largest / GIB:.1f} GiB copied to host",
                    "torch/serialization.py _save (each non-CPU storage copied to the host)",
                )
            )
        if gather_false_z3 and not t.save_only_model:
            why += "; without save_only_model the optimizer states are written twice"
    checkpoint = Checkpoint(weights, kind, optimizer_bytes, skips, why)
    weights_moment = sum(i.bytes for i in host)
    ckpt_moment = sum(i.bytes for i in ckpt)
    if ckpt_moment > weights_moment:
        other = f"; before it, saving the weights: {weights_moment / GIB:.1f} GiB" if host else ""
        host, note = ckpt, f"host peak while the engine checkpoint is written{other}"
    else:
        note = f"engine checkpoint afterwards: {ckpt_moment / GIB:.1f} GiB" if ckpt else ""
    if any(i.name.startswith("rank 0") for i in host):
        note = "node 0 (rank 0 consolidates)" + (f"; {note}" if note else "")
    return checkpoint, gpu, host, note
