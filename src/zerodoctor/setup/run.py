"""RunDescription: the one frozen, typed description of a training run that every judge reads.

Built once, by `describe_run`, from the user's files (a TrainingSetup), the command-line flags, an optional
`cluster.yaml` and the environment snapshot. Every value is a `Known[T]`: the value plus its `Origin` (a file
line and key, an "auto" filled by the framework, a framework or DeepSpeed default, a flag, the environment),
so a finding can point at the line that caused it. A value nobody gave and no default implies is `None`:
an unknown is never shown as a pass.

Lint rules, the planner (`zerodoctor.plan.inputs.inputs_from_run`), `check`, the selftest and the runtime
guard all read this; none of them re-reads framework keys on its own. Precedence, for every value: flag >
cluster.yaml > the training files (framework arguments, then the DeepSpeed JSON) > environment > default.

Nothing here imports torch, transformers or DeepSpeed.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from packaging.version import Version

from zerodoctor.errors import SetupError
from zerodoctor.facts import as_number, is_auto, truthy
from zerodoctor.findings import Evidence
from zerodoctor.models import LORA_ALL_LINEAR, ModelSpec
from zerodoctor.setup import axolotl
from zerodoctor.setup.deepspeed_config import pin_memory_default
from zerodoctor.setup.hf_args import (
    FSDP_SHARDING,
    HF_AUTO_BUCKETS,
    HF_FSDP_DEFAULT_VERSION,
    hf_auto_bucket,
    hf_fsdp_options,
)
from zerodoctor.setup.model import FILLS_AUTO, MODEL_REF_KEYS, TrainingSetup, normalize_dtype
from zerodoctor.setup.python_reader import Symbol
from zerodoctor.versions import parse_version

if TYPE_CHECKING:
    from zerodoctor.env.model import Environment

T = TypeVar("T")
GIB = 2**30

METHODS = ("full", "lora", "qlora", "freeze")
PRECISIONS = ("bf16", "fp16", "fp32")
# the planner's optimizers (plan.model_states.OPTIMIZERS reads this list; setup does not import the planner)
OPTIMIZERS = (
    "adamw",
    "adamw_8bit",
    "sgd",
    "paged_adamw_32bit",
    "paged_adamw_8bit",
    "ademamix",
    "ademamix_8bit",
    "paged_ademamix_32bit",
    "paged_ademamix_8bit",
)
ATTN_IMPLS = ("flash", "sdpa", "eager")
OFFLOAD_DEVICES = ("none", "cpu", "nvme")
QUANT_STORAGES = ("bfloat16", "float16", "float32", "uint8")

DEFAULT_SEQ_LEN = 2048
"""LLaMA-Factory's `cutoff_len` default (hparams/data_args.py): used when neither a flag nor a file says."""
DEFAULT_LORA_RANK = 8
"""PEFT `LoraConfig.r` and LLaMA-Factory `lora_rank` default."""

# DeepSpeed's code defaults for the ZeRO knobs that move memory (DeepSpeed 0.19.8 runtime/zero/config.py,
# offload_config.py; the same values as setup.deepspeed_config.DS_DEFAULTS).
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


# ---------------------------------------------------------------------------------------------------------
# Provenance
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Origin:
    """Where a value came from. `kind` is one of: file, auto (a framework filled a DeepSpeed "auto"),
    framework (the framework's own default or behaviour), deepspeed (DeepSpeed's code default), flag,
    cluster-file, environment, default (zerodoctor's documented assumption)."""

    kind: str
    detail: str
    file: str | None = None
    line: int | None = None
    column: int | None = None
    key: str | None = None

    def describe(self) -> str:
        """`train_args.yaml:12:1 (per_device_train_batch_size)`, `--micro-batch`, `default: ...`."""
        if self.file:
            ev = Evidence(file=self.file, line=self.line, column=self.column, key=self.key)
            loc = ev.location()
            return f"{loc}: {self.detail}" if self.detail and self.detail != self.key else loc
        return self.detail if self.kind in ("flag", "environment") else f"{self.kind}: {self.detail}"

    def evidence(self, text: str | None = None) -> Evidence:
        return Evidence(file=self.file, line=self.line, column=self.column, key=self.key, text=text)

    @classmethod
    def of_evidence(cls, ev: Evidence, kind: str = "file", detail: str | None = None) -> Origin:
        return cls(kind, detail or ev.key or "", ev.file, ev.line, ev.column, ev.key)


@dataclass(frozen=True)
class Known(Generic[T]):
    """A value and where it came from."""

    value: T
    origin: Origin


def _flag(name: str) -> Origin:
    return Origin("flag", name)


def _default(why: str) -> Origin:
    return Origin("default", why)


# ---------------------------------------------------------------------------------------------------------
# The description
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FrameworkTraits:
    """What the launcher does for the user (docs/framework-facts.md): fills DeepSpeed "auto" values; builds
    the model under `deepspeed.zero.Init` for ZeRO-3 (so weights are partitioned while loading); hands
    DeepSpeed an optimizer built outside it (a client optimizer)."""

    name: str | None
    fills_auto: bool | None
    zero_init: bool | None
    client_optimizer: bool | None
    swaps_offloaded_optimizer: bool = False
    """Under optimizer offload DeepSpeed steps DeepSpeedCPUAdam (fp32 Adam states), whatever optimizer the run
    names: accelerate swaps the client optimizer (`accelerate_swaps_offloaded_optimizer`)."""


@dataclass(frozen=True)
class ZeroDescription:
    """ZeRO settings as DeepSpeed will run them: after the framework filled "auto" and DeepSpeed's defaults.
    `offload_param` is the effective device (DeepSpeed ignores parameter offload below stage 3, and any
    offload at stage 0); `offload_*_written` keeps what the file says, for the rule that reports the gap."""

    stage: Known[int]
    offload_optimizer: Known[str]
    offload_param: Known[str]
    offload_optimizer_written: str
    offload_param_written: str
    pin_memory: Known[bool]
    reduce_bucket_size: Known[int]
    allgather_bucket_size: Known[int]
    prefetch_bucket_size: Known[int]
    max_live_parameters: Known[int]
    max_reuse_distance: Known[int]
    param_persistence_threshold: Known[int]
    sub_group_size: Known[int]
    overlap_comm: Known[bool]
    gather_16bit_on_save: Known[bool]
    zero3_init: Known[bool]
    gradient_clipping: Known[float] | None
    nvme_param_buffer_count: int = DS_DEFAULT_NVME_PARAM_BUFFER_COUNT
    nvme_param_buffer_size: int = DS_DEFAULT_NVME_PARAM_BUFFER_SIZE
    nvme_optimizer_buffer_count: int = DS_DEFAULT_NVME_OPTIMIZER_BUFFER_COUNT
    optimizer_from_config: bool = False
    """The DeepSpeed config has an Adam/AdamW `optimizer` block (without `torch_adam: true`): DeepSpeed builds
    FusedAdam itself (engine.py `get_optimizer_configuration`), not the framework's torch AdamW."""

    @property
    def offloads(self) -> bool:
        return self.offload_optimizer.value != "none" or self.offload_param.value != "none"


@dataclass(frozen=True)
class FsdpDescription:
    """FSDP as torch will run it: accelerate's `FullyShardedDataParallelPlugin` (from an accelerate config's
    `fsdp_config`, accelerate 1.15 utils/dataclasses.py) or HF Trainer's (`--fsdp` + `fsdp_config`,
    transformers 5.23 `TrainingArguments._process_fsdp_args`), each value with where it came from.
    `sharding` is one of `FSDP_SHARDING` (FSDP2: full_shard = reshard_after_forward true, shard_grad_op =
    false); `backward_prefetch` is "backward_pre", "backward_post" or "none"; `state_dict_type` "full",
    "sharded" or "local"."""

    version: Known[int]
    sharding: Known[str]
    offload_params: Known[bool]
    backward_prefetch: Known[str]
    forward_prefetch: Known[bool]
    state_dict_type: Known[str]
    use_orig_params: Known[bool]
    cpu_ram_efficient_loading: Known[bool]
    activation_checkpointing: Known[bool]


@dataclass(frozen=True)
class ClusterDescription:
    """Homogeneous nodes; any value may be unknown (None)."""

    nodes: Known[int] | None
    gpus_per_node: Known[int] | None
    world_size: Known[int] | None
    gpu_memory_bytes: Known[int] | None
    host_ram_bytes: Known[int] | None


