"""What the planner is asked: the model, the cluster, the training recipe and the ZeRO settings, resolved.

The values are not resolved here: `zerodoctor.setup.run.describe_run` resolves files, flags and the
environment into one RunDescription (each value with its origin), and `inputs_from_run` maps it to the
planner's types. `PlanInputs.sources` carries the origins, so the report can say "micro batch 2
(train_args.yaml:7:1: per_device_train_batch_size)".

Nothing here imports torch, transformers or DeepSpeed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from zerodoctor.errors import PlanError
from zerodoctor.models import LORA_ALL_LINEAR, ModelSpec
from zerodoctor.models.spec import with_transformers_layout
from zerodoctor.setup.run import (
    DEFAULT_LORA_RANK,
    DEFAULT_SEQ_LEN,
    DS_DEFAULT_ALLGATHER_BUCKET,
    DS_DEFAULT_MAX_LIVE,
    DS_DEFAULT_MAX_REUSE,
    DS_DEFAULT_NVME_OPTIMIZER_BUFFER_COUNT,
    DS_DEFAULT_NVME_PARAM_BUFFER_COUNT,
    DS_DEFAULT_NVME_PARAM_BUFFER_SIZE,
    DS_DEFAULT_PERSISTENCE,
    DS_DEFAULT_PREFETCH_BUCKET,
    DS_DEFAULT_REDUCE_BUCKET,
    DS_DEFAULT_SUB_GROUP,
    FsdpDescription,
    RunDescription,
    RunFlags,
    ZeroDescription,
    describe_run,
)

if TYPE_CHECKING:
    from zerodoctor.env.model import Environment
    from zerodoctor.setup.model import TrainingSetup

GIB = 2**30
GB = 10**9

METHODS = ("full", "lora", "qlora", "freeze")
"""Methods the planner models."""
DEFAULT_LORA_TARGETS = LORA_ALL_LINEAR
"""LLaMA-Factory's `lora_target: all` (every linear layer but the output layer)."""


@dataclass(frozen=True)
class Cluster:
    """Homogeneous nodes: `gpu_memory_bytes` per GPU, `host_ram_bytes` per node."""

    nodes: int
    gpus_per_node: int
    gpu_memory_bytes: int
    host_ram_bytes: int

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node


