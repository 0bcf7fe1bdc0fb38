"""The planner's per-phase prediction beside what the runtime guard measured, on the real engine on CPU.

One HF Trainer run under DeepSpeed ZeRO-3 with offload_optimizer and offload_param (CPU accelerator, gloo, 2 ranks
under torchrun), a Llama built from a config (random weights, fp32: DeepSpeed's CPU accelerator trains in fp32
here), `ZeroDoctorCallback` attached with its defaults. The guard asks the planner for this run's per-phase
prediction (the model's config, the engine's final DeepSpeed config, the world size) and records, at each phase,
this rank's measurement beside it (`gap` records): load (the train-begin sample, after the engine was built),
first optimizer step, a steady step, every checkpoint save. This script reads those records back and prints
both, per rank and per node.

What CPU can show is host memory only: each rank's RSS and its high-water mark (the kernel's maxrss, never reset).
There is no GPU here, so the GPU side of the prediction is not compared (the guard records no GPU figure on a
CPU run). The planner's host figure per node includes a fixed per-rank process baseline (Python + torch +
CUDA context + NCCL host buffers on a GPU node); the measured RSS at process start (after the imports, before the
model exists) is recorded too, so the model-state part of the prediction can be compared with what each rank
added above its own start.

    python benchmarks/guard_prediction.py [--hidden 512] [--layers 4] [--vocab 16000] [--seq 128] [--steps 8]
                                          [--save-steps 4] [--out DIR] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

GIB = 1 << 30
MIB = 1 << 20
PHASES = ("load", "first_step", "steady", "save")


def ds_config() -> dict[str, Any]:
    return {
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": 1.0,
        "zero_optimization": {
            "stage": 3,
            "offload_optimizer": {"device": "cpu", "pin_memory": True},
            "offload_param": {"device": "cpu", "pin_memory": True},
            "stage3_gather_16bit_weights_on_model_save": True,
        },
    }


def model_config(a: argparse.Namespace) -> dict[str, Any]:
    return {
        "hidden_size": a.hidden,
        "intermediate_size": int(a.hidden * 2.6875),  # Llama's 11008 / 4096
        "num_hidden_layers": a.layers,
        "num_attention_heads": 8,
        "num_key_value_heads": 8,
        "vocab_size": a.vocab,
        "max_position_embeddings": max(a.seq, 256),
        "tie_word_embeddings": False,
    }


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def worker(a: argparse.Namespace) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

    from zerodoctor.engine.tiny_job import exit_without_teardown
    from zerodoctor.guard import ZeroDoctorCallback

    rss_start = _rss()  # torch, transformers (and DeepSpeed through them) imported; no model yet
    rank = int(os.environ.get("RANK", "0"))
    out = Path(a.out)
    args = TrainingArguments(
        output_dir=str(out),
        deepspeed=ds_config(),
        per_device_train_batch_size=2,
        gradient_accumulation_steps=1,
        max_steps=a.steps,
        save_steps=a.save_steps,
        save_strategy="steps",
        logging_steps=max(a.steps // 4, 1),
        learning_rate=1e-4,
        report_to=[],
        use_cpu=True,
        dataloader_num_workers=0,
        save_total_limit=1,
        disable_tqdm=True,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**model_config(a)))
    ids = torch.randint(0, a.vocab, (4 * a.steps, a.seq), generator=torch.Generator().manual_seed(rank))
    data = [{"input_ids": x, "labels": x} for x in ids]
    trainer = Trainer(model=model, args=args, train_dataset=data)
    ZeroDoctorCallback.attach(trainer, run_dir=str(out))
    trainer.train()
    (out / f"bench_rank{rank}.json").write_text(
        json.dumps(
            {
                "rank": rank,
                "rss_start": rss_start,
                "params": sum(
                    p.ds_numel if hasattr(p, "ds_numel") else p.numel() for p in model.parameters()
                ),
                "global_step": trainer.state.global_step,
            }
        )
    )
    exit_without_teardown(0)


GPU_ONLY_ITEMS = ("CUDA context", "NCCL buffers", "allocator reserved but unallocated")
"""The planner's per-GPU items that do not exist on the CPU accelerator."""
IPG_BUCKET_ITEM = "model states: ipg_bucket"


