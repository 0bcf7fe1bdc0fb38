"""Memory per phase of a torch FSDP run (accelerate / HF Trainer), item by item, beside the ZeRO planner.

accelerate users switch between DeepSpeed ZeRO and FSDP with one line of their config; this module answers
the FSDP side with the same phases and verdicts (`phases.StrategyPlan`). Pure arithmetic, no torch import.
Read from the source of torch 2.13 (`torch/distributed/fsdp/`), accelerate 1.15 and transformers 5.23:

* Wrapping. accelerate's transformer-based auto wrap makes every decoder layer one FSDP unit. FSDP1
  (`FullyShardedDataParallel`) puts everything else (embeddings, final norm, output layer) in the root
  unit; FSDP2 (`fully_shard`, accelerate `fsdp2_prepare_model`) gives the input embedding its own unit and
  the tail `[final_norm, lm_head]` one with `reshard_after_forward=False`.
* Sharded state per rank (`_flat_param.py` FlatParamHandle.shard: each unit's flat parameter padded to a
  multiple of the shard count and split evenly). With mixed precision accelerate upcasts every trainable
  flat parameter (FSDP1: the whole unit once any of its parameters trains, `use_orig_params`) or parameter
  (FSDP2) to fp32 (accelerate accelerator.py prepare_model / fsdp_utils.py fsdp2_prepare_model "FSDP upcast
  of low precision parameters"), so trainable shards are fp32 like DeepSpeed's master copy: 4 B params +
  4 B gradients (`_cast_grad_to_param_dtype`) + 8 B AdamW states per trainable element / N.
* Gathered units. A unit is all-gathered in the compute dtype (`MixedPrecision.param_dtype`, through the
  low-precision shard `_mp_shard`) before it runs and freed after it (`_post_forward_reshard`,
  `_post_backward_hook`), except the FSDP1 root, which is not freed after forward (`_post_forward_reshard`:
  `free_unsharded_flat_param = not state._is_root and ...`) and so stays gathered through the step.
  Prefetch (`backward_prefetch`, `forward_prefetch`; FSDP2 always prefetches in backward) gathers the next
  unit while the current one computes: two layer units at once.
* Gradients. Autograd writes a unit's whole gradient in the compute dtype before the post-backward hook
  reduce-scatters it (`_post_backward_hook` -> `_reduce_grad`). In FSDP1 the root's output-layer gradient
  waits for the root's post-backward at the very end of the backward pass.
* CPU offload (`CPUOffload(offload_params=True)`, FSDP2 `CPUOffloadPolicy`): sharded parameters and
  gradients live on the host, pinned (`_flat_param.py` `_local_shard.pin_memory()`, `_cpu_grad` pinned),
  so the optimizer steps on the host; each unit's shard is copied to the GPU before the all-gather.
* Checkpoint save (accelerate `set_state_dict_type`): FULL_STATE_DICT with `offload_to_cpu=True,
  rank0_only=True` unshards units in full precision (`_unshard_param_utils._unshard_fsdp_state_params`,
  `_force_full_precision`) and copies them to rank 0's host; FSDP1 keeps the root unshard open while its
  children are saved. The full optimizer state dict (`FullOptimStateDictConfig(offload_to_cpu=True,
  rank0_only=True)`) gathers every AdamW state on rank 0's host. SHARDED_STATE_DICT: each rank copies its
  own shards to the host.

The per-GPU constants (CUDA context, NCCL buffers, allocator slack) and activations are the ZeRO planner's.
What the real engine holds per rank is checked on CPU with 2 gloo ranks in `tests/plan/test_fsdp_engine.py`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from zerodoctor.plan import host_load as hl
from zerodoctor.plan import model_states as ms
from zerodoctor.plan.inputs import GIB, FsdpSettings, PlanInputs, Training, ZeroSettings
from zerodoctor.versions import parse_version

if TYPE_CHECKING:
    from zerodoctor.plan.phases import Item, StrategyPlan

SRC_FLAT = "torch/distributed/fsdp/_flat_param.py"
SRC_RUNTIME = "torch/distributed/fsdp/_runtime_utils.py"
SRC_CPU_GRAD = (
    "torch/distributed/fsdp/_flat_param.py FlatParamHandle.init_flat_param_attributes: "
    "_local_shard.pin_memory() and _cpu_grad = zeros_like(_local_shard).pin_memory() for every FlatParameter "
    "when offload_params (torch 2.2 through 2.13)"
)
SRC_UPCAST = (
    "accelerate/accelerator.py prepare_model (FSDP1) / utils/fsdp_utils.py fsdp2_prepare_model (FSDP2): "
    "upcast of trainable low-precision parameters to fp32"
)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def shard_count(inputs: PlanInputs, f: FsdpSettings) -> int:
    """Ranks a unit is split over: the world, one node for hybrid sharding, 1 for no_shard."""
    if f.sharding == "no_shard":
        return 1
    if f.sharding.startswith("hybrid"):
        return inputs.cluster.gpus_per_node
    return inputs.cluster.world_size


def units(inputs: PlanInputs, f: FsdpSettings) -> tuple[int, int, int, int]:
    """(layer unit, number of layer units, head unit, embedding unit) in elements. FSDP1: head = the root
    (everything outside the decoder layers), embedding 0 (it is in the root). FSDP2 (accelerate): the
    embedding is its own unit, head = final norm + output layer (+ leftovers of the root)."""
    p = inputs.model.params
    layer = max(p.dense_layer if p.num_dense_layers else 0, p.moe_layer if p.num_moe_layers else 0)
    outside = p.total - p.decoder_layers
    if f.version == 1 or p.tied_embeddings:
        return layer, p.num_layers, outside, 0
    return layer, p.num_layers, outside - p.embedding, p.embedding


@dataclass(frozen=True)
class FsdpStates:
    """Per-rank sharded state of an FSDP run, in bytes, and the per-unit blocks pinned with CPU offload."""

    params: int
    grads: int
    optimizer: int
    trainable_shard: int
    upcast_frozen: bool
    pinned_blocks: tuple[tuple[int, int], ...]  # (bytes of one unit's parameter shard, how many units)
    grad_blocks: tuple[tuple[int, int], ...]
    grad_numel: int = 0
    """Unsharded elements of every FlatParameter (FSDP2: parameter) that gets a gradient: what `no_sync` keeps."""


HF_TRAINER_FRAMEWORKS = frozenset({"hf", "llamafactory"})
# Runs whose FSDP setup is accelerate's prepare.
ACCELERATE_FRAMEWORKS = HF_TRAINER_FRAMEWORKS | {"accelerate"}
PEFT_WRAP_BY_TRAINER_FROM = (4, 39)
SRC_PEFT_WRAP = (
    "transformers trainer.py Trainer._fsdp_qlora_plugin_updates (4.39-4.x, #29587; #36720 widened it to every "
    "PeftConfig) / distributed/fsdp.py update_fsdp_plugin_peft (5.x): "
    "`fsdp_plugin.auto_wrap_policy = fsdp_auto_wrap_policy(model)` (peft utils/other.py: a leaf whose weight requires "
    "grad is a unit of its own)"
)


def trainer_wraps_adapters(inputs: PlanInputs, t: Training) -> bool:
    """The HF Trainer (and LLaMA-Factory's trainers, its subclasses) replaces the FSDP1 auto-wrap policy of a PEFT
    model with PEFT's own (`SRC_PEFT_WRAP`): every adapter is a unit of its own, so the decoder layers' FlatParameters
    hold only frozen weights, require no gradient and are not upcast, whatever `use_orig_params` says. FSDP1 only:
    under FSDP2 the Trainer creates the optimizer before `accelerator.prepare` (`is_fsdp2` sets
    `delay_optimizer_creation = False`, transformers 4.57.6 and 5.23 trainer.py `_inner_training_loop`), so the hook
    never runs; callers ask about FSDP1 plans. An unknown transformers version is planned as a current one."""
    if not t.is_peft or inputs.framework not in HF_TRAINER_FRAMEWORKS:
        return False
    v = parse_version(inputs.transformers_version)
    return v is None or v.release >= PEFT_WRAP_BY_TRAINER_FROM


def pure_16bit(t: Training) -> bool:
    """A pure 16-bit run: the model is cast to 16-bit and FSDP gets no MixedPrecision (llama-recipes `pure_bf16`:
    `model.to(torch.bfloat16)`, then `FSDP(mixed_precision=None)`), so its FlatParameters, their gradients and torch
    AdamW's `zeros_like(p)` states are 16-bit: no fp32 master anywhere (meta-llama/llama-cookbook
    llama_finetuning.py at 754b5d22; torch `_flat_param.py`: a FlatParameter has its parameters' dtype;
    `torch/optim/adamw.py` `_init_group`)."""
    return t.pure_bf16 and t.param_bytes < ms.FP32_BYTES


def master_bytes(t: Training) -> int:
    """Bytes per trainable element of the sharded parameters and gradients: fp32 (accelerate's upcast under mixed
    precision, or an fp32 run), the 16-bit dtype in a pure 16-bit run (`pure_16bit`)."""
    return t.param_bytes if pure_16bit(t) else ms.FP32_BYTES


def optimizer_bytes_per_param(t: Training) -> float:
    """Optimizer-state bytes per trainable element: torch AdamW/SGD states are `zeros_like(p)` (the shard's dtype,
    `master_bytes`); bitsandbytes' optimizers keep their own widths."""
    state_b = master_bytes(t) if t.optimizer in ("adamw", "sgd") else ms.FP32_BYTES
    return ms.optimizer_state_bytes_per_param(t.optimizer, state_b)


