"""The built-in DeepSpeed checks reach the same verdict as DeepSpeed's own config parser (DeepSpeed 0.19.8,
`deepspeed.runtime.config.DeepSpeedConfig`, run for real in a subprocess), on the same files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from zerodoctor.findings import Severity
from zerodoctor.lint.deepspeed_validate import validate_many
from zerodoctor.lint.engine import lint_setup, select_rules
from zerodoctor.setup.discover import discover
from zerodoctor.setup.load import load_setup, setup_from_documents

pytest.importorskip("deepspeed")

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
BUILTIN = ["DS001", "DS002", "DS003", "DS004", "DS005"]

# (name, file text, world size, DeepSpeed should accept)
CASES = [
    (
        "valid zero3 offload",
        {
            "train_micro_batch_size_per_gpu": 1,
            "gradient_accumulation_steps": 4,
            "gradient_clipping": 1.0,
            "bf16": {"enabled": True},
            "zero_optimization": {
                "stage": 3,
                "offload_optimizer": {"device": "cpu", "pin_memory": True},
                "offload_param": {"device": "cpu"},
                "reduce_bucket_size": 5e8,
                "stage3_gather_16bit_weights_on_model_save": True,
            },
        },
        8,
        True,
    ),
    (
        "batch triple wrong",
        {"train_batch_size": 64, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 8},
        1,
        False,
    ),
    (
        "batch triple right",
        {"train_batch_size": 64, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 8},
        2,
        True,
    ),
    ("micro batch zero", {"train_micro_batch_size_per_gpu": 0}, 1, False),
    (
        "fractional bucket",
        {
            "train_micro_batch_size_per_gpu": 1,
            "zero_optimization": {"stage": 3, "stage3_prefetch_bucket_size": 14745599.9},
        },
        1,
        False,
    ),
    (
        "bucket as string",
        {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2, "reduce_bucket_size": "5e8"}},
        1,
        False,
    ),
    (
        "exact float bucket",
        {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2, "reduce_bucket_size": 5e8}},
        1,
        True,
    ),
    (
        "unknown zero key",
        {
            "train_micro_batch_size_per_gpu": 1,
            "zero_optimization": {"stage": 3, "stage3_gather_16bit_weight_on_model_save": True},
        },
        1,
        False,
    ),
    (
        "unknown offload key",
        {
            "train_micro_batch_size_per_gpu": 1,
            "zero_optimization": {"stage": 3, "offload_param": {"device": "cpu", "pin": True}},
        },
        1,
        False,
    ),
    (
        "fp16 and bf16",
        {"train_micro_batch_size_per_gpu": 1, "fp16": {"enabled": True}, "bf16": {"enabled": True}},
        1,
        False,
    ),
    (
        "bool as yes",
        {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3, "overlap_comm": "yes"}},
        1,
        True,
    ),
    (
        "bool as maybe",
        {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3, "overlap_comm": "maybe"}},
        1,
        False,
    ),
    (
        "partial offload on stage 2",
        {
            "train_micro_batch_size_per_gpu": 1,
            "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "ratio": 0.5}},
        },
        1,
        False,
    ),
    ("stage 5", {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 5}}, 1, False),
    (
        "offload to gpu",
        {
            "train_micro_batch_size_per_gpu": 1,
            "zero_optimization": {"stage": 3, "offload_param": {"device": "gpu"}},
        },
        1,
        False,
    ),
    (
        "aliases",
        {
            "train_micro_batch_size_per_gpu": 1,
            "zero_optimization": {
                "stage": 3,
                "gather_16bit_weights_on_model_save": True,
                "max_live_parameters": 1e9,
                "prefetch_bucket_size": 5e7,
            },
        },
        1,
        True,
    ),
    ("auto without HF", {"train_micro_batch_size_per_gpu": "auto", "gradient_clipping": "auto"}, 1, False),
]


def _write(tmp_path: Path, name: str, content) -> Path:
    p = tmp_path / f"{name.replace(' ', '_')}.json"
    p.write_text(content if isinstance(content, str) else json.dumps(content, indent=2))
    return p


def _builtin_rejects(setup) -> bool:
    findings = lint_setup(setup, select_rules(BUILTIN))
    return any(f.severity is Severity.ERROR for f in findings)


@pytest.mark.engine
def test_builtin_checks_agree_with_deepspeed(tmp_path):
    setups, expected = [], []
    for name, cfg, ws, accepts in CASES:
        setups.append(load_setup([_write(tmp_path, name, cfg)], framework="deepspeed", world_size=ws))
        expected.append((name, accepts))
    # duplicate keys: only DeepSpeed's JSON loader sees them, so it must read the file itself
    dup = _write(
        tmp_path, "duplicate", '{"train_micro_batch_size_per_gpu": 1, "train_micro_batch_size_per_gpu": 2}'
    )
    setups.append(load_setup([dup], framework="deepspeed", world_size=1))
    expected.append(("duplicate keys", False))
    # the bundled seed setups, as their frameworks hand them to DeepSpeed
    for folder in sorted(EXAMPLES.iterdir()):
        # the files the run uses, as `zerodoctor check DIR` finds them (the DeepSpeed JSON the YAML names)
        found = discover([folder])
        s = setup_from_documents([d for d in found.documents if "upstream" not in d.display], world_size=8)
        if s.ds_written is not None:
            setups.append(s)
            expected.append((f"example {folder.name}", True))
    verdicts = validate_many(setups)
    disagreements = []
    for setup, (name, accepts), ds_findings in zip(setups, expected, verdicts, strict=True):
        assert not any(f.severity is Severity.INFO for f in ds_findings), (
            f"{name}: DeepSpeed did not run: {ds_findings}"
        )
        deepspeed_rejects = any(f.severity is Severity.ERROR for f in ds_findings)
        assert deepspeed_rejects == (not accepts), (
            f"{name}: expected DeepSpeed to {'accept' if accepts else 'reject'}: {ds_findings}"
        )
        if _builtin_rejects(setup) != deepspeed_rejects:
            disagreements.append(
                (name, deepspeed_rejects, [f.message for f in lint_setup(setup, select_rules(BUILTIN))])
            )
    assert not disagreements, disagreements
