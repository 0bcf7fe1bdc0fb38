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
    zero = data.get("zero_optimization")
    if zero is not None and not isinstance(zero, dict):
        yield RULE.finding(
            "`zero_optimization` must be an object.", evidence=[doc.evidence(("zero_optimization",))]
        )
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
        if (
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