def fsdp_states(inputs: PlanInputs, f: FsdpSettings, t: Training) -> FsdpStates:
    """Sharded parameters, gradients and optimizer states one rank holds.

    Units are padded to a multiple of the shard count and split (`FlatParamHandle.shard`). Storage: fp32 for
    trainable units (accelerate's upcast under mixed precision; fp32 anyway in an fp32 run), the load dtype
    for frozen ones. FSDP1 with `use_orig_params=True` flattens a decoder layer and its LoRA adapters (one dtype:
    `_flat_param.py` "Must flatten tensors with uniform dtype") into one FlatParameter that requires grad, so
    accelerate upcasts the whole unit and its gradient covers the whole unit (checked on 2 gloo ranks: the
    flat gradient has the shard's full size); with `use_orig_params=False` PEFT's wrap policy gives the
    adapters units of their own. FSDP2 keeps per-parameter storage and gradients: only the adapters are fp32
    and have gradients."""
    from zerodoctor.plan import phases as ph

    n = shard_count(inputs, f)
    pb = t.param_bytes
    trainable, _ = ph.trainable_frozen(inputs, t)
    layer, n_layers, head, embed = units(inputs, f)
    frozen_bpp = ph.qlora_frozen_bytes(inputs, t)[1] if t.method == "qlora" else float(pb)
    # (numel, count, kind): kind "train" (all trainable), "frozen", "mixed" (LoRA adapters inside)
    kinds: list[tuple[int, int, str]] = []
    if t.method == "full":
        kinds += [(layer, n_layers, "train"), (head, 1, "train"), (embed, 1, "train")]
    elif t.method == "freeze":
        k = min(max(t.freeze_trainable_layers, 0), n_layers)
        kinds += [
            (layer, k, "train"),
            (layer, n_layers - k, "frozen"),
            (head, 1, "frozen"),
            (embed, 1, "frozen"),
        ]
    else:
        saved = set(t.trainable_modules)
        head_mixed = bool(saved & {"lm_head", "embed_tokens", "wte", "word_embeddings"})
        kinds += [
            (layer, n_layers, "mixed"),
            (head, 1, "mixed" if head_mixed else "frozen"),
            (embed, 1, "frozen"),
        ]
    # PEFT's own wrap policy (peft utils/other.py fsdp_auto_wrap_policy, what the PEFT docs use with
    # use_orig_params=False) wraps the trainable leaves in units of their own: then nothing frozen is upcast.
    # The HF Trainer sets PEFT's policy itself under FSDP1 (`trainer_wraps_adapters`).
    upcast_frozen = (
        f.version == 1
        and t.is_peft
        and f.use_orig_params
        and t.method != "qlora"
        and not pure_16bit(t)
        and not trainer_wraps_adapters(inputs, t)
    )
    mb = master_bytes(t)
    params = grads = grad_numel = 0
    pinned: list[tuple[int, int]] = []
    gblocks: list[tuple[int, int]] = []
    for numel, count, kind in kinds:
        if not numel or not count:
            continue
        shard = _ceil_div(numel, n)
        bpp = float(mb) if kind == "train" or kind == "mixed" and upcast_frozen else frozen_bpp
        nbytes = math.ceil(shard * bpp)
        params += nbytes * count
        pinned.append((nbytes, count))
        if kind == "train" or (kind == "mixed" and upcast_frozen):
            grads += shard * mb * count
            grad_numel += numel * count
            gblocks.append((shard * mb, count))
    if t.is_peft:
        extra = _ceil_div(trainable, n)  # adapters (and modules_to_save copies): fp32, own gradients
        if not upcast_frozen:  # otherwise they are inside the upcast units, counted above
            params += extra * mb
            grads += extra * mb
            grad_numel += trainable
    train_shard = _ceil_div(trainable, n)
    opt = math.ceil(train_shard * optimizer_bytes_per_param(t))
    return FsdpStates(params, grads, opt, train_shard, upcast_frozen, tuple(pinned), tuple(gblocks), grad_numel)


