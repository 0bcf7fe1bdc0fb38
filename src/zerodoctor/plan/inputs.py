"""What the planner is asked: the model, the cluster, the training recipe and the ZeRO settings, resolved.

Values come from three places, in this order of precedence: explicit options (`--micro-batch 2`), the
user's files read through `zerodoctor.setup` (HF / LLaMA-Factory / XTuner arguments, the DeepSpeed JSON)
and the environment snapshot (`--env`: GPU memory, host RAM, GPU count), then documented defaults.
`PlanInputs.sources` records where every value came from, so the report can say "micro batch 2 (from
train_args.yaml: per_device_train_batch_size)".

Nothing here imports torch, transformers or DeepSpeed.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from zerodoctor.errors import PlanError
from zerodoctor.facts import as_number, is_auto, truthy
from zerodoctor.models import LORA_ALL_LINEAR, ModelSpec, resolve_model
from zerodoctor.setup.model import normalize_dtype

if TYPE_CHECKING:
    from zerodoctor.env.model import Environment
    from zerodoctor.setup.model import TrainingSetup

GIB = 2**30
GB = 10**9

METHODS = ("full", "lora", "qlora")
PRECISIONS = ("bf16", "fp16", "fp32")
OPTIMIZERS = ("adamw", "adamw_8bit", "sgd")
ATTN_IMPLS = ("flash", "sdpa", "eager")
OFFLOAD_DEVICES = ("none", "cpu", "nvme")
QUANT_STORAGES = ("bfloat16", "float16", "float32", "uint8")

DEFAULT_SEQ_LEN = 2048
"""LLaMA-Factory's `cutoff_len` default (hparams/data_args.py) -- used when neither an option nor a file says."""
DEFAULT_LORA_RANK = 8
"""PEFT `LoraConfig.r` and LLaMA-Factory `lora_rank` default."""
DEFAULT_LORA_TARGETS = LORA_ALL_LINEAR
"""LLaMA-Factory's `lora_target: all` (every linear layer but the output layer)."""

# HF Trainer fills these "auto" bucket values from the model's hidden size h (transformers
# integrations/deepspeed.py trainer_config_finalize; memory.md §11.1).
HF_AUTO_REDUCE_BUCKET = "h*h"
HF_AUTO_PREFETCH = "0.9*h*h"
HF_AUTO_PERSISTENCE = "10*h"

# DeepSpeed's code defaults for the knobs the planner reads (DeepSpeed 0.19.8 runtime/zero/config.py and
# offload_config.py, the same table as zerodoctor.setup.deepspeed_config.DS_DEFAULTS; memory.md §11.1).
DS_DEFAULT_REDUCE_BUCKET = 500_000_000
DS_DEFAULT_ALLGATHER_BUCKET = 500_000_000
DS_DEFAULT_PREFETCH_BUCKET = 50_000_000
DS_DEFAULT_MAX_LIVE = 1_000_000_000
DS_DEFAULT_MAX_REUSE = 1_000_000_000
DS_DEFAULT_PERSISTENCE = 100_000
DS_DEFAULT_SUB_GROUP = 1_000_000_000
DS_DEFAULT_NVME_PARAM_BUFFER_COUNT = 5
DS_DEFAULT_NVME_PARAM_BUFFER_SIZE = 100_000_000
DS_DEFAULT_NVME_OPTIMIZER_BUFFER_COUNT = 4


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
    (LLaMA-Factory, failures.md A4)."""

    method: str = "full"
    lora_rank: int = DEFAULT_LORA_RANK
    lora_targets: str | tuple[str, ...] = DEFAULT_LORA_TARGETS
    quant_storage: str = "uint8"
    quant_storage_by_framework: bool = False
    double_quant: bool = True
    precision: str = "bf16"
    optimizer: str = "adamw"
    micro_batch: int = 1
    grad_accum: int = 1
    seq_len: int = DEFAULT_SEQ_LEN
    gradient_checkpointing: bool = True
    attn: str = "sdpa"
    sequence_parallel: int = 1
    samples: int | None = None
    save_only_model: bool = False

    @property
    def param_bytes(self) -> int:
        return 4 if self.precision == "fp32" else 2

    @property
    def is_peft(self) -> bool:
        return self.method in ("lora", "qlora")


@dataclass(frozen=True)
class ZeroSettings:
    """One DeepSpeed ZeRO configuration: the knobs that move memory (memory.md §11.1)."""

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

    @property
    def label(self) -> str:
        """`ZeRO-3 + offload optimizer=cpu, param=cpu (pin)` style short name."""
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
        """`overlap_comm` as DeepSpeed resolves None: True for ZeRO-3, False otherwise (memory.md §11.1)."""
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
    "xtuner", "deepspeed" or None (unknown: HF-style "auto" handling is assumed for emitted configs only
    when it is one of the HF family)."""

    model: ModelSpec
    cluster: Cluster
    training: Training
    zero: ZeroSettings | None = None
    framework: str | None = None
    deepspeed_version: str | None = None
    torch_version: str | None = None
    transformers_version: str | None = None
    sources: Mapping[str, str] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    zero3_init: bool = True

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


