"""DS001 deepspeed.invalid-config: keys and values DeepSpeed rejects, or silently ignores.

Why it matters: DeepSpeed validates `zero_optimization` and its offload blocks with pydantic models that
forbid unknown keys, so a misspelt key (`stage3_gather_16bit_weight_on_model_save`) stops the job at
`deepspeed.initialize`, after the model has loaded on every rank. Unknown *top-level* keys are ignored
silently: `"zero_optimisation": {...}` trains with ZeRO disabled. Duplicate keys are rejected
(`dict_raise_error_on_duplicate_keys`) when DeepSpeed opens the file itself; under HF Trainer, LLaMA-Factory
and accelerate the file is read with `json.load` first (accelerate `HfDeepSpeedConfig`), the last value wins
and the finding is a warning naming the value used. Bucket sizes must be integers: pydantic v2 accepts `5e8` (an exact
float) but not `14745599.999` (what `0.9 * hidden**2` gives; accelerate PR #2814) nor the string `"5e8"`.
`"auto"` is only a placeholder that HF Trainer / accelerate fill for a fixed set of keys; anywhere else it
reaches DeepSpeed unchanged.

Example (fails):

    {"zero_optimization": {"stage": 3, "stage3_prefetch_bucket_size": 14745599.999}}

Use instead:

    {"zero_optimization": {"stage": 3, "stage3_prefetch_bucket_size": 14745600}}

Without DeepSpeed installed, zerodoctor checks the keys and types that decide memory and correctness
(the lists below are DeepSpeed 0.19.8's models); with `--deepspeed-validate`, DeepSpeed's own config
models judge the whole file. Fix: safe for a misspelt key inside `zero_optimization` or its offload blocks
(DeepSpeed refuses to start with it, so the rename to the one close name only lets the run start as the file
means); a misspelt top-level key is not renamed automatically, since DeepSpeed ignores it today and the rename
turns its settings on.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterator
from typing import Any

from zerodoctor.findings import Evidence, Finding, Fix, Severity
from zerodoctor.lint.rule import Rule
from zerodoctor.lint.rules._common import HF_FILLABLE_AUTO, fillable_auto_keys, is_auto
from zerodoctor.setup.deepspeed_config import DEEPSPEED_TOP_KEYS as TOP_KEYS
from zerodoctor.setup.deepspeed_config import ZERO_ALIASES
from zerodoctor.setup.model import TrainingSetup
from zerodoctor.setup.run import RunDescription

# DeepSpeedZeroConfig fields and aliases (DeepSpeed 0.19.8, runtime/zero/config.py; extra="forbid").
ZERO_KEYS = {
    "allgather_bucket_size",
    "allgather_partitions",
    "allgather_sequential",
    "compute_grad_norm",
    "contiguous_gradients",
    "cpu_offload",
    "cpu_offload_param",
    "cpu_offload_use_pin_memory",
    "elastic_checkpoint",
    "enable_sanity_checks",
    "gather_16bit_weights_on_model_save",
    "ignore_unused_parameters",
    "leaf_module",
    "legacy_stage1",
    "load_from_fp32_weights",
    "log_trace_cache_warnings",
    "max_live_parameters",
    "max_reuse_distance",
    "memory_efficient_linear",
    "model_persistence_threshold",
    "module_granularity_threshold",
    "offload_optimizer",
    "offload_param",
    "overlap_comm",
    "override_module_apply",
    "param_persistence_threshold",
    "parameter_alignment",
    "pipeline_loading_checkpoint",
    "prefetch_bucket_size",
    "reduce_bucket_size",
    "reduce_scatter",
    "round_robin_gradients",
    "save_muon_momentum_buffer_in_memory",
    "stage",
    "stage3_allgather_sequential",
    "stage3_gather_16bit_weights_on_model_save",
    "stage3_gather_fp16_weights_on_model_save",
    "stage3_max_live_parameters",
    "stage3_max_reuse_distance",
    "stage3_model_persistence_threshold",
    "stage3_module_granularity_threshold",
    "stage3_param_persistence_threshold",
    "stage3_prefetch_bucket_size",
    "stage3_use_all_reduce_for_fetch_params",
    "sub_group_size",
    "use_all_reduce_for_fetch_params",
    "use_multi_rank_bucket_allreduce",
    "zenflow",
    "zero_hpz_partition_size",
    "zero_quantized_gradients",
    "zero_quantized_nontrainable_weights",
    "zero_quantized_weights",
}
OFFLOAD_OPTIMIZER_KEYS = {
    "buffer_count",
    "cpuadam_cores_perc",
    "device",
    "fast_init",
    "nvme_path",
    "pin_memory",
    "pipeline_read",
    "pipeline_write",
    "ratio",
    "super_offload",
    "pipeline",
}
OFFLOAD_PARAM_KEYS = {"buffer_count", "buffer_size", "device", "max_in_cpu", "nvme_path", "pin_memory"}
# Integer fields of DeepSpeed's pydantic models (lax mode: 5e8, "500000000" and true are accepted; 14745599.9
# and "5e8" are not).
PYDANTIC_INT_KEYS = {
    "zero_optimization.stage",
    "zero_optimization.reduce_bucket_size",
    "zero_optimization.allgather_bucket_size",
    "zero_optimization.sub_group_size",
    "zero_optimization.stage3_prefetch_bucket_size",
    "zero_optimization.stage3_param_persistence_threshold",
    "zero_optimization.stage3_max_live_parameters",
    "zero_optimization.stage3_max_reuse_distance",
    "zero_optimization.stage3_model_persistence_threshold",
    "zero_optimization.offload_param.buffer_count",
    "zero_optimization.offload_param.buffer_size",
    "zero_optimization.offload_param.max_in_cpu",
    "zero_optimization.offload_optimizer.buffer_count",
}
# Top-level batch keys DeepSpeed reads raw (runtime/config.py get_scalar_param) and does arithmetic on.
RAW_INT_KEYS = {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"}
PYDANTIC_BOOL_KEYS = {
    "zero_optimization.overlap_comm",
    "zero_optimization.contiguous_gradients",
    "zero_optimization.stage3_gather_16bit_weights_on_model_save",
    "zero_optimization.reduce_scatter",
    "zero_optimization.offload_optimizer.pin_memory",
    "zero_optimization.offload_param.pin_memory",
}
# Read raw with get_scalar_param and used for their Python truth value: the string "false" counts as true.
RAW_BOOL_KEYS = {"zero_allow_untested_optimizer", "zero_force_ds_cpu_optimizer"}
# Blocks parsed by pydantic models that drop "auto" values (DeepSpeedConfigModel) and use the default.
PYDANTIC_BLOCKS = ("zero_optimization", "fp16", "bf16")
DEVICES = ("none", "cpu", "nvme")

# Top-level blocks DeepSpeed 0.19.8 reads as mappings (runtime/config.py DeepSpeedConfig._initialize_params and
# the block parsers it calls), with how each is read: a pydantic/config class built with `**block` (TypeError
# "X() argument after ** must be a mapping, not T") or a dict method called on it (AttributeError "'T' object has
# no attribute 'get'"). The second item says whether null is accepted (read as "not given"). Measured by building
# DeepSpeedConfig with each block set to true, "x", 5, null and [1].
MAPPING_BLOCKS: dict[str, tuple[str, bool]] = {
    "zero_optimization": ("deepspeed.runtime.zero.config.DeepSpeedZeroConfig", False),
    "bf16": ("deepspeed.runtime.precision_config.DeepSpeedBF16Config", True),
    "bfloat16": ("deepspeed.runtime.precision_config.DeepSpeedBF16Config", False),
    "fp16": ("deepspeed.runtime.precision_config.DeepSpeedFP16Config", False),
    "comms_logger": ("deepspeed.comm.config.CommsLoggerConfig", False),
    "compile": ("deepspeed.compile.config.CompileConfig", False),
    "hybrid_engine": ("deepspeed.runtime.config.HybridEngineConfig", False),
    "tensor_parallel": ("deepspeed.runtime.tensor_parallel.config.TPTrainingConfig", False),
    "weight_quantization": ("deepspeed.inference.config.WeightQuantConfig", False),
    "optimizer": (".keys", False),
    "scheduler": (".keys", False),
    "pipeline": (".items", False),
    "activation_checkpointing": (".get", False),
    "aio": (".get", True),
    "autotuning": (".get", False),
    "checkpoint": (".get", False),
    "data_efficiency": (".get", False),
    "data_types": (".get", False),
    "flops_profiler": (".get", False),
    "torch_autocast": (".get", False),
    "tensorboard": ("DeepSpeedMonitorConfig", False),
    "wandb": ("DeepSpeedMonitorConfig", False),
    "csv_monitor": ("DeepSpeedMonitorConfig", False),
}
# DeepSpeed 0.19.8 runtime/config.py _REMOVED_TOP_LEVEL_CONFIG_KEYS: a block for a removed feature raises
# DeepSpeedConfigError with this text (whatever its value) before anything else is read.
_REMOVED = "See https://github.com/deepspeedai/DeepSpeed/issues/8489."
REMOVED_TOP_KEYS: dict[str, str] = {
    "nebula": "Nebula checkpointing has been removed. A leftover 'nebula' block would be ignored and checkpoints "
    f"would silently fall back to local torch.save. {_REMOVED}",
    "compression_training": "The DeepSpeed compression library has been removed. A leftover "
    f"'compression_training' block would be ignored and the model would train unquantized. {_REMOVED}",
    "amp": "NVIDIA Apex AMP integration has been removed. Use DeepSpeed 'fp16', 'bf16', or 'torch_autocast' "
    f"instead. {_REMOVED}",
    "quantize_training": f"Mixture-of-Quantization (MoQ) / 'quantize_training' has been removed. {_REMOVED}",
    "sparse_gradients": "Sparse compression of dense torch.nn.Embedding gradients has been removed. A leftover "
    f"'sparse_gradients' flag would be ignored and those gradients would be reduced dense. {_REMOVED}",
    "eigenvalue": "Eigenvalue-based Mixture-of-Quantization (MoQ) has been removed; the standalone 'eigenvalue' "
    f"configuration block is no longer supported. {_REMOVED}",
    "sparse_attention": "DeepSpeed Sparse Attention has been removed; the 'sparse_attention' configuration block "
    f"is no longer supported. {_REMOVED}",
    "elasticity": "Elastic training has been removed; the 'elasticity' configuration block is no longer supported. "
    "Set train_batch_size / train_micro_batch_size_per_gpu / gradient_accumulation_steps directly.",
    "graph_harvesting": "Graph harvesting has been removed; the 'graph_harvesting' configuration option is no "
    f"longer supported. {_REMOVED}",
    "curriculum_learning": "Legacy top-level 'curriculum_learning' has been removed. Use "
    f"'data_efficiency.data_sampling.curriculum_learning' instead. {_REMOVED}",
    "progressive_layer_drop": "Progressive Layer Dropping has been removed; the 'progressive_layer_drop' "
    f"configuration block is no longer supported. {_REMOVED}",
}
# Bounds of DeepSpeed 0.19.8's pydantic int/float fields (runtime/zero/config.py, runtime/zero/offload_config.py:
# `Field(..., gt=0)` / `ge=0` / `le=1.0`), by canonical key: (lower, lower is allowed, upper or None).
FIELD_BOUNDS: dict[str, tuple[float, bool, float | None]] = {
    "zero_optimization.reduce_bucket_size": (0, False, None),
    "zero_optimization.allgather_bucket_size": (0, True, None),
    "zero_optimization.sub_group_size": (0, True, None),
    "zero_optimization.stage3_prefetch_bucket_size": (0, True, None),
    "zero_optimization.stage3_param_persistence_threshold": (0, True, None),
    "zero_optimization.stage3_model_persistence_threshold": (0, True, None),
    "zero_optimization.stage3_max_live_parameters": (0, True, None),
    "zero_optimization.stage3_max_reuse_distance": (0, True, None),
    "zero_optimization.zero_hpz_partition_size": (0, True, None),
    "zero_optimization.offload_param.buffer_count": (0, True, None),
    "zero_optimization.offload_param.buffer_size": (0, True, None),
    "zero_optimization.offload_param.max_in_cpu": (0, True, None),
    "zero_optimization.offload_optimizer.buffer_count": (0, True, None),
    "zero_optimization.offload_optimizer.ratio": (0, True, 1.0),
    "zero_optimization.offload_optimizer.cpuadam_cores_perc": (0, True, 1.0),
}
# Read raw (get_scalar_param) and lower-cased: runtime/config.py get_communication_data_type.
COMM_DTYPE_KEYS = ("communication_data_type", "seq_parallel_communication_data_type")
COMM_DTYPES = ("fp16", "bf16", "fp32")
ALLREDUCE_OPS = ("mean", "sum")  # runtime/constants.py GRADIENT_ALLREDUCE_OP_SUPPORTED

REFS = ("deepspeedai/DeepSpeed#1270", "huggingface/accelerate#2814")
# Launchers that parse the DeepSpeed JSON with plain json.load before DeepSpeed sees it (a duplicate key: the
# last value wins, nothing raises): transformers integrations/deepspeed.py HfTrainerDeepSpeedConfig ->
# accelerate utils/deepspeed.py HfDeepSpeedConfig (accelerate 1.15); LLaMA-Factory passes the path to HF.
JSON_LOAD_FRAMEWORKS = ("hf", "llamafactory", "accelerate")
FRAMEWORK_NAMES = {
    "hf": "HF Trainer",
    "llamafactory": "LLaMA-Factory (through HF Trainer)",
    "accelerate": "accelerate",
}


def _shown(value: Any) -> str:
    return f"the string {value!r}" if isinstance(value, str) else repr(value)


def _exact(value: Any) -> str:
    if isinstance(value, float):
        return f" Use {int(round(value))}."
    if isinstance(value, str):
        try:
            f = float(value)
        except ValueError:
            return ""
        return f" Write it as a number: {int(f)}." if f.is_integer() else ""
    return ""


def _pydantic_int(value: Any) -> bool:
    """What pydantic v2 (lax mode) accepts for an int field: ints, bools, exact floats, integer strings."""
    if isinstance(value, bool | int):
        return True
    if isinstance(value, float):
        return value.is_integer()
    if isinstance(value, str):
        try:
            int(value.strip())
        except ValueError:
            return False
        return True
    return False


def _unfilled_auto(setup: TrainingSetup, doc: Any, dotted: str, canon: str, path: tuple[str, ...]) -> Finding:
    who = "xtuner train only fills" if setup.framework == "xtuner" else "HF Trainer and accelerate only fill"
    which = (
        "gradient accumulation, micro batch size, clipping and fp16/bf16"
        if setup.framework == "xtuner"
        else "batch sizes, clipping, fp16/bf16, optimizer/scheduler params and the three hidden-size based ZeRO keys"
    )
    if canon.split(".")[0] in PYDANTIC_BLOCKS:
        # DeepSpeedConfigModel drops "auto" values, so the field silently takes its default.
        default = "stage 0 (no ZeRO at all)" if canon == "zero_optimization.stage" else "its default"
        return RULE.finding(
            f'`{dotted}` is "auto", but {who} "auto" for {which}; DeepSpeed\'s config model silently drops '
            f'this "auto" and uses {default}.',
            evidence=[doc.evidence(path)],
            fixes=[Fix(f"Give `{dotted}` a concrete value.")],
            severity=Severity.ERROR if canon == "zero_optimization.stage" else Severity.WARNING,
        )
    return RULE.finding(
        f'`{dotted}` is "auto", but {who} "auto" for {which}; here DeepSpeed receives the string and fails.',
        evidence=[doc.evidence(path)],
        fixes=[Fix(f"Give `{dotted}` a concrete value.")],
    )


# What pydantic v2 (lax mode) accepts for a bool field, so we flag exactly what DeepSpeed rejects.
_BOOL_STRINGS = {"0", "off", "f", "false", "n", "no", "1", "on", "t", "true", "y", "yes"}


def _pydantic_bool(value: Any) -> bool:
    if isinstance(value, bool) or value is None:
        return True
    if isinstance(value, int):
        return value in (0, 1)
    if isinstance(value, float):
        return value in (0.0, 1.0)
    return isinstance(value, str) and value.strip().lower() in _BOOL_STRINGS


def _close(name: str, options: set[str]) -> str | None:
    match = difflib.get_close_matches(name, sorted(options), n=1, cutoff=0.8)
    return match[0] if match else None


def _walk(node: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(node, dict):
        for k, v in node.items():
            key = f"{prefix}{k}"
            yield key, v
            yield from _walk(v, key + ".")


def _canonical_key(dotted: str) -> str:
    parts = dotted.split(".")
    if parts[0] == "bfloat16":
        parts[0] = "bf16"
    if parts[0] == "zero_optimization" and len(parts) > 1:
        parts[1] = ZERO_ALIASES.get(parts[1], parts[1])
    return ".".join(parts)


def _type_name(value: Any) -> str:
    return type(value).__name__


def _block_findings(doc: Any, data: dict[str, Any]) -> Iterator[Finding]:
    """Top-level values DeepSpeed's constructor refuses by their type, with the error it raises."""
    for key, message in REMOVED_TOP_KEYS.items():
        if key in data:
            yield RULE.finding(
                f"`{key}`: DeepSpeed 0.19.8 refuses the config (DeepSpeedConfigError): '{message}'",
                evidence=[doc.evidence((key,))],
                fixes=[Fix(f"Remove `{key}`.")],
            )
    for key, (reader, null_ok) in MAPPING_BLOCKS.items():
        if key not in data:
            continue
        value = data[key]
        if isinstance(value, dict) or value is None and null_ok:
            continue
        if key == "zero_optimization" and isinstance(value, bool):
            continue  # the legacy spelling (read_zero_config_deprecated); reported below
        if reader.startswith("."):
            error = f"AttributeError: '{_type_name(value)}' object has no attribute '{reader[1:]}'"
        elif reader == "DeepSpeedMonitorConfig":
            error = f"ValidationError for DeepSpeedMonitorConfig: {key}: Input should be a valid dictionary"
        else:
            error = f"TypeError: {reader}() argument after ** must be a mapping, not {_type_name(value)}"
        shown = "null" if value is None else json.dumps(value, default=str)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        example = (
            '{"enabled": true}'
            if key in ("bf16", "bfloat16", "fp16")
            else '{"type": "AdamW", "params": {"lr": 2e-5}}'
            if key == "optimizer"
            else "{...}"
        )
        yield RULE.finding(
            f"`{key}` must be an object, got {shown}; DeepSpeed's config parser stops with '{error}'.",
            evidence=[doc.evidence((key,))],
            fixes=[Fix(f"Write `{key}` as an object such as {example}, or remove it.")],
        )
    for key in ("optimizer", "scheduler"):
        block = data.get(key)
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if key == "optimizer" and kind is not None and not isinstance(kind, str):
            # runtime/config.py: `self.optimizer_name.lower()`
            yield RULE.finding(
                f"`optimizer.type` must be a name such as \"AdamW\", got {kind!r}; DeepSpeed's config parser "
                f"stops with \"AttributeError: '{_type_name(kind)}' object has no attribute 'lower'\".",
                evidence=[doc.evidence((key, "type"))],
            )
        params = block.get("params")
        if key == "optimizer" and kind is not None and params is not None and not isinstance(params, dict):
            # runtime/config.py get_optimizer_gradient_clipping: `optimizer_params.keys()`
            yield RULE.finding(
                f"`optimizer.params` must be an object, got {params!r:.60}; DeepSpeed's config parser stops with "
                f"\"AttributeError: '{_type_name(params)}' object has no attribute 'keys'\".",
                evidence=[doc.evidence((key, "params"))],
            )