NO_SYNC_FRAMEWORKS = frozenset({"hf", "llamafactory", "accelerate"})
"""Frameworks whose gradient accumulation runs the micro-batches before the last one under FSDP's `no_sync`: HF
Trainer (up to 4.28 `model.no_sync()` when `args._no_sync_in_gradient_accumulation`; from 4.29 through accelerate's
`accumulate`, sync_each_batch False by default) and accelerate itself (accelerator.py `accumulate` -> `no_sync`: the
FSDP1 module's `no_sync`, FSDP2 `set_requires_gradient_sync(False)`). None (the framework not given) is HF Trainer,
the CLI's assumption. llama-recipes and torchtune sync every micro-batch."""
SRC_NO_SYNC = (
    "torch/distributed/fsdp/fully_sharded_data_parallel.py no_sync (\"FSDP will accumulate the full model gradients "
    "(instead of gradient shards) until the eventual sync\"); _runtime_utils.py _post_backward_hook returns before "
    "_reduce_grad when not _sync_gradients; _flat_param.py prepare_gradient_for_backward keeps a .grad of the "
    "unpadded unsharded size; accelerate accelerator.py accumulate / no_sync (sync_each_batch)"
)


def accumulates_unsharded(inputs: PlanInputs, f: FsdpSettings, t: Training) -> bool:
    """True when the micro-batches before the last one of an accumulation run under `no_sync` (NO_SYNC_FRAMEWORKS)
    and units are sharded: every trainable unit's whole gradient then stays unsharded, in the compute dtype, from
    the first micro-batch's backward to the last one's reduce-scatter (SRC_NO_SYNC). With one shard (no_shard, or
    FSDP1 on one GPU, which switches to NO_SHARD) the gradient is unsharded anyway. FSDP2 accumulates in its
    `reduce_dtype` (`_fsdp_param.py` to_accumulated_grad_if_needed), which accelerate sets to the compute dtype
    (utils/dataclasses.py set_mixed_precision: param_dtype = reduce_dtype); only FSDP1 is engine-checked
    (tests/plan/test_fsdp_engine.py)."""
    return t.grad_accum > 1 and shard_count(inputs, f) > 1 and (inputs.framework or "hf") in NO_SYNC_FRAMEWORKS