@dataclass(frozen=True)
class RunDescription:
    """One training run, resolved. `files` holds the parsed documents (for evidence positions and the
    rules that judge how a file is written); every decision-relevant value is a field here."""

    files: TrainingSetup = field(compare=False, repr=False)
    env: Environment | None = field(compare=False, repr=False)
    framework: FrameworkTraits
    model_ref: Known[str] | None
    model: ModelSpec | None
    model_note: str | None
    method: Known[str]
    lora_rank: Known[int]
    lora_targets: Known[str | tuple[str, ...]]
    quant_storage: Known[str]
    quant_storage_by_framework: bool
    precision: Known[str]
    optimizer: Known[str]
    micro_batch: Known[int]
    grad_accum: Known[int]
    seq_len: Known[int]
    gradient_checkpointing: Known[bool]
    use_reentrant: Known[bool] | None
    attn: Known[str]
    sequence_parallel: Known[int]
    samples: Known[int] | None
    epochs: Known[float] | None
    max_steps: Known[int] | None
    save_only_model: Known[bool]
    trainable_modules: Known[tuple[str, ...]]
    freeze_trainable_layers: Known[int]
    reference_model: Known[bool]
    paired_inputs: Known[bool]
    quant_method: Known[str]
    expandable_segments: Known[bool]
    zero: ZeroDescription | None
    cluster: ClusterDescription
    notes: tuple[str, ...] = ()
    lower_bound: str | None = None
    """Why the plan is only a lower bound (axolotl's online RL: generation and its models are not modelled): then no
    strategy gets a "fits" verdict (`plan.phases.StrategyPlan.status`)."""
    invalid: tuple[tuple[Origin, str], ...] = ()
    """Values that were wrong and replaced by their default (lenient descriptions only): where, and why."""
    strategy: Known[str] | None = None
    """How the model is sharded: "deepspeed" (a ZeRO config), "fsdp" (torch FSDP through accelerate or HF
    Trainer: `fsdp` holds its settings) or "ddp" (neither: every rank holds the whole model)."""
    fsdp: FsdpDescription | None = None
    weights_dtype: Known[str] | None = None
    """The dtype the model is loaded in (`torch_dtype` / `dtype` in the arguments: "bf16", "fp16", "fp32" or "auto"),
    None when not stated. The planner keeps it as the trained weights of a run without DeepSpeed or FSDP."""
    pure_bf16: Known[bool] | None = None
    """LLaMA-Factory `pure_bf16` (trainable parameters stay 16-bit instead of being upcast to fp32)."""
    upcast_layernorm: Known[bool] | None = None
    """LLaMA-Factory `upcast_layernorm` (model_utils/checkpointing.py prepare_model_for_training: the 1-D norm
    weights in fp32; default off). In a QLoRA run it makes the residual stream fp32 (`zerodoctor.plan.kbit_prep`)."""
    lora_dropout: Known[float] | None = None
    """PEFT / LLaMA-Factory `lora_dropout` from the arguments (None: not stated, PEFT's default 0)."""
    kbit_preparation: Known[str] | None = None
    """The k-bit preparation where the framework's own code decides it apart from `plan.kbit_prep.FRAMEWORK_MODE`
    (an axolotl YAML: "none", `setup.axolotl.KBIT_PREPARATION`); None = the framework's mode."""
    eval_micro_batch: Known[int] | None = None
    """Sequences per GPU in an evaluation forward when the run evaluates (`eval_strategy` / `evaluation_strategy`
    steps|epoch, or `do_eval`; LLaMA-Factory also needs `val_size` > 0 or `eval_dataset`): the run's
    `per_device_eval_batch_size`, else transformers' default 8. None: the run does not evaluate."""
    eval_keeps_logits: Known[bool] | None = None
    """The evaluation keeps each batch's logits for metrics (`prediction_loss_only: false` stated, or LLaMA-Factory
    `compute_accuracy`); otherwise HF Trainer.evaluate keeps only the loss when no compute_metrics is passed."""
    liger_kernel: Known[bool] | None = None
    """Liger Kernel on or off as stated: `--liger-kernel`, HF TrainingArguments / TRL / ms-swift `use_liger_kernel`,
    LLaMA-Factory `enable_liger_kernel`, TRL < 0.16 SFTConfig `use_liger` (None: not stated, off as in every one of
    them)."""
    liger_kernel_config: Known[tuple[tuple[str, bool], ...]] | None = None
    """transformers TrainingArguments `liger_kernel_config`: each kernel it switches on or off (True / False), as
    `_apply_liger_kernel_to_instance(**kernel_config)` receives them (None: not stated, or no boolean in it)."""
    cut_cross_entropy: Known[bool] | None = None
    """Cut Cross-Entropy on or off as stated: `--cut-cross-entropy`, or an arguments file's `cut_cross_entropy` /
    `plugins` list (axolotl's keys, read generically: `_cut_cross_entropy`). None: not stated, off."""

    # ---- derived --------------------------------------------------------------------------------------
    @property
    def world_size(self) -> int | None:
        return self.cluster.world_size.value if self.cluster.world_size else None

    @property
    def data_parallel(self) -> int | None:
        ws = self.world_size
        return ws // self.sequence_parallel.value if ws else None

    def steps_per_epoch(self) -> int | None:
        """Optimizer steps per epoch: ceil(samples / (micro x dp)) batches per rank, // grad_accum (HF Trainer
        `num_update_steps_per_epoch = len_dataloader // gradient_accumulation_steps`, at least 1). With
        sequence parallelism the ranks of one group share a sample, so dp = world / sp (XTuner)."""
        dp = self.data_parallel
        if self.samples is None or not dp:
            return None
        per_rank = -(-self.samples.value // (self.micro_batch.value * dp))
        return max(per_rank // self.grad_accum.value, 1)

    @property
    def deepspeed_version(self) -> str | None:
        return self.env.version_of("deepspeed") if self.env is not None else None

    def sources(self) -> dict[str, str]:
        """Every known value's origin, one line each (what `plan --format json` reports as `sources`)."""
        out: dict[str, str] = {}
        for holder in (self, self.cluster, self.zero):
            for f in fields(holder) if holder is not None else ():
                value = getattr(holder, f.name)
                if isinstance(value, Known):
                    out[f.name.removesuffix("_bytes")] = value.origin.describe()
        for f in fields(self.fsdp) if self.fsdp is not None else ():
            out["fsdp_" + f.name] = getattr(self.fsdp, f.name).origin.describe()
        return out

    def facts(self) -> dict[str, Any]:
        """Facts the knowledge base matches (see kb/schema.py): the files' facts, overridden by the values
        this description resolved, so a KB condition sees what the run will do, not only what a file says
        (e.g. LLaMA-Factory turns gradient checkpointing on unless `disable_gradient_checkpointing`).
        zerodoctor's own assumptions (origin "default") are not facts: they stay unknown, so they can never
        rule a known failure in or out."""
        f = self.files.facts()

        def put(key: str, k: Known[Any] | None) -> None:
            if k is not None and k.origin.kind != "default":
                f[key] = k.value

        put("hf.gradient_checkpointing", self.gradient_checkpointing)
        put("setup.gradient_checkpointing", self.gradient_checkpointing)
        if self.gradient_checkpointing.value:
            put("hf.gradient_checkpointing_kwargs.use_reentrant", self.use_reentrant)
        put("setup.method", self.method)
        put("setup.precision", self.precision)
        put("setup.micro_batch", self.micro_batch)
        put("setup.grad_accum", self.grad_accum)
        put("setup.seq_len", self.seq_len)
        put("setup.sequence_parallel", self.sequence_parallel)
        put("setup.world_size", self.cluster.world_size)
        if self.zero is not None:
            z = self.zero
            put("setup.zero_stage", z.stage)
            put("setup.offload_optimizer", z.offload_optimizer)
            put("setup.offload_param", z.offload_param)
            put("setup.pin_memory", z.pin_memory)
            put("setup.zero3_init", z.zero3_init)
        return f


# ---------------------------------------------------------------------------------------------------------
# Flags
# ---------------------------------------------------------------------------------------------------------


@dataclass
class RunFlags:
    """Command-line values (None = not given), the same for `plan`, `check`, `selftest`. Sizes in GiB."""

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
    world_size: int | None = None
    liger_kernel: bool | None = None
    cut_cross_entropy: bool | None = None


@dataclass(frozen=True)
class ClusterFile:
    """Values of a `cluster.yaml` (nodes, gpus_per_node, gpu_memory_gib, host_ram_gib) with their origins."""

    values: Mapping[str, Known[Any]]


# ---------------------------------------------------------------------------------------------------------
# Building it
# ---------------------------------------------------------------------------------------------------------


def choice(value: str, allowed: tuple[str, ...], what: str) -> str:
    low = str(value).strip().lower()
    if low in allowed:
        return low
    close = difflib.get_close_matches(low, allowed, n=3, cutoff=0.4)
    hint = f"did you mean {' or '.join(close)}?" if close else f"use one of: {', '.join(allowed)}"
    raise SetupError(f"{what} '{value}' is not known", hint=hint)


MAX_COUNT = 10**12
"""No count of a training run (ranks, batch, rank of an adapter, tokens) comes near this: a larger one is a typo."""


def positive(value: Any, what: str) -> int:
    num = as_number(value)
    if num is None or num != num or num in (float("inf"), float("-inf")) or num != int(num) or num <= 0:
        raise SetupError(f"{what} must be a whole number above 0, got {value!r}")
    if num > MAX_COUNT:
        raise SetupError(
            f"{what} is {value!r}, larger than any count a training run can use", hint="fix the typo"
        )
    return int(num)


class _Validate:
    """Checks values as they are resolved. Strict (plan, check): a wrong value is a one-line SetupError naming
    the flag or file line. Lenient (lint, whose rules report bad values as findings with their own fixes): the
    value is replaced by `fallback`, and a note says so."""

    def __init__(self, strict: bool, notes: list[str]) -> None:
        self.strict = strict
        self.notes = notes
        self.invalid: list[tuple[Origin, str]] = []

    def _fail(self, err: SetupError, k: Known[Any], fallback: Any) -> Known[Any]:
        if self.strict:
            raise err
        self.notes.append(f"{err}; assumed {fallback!r}")
        self.invalid.append((k.origin, str(err)))
        return Known(fallback, Origin("default", f"invalid value replaced by {fallback!r}", key=k.origin.key))

    def count(self, k: Known[Any], what: str, fallback: int = 1) -> Known[int]:
        """A whole number above 0; the error names the flag or the file line it came from."""
        o = k.origin
        where = o.detail if o.kind == "flag" else (f"{o.describe()}: {what}" if o.file else what)
        try:
            return Known(positive(k.value, where), o)
        except SetupError as err:
            return self._fail(err, k, fallback)

    def refuse(self, k: Known[Any], why: str, fallback: Any) -> Known[Any]:
        """A value the framework refuses, `why` saying so (with the framework's version)."""
        o = k.origin
        where = o.detail if o.kind == "flag" else (f"{o.describe()}" if o.file else (o.key or "value"))
        return self._fail(SetupError(f"{where}: {why}"), k, fallback)

    def one_of(self, k: Known[Any], allowed: tuple[str, ...], what: str, fallback: str) -> Known[str]:
        o = k.origin
        where = o.detail if o.kind == "flag" else (f"{o.describe()}: {what}" if o.file else what)
        try:
            return Known(choice(k.value, allowed, where), o)
        except SetupError as err:
            return self._fail(err, k, fallback)


def _gib_bytes(value: Any, what: str) -> int:
    num = as_number(value)
    if num is None or num != num or num in (float("inf"), float("-inf")) or num <= 0 or num > 2**40:
        raise SetupError(f"{what} must be a size in GiB above 0, got {value!r}")
    return int(num * GIB)


def lora_targets(value: Any) -> str | tuple[str, ...]:
    """PEFT / LLaMA-Factory target spelling: "all", "all-linear", "q_proj,v_proj", a list."""
    if isinstance(value, list | tuple):
        names = tuple(str(v).strip() for v in value if str(v).strip())
    else:
        text = str(value).strip()
        if text.lower() in ("all", "all-linear", "all_linear"):
            return LORA_ALL_LINEAR
        names = tuple(p.strip() for p in text.split(",") if p.strip())
    if not names:
        raise SetupError(
            "the LoRA target list is empty", hint=f"use '{LORA_ALL_LINEAR}' or q_proj,v_proj,..."
        )
    return names


def _unless(given: object, flag: str) -> str | None:
    """`flag`, to name in a note about a value the files leave unevaluated, unless the flag was given."""
    return flag if given is None else None


def _first(*candidates: Known[Any] | None) -> Known[Any] | None:
    return next((c for c in candidates if c is not None and c.value is not None), None)


class _Reader:
    """Reads the values the framework files give, each as a Known with its file position."""

    def __init__(self, setup: TrainingSetup | None, notes: list[str] | None = None) -> None:
        self.s = setup
        self.notes = notes if notes is not None else []

    def arg(self, *names: str) -> Known[Any] | None:
        """First of `names` given in the HF / LLaMA-Factory arguments file (not a default)."""
        s = self.s
        if s is None or s.args_doc is None:
            return None
        for name in names:
            if name in s.args_doc.data and s.args_doc.data[name] is not None:
                return Known(
                    s.args.get(name, s.args_doc.data[name]), Origin.of_evidence(s.arg_evidence(name))
                )
        return None

    def written(self, name: str) -> Known[Any] | None:
        """An argument as the file writes it (`arg` gives the value the Trainer gets: for an axolotl YAML its
        builder's, `bf16: auto` resolved)."""
        k = self.arg(name)
        return Known(self.s.args_doc.data[name], k.origin) if k is not None and self.s and self.s.args_doc else None

    def xt(self, *paths: tuple[str, ...] | str, flag: str | None = None) -> Known[Any] | None:
        """The first of `paths` the XTuner config sets to a plain value; when it sets one to an expression
        that stays symbolic, and `flag` (the command-line flag that gives the value instead) is named, a note
        says so."""
        s = self.s
        if s is None or s.xtuner_doc is None:
            return None
        symbolic: tuple[str, ...] | str | None = None
        for path in paths:
            value = s.xtuner_doc.get(path)
            if value is not None and isinstance(value, int | float | str | bool):
                return Known(value, Origin.of_evidence(s.xtuner_doc.evidence(path)))
            if isinstance(value, Symbol) and symbolic is None:
                symbolic = path
        if symbolic is not None and flag is not None:
            # The config is read with ast and never run: an expression it cannot evaluate (a call it does not
            # know, a division by zero) must not silently become a default.
            ev = s.xtuner_doc.evidence(symbolic, text="")
            where = f"{ev.file}:{ev.line}" if ev.line else ev.file
            note = (
                f"{where}: {ev.key} = {s.xtuner_doc.get(symbolic)} could not be evaluated (the config is read, "
                f"never run), so the default is assumed; pass {flag} to give the value"
            )
            if note not in self.notes:
                self.notes.append(note)
        return None

    def ds(self, key: str, *, concrete: bool = False) -> Known[Any] | None:
        """A DeepSpeed key: as written (with its position), or DeepSpeed's default; with `concrete`, only a
        written non-"auto" value."""
        s = self.s
        if s is None or s.ds_written is None:
            return None
        written = s.ds_written_value(key)
        if concrete and (written is None or is_auto(written)):
            return None
        filled = s.resolution.filled.get(key) if s.resolution is not None else None
        if filled is not None and is_auto(written):
            value, from_key = filled
            return Known(value, Origin("auto", f'"auto" filled from {from_key}', *_pos(s, key)))
        value = s.ds_flat().get(key)
        if value is None:
            return None
        if written is None:
            return Known(value, Origin("deepspeed", f"DeepSpeed default for {key}", key=key))
        return Known(value, Origin.of_evidence(s.ds_evidence(key)))


def _pos(s: TrainingSetup, key: str) -> tuple[str | None, int | None, int | None, str]:
    ev = s.ds_evidence(key)
    return ev.file, ev.line, ev.column, key


def describe_run(
    setup: TrainingSetup | None,
    flags: RunFlags | None = None,
    *,
    env: Environment | None = None,
    cluster_file: ClusterFile | None = None,
    strict: bool = True,
) -> RunDescription:
    """Resolve files + flags + cluster file + environment into one RunDescription.

    With `strict`, raises SetupError for values that are wrong (a method that does not exist, a zero micro
    batch); without it (lint), such a value is replaced by its default and a note says so. Values nobody
    gave stay unknown (None) or take a documented default that says so in its origin."""
    flags = flags or RunFlags()
    if setup is None:
        from zerodoctor.setup.model import build_setup

        setup = build_setup([], env=env, framework=flags.framework)
    env = env if env is not None else setup.env
    # `load_setup` callers (lint) pass the cluster flags to the setup; they are flags all the same.
    flags = replace(
        flags,
        nodes=flags.nodes if flags.nodes is not None else setup.num_nodes,
        gpus_per_node=flags.gpus_per_node if flags.gpus_per_node is not None else setup.gpus_per_node,
        samples=flags.samples if flags.samples is not None else setup.dataset_samples,
    )
    notes: list[str] = []
    rd = _Reader(setup if setup.documents else None, notes)
    cf = dict(cluster_file.values) if cluster_file is not None else {}
    env_facts = env.facts() if env is not None else {}
    check = _Validate(strict, notes)

    def fl(name: str, value: Any) -> Known[Any] | None:
        return Known(value, _flag("--" + name.replace("_", "-"))) if value is not None else None

    def envk(key: str, what: str) -> Known[Any] | None:
        value = env_facts.get(key)
        return Known(value, Origin("environment", f"--env ({what})")) if value else None

    # ---- framework -----------------------------------------------------------------------------------
    fw_name = flags.framework or setup.framework
    traits = FrameworkTraits(
        name=fw_name,
        fills_auto=(fw_name in FILLS_AUTO) if fw_name else None,
        zero_init=_zero_init_trait(setup, fw_name),
        client_optimizer=setup.client_optimizer(),
        swaps_offloaded_optimizer=accelerate_swaps_offloaded_optimizer(fw_name, setup.ds_written),
    )

    # an axolotl YAML, read as HF arguments: where a key is absent, axolotl's defaults (setup/axolotl.py)
    ax = setup.args_doc is not None and setup.args_doc.kind == "hf" and axolotl.is_axolotl(setup.args_doc.data)

    # ---- model ---------------------------------------------------------------------------------------
    model_ref = _first(fl("model", flags.model), _model_ref_from_files(setup))
    model: ModelSpec | None = None
    model_note: str | None = None
    if model_ref is not None:
        if setup.model_spec is not None and flags.model is None:
            model = setup.model_spec
        else:
            from zerodoctor.setup.load import resolve_model_quietly

            spec, model_note = resolve_model_quietly(str(model_ref.value))
            model = spec if isinstance(spec, ModelSpec) else None
        if model is None and model_note is None:
            model_note = setup.model_note

    # ---- cluster -------------------------------------------------------------------------------------
    gpn_k = _first(
        fl("gpus_per_node", flags.gpus_per_node),
        cf.get("gpus_per_node"),
        envk("env.gpu_count", "GPUs in the snapshot"),
    )
    gpn = check.count(gpn_k, "GPUs per node") if gpn_k else None
    world_k = _first(
        fl("world_size", flags.world_size),
        Known(flags.nodes * flags.gpus_per_node, _flag("--nodes x --gpus-per-node"))
        if flags.nodes and flags.gpus_per_node
        else None,
        Known(setup.world_size, _world_origin(setup)) if setup.world_size else None,
    )
    nodes_k = _first(fl("nodes", flags.nodes), cf.get("nodes"))
    if nodes_k is None and world_k is not None and gpn is not None and world_k.value % gpn.value == 0:
        nodes_k = Known(world_k.value // gpn.value, Origin("default", "world size / GPUs per node"))
    if nodes_k is None and gpn is not None:
        nodes_k = Known(1, _default("1 node (pass --nodes)"))
    nodes = check.count(nodes_k, "number of nodes") if nodes_k else None
    if world_k is None and nodes is not None and gpn is not None:
        world_k = Known(nodes.value * gpn.value, Origin("default", "nodes x GPUs per node"))
    world = check.count(world_k, "world size") if world_k else None
    gpu_mem = _first(
        fl("gpu_memory", _gib_bytes(flags.gpu_memory_gib, "--gpu-memory") if flags.gpu_memory_gib else None),
        _bytes_from_gib(cf.get("gpu_memory_gib"), "gpu_memory_gib"),
        envk("env.gpu_memory_bytes", "smallest GPU"),
    )
    host = _first(
        fl("host_ram", _gib_bytes(flags.host_ram_gib, "--host-ram") if flags.host_ram_gib else None),
        _bytes_from_gib(cf.get("host_ram_gib"), "host_ram_gib"),
        envk("env.host_ram_bytes", "host RAM"),
    )
    cluster = ClusterDescription(nodes, gpn, world, gpu_mem, host)

    # ---- recipe --------------------------------------------------------------------------------------
    refused = _llamafactory_refusals(setup, rd, env, check)
    method_k = _first(
        fl("method", flags.method),
        _axolotl_lora_4bit(rd, env, notes) if ax and setup.method == "qlora" else None,
        Known(setup.method, _method_origin(setup))
        if setup.method and "finetuning_type" not in refused
        else None,
    ) or Known("full" if "finetuning_type" not in refused else "lora", _default("full fine-tuning"))
    method = check.one_of(method_k, METHODS, "finetuning method", "full")
    oft = setup.adapter == "oft" and flags.method is None
    rank_k = _first(
        fl("lora_rank", flags.lora_rank),
        _oft_rank(setup, rd, notes) if oft else rd.arg("lora_rank", "lora_r"),
    ) or Known(DEFAULT_LORA_RANK, _default("PEFT r=8"))
    rank = check.count(rank_k, "LoRA rank")
    targets_k = _first(
        fl("lora_targets", flags.lora_targets),
        _axolotl_target_linear(rd) if ax else None,
        rd.arg("oft_target") if oft else rd.arg("lora_target", "lora_target_modules", "target_modules"),
    ) or Known(LORA_ALL_LINEAR, _default("all linear layers"))
    targets = Known(lora_targets(targets_k.value), targets_k.origin)

    quant = dict(setup.quant)
    # TRL-style load_in_4bit + torch_dtype: some TRL releases set the storage to torch_dtype (lint QL001 warns);
    # plan that case, and say so in the value's origin.
    maybe_dtype = quant.get("bnb_4bit_compute_dtype") if quant.get("quant_storage_maybe_from_dtype") else None
    quant_origin = (
        Origin.of_evidence(setup.quant_evidence) if setup.quant_evidence else Origin("file", "quantization")
    )
    storage_k = _first(
        fl("quant_storage", flags.quant_storage),
        # axolotl reads no storage key: its loader sets bf16 itself (also in setup.quant, `setup.load`)
        _ax_default(axolotl.QUANT_STORAGE) if ax and method.value == "qlora" and _axolotl_adapter(rd) == "qlora" else None,
        Known(quant.get("bnb_4bit_quant_storage"), quant_origin),
        Known(maybe_dtype, Origin("framework", "torch_dtype (as TRL's get_quantization_config sets it)")),
    ) or Known("uint8", _default("bitsandbytes: uint8"))
    storage = check.one_of(
        Known(_storage_dtype(storage_k.value), storage_k.origin), QUANT_STORAGES, "quant storage", "uint8"
    )
    by_framework = bool(quant.get("quant_storage_set_by_framework")) and flags.quant_storage is None

    precision_k = _first(
        fl("precision", flags.precision), _axolotl_precision(rd, env, notes) if ax else None, _precision(setup, rd)
    ) or Known("bf16", _default("bf16"))
    precision = check.one_of(precision_k, PRECISIONS, "precision", "bf16")
    optimizer_k = _first(
        fl("optimizer", flags.optimizer), _optimizer(rd), _axolotl_optimizer(rd) if ax else None
    ) or Known(
        "adamw", _default("AdamW")
    )
    optimizer = check.one_of(optimizer_k, OPTIMIZERS, "optimizer", "adamw")

    micro_k = _first(
        fl("micro_batch", flags.micro_batch),
        rd.xt(("train_dataloader", "batch_size"), "batch_size", flag=_unless(flags.micro_batch, "--micro-batch")),
        rd.arg("per_device_train_batch_size", "micro_batch_size"),  # HF / LLaMA-Factory, axolotl
        rd.ds("train_micro_batch_size_per_gpu", concrete=True),
    ) or (_ax_default(axolotl.MICRO_BATCH) if ax else _micro_default(setup))
    micro = check.count(micro_k, "micro batch")
    accum_k = _first(
        fl("grad_accum", flags.grad_accum),
        rd.xt(
            ("optim_wrapper", "accumulative_counts"),
            "accumulative_counts",
            flag=_unless(flags.grad_accum, "--grad-accum"),
        ),
        rd.arg("gradient_accumulation_steps"),
        rd.ds("gradient_accumulation_steps", concrete=True),
    ) or Known(1, _default("1 (HF and DeepSpeed default)"))
    accum = check.count(accum_k, "gradient accumulation steps")
    seq_k = _first(
        fl("seq_len", flags.seq_len),
        rd.xt("max_length", flag=_unless(flags.seq_len, "--seq-len")),
        rd.arg("cutoff_len", "max_length", "max_seq_length", "model_max_length", "sequence_len"),
        _ax_default(axolotl.SEQUENCE_LEN) if ax else None,
    ) or Known(
        DEFAULT_SEQ_LEN,
        _default(f"{DEFAULT_SEQ_LEN}: not given (pass --seq-len; LLaMA-Factory's cutoff_len default)"),
    )
    seq = check.count(seq_k, "sequence length")
    gc_k = _first(
        fl("gradient_checkpointing", flags.gradient_checkpointing),
        _axolotl_checkpointing(rd, notes) if ax else _gradient_checkpointing(setup, rd),
    )
    gc = (
        Known(bool(truthy(gc_k.value)), gc_k.origin)
        if gc_k
        else Known(True, _default("on (pass --no-gradient-checkpointing)"))
    )
    reentrant = setup.use_reentrant()
    use_reentrant = (
        Known(reentrant, _reentrant_origin(setup, rd)) if reentrant is not None and gc.value else None
    )
    attn_k = _first(
        fl("attn", flags.attn), _attn(setup, rd), _ax_default(axolotl.ATTENTION) if ax else None
    ) or Known("sdpa", _default("transformers: sdpa"))
    attn = check.one_of(attn_k, ATTN_IMPLS, "attention implementation", "sdpa")
    sp_k = _first(
        fl("sequence_parallel", flags.sequence_parallel),
        rd.xt("sequence_parallel_size", flag=_unless(flags.sequence_parallel, "--sequence-parallel")),
        rd.arg("sequence_parallel_size"),
    ) or Known(1, _default("no sequence parallelism"))
    sp = check.count(sp_k, "sequence parallel size")
    if world is not None and world.value % sp.value:
        sp = check._fail(
            SetupError(
                f"world size {world.value} ({world.origin.describe()}) is not divisible by sequence parallel "
                f"size {sp.value} ({sp.origin.describe()})",
                hint="choose a sequence parallel size that divides the number of GPUs",
            ),
            sp,
            1,
        )
    if seq.value % sp.value:
        notes.append(
            f"sequence length {seq.value} is not a multiple of sequence parallel {sp.value}; rounded up per rank"
        )
    samples_v = flags.samples
    samples = check.count(Known(samples_v, _flag("--samples")), "samples") if samples_v is not None else None
    epochs_k = _first(rd.arg("num_train_epochs"), rd.xt("max_epochs"))
    epochs = None
    if epochs_k is not None and as_number(epochs_k.value) is not None:
        epochs = Known(float(as_number(epochs_k.value) or 0), epochs_k.origin)
    steps_k = _first(rd.arg("max_steps"), rd.xt("max_iters"))
    max_steps = None
    if steps_k is not None and as_number(steps_k.value) is not None and (as_number(steps_k.value) or 0) > 0:
        max_steps = Known(int(as_number(steps_k.value) or 0), steps_k.origin)
    save_only_k = _first(fl("save_only_model", flags.save_only_model), rd.arg("save_only_model")) or Known(
        False, Origin("framework", "HF save_only_model default false")
    )
    save_only = Known(bool(truthy(save_only_k.value)), save_only_k.origin)

    # ---- what else trains, and preference training ------------------------------------------------------
    # axolotl: `lora_modules_to_save` (loaders/adapter.py _build_peft_lora_config: modules_to_save=cfg.lora_modules_to_save)
    mods_k = rd.arg("modules_to_save", "additional_target", "lora_modules_to_save")
    no_modules: tuple[str, ...] = ()
    modules = Known(_names(mods_k.value), mods_k.origin) if mods_k else Known(no_modules, _default("none"))
    layers_k = rd.arg("freeze_trainable_layers") or Known(2, Origin("framework", "LLaMA-Factory default 2"))
    layers = check.count(
        Known(abs(as_number(layers_k.value) or 2), layers_k.origin), "freeze_trainable_layers", 2
    )
    reference, paired = (_axolotl_preference(rd, method.value, notes) if ax else None) or _preference(
        rd, method.value
    )
    qm_k = rd.arg("quantization_method")
    quant_method = (
        check.one_of(qm_k, ("bnb", "bitsandbytes", "gptq", "awq"), "quantization_method", "bnb")
        if qm_k
        else Known("bnb", _default("bitsandbytes"))
    )
    if quant_method.value == "bitsandbytes":
        quant_method = Known("bnb", quant_method.origin)
    alloc_conf = (env.env_vars.get("PYTORCH_CUDA_ALLOC_CONF", "") if env is not None else "").replace(" ", "")
    expandable = (
        Known(True, Origin("environment", "--env (PYTORCH_CUDA_ALLOC_CONF)"))
        if "expandable_segments:True" in alloc_conf
        else Known(False, _default("PYTORCH_CUDA_ALLOC_CONF without expandable_segments"))
    )

    liger_loss = rd.arg("use_liger_loss")
    if liger_loss is not None and truthy(liger_loss.value):
        notes.append(
            f"use_liger_loss ({liger_loss.origin.describe()}): TRL's chunked Liger preference loss is not modelled; "
            "the logits and log-probabilities are planned instead (their upper bound)"
        )

    cce = fl("cut_cross_entropy", flags.cut_cross_entropy)
    if flags.cut_cross_entropy is None:
        cce = _cut_cross_entropy(rd, traits.name, env, notes)

    # ---- ZeRO ----------------------------------------------------------------------------------------
    zero = _zero(setup, rd, model, traits, flags, notes, check)
    _note_offloaded_client_optimizer(optimizer, zero, traits, notes)
    if ax and zero is not None:
        precision = _axolotl_zero3_half(precision, zero, rd, setup, notes)
    if traits.name is None and setup.ds_written is not None:
        notes.append("launcher unknown: assuming HF Trainer where it matters (pass --framework to change it)")
    fsdp, fsdp_origin = _fsdp(setup, rd) if zero is None else (None, None)
    if zero is not None:
        strategy = Known("deepspeed", zero.stage.origin)
    elif fsdp is not None and fsdp_origin is not None:
        strategy = Known("fsdp", fsdp_origin)
    else:
        strategy = Known("ddp", _default("no DeepSpeed config and no FSDP: every rank holds the whole model"))

    return RunDescription(
        files=setup,
        env=env,
        framework=traits,
        model_ref=Known(str(model_ref.value), model_ref.origin) if model_ref else None,
        model=model,
        model_note=model_note,
        method=method,
        lora_rank=rank,
        lora_targets=targets,
        quant_storage=storage,
        quant_storage_by_framework=by_framework,
        precision=precision,
        optimizer=optimizer,
        micro_batch=micro,
        grad_accum=accum,
        seq_len=seq,
        gradient_checkpointing=gc,
        use_reentrant=use_reentrant,
        attn=attn,
        sequence_parallel=sp,
        samples=samples,
        epochs=epochs,
        max_steps=max_steps,
        save_only_model=save_only,
        trainable_modules=modules,
        freeze_trainable_layers=layers,
        reference_model=reference,
        paired_inputs=paired,
        quant_method=quant_method,
        expandable_segments=expandable,
        zero=zero,
        cluster=cluster,
        lower_bound=_axolotl_online_rl(rd) if ax else None,
        notes=tuple(notes),
        invalid=tuple(check.invalid),
        strategy=strategy,
        fsdp=fsdp,
        weights_dtype=_weights_dtype(rd),
        pure_bf16=rd.arg("pure_bf16"),
        upcast_layernorm=rd.arg("upcast_layernorm"),
        lora_dropout=_lora_dropout(rd) or (_ax_default(axolotl.LORA_DROPOUT) if ax else None),
        kbit_preparation=_ax_default(axolotl.KBIT_PREPARATION) if ax and method.value == "qlora" else None,
        eval_micro_batch=_axolotl_eval_micro_batch(rd, micro) if ax else _eval_micro_batch(rd, traits.name),
        eval_keeps_logits=_eval_keeps_logits(rd),
        liger_kernel=_first(fl("liger_kernel", flags.liger_kernel), _liger_kernel(rd)),
        cut_cross_entropy=cce,
        liger_kernel_config=_liger_kernel_config(rd),
    )


def _ax_default(d: axolotl.AxolotlDefault) -> Known[Any]:
    """An axolotl default (`setup.axolotl`) as a value with its source."""
    return Known(d.value, Origin("framework", d.source))


def _axolotl_precision(rd: _Reader, env: Environment | None, notes: list[str]) -> Known[str] | None:
    """An axolotl YAML's precision where its `bf16` decides it (`setup.axolotl.PRECISION`): "auto" is bf16 (on a GPU
    with bf16) unless `fp16` is true, and so is an unwritten bf16 from v0.5.0 (`setup.axolotl.DEFAULTS_SINCE`; fp32
    before, and where the version is not known: the larger plan, with a note); `bf16: false` trains in fp16 with
    `float16` / `load_in_8bit`, else fp32 (resolve_dtype's `torch_dtype`). None: `_precision` reads a true `bf16` /
    `fp16`."""
    bf16, fp16 = rd.written("bf16"), rd.written("fp16")
    if fp16 is not None and truthy(fp16.value):
        return None
    if bf16 is None:
        # resolve_dtype: `bf16 or bfloat16` -> bf16 weights, else `load_in_8bit or fp16 or float16` -> fp16, in
        # every release: these keys decide before the version does (review R10, 4)
        bfloat16 = rd.arg("bfloat16")
        if bfloat16 is not None and truthy(bfloat16.value):
            why = "bfloat16 with bf16 unwritten: axolotl loads bf16 weights (utils/config resolve_dtype)"
            return Known("bf16", replace(bfloat16.origin, detail=why))
        installed = env.version_of("axolotl") if env is not None else None
        version = parse_version(installed)
        since = axolotl.DEFAULTS_SINCE
        if version is not None and version >= Version(since):
            return _ax_default(axolotl.PRECISION)
        ds_bf16 = rd.ds("bf16.enabled", concrete=True)
        if ds_bf16 is not None and ds_bf16.value is True:
            # before v0.5.0 the Trainer's bf16 False against it stops the run (HF001), after it is bf16: never fp32
            why = "bf16 unwritten, the DeepSpeed config enables bf16: axolotl trains bf16 (or stops, HF001)"
            return Known("bf16", replace(ds_bf16.origin, detail=why))
        half = _axolotl_half(rd, "bf16 unwritten")
        if half is not None:
            return half
        why = f"bf16 unwritten: before axolotl {since} (#1415) it stays None, fp32 (utils/config resolve_dtype)"
        if version is None:
            notes.append(
                f"bf16 is not written: axolotl >= {since} takes `bf16: auto` (bf16) and earlier releases train fp32; "
                "the version is not known here, so fp32 is planned (the larger); write `bf16: auto` or pass --env "
                "from the training environment"
            )
        return Known("fp32", Origin("framework", why if version is None else f"axolotl {installed}: {why}"))
    if str(bf16.value).strip().lower() == "auto":
        return Known("bf16", replace(bf16.origin, detail=f"bf16: auto ({axolotl.PRECISION.source})"))
    if truthy(bf16.value) is False and rd.arg("bfloat16") is None:
        half = _axolotl_half(rd, "bf16 false")
        if half is not None:
            return half
        why = "bf16 false and no fp16: axolotl trains fp32 (utils/config resolve_dtype)"
        return Known("fp32", replace(bf16.origin, detail=why))
    return None


def _axolotl_half(rd: _Reader, bf16_state: str) -> Known[str] | None:
    """fp16 where an axolotl YAML's `float16` or `load_in_8bit` is true and bf16 does not decide (resolve_dtype)."""
    half = next((k for k in (rd.arg("float16"), rd.arg("load_in_8bit")) if k is not None and truthy(k.value)), None)
    if half is None:
        return None
    why = f"{half.origin.key} with {bf16_state}: axolotl loads fp16 weights (utils/config resolve_dtype)"
    return Known("fp16", replace(half.origin, detail=why))


def _axolotl_zero3_half(
    precision: Known[str], zero: ZeroDescription, rd: _Reader, s: TrainingSetup, notes: list[str]
) -> Known[str]:
    """fp16 weights from `float16` / `load_in_8bit` (`_axolotl_half`) under ZeRO-3's zero.Init: axolotl passes
    TrainingArguments bf16 and fp16 false, so a DeepSpeed config that does not enable fp16 or bf16 itself leaves both
    disabled and zero.Init casts the parameters to fp32 (deepspeed/runtime/zero/partition_parameters.py `_set_dtype`):
    the larger fp32 plan, with a note (review R10, 7)."""
    fp16 = rd.written("fp16")
    if precision.value != "fp16" or (fp16 is not None and truthy(fp16.value)):
        return precision
    if zero.stage.value != 3 or not zero.zero3_init.value:
        return precision
    ds = s.ds_written or {}
    if any(isinstance(ds.get(k), dict) and ds[k].get("enabled") is True for k in ("fp16", "bf16")):
        return precision
    why = (
        f"{precision.origin.describe()} loads fp16 weights, but axolotl hands TrainingArguments bf16 / fp16 false, "
        "so the DeepSpeed config enables neither and zero.Init makes the ZeRO-3 parameters fp32 "
        "(partition_parameters.py _set_dtype)"
    )
    notes.append(f"{why}: fp32 is planned (the larger); write `fp16: true` to train in fp16")
    return Known("fp32", Origin("framework", why))


def _axolotl_adapter(rd: _Reader) -> str | None:
    """axolotl's `adapter` key, lower case (lora / qlora); None where unwritten."""
    k = rd.arg("adapter")
    return str(k.value).strip().lower() if k is not None and k.value else None


def _axolotl_lora_4bit(rd: _Reader, env: Environment | None, notes: list[str]) -> Known[str] | None:
    """`adapter: lora` + `load_in_4bit: true`: axolotl quantizes only for `adapter: qlora` from v0.13.0
    (`setup.axolotl.LORA_4BIT_UNQUANTIZED`), so the weights load in the torch dtype: planned as LoRA there and where
    the version is not known (the larger plan, with a note); before, the legacy `load_in_4bit` kwarg quantized with
    uint8 storage (None: the 4-bit setup stands). None also for any other adapter."""
    if _axolotl_adapter(rd) != "lora":
        return None
    k = rd.arg("load_in_4bit")
    origin = k.origin if k is not None else Origin("file", "load_in_4bit")
    installed = env.version_of("axolotl") if env is not None else None
    version = parse_version(installed)
    since = axolotl.LORA_4BIT_UNQUANTIZED.value
    unknown = "the version is not known here"
    if version is not None and version.is_prerelease and version.base_version == since:
        # main carried "0.13.0.dev" before #3205 landed (review R10, 6): a dev build may quantize or not
        version, unknown = None, f"axolotl {installed} is a pre-release of {since}, with or without #3205"
    if version is not None and version < Version(since):
        return None
    if version is None:
        notes.append(
            f"adapter: lora with load_in_4bit ({origin.describe()}): axolotl >= {since} loads the weights unquantized "
            f"(only `adapter: qlora` quantizes) and earlier releases load them 4-bit; {unknown}, so "
            f"the {since} behaviour is planned (16-bit weights, the larger); write `adapter: qlora` for 4-bit weights "
            "or pass --env from the training environment"
        )
    why = f"adapter: lora + load_in_4bit ({axolotl.LORA_4BIT_UNQUANTIZED.source})"
    if version is not None:
        why = f"axolotl {installed}: {why}"
    return Known("lora", replace(origin, detail=why))


def _axolotl_optimizer(rd: _Reader) -> Known[str] | None:
    """axolotl's `optimizer` key (an HF `optim` name such as adamw_bnb_8bit or paged_adamw_32bit, which
    core/builders/base.py passes on as `optim`; its default adamw_torch_fused is the planner's AdamW)."""
    k = rd.arg("optimizer")
    name = optimizer_kind(k.value) if k is not None and isinstance(k.value, str) else None
    return Known(name, k.origin) if k is not None and name else None


def _axolotl_checkpointing(rd: _Reader, notes: list[str]) -> Known[Any]:
    """axolotl's `gradient_checkpointing`: true / false, "offload" or "offload_disk" (checkpointing whose saved layer
    inputs go to host memory or disk, utils/schemas/config.py; "unsloth" in 2024 releases), else its default false."""
    k = rd.arg("gradient_checkpointing")
    if k is None:
        return _ax_default(axolotl.GRADIENT_CHECKPOINTING)
    if isinstance(k.value, str) and k.value.strip().lower() in ("offload", "offload_disk", "unsloth"):
        notes.append(
            f"gradient_checkpointing: {k.value} ({k.origin.describe()}): the checkpointed layer inputs axolotl moves "
            "off the GPU are not modelled; planned as plain gradient checkpointing (an upper bound)"
        )
        return Known(True, k.origin)
    return k


def _axolotl_target_linear(rd: _Reader) -> Known[Any] | None:
    """axolotl's `lora_target_linear: true`: every linear layer but the head, whatever `lora_target_modules` adds
    (`setup.axolotl.LORA_TARGET_LINEAR`); None where it is not true."""
    k = rd.arg("lora_target_linear")
    if k is None or not truthy(k.value):
        return None
    return Known(LORA_ALL_LINEAR, replace(k.origin, detail=f"lora_target_linear ({axolotl.LORA_TARGET_LINEAR})"))


def _axolotl_eval_micro_batch(rd: _Reader, micro: Known[int]) -> Known[int] | None:
    """An axolotl run's evaluation batch when it evaluates (`setup.axolotl.EVALUATES`): `eval_batch_size`, else the
    micro batch (`setup.axolotl.EVAL_BATCH`). None: no eval set, no schedule (HF's eval_strategy "no"), or
    `eval_strategy: no`."""
    val = rd.arg("val_set_size")
    has_set = (val is not None and (as_number(val.value) or 0) > 0) or rd.arg("test_datasets") is not None
    strategy = rd.arg("eval_strategy")
    scheduled = rd.arg("eval_steps", "evals_per_epoch") is not None or strategy is not None
    if not has_set or not scheduled or (strategy is not None and str(strategy.value).lower() == "no"):
        return None
    size = rd.arg("eval_batch_size")
    if size is not None and (as_number(size.value) or 0) >= 1:
        return Known(int(as_number(size.value) or 1), size.origin)
    return Known(micro.value, Origin("framework", f"{axolotl.EVAL_BATCH}; {axolotl.EVALUATES}"))


EVAL_STRATEGIES = ("steps", "epoch")
"""transformers IntervalStrategy values that evaluate during training ("no" does not)."""


def _eval_micro_batch(rd: _Reader, framework: str | None) -> Known[int] | None:
    """The evaluation's batch per GPU when the run evaluates, with where that came from (see
    `RunDescription.eval_micro_batch`). transformers trainer.py: `evaluate()` runs at `eval_strategy` steps|epoch
    (the 4.x name `evaluation_strategy` too); LLaMA-Factory's workflow evaluates after training with `do_eval` and
    builds an eval set only from `val_size` > 0 or `eval_dataset`."""
    strategy = rd.arg("eval_strategy", "evaluation_strategy")
    do_eval = rd.arg("do_eval")
    when = None
    if (
        strategy is not None
        and str(getattr(strategy.value, "value", strategy.value)).lower() in EVAL_STRATEGIES
    ):
        when = strategy
    elif do_eval is not None and truthy(do_eval.value):
        when = do_eval
    if when is None:
        return None
    if framework == "llamafactory":
        val = rd.arg("val_size")
        has_split = val is not None and (as_number(val.value) or 0) > 0
        if not has_split and rd.arg("eval_dataset") is None:
            return None  # no eval set: LLaMA-Factory's loader gives the Trainer none
    size = rd.arg("per_device_eval_batch_size")
    if (
        size is not None
        and isinstance(as_number(size.value), (int, float))
        and (as_number(size.value) or 0) >= 1
    ):
        return Known(int(as_number(size.value) or 1), size.origin)
    return Known(
        8,
        _default(f"transformers' per_device_eval_batch_size default 8 ({when.origin.describe()} evaluates)"),
    )


def _eval_keeps_logits(rd: _Reader) -> Known[bool] | None:
    """Whether the evaluation keeps logits: only when the arguments say so (`prediction_loss_only: false`, or
    LLaMA-Factory `compute_accuracy: true`); None = not stated (Trainer.evaluate: loss only without compute_metrics)."""
    loss_only = rd.arg("prediction_loss_only")
    if loss_only is not None and not truthy(loss_only.value):
        return Known(True, loss_only.origin)
    acc = rd.arg("compute_accuracy")
    if acc is not None and truthy(acc.value):
        return Known(True, acc.origin)
    return None


def _liger_kernel(rd: _Reader) -> Known[bool] | None:
    """Liger Kernel from the arguments: `use_liger_kernel` (transformers TrainingArguments >= 4.45, which TRL's
    configs and ms-swift's arguments extend), `enable_liger_kernel` (LLaMA-Factory ModelArguments) or `use_liger`
    (TRL SFTConfig before 0.16, deprecated by huggingface/trl#2949); a value that is not a boolean is left unknown.
    TRL's `use_liger_loss` (DPO/ORPO/GKD configs) swaps only the preference loss, which the planner does not model:
    it is not read, and the run's logits stay planned (their upper bound)."""
    k = rd.arg("use_liger_kernel", "enable_liger_kernel", "use_liger")
    on = truthy(k.value) if k is not None else None
    return Known(on, k.origin) if k is not None and on is not None else None


CCE_PLUGIN = "CutCrossEntropyPlugin"
"""The class name of axolotl's plugin (`axolotl.integrations.cut_cross_entropy.CutCrossEntropyPlugin`)."""


CCE_DEFAULT_ON_SINCE = "0.9.0"
"""The axolotl release whose plugin args make `cut_cross_entropy` default true (#2562; `Optional[bool] = None`, off,
in v0.6.0-v0.8.x: read at the tags)."""


def _cut_cross_entropy(
    rd: _Reader, framework: str | None, env: Environment | None, notes: list[str]
) -> Known[bool] | None:
    """Cut Cross-Entropy from the arguments file. zerodoctor does not model axolotl as a framework: its YAML is read
    as a generic arguments file, and only these keys are taken from it (with LigerPlugin's
    `liger_fused_linear_cross_entropy`: `_axolotl_liger_after_cce`). Axolotl applies CCE only through its
    plugin (integrations/cut_cross_entropy `pre_model_load`), when `cut_cross_entropy` is true -- the plugin's
    default since v0.9.0 (#2562), off before. So: a `plugins` list without the plugin is off whatever
    `cut_cross_entropy` says; with it, as written, or unwritten: on where `--env` shows axolotl >= 0.9.0, else off
    (an older or unknown release: the larger case, as `phases.liger_plan` plans an unknown version) with a note;
    without a `plugins` key, `cut_cross_entropy` as written (a value that is not a boolean is left unknown).
    LLaMA-Factory has no such argument (its parser refuses it: lint HF004): nothing is read there."""
    if framework == "llamafactory":
        return None
    key = rd.arg("cut_cross_entropy")
    stated = truthy(key.value) if key is not None else None
    plugins = rd.arg("plugins")
    if plugins is None:
        return Known(stated, key.origin) if key is not None and stated is not None else None
    names = [plugins.value] if isinstance(plugins.value, str) else plugins.value
    listed = isinstance(names, list) and any(str(n).rsplit(".", 1)[-1] == CCE_PLUGIN for n in names)
    if not listed:
        return Known(False, plugins.origin)
    liger = _axolotl_liger_after_cce(rd, names)
    if liger is not None:
        notes.append(
            f"{plugins.origin.describe()}: axolotl's LigerPlugin is listed after {CCE_PLUGIN} with "
            f"liger_fused_linear_cross_entropy ({liger.origin.describe()}): both patch the model's forward in "
            "pre_model_load and the last one listed wins, so Liger's fused loss runs, not Cut Cross-Entropy; "
            "planned without it (the logits, the upper bound of Liger's chunked loss)"
        )
        return Known(False, liger.origin)
    if stated is not None and key is not None:
        return Known(stated, key.origin)
    installed = env.version_of("axolotl") if env is not None else None
    version = parse_version(installed)
    on = version is not None and version >= Version(CCE_DEFAULT_ON_SINCE)
    if version is None:
        notes.append(
            f"{plugins.origin.describe()}: {CCE_PLUGIN} is listed and cut_cross_entropy is not written: axolotl "
            f"turns it on by default from v{CCE_DEFAULT_ON_SINCE} only, and its version is not known here, so it "
            "is planned off (the larger case); write `cut_cross_entropy: true`, pass --env from an environment with "
            f"axolotl >= {CCE_DEFAULT_ON_SINCE} or --cut-cross-entropy to plan it on"
        )
    why = f"axolotl {installed}: cut_cross_entropy default {'on' if on else 'off'} (on from v{CCE_DEFAULT_ON_SINCE})"
    return Known(on, replace(plugins.origin, detail=why) if version is not None else plugins.origin)


LIGER_PLUGIN = "LigerPlugin"
"""axolotl's `axolotl.integrations.liger.LigerPlugin` (its `liger_fused_linear_cross_entropy` key)."""


def _axolotl_liger_after_cce(rd: _Reader, names: list[Any]) -> Known[Any] | None:
    """axolotl's `liger_fused_linear_cross_entropy` when its LigerPlugin is listed after CutCrossEntropyPlugin:
    both rebind `<Model>ForCausalLM.forward` in `pre_model_load`, in the order of `plugins`, so the later one's loss
    runs (axolotl refuses the pair only from v0.13.1 and only with `cut_cross_entropy` written, #3330)."""
    short = [str(n).rsplit(".", 1)[-1] for n in names]
    flce = rd.arg("liger_fused_linear_cross_entropy")
    if LIGER_PLUGIN not in short or flce is None or not truthy(flce.value):
        return None
    last = {n: i for i, n in enumerate(short)}
    return flce if last[LIGER_PLUGIN] > last.get(CCE_PLUGIN, len(short)) else None


def _liger_kernel_config(rd: _Reader) -> Known[tuple[tuple[str, bool], ...]] | None:
    """`liger_kernel_config` (a mapping, or its JSON text on a command line): each kernel it switches on or off (a
    value that is not a boolean is left out)."""
    k = rd.arg("liger_kernel_config")
    if k is None:
        return None
    value = k.value
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    if not isinstance(value, Mapping):
        return None
    switches = tuple((str(key), bool(on)) for key, on in value.items() if isinstance(on, bool))
    return Known(switches, k.origin) if switches else None


_WEIGHTS_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "auto": "auto"}


def _lora_dropout(rd: _Reader) -> Known[float] | None:
    """`lora_dropout` from the arguments, when it is a probability (a value that is not is left to PEFT to reject)."""
    k = rd.arg("lora_dropout")
    if k is None or isinstance(k.value, bool):
        return None
    try:
        value = float(k.value)
    except (TypeError, ValueError):
        return None
    return Known(value, k.origin) if 0.0 <= value < 1.0 else None


def _weights_dtype(rd: _Reader) -> Known[str] | None:
    """`torch_dtype` / `dtype` from the arguments (ms-swift, TRL ModelConfig, the HF example scripts)."""
    k = rd.arg("torch_dtype", "dtype")
    if k is None:
        return None
    name = _WEIGHTS_DTYPES.get(normalize_dtype(k.value) or "")
    return Known(name, k.origin) if name else None


# ---- pieces ---------------------------------------------------------------------------------------------


def _bytes_from_gib(k: Known[Any] | None, what: str) -> Known[int] | None:
    return Known(_gib_bytes(k.value, what), k.origin) if k is not None else None


def _world_origin(s: TrainingSetup) -> Origin:
    src = s.world_size_source or "files"
    if s.accelerate_doc is not None and "num_processes" in src:
        return Origin.of_evidence(s.accelerate_doc.evidence(("num_processes",)))
    return Origin("flag", src) if src.startswith("--") else Origin("file", src)


def _model_ref_from_files(s: TrainingSetup) -> Known[Any] | None:
    if not s.model_ref:
        return None
    key = next((k for k in MODEL_REF_KEYS if s.args_doc is not None and s.args_doc.has(k)), None)
    if s.args_doc is not None and key is not None:
        return Known(s.model_ref, Origin.of_evidence(s.args_doc.evidence((key,))))
    if s.xtuner_doc is not None and s.xtuner_doc.has("pretrained_model_name_or_path"):
        return Known(
            s.model_ref, Origin.of_evidence(s.xtuner_doc.evidence(("pretrained_model_name_or_path",)))
        )
    return Known(s.model_ref, Origin("file", "model"))


def _method_origin(s: TrainingSetup) -> Origin:
    if s.quant_evidence is not None:
        return Origin.of_evidence(s.quant_evidence)
    if s.args_doc is not None:
        for key in ("finetuning_type", "use_peft_lora", "use_peft", "lora_r", "lora_target_modules"):
            if s.args_doc.has(key):
                return Origin.of_evidence(s.args_doc.evidence((key,)))
        if s.args_doc.kind == "llamafactory":
            return Origin.of_evidence(
                s.args_doc.file_evidence(), "framework", "LLaMA-Factory finetuning_type default lora"
            )
    if s.xtuner_doc is not None and s.xtuner_doc.has(("model", "lora")):
        return Origin.of_evidence(s.xtuner_doc.evidence(("model", "lora")))
    return Origin("framework", "no adapter or quantization configured: full fine-tuning")


def _names(value: Any) -> tuple[str, ...]:
    """`embed_tokens,lm_head` or a list -> ("embed_tokens", "lm_head")."""
    items = value if isinstance(value, list | tuple) else str(value).split(",")
    return tuple(str(x).strip() for x in items if str(x).strip())


PREFERENCE_STAGES = ("dpo", "kto", "orpo")
"""LLaMA-Factory stages that train on preferences; `orpo` is a stage of its own in v0.6.2-v0.7.1 (its
CustomORPOTrainer has no reference model and concatenates chosen and rejected: orpo/trainer.py
concatenated_forward at v0.7.1), `stage: dpo` + `pref_loss: orpo` from v0.8.0."""
REFERENCE_FREE_LOSSES = ("orpo", "simpo")
OFT_DEFAULT_BLOCK = 32
"""LLaMA-Factory OFTArguments.oft_block_size default (oft_rank default 0: the block size decides)."""


def _llamafactory_refusals(
    setup: TrainingSetup, rd: _Reader, env: Environment | None, check: _Validate
) -> set[str]:
    """The LLaMA-Factory fields whose value the run's release refuses (HfArgumentParser stops before training):
    each reported with the release and what it accepts (zerodoctor.setup.llamafactory_values)."""
    from zerodoctor.setup.llamafactory_values import FIELDS, refusal

    if setup.args_doc is None or setup.args_doc.kind != "llamafactory":
        return set()
    version = None
    if env is not None:
        version = env.version_of("llamafactory") or env.version_of("llmtuner") or None
    out = set()
    for name in FIELDS:
        k = rd.arg(name)
        why = refusal(name, k.value, version) if k is not None else None
        if k is not None and why is not None:
            check.refuse(k, why, {"finetuning_type": "lora", "stage": "sft"}.get(name, "sigmoid"))
            out.add(name)
    return out


def _oft_rank(setup: TrainingSetup, rd: _Reader, notes: list[str]) -> Known[int]:
    """LLaMA-Factory's OFT planned as LoRA's adapter-only trainable set: the LoRA rank with as many parameters.

    PEFT's OFT (peft 0.21.2 tuners/oft/layer.py `update_layer`, the `OFTConfig` LLaMA-Factory builds in
    model/adapter.py from oft_rank and oft_block_size) gives each targeted linear layer in_features / b blocks of
    b(b-1)/2 parameters (a skew-symmetric b x b block each): in_features x (b-1)/2, where LoRA of rank r has
    r x (in + out). On a square layer the two match at r = (b-1)/4 (7.75 for LLaMA-Factory's default b = 32);
    on a wider layer (down_proj) OFT has more, on a narrower one fewer. The adapter is a small fraction of the
    model either way; what OFT's rotation of the input costs in activations is not modelled."""
    block_k = rd.arg("oft_block_size")
    rank_k = rd.arg("oft_rank")
    block = as_number(block_k.value) if block_k is not None else OFT_DEFAULT_BLOCK
    oft_rank = as_number(rank_k.value) if rank_k is not None else 0
    hidden = setup.hidden_size
    if oft_rank and not block and hidden:
        block = hidden / oft_rank  # PEFT: oft_block_size = in_features // r when r is given instead
    b = float(block or OFT_DEFAULT_BLOCK)
    rank = max(1, round((b - 1) / 4))
    given = block_k or rank_k
    origin = given.origin if given is not None else None
    notes.append(
        f"finetuning_type oft: planned as LoRA's adapter-only trainable set on the same targets at rank {rank}, the "
        f"rank whose r x (in + out) equals OFT's in_features x (b-1)/2 (block size b = {b:g}) on a square layer "
        "(peft tuners/oft/layer.py update_layer); approximate on non-square layers, and OFT's rotation "
        "activations are not modelled"
    )
    return Known(
        rank,
        origin
        or Origin(
            "framework", f"LLaMA-Factory OFT, oft_block_size default {OFT_DEFAULT_BLOCK}: LoRA rank {rank}"
        ),
    )


def _preference(rd: _Reader, method: str) -> tuple[Known[bool], Known[bool]]:
    """(reference model, paired inputs) of preference training. LLaMA-Factory `stage: dpo|kto` builds a frozen
    reference for full and freeze tuning (LoRA uses the base with adapters off); ORPO/SimPO need none
    (`pref_loss`); DPO concatenates chosen and rejected in one forward, KTO does not (TRL trainers)."""
    stage = rd.arg("stage")
    if stage is None or str(stage.value).lower() not in PREFERENCE_STAGES:
        none = Known(False, Origin("framework", "not preference training"))
        return none, none
    kind = str(stage.value).lower()
    if kind == "orpo":  # LLaMA-Factory v0.6.2-v0.7.1: no reference model, chosen and rejected in one forward
        return Known(False, stage.origin), Known(True, stage.origin)
    loss = rd.arg("pref_loss")
    # pref_loss is DPO's: the KTO workflow builds its reference whatever pref_loss says (train/kto/workflow.py)
    reference_free = kind == "dpo" and loss is not None and str(loss.value).lower() in REFERENCE_FREE_LOSSES
    ref_k = rd.arg("ref_model")
    if ref_k is not None:
        reference = Known(True, ref_k.origin)
    elif reference_free:
        reference = Known(False, loss.origin if loss else stage.origin)
    else:
        reference = Known(method in ("full", "freeze"), stage.origin)
    return reference, Known(kind == "dpo", stage.origin)


AXOLOTL_PAIRED_RL = ("dpo", "ipo", "simpo", "orpo")
"""axolotl `rl:` values whose TRL trainer (DPOTrainer with loss ipo, CPOTrainer for simpo, ORPOTrainer) concatenates
chosen and rejected in one forward; `kto` (KTOTrainer) does not."""


def _axolotl_online_rl(rd: _Reader) -> str | None:
    """Why an axolotl YAML's `rl:` (grpo, gdpo, ebft...) makes the plan a lower bound; None for offline preference
    training (`AXOLOTL_PAIRED_RL`, kto) and supervised runs (review R10, 8)."""
    rl = rd.arg("rl")
    if rl is None or not rl.value or str(rl.value).strip().lower() in (*AXOLOTL_PAIRED_RL, "kto"):
        return None
    return (
        f"rl: {rl.value} ({rl.origin.describe()}): online RL (generation, a reference and reward models) is not "
        "modelled"
    )


def _axolotl_preference(
    rd: _Reader, method: str, notes: list[str]
) -> tuple[Known[bool], Known[bool]] | None:
    """(reference model, paired inputs) of an axolotl YAML's `rl:` (utils/schemas/enums.py RLType). train.py
    setup_reference_model loads the model a second time as the reference for every `rl` but orpo when there is no
    adapter, or with `rl_adapter_ref_model: true` (an adapter otherwise uses the base with the adapter off).
    None where `rl` is unwritten (then not preference training)."""
    rl = rd.arg("rl")
    if rl is None or not rl.value:
        return None
    kind = str(rl.value).strip().lower()
    if kind not in (*AXOLOTL_PAIRED_RL, "kto"):
        notes.append(f"{_axolotl_online_rl(rd)}; planned as supervised training, which is smaller")
        return None
    ref_adapter = rd.arg("rl_adapter_ref_model")
    if kind == "orpo":
        reference = Known(False, replace(rl.origin, detail="rl: orpo (axolotl train.py: no reference model)"))
    elif method in ("full", "freeze"):
        why = f"rl: {kind} without an adapter: axolotl loads a reference model (train.py setup_reference_model)"
        reference = Known(True, replace(rl.origin, detail=why))
    elif ref_adapter is not None and truthy(ref_adapter.value):
        reference = Known(True, ref_adapter.origin)
    else:
        why = f"rl: {kind} with an adapter: the base with the adapter off is the reference (train.py)"
        reference = Known(False, replace(rl.origin, detail=why))
    return reference, Known(kind in AXOLOTL_PAIRED_RL, rl.origin)


def _storage_dtype(value: Any) -> str:
    """setup's dtype spelling, plus "none" for "no quant storage" (bitsandbytes then packs into uint8)."""
    if str(value).strip().lower() == "none":
        return "uint8"
    return normalize_dtype(value) or "uint8"


def _micro_default(s: TrainingSetup) -> Known[int]:
    if s.args_doc is not None:
        # transformers TrainingArguments.per_device_train_batch_size default 8; LLaMA-Factory inherits it.
        return Known(8, Origin("framework", "HF per_device_train_batch_size default 8"))
    return Known(1, Origin("deepspeed", "DeepSpeed train_micro_batch_size_per_gpu default 1"))


def _precision(s: TrainingSetup, rd: _Reader) -> Known[str] | None:
    for name in ("bf16", "fp16"):
        k = rd.arg(name)
        if k is not None and truthy(k.value):
            return Known(name, k.origin)
    if s.mixed_precision_evidence is not None and s.accelerate_doc is not None:
        mp = str(s.accelerate_doc.get("mixed_precision") or "").lower()
        if mp in ("bf16", "fp16"):
            return Known(mp, Origin.of_evidence(s.mixed_precision_evidence))
    if s.ds_written is not None:
        for name in ("bf16", "fp16"):
            k = rd.ds(f"{name}.enabled")
            if k is not None and k.value is True:
                return Known(name, k.origin)
        if s.args_doc is None and s.xtuner_doc is None and s.framework == "deepspeed":
            return Known("fp32", Origin("deepspeed", "neither bf16 nor fp16 enabled: fp32"))
    return None


def optimizer_kind(optim: str) -> str | None:
    """The planner's optimizer for an HF `optim` name (transformers `OptimizerNames`, which LLaMA-Factory passes
    through, or an optimizer class name): bitsandbytes' paged AdamW (`paged_adamw_32bit`, `PagedAdamW8bit`) keeps its states in CUDA unified
    memory (planned apart, `plan.model_states.PAGED_OPTIMIZERS`), so it must not collapse into plain AdamW; the
    other 8-bit optimizers are planned as `adamw_8bit` (at most two 8-bit states); None for an optimizer the planner
    does not model (then Adam-shaped by default).
    """
    low = optim.strip().lower()
    if "sgd" in low:
        return "sgd"
    if "ademamix" in low:  # three states (`plan.model_states.optimizer_state_bytes_per_param`), 8-bit: uint8
        bits = "8bit" if "8bit" in low else "32bit"
        if low.startswith("paged"):  # cudaMallocManaged like paged AdamW (`plan.model_states.PAGED_OPTIMIZERS`)
            return f"paged_ademamix_{bits}"
        return "ademamix_8bit" if bits == "8bit" else "ademamix"
    if low.startswith("paged") and "adam" in low:
        return "paged_adamw_8bit" if "8bit" in low else "paged_adamw_32bit"
    if "8bit" in low:
        return "adamw_8bit"
    return "adamw" if "adam" in low else None


def _optimizer(rd: _Reader) -> Known[str] | None:
    k = rd.arg("optim")
    if k is not None and isinstance(k.value, str):
        name = optimizer_kind(k.value)
        if name:
            return Known(name, k.origin)
    s = rd.s
    if s is not None and s.xtuner_doc is not None:
        # XTuner: `optim_wrapper = dict(optimizer=dict(type=optim_type))`, a class such as torch.optim.AdamW or
        # bitsandbytes.optim.PagedAdamW32bit (read as a symbol by the ast reader, never imported).
        path = ("optim_wrapper", "optimizer", "type")
        source = getattr(s.xtuner_doc.get(path), "source", None)
        name = optimizer_kind(source.rsplit(".", 1)[-1]) if isinstance(source, str) else None
        if name:
            return Known(name, Origin.of_evidence(s.xtuner_doc.evidence(path)))
    k = rd.ds("optimizer.type", concrete=True)
    if k is not None and isinstance(k.value, str):
        return Known("sgd" if "sgd" in k.value.lower() else "adamw", k.origin)
    return None


def _gradient_checkpointing(s: TrainingSetup, rd: _Reader) -> Known[bool] | None:
    if s.args_doc is not None and s.args_doc.kind == "llamafactory":
        k = rd.arg("disable_gradient_checkpointing")
        if k is not None:
            return Known(not truthy(k.value), k.origin)
        return Known(True, Origin("framework", "LLaMA-Factory turns gradient checkpointing on by default"))
    k = rd.arg("gradient_checkpointing")
    if k is not None:
        return Known(bool(truthy(k.value)), k.origin)
    if s.args_doc is not None:
        return Known(False, Origin("framework", "HF gradient_checkpointing default false"))
    if s.xtuner_doc is not None:
        return Known(True, Origin("framework", "XTuner enables gradient checkpointing by default"))
    return None


def _reentrant_origin(s: TrainingSetup, rd: _Reader) -> Origin:
    k = rd.arg("gradient_checkpointing_kwargs", "use_reentrant", "use_reentrant_gc")
    if k is not None:
        return k.origin
    if s.args_doc is not None and s.args_doc.kind == "llamafactory":
        return Origin("framework", "LLaMA-Factory use_reentrant_gc default true")
    return Origin("framework", "transformers 5.23 default use_reentrant=False")


def _attn(s: TrainingSetup, rd: _Reader) -> Known[str] | None:
    k = rd.arg("attn_implementation", "flash_attn")
    if k is not None and isinstance(k.value, str):
        low = k.value.lower()
        if "flash" in low or low in ("fa2", "fa3"):
            return Known("flash", k.origin)
        return Known("eager" if low in ("eager", "disabled") else "sdpa", k.origin)
    k = rd.arg("use_flash_attn", "flash_attention")  # axolotl: `flash_attention: true`
    if k is not None and truthy(k.value):
        return Known("flash", k.origin)
    # axolotl's legacy flag, after flash_attention (utils/schemas/enums.py LEGACY_ATTN_FLAG_TO_IMPL "eager_attention":
    # "eager"; v0.5.0 utils/models.py: `elif cfg.eager_attention: model_kwargs["attn_implementation"] = "eager"`)
    k = rd.arg("eager_attention")
    if k is not None and truthy(k.value):
        return Known("eager", k.origin)
    sp = rd.xt("sequence_parallel_size")
    if sp is not None and sp.value not in (1, None):
        return Known("flash", Origin("framework", "XTuner sequence parallelism dispatches flash attention"))
    return None


def _zero_init_trait(s: TrainingSetup, framework: str | None) -> bool | None:
    """Whether the model is built under zero.Init for ZeRO-3: accelerate's zero3_init_flag; HF Trainer and
    LLaMA-Factory and XTuner do (docs/framework-facts.md); plain DeepSpeed only if the user's script does."""
    flag = s.zero3_init_flag()
    if flag is not None:
        return flag
    if framework in ("hf", "llamafactory", "xtuner"):
        return True
    return None


def _num(value: Any, fallback: int) -> int:
    num = as_number(value)
    if num is None or num != num or num in (float("inf"), float("-inf")):
        return fallback
    return int(num)


def _zero(
    s: TrainingSetup,
    rd: _Reader,
    model: ModelSpec | None,
    traits: FrameworkTraits,
    flags: RunFlags,
    notes: list[str],
    check: _Validate,
) -> ZeroDescription | None:
    """The ZeRO configuration as DeepSpeed will run it: "auto" bucket values as HF fills them from the
    model's hidden size (HF-like frameworks; transformers integrations/deepspeed.py trainer_config_finalize),
    DeepSpeed's code defaults for absent keys, flags over both."""
    if s.ds_written is None and flags.stage is None and not (flags.offload_optimizer or flags.offload_param):
        return None
    h = model.params.hidden_size if model is not None else None
    hf_like = traits.name in ("hf", "llamafactory", "accelerate")

    def knob(key: str, ds_default: int) -> Known[int]:
        full = f"zero_optimization.{key}"
        k = rd.ds(full)
        if k is None:
            return Known(ds_default, Origin("deepspeed", f"DeepSpeed default for {full}", key=full))
        if is_auto(k.value):
            hf_auto = hf_auto_bucket(full, h) if h and full in HF_AUTO_BUCKETS else None
            if hf_like and hf_auto is not None:
                return Known(
                    hf_auto,
                    Origin(
                        "auto", f'"auto" -> {hf_auto:,} (HF: from hidden size {h})', *_pos(s, full)[:3], full
                    ),
                )
            return Known(
                ds_default,
                Origin("deepspeed", f'"auto" left unfilled: DeepSpeed default {ds_default:,}', key=full),
            )
        return Known(_num(k.value, ds_default), k.origin)

    stage_k = rd.ds("zero_optimization.stage") or Known(0, Origin("deepspeed", "DeepSpeed default stage 0"))
    if flags.stage is not None:
        if flags.stage not in (0, 1, 2, 3):
            raise SetupError(f"--stage must be 0, 1, 2 or 3, got {flags.stage}")
        stage_k = Known(flags.stage, _flag("--stage"))
    stage = Known(_num(stage_k.value, -1), stage_k.origin)
    if stage.value not in (0, 1, 2, 3):
        stage = check._fail(
            SetupError(
                f"{stage_k.origin.describe()}: zero_optimization.stage is {stage_k.value!r}",
                hint="DeepSpeed accepts stage 0, 1, 2 or 3",
            ),
            stage_k,
            0,
        )

    def device(part: str) -> tuple[Known[str], str]:
        key = f"zero_optimization.offload_{part}.device"
        flag_value = getattr(flags, f"offload_{part}")
        k = Known(flag_value, _flag(f"--offload-{part}")) if flag_value else rd.ds(key)
        k = k or Known("none", Origin("deepspeed", "no offload", key=key))
        checked = check.one_of(Known(str(k.value or "none"), k.origin), OFFLOAD_DEVICES, key, "none")
        return checked, checked.value

    opt_k, opt_written = device("optimizer")
    par_k, par_written = device("param")
    # DeepSpeed ignores parameter offload below stage 3 and any offload at stage 0 (lint DS005 says so).
    if stage.value < 3 and par_written != "none":
        par_k = Known(
            "none",
            Origin(
                "deepspeed",
                f"ignored at ZeRO stage {stage.value}",
                *_pos(s, "zero_optimization.offload_param.device")[:3],
                "zero_optimization.offload_param.device",
            ),
        )
        notes.append(
            f"offload_param.device is {par_written!r} but ZeRO stage is {stage.value}: DeepSpeed ignores it, "
            "so parameters stay on the GPU"
        )
    if stage.value == 0 and opt_written != "none":
        opt_k = Known("none", Origin("deepspeed", "ignored at ZeRO stage 0"))
        notes.append("offload_optimizer is ignored at ZeRO stage 0 (no ZeRO optimizer is built)")

    pin = _pin_memory(s, rd, opt_k.value, par_k.value)
    overlap_k = rd.ds("zero_optimization.overlap_comm")
    overlap = (
        Known(bool(truthy(overlap_k.value)), overlap_k.origin)
        if overlap_k is not None and overlap_k.value is not None
        else Known(stage.value == 3, Origin("deepspeed", "overlap_comm default: on for ZeRO-3 only"))
    )
    gather_k = rd.ds("zero_optimization.stage3_gather_16bit_weights_on_model_save")
    gather = (
        Known(bool(truthy(gather_k.value)), gather_k.origin)
        if gather_k is not None
        else Known(False, Origin("deepspeed", "stage3_gather_16bit_weights_on_model_save default false"))
    )
    zero3_init = Known(
        traits.zero_init if traits.zero_init is not None else True,
        _zero_init_origin(s, traits),
    )
    if zero3_init.value is False and stage.value == 3:
        notes.append(
            "the model is not built under zero.Init: every rank loads the whole model before partitioning"
        )
    clip_k = rd.ds("gradient_clipping")
    clip = None
    if clip_k is not None and as_number(clip_k.value) is not None:
        clip = Known(float(as_number(clip_k.value) or 0.0), clip_k.origin)
    elif clip_k is not None and is_auto(clip_k.value):
        mgn = rd.arg("max_grad_norm")
        if mgn is not None and as_number(mgn.value) is not None:
            clip = Known(
                float(as_number(mgn.value) or 0.0),
                Origin(
                    "auto",
                    '"auto" filled from max_grad_norm',
                    *_pos(s, "gradient_clipping")[:3],
                    "gradient_clipping",
                ),
            )
        elif traits.fills_auto:
            clip = Known(
                1.0,
                Origin("auto", '"auto" filled from HF max_grad_norm default 1.0', key="gradient_clipping"),
            )
    flat = s.ds_flat() if s.ds_written is not None else {}
    return ZeroDescription(
        stage=stage,
        offload_optimizer=opt_k,
        offload_param=par_k,
        offload_optimizer_written=opt_written,
        offload_param_written=par_written,
        pin_memory=pin,
        reduce_bucket_size=knob("reduce_bucket_size", DS_DEFAULT_REDUCE_BUCKET),
        allgather_bucket_size=knob("allgather_bucket_size", DS_DEFAULT_ALLGATHER_BUCKET),
        prefetch_bucket_size=knob("stage3_prefetch_bucket_size", DS_DEFAULT_PREFETCH_BUCKET),
        max_live_parameters=knob("stage3_max_live_parameters", DS_DEFAULT_MAX_LIVE),
        max_reuse_distance=knob("stage3_max_reuse_distance", DS_DEFAULT_MAX_REUSE),
        param_persistence_threshold=knob("stage3_param_persistence_threshold", DS_DEFAULT_PERSISTENCE),
        sub_group_size=knob("sub_group_size", DS_DEFAULT_SUB_GROUP),
        overlap_comm=overlap,
        gather_16bit_on_save=gather,
        zero3_init=zero3_init,
        gradient_clipping=clip,
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
        optimizer_from_config=_deepspeed_builds_fused_adam(s.ds_written),
    )


def accelerate_swaps_offloaded_optimizer(framework: str | None, ds: Mapping[str, Any] | None) -> bool:
    """HF Trainer, LLaMA-Factory and axolotl prepare DeepSpeed through accelerate, which replaces the client
    optimizer (8-bit, paged, SGD...) with DeepSpeedCPUAdam, fp32 Adam states, when offload_optimizer is cpu / nvme
    and the config has no `optimizer` block (accelerate 0.26-1.15 accelerator.py prepare_deepspeed:
    `map_pytorch_optim_to_deepspeed` unless `zero_force_ds_cpu_optimizer: false`; utils/deepspeed.py: "DeepSpeedCPUAdam
    is the default"). Adagrad / Lion map to their CPU twins (fewer states), so AdamW is the upper bound. An unknown
    launcher (None) is read as HF Trainer, as elsewhere; a raw DeepSpeed script with a client optimizer under offload
    raises unless `zero_force_ds_cpu_optimizer: false` (engine.py `_configure_optimizer`), so it swaps too."""
    if framework not in (None, "hf", "llamafactory", "accelerate"):
        return False
    return ds is None or (
        not isinstance(ds.get("optimizer"), dict) and ds.get("zero_force_ds_cpu_optimizer") is not False
    )


def _note_offloaded_client_optimizer(
    optimizer: Known[str], zero: ZeroDescription | None, traits: FrameworkTraits, notes: list[str]
) -> None:
    """Say why the run's offload strategy plans AdamW (`accelerate_swaps_offloaded_optimizer`). The run keeps its own
    optimizer: the planner swaps per candidate (plan/phases.py, `Training.offload_swaps_optimizer`), so strategies
    without optimizer offload plan the client optimizer that really steps there (review R10, 1)."""
    if (
        zero is None
        or zero.offload_optimizer.value not in ("cpu", "nvme")
        or not traits.swaps_offloaded_optimizer
        or optimizer.value == "adamw"
    ):
        return
    notes.append(
        f"optimizer {optimizer.value} ({optimizer.origin.describe()}): with offload_optimizer "
        f"{zero.offload_optimizer.value} accelerate hands DeepSpeed DeepSpeedCPUAdam in its place, fp32 Adam states "
        "(accelerate accelerator.py prepare_deepspeed -> utils/deepspeed.py map_pytorch_optim_to_deepspeed): "
        f"strategies with optimizer offload plan AdamW, those without plan {optimizer.value}"
    )


def _deepspeed_builds_fused_adam(ds: dict[str, Any] | None) -> bool:
    """True when the DeepSpeed config's `optimizer` block makes DeepSpeed build FusedAdam (type Adam or AdamW,
    `torch_adam` not set): deepspeed/runtime/engine.py `_configure_basic_optimizer` -> `get_optimizer_configuration`
    (torch.optim.AdamW only with `torch_adam: true`; DeepSpeedCPUAdam with offload_optimizer). HF Trainer and
    accelerate leave such a block to DeepSpeed (transformers integrations/deepspeed.py `deepspeed_optim_sched`)."""
    block = ds.get("optimizer") if ds is not None else None
    if not isinstance(block, dict) or str(block.get("type", "")).lower() not in ("adam", "adamw"):
        return False
    params = block.get("params")
    return not (isinstance(params, dict) and params.get("torch_adam") is True)


def _fsdp(s: TrainingSetup, rd: _Reader) -> tuple[FsdpDescription | None, Origin | None]:
    """FSDP settings from HF arguments (`fsdp`, `fsdp_config`) or an accelerate config with
    `distributed_type: FSDP` (its `fsdp_config` section), with the defaults each applies when a key is absent
    (HF: transformers 5.23 TrainingArguments._process_fsdp_args; accelerate 1.15 FullyShardedDataParallelPlugin).
    Returns the description and the origin of the choice of FSDP itself (None, None without FSDP)."""
    hf = rd.arg("fsdp")
    cfg_k = rd.arg("fsdp_config")
    opts = hf_fsdp_options(hf.value, cfg_k.value if cfg_k else None) if hf is not None else None
    if opts is not None and hf is not None:
        where = hf.origin
        cfg_where = cfg_k.origin if cfg_k is not None and isinstance(cfg_k.value, dict) else where

        def hf_get(key: str, default: Any, why: str) -> Known[Any]:
            if key in opts and opts[key] is not None:
                return Known(
                    opts[key], cfg_where if cfg_k is not None and _has_fsdp_key(cfg_k.value, key) else where
                )
            return Known(default, Origin("framework", f"HF Trainer default: {why}"))

        version = hf_get("version", HF_FSDP_DEFAULT_VERSION, f"fsdp_config version {HF_FSDP_DEFAULT_VERSION}")
        v = _num(version.value, HF_FSDP_DEFAULT_VERSION)
        return (
            FsdpDescription(
                version=Known(v, version.origin),
                sharding=_sharding(hf_get("reshard_after_forward", "full_shard", "full shard")),
                offload_params=_bool(hf_get("cpu_offload", False, "no CPU offload")),
                backward_prefetch=_prefetch(
                    hf_get("backward_prefetch", "none", "backward_prefetch NO_PREFETCH")
                    if v == 1
                    else Known(
                        "backward_pre", Origin("framework", "FSDP2 prefetches the next unit in backward")
                    )
                ),
                forward_prefetch=_bool(hf_get("forward_prefetch", False, "forward_prefetch false")),
                state_dict_type=_sd_type(hf_get("state_dict_type", "FULL_STATE_DICT", "FULL_STATE_DICT")),
                use_orig_params=_bool(hf_get("use_orig_params", True, "use_orig_params true")),
                cpu_ram_efficient_loading=_bool(
                    hf_get("cpu_ram_efficient_loading", False, "cpu_ram_efficient_loading false")
                ),
                activation_checkpointing=_bool(
                    hf_get("activation_checkpointing", False, "FSDP activation_checkpointing false")
                ),
            ),
            where,
        )
    doc = s.accelerate_doc
    if doc is None or str(doc.get("distributed_type") or "").upper() != "FSDP":
        return None, None
    section = doc.get("fsdp_config")
    section = section if isinstance(section, dict) else {}

    def acc(key: str, default: Any, why: str) -> Known[Any]:
        if section.get(key) is not None:
            return Known(section[key], Origin.of_evidence(doc.evidence(("fsdp_config", key))))
        return Known(default, Origin("framework", f"accelerate default: {why}"))

    version = acc("fsdp_version", 1, "fsdp_version 1")
    v = _num(version.value, 1)
    sharding = acc("fsdp_sharding_strategy", None, "")
    if sharding.value is None:
        sharding = acc(
            "fsdp_reshard_after_forward", "full_shard", "FULL_SHARD (FSDP2: reshard_after_forward true)"
        )
    prefetch = acc("fsdp_backward_prefetch", None, "")
    if prefetch.value is None:
        prefetch = acc("fsdp_backward_prefetch_policy", "none", "backward_prefetch None (no prefetch)")
    if v == 2:
        prefetch = Known("backward_pre", Origin("framework", "FSDP2 prefetches the next unit in backward"))
    return (
        FsdpDescription(
            version=Known(v, version.origin),
            sharding=_sharding(sharding),
            offload_params=_bool(acc("fsdp_offload_params", False, "fsdp_offload_params false")),
            backward_prefetch=_prefetch(prefetch),
            forward_prefetch=_bool(acc("fsdp_forward_prefetch", False, "fsdp_forward_prefetch false")),
            state_dict_type=_sd_type(
                acc(
                    "fsdp_state_dict_type",
                    "FULL_STATE_DICT" if v == 1 else "SHARDED_STATE_DICT",
                    "FULL_STATE_DICT for FSDP1, SHARDED_STATE_DICT for FSDP2",
                )
            ),
            use_orig_params=_bool(acc("fsdp_use_orig_params", v == 2, "fsdp_use_orig_params false (FSDP1)")),
            cpu_ram_efficient_loading=_bool(
                acc("fsdp_cpu_ram_efficient_loading", False, "fsdp_cpu_ram_efficient_loading false")
            ),
            activation_checkpointing=_bool(
                acc("fsdp_activation_checkpointing", False, "fsdp_activation_checkpointing false")
            ),
        ),
        Origin.of_evidence(doc.evidence(("distributed_type",))),
    )


def _has_fsdp_key(cfg: Any, key: str) -> bool:
    return isinstance(cfg, dict) and (key in cfg or f"fsdp_{key}" in cfg)


def _bool(k: Known[Any]) -> Known[bool]:
    return Known(bool(truthy(k.value)), k.origin)


def _sharding(k: Known[Any]) -> Known[str]:
    """A ShardingStrategy name or number (FSDP1), or FSDP2's reshard_after_forward bool."""
    v = k.value
    if isinstance(v, bool) or str(v).lower() in ("true", "false"):
        return Known("full_shard" if truthy(v) else "shard_grad_op", k.origin)
    num = as_number(v)
    if num is not None and 1 <= num <= len(FSDP_SHARDING):
        return Known(FSDP_SHARDING[int(num) - 1], k.origin)
    name = str(v).strip().lower()
    return Known(name if name in FSDP_SHARDING else "full_shard", k.origin)


def _prefetch(k: Known[Any]) -> Known[str]:
    name = str(k.value).strip().lower()
    num = as_number(k.value)
    if num is not None and int(num) in (1, 2):
        name = ("backward_pre", "backward_post")[int(num) - 1]
    return Known(name if name in ("backward_pre", "backward_post") else "none", k.origin)


def _sd_type(k: Known[Any]) -> Known[str]:
    name = str(k.value).strip().lower().removesuffix("_state_dict")
    num = as_number(k.value)
    if num is not None and int(num) in (1, 2, 3):
        name = ("full", "local", "sharded")[int(num) - 1]
    return Known(name if name in ("full", "local", "sharded") else "full", k.origin)


def _zero_init_origin(s: TrainingSetup, traits: FrameworkTraits) -> Origin:
    if s.accelerate_doc is not None:
        section = s.accelerate_doc.get("deepspeed_config") or {}
        if isinstance(section, dict) and "zero3_init_flag" in section:
            return Origin.of_evidence(s.accelerate_doc.evidence(("deepspeed_config", "zero3_init_flag")))
        return Origin("framework", "accelerate zero3_init_flag default: on for ZeRO-3")
    if traits.zero_init:
        return Origin("framework", f"{traits.name} builds the model under zero.Init for ZeRO-3")
    return _default("assumed built under zero.Init (a plain deepspeed.initialize script must do it itself)")


def _pin_memory(s: TrainingSetup, rd: _Reader, opt: str, par: str) -> Known[bool]:
    """pin_memory of the offloaded parts, as DeepSpeed resolves it. Not written and DeepSpeed's version
    unknown: assume pinned (the default since DeepSpeed PR #8207, and the larger host footprint, so the host
    RAM check errs on the safe side). One value for lint and plan."""
    offloaded = [p for p, dev in (("optimizer", opt), ("param", par)) if dev != "none"]
    if not offloaded:
        return Known(False, Origin("deepspeed", "nothing offloaded"))
    for part in offloaded:
        key = f"zero_optimization.offload_{part}.pin_memory"
        written = s.ds_written_value(key) if s.ds_written is not None else None
        if written is not None and truthy(written):
            return Known(True, Origin.of_evidence(s.ds_evidence(key)))
    for part in offloaded:
        key = f"zero_optimization.offload_{part}.pin_memory"
        written = s.ds_written_value(key) if s.ds_written is not None else None
        if written is None:
            default = pin_memory_default(s.package_version("deepspeed"))
            if default is None:
                return Known(
                    True,
                    Origin(
                        "default",
                        "pin_memory not written and DeepSpeed version unknown: assumed on (its "
                        "default since DeepSpeed PR #8207; the larger host footprint)",
                        key=key,
                    ),
                )
            if default:
                return Known(
                    True,
                    Origin(
                        "deepspeed",
                        f"pin_memory default on in DeepSpeed {s.package_version('deepspeed')}",
                        key=key,
                    ),
                )
    key = f"zero_optimization.offload_{offloaded[0]}.pin_memory"
    written = s.ds_written_value(key) if s.ds_written is not None else None
    if written is not None:
        return Known(False, Origin.of_evidence(s.ds_evidence(key)))
    return Known(
        False,
        Origin("deepspeed", f"pin_memory default off in DeepSpeed {s.package_version('deepspeed')}", key=key),
    )