def _scalar_finding(doc: Any, dotted: str, canon: str, path: tuple[str, ...], value: Any) -> Finding | None:
    """A scalar DeepSpeed refuses (or trips over at the first step), by the reader it goes through."""
    if canon in FIELD_BOUNDS and isinstance(value, int | float) and not isinstance(value, bool):
        low, low_ok, high = FIELD_BOUNDS[canon]
        if value < low or value == low and not low_ok:
            bound = "greater than or equal to 0" if low_ok else "greater than 0"
        elif high is not None and value > high:
            bound = f"less than or equal to {high}"
        else:
            return None
        return RULE.finding(
            f"`{dotted}` is {value!r}; DeepSpeed's pydantic model rejects it: 'Input should be {bound}'.",
            evidence=[doc.evidence(path)],
        )
    if canon in COMM_DTYPE_KEYS and value is not None:
        if not isinstance(value, str):
            error = f"AttributeError: '{_type_name(value)}' object has no attribute 'lower'"
        elif value.lower() not in COMM_DTYPES:
            error = (
                "ValueError: Invalid communication_data_type. Supported data types: ['fp16', 'bf16', 'fp32']. "
                f"Got: {value.lower()}"
            )
        else:
            return None
        return RULE.finding(
            f'`{dotted}` is {value!r}; DeepSpeed\'s config parser stops with "{error}". Use "fp16", "bf16" or '
            '"fp32", or remove the key.',
            evidence=[doc.evidence(path)],
        )
    if canon == "gradient_allreduce_op" and not (isinstance(value, str) and value.lower() in ALLREDUCE_OPS):
        return RULE.finding(
            f"`{dotted}` is {value!r}; DeepSpeed's config parser stops with 'ValueError: Invalid "
            f"gradient_allreduce_op. Supported operations: {list(ALLREDUCE_OPS)}. Got: {value!r}'.",
            evidence=[doc.evidence(path)],
        )
    if canon == "gradient_clipping" and value is not None and (
        isinstance(value, bool) or not isinstance(value, int | float)
    ):
        # Read raw (get_gradient_clipping); runtime/engine.py compares `self.gradient_clipping() > 0.0` at the
        # first optimizer step, where a string or an object raises TypeError.
        return RULE.finding(
            f"`{dotted}` must be a number, got {_shown(value)}; DeepSpeed keeps it as written and the engine's "
            "`gradient_clipping() > 0.0` fails at the first optimizer step." + _exact_float(value),
            evidence=[doc.evidence(path)],
        )
    if canon.endswith(".nvme_path") and canon.count(".") == 2 and value is not None and not isinstance(value, str):
        return RULE.finding(
            f"`{dotted}` must be a path string, got {value!r}; DeepSpeed's pydantic model rejects it: 'Input is "
            "not a valid path'.",
            evidence=[doc.evidence(path)],
        )
    return None