def gathered_numel(inputs: PlanInputs, f: FsdpSettings) -> tuple[int, str]:
    """Elements unsharded at once at the peak of forward/backward, and how: the FSDP1 root (never freed after
    forward) plus one layer unit, two with prefetch; FSDP2 the larger of its tail + one layer and two layers
    (its tail is resharded at the start of backward); the whole model when units are not resharded after
    forward (shard_grad_op, no_shard). Measured on 2 gloo ranks by tests/plan/test_fsdp_engine.py (in-flight
    all-gathers included)."""
    p = inputs.model.params
    layer, n_layers, head, embed = units(inputs, f)
    prefetch = f.backward_prefetch != "none" or f.forward_prefetch
    if f.sharding in ("shard_grad_op", "hybrid_shard_zero2", "no_shard"):
        return (
            p.total,
            f"{f.sharding}: units stay gathered after forward, so the whole model is unsharded in backward",
        )
    if f.version == 2:
        # FSDP2 (accelerate): the tail [final norm, lm_head] has reshard_after_forward=False and stays gathered from
        # its forward until its own post-backward, the first of the backward pass, while the last layer is being
        # prefetched; afterwards a layer's backward runs while the one before it is prefetched (implicit
        # backward prefetch); the embedding is gathered again at the very end next to the first layer.
        two = layer * min(2, n_layers)
        peak = max(head + layer, two, embed + layer)
        how = (
            f"max(tail [final norm, lm_head] {head:,} + one layer unit, two layer units (current + prefetched), "
            f"embedding {embed:,} + one layer unit) with layer units of {layer:,}"
        )
        return peak, how
    how = (
        f"root unit {head:,} (kept gathered from forward through backward: not freed after forward as the root) + "
        f"{'two layer units (current + prefetched)' if prefetch else 'one layer unit'} of {layer:,}"
    )
    return head + layer * min(2 if prefetch else 1, n_layers), how


def _host_upcast(
    inputs: PlanInputs, f: FsdpSettings, t: Training, trainable: int, frozen: int, loaders: int
) -> Item | None:
    """FSDP2 under mixed precision: the loaded model on each loading rank's host once accelerate has upcast its
    trainable parameters to fp32, before `fully_shard` (plan/host_load.py `fsdp2_upcasts_on_host`); None where
    nothing is upcast there (FSDP1, pure 16-bit, QLoRA's Params4bit, a model loaded in fp32, accelerate < 1.14, a
    run that names no accelerate-based framework)."""
    from zerodoctor.plan import phases as ph

    load_b = ph.loaded_weight_bytes(inputs, t)[0]
    if f.version != 2 or pure_16bit(t) or t.method == "qlora" or not trainable or load_b >= ms.FP32_BYTES:
        return None
    if t.param_bytes >= ms.FP32_BYTES or not hl.fsdp2_upcasts_on_host(inputs.accelerate_version):
        return None
    if inputs.framework not in ACCELERATE_FRAMEWORKS:
        return None  # torchtune, litgpt and other FSDP2 users shard without accelerate's prepare
    a = hl.fsdp2_host_upcast(trainable, frozen, load_b, loaders, inputs.accelerate_version)
    return ph.Item(a.name, a.bytes, a.detail, a.source)