@dataclass(frozen=True)
class Training:
    """The recipe. `quant_storage` is the bnb 4-bit storage dtype (QLoRA only; "uint8" = bnb's default,
    which ZeRO-3 cannot partition); `quant_storage_by_framework` is True when the framework sets it itself
    (LLaMA-Factory model/model_utils/quantization.py)."""

    method: str = "full"
    lora_rank: int = DEFAULT_LORA_RANK
    lora_targets: str | tuple[str, ...] = DEFAULT_LORA_TARGETS
    lora_dropout: float = 0.0
    """PEFT `lora_dropout` (its default and LLaMA-Factory's: 0): above 0 every adapter keeps its own dropped copy of
    its input and a bool mask (`activations._linear_inputs`)."""
    quant_storage: str = "uint8"
    quant_storage_by_framework: bool = False
    double_quant: bool = True
    precision: str = "bf16"
    optimizer: str = "adamw"
    offload_swaps_optimizer: bool = False
    """The framework hands DeepSpeed DeepSpeedCPUAdam (fp32 Adam states) in place of `optimizer` under optimizer
    offload (accelerate, `setup.run.accelerate_swaps_offloaded_optimizer`): an offload strategy plans AdamW."""
    micro_batch: int = 1
    grad_accum: int = 1
    seq_len: int = DEFAULT_SEQ_LEN
    gradient_checkpointing: bool = True
    attn: str = "sdpa"
    sequence_parallel: int = 1
    samples: int | None = None
    save_only_model: bool = False
    trainable_modules: tuple[str, ...] = ()
    """Whole modules trained next to LoRA adapters (PEFT `modules_to_save`, LLaMA-Factory `additional_target`,
    e.g. ("embed_tokens", "lm_head")): PEFT trains a copy of each, the original stays frozen."""
    freeze_trainable_layers: int = 2
    """`method: "freeze"`: the last N decoder layers train (LLaMA-Factory `freeze_trainable_layers`)."""
    reference_model: bool = False
    """DPO/KTO with a separate frozen reference model (TRL `ref_model`; LLaMA-Factory builds one for full and
    freeze tuning). False for LoRA (the base with adapters disabled is the reference) and reference-free
    losses (ORPO, SimPO)."""
    paired_inputs: bool = False
    """Preference training that concatenates chosen and rejected: two sequences per sample in every forward
    (TRL DPOTrainer `concatenated_forward`)."""
    quant_method: str = "bnb"
    """QLoRA's 4-bit base: "bnb" (bitsandbytes NF4/FP4, quantised at load), "gptq" or "awq" (a pre-quantised
    checkpoint: int32-packed 4-bit weights with fp16 scales and packed zeros per `quant_group_size`)."""
    quant_group_size: int = 128
    """GPTQ/AWQ `group_size` from the checkpoint's quantization_config."""
    longest_sample_tokens: int | None = None
    """The longest tokenised sample of the dataset, when known. Batches are padded to their longest sample
    (LLaMA-Factory / TRL collators, `padding=True`) and `seq_len` (`cutoff_len`, `max_length`) is only the cap,
    so the peak is planned at min(seq_len, longest_sample_tokens); None = at the cap (packing fills it). Packing
    and padding-free batches need no key of their own: a packed row (LLaMA-Factory `packing` / `neat_packing`, TRL
    `packing`, ms-swift `--packing`) is filled to the cap, and a padding-free micro-batch (TRL `padding_free`,
    ms-swift `--padding_free`) concatenates at most micro_batch x min(cap, longest) tokens into one row, which
    flash-attention's varlen kernel attends per sample: it keeps q, k, v, the output and a fp32 logsumexp per token
    and head, what `activations._attention_saved` charges the same tokens padded, and no attention matrix."""

    images_per_sample: int = 1
    """Images a vision-language sample feeds the vision tower (MiniCPM-V's finetune dataset opens one per sample);
    each is encoded as up to 1 + `max_slice_nums` slices of the model's `slice_config`. Text-only models ignore it."""

    weights_dtype: str | None = None
    """The dtype the model's weights are loaded in (`from_pretrained(torch_dtype=...)` / `dtype=...`): "bf16",
    "fp16", "fp32" or "auto" (the checkpoint's dtype, taken as 16-bit); None = not stated. It decides the model states of a run without DeepSpeed or FSDP, whose
    torch optimizer steps those very weights (`phases.loaded_weight_bytes` resolves None)."""
    pure_bf16: bool = False
    """LLaMA-Factory `pure_bf16`: trainable parameters stay in the loaded 16-bit dtype (otherwise LLaMA-Factory
    upcasts them to fp32 when neither DeepSpeed ZeRO-3 nor FSDP manages them)."""
    eval_micro_batch: int | None = None
    """Sequences per GPU in the evaluation forward when the run evaluates during or after training (HF Trainer
    `eval_strategy` steps|epoch / `do_eval`, at `per_device_eval_batch_size`, transformers' default 8); None = no
    evaluation. It adds the phase "evaluation" (`phases.eval_phase`)."""
    eval_keeps_logits: bool = False
    """The evaluation keeps each batch's logits for metrics (transformers `prediction_step` without
    `prediction_loss_only`; `Trainer.evaluate` keeps only the loss when no `compute_metrics` is passed)."""
    kbit_preparation: str | None = None
    """QLoRA: which k-bit preparation the script applies before `get_peft_model` ("peft" = PEFT's
    `prepare_model_for_kbit_training`, "norms" = TRL with bf16, "none"); None = the framework's
    (`zerodoctor.plan.kbit_prep`). It matters only without DeepSpeed or FSDP."""
    liger_kernel: bool = False
    """Liger Kernel patched in (HF / TRL / ms-swift `use_liger_kernel`, LLaMA-Factory `enable_liger_kernel`): for a
    model type liger_kernel supports, its fused linear cross-entropy replaces the logits and the loss, and its RMSNorm
    and SwiGLU change what each layer saves (`zerodoctor.plan.liger`)."""
    cut_cross_entropy: bool = False
    """Apple's Cut Cross-Entropy patched in (axolotl's CutCrossEntropyPlugin, `cut_cross_entropy`): the loss from the
    final hidden states and the head weight without logits, in training and evaluation (`zerodoctor.plan.cce`); with
    `liger_kernel` on as well, Liger's fused loss is the one that runs (`phases.cce_for`)."""
    liger_kernel_config: tuple[tuple[str, bool], ...] = ()
    """transformers `liger_kernel_config` as stated (`zerodoctor.plan.liger.LIGER_CONFIG_KEYS`: a kernel switched
    on or off against its `apply_liger_kernel_to_<type>` default); () = the defaults."""
    lower_bound: str | None = None
    """Why this plan is only a lower bound (`setup.run.RunDescription.lower_bound`): no "fits" verdict then."""
    liger_at_load: bool = False
    """Liger is patched in when the model is loaded, before PEFT wraps it (TRL < 0.16 SFTConfig `use_liger`:
    `AutoLigerKernelForCausalLM`), not by the Trainer on the built model (`liger.TRANSFORMERS_PATCHES_PEFT_FROM`)."""

    @property
    def param_bytes(self) -> int:
        return 4 if self.precision == "fp32" else 2

    @property
    def is_peft(self) -> bool:
        return self.method in ("lora", "qlora")


