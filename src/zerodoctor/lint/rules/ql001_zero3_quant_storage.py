"""QL001 qlora.zero3-quant-storage: 4-bit QLoRA under ZeRO-3 needs `bnb_4bit_quant_storage` = compute dtype.

Why it matters: bitsandbytes packs 4-bit weights into `uint8` by default. ZeRO-3 flattens and partitions
parameters per dtype group next to the bf16/fp16 ones, and cannot do that with the uint8-packed weights, so
the quantized base model stays whole on every GPU (huggingface/peft#1844: Llama-3 8B/70B/405B OOM with QLoRA +
ZeRO-3). PEFT's guide "Use PEFT QLoRA and DeepSpeed with ZeRO3" sets `bnb_4bit_quant_storage` to the same
dtype as the model's `torch_dtype` (bf16), which makes the 4-bit weights partitionable. Even then the load
skips `zero.Init` (transformers only enters it when the model is not quantized), so each GPU holds the whole
4-bit model at load time (QL002).

What frameworks do for you: LLaMA-Factory builds its BitsAndBytesConfig with `bnb_4bit_quant_storage =
compute dtype` for every 4-bit load (`model/model_utils/quantization.py`), so a LLaMA-Factory
`quantization_bit: 4` setup is not reported. PEFT's example `train.py` defaults `bnb_4bit_quant_storage_dtype`
to "uint8", so leaving the argument out reproduces the failure. TRL's `get_quantization_config` passes
`bnb_4bit_quant_storage=torch_dtype` in some releases and its own `bnb_4bit_quant_storage` argument in others
(huggingface/trl trl/trainer/utils.py), so TRL-style `load_in_4bit` + `torch_dtype` without an explicit storage
is a warning, not an error.

Example (fails): `use_4bit_quantization: true` with ZeRO-3 and no `bnb_4bit_quant_storage_dtype`.
Use instead: `bnb_4bit_quant_storage_dtype: bfloat16` (and `torch_dtype`/`bf16` matching). Fix: safe.
"""

from __future__ import annotations

from collections.abc import Iterator

from zerodoctor.findings import Finding, Fix, Severity
from zerodoctor.lint.rule import Rule
from zerodoctor.setup.model import TrainingSetup
from zerodoctor.setup.run import RunDescription


def _storage_key(setup: TrainingSetup) -> tuple[str, str, str]:
    """(name shown, dotted key to patch, target file kind) where the storage dtype belongs."""
    if (
        setup.xtuner_doc is not None
        and setup.quant_evidence is not None
        and setup.quant_evidence.file == setup.xtuner_doc.display
    ):
        return "bnb_4bit_quant_storage", "model.llm.quantization_config.bnb_4bit_quant_storage", "xtuner"
    if setup.args_doc is not None and "use_4bit_quantization" in setup.args_doc.data:
        return (
            "bnb_4bit_quant_storage_dtype",
            "bnb_4bit_quant_storage_dtype",
            "hf",
        )  # PEFT example scripts' name
    if setup.args_doc is not None and isinstance(setup.args_doc.data.get("quantization_config"), dict):
        return "bnb_4bit_quant_storage", "quantization_config.bnb_4bit_quant_storage", "hf"
    return "bnb_4bit_quant_storage", "bnb_4bit_quant_storage", "hf"


def check(run: RunDescription) -> Iterator[Finding]:
    setup = run.files
    if not setup.quant.get("load_in_4bit") or setup.zero_stage != 3:
        return
    if setup.quant.get("quant_storage_set_by_framework"):
        return  # LLaMA-Factory sets it to the compute dtype itself
    storage = setup.quant.get("bnb_4bit_quant_storage")
    compute = setup.quant.get("bnb_4bit_compute_dtype")
    want = compute if compute in ("bfloat16", "float16", "float32") else "bfloat16"
    key, patch_key, target = _storage_key(setup)
    evidence = [
        e for e in (setup.quant_evidence, setup.ds_evidence("zero_optimization.stage")) if e is not None
    ]
    size = ""
    if setup.total_params:
        size = f" For this model that is about {setup.total_params * 0.5 / 2**30:,.0f} GiB of 4-bit weights per GPU."
    if storage is None and setup.quant.get("quant_storage_maybe_from_dtype"):
        yield RULE.finding(
            f"4-bit quantization with ZeRO-3 through TRL-style arguments (load_in_4bit + torch_dtype) and no "
            f"{key}: TRL's get_quantization_config sets the storage to torch_dtype in some releases and reads its "
            "own bnb_4bit_quant_storage argument in others (then None: uint8, and every GPU keeps the whole "
            f"quantized model).{size} Set it explicitly.",
            evidence=evidence,
            severity=Severity.WARNING,
            fixes=[Fix(f"Set {key}: {want}", target=target, patch={patch_key: want})],
        )
        return
    if storage in (None, "uint8"):
        how = "is not set (bitsandbytes packs into uint8)" if storage is None else "is uint8"
        yield RULE.finding(
            f"4-bit quantization with ZeRO-3, but {key} {how}: ZeRO-3 cannot partition the packed weights, so every "
            f"GPU keeps the whole quantized base model and large models run out of GPU memory.{size}",
            evidence=evidence,
            fixes=[
                Fix(
                    f"Set {key}: {want} (the same dtype as torch_dtype / bf16)",
                    target=target,
                    patch={patch_key: want},
                )
            ],
        )
    elif compute and storage != compute:
        yield RULE.finding(
            f"{key} is {storage} but the compute dtype is {compute}; PEFT's ZeRO-3 QLoRA guide requires the model "
            "dtype to equal the quant storage dtype so the packed weights join the same flat groups.",
            evidence=evidence,
            severity=Severity.WARNING,
            fixes=[Fix(f"Set {key}: {compute}", target=target, patch={patch_key: compute})],
        )


RULE = Rule(
    code="QL001",
    name="qlora.zero3-quant-storage",
    title="QLoRA under ZeRO-3 without bnb_4bit_quant_storage = compute dtype",
    severity=Severity.ERROR,
    references=(
        "huggingface/peft#2016",
        "huggingface/accelerate#2978",
        "huggingface/peft#1972",
        "bitsandbytes-foundation/bitsandbytes#1249",
        "deepspeedai/DeepSpeed#5660",
    ),
    check=check,
    fix_safety="safe",
)