def plan_fsdp(
    inputs: PlanInputs, zero: ZeroSettings, t: Training, *, label: str = "", margin: float
) -> StrategyPlan:
    """One FSDP strategy's phases; `zero.fsdp` holds the FSDP settings (`inputs.fsdp_as_zero`)."""
    from zerodoctor.plan import phases as ph

    f = zero.fsdp
    assert f is not None
    c = inputs.cluster
    p = inputs.model.params
    n = shard_count(inputs, f)
    n_local = c.gpus_per_node
    pb = t.param_bytes
    trainable, frozen = ph.trainable_frozen(inputs, t)
    layer, n_layers, head, embed = units(inputs, f)
    st = fsdp_states(inputs, f, t)
    frozen_bpp = ph.qlora_frozen_bytes(inputs, t)[1] if t.method == "qlora" else float(pb)
    param_shard_bytes, grad_shard_bytes, opt_bytes = st.params, st.grads, st.optimizer
    train_shard, upcast_frozen = st.trainable_shard, st.upcast_frozen
    offload = f.offload_params
    dev = ms.HOST if offload else ms.GPU
    # FSDP1 + CPU offload: a pinned _cpu_grad for every FlatParameter, frozen ones included (SRC_CPU_GRAD)
    host_grad_bytes = param_shard_bytes if offload and f.version == 1 else grad_shard_bytes
    mb = master_bytes(t)
    upcast_note = (
        f"{8 * pb}-bit (pure {8 * pb}-bit: the model cast to 16-bit, FSDP without MixedPrecision, no fp32 master)"
        if pure_16bit(t)
        else "fp32 (accelerate upcasts trainable parameters under mixed precision)"
        if pb < 4
        else "fp32"
    )
    components = [
        ms.Component(
            "fsdp sharded parameters",
            param_shard_bytes,
            dev,
            pinned=offload,
            source=f"{SRC_FLAT} FlatParamHandle.shard; {SRC_UPCAST}",
        ),
        ms.Component(
            "fsdp sharded gradients",
            host_grad_bytes,
            dev,
            pinned=offload,
            source=f"{SRC_RUNTIME} _post_backward_hook -> _reduce_grad (_cast_grad_to_param_dtype)"
            + ("; _flat_param.py _cpu_grad (pinned)" if offload else ""),
        ),
        ms.Component(
            ms.OPTIMIZER_STATES,
            opt_bytes,
            dev,
            lazy=True,
            source="torch/optim/adamw.py _init_group (exp_avg, exp_avg_sq like the fp32 shard, first step)",
        ),
    ]
    # Pinned host blocks: one per unit's shard (FSDP1 FlatParameter; FSDP2 pins per parameter: per unit here);
    # PEFT's adapter units (use_orig_params=False) are small and counted as requested.
    tv = inputs.torch_version
    adapter_params = st.params - sum(b * k for b, k in st.pinned_blocks)
    pinned_params = sum(ms.pinned_bytes(b, tv) * k for b, k in st.pinned_blocks) + adapter_params
    if f.version == 1:
        # FSDP1 pre-allocates a pinned `_cpu_grad` shaped like the `_local_shard` of EVERY FlatParameter, frozen
        # ones included (QLoRA's 4-bit base, LoRA's frozen layers): init_flat_param_attributes does not look at
        # requires_grad. FSDP2 moves only the reduce-scattered gradients of parameters that train.
        cpu_grad_bytes, pinned_grads = st.params, pinned_params
    else:
        cpu_grad_bytes = st.grads
        adapter_grads = st.grads - sum(b * k for b, k in st.grad_blocks)
        pinned_grads = sum(ms.pinned_bytes(b, tv) * k for b, k in st.grad_blocks) + adapter_grads

    reserve = ph.reserve_items_for(inputs)
    baseline = ph.host_baseline(inputs)
    train_baseline = ph.host_baseline(inputs, training=True)

    def gpu_states(*, lazy: bool, grads: bool) -> list[ph.Item]:
        if offload:
            return []
        out = [
            ph.Item(
                "FSDP sharded parameters",
                param_shard_bytes,
                f"1/{n} of each unit; {train_shard:,} trainable elements x {mb} B {upcast_note}"
                + (
                    (
                        ", frozen weights in fp32 too (FSDP1 upcasts whole LoRA units)"
                        if upcast_frozen
                        else f", frozen weights at {frozen_bpp:.2f} B"
                        + (
                            " (the HF Trainer wraps each adapter in a unit of its own, PEFT's policy)"
                            if trainer_wraps_adapters(inputs, t) and f.version == 1
                            else ""
                        )
                    )
                    if frozen
                    else ""
                ),
                components[0].source
                + ("; " + SRC_PEFT_WRAP if trainer_wraps_adapters(inputs, t) and f.version == 1 else ""),
            )
        ]
        if grads:
            out.append(
                ph.Item(
                    "FSDP sharded gradients",
                    grad_shard_bytes,
                    f"{mb}-byte gradient shards"
                    + (
                        " of whole LoRA units (FSDP1 flat gradients)"
                        if upcast_frozen
                        else f" of {train_shard:,} elements"
                    ),
                    components[1].source,
                )
            )
        if lazy and t.optimizer in ms.PAGED_OPTIMIZERS:
            out.append(ph.paged_states_items(opt_bytes, n_local, t.optimizer)[0])
        elif lazy:
            out.append(
                ph.Item(
                    "optimizer states",
                    opt_bytes,
                    f"AdamW exp_avg + exp_avg_sq like the {mb}-byte shard (zeros_like), allocated at the first step",
                    components[2].source,
                )
            )
        return out

    def host_states(*, lazy: bool, grads: bool) -> list[ph.Item]:
        if not offload:
            paged = lazy and t.optimizer in ms.PAGED_OPTIMIZERS and opt_bytes > 0
            return [ph.paged_states_items(opt_bytes, n_local, t.optimizer)[1]] if paged else []
        out = [
            ph.Item(
                "offloaded: FSDP sharded parameters",
                pinned_params * n_local,
                f"{n_local} ranks x {param_shard_bytes / GIB:.2f} GiB, pinned per unit "
                f"({pinned_params / GIB:.2f} GiB with power-of-two blocks)",
                components[0].source + "; _flat_param.py _local_shard.pin_memory()",
            )
        ]
        if grads:
            out.append(
                ph.Item(
                    "offloaded: FSDP sharded gradients",
                    pinned_grads * n_local,
                    (
                        f"{n_local} ranks x {cpu_grad_bytes / GIB:.2f} GiB: a pinned _cpu_grad like every unit's "
                        f"parameter shard, frozen units included ({pinned_grads / GIB:.2f} GiB with power-of-two "
                        "blocks)"
                        if f.version == 1
                        else f"{n_local} ranks x {grad_shard_bytes / GIB:.2f} GiB of trainable gradients on the host"
                    ),
                    SRC_CPU_GRAD if f.version == 1 else components[1].source,
                )
            )
        if lazy:
            out.append(
                ph.Item(
                    "offloaded: optimizer states",
                    opt_bytes * n_local,
                    f"{n_local} ranks x {opt_bytes / GIB:.2f} GiB: the optimizer steps on the host shards",
                    components[2].source,
                )
            )
        return out

    # ---- gathered units during forward/backward --------------------------------------------------------
    cb = pb  # MixedPrecision.param_dtype = the compute dtype (accelerate set_mixed_precision)
    gathered, how = gathered_numel(inputs, f)
    gbpp = frozen_bpp if t.method == "qlora" else float(cb)  # QLoRA units gather their packed 4-bit storage
    fwd: list[ph.Item] = [
        ph.Item(
            "FSDP gathered units (working set)",
            math.ceil((gathered + _ceil_div(layer, n)) * gbpp) + (_ceil_div(layer, n) * 4 if offload else 0),
            f"{how}; at {gbpp:.2f} B per element (param_dtype), plus the low-precision shard being all-gathered"
            + (" and its fp32 copy from the host (CPU offload)" if offload else ""),
            f"{SRC_RUNTIME} _pre_forward_unshard / _post_forward_reshard / _prefetch_handle; "
            f"{SRC_FLAT} _use_low_precision_shard, _full_param_padded",
        )
    ]
    if trainable:
        # FSDP2's tail unit (final norm + lm_head) is reduce-scattered right after its own backward; FSDP1's
        # root waits for the end of backward (next item).
        unit_grad = max(layer, head) if f.version == 2 and t.method == "full" else layer
        what = f"{unit_grad:,} elements"
        if t.is_peft and not upcast_frozen:
            # The frozen weights of a LoRA/QLoRA layer get no gradient: with PEFT's wrap policy
            # (use_orig_params=False) the adapters are units of their own and the layer's FlatParameter does not
            # require grad; FSDP2 keeps per-parameter gradients. What autograd writes unsharded is one layer's
            # adapters at most.
            unit_grad = _ceil_div(inputs.model.lora_params(t.lora_rank, t.lora_targets), max(n_layers, 1))
            what = f"{unit_grad:,} adapter elements of one layer (the frozen layer weights get no gradient)"
        fwd.append(
            ph.Item(
                "unsharded gradient of one unit",
                unit_grad * cb + _ceil_div(unit_grad, n) * cb,
                f"{what} in {cb} B written by autograd before the post-backward hook reduce-scatters it, "
                "+ the reduce-scatter output",
                f"{SRC_RUNTIME} _post_backward_hook, _reduce_grad; {SRC_FLAT} (a FlatParameter requires grad only "
                "if its parameters do)",
            )
        )
        out_layer = p.lm_head or (p.embedding if p.tied_embeddings else 0)
        if f.version == 1 and (t.method == "full" or "lm_head" in t.trainable_modules) and out_layer:
            fwd.append(
                ph.Item(
                    "root unit: output-layer gradient held through backward",
                    out_layer * cb,
                    f"{out_layer:,} elements: computed first in backward, reduce-scattered only at the root's "
                    "post-backward after the embedding (FSDP1 root unit)",
                    f"{SRC_RUNTIME} _post_backward_hook (root handle last)",
                )
            )

    if t.method == "qlora":
        fwd.append(ph.dequantised_weight_item(inputs, t))
    act = ph.activations_for(inputs, t, zero)
    act_items = ph.activation_items(act, t, inputs)

    # ---- load ------------------------------------------------------------------------------------------
    # The model is loaded in its load dtype (`torch_dtype`, else the transformers default: phases.loaded_weight_bytes)
    # before FSDP wraps it; MixedPrecision only casts the gathered parameters.
    whole_model_bytes_load = (
        math.ceil(trainable * pb + frozen * frozen_bpp)
        if t.method == "qlora"
        else p.total * ph.loaded_weight_bytes(inputs, t)[0]
    )
    load_gpu = [*reserve]
    load_host = [baseline]
    lazy_init = offload and f.version == 1
    if offload and not lazy_init:  # FSDP2 pins each parameter's shard in fully_shard itself
        load_host.append(
            ph.Item(
                "offloaded: FSDP sharded parameters",
                pinned_params * n_local,
                f"{n_local} ranks x {param_shard_bytes / GIB:.2f} GiB pinned",
                components[0].source,
            )
        )
    elif not offload:
        load_gpu.append(
            ph.Item(
                "FSDP sharded parameters",
                param_shard_bytes,
                "the trainable shards in fp32 (accelerate's mixed-precision upcast)",
                components[0].source,
            )
        )
    biggest = max(head + embed if f.version == 1 else max(head, embed), layer)
    if not offload:
        load_gpu.append(
            ph.Item(
                "unit being moved and flattened",
                biggest * pb * (2 if f.version == 1 else 1),
                f"the largest unit ({biggest:,} elements) moved to the GPU"
                + (" and concatenated into its FlatParameter" if f.version == 1 else "")
                + " before it is sharded",
                "torch/distributed/fsdp/_init_utils.py _move_module_to_device; _flat_param.py flatten_tensors"
                if f.version == 1
                else "torch/distributed/fsdp/_fully_shard/_fsdp_init.py _move_states_to_device; _fsdp_param.py",
            )
        )
    loaders = 1 if f.cpu_ram_efficient_loading else n_local
    whole_loaded = ph.Item(
        "whole model loaded per rank" if loaders > 1 else "whole model loaded once per node",
        whole_model_bytes_load * loaders,
        f"{loaders} x {whole_model_bytes_load / GIB:.1f} GiB"
        + (
            ": cpu_ram_efficient_loading, only local rank 0 reads the weights, the others build on meta"
            if loaders == 1
            else ": every rank runs from_pretrained on the host before FSDP shards it"
        ),
        "transformers modeling_utils (is_fsdp_enabled and not is_local_dist_rank_0 -> meta); "
        "accelerate FullyShardedDataParallelPlugin.cpu_ram_efficient_loading",
    )
    # The loading rank reads the checkpoint one shard at a time into the model it builds: the shard being read and
    # the model coexist (transformers modeling_utils _load_pretrained_model, one state dict per shard file).
    shard_read = ph.Item(
        "checkpoint shard being read",
        min(ph.LOAD_SHARD_BYTES, whole_model_bytes_load) * loaders,
        f"{loaders} x one {ph.LOAD_SHARD_BYTES / 10**9:.0f} GB safetensors shard next to the model being filled",
        "transformers modeling_utils _load_pretrained_model (one shard's state dict at a time); "
        "phases.LOAD_SHARD_BYTES",
    )
    loading = [whole_loaded, shard_read]
    load_note = "model loaded and sharded"
    if lazy_init:
        # FSDP1 + CPU offload, two moments: (1) wrapping: the loaded model moves to the GPU unit by unit, is
        # flattened, sharded and its shard copied back to the host (_init_param_handle_from_params:
        # flat_param_to(cpu), pageable), so the loaded copy shrinks while the shards grow; (2) lazy init at the
        # first forward: init_flat_param_attributes pins a COPY of every unit's shard and a zeroed pinned
        # _cpu_grad, while the pageable shard stays the FlatParameter's data until that unit's first
        # pre_unshard moves it to the GPU (flat_param_to(device)) -- all three exist at once.
        lazy = [
            ph.Item(
                "FSDP lazy init: pageable shards (until each unit's first forward)",
                param_shard_bytes * n_local,
                f"{n_local} ranks x {param_shard_bytes / GIB:.2f} GiB: the shard FSDP copied to the host at wrap "
                "time, still the FlatParameter's data beside its pinned copy",
                "torch/distributed/fsdp/_init_utils.py _init_param_handle_from_params (flat_param_to(cpu)); "
                "_flat_param.py pre_unshard (flat_param_to(self.device)) frees it at the unit's first forward",
            ),
            ph.Item(
                "offloaded: FSDP sharded parameters",
                pinned_params * n_local,
                f"{n_local} ranks x {param_shard_bytes / GIB:.2f} GiB pinned per unit "
                f"({pinned_params / GIB:.2f} GiB with power-of-two blocks)",
                components[0].source + "; " + SRC_CPU_GRAD,
            ),
            ph.Item(
                "offloaded: FSDP sharded gradients",
                pinned_grads * n_local,
                f"{n_local} ranks x {cpu_grad_bytes / GIB:.2f} GiB: pinned _cpu_grad of every unit, frozen ones "
                f"included ({pinned_grads / GIB:.2f} GiB with power-of-two blocks)",
                SRC_CPU_GRAD,
            ),
        ]
        lazy_bytes = sum(i.bytes for i in lazy)
        loading_bytes = sum(i.bytes for i in loading)
        if lazy_bytes >= loading_bytes:
            load_host += lazy
            load_note = (
                f"host peak at FSDP's lazy init (first forward); loading the model before wrapping held "
                f"{loading_bytes / GIB:.1f} GiB"
            )
        else:
            load_host += loading
            load_note = f"host peak while the model is loaded; FSDP's lazy init: {lazy_bytes / GIB:.1f} GiB"
    else:
        upcast = _host_upcast(inputs, f, t, trainable, frozen, loaders)
        if upcast is not None and upcast.bytes >= sum(i.bytes for i in loading):
            # accelerate's prepare upcasts the loaded model on the host after from_pretrained has returned (its
            # shard freed): a later, larger moment of the load phase.
            load_host.append(upcast)
            load_note = (
                f"host peak in accelerate's prepare (fp32 upcast before fully_shard); loading the model held "
                f"{sum(i.bytes for i in loading) / GIB:.1f} GiB"
            )
        else:
            load_host += loading
    load = ph.Phase("load", tuple(load_gpu), tuple(load_host), load_note)

    # ---- first optimizer step ---------------------------------------------------------------------------
    step_extra: list[ph.Item] = []
    if t.optimizer == "adamw" and trainable and not offload:
        step_extra.append(
            ph.Item(
                "AdamW update temporary",
                train_shard * mb,
                f"foreach AdamW: torch._foreach_sqrt over every {mb}-byte shard of the device group at once "
                f"({train_shard:,} elements)",
                "torch/optim/adamw.py / adam.py _multi_tensor_adam (torch._foreach_sqrt(device_exp_avg_sqs))",
            )
        )
    first = ph.Phase(
        "first_step",
        tuple([*reserve, *gpu_states(lazy=True, grads=True), *step_extra]),
        tuple([train_baseline, *host_states(lazy=True, grads=True)]),
        "optimizer state allocated lazily + the step's fp32 transients",
    )
    no_sync: list[ph.Item] = []
    fwd_step = fwd
    if trainable and accumulates_unsharded(inputs, f, t):
        # zero_grad(set_to_none=True) (the torch >= 2.0 default HF Trainer, accelerate and Fabric call) freed the
        # sharded gradients after the last step; the unsharded ones of the micro-batches so far are all alive when
        # the last micro-batch starts its backward, and its reduce-scatter frees them unit by unit as the (smaller)
        # shards come back. With CPU offload too: no_sync keeps them on the GPU ("the gradients will not be
        # offloaded to CPU when inside the context manager", FullyShardedDataParallel.no_sync).
        no_sync.append(
            ph.Item(
                "FSDP no_sync: unsharded gradients of the accumulation",
                st.grad_numel * cb,
                f"{t.grad_accum} micro-batches a step, all but the last under no_sync: the whole gradient of every "
                f"trainable unit ({st.grad_numel:,} elements) in {cb} B on every rank, in place of the shards",
                SRC_NO_SYNC,
            )
        )
        # The root's output-layer gradient is part of the accumulated whole; one unit's fresh gradient is still
        # written beside its accumulated one before autograd adds them.
        fwd_step = [i for i in fwd if not i.name.startswith("root unit:")]
    steady = ph.Phase(
        "steady",
        tuple([*reserve, *gpu_states(lazy=True, grads=not no_sync), *no_sync, *fwd_step, *act_items]),
        tuple([train_baseline, *host_states(lazy=True, grads=True)]),
        "forward/backward: gathered units, sharded states resident",
    )

    # ---- save -------------------------------------------------------------------------------------------
    save_gpu: list[ph.Item] = []
    save_host: list[ph.Item] = []
    adapters_only = t.is_peft and inputs.framework in ("hf", "llamafactory")
    # "full precision" is the FlatParameter's own dtype: 16-bit in a pure 16-bit run (_force_full_precision)
    full_weights = math.ceil(trainable * mb + (frozen * (frozen_bpp if not upcast_frozen else 4)))
    weights = math.ceil(trainable * mb) if adapters_only else full_weights
    optimizer_full = math.ceil(trainable * optimizer_bytes_per_param(t))
    opt_written = 0 if t.save_only_model else optimizer_full
    if f.state_dict_type == "full":
        if f.version == 1:
            gathered_save = (head + layer) * mb
            how_save = f"root unit ({head:,}) stays unsharded while each layer unit ({layer:,}) is, in full precision"
        else:
            gathered_save = p.largest_module_numel * mb
            how_save = (
                f"one parameter at a time ({p.largest_module_name}, {p.largest_module_numel:,}) in fp32"
            )
        save_gpu.append(
            ph.Item(
                "FULL_STATE_DICT unshard (rank 0)",
                gathered_save,
                how_save,
                "torch/distributed/fsdp/_unshard_param_utils.py _unshard_fsdp_state_params (_force_full_precision); "
                "_state_dict_utils.py _full_pre_state_dict_hook",
            )
        )
        # accelerate saves the model (save_fsdp_model) and then the optimizer (save_fsdp_optimizer): the two
        # host copies on rank 0 are alive one after the other, not together.
        if opt_written > weights:
            save_host.append(
                ph.Item(
                    "rank 0: full optimizer state dict on the host",
                    opt_written,
                    f"node 0 only: every AdamW state gathered ({opt_written / 10**9:,.1f} GB), after the "
                    f"{weights / 10**9:,.1f} GB model state dict was written and freed",
                    "accelerate utils/fsdp_utils.py save_fsdp_optimizer: FullOptimStateDictConfig(offload_to_cpu=True, "
                    "rank0_only=True); torch/distributed/fsdp/_optim_utils.py _gather_orig_param_state",
                )
            )
        else:
            save_host.append(
                ph.Item(
                    "rank 0: full state dict on the host",
                    weights,
                    f"node 0 only: {weights / 10**9:,.1f} GB "
                    + (
                        "(adapter weights)"
                        if adapters_only
                        else "(fp32 where accelerate upcast the parameters)"
                    ),
                    "accelerate utils/fsdp_utils.py save_fsdp_model: FullStateDictConfig(offload_to_cpu=True, "
                    "rank0_only=True)",
                )
            )
        kind = "full state dict on rank 0" + (" (adapters)" if adapters_only else "")
    else:
        per_rank = max(math.ceil(weights / n), math.ceil(opt_written / n))
        save_host.append(
            ph.Item(
                "every rank: its shards copied to the host",
                per_rank * n_local,
                f"{n_local} ranks x {per_rank / GIB:.2f} GiB ({f.state_dict_type} state dict, offload_to_cpu; "
                "model shards, then optimizer shards)",
                "accelerate utils/fsdp_utils.py save_fsdp_model / save_fsdp_optimizer "
                "(ShardedStateDictConfig(offload_to_cpu=True)); torch.distributed.checkpoint",
            )
        )
        kind = f"{f.state_dict_type} state dict (one shard per rank)"
    checkpoint = ph.Checkpoint(
        weights,
        kind,
        optimizer_full,
        True,
        "save_only_model skips the optimizer state dict (HF Trainer _save_optimizer_and_scheduler)",
    )
    save = ph.Phase(
        "save",
        tuple([*reserve, *gpu_states(lazy=True, grads=False), *save_gpu]),
        # FSDP1's pinned _cpu_grad is an attribute of the FlatParameter: it outlives zero_grad and the save.
        tuple([train_baseline, *host_states(lazy=True, grads=lazy_init), *save_host]),
        "node 0 (rank 0 gathers)" if f.state_dict_type == "full" else "",
    )
    # The evaluation runs after optimizer steps: zero_grad has freed the gradients (the save's resident states).
    evaluation = ph.eval_phase(
        inputs, t, zero, (*reserve, *gpu_states(lazy=True, grads=False), *fwd), steady.host
    )
    return ph.StrategyPlan(
        zero=zero,
        training=t,
        cluster=c,
        trainable_params=trainable,
        frozen_params=frozen,
        phases=(load, first, steady, *((evaluation,) if evaluation else ()), save),
        checkpoint=checkpoint,
        components=tuple(components),
        activation_notes=tuple(act.notes),
        margin=margin,
        label=label,
    )
