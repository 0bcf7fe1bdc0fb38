"""`zerodoctor plan [CONFIG...]`: per-GPU and per-node memory of a ZeRO fine-tuning run, phase by phase, the
strategies that fit, and a DeepSpeed config for the recommended one. Never imports torch/transformers."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from zerodoctor.cli.common import (
    add_env_option,
    add_output_options,
    emit,
    exit_code,
    load_env_option,
    positive_int,
)

if TYPE_CHECKING:
    from zerodoctor.plan.candidates import PlanResult
    from zerodoctor.plan.phases import StrategyPlan


def _gib_value(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a size in GiB, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a size above 0 GiB, got {value:g}")
    return value


def _count(text: str) -> int:
    """Like positive_int, but says what 0 means for a cluster."""
    return positive_int(text)


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
    g.add_argument("--nodes", type=_count, help="number of nodes (default 1, or world size / GPUs per node)")
    g.add_argument("--gpus-per-node", type=_count, help="GPUs per node (default: from --env)")
    g.add_argument(
        "--gpu-memory", type=_gib_value, metavar="GIB", help="memory per GPU in GiB (default: from --env)"
    )
    g.add_argument(
        "--host-ram", type=_gib_value, metavar="GIB", help="host RAM per node in GiB (default: from --env)"
    )
    add_env_option(p)
    t = p.add_argument_group("training")
    t.add_argument("--method", choices=("full", "lora", "qlora"))
    t.add_argument("--lora-rank", type=positive_int)
    t.add_argument("--lora-targets", help="all-linear (default) or q_proj,v_proj,...")
    t.add_argument(
        "--quant-storage", help="QLoRA bnb_4bit_quant_storage: bfloat16, float16, or uint8/none (bnb default)"
    )
    t.add_argument("--precision", choices=("bf16", "fp16", "fp32"))
    t.add_argument("--optimizer", choices=("adamw", "adamw_8bit", "sgd"))
    t.add_argument("--micro-batch", type=positive_int, help="per-GPU micro batch")
    t.add_argument("--grad-accum", type=positive_int, help="gradient accumulation steps")
    t.add_argument(
        "--seq-len", type=positive_int, help="tokens per sequence (default: cutoff_len/max_length or 2048)"
    )
    t.add_argument(
        "--gradient-checkpointing",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="activation checkpointing (default: from the configs, else on)",
    )
    t.add_argument("--attn", choices=("flash", "sdpa", "eager"))
    t.add_argument("--sequence-parallel", type=positive_int, help="sequence parallel size (Ulysses / XTuner)")
    t.add_argument(
        "--samples", type=positive_int, help="training samples per epoch (expected optimizer steps)"
    )
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
        sequence_parallel=args.sequence_parallel,
        samples=args.samples,
        deepspeed=args.deepspeed,
        stage=args.stage,
        offload_optimizer=args.offload_optimizer,
        offload_param=args.offload_param,
        save_only_model=args.save_only_model,
        framework=args.framework,
    )
    inputs = load_inputs(opts, env=load_env_option(args.env))
    result = plan(inputs, margin=args.margin / 100)
    written = None
    if args.emit_ds_config:
        if result.recommended is None:
            raise UsageError("--emit-ds-config: no strategy fits, so there is no config to write")
        from zerodoctor.plan.emit import write_ds_config

        written = write_ds_config(args.emit_ds_config, inputs, result.recommended)
    findings = list(result.findings)
    extra = json_document(result)
    if written is not None:
        extra["emitted_ds_config"] = str(written)
    header = render_header(result, details=args.details) if args.format == "text" else None
    if written is not None and header is not None:
        header += f"\nwrote {written} ({result.recommended.name if result.recommended else ''})\n"
    if header is not None:
        from rich.markup import escape

        header = escape(header)  # plain text: "[lora]" is not rich markup
    emit(args, "plan", findings, title="zerodoctor plan", header=header, extra=extra, clean_message="")
    if args.format == "markdown":
        import sys

        sys.stdout.write(render_markdown_tables(result))
    return exit_code(findings, args.fail_on)


# --------------------------------------------------------------------------------------------------
# Rendering (the CLI is the only place that formats for people)
# --------------------------------------------------------------------------------------------------


def _g(nbytes: float) -> str:
    return f"{nbytes / 2**30:,.1f}"


def json_document(result: PlanResult) -> dict[str, Any]:
    inputs = result.inputs
    p = inputs.model.params
    t = inputs.training
    rec = result.recommended
    trainable = (
        rec.trainable_params if rec is not None else (result.yours.trainable_params if result.yours else None)
    )
    from dataclasses import asdict

    return {
        "model": {
            "name": inputs.model.name,
            "display_name": inputs.model.display_name,
            "model_type": inputs.model.model_type,
            "source": str(inputs.model.source),
            "total_params": p.total,
            "trainable_params": trainable,
            "largest_module": {"name": p.largest_module_name, "params": p.largest_module_numel},
            "count_method": inputs.model.count_method,
        },
        "cluster": {**asdict(inputs.cluster), "world_size": inputs.cluster.world_size},
        "training": {
            **{k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(t).items()},
            "data_parallel": inputs.data_parallel,
            "steps_per_epoch": inputs.steps_per_epoch(),
        },
        "framework": inputs.framework,
        "sources": dict(inputs.sources),
        "notes": list(inputs.notes),
        "safety_margin": result.margin,
        "yours": result.yours.to_dict() if result.yours else None,
        "recommended": rec.name if rec is not None else None,
        "strategies": [s.to_dict() for s in result.candidates],
    }


def _row(s: StrategyPlan, mark: str) -> str:
    gpu, gph = s.gpu_peak()
    host, hph = s.host_peak()
    save = s.phase("save")
    margin = (s.cluster.gpu_memory_bytes - gpu) / 2**30
    return (
        f"{mark:1} {s.name[:72]:72} {_g(gpu):>7} {gph:<10} {_g(host):>8} {hph:<10} "
        f"{_g(save.host_bytes):>8} {s.status:<12} {margin:+7.1f}"
    )


def _phase_table(s: StrategyPlan, details: bool) -> list[str]:
    lines = [f"  {'phase':<22} {'GPU GiB':>9} {'host GiB/node':>14}  biggest items"]
    for ph in s.phases:
        top = sorted(ph.gpu, key=lambda i: -i.bytes)[:2] + sorted(ph.host, key=lambda i: -i.bytes)[:1]
        what = "; ".join(f"{i.name} {_g(i.bytes)}" for i in top)
        lines.append(f"  {ph.title:<22} {_g(ph.gpu_bytes):>9} {_g(ph.host_bytes):>14}  {what}")
        if details:
            for i in ph.gpu:
                lines.append(
                    f"      gpu  {_g(i.bytes):>8}  {i.name}" + (f" ({i.detail})" if i.detail else "")
                )
            for i in ph.host:
                lines.append(
                    f"      host {_g(i.bytes):>8}  {i.name}" + (f" ({i.detail})" if i.detail else "")
                )
    ck = s.checkpoint
    lines.append(
        f"  checkpoint on disk: {ck.full_bytes / 1e9:,.1f} GB ({ck.weights_kind} {ck.weights_bytes / 1e9:,.1f} GB + "
        f"optimizer state {ck.optimizer_bytes / 1e9:,.1f} GB); with save_only_model: "
        f"{ck.save_only_model_bytes / 1e9:,.1f} GB"
    )
    if not ck.save_only_model_skips_optimizer:
        lines.append(f"  note: {ck.explanation}")
    return lines


def render_header(result: PlanResult, *, details: bool = False) -> str:
    i = result.inputs
    p = i.model.params
    t = i.training
    c = i.cluster
    method = t.method + (f" r={t.lora_rank}" if t.is_peft else "")
    if t.method == "qlora":
        method += f" quant_storage={t.quant_storage}"
    out = [
        f"model    {i.model.display_name}: {p.total:,} parameters ({i.model.count_method.split(' (')[0]})",
        f"cluster  {c.nodes} node(s) x {c.gpus_per_node} GPUs = {c.world_size}; {_g(c.gpu_memory_bytes)} GiB per GPU, "
        f"{_g(c.host_ram_bytes)} GiB host RAM per node",
        f"training {method}, {t.precision}, {t.optimizer}, micro batch {t.micro_batch} x grad accum {t.grad_accum}, "
        f"seq {t.seq_len}, {t.attn}, gradient checkpointing {'on' if t.gradient_checkpointing else 'off'}"
        + (f", sequence parallel {t.sequence_parallel}" if t.sequence_parallel > 1 else ""),
    ]
    steps = i.steps_per_epoch()
    if steps is not None:
        out.append(
            f"steps    {steps:,} optimizer steps per epoch ({t.samples:,} samples, data parallel {i.data_parallel})"
        )
    for note in i.notes:
        out.append(f"note     {note}")
    out.append("")
    if result.yours is not None:
        out.append(f"your configuration: {result.yours.zero.label} -> {result.yours.status}")
        out += _phase_table(result.yours, details)
        out.append("")
    rec = result.recommended
    if rec is not None:
        out.append(f"recommended: {rec.name}")
        out += _phase_table(rec, details)
        out.append("")
    out.append(
        f"candidates (safety margin {result.margin:.0%}; GiB; * = recommended)\n"
        f"  {'strategy':72} {'GPU pk':>7} {'phase':<10} {'host/nd':>8} {'phase':<10} {'save hst':>8} "
        f"{'verdict':<12} {'GPU mgn':>7}"
    )
    for s in result.candidates:
        out.append(_row(s, "*" if s is rec else ""))
    out.append("")
    return "\n".join(out)


def render_markdown_tables(result: PlanResult) -> str:
    """The candidates and the recommended strategy's phases as Markdown tables (after the findings)."""
    lines = ["## Candidate strategies", "", f"Safety margin {result.margin:.0%}; GiB.", ""]
    lines.append("| | strategy | GPU peak | phase | host/node | phase | verdict |")
    lines.append("|---|---|---:|---|---:|---|---|")
    for s in result.candidates:
        gpu, gph = s.gpu_peak()
        host, hph = s.host_peak()
        mark = "**recommended**" if s is result.recommended else ""
        lines.append(f"| {mark} | {s.name} | {_g(gpu)} | {gph} | {_g(host)} | {hph} | {s.status} |")
    for title, plan in (("Your configuration", result.yours), ("Recommended", result.recommended)):
        if plan is None:
            continue
        lines += [
            "",
            f"## {title}: {plan.name}",
            "",
            "| phase | GPU GiB | host GiB/node |",
            "|---|---:|---:|",
        ]
        lines += [f"| {ph.title} | {_g(ph.gpu_bytes)} | {_g(ph.host_bytes)} |" for ph in plan.phases]
    return "\n".join(lines) + "\n"
