"""QL002 qlora.zero3-requirements: the rest of what QLoRA + ZeRO-3 needs (versions, zero3_init, load peak).

Why it matters: PEFT's guide lists minimum versions for QLoRA with ZeRO-3: `bitsandbytes>=0.43.3`,
`accelerate>=1.0.1`, `transformers>4.44.2`, `trl>0.11.4`, `peft>0.13.0` (PEFT PR #2151; first documented as
bnb>=0.43.0 in PR #1550), and `zero3_init_flag: true` in the accelerate config. Older stacks either cannot
flatten 4-bit weights or break quantized loading under ZeRO-3 (transformers PR #32640 fixed a regression from
#32299). And whatever the versions, a quantized load skips `zero.Init` (transformers enters it only for
unquantized models; TimDettmers in bitsandbytes#1249), so every GPU first holds the whole 4-bit model: about
0.5 byte per parameter (Llama-3-70B: ~33 GiB; Llama-3.1-405B: ~190 GiB, which no 80 GB GPU can load).

Fixes: upgrade to the listed versions; set `zero3_init_flag: true`; for 405B-class models use FSDP-QLoRA or
LoRA on bf16 weights with ZeRO-3 + zero.Init across enough GPUs. No automatic fix.
"""

from __future__ import annotations

from collections.abc import Iterator

from zerodoctor.findings import Evidence, Finding, Fix, Severity
from zerodoctor.lint.rule import Rule
from zerodoctor.lint.rules._common import gib
from zerodoctor.setup.run import RunDescription
from zerodoctor.versions import parse_version

# (package, operator, version) from the PEFT docs (docs/source/accelerate/deepspeed.md, PR #2151).
MINIMUMS = (
    ("bitsandbytes", ">=", "0.43.3"),
    ("accelerate", ">=", "1.0.1"),
    ("transformers", ">", "4.44.2"),
    ("trl", ">", "0.11.4"),
    ("peft", ">", "0.13.0"),
)
# 4-bit NF4 weights: 0.5 byte per parameter plus blockwise absmax constants (one fp32 per 64 weights, or about
# 0.127 bit/param with double quantization): we count 0.5 B/param, a lower bound.
BYTES_PER_4BIT_PARAM = 0.5


def check(run: RunDescription) -> Iterator[Finding]:
    setup = run.files
    if not setup.quant.get("load_in_4bit") or setup.zero_stage != 3:
        return
    if setup.env is not None:
        versions = setup.env.versions()
        old = []
        for pkg, op, minimum in MINIMUMS:
            have = parse_version(versions.get(pkg))
            want = parse_version(minimum)
            if have is None or want is None:
                continue
            if (op == ">=" and have < want) or (op == ">" and have <= want):
                old.append(f"{pkg} {have} (needs {op}{minimum})")
        if old:
            yield RULE.finding(
                "QLoRA with ZeRO-3 needs the versions PEFT documents; this environment has "
                + ", ".join(old)
                + ".",
                evidence=[Evidence(file=setup.env.source, key=o.split(" ")[0], text=o) for o in old],
                fixes=[
                    Fix(
                        "Upgrade: pip install "
                        + " ".join(
                            f'"{p}{op}{m}"'
                            for p, op, m in MINIMUMS
                            if any(o.startswith(p + " ") for o in old)
                        ),
                        target="env",
                    )
                ],
                severity=Severity.WARNING,
            )
    flag = setup.zero3_init_flag()
    if setup.accelerate_doc is not None and flag is False:
        yield RULE.finding(
            "zero3_init_flag is false: PEFT's QLoRA + ZeRO-3 guide requires it to be true in the accelerate config.",
            evidence=[setup.accelerate_doc.evidence(("deepspeed_config", "zero3_init_flag"))],
            fixes=[
                Fix(
                    "Set zero3_init_flag: true",
                    target="accelerate",
                    patch={"deepspeed_config.zero3_init_flag": True},
                )
            ],
            severity=Severity.WARNING,
        )
    if setup.total_params:
        load_peak = setup.total_params * BYTES_PER_4BIT_PARAM
        gpu_mem = setup.facts().get("env.gpu_memory_bytes")
        where = [e for e in (setup.quant_evidence,) if e is not None]
        if gpu_mem and load_peak >= 0.9 * gpu_mem:
            yield RULE.finding(
                f"A 4-bit load skips zero.Init, so each GPU first holds the whole quantized model: at least "
                f"{gib(load_peak)} for {setup.total_params / 1e9:,.1f}B parameters, on GPUs with {gib(gpu_mem)}. "
                "It cannot load.",
                evidence=where,
                fixes=[
                    Fix(
                        "Use LoRA on bf16 weights with ZeRO-3 (zero.Init partitions at load) across enough GPUs"
                    ),
                    Fix("Or FSDP-QLoRA with fsdp_cpu_ram_efficient_loading (bitsandbytes fsdp_qlora guide)"),
                ],
                severity=Severity.ERROR if load_peak > gpu_mem else Severity.WARNING,
            )
        else:
            yield RULE.finding(
                f"A 4-bit load skips zero.Init, so each GPU first holds the whole quantized model: at least "
                f"{gib(load_peak)} for {setup.total_params / 1e9:,.1f}B parameters before ZeRO-3 partitions it.",
                evidence=where,
                severity=Severity.INFO,
            )


RULE = Rule(
    code="QL002",
    name="qlora.zero3-requirements",
    title="QLoRA + ZeRO-3: versions, zero3_init and the load peak",
    severity=Severity.WARNING,
    references=(
        "huggingface/peft#2016",
        "bitsandbytes-foundation/bitsandbytes#1249",
        "huggingface/transformers#32640",
    ),
    check=check,
)