def device_items_on_cpu(out: Path, world: int, params: int, seq: int) -> dict[str, dict[str, int]]:
    """The planner's per-GPU model items, asked with the guard's own files as if on an 80 GiB GPU: on the CPU
    accelerator the "device" is host memory, so these are resident in the ranks' RSS too. The IPG bucket is
    `torch.empty(reduce_bucket_size)` (stage3.py): on a GPU all of it is committed, on the host only the pages
    gradients touch, at most the model's numel (fp32 here)."""
    from zerodoctor.guard.prediction import predict_for_run

    d = out / "zerodoctor"
    pred = predict_for_run(
        guard_dir=Path(tempfile.mkdtemp(prefix="zd-pred-")),
        model_config=json.loads((d / "model_config.json").read_text()),
        ds_config=json.loads((d / "ds_config.live.json").read_text()),
        world_size=world,
        gpus_per_node=world,
        gpu_memory_bytes=80 * GIB,
        host_ram_bytes=1024 * GIB,
        seq_len=seq,
    )
    res: dict[str, dict[str, int]] = {}
    for phase, p in pred["phases"].items():
        items = {k: v for k, v in p["gpu_items"].items() if k not in GPU_ONLY_ITEMS and v}
        if IPG_BUCKET_ITEM in items:
            items[IPG_BUCKET_ITEM] = min(items[IPG_BUCKET_ITEM], 4 * params)
        res[phase] = items
    return res


def analyse(out: Path, seq: int) -> dict[str, Any]:
    """Prediction and measurement per phase from the guard's records (read with the report's reader)."""
    from zerodoctor.report.run_report import load_run

    report = load_run(out)
    pred = report.prediction or {}
    if not pred.get("available"):
        raise SystemExit(f"no prediction recorded: {pred.get('reason')}")
    bench = {
        int(b["rank"]): b for b in (json.loads(p.read_text()) for p in sorted(out.glob("bench_rank*.json")))
    }
    ranks = sorted(bench)
    per_node_ranks = int(pred.get("ranks_per_node") or len(ranks))
    device = device_items_on_cpu(out, len(ranks), int(bench[ranks[0]]["params"]), seq)
    rows = []
    so_far = 0  # the RSS high-water mark never resets: hold it against the largest phase the run went through
    for phase in PHASES:
        p = pred["phases"][phase]
        baseline = int(p["host_items"].get("process baseline", 0))
        gaps = {r: [g for g in report.gaps if g.get("rank") == r and g.get("phase") == phase] for r in ranks}
        # a phase seen several times (every save) is taken at its highest measurement
        worst = {r: max(gs, key=lambda g: g["measured_rss_peak"]) for r, gs in gaps.items() if gs}
        if len(worst) != len(ranks):
            continue
        rss = {r: int(worst[r]["measured_rss"]) for r in ranks}
        peak = {r: int(worst[r]["measured_rss_peak"]) for r in ranks}
        above = {r: peak[r] - int(bench[r]["rss_start"]) for r in ranks}
        predicted = int(p["host_bytes_per_node"])
        model_part = predicted - baseline
        cpu_visible = model_part + per_node_ranks * sum(device[phase].values())
        # the first optimizer step comes after a forward and backward: the steady items are in its peak too
        steady = pred["phases"]["steady"]
        steady_visible = int(steady["host_bytes_per_node"]) - int(
            steady["host_items"].get("process baseline", 0)
        )
        steady_visible += per_node_ranks * sum(device["steady"].values())
        so_far = max(so_far, cpu_visible, steady_visible if phase != "load" else 0)
        rows.append(
            {
                "phase": phase,
                "step": max(int(worst[r]["step"]) for r in ranks),
                "predicted_host_node": predicted,
                "predicted_baseline_node": baseline,
                "predicted_model_state_node": model_part,
                "predicted_items": {k: v for k, v in p["host_items"].items() if v},
                "measured_rss": rss,
                "measured_rss_peak": peak,
                "measured_peak_node": sum(peak.values()),
                "measured_above_start_node": sum(above.values()),
                "gap_total": sum(peak.values()) / predicted - 1 if predicted else None,
                "gap_model_state": sum(above.values()) / model_part - 1 if model_part > 0 else None,
                "predicted_device_items_per_rank": device[phase],
                "predicted_cpu_visible_node": cpu_visible,
                "predicted_cpu_visible_so_far_node": so_far,
                "gap_cpu_visible_so_far": sum(above.values()) / so_far - 1 if so_far > 0 else None,
            }
        )
    findings = [
        {"id": f.id, "message": f.message}
        for f in report.findings
        if f.id in ("guard.host-above-prediction", "guard.gpu-above-prediction")
    ]
    return {
        "strategy": pred.get("strategy"),
        "ranks_per_node": per_node_ranks,
        "params": bench[ranks[0]]["params"],
        "rss_start": {r: int(bench[r]["rss_start"]) for r in ranks},
        "has_gpu": report.has_gpu,
        "phases": rows,
        "guard_findings": findings,
        "steps": bench[ranks[0]]["global_step"],
    }