@dataclass
class PlanOptions:
    """Raw options (None = not given). What `zerodoctor plan` parses; also the library entry point."""

    model: str | None = None
    files: tuple[str, ...] = ()
    nodes: int | None = None
    gpus_per_node: int | None = None
    gpu_memory_gib: float | None = None
    host_ram_gib: float | None = None
    method: str | None = None
    lora_rank: int | None = None
    lora_targets: str | None = None
    quant_storage: str | None = None
    precision: str | None = None
    optimizer: str | None = None
    micro_batch: int | None = None
    grad_accum: int | None = None
    seq_len: int | None = None
    gradient_checkpointing: bool | None = None
    attn: str | None = None
    sequence_parallel: int | None = None
    samples: int | None = None
    deepspeed: str | None = None
    stage: int | None = None
    offload_optimizer: str | None = None
    offload_param: str | None = None
    save_only_model: bool | None = None
    framework: str | None = None


def _choice(value: str, allowed: tuple[str, ...], what: str) -> str:
    low = value.strip().lower()
    if low in allowed:
        return low
    close = difflib.get_close_matches(low, allowed, n=3, cutoff=0.4)
    hint = f"did you mean {' or '.join(close)}?" if close else f"use one of: {', '.join(allowed)}"
    raise PlanError(f"{what} '{value}' is not known", hint=hint)


def _positive(value: Any, what: str) -> int:
    num = as_number(value)
    if num is None or num != int(num) or num <= 0:
        raise PlanError(f"{what} must be a whole number above 0, got {value!r}")
    return int(num)


def _gib(value: float, what: str) -> int:
    if value <= 0:
        raise PlanError(f"{what} must be above 0 GiB, got {value:g}")
    return int(value * GIB)


def _normalize_dtype(value: Any) -> str:
    """setup's dtype spelling, plus "none" for "no quant storage" (bitsandbytes then packs into uint8)."""
    if str(value).strip().lower() == "none":
        return "uint8"
    return normalize_dtype(value) or "uint8"


def _targets(value: Any) -> str | tuple[str, ...]:
    """PEFT / LLaMA-Factory target spelling: "all", "all-linear", "q_proj,v_proj", a list."""
    if isinstance(value, list | tuple):
        names = tuple(str(v).strip() for v in value if str(v).strip())
    else:
        text = str(value).strip()
        if text.lower() in ("all", "all-linear", "all_linear"):
            return LORA_ALL_LINEAR
        names = tuple(p.strip() for p in text.split(",") if p.strip())
    if not names:
        raise PlanError("--lora-targets is empty", hint=f"pass '{LORA_ALL_LINEAR}' or q_proj,v_proj,...")
    return names


