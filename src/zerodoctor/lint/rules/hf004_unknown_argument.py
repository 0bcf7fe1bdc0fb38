"""HF004 hf.unknown-argument: a key in a training YAML that no argument dataclass of the framework has.

Why it matters: LLaMA-Factory reads its YAML with `HfArgumentParser(...).parse_dict(args, allow_extra_keys=False)`
unless the environment sets `ALLOW_EXTRA_ARGS` (hiyouga/LLaMA-Factory src/llamafactory/hparams/parser.py,
`_parse_train_args`), and HfArgumentParser's `parse_dict` / `parse_yaml_file` raise
`ValueError: Some keys are not used by the HfArgumentParser: [...]` for a key no dataclass has (transformers
src/transformers/hf_argparser.py). So a misspelt `per_device_train_batchsize` stops the job before training;
where extras are allowed it is dropped silently and the real setting keeps its default (a micro batch of 8, or
gradient checkpointing off), and the memory plan of that run is not the one the user meant.

Example (fails):

    per_device_train_batchsize: 1

Use instead:

    per_device_train_batch_size: 1

The known names are transformers' TrainingArguments / Seq2SeqTrainingArguments fields (5.23.0 and the 4.x fields
5.x dropped) and LLaMA-Factory's Model/Data/Finetuning/Generating/Training argument fields
(`zerodoctor.lint.rules._arg_fields` names the versions). For a LLaMA-Factory YAML every unknown key is
reported (an error when it is within a typo of a known name, a warning otherwise, since a plug-in's
parser may know it; a Megatron (USE_MCA) or v1 (USE_V1) config is not judged; a warning when the environment
snapshot shows ALLOW_EXTRA_ARGS set, since LLaMA-Factory then drops the key and trains on the default); for a
plain HF TrainingArguments YAML only a key within a typo of a TrainingArguments field, since a
training script adds its own dataclasses (`model_name_or_path`, `lora_r`, ...) that zerodoctor cannot see.
Fix: safe (the rename to the suggested name, when that name is not set already; otherwise the stray key is
removed).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator
from typing import Any

from zerodoctor.findings import Finding, Fix, Severity
from zerodoctor.lint.rule import Rule
from zerodoctor.lint.rules._arg_fields import (
    LLAMAFACTORY_ARGS,
    LLAMAFACTORY_COMMIT,
    LLAMAFACTORY_PLUGIN_ARGS,
    LLAMAFACTORY_UNBUNDLED_MARKERS,
    TRANSFORMERS_4_ONLY,
    TRANSFORMERS_TRAINING_ARGS,
    TRANSFORMERS_VERSION,
)
from zerodoctor.setup.hf_args import HF_DEFAULTS
from zerodoctor.setup.run import RunDescription

TRAINING_ARGS = TRANSFORMERS_TRAINING_ARGS | TRANSFORMERS_4_ONLY
# difflib ratios: a LLaMA-Factory YAML has only known names, so any close name is the likely one; a plain HF
# YAML mixes in the script's own fields, so only a near-certain typo is named (`lora_target_modules` is 0.8
# from `optim_target_modules`, `save_total_limits` 0.97 from `save_total_limit`).
CUTOFF_LLAMAFACTORY = 0.8
CUTOFF_HF = 0.85
# LLaMA-Factory arguments whose default matters to memory (data_args.py, model_args.py at the commit).
LF_DEFAULTS: dict[str, Any] = {"cutoff_len": 2048, "disable_gradient_checkpointing": False}


def _near(key: str, known: frozenset[str], cutoff: float) -> str | None:
    match = difflib.get_close_matches(key, sorted(known), n=1, cutoff=cutoff)
    return match[0] if match else None


def _default(name: str) -> str:
    if name in HF_DEFAULTS:
        return f" ({HF_DEFAULTS[name][1]!r})"
    if name in LF_DEFAULTS:
        return f" ({LF_DEFAULTS[name]!r})"
    return ""


def check(run: RunDescription) -> Iterator[Finding]:
    doc = run.files.args_doc
    if doc is None or not isinstance(doc.data, dict):
        return
    lf = doc.kind == "llamafactory"
    if lf and not LLAMAFACTORY_UNBUNDLED_MARKERS.isdisjoint(doc.data):
        return  # a Megatron (USE_MCA) or v1 (USE_V1) config: its parser's fields are not bundled
    known = TRAINING_ARGS | LLAMAFACTORY_ARGS | LLAMAFACTORY_PLUGIN_ARGS if lf else TRAINING_ARGS
    env = run.files.env
    # LLaMA-Factory's is_env_enabled (extras/misc.py): the value lower-cased in ("true", "y", "1")
    extras_allowed = (
        lf and env is not None and env.env_vars.get("ALLOW_EXTRA_ARGS", "0").lower() in ("true", "y", "1")
    )
    who = "LLaMA-Factory" if lf else "HF TrainingArguments"
    for key, value in doc.data.items():
        if not isinstance(key, str) or key in known:
            continue
        near = _near(key, known, CUTOFF_LLAMAFACTORY if lf else CUTOFF_HF)
        if near is None and not lf:
            continue  # most likely a field of the script's own dataclasses
        if extras_allowed:
            stops = "ALLOW_EXTRA_ARGS is set in this environment, so llamafactory-cli ignores it"
            then = f": `{near}` keeps its default{_default(near)}" if near else ""
        else:
            stops = (
                "llamafactory-cli stops before training with "
                if lf
                else "a script that reads this file with HfArgumentParser stops before training with "
            ) + f"\"ValueError: Some keys are not used by the HfArgumentParser: ['{key}']\""
            then = (
                f"; where extras are allowed{' (ALLOW_EXTRA_ARGS=1)' if lf else ''} the key is dropped and "
                f"`{near}` keeps its default{_default(near)}"
                if near
                else " (where ALLOW_EXTRA_ARGS=1 allows extras, the key is ignored)"
            )
        if near is None:
            fixes = [Fix(f"Remove `{key}` or correct its name.")]
        elif near in doc.data:
            fixes = [Fix(f"Remove `{key}` (`{near}` is set already).", target=doc.kind, patch={key: None})]
        else:
            fixes = [Fix(f"Rename `{key}` to `{near}`.", target=doc.kind, patch={key: None, near: value})]
        yield RULE.finding(
            f"`{key}` is not an argument {who} knows"
            + (f": did you mean `{near}`?" if near else ".")
            + f" {stops}{then}.",
            evidence=[doc.evidence((key,))],
            fixes=fixes,
            severity=Severity.ERROR if near and not extras_allowed else Severity.WARNING,
            data={"key": key, "near": near, "file": doc.display},
        )


RULE = Rule(
    code="HF004",
    name="hf.unknown-argument",
    title="Training YAML key that no argument dataclass has",
    severity=Severity.ERROR,
    references=(
        "hiyouga/LLaMA-Factory src/llamafactory/hparams/parser.py@" + LLAMAFACTORY_COMMIT[:10],
        f"huggingface/transformers src/transformers/hf_argparser.py@v{TRANSFORMERS_VERSION}",
        f"huggingface/transformers src/transformers/training_args.py@v{TRANSFORMERS_VERSION}",
    ),
    check=check,
    fix_safety="safe",
)
