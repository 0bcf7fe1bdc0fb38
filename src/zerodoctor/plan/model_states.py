"""Model states per rank under DeepSpeed ZeRO: which tensors exist, how many bytes, on which device.

Pure arithmetic (no torch, no DeepSpeed import). The layout follows DeepSpeed 0.19.8's source, read
tensor by tensor (docs/memory-model.md describes 0.16.5; the differences are noted where they matter), and is
checked against the real engine by `benchmarks/plan_accuracy.py` (<= 1 % per component, world size 1, 2
and 4, ZeRO-2/3, offload none/optimizer/both; results in `benchmarks/RESULTS.md`).

What DeepSpeed holds per rank (P_t trainable, P_f frozen, N data-parallel ranks, b = bytes of the
16-bit/compute dtype):

* ZeRO-3 (`runtime/zero/stage3.py::DeepSpeedZeroOptimizer_Stage3`): 16-bit parameter partitions
  (b.P_t/N, on the GPU, or in one *always pinned* host buffer with `offload_param`), frozen partitions
  (b.P_f/N), the gradient partitions `grad_partitions_flat_buffer` (b.P_t/N, host with
  `offload_optimizer`), the fp32 master partitions (4.P_t/N), fp32 gradients (4.P_t/N: persistent
  per-sub-group host buffers with `offload_optimizer`, otherwise created per sub-group at the optimizer
  step and freed after it), Adam moments (8.P_t/N, allocated at the first step) and one IPG bucket of
  `reduce_bucket_size` elements.
* ZeRO-1/2 (`runtime/zero/stage_1_and_2.py::DeepSpeedZeroOptimizer`): the *whole* flattened 16-bit
  trainable model on every rank (`bit16_groups_flat`, b.P_t), frozen weights as ordinary tensors, the
  gradient partition `grads_in_partition` (ZeRO-2, b.P_t/N), fp32 master and grads and Adam on the
  partition, IPG buckets of `reduce_bucket_size` (x2 with `overlap_comm`), and with optimizer offload
  a pinned 16-bit staging copy of the partition plus two largest-parameter gradient staging buffers.
* Stage 0 with bf16/fp16 (`runtime/fp16/fused_optimizer.py::FP16_Optimizer`): like ZeRO-1/2 with
  N = 1, no buckets, full-size grads.

Granularity: DeepSpeed pads each ZeRO-3 parameter to a multiple of N and each ZeRO-1/2 flat group to a
multiple of 2N elements, and a ZeRO-2 gradient partition holds every parameter that *touches* the
rank's partition in full. Pass `param_numels` (trainable tensor sizes in the model's order) to get those
exactly; without it the counts are P/N rounded up, which is off by at most a few parameters' sizes
(negligible for real models, visible for toy ones).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from zerodoctor.errors import PlanError
from zerodoctor.setup.run import OPTIMIZERS as run_optimizers

# --------------------------------------------------------------------------------------------------
# Names
# --------------------------------------------------------------------------------------------------

PARAM16 = "param16"
"""16-bit trainable parameters: ZeRO-3 partitions (`fp16_partitioned_groups_flat`), ZeRO-1/2 the full
flat buffer (`bit16_groups_flat`)."""
FROZEN16 = "frozen16"
"""Frozen weights (LoRA base): 16-bit, or packed 4-bit for QLoRA; ZeRO-3 partitions them."""
GRAD16 = "grad16"
"""Gradient partition in grad_accum dtype (= model dtype unless `data_types.grad_accum_dtype`)."""
FP32_MASTER = "fp32_master"
FP32_GRAD = "fp32_grad"
GRAD_FLAT_COPY = "grad_flat_copy"
"""Transient flattened 16-bit copy of the gradient partition made at the step before `.to(fp32)`."""
OPTIMIZER_STATES = "optimizer_states"
IPG_BUCKET = "ipg_bucket"
PARAM16_STAGING = "param16_staging"
"""ZeRO-1/2 offload: host 16-bit copy of the partition that the updated fp32 weights go through."""
GRAD_STAGING = "grad_staging"
"""ZeRO-1/2 offload: `temp_grad_buffer_for_{gpu,cpu}_offload`, one largest parameter each."""
SWAP_BUFFER = "swap_buffer"
"""NVMe offload: pinned host buffers the swapper reads/writes through."""

GPU = "gpu"
HOST = "host"
NVME = "nvme"

OFFLOAD_DEVICES = ("none", "cpu", "nvme")
OPTIMIZERS = run_optimizers  # the names setup.run resolves an `optim` to (one list)
PAGED_OPTIMIZERS = ("paged_adamw_32bit", "paged_adamw_8bit", "paged_ademamix_32bit", "paged_ademamix_8bit")
"""bitsandbytes paged optimizers (HF Trainer `optim="paged_adamw_32bit"` / `"paged_adamw_8bit"`): their states are
CUDA unified memory (bitsandbytes functional.get_paged -> cudaMallocManaged), which the driver evicts to host RAM
when the GPU runs out of memory and pages back for the update (Dettmers et al. 2023, QLoRA, "Paged Optimizers").
Their update is one fused kernel per parameter (functional.optimizer_update_32bit / _8bit_blockwise): no
foreach temporaries."""

# --------------------------------------------------------------------------------------------------
# Byte counts, each from the DeepSpeed (or torch/bitsandbytes) code that allocates it
# --------------------------------------------------------------------------------------------------

FP32_BYTES = 4
"""fp32 master weights and fp32 gradients: `master_weights_and_grads_dtype` defaults to fp32
(stage3.py::_create_fp32_partitions, stage_1_and_2.py::__init__ `single_partition_of_fp32_groups`)."""

ADAM_STATE_BYTES = 2 * FP32_BYTES
"""exp_avg + exp_avg_sq, `torch.zeros_like(p.data)` of the fp32 master partition, created inside the
first `step()` (ops/adam/cpu_adam.py::DeepSpeedCPUAdam.step; torch.optim.AdamW `_init_group`)."""

SGD_MOMENTUM_BYTES = FP32_BYTES
"""momentum_buffer, one fp32 tensor per master partition, created at the first step
(torch/optim/sgd.py::_init_group, only when momentum != 0)."""

ADAM_8BIT_STATE_BYTES = 2.0 + 2 * FP32_BYTES / 256
"""bitsandbytes 8-bit Adam: two uint8 states plus one fp32 absmax per 256-element block for each
(bitsandbytes/optim/optimizer.py::Optimizer2State.init_state, blocksize 256)."""
ADEMAMIX_8BIT_STATE_BYTES = 3.0 + 3 * FP32_BYTES / 256
"""bitsandbytes 8-bit AdEMAMix: state1 (2, *p) and state2 uint8, absmax1 (2, blocks) and absmax2 (blocks) fp32
(bitsandbytes/optim/ademamix.py::AdEMAMix.init_state, blocksize 256; review R10, 3)."""

NCCL_START_ALIGNMENT_FACTOR = 2
"""ZeRO-1/2 pads each flat group to a multiple of 2 x N elements so every partition starts 4-byte
aligned (stage_1_and_2.py::__init__ `nccl_start_alignment_factor = 2`)."""

NVME_OPTIMIZER_BUFFER_COUNT = 4
"""`offload_optimizer.buffer_count` default (runtime/zero/offload_config.py::DeepSpeedZeroOffloadOptimizerConfig)."""
NVME_PARAM_BUFFER_COUNT = 5
"""`offload_param.buffer_count` default (offload_config.py::DeepSpeedZeroOffloadParamConfig)."""
NVME_PARAM_BUFFER_SIZE = 100_000_000
"""`offload_param.buffer_size` default, elements (offload_config.py::DeepSpeedZeroOffloadParamConfig)."""
NVME_OPTIMIZER_TENSORS = 3
"""NVMe optimizer swap moves fp32 param + exp_avg + exp_avg_sq per sub-group, each staged through a pinned
buffer of the largest sub-group (swap_tensor/partitioned_optimizer_swapper.py, optimizer_utils.py)."""

LAST_OLD_LAYOUT_VERSION = (0, 16, 5)
"""Versions up to this one (the one the memory model was first written against) pin the ZeRO-1/2 fp32 master unconditionally when
offloading (fixed by deepspeedai/DeepSpeed#7689, 2025-11) and have no 16-bit staging buffer
(added by deepspeedai/DeepSpeed#7309, 2025-05). Later versions follow 0.19.8, the one measured."""


@dataclass(frozen=True)
class Component:
    """One model-state tensor (or family of tensors) that DeepSpeed holds on one rank."""

    name: str
    bytes: int
    device: str
    pinned: bool = False
    lazy: bool = False
    transient: bool = False
    source: str = ""


# --------------------------------------------------------------------------------------------------
# Public functions
# --------------------------------------------------------------------------------------------------


def model_state_components(
    *,
    trainable: int,
    frozen: int,
    stage: int,
    world_size: int,
    offload_optimizer: str = "none",
    offload_param: str = "none",
    param_bytes: int = 2,
    frozen_bytes_per_param: float | None = None,
    frozen_partitioned: bool = True,
    optimizer: str = "adamw",
    pin_memory: bool = True,
    sub_group_size: int = 1_000_000_000,
    reduce_bucket_size: int = 500_000_000,
    overlap_comm: bool | None = None,
    gradient_accumulation_steps: int = 1,
    deepspeed_version: str | None = None,
    param_numels: Sequence[int] | None = None,
    largest_param_numel: int | None = None,
) -> list[Component]:
    """Model-state components held by one rank (the largest rank where ranks differ).

    `trainable`/`frozen` are element counts; `world_size` is the data-parallel size N. Offload devices
    are "none", "cpu" or "nvme"; `offload_param` only exists for ZeRO-3 (DeepSpeed ignores it below
    stage 3, and so does this). `param_bytes` is the width of the model dtype (2 bf16/fp16, 4 fp32),
    which is also the gradient-partition dtype (DeepSpeed's default grad_accum_dtype). `frozen_bytes_per_param`
    defaults to `param_bytes` (QLoRA nf4: ~0.5 plus quantisation constants); `frozen_partitioned=False`
    keeps frozen weights whole on every GPU (QLoRA under ZeRO-3 without `bnb_4bit_quant_storage`).
    `overlap_comm` None means DeepSpeed's default (False below ZeRO-3; ZeRO-3's single bucket does not
    depend on it). `deepspeed_version` <= 0.16.5 selects the older ZeRO-1/2 offload layout.

    `param_numels` (trainable tensor sizes, model order) makes per-tensor padding, ZeRO-3 sub-groups and
    the ZeRO-2 gradient partition exact; `largest_param_numel` sizes the ZeRO-1/2 offload staging buffers
    and bounds the ZeRO-3 sub-group overshoot (taken from `param_numels` when given; 0 otherwise).

    Not included: gathered ZeRO-3 parameters, persistent small parameters (whole copies on every GPU),
    gradients autograd holds before DeepSpeed copies them into a bucket, activations. Raises `PlanError`
    on values DeepSpeed would reject.
    """
    _validate(stage, world_size, offload_optimizer, offload_param, param_bytes, optimizer, trainable, frozen)
    fb = float(param_bytes) if frozen_bytes_per_param is None else float(frozen_bytes_per_param)
    numels = list(param_numels) if param_numels is not None else None
    if numels is not None and sum(numels) != trainable:
        raise PlanError(f"param_numels sum to {sum(numels)}, not trainable={trainable}")
    largest = largest_param_numel if largest_param_numel is not None else (max(numels) if numels else 0)
    old = _is_old_layout(deepspeed_version)
    if stage == 3:
        return _stage3(
            trainable,
            frozen,
            largest,
            world_size,
            offload_optimizer,
            offload_param,
            param_bytes,
            fb,
            frozen_partitioned,
            optimizer,
            pin_memory,
            sub_group_size,
            reduce_bucket_size,
            numels,
        )
    return _stage012(
        trainable,
        frozen,
        stage,
        world_size,
        offload_optimizer,
        param_bytes,
        fb,
        optimizer,
        pin_memory,
        reduce_bucket_size,
        bool(overlap_comm),
        gradient_accumulation_steps,
        numels,
        largest,
        old,
    )


def totals(components: list[Component], *, after_first_step: bool) -> dict[str, int]:
    """Bytes per device. Before the first step: what exists after `deepspeed.initialize` (no lazy
    optimizer states, no step transients). After: the peak of the first optimizer step (all of them).

    `host_pinned` is the requested size of pinned host buffers (a subset of `host`);
    `host_pinned_rounded` is what PyTorch's pinned allocator really reserves for them (`pinned_bytes`).
    """
    out = {GPU: 0, HOST: 0, "host_pinned": 0, "host_pinned_rounded": 0, NVME: 0}
    for c in components:
        if not after_first_step and (c.lazy or c.transient):
            continue
        out[c.device] += c.bytes
        if c.device == HOST and c.pinned:
            out["host_pinned"] += c.bytes
            out["host_pinned_rounded"] += pinned_bytes(c.bytes)
    return out


def pinned_bytes(
    nbytes: int, torch_version: str | None = None, *, max_round_threshold: int | None = None
) -> int:
    """Bytes PyTorch's CachingHostAllocator reserves for one pinned block of `nbytes`.

    It rounds every block up to the next power of two (`c10::llvm::PowerOf2Ceil` in
    ATen/core/CachingHostAllocator.h, since torch 1.11: pytorch#95823) unless the block is larger than
    `pinned_max_round_threshold` (PYTORCH_CUDA_ALLOC_CONF / allocator config, torch >= 2.10; default
    unlimited, c10/core/AllocatorConfig.h). `torch_version` is accepted for when that default changes;
    through 2.13 every version rounds.
    """
    del torch_version  # every release through 2.13 rounds by default (docs/memory-model.md)
    if nbytes <= 0:
        return 0
    if max_round_threshold is not None and nbytes > max_round_threshold:
        return nbytes
    return 1 << (nbytes - 1).bit_length()


def optimizer_state_bytes_per_param(optimizer: str, state_dtype_bytes: int = FP32_BYTES) -> float:
    """Optimizer-state bytes per trainable element whose master copy is `state_dtype_bytes` wide."""
    if optimizer == "adamw":
        return 2.0 * state_dtype_bytes
    if optimizer == "sgd":
        return float(state_dtype_bytes)
    if optimizer in ("adamw_8bit", "paged_adamw_8bit"):
        return ADAM_8BIT_STATE_BYTES
    if optimizer in ("ademamix", "paged_ademamix_32bit"):
        # bitsandbytes AdEMAMix (transformers optim "ademamix*"): fast and slow EMA stacked in state1 plus nu in state2,
        # fp32 in its 32-bit mode (bitsandbytes/optim/ademamix.py init_state)
        return 3.0 * FP32_BYTES
    if optimizer in ("ademamix_8bit", "paged_ademamix_8bit"):
        # optim_bits 8: the three states uint8, absmax1 (2, blocks) + absmax2 (blocks) fp32 per 256 elements
        return ADEMAMIX_8BIT_STATE_BYTES
    if optimizer == "paged_adamw_32bit":
        # bitsandbytes Optimizer2State with optim_bits=32: two fp32 states whatever the parameter's dtype
        # (bitsandbytes/optim/optimizer.py init_state: torch.zeros_like(p, dtype=torch.float32)).
        return 2.0 * FP32_BYTES
    raise PlanError(f"unknown optimizer {optimizer!r}", hint=f"use one of {', '.join(OPTIMIZERS)}")


# --------------------------------------------------------------------------------------------------
# ZeRO-3
# --------------------------------------------------------------------------------------------------


def _optimizer_states(part: int, optimizer: str, device: str) -> Component:
    """The optimizer's own state for a rank's partition, created at the first step (every stage alike)."""
    return Component(
        OPTIMIZER_STATES,
        math.ceil(part * optimizer_state_bytes_per_param(optimizer)),
        device,
        lazy=True,
        source="deepspeed/ops/adam/cpu_adam.py::DeepSpeedCPUAdam.step (lazy)",
    )


def _stage3(
    trainable: int,
    frozen: int,
    largest: int,
    n: int,
    off_opt: str,
    off_param: str,
    pb: int,
    fb: float,
    frozen_partitioned: bool,
    optimizer: str,
    pin: bool,
    sub_group_size: int,
    bucket: int,
    numels: list[int] | None,
) -> list[Component]:
    # Each parameter is padded to a multiple of N and split evenly (partition_parameters.py::_aligned_size).
    part = sum(_ceil_div(x, n) for x in numels) if numels is not None else _ceil_div(trainable, n)
    sub_groups = _stage3_sub_groups(numels, n, sub_group_size) if numels is not None else []
    if sub_groups:
        largest_sub = max(sub_groups)
    else:
        # A sub-group closes at the first parameter that takes it to sub_group_size or beyond, so it can
        # overshoot by up to one parameter partition (upper bound when only counts are known).
        overshoot = max(_ceil_div(largest, n) - 1, 0)
        largest_sub = min(part, max(sub_group_size, 1) + overshoot)
    out: list[Component] = []
    param_dev = _device(off_param)
    opt_dev = _device(off_opt)
    src = "deepspeed/runtime/zero/stage3.py"

    if part:
        # offload_param: one flat host buffer per param group, pinned unconditionally
        # (stage3.py::_create_param_groups_fp16_flat_cpu_memory calls pin_memory without checking the flag).
        out.append(
            Component(
                PARAM16,
                part * pb,
                param_dev,
                pinned=param_dev == HOST,
                source=f"{src}::_create_fp16_partitions_with_defragmentation",
            )
        )
    if frozen:
        if frozen_partitioned:
            # Frozen params keep their ds_tensor partition where zero.Init put it; pinned iff pin_memory
            # (partition_parameters.py::Init._partition_param).
            fbytes = math.ceil(_ceil_div(frozen, n) * fb)
            out.append(
                Component(
                    FROZEN16,
                    fbytes,
                    param_dev,
                    pinned=param_dev == HOST and pin,
                    source="deepspeed/runtime/zero/partition_parameters.py::_partition_param",
                )
            )
        else:
            # QLoRA without bnb_4bit_quant_storage: bitsandbytes weights are not ZeRO parameters and
            # stay whole on every GPU (docs/memory-model.md, docs/known-failures.md).
            out.append(
                Component(
                    FROZEN16,
                    math.ceil(frozen * fb),
                    GPU,
                    source="transformers modeling_utils (quantised loads skip zero.Init; bnb uint8 storage cannot be partitioned)",
                )
            )
    if not part:
        return out
    # grad_partitions_flat_buffer: self.device is the CPU with offload_optimizer (stage3.py:333).
    grad_dev = GPU if off_opt == "none" else HOST
    out.append(
        Component(
            GRAD16,
            part * pb,
            grad_dev,
            pinned=grad_dev == HOST and pin,
            source=f"{src}::_setup_for_real_optimizer grad_partitions_flat_buffer",
        )
    )
    if not (pb == FP32_BYTES and off_opt == "none"):
        # fp32 training without offload aliases the master to the param partition (_create_fp32_partitions).
        out.append(
            Component(FP32_MASTER, part * FP32_BYTES, opt_dev, source=f"{src}::_create_fp32_partitions")
        )
    if off_opt == "none":
        out.append(
            Component(
                FP32_GRAD,
                largest_sub * FP32_BYTES,
                GPU,
                transient=True,
                source=f"{src}::_prepare_fp32_grad_for_sub_group",
            )
        )
        out.append(
            Component(
                GRAD_FLAT_COPY,
                largest_sub * pb,
                GPU,
                transient=True,
                source=f"{src}::_prepare_fp32_grad_for_sub_group flatten()",
            )
        )
    else:
        # Per-sub-group fp32 grad buffers, pinned iff pin_memory (initialize_optimizer_states); NVMe:
        # swapped out with the optimizer state (_optimizer_states_and_gradient_swap_out).
        out.append(
            Component(
                FP32_GRAD,
                part * FP32_BYTES,
                opt_dev,
                pinned=opt_dev == HOST and pin,
                source=f"{src}::initialize_optimizer_states subgroup_gradient_buffer",
            )
        )
    out.append(_optimizer_states(part, optimizer, opt_dev))
    if bucket:
        # One contiguous IPG buffer per communication dtype, allocated at init (contiguous_gradients).
        out.append(
            Component(
                IPG_BUCKET, bucket * pb, GPU, source=f"{src}::_setup_for_real_optimizer ipg bucket.buffer"
            )
        )
    if off_opt == "nvme":
        out.append(
            Component(
                SWAP_BUFFER,
                NVME_OPTIMIZER_BUFFER_COUNT * largest_sub * FP32_BYTES,
                HOST,
                pinned=True,
                source="deepspeed/runtime/swap_tensor/optimizer_utils.py",
            )
        )
    if off_param == "nvme":
        out.append(
            Component(
                SWAP_BUFFER,
                NVME_PARAM_BUFFER_COUNT * NVME_PARAM_BUFFER_SIZE * pb,
                HOST,
                pinned=True,
                source="deepspeed/runtime/swap_tensor/partitioned_param_swapper.py",
            )
        )
    return out


def _stage3_sub_groups(numels: list[int], n: int, sub_group_size: int) -> list[int]:
    """Partition numel of each sub-group, as stage3.py::_create_fp16_sub_groups forms them."""
    parts = [_ceil_div(x, n) for x in numels]
    if sub_group_size >= sum(parts):
        return [sum(parts)]
    groups, acc = [], 0
    for i, p in enumerate(parts):
        acc += p
        if acc >= sub_group_size or i == len(parts) - 1:
            groups.append(acc)
            acc = 0
    return groups


# --------------------------------------------------------------------------------------------------
# Stage 0, ZeRO-1 and ZeRO-2
# --------------------------------------------------------------------------------------------------


def _stage012(
    trainable: int,
    frozen: int,
    stage: int,
    n: int,
    off_opt: str,
    pb: int,
    fb: float,
    optimizer: str,
    pin: bool,
    bucket: int,
    overlap: bool,
    gas: int,
    numels: list[int] | None,
    largest: int,
    old_layout: bool,
) -> list[Component]:
    src = "deepspeed/runtime/zero/stage_1_and_2.py"
    out: list[Component] = []
    if frozen:
        out.append(
            Component(
                FROZEN16,
                math.ceil(frozen * fb),
                GPU,
                source="frozen params stay ordinary module tensors (not in bit16_groups)",
            )
        )
    if not trainable:
        return out
    if stage == 0:
        return out + _stage0(trainable, pb, optimizer)
    # Flat group padded to a multiple of 2N elements, then split evenly (stage_1_and_2.py::__init__).
    align = NCCL_START_ALIGNMENT_FACTOR * n
    flat = _ceil_div(trainable, align) * align
    part = flat // n
    opt_dev = GPU if off_opt == "none" else HOST
    out.append(Component(PARAM16, flat * pb, GPU, source=f"{src}::__init__ bit16_groups_flat"))
    if off_opt == "none":
        if stage == 2:
            # Every param that touches the partition is copied in full (copy_grads_in_partition).
            g = _zero2_grad_partition(numels, n, flat) if numels is not None else part
            out.append(
                Component(GRAD16, g * pb, GPU, source=f"{src}::copy_grads_in_partition grads_in_partition")
            )
        else:
            # ZeRO-1 keeps full-size param.grad until the boundary reduce (reduce_gradients).
            out.append(Component(GRAD16, trainable * pb, GPU, source=f"{src}::reduce_gradients (param.grad)"))
        out.append(
            Component(
                FP32_GRAD, part * FP32_BYTES, GPU, transient=True, source=f"{src}::step single_grad_partition"
            )
        )
        out.append(
            Component(
                GRAD_FLAT_COPY,
                part * pb,
                GPU,
                transient=True,
                source=f"{src}::step flatten(averaged_gradients)",
            )
        )
    else:
        if gas > 1:
            g = _zero2_grad_partition(numels, n, flat) if numels is not None else part
            out.append(
                Component(
                    GRAD16,
                    g * pb,
                    HOST,
                    pinned=pin,
                    source=f"{src}::async_accumulate_grad_in_cpu_via_gpu accumulated_grads_in_cpu",
                )
            )
        out.append(
            Component(
                FP32_GRAD, part * FP32_BYTES, HOST, pinned=pin, source=f"{src}::initialize_optimizer_states"
            )
        )
        if not old_layout:
            out.append(
                Component(
                    PARAM16_STAGING,
                    part * pb,
                    HOST,
                    pinned=pin,
                    source=f"{src}::__init__ param_buffer_of_bit16_for_cpu_offload_groups",
                )
            )
        if largest:
            out.append(
                Component(
                    GRAD_STAGING,
                    largest * pb,
                    GPU,
                    source=f"{src}::__init__ temp_grad_buffer_for_gpu_offload",
                )
            )
            out.append(
                Component(
                    GRAD_STAGING,
                    largest * pb,
                    HOST,
                    pinned=pin,
                    source=f"{src}::__init__ temp_grad_buffer_for_cpu_offload",
                )
            )
    master_pinned = off_opt != "none" and (pin or old_layout)
    out.append(
        Component(
            FP32_MASTER,
            part * FP32_BYTES,
            opt_dev,
            pinned=master_pinned,
            source=f"{src}::__init__ single_partition_of_fp32_groups",
        )
    )
    out.append(_optimizer_states(part, optimizer, opt_dev))
    if bucket and stage == 2:
        # setup_buckets: one buffer, a second with overlap_comm (default False below stage 3).
        out.append(
            Component(IPG_BUCKET, bucket * pb * (2 if overlap else 1), GPU, source=f"{src}::setup_buckets")
        )
    return out


def _stage0(trainable: int, pb: int, optimizer: str) -> list[Component]:
    out = [
        Component(PARAM16, trainable * pb, GPU, source="model parameters"),
        Component(GRAD16, trainable * pb, GPU, source="param.grad"),
    ]
    if pb == FP32_BYTES:
        # fp32 training: the client optimizer steps the model parameters directly (engine.py::_configure_optimizer).
        state = optimizer_state_bytes_per_param(optimizer, FP32_BYTES)
    else:
        src = "deepspeed/runtime/fp16/fused_optimizer.py::FP16_Optimizer"
        out.append(Component(FP32_MASTER, trainable * FP32_BYTES, GPU, source=f"{src} fp32_groups_flat"))
        out.append(Component(FP32_GRAD, trainable * FP32_BYTES, GPU, transient=True, source=f"{src}.step"))
        state = optimizer_state_bytes_per_param(optimizer)
    out.append(
        Component(
            OPTIMIZER_STATES,
            math.ceil(trainable * state),
            GPU,
            lazy=True,
            source="torch.optim first step (lazy)",
        )
    )
    return out


def torch_optimizer_components(
    *,
    trainable: int,
    frozen: int,
    trainable_bytes: int,
    frozen_bytes_per_param: float,
    optimizer: str = "adamw",
    trainable_groups: Sequence[tuple[int, int]] | None = None,
) -> list[Component]:
    """Model states of a run without DeepSpeed or FSDP (HF Trainer, DDP, plain PyTorch), all on the GPU.
    `trainable_groups`: (elements, bytes) per dtype when the trainable weights do not share one dtype (PEFT's fp32
    adapters beside `modules_to_save` copies in the model's dtype); their gradients and states follow each group.

    The torch optimizer steps the model's own parameters in the dtype they hold (`trainable_bytes`: 2 when the
    model was loaded in bf16/fp16 and nothing upcast it, 4 for fp32 weights under autocast); there is no fp32
    master copy. Gradients are `param.grad` in the parameter's dtype (autograd accumulates in the leaf's
    dtype) and the optimizer state follows it too: torch/optim/adam.py `_init_group` builds `exp_avg` and
    `exp_avg_sq` with `torch.zeros_like(p, memory_format=torch.preserve_format)` at the first step.
    DeepSpeed's stage 0 (an fp32 master in FP16_Optimizer / BF16_Optimizer) is `model_state_components`."""
    _validate(0, 1, "none", "none", trainable_bytes, optimizer, trainable, frozen)
    out: list[Component] = []
    if frozen:
        out.append(
            Component(FROZEN16, math.ceil(frozen * frozen_bytes_per_param), GPU, source="frozen model parameters")
        )
    if not trainable:
        return out
    src = "torch/optim/adam.py _init_group (torch.zeros_like(p): the parameter's dtype)"
    groups = list(trainable_groups) if trainable_groups else [(trainable, trainable_bytes)]
    weights = sum(n * b for n, b in groups)
    states = sum(math.ceil(n * optimizer_state_bytes_per_param(optimizer, b)) for n, b in groups)
    return out + [
        Component(PARAM16, weights, GPU, source="model parameters (the optimizer steps them)"),
        Component(
            GRAD16,
            weights,
            GPU,
            lazy=True,
            source="param.grad (the parameter's dtype), from the first backward",
        ),
        Component(
            OPTIMIZER_STATES,
            states,
            GPU,
            lazy=True,
            source=f"{src}, first step (lazy)",
        ),
    ]


def _zero2_grad_partition(numels: list[int], n: int, flat: int) -> int:
    """Largest `grads_in_partition` over ranks: full numel of every param overlapping the rank's slice."""
    part = flat // n
    best = 0
    for rank in range(n):
        lo, hi = rank * part, (rank + 1) * part
        total, offset = 0, 0
        for x in numels:
            if offset < hi and offset + x > lo:
                total += x
            offset += x
        best = max(best, total)
    return best


# --------------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------------


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _device(offload: str) -> str:
    return {"none": GPU, "cpu": HOST, "nvme": NVME}[offload]


def _is_old_layout(version: str | None) -> bool:
    if not version:
        return False
    parts: list[int] = []
    for piece in version.split("+")[0].split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    while len(parts) < 3:
        parts.append(0)
    return tuple(parts) <= LAST_OLD_LAYOUT_VERSION


def _validate(
    stage: int,
    n: int,
    off_opt: str,
    off_param: str,
    pb: int,
    optimizer: str,
    trainable: int,
    frozen: int,
) -> None:
    if stage not in (0, 1, 2, 3):
        raise PlanError(f"ZeRO stage must be 0, 1, 2 or 3, got {stage}")
    if n < 1:
        raise PlanError(f"world size must be at least 1, got {n}")
    if trainable < 0 or frozen < 0:
        raise PlanError(f"parameter counts must be >= 0, got trainable={trainable}, frozen={frozen}")
    for what, value in (("offload_optimizer", off_opt), ("offload_param", off_param)):
        if value not in OFFLOAD_DEVICES:
            raise PlanError(f"{what} device {value!r} is not one of {', '.join(OFFLOAD_DEVICES)}")
    if pb not in (2, 4):
        raise PlanError(f"param_bytes must be 2 (bf16/fp16) or 4 (fp32), got {pb}")
    if optimizer not in OPTIMIZERS:
        raise PlanError(f"unknown optimizer {optimizer!r}", hint=f"use one of {', '.join(OPTIMIZERS)}")
    if stage == 0 and off_opt != "none":
        raise PlanError("offload_optimizer needs ZeRO stage 1, 2 or 3", hint="set zero_optimization.stage")
    if stage in (1, 2) and off_opt == "nvme":
        raise PlanError(
            "NVMe optimizer offload is only implemented for ZeRO-3",
            hint='use "offload_optimizer": {"device": "cpu"} or stage 3',
        )