class _Resolver:
    """Collects values with their source: option > file > environment > default."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}
        self.sources: dict[str, str] = {}

    def pick(self, key: str, *candidates: tuple[Any, str]) -> Any:
        for value, source in candidates:
            if value is not None:
                self.values[key] = value
                self.sources[key] = source
                return value
        return None


def _arg(setup: TrainingSetup | None, *names: str) -> tuple[Any, str]:
    """First of `names` given in the HF / LLaMA-Factory arguments file (not a default)."""
    if setup is None or setup.args_doc is None:
        return None, ""
    given = setup.args_doc.data
    for name in names:
        if name in given and given[name] is not None:
            return setup.args.get(name, given[name]), f"{setup.args_doc.display}: {name}"
    return None, ""


def _xt(setup: TrainingSetup | None, *paths: tuple[str, ...] | str) -> tuple[Any, str]:
    if setup is None or setup.xtuner_doc is None:
        return None, ""
    for path in paths:
        value = setup.xtuner_doc.get(path)
        if value is not None and isinstance(value, int | float | str | bool):
            key = path if isinstance(path, str) else ".".join(path)
            return value, f"{setup.xtuner_doc.display}: {key}"
    return None, ""


def _ds(setup: TrainingSetup | None, key: str) -> tuple[Any, str]:
    if setup is None or setup.ds_written is None:
        return None, ""
    value = setup.ds_flat().get(key)
    if value is None:
        return None, ""
    written = setup.ds_written_value(key)
    where = setup.ds_doc.display if setup.ds_doc is not None else "DeepSpeed config"
    return value, f"{where}: {key}" if written is not None else f"DeepSpeed default ({key})"


def load_inputs(opts: PlanOptions, *, env: Environment | None = None) -> PlanInputs:
    """Resolve options + files + environment into PlanInputs; raises PlanError / InputError (one line each)."""
    setup = None
    files = list(opts.files)
    if opts.deepspeed:
        files.append(opts.deepspeed)
    if files:
        from zerodoctor.setup.load import load_setup

        world = opts.nodes * opts.gpus_per_node if opts.nodes and opts.gpus_per_node else None
        setup = load_setup(
            files,
            env=env,
            framework=opts.framework,
            world_size=world,
            num_nodes=opts.nodes,
            gpus_per_node=opts.gpus_per_node,
            model=opts.model,
        )
    return build_inputs(opts, setup=setup, env=env)


def build_inputs(
    opts: PlanOptions, *, setup: TrainingSetup | None = None, env: Environment | None = None
) -> PlanInputs:
    r = _Resolver()
    notes: list[str] = []
    env = env if env is not None else (setup.env if setup is not None else None)
    env_facts = env.facts() if env is not None else {}

    # ---- model -------------------------------------------------------------------------------------------
    model_ref = opts.model or (setup.model_ref if setup is not None else None)
    if not model_ref:
        raise PlanError(
            "no model: the files name none and --model is not given",
            hint="pass --model NAME (catalog name, hub id or config.json path), e.g. --model llama-3.1-8b",
        )
    spec = setup.model_spec if setup is not None and setup.model_spec is not None and not opts.model else None
    model: ModelSpec = spec if spec is not None else resolve_model(str(model_ref))
    r.sources["model"] = "--model" if opts.model else _model_source(setup)

    # ---- cluster -----------------------------------------------------------------------------------------
    gpn = r.pick(
        "gpus_per_node",
        (opts.gpus_per_node, "--gpus-per-node"),
        (setup.gpus_per_node if setup else None, "files"),
        (env_facts.get("env.gpu_count") or None, "--env (GPUs in the snapshot)"),
    )
    if gpn is None:
        raise PlanError(
            "GPUs per node unknown", hint="pass --gpus-per-node N, or --env with a snapshot of a GPU node"
        )
    gpn = _positive(gpn, "--gpus-per-node")
    world_from_files = setup.world_size if setup is not None else None
    nodes = r.pick(
        "nodes",
        (opts.nodes, "--nodes"),
        (world_from_files // gpn if world_from_files and world_from_files % gpn == 0 else None, "world size"),
        (1, "default (1 node)"),
    )
    nodes = _positive(nodes, "--nodes")
    gpu_mem = (
        _gib(opts.gpu_memory_gib, "--gpu-memory")
        if opts.gpu_memory_gib is not None
        else env_facts.get("env.gpu_memory_bytes")
    )
    r.sources["gpu_memory"] = "--gpu-memory" if opts.gpu_memory_gib is not None else "--env (smallest GPU)"
    if not gpu_mem:
        raise PlanError(
            "GPU memory unknown",
            hint="pass --gpu-memory GiB (e.g. 80), or --env with a snapshot of a GPU node",
        )
    host = (
        _gib(opts.host_ram_gib, "--host-ram")
        if opts.host_ram_gib is not None
        else env_facts.get("env.host_ram_bytes")
    )
    r.sources["host_ram"] = "--host-ram" if opts.host_ram_gib is not None else "--env (host RAM)"
    if not host:
        raise PlanError(
            "host RAM per node unknown",
            hint="pass --host-ram GiB (per node, e.g. 1024), or --env with a snapshot",
        )
    cluster = Cluster(nodes, gpn, int(gpu_mem), int(host))

    # ---- training recipe ---------------------------------------------------------------------------------
    framework = opts.framework or (setup.framework if setup is not None else None)
    if framework is None:
        framework = "hf"
        notes.append("launcher unknown: assuming HF Trainer (pass --framework to change what a save gathers)")
    method = r.pick(
        "method", (opts.method, "--method"), (setup.method if setup else None, "files"), ("full", "default")
    )
    method = _choice(str(method), METHODS, "--method")
    if method not in METHODS:  # freeze/oft etc. from LLaMA-Factory
        raise PlanError(f"finetuning method '{method}' is not modelled", hint="use --method full|lora|qlora")
    lora_rank = _positive(
        r.pick(
            "lora_rank",
            (opts.lora_rank, "--lora-rank"),
            _arg(setup, "lora_rank", "lora_r"),
            (DEFAULT_LORA_RANK, "default (PEFT r=8)"),
        ),
        "--lora-rank",
    )
    targets = _targets(
        r.pick(
            "lora_targets",
            (opts.lora_targets, "--lora-targets"),
            _arg(setup, "lora_target", "lora_target_modules", "target_modules"),
            (DEFAULT_LORA_TARGETS, "default (all linear layers)"),
        )
    )
    quant = dict(setup.quant) if setup is not None else {}
    # TRL-style load_in_4bit + torch_dtype: some TRL releases set the storage to torch_dtype (lint QL001 warns);
    # plan that case, and say so in the value's source.
    maybe_dtype = quant.get("bnb_4bit_compute_dtype") if quant.get("quant_storage_maybe_from_dtype") else None
    storage_raw = r.pick(
        "quant_storage",
        (opts.quant_storage, "--quant-storage"),
        (quant.get("bnb_4bit_quant_storage"), "files"),
        (maybe_dtype, "torch_dtype (as TRL's get_quantization_config sets it in some releases)"),
        ("uint8", "default (bitsandbytes: uint8)"),
    )
    storage = _choice(_normalize_dtype(storage_raw), QUANT_STORAGES, "--quant-storage")
    by_framework = bool(quant.get("quant_storage_set_by_framework")) and opts.quant_storage is None
    precision = r.pick(
        "precision",
        (opts.precision, "--precision"),
        (_precision_from_setup(setup), "files"),
        ("bf16", "default"),
    )
    precision = _choice(str(precision), PRECISIONS, "--precision")
    optimizer = r.pick(
        "optimizer",
        (opts.optimizer, "--optimizer"),
        (_optimizer_from_setup(setup), "files"),
        ("adamw", "default"),
    )
    optimizer = _choice(str(optimizer), OPTIMIZERS, "--optimizer")
    micro = r.pick(
        "micro_batch",
        (opts.micro_batch, "--micro-batch"),
        _xt(setup, ("train_dataloader", "batch_size"), "batch_size"),
        _arg(setup, "per_device_train_batch_size"),
        _ds(setup, "train_micro_batch_size_per_gpu")
        if _ds_concrete(setup, "train_micro_batch_size_per_gpu")
        else (None, ""),
        (1, "default"),
    )
    micro = _positive(micro, "--micro-batch")
    accum = r.pick(
        "grad_accum",
        (opts.grad_accum, "--grad-accum"),
        _xt(setup, ("optim_wrapper", "accumulative_counts"), "accumulative_counts"),
        _arg(setup, "gradient_accumulation_steps"),
        _ds(setup, "gradient_accumulation_steps")
        if _ds_concrete(setup, "gradient_accumulation_steps")
        else (None, ""),
        (1, "default"),
    )
    accum = _positive(accum, "--grad-accum")
    seq = r.pick(
        "seq_len",
        (opts.seq_len, "--seq-len"),
        _xt(setup, "max_length"),
        _arg(setup, "cutoff_len", "max_length", "max_seq_length", "model_max_length"),
        (DEFAULT_SEQ_LEN, f"default ({DEFAULT_SEQ_LEN}, LLaMA-Factory cutoff_len)"),
    )
    seq = _positive(seq, "--seq-len")
    gc = r.pick(
        "gradient_checkpointing",
        (opts.gradient_checkpointing, "--gradient-checkpointing"),
        _gc_from_setup(setup),
        (True, "default (on; pass --no-gradient-checkpointing)"),
    )
    attn = r.pick(
        "attn",
        (opts.attn, "--attn"),
        (_attn_from_setup(setup), "files"),
        ("sdpa", "default (transformers: sdpa)"),
    )
    attn = _choice(str(attn), ATTN_IMPLS, "--attn")
    sp = r.pick(
        "sequence_parallel",
        (opts.sequence_parallel, "--sequence-parallel"),
        _xt(setup, "sequence_parallel_size"),
        _arg(setup, "sequence_parallel_size"),
        (1, "default"),
    )
    sp = _positive(sp, "--sequence-parallel")
    if cluster.world_size % sp:
        raise PlanError(
            f"world size {cluster.world_size} ({nodes} node(s) x {gpn} GPUs) is not divisible by "
            f"sequence parallel size {sp}",
            hint="choose --sequence-parallel that divides the number of GPUs",
        )
    if seq % sp:
        notes.append(
            f"sequence length {seq} is not a multiple of sequence parallel {sp}; rounded up per rank"
        )
    samples = opts.samples if opts.samples is not None else (setup.dataset_samples if setup else None)
    if samples is not None:
        samples = _positive(samples, "--samples")
        r.sources["samples"] = "--samples"
    save_only = r.pick(
        "save_only_model",
        (opts.save_only_model, "--save-only-model"),
        _arg(setup, "save_only_model"),
        (False, "default"),
    )
    training = Training(
        method=method,
        lora_rank=lora_rank,
        lora_targets=targets,
        quant_storage=storage,
        quant_storage_by_framework=by_framework,
        precision=precision,
        optimizer=optimizer,
        micro_batch=micro,
        grad_accum=accum,
        seq_len=seq,
        gradient_checkpointing=bool(truthy(gc)),
        attn=attn,
        sequence_parallel=sp,
        samples=samples,
        save_only_model=bool(truthy(save_only)),
    )
    if training.is_peft:
        model.lora_params(lora_rank, targets)  # validates the target names now, with a clear message

    # ---- ZeRO --------------------------------------------------------------------------------------------
    ds_version = env.version_of("deepspeed") if env is not None else None
    torch_version = env.version_of("torch") if env is not None else None
    tf_version = env.version_of("transformers") if env is not None else None
    zero = _zero_from_setup(setup, model, framework, r) if setup is not None else None
    if opts.stage is not None or opts.offload_optimizer or opts.offload_param:
        base = zero or ZeroSettings(stage=opts.stage if opts.stage is not None else 3, pin_memory=True)
        if opts.stage is not None:
            if opts.stage not in (0, 1, 2, 3):
                raise PlanError(f"--stage must be 0, 1, 2 or 3, got {opts.stage}")
            base = replace(base, stage=opts.stage)
            r.sources["stage"] = "--stage"
        if opts.offload_optimizer:
            base = replace(
                base,
                offload_optimizer=_choice(opts.offload_optimizer, OFFLOAD_DEVICES, "--offload-optimizer"),
            )
            r.sources["offload_optimizer"] = "--offload-optimizer"
        if opts.offload_param:
            base = replace(
                base, offload_param=_choice(opts.offload_param, OFFLOAD_DEVICES, "--offload-param")
            )
            r.sources["offload_param"] = "--offload-param"
        zero = base
    if zero is not None:
        _check_zero(zero)
    zero3_init = True
    if setup is not None and setup.zero3_init_flag() is False:
        zero3_init = False
        notes.append(
            "accelerate zero3_init_flag is false: every rank loads the whole model before partitioning"
        )
    sources = dict(r.sources)
    return PlanInputs(
        model=model,
        cluster=cluster,
        training=training,
        zero=zero,
        framework=framework,
        deepspeed_version=ds_version or None,
        torch_version=torch_version or None,
        transformers_version=tf_version or None,
        sources=sources,
        notes=tuple(notes),
        zero3_init=zero3_init,
    )


def _check_zero(z: ZeroSettings) -> None:
    if z.offload_param != "none" and z.stage != 3:
        raise PlanError(
            f"offload_param={z.offload_param} needs ZeRO stage 3, the config has stage {z.stage}",
            hint="set zero_optimization.stage to 3 or offload_param.device to none",
        )
    if z.offload_optimizer != "none" and z.stage == 0:
        raise PlanError(
            "offload_optimizer needs ZeRO stage 1, 2 or 3", hint="set zero_optimization.stage to 2 or 3"
        )


def _model_source(setup: TrainingSetup | None) -> str:
    if setup is None:
        return "files"
    doc = setup.args_doc or setup.xtuner_doc
    return f"{doc.display}: model" if doc is not None else "files"


def _ds_concrete(setup: TrainingSetup | None, key: str) -> bool:
    if setup is None or setup.ds_written is None:
        return False
    value = setup.ds_written_value(key)
    return value is not None and not is_auto(value)


def _precision_from_setup(setup: TrainingSetup | None) -> str | None:
    if setup is None:
        return None
    if setup.args_doc is not None:
        if setup.args.get("bf16") is True:
            return "bf16"
        if setup.args.get("fp16") is True:
            return "fp16"
    if setup.ds_written is not None:
        flat = setup.ds_flat()
        if flat.get("bf16.enabled") is True:
            return "bf16"
        if flat.get("fp16.enabled") is True:
            return "fp16"
        if setup.args_doc is None and setup.xtuner_doc is None and setup.framework == "deepspeed":
            return "fp32"
    return None


def _optimizer_from_setup(setup: TrainingSetup | None) -> str | None:
    if setup is None:
        return None
    value, _ = _arg(setup, "optim")
    if isinstance(value, str):
        low = value.lower()
        if "8bit" in low:
            return "adamw_8bit"
        if "sgd" in low:
            return "sgd"
        if "adam" in low:
            return "adamw"
    if setup.ds_written is not None:
        opt = setup.ds_written_value("optimizer.type")
        if isinstance(opt, str):
            return "sgd" if "sgd" in opt.lower() else "adamw"
    return None


def _gc_from_setup(setup: TrainingSetup | None) -> tuple[Any, str]:
    if setup is None:
        return None, ""
    if setup.args_doc is not None and setup.args_doc.kind == "llamafactory":
        value, where = _arg(setup, "disable_gradient_checkpointing")
        if value is not None:
            return (not truthy(value)), where
        return True, f"{setup.args_doc.display}: LLaMA-Factory default (gradient checkpointing on)"
    value, where = _arg(setup, "gradient_checkpointing")
    if value is not None:
        return truthy(value), where
    if setup.args_doc is not None:
        return False, f"{setup.args_doc.display}: HF default (gradient_checkpointing false)"
    if setup.xtuner_doc is not None:
        return True, f"{setup.xtuner_doc.display}: XTuner enables gradient checkpointing by default"
    return None, ""


def _attn_from_setup(setup: TrainingSetup | None) -> str | None:
    if setup is None:
        return None
    value, _ = _arg(setup, "attn_implementation", "flash_attn")
    if isinstance(value, str):
        low = value.lower()
        if "flash" in low or low in ("fa2", "fa3"):
            return "flash"
        if low == "eager" or low == "disabled":
            return "eager"
        return "sdpa"
    value, _ = _arg(setup, "use_flash_attn")
    if value is not None and truthy(value):
        return "flash"
    if setup.xtuner_doc is not None and (setup.xtuner_doc.get("sequence_parallel_size") or 1) != 1:
        return "flash"  # XTuner sequence parallel requires flash attention (dispatch)
    return None


def _num(value: Any, fallback: int) -> int:
    num = as_number(value)
    return int(num) if num is not None else fallback


def _zero_from_setup(
    setup: TrainingSetup, model: ModelSpec, framework: str | None, r: _Resolver
) -> ZeroSettings | None:
    """The user's ZeRO configuration as DeepSpeed will run it: "auto" bucket values as HF fills them from
    the model's hidden size (when the framework is HF-like), DeepSpeed's code defaults for absent keys."""
    if setup.ds_written is None:
        return None
    flat = setup.ds_flat()
    h = model.params.hidden_size
    hf_like = framework in ("hf", "llamafactory", "accelerate")

    def knob(key: str, ds_default: int, hf_auto: int | None) -> int:
        value = flat.get(f"zero_optimization.{key}")
        if is_auto(value):
            if hf_like and hf_auto is not None:
                r.sources[key] = f'"auto" -> {hf_auto:,} (HF: from hidden size {h})'
                return hf_auto
            r.sources[key] = f'"auto" left unfilled: DeepSpeed default {ds_default:,}'
            return ds_default
        return _num(value, ds_default)

    stage = _num(flat.get("zero_optimization.stage"), 0)
    opt = str(flat.get("zero_optimization.offload_optimizer.device", "none") or "none").lower()
    par = str(flat.get("zero_optimization.offload_param.device", "none") or "none").lower()
    for name, value in (("offload_optimizer", opt), ("offload_param", par)):
        if value not in OFFLOAD_DEVICES:
            raise PlanError(
                f"zero_optimization.{name}.device is '{value}'",
                hint="DeepSpeed accepts none, cpu or nvme (lower case)",
            )
    pins = [
        flat.get(f"zero_optimization.offload_{p}.pin_memory")
        for p, dev in (("optimizer", opt), ("param", par))
        if dev != "none"
    ]
    # Unknown DeepSpeed version and not written: assume the current default (True since PR #8207).
    pin = any(p is None or truthy(p) is not False for p in pins) if pins else True
    overlap = flat.get("zero_optimization.overlap_comm")
    zero = ZeroSettings(
        stage=stage,
        offload_optimizer=opt,
        offload_param=par,
        pin_memory=pin,
        reduce_bucket_size=knob("reduce_bucket_size", DS_DEFAULT_REDUCE_BUCKET, h * h),
        allgather_bucket_size=knob("allgather_bucket_size", DS_DEFAULT_ALLGATHER_BUCKET, None),
        prefetch_bucket_size=knob(
            "stage3_prefetch_bucket_size", DS_DEFAULT_PREFETCH_BUCKET, int(0.9 * h * h)
        ),
        max_live_parameters=knob("stage3_max_live_parameters", DS_DEFAULT_MAX_LIVE, None),
        max_reuse_distance=knob("stage3_max_reuse_distance", DS_DEFAULT_MAX_REUSE, None),
        param_persistence_threshold=knob(
            "stage3_param_persistence_threshold", DS_DEFAULT_PERSISTENCE, 10 * h
        ),
        sub_group_size=knob("sub_group_size", DS_DEFAULT_SUB_GROUP, None),
        overlap_comm=None if overlap is None else bool(truthy(overlap)),
        gather_16bit_on_save=bool(
            truthy(flat.get("zero_optimization.stage3_gather_16bit_weights_on_model_save"))
        ),
        nvme_param_buffer_count=_num(
            flat.get("zero_optimization.offload_param.buffer_count"), DS_DEFAULT_NVME_PARAM_BUFFER_COUNT
        ),
        nvme_param_buffer_size=_num(
            flat.get("zero_optimization.offload_param.buffer_size"), DS_DEFAULT_NVME_PARAM_BUFFER_SIZE
        ),
        nvme_optimizer_buffer_count=_num(
            flat.get("zero_optimization.offload_optimizer.buffer_count"),
            DS_DEFAULT_NVME_OPTIMIZER_BUFFER_COUNT,
        ),
    )
    r.sources.setdefault("stage", _ds(setup, "zero_optimization.stage")[1] or "DeepSpeed config")
    return zero