@dataclass(frozen=True)
class FsdpSettings:
    """torch FSDP as accelerate / HF Trainer configure it (`zerodoctor.setup.run.FsdpDescription`): `version` 1
    (`FullyShardedDataParallel`) or 2 (`fully_shard`), `sharding` full_shard | shard_grad_op | no_shard |
    hybrid_shard | hybrid_shard_zero2, `backward_prefetch` backward_pre | backward_post | none,
    `state_dict_type` full | sharded | local. Memory per item: `zerodoctor.plan.fsdp`."""

    version: int = 1
    sharding: str = "full_shard"
    offload_params: bool = False
    backward_prefetch: str = "none"
    forward_prefetch: bool = False
    state_dict_type: str = "full"
    use_orig_params: bool = True
    cpu_ram_efficient_loading: bool = False

    @property
    def label(self) -> str:
        parts = [f"FSDP{self.version} {self.sharding}"]
        if self.offload_params:
            parts.append("CPU offload")
        return " + ".join(parts)


def fsdp_settings(f: FsdpDescription) -> FsdpSettings:
    """The planner's FSDP knobs from the run's resolved FSDP description."""
    return FsdpSettings(
        version=f.version.value,
        sharding=f.sharding.value,
        offload_params=f.offload_params.value,
        backward_prefetch=f.backward_prefetch.value,
        forward_prefetch=f.forward_prefetch.value,
        state_dict_type=f.state_dict_type.value,
        use_orig_params=f.use_orig_params.value,
        cpu_ram_efficient_loading=f.cpu_ram_efficient_loading.value,
    )


def fsdp_as_zero(f: FsdpSettings) -> ZeroSettings:
    """An FSDP strategy in the planner's strategy type: `stage` 3 for the sharded strategies (2 for
    shard_grad_op, 0 for no_shard) and both offload devices "cpu" with `offload_params` (FSDP's CPUOffload
    moves parameters, gradients and so the optimizer step to the host), so the cost order of the candidates
    applies to it unchanged; `fsdp` says it is FSDP."""
    stage = {"no_shard": 0, "shard_grad_op": 2, "hybrid_shard_zero2": 2}.get(f.sharding, 3)
    off = "cpu" if f.offload_params else "none"
    return ZeroSettings(stage=stage, offload_optimizer=off, offload_param=off, pin_memory=True, fsdp=f)


