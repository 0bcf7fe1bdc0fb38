"""Text, Markdown and JSON renderings of a memory plan (`zerodoctor plan`). One unit throughout: GiB (2**30)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from zerodoctor.plan.candidates import PlanResult
    from zerodoctor.plan.phases import StrategyPlan


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


def _row(s: StrategyPlan, mark: str, width: int) -> str:
    gpu, gph = s.gpu_peak()
    host, hph = s.host_peak()
    save = s.phase("save")
    margin = (s.cluster.gpu_memory_bytes - gpu) / 2**30
    return (
        f"{mark:1} {s.name:{width}} {_g(gpu):>7} {gph:<10} {_g(host):>8} {hph:<10} "
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
        f"  checkpoint on disk: {_g(ck.full_bytes)} GiB ({ck.weights_kind} {_g(ck.weights_bytes)} GiB + "
        f"optimizer state {_g(ck.optimizer_bytes)} GiB); with save_only_model: "
        f"{_g(ck.save_only_model_bytes)} GiB"
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
    width = max((len(s.name) for s in result.candidates), default=8)  # whole names, never cut
    out.append(
        f"candidates (safety margin {result.margin:.0%}; GiB; * = recommended)\n"
        f"  {'strategy':{width}} {'GPU pk':>7} {'phase':<10} {'host/nd':>8} {'phase':<10} {'save hst':>8} "
        f"{'verdict':<12} {'GPU mgn':>7}"
    )
    for s in result.candidates:
        out.append(_row(s, "*" if s is rec else "", width))
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
