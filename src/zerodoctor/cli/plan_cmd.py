"""`zerodoctor plan [CONFIG...]`: per-GPU and per-node memory of a ZeRO fine-tuning run, phase by phase, the
strategies that fit, and a DeepSpeed config for the recommended one. Never imports torch/transformers."""

from __future__ import annotations

import argparse
from typing import Any

from zerodoctor.cli.common import (
    add_env_option,
    add_output_options,
    emit,
    exit_code,
    load_env_option,
)
from zerodoctor.report.plan import json_document, render_header, render_markdown_tables
from zerodoctor.safeio import count_arg, gib_arg


def add_parser(sub: argparse._SubParsersAction, epilog: str) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "plan",
        help="predict per-GPU and host memory per phase and recommend a ZeRO strategy that fits",
        description="Predict per-GPU peak memory, host RAM per node, the first-optimizer-step and checkpoint-save "
        "spikes for ZeRO-2/3 with and without CPU/NVMe offload, for full fine-tuning, LoRA and QLoRA; list the "
        "candidate strategies and recommend the cheapest that fits. CONFIG files (HF / LLaMA-Factory YAML, XTuner "
        ".py, DeepSpeed JSON, accelerate YAML) supply model, method, batch and ZeRO settings; options override them.",
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("files", nargs="*", metavar="CONFIG", help="training configs (optional)")
    p.add_argument("--model", help="catalog name, hub id or config.json path (default: from the configs)")
    g = p.add_argument_group("cluster")
    g.add_argument(
        "--nodes", type=count_arg, help="number of nodes (default 1, or world size / GPUs per node)"
    )
    g.add_argument("--gpus-per-node", type=count_arg, help="GPUs per node (default: from --env)")
    g.add_argument(
        "--gpu-memory", type=gib_arg, metavar="GIB", help="memory per GPU in GiB (default: from --env)"
    )
    g.add_argument(
        "--host-ram", type=gib_arg, metavar="GIB", help="host RAM per node in GiB (default: from --env)"
    )
    add_env_option(p)
    t = p.add_argument_group("training")
    t.add_argument("--method", choices=("full", "lora", "qlora", "freeze"))
    t.add_argument("--lora-rank", type=count_arg)
    t.add_argument("--lora-targets", help="all-linear (default) or q_proj,v_proj,...")
    t.add_argument(
        "--quant-storage", help="QLoRA bnb_4bit_quant_storage: bfloat16, float16, or uint8/none (bnb default)"
    )
    t.add_argument("--precision", choices=("bf16", "fp16", "fp32"))
    t.add_argument("--optimizer", choices=("adamw", "adamw_8bit", "sgd"))
    t.add_argument("--micro-batch", type=count_arg, help="per-GPU micro batch")
    t.add_argument("--grad-accum", type=count_arg, help="gradient accumulation steps")
    t.add_argument(
        "--seq-len", type=count_arg, help="tokens per sequence (default: cutoff_len/max_length or 2048)"
    )
    t.add_argument(
        "--gradient-checkpointing",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="activation checkpointing (default: from the configs, else on)",
    )
    t.add_argument("--attn", choices=("flash", "sdpa", "eager"))
    t.add_argument(
        "--liger-kernel",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="Liger Kernel patched in (use_liger_kernel / enable_liger_kernel / TRL use_liger; default: from the configs, else off)",
    )
    t.add_argument(
        "--cut-cross-entropy",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="Apple's Cut Cross-Entropy patched in (axolotl CutCrossEntropyPlugin / cut_cross_entropy: no logits; "
        "Liger's fused loss wins when both are on; default: from the configs, else off)",
    )
    t.add_argument("--sequence-parallel", type=count_arg, help="sequence parallel size (Ulysses / XTuner)")
    t.add_argument("--samples", type=count_arg, help="training samples per epoch (expected optimizer steps)")
    t.add_argument(
        "--save-only-model", action=argparse.BooleanOptionalAction, default=None, help="HF save_only_model"
    )
    z = p.add_argument_group("ZeRO (your current strategy; optional)")
    z.add_argument("--deepspeed", metavar="DS_JSON", help="DeepSpeed config to read and evaluate")
    z.add_argument("--stage", type=int, choices=(0, 1, 2, 3))
    z.add_argument("--offload-optimizer", choices=("none", "cpu", "nvme"))
    z.add_argument("--offload-param", choices=("none", "cpu", "nvme"))
    p.add_argument(
        "--framework",
        choices=("hf", "llamafactory", "accelerate", "xtuner", "deepspeed"),
        help='launcher, when the configs do not say (decides "auto" in emitted configs and what a save gathers)',
    )
    p.add_argument(
        "--margin", type=float, default=10.0, metavar="PERCENT", help="safety margin in percent (default 10)"
    )
    p.add_argument(
        "--emit-ds-config", metavar="FILE", help="write the recommended strategy's DeepSpeed config here"
    )
    p.add_argument("--details", action="store_true", help="text output: every item of every phase")
    add_output_options(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from zerodoctor.errors import UsageError
    from zerodoctor.plan.candidates import plan
    from zerodoctor.plan.inputs import PlanOptions, load_inputs

    if not 0 <= args.margin < 100:
        raise UsageError(f"--margin must be between 0 and 100 percent, got {args.margin:g}")
    opts = PlanOptions(
        model=args.model,
        files=tuple(args.files),
        nodes=args.nodes,
        gpus_per_node=args.gpus_per_node,
        gpu_memory_gib=args.gpu_memory,
        host_ram_gib=args.host_ram,
        method=args.method,
        lora_rank=args.lora_rank,
        lora_targets=args.lora_targets,
        quant_storage=args.quant_storage,
        precision=args.precision,
        optimizer=args.optimizer,
        micro_batch=args.micro_batch,
        grad_accum=args.grad_accum,
        seq_len=args.seq_len,
        gradient_checkpointing=args.gradient_checkpointing,
        attn=args.attn,
        liger_kernel=args.liger_kernel,
        cut_cross_entropy=args.cut_cross_entropy,
        sequence_parallel=args.sequence_parallel,
        samples=args.samples,
        deepspeed=args.deepspeed,
        stage=args.stage,
        offload_optimizer=args.offload_optimizer,
        offload_param=args.offload_param,
        save_only_model=args.save_only_model,
        framework=args.framework,
    )
    env = load_env_option(args.env)
    inputs = load_inputs(opts, env=env)
    result = plan(inputs, margin=args.margin / 100)
    written = None
    if args.emit_ds_config:
        if result.recommended is None:
            raise UsageError("--emit-ds-config: no strategy fits, so there is no config to write")
        from zerodoctor.plan.emit import write_ds_config

        written, notes = write_ds_config(
            args.emit_ds_config, inputs, result.recommended, _user_ds_config(args, env)
        )
    findings = list(result.findings)
    extra = json_document(result)
    if written is not None:
        extra["emitted_ds_config"] = str(written)
        extra["emitted_ds_config_notes"] = notes
    header = render_header(result, details=args.details) if args.format == "text" else None
    if written is not None and header is not None:
        header += f"\nwrote {written} ({result.recommended.name if result.recommended else ''})\n"
        header += "".join(f"  check: {n}\n" for n in notes)
    if header is not None:
        from rich.markup import escape

        header = escape(header)  # plain text: "[lora]" is not rich markup
    emit(args, "plan", findings, title="zerodoctor plan", header=header, extra=extra, clean_message="")
    if args.format == "markdown":
        import sys

        sys.stdout.write(render_markdown_tables(result))
    return exit_code(findings, args.fail_on)


def _user_ds_config(args: argparse.Namespace, env: Any) -> dict[str, Any] | None:
    """The user's DeepSpeed config as written (its optimizer and scheduler go into the emitted one), if any."""
    files = [*args.files, *([args.deepspeed] if args.deepspeed else [])]
    if not files:
        return None
    from zerodoctor.setup.load import load_setup

    setup = load_setup(files, env=env, framework=args.framework, model=args.model)
    return setup.ds_written