@dataclass(frozen=True)
class ZeroSettings:
    """One DeepSpeed ZeRO configuration: the knobs that move memory (docs/memory-model.md)."""

    stage: int
    offload_optimizer: str = "none"
    offload_param: str = "none"
    pin_memory: bool = True
    reduce_bucket_size: int = DS_DEFAULT_REDUCE_BUCKET
    allgather_bucket_size: int = DS_DEFAULT_ALLGATHER_BUCKET
    prefetch_bucket_size: int = DS_DEFAULT_PREFETCH_BUCKET
    max_live_parameters: int = DS_DEFAULT_MAX_LIVE
    max_reuse_distance: int = DS_DEFAULT_MAX_REUSE
    param_persistence_threshold: int = DS_DEFAULT_PERSISTENCE
    sub_group_size: int = DS_DEFAULT_SUB_GROUP
    overlap_comm: bool | None = None
    gather_16bit_on_save: bool = True
    nvme_param_buffer_count: int = DS_DEFAULT_NVME_PARAM_BUFFER_COUNT
    nvme_param_buffer_size: int = DS_DEFAULT_NVME_PARAM_BUFFER_SIZE
    nvme_optimizer_buffer_count: int = DS_DEFAULT_NVME_OPTIMIZER_BUFFER_COUNT
    optimizer_from_config: bool = False
    """The DeepSpeed config has an Adam/AdamW `optimizer` block, so DeepSpeed builds the optimizer itself
    (runtime/engine.py `_configure_basic_optimizer` -> `get_optimizer_configuration`): FusedAdam on the GPU, whose
    one multi-tensor kernel (`multi_tensor_adam`) updates in place with no full-size temporary; DeepSpeedCPUAdam
    with offload_optimizer. False: the framework hands DeepSpeed torch.optim.AdamW (HF Trainer `create_optimizer`
    when the config has no `optimizer` block), whose foreach update makes one fp32 temporary per tensor."""
    fsdp: FsdpSettings | None = None
    """Set when the strategy is torch FSDP, not DeepSpeed (`fsdp_as_zero`): the other knobs do not apply."""

    @property
    def label(self) -> str:
        """`ZeRO-3 + offload optimizer=cpu, param=cpu (pin)` style short name."""
        if self.fsdp is not None:
            return self.fsdp.label
        parts = [f"ZeRO-{self.stage}"]
        off = []
        if self.offload_optimizer != "none":
            off.append(f"optimizer->{self.offload_optimizer}")
        if self.offload_param != "none":
            off.append(f"param->{self.offload_param}")
        if off:
            parts.append("offload " + ", ".join(off))
            if not self.pin_memory:
                parts.append("pin_memory off")
        if self.stage == 3 and not self.gather_16bit_on_save:
            parts.append("no 16-bit gather at save")
        return " + ".join(parts)

    @property
    def overlap(self) -> bool:
        """`overlap_comm` as DeepSpeed resolves None: True for ZeRO-3, False otherwise (DeepSpeed runtime/zero/config.py)."""
        return self.overlap_comm if self.overlap_comm is not None else self.stage == 3

    @property
    def offload_rank(self) -> int:
        """0 no offload, 1 optimizer to CPU, 2 optimizer+param to CPU, 3 anything to NVMe: the cost order."""
        if "nvme" in (self.offload_optimizer, self.offload_param):
            return 3
        if self.offload_param == "cpu":
            return 2
        return 1 if self.offload_optimizer == "cpu" else 0