def _exact_float(value: Any) -> str:
    try:
        number = float(value) if isinstance(value, str) else None
    except ValueError:
        return ""
    return f" Write it without quotes: {number!r}." if number is not None else ""


def check(run: RunDescription) -> Iterator[Finding]:
    setup = run.files
    doc = setup.ds_doc
    if doc is None:
        return
    data = doc.data
    dup_paths = [p for p, _ in doc.duplicates]
    for path, pos in doc.duplicates:
        if any(path[: len(d)] == d and path != d for d in dup_paths):
            continue  # inside a block that is itself duplicated: DeepSpeed reports the block only
        where = Evidence(file=doc.display, line=pos.line, column=pos.column, key=".".join(path))
        if setup.framework in JSON_LOAD_FRAMEWORKS:
            # NOTE: HF Trainer, LLaMA-Factory and accelerate read the file with json.load (accelerate
            # utils/deepspeed.py HfDeepSpeedConfig.__init__) and hand DeepSpeed a dict: the last value wins.
            used = json.dumps(doc.get(path), default=str)
            yield RULE.finding(
                f"`{'.'.join(path)}` appears twice; {FRAMEWORK_NAMES[setup.framework]} reads this file with "
                f"json.load, which keeps the last one, so the run uses {used}. Remove the other so the file "
                "says what the run does (DeepSpeed itself refuses duplicate keys when it opens the file).",
                evidence=[where],
                severity=Severity.WARNING,
                fixes=[Fix(f"Keep only the `{path[-1]}` you mean ({used} is the one used now).")],
            )
            continue
        yield RULE.finding(
            f"`{'.'.join(path)}` appears twice; DeepSpeed refuses configs with duplicate keys when it opens the "
            "file itself (ValueError from dict_raise_error_on_duplicate_keys, deepspeed/runtime/config.py). "
            "Keep one of them.",
            evidence=[where],
        )
    for key in data:
        if key not in TOP_KEYS:
            near = _close(key, TOP_KEYS)
            if near:
                yield RULE.finding(
                    f"Top-level key `{key}` is not a DeepSpeed setting, and DeepSpeed ignores unknown top-level "
                    f"keys silently: did you mean `{near}`? As written, `{near}` keeps its default.",
                    evidence=[doc.evidence((key,))],
                    severity=Severity.WARNING,
                    fixes=[Fix(f"Rename `{key}` to `{near}`.")],
                    data={
                        "why_no_autofix": f"the run starts today with `{near}` at its default; renaming turns these "
                        "settings on and changes how it trains"
                    },
                )
    yield from _block_findings(doc, data)
    zero = data.get("zero_optimization")
    if isinstance(zero, bool):
        yield RULE.finding(
            "`zero_optimization` must be an object.", evidence=[doc.evidence(("zero_optimization",))]
        )
    if not isinstance(zero, dict):
        zero = None
    for block, allowed, label in (
        (zero, ZERO_KEYS, "zero_optimization"),
        (
            (zero or {}).get("offload_optimizer"),
            OFFLOAD_OPTIMIZER_KEYS,
            "zero_optimization.offload_optimizer",
        ),
        ((zero or {}).get("offload_param"), OFFLOAD_PARAM_KEYS, "zero_optimization.offload_param"),
    ):
        if not isinstance(block, dict):
            continue
        for key in block:
            if key not in allowed:
                near = _close(key, allowed)
                hint = f" Did you mean `{near}`?" if near else ""
                # The run cannot start with this key, so the rename only makes it start with what the file
                # means: safe to apply (a key that is set already is left for the user to choose).
                patch = (
                    {f"{label}.{key}": None, f"{label}.{near}": block[key]}
                    if near and near not in block
                    else None
                )
                yield RULE.finding(
                    f"`{label}` has no setting `{key}`; DeepSpeed's config model forbids unknown keys here, so "
                    f"`deepspeed.initialize` fails with a pydantic 'Extra inputs are not permitted' error.{hint}",
                    evidence=[doc.evidence((*label.split("."), key))],
                    fixes=[
                        Fix(
                            f"Rename `{key}` to `{near}`." if near else f"Remove `{key}`.",
                            target="deepspeed" if patch else None,
                            patch=patch,
                        )
                    ],
                    data={}
                    if patch
                    else {
                        "why_no_autofix": f"`{near}` is set as well: keep the value you mean"
                        if near
                        else "no setting is close to this name"
                    },
                )
    fillable = fillable_auto_keys(setup.framework)
    for dotted, value in _walk(data):
        canon = _canonical_key(dotted)
        path = tuple(dotted.split("."))
        if len(path) == 1 and dotted in MAPPING_BLOCKS and not isinstance(value, dict):
            continue  # a block written as a scalar ("bf16": "auto"): reported by _block_findings
        if path == ("optimizer", "params") and not isinstance(value, dict):
            continue  # (`"params": "auto"` and other non-objects: reported once, by _block_findings; review R9)
        if is_auto(value):
            # "auto" in a key nobody fills. (Without any framework that fills "auto", DS004 reports them all.)
            if fillable is None and canon not in HF_FILLABLE_AUTO or fillable and canon not in fillable:
                yield _unfilled_auto(setup, doc, dotted, canon, path)
            continue
        if canon in PYDANTIC_INT_KEYS and not _pydantic_int(value):
            yield RULE.finding(
                f"`{dotted}` must be an integer, got {_shown(value)}; DeepSpeed's pydantic model rejects it.{_exact(value)}",
                evidence=[doc.evidence(path)],
            )
        elif canon in RAW_INT_KEYS and (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or isinstance(value, float)
            and not value.is_integer()
        ):
            yield RULE.finding(
                f"`{dotted}` must be a whole number, got {_shown(value)}; DeepSpeed reads it as is and its batch "
                f"arithmetic fails.{_exact(value)}",
                evidence=[doc.evidence(path)],
            )
        elif canon in PYDANTIC_BOOL_KEYS and not _pydantic_bool(value):
            yield RULE.finding(
                f"`{dotted}` must be true or false, got {value!r}; DeepSpeed's pydantic model rejects it.",
                evidence=[doc.evidence(path)],
                fixes=[Fix(f"Write `{dotted}` as a JSON boolean (true / false).")],
            )
        elif (scalar := _scalar_finding(doc, dotted, canon, path, value)) is not None:
            yield scalar
        elif canon in RAW_BOOL_KEYS and not isinstance(value, bool):
            truth = "true" if value else "false"
            yield RULE.finding(
                f"`{dotted}` is {value!r}, not a JSON boolean: DeepSpeed reads it as is and uses its Python truth "
                f"value, so it counts as {truth}"
                + (' (the string "false" is true).' if isinstance(value, str) and value else "."),
                evidence=[doc.evidence(path)],
                severity=Severity.ERROR if isinstance(value, str) else Severity.WARNING,
                fixes=[Fix(f"Write `{dotted}` as true or false without quotes.")],
            )
    if isinstance(zero, dict):
        stage = zero.get("stage", 0)
        if isinstance(stage, bool):
            yield RULE.finding(
                f"`zero_optimization.stage` is {json.dumps(stage)}; DeepSpeed's pydantic model reads a boolean as the "
                f"number {int(stage)}, so this runs ZeRO stage {int(stage)} (plan and check refuse it). Write the "
                "stage you mean: 0, 1, 2 or 3.",
                evidence=[doc.evidence(("zero_optimization", "stage"))],
            )
        elif (
            not is_auto(stage)
            and isinstance(stage, int | float)
            and not isinstance(stage, bool)
            and stage not in (0, 1, 2, 3)
        ):
            yield RULE.finding(
                f"`zero_optimization.stage` is {stage!r}; ZeRO stages are 0, 1, 2 and 3.",
                evidence=[doc.evidence(("zero_optimization", "stage"))],
            )
        for part in ("offload_optimizer", "offload_param"):
            block = zero.get(part)
            if part in zero and block is not None and not isinstance(block, dict):
                yield RULE.finding(
                    f'`zero_optimization.{part}` must be an object such as {{"device": "cpu"}}, got {block!r}; '
                    "DeepSpeed's config model rejects it.",
                    evidence=[doc.evidence(("zero_optimization", part))],
                    fixes=[Fix(f'Write `{part}` as {{"device": "cpu"}}.')],
                )
            elif isinstance(block, dict) and "device" in block and not is_auto(block["device"]):
                dev = block["device"]
                if dev not in DEVICES:  # the enum is case-sensitive and not optional
                    hint = (
                        f' (lower case: "{dev.strip().lower()}")'
                        if isinstance(dev, str) and dev.strip().lower() in DEVICES
                        else ""
                    )
                    yield RULE.finding(
                        f'`zero_optimization.{part}.device` is {dev!r}; DeepSpeed accepts exactly "none", "cpu" or '
                        f'"nvme"{hint}.',
                        evidence=[doc.evidence(("zero_optimization", part, "device"))],
                    )


RULE = Rule(
    code="DS001",
    name="deepspeed.invalid-config",
    title="DeepSpeed config key or value that DeepSpeed rejects or ignores",
    severity=Severity.ERROR,
    references=REFS,
    check=check,
    fix_safety="safe",
)