def _mib(n: int) -> str:
    return f"{n / MIB:,.0f}"


def markdown(res: dict[str, Any]) -> str:
    ranks = sorted(res["rss_start"])
    head = (
        "| phase (step) | predicted host / node: total = baseline + model states (MiB) | "
        + " | ".join(f"rank {r} RSS / peak (MiB)" for r in ranks)
        + " | measured peak / node | gap (total) | measured above start / node | gap (model states) |"
        + " predicted model states + device items (CPU), largest phase so far | gap |"
    )
    lines = [head, "|" + "---|" * (8 + len(ranks))]
    for row in res["phases"]:
        lines.append(
            f"| {row['phase']} ({row['step']}) | {_mib(row['predicted_host_node'])} = "
            f"{_mib(row['predicted_baseline_node'])} + {_mib(row['predicted_model_state_node'])} | "
            + " | ".join(
                f"{_mib(row['measured_rss'][r])} / {_mib(row['measured_rss_peak'][r])}" for r in ranks
            )
            + f" | {_mib(row['measured_peak_node'])} | {row['gap_total']:+.0%} | "
            f"{_mib(row['measured_above_start_node'])} | "
            + (f"{row['gap_model_state']:+.0%}" if row["gap_model_state"] is not None else "-")
            + f" | {_mib(row['predicted_cpu_visible_so_far_node'])} | "
            + (f"{row['gap_cpu_visible_so_far']:+.0%}" if row["gap_cpu_visible_so_far"] is not None else "-")
            + " |"
        )
    return "\n".join(lines)


def main() -> int:
    from zerodoctor.engine.launch import torchrun_command

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=16000)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--save-steps", type=int, default=4)
    ap.add_argument("--out", help="run directory (default: a new temporary one)")
    ap.add_argument("--json", help="also write the result here")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        worker(a)
        return 0
    out = Path(a.out) if a.out else Path(tempfile.mkdtemp(prefix="zd-guard-pred-")) / "run"
    out.mkdir(parents=True, exist_ok=True)
    flags = [
        "--hidden",
        str(a.hidden),
        "--layers",
        str(a.layers),
        "--vocab",
        str(a.vocab),
        "--seq",
        str(a.seq),
    ]
    flags += ["--steps", str(a.steps), "--save-steps", str(a.save_steps), "--out", str(out)]
    cmd = torchrun_command([str(Path(__file__).resolve()), "--worker", *flags], 2)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1200)
    if proc.returncode != 0:
        sys.stderr.write((proc.stdout + proc.stderr)[-6000:])
        return proc.returncode
    res = {"run_dir": str(out), "config": model_config(a), "ds_config": ds_config(), **analyse(out, a.seq)}
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))
    print(json.dumps({k: v for k, v in res.items() if k != "phases"}, indent=1))
    print(markdown(res))
    for row in res["phases"]:
        items = ", ".join(f"{k} {_mib(v)}" for k, v in row["predicted_items"].items())
        dev = ", ".join(f"{k} {_mib(v)}" for k, v in row["predicted_device_items_per_rank"].items())
        print(f"  {row['phase']}: predicted host items (MiB per node): {items}")
        print(f"  {row['phase']}: predicted device items (MiB per rank, resident on the host here): {dev}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