@dataclass(frozen=True)
class PlanInputs:
    """Everything the planner needs, resolved. `zero` is the user's ZeRO configuration when they gave one
    (a DeepSpeed file or `--stage`), else None. `framework` is "hf", "llamafactory", "accelerate",
    "xtuner", "deepspeed" or None. None only reaches the planner when PlanInputs is built directly (a library call;
    benchmarks/plan_published.py for litgpt/torchtune runs): `inputs_from_run` -- what `plan`, `check` and the guard
    use -- turns a launcher the files and flags do not name into "hf", with a note. With None, HF-style "auto"
    handling is not assumed for emitted configs and no k-bit preparation is charged (kbit_prep.py).

    A version left None (no --env) is taken per item, each item's docstring saying which: host items as the version
    that holds more (transformers < 5.0 for a PEFT save under ZeRO-3, host_save.py; accelerate >= 1.14 for the FSDP2
    host upcast, host_load.py), the HF Trainer's FSDP1 PEFT wrap policy as a current transformers (fsdp.py)."""

    model: ModelSpec
    cluster: Cluster
    training: Training
    zero: ZeroSettings | None = None
    framework: str | None = None
    deepspeed_version: str | None = None
    torch_version: str | None = None
    transformers_version: str | None = None
    safetensors_version: str | None = None
    accelerate_version: str | None = None
    liger_version: str | None = None
    """liger-kernel's version (None: planned as a current release, `zerodoctor.plan.liger.WEIGHT_GRAD_COPY_FROM`)."""
    sources: Mapping[str, str] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    zero3_init: bool = True
    expandable_segments: bool = False
    """PYTORCH_CUDA_ALLOC_CONF has expandable_segments:True (less allocator slack per GPU)."""
    run: RunDescription | None = field(default=None, compare=False, repr=False)
    """The run description these inputs were read from (None when built directly): what a finding names the
    user's settings by (`per_device_train_batch_size (4, train.yaml:12)`)."""

    @property
    def data_parallel(self) -> int:
        return self.cluster.world_size // self.training.sequence_parallel

    def steps_per_epoch(self) -> int | None:
        """Optimizer steps per epoch: ceil(samples / (micro x dp)) batches per rank, // grad_accum (HF Trainer
        `num_update_steps_per_epoch = len_dataloader // gradient_accumulation_steps`, at least 1). With
        sequence parallelism the ranks of one group share a sample, so dp = world / sp (XTuner)."""
        t = self.training
        if t.samples is None:
            return None
        per_rank = -(-t.samples // (t.micro_batch * self.data_parallel))
        return max(per_rank // t.grad_accum, 1)


PlanOptions = RunFlags
"""The planner's options are the run's flags (`zerodoctor.setup.run.RunFlags`)."""


def load_inputs(opts: PlanOptions, *, env: Environment | None = None) -> PlanInputs:
    """Read the files named in `opts`, describe the run, and map it to PlanInputs (PlanError / InputError /
    SetupError, one line each)."""
    setup = None
    files = list(opts.files)
    if opts.deepspeed:
        files.append(opts.deepspeed)
    if files:
        from zerodoctor.setup.load import load_setup

        setup = load_setup(
            files,
            env=env,
            framework=opts.framework,
            world_size=opts.world_size,
            num_nodes=opts.nodes,
            gpus_per_node=opts.gpus_per_node,
            model=opts.model,
        )
    return inputs_from_run(describe_run(setup, opts, env=env))


def build_inputs(
    opts: PlanOptions, *, setup: TrainingSetup | None = None, env: Environment | None = None
) -> PlanInputs:
    return inputs_from_run(describe_run(setup, opts, env=env))


def inputs_from_run(run: RunDescription) -> PlanInputs:
    """The planner's view of a run. Raises PlanError naming what the planner needs and the run does not say."""
    if run.model is None:
        if run.model_ref is None:
            raise PlanError(
                "no model: the files name none and --model is not given",
                hint="pass --model NAME (catalog name, hub id or config.json path), e.g. --model llama-3.1-8b",
            )
        where = run.model_ref.origin.describe()
        raise PlanError(f"{where}: {run.model_note or f'model {run.model_ref.value!r} is not known'}")
    model = run.model
    c = run.cluster
    if c.gpus_per_node is None:
        raise PlanError(
            "GPUs per node unknown", hint="pass --gpus-per-node N, or --env with a snapshot of a GPU node"
        )
    if c.gpu_memory_bytes is None:
        raise PlanError(
            "GPU memory unknown",
            hint="pass --gpu-memory GiB (e.g. 80), or --env with a snapshot of a GPU node",
        )
    if c.host_ram_bytes is None:
        raise PlanError(
            "host RAM per node unknown",
            hint="pass --host-ram GiB (per node, e.g. 1024), or --env with a snapshot",
        )
    assert c.nodes is not None  # known whenever GPUs per node are
    cluster = Cluster(c.nodes.value, c.gpus_per_node.value, c.gpu_memory_bytes.value, c.host_ram_bytes.value)
    if run.world_size is not None and run.world_size != cluster.world_size:
        raise PlanError(
            f"world size {run.world_size} ({run.cluster.world_size.origin.describe() if run.cluster.world_size else ''}) "
            f"is not {cluster.nodes} node(s) x {cluster.gpus_per_node} GPUs",
            hint="pass --nodes and --gpus-per-node that multiply to the world size",
        )
    if run.method.value not in METHODS:
        raise PlanError(
            f"finetuning method '{run.method.value}' is not modelled by the planner",
            hint="use --method full|lora|qlora|freeze",
        )
    training = Training(
        method=run.method.value,
        lora_rank=run.lora_rank.value,
        lora_targets=run.lora_targets.value,
        lora_dropout=run.lora_dropout.value if run.lora_dropout is not None else 0.0,
        quant_storage=run.quant_storage.value,
        quant_storage_by_framework=run.quant_storage_by_framework,
        precision=run.precision.value,
        optimizer=run.optimizer.value,
        offload_swaps_optimizer=run.framework.swaps_offloaded_optimizer,
        lower_bound=run.lower_bound,
        micro_batch=run.micro_batch.value,
        grad_accum=run.grad_accum.value,
        seq_len=run.seq_len.value,
        gradient_checkpointing=run.gradient_checkpointing.value,
        attn=run.attn.value,
        sequence_parallel=run.sequence_parallel.value,
        samples=run.samples.value if run.samples is not None else None,
        save_only_model=run.save_only_model.value,
        trainable_modules=run.trainable_modules.value,
        freeze_trainable_layers=run.freeze_trainable_layers.value,
        reference_model=run.reference_model.value,
        paired_inputs=run.paired_inputs.value,
        quant_method=run.quant_method.value,
        weights_dtype=run.weights_dtype.value if run.weights_dtype is not None else None,
        pure_bf16=bool(run.pure_bf16.value) if run.pure_bf16 is not None else False,
        eval_micro_batch=run.eval_micro_batch.value if run.eval_micro_batch is not None else None,
        eval_keeps_logits=bool(run.eval_keeps_logits.value) if run.eval_keeps_logits is not None else False,
        kbit_preparation=_kbit_preparation(run),
        liger_kernel=bool(run.liger_kernel.value) if run.liger_kernel is not None else False,
        cut_cross_entropy=bool(run.cut_cross_entropy.value) if run.cut_cross_entropy is not None else False,
        liger_kernel_config=run.liger_kernel_config.value if run.liger_kernel_config is not None else (),
        # TRL < 0.16 SFTConfig `use_liger` loads through AutoLigerKernelForCausalLM (trl sft_trainer.py)
        liger_at_load=run.liger_kernel is not None and run.liger_kernel.origin.key == "use_liger",
    )
    notes = list(run.notes)
    quant = model.quantization
    if quant is not None:
        # A pre-quantized checkpoint (GPTQ/AWQ/bnb weights in the files) trains only adapters on top: the run is a
        # QLoRA of the checkpoint's own method whatever the recipe's quantization flags say (LLaMA-Factory
        # model_utils/quantization.py: "`quantization_bit` will not affect on the PTQ-quantized models").
        refusal = quant.planner_refusal
        if refusal is not None:
            raise PlanError(f"{model.name}: {refusal}")
        if training.method not in ("lora", "qlora"):
            raise PlanError(
                f"{model.name} is a pre-quantized checkpoint ({quant.source}): its packed weights cannot be "
                f"trained by '{training.method}' (transformers trainer_utils: 'You cannot perform fine-tuning on "
                "purely quantized models')",
                hint="use --method lora (adapters on the quantized base), or plan the 16-bit base model",
            )
        method_q = quant.method or training.quant_method  # `-4bit` names no method: the run's (default bnb)
        group = training.quant_group_size
        if quant.group_size is not None:
            group = quant.group_size if quant.group_size > 0 else model.params.hidden_size  # -1: one group per column
        training = replace(training, method="qlora", quant_method=method_q, quant_group_size=group)
        notes.append(
            f"pre-quantized base: {method_q} {quant.bits}-bit (from {quant.source}); planned as a QLoRA of it"
        )
    # MoE experts as the environment's transformers builds them (one nn.Linear per expert before 5.0), before the
    # LoRA targets are checked against the model's Linear names
    laid_out = with_transformers_layout(model, (run.env.version_of("transformers") or None) if run.env else None)
    if laid_out is not model:
        notes.append(laid_out.notes.rsplit("; ", 1)[-1])
        model = laid_out
    if training.is_peft:
        model.lora_params(training.lora_rank, training.lora_targets)  # validates target names, clear message
    framework = run.framework.name
    if framework is None:
        framework = "hf"
        if not any(n.startswith("launcher unknown") for n in notes):
            notes.append(
                "launcher unknown: assuming HF Trainer where it matters (pass --framework to change it)"
            )
    zero = zero_settings(run.zero) if run.zero is not None else None
    if zero is None and run.fsdp is not None:
        zero = fsdp_as_zero(fsdp_settings(run.fsdp))
    env = run.env
    return PlanInputs(
        model=model,
        cluster=cluster,
        training=training,
        zero=zero,
        framework=framework,
        deepspeed_version=(env.version_of("deepspeed") or None) if env is not None else None,
        torch_version=(env.version_of("torch") or None) if env is not None else None,
        transformers_version=(env.version_of("transformers") or None) if env is not None else None,
        safetensors_version=(env.version_of("safetensors") or None) if env is not None else None,
        accelerate_version=(env.version_of("accelerate") or None) if env is not None else None,
        liger_version=(env.version_of("liger-kernel") or None) if env is not None else None,
        sources=run.sources(),
        notes=tuple(notes),
        zero3_init=run.zero.zero3_init.value if run.zero is not None else True,
        expandable_segments=run.expandable_segments.value,
        run=run,
    )


def _kbit_preparation(run: RunDescription) -> str | None:
    """The k-bit preparation a run's own arguments choose, where they do: LLaMA-Factory's `upcast_layernorm: true`
    puts the norm weights in fp32 ("norms"); an axolotl YAML's own ("none": `setup.axolotl.KBIT_PREPARATION`);
    None = the framework's (`zerodoctor.plan.kbit_prep.FRAMEWORK_MODE`)."""
    if run.kbit_preparation is not None:
        return run.kbit_preparation.value
    if run.framework.name == "llamafactory" and run.upcast_layernorm is not None and run.upcast_layernorm.value:
        return "norms"
    return None


def zero_settings(z: ZeroDescription) -> ZeroSettings:
    """The planner's ZeRO knobs from the run's resolved ZeRO description."""
    return ZeroSettings(
        stage=z.stage.value,
        offload_optimizer=z.offload_optimizer.value,
        offload_param=z.offload_param.value,
        pin_memory=z.pin_memory.value,
        reduce_bucket_size=z.reduce_bucket_size.value,
        allgather_bucket_size=z.allgather_bucket_size.value,
        prefetch_bucket_size=z.prefetch_bucket_size.value,
        max_live_parameters=z.max_live_parameters.value,
        max_reuse_distance=z.max_reuse_distance.value,
        param_persistence_threshold=z.param_persistence_threshold.value,
        sub_group_size=z.sub_group_size.value,
        overlap_comm=z.overlap_comm.value,
        gather_16bit_on_save=z.gather_16bit_on_save.value,
        nvme_param_buffer_count=z.nvme_param_buffer_count,
        nvme_param_buffer_size=z.nvme_param_buffer_size,
        nvme_optimizer_buffer_count=z.nvme_optimizer_buffer_count,
        optimizer_from_config=z.optimizer_from_config,
    )
