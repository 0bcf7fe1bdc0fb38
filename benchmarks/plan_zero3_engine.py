"""ZeRO-3 runtime items of the planner against the real DeepSpeed engine (CPU accelerator, gloo, 2 ranks).

What a CPU run can show of what a GPU run spends beyond model states:

* the fetched-parameter working set: during forward and backward, the elements of parameters DeepSpeed
  holds whole or is gathering (`ds_status` AVAILABLE or INFLIGHT: an in-flight all-gather has its buffer
  already; not persistent), sampled before and after every module's forward and at every gradient hook, for
  a grid of `stage3_max_live_parameters`, `stage3_max_reuse_distance`, `stage3_prefetch_bucket_size` and
  gradient checkpointing -- against `phases.zero3_working_set_numel`;
* the same on a Llama proportioned like Llama-3-8B (`PROPORTIONED`: embedding and head 2.4 decoder layers
  each, GQA 4:1, HF "auto" prefetch / persistence / bucket from its hidden size, max_live and max_reuse at
  1e9 x its layer / Llama-3-8B's layer), with ZeRO-3 + both offloads and checkpointing, three steps: the
  prefetch loop overshoots max_live by the parameter that crosses it (the head);
* the persistent parameters (`ds_persist`) against the planner's per-parameter threshold rule;
* host memory per rank (psutil RSS) from before `deepspeed.initialize` to after the first optimizer step,
  for ZeRO-3 with both offloads, against the planner's offloaded model states per rank (on CPU nothing is
  page-locked, so PyTorch's pinned power-of-two rounding is not part of this measurement).

    python benchmarks/plan_zero3_engine.py            # markdown rows
    torchrun ... benchmarks/plan_zero3_engine.py --worker OUT_DIR   (internal)
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
SMALL = {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 8, "num_attention_heads": 4,
         "num_key_value_heads": 4, "vocab_size": 1000}  # fmt: skip
HOST = {"hidden_size": 512, "intermediate_size": 1376, "num_hidden_layers": 4, "num_attention_heads": 8,
        "num_key_value_heads": 8, "vocab_size": 32000}  # fmt: skip
COMMON = {"model_type": "llama", "max_position_embeddings": 64, "tie_word_embeddings": False}
PROPORTIONED = {"hidden_size": 256, "intermediate_size": 896, "num_hidden_layers": 8, "num_attention_heads": 8,
                "num_key_value_heads": 2, "vocab_size": 8000}  # fmt: skip
LLAMA3_8B_LAYER = 218_103_808
"""Parameters of one Llama-3-8B decoder layer (4096 hidden, 14336 intermediate, 8 of 32 heads for k/v)."""

# (max_live, max_reuse, prefetch_bucket, persistence_threshold, gradient_checkpointing)
GRID = [
    (0, 0, 0, 0, False),
    (0, 400_000, 0, 0, False),
    (0, 800_000, 0, 0, False),
    (0, 1_600_000, 0, 0, False),
    (0, 800_000, 0, 0, True),
    (0, 1_600_000, 0, 0, True),
    (300_000, 0, 100_000, 0, False),
    (10**9, 10**9, 50_000_000, 100_000, False),
    (10**9, 10**9, 50_000_000, 1_000, True),
]
QUICK = [GRID[0], GRID[5], GRID[8]]


def _ds_config(max_live: int, max_reuse: int, prefetch: int, persist: int, offload: bool) -> dict[str, Any]:
    zero: dict[str, Any] = {
        "stage": 3,
        "stage3_max_live_parameters": max_live,
        "stage3_max_reuse_distance": max_reuse,
        "stage3_prefetch_bucket_size": prefetch,
        "stage3_param_persistence_threshold": persist,
        "reduce_bucket_size": 100_000,
    }
    if offload:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    return {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "bf16": {"enabled": True},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
        "zero_optimization": zero,
    }


def _working_set(grid: tuple[int, int, int, int, bool]) -> dict[str, Any]:
    import deepspeed
    import torch
    from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus
    from transformers import LlamaConfig, LlamaForCausalLM

    max_live, max_reuse, prefetch, persist, ckpt = grid
    cfg = _ds_config(max_live, max_reuse, prefetch, persist, offload=False)
    with deepspeed.zero.Init(config_dict_or_path=cfg):
        model = LlamaForCausalLM(LlamaConfig(**COMMON, **SMALL))
    if ckpt:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    params = list(model.parameters())
    peak = {"forward": 0, "backward": 0}
    phase = ["forward"]

    held = (ZeroParamStatus.AVAILABLE, ZeroParamStatus.INFLIGHT)

    def sample() -> None:
        n = sum(p.ds_numel for p in params if p.ds_status in held and not p.ds_persist)
        peak[phase[0]] = max(peak[phase[0]], n)

    for m in model.modules():  # registered before DeepSpeed's hooks: runs before its release
        m.register_forward_hook(lambda *a: sample())
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=params, config=cfg)
    for p in params:
        p.register_hook(lambda g: (sample(), g)[1])
    gen = torch.Generator().manual_seed(0)
    for _ in range(2):  # the second step runs on a complete trace (reuse-distance decisions apply)
        ids = torch.randint(0, SMALL["vocab_size"], (1, 16), generator=gen)
        phase[0] = "forward"
        loss = engine(input_ids=ids, labels=ids).loss
        phase[0] = "backward"
        engine.backward(loss)
        engine.step()
    out = {
        "grid": list(grid),
        "total": sum(p.ds_numel for p in params),
        "largest_module": max(sum(p.ds_numel for p in m.parameters(recurse=False)) for m in model.modules()),
        "persistent": sum(p.ds_numel for p in params if p.ds_persist),
        **peak,
    }
    engine.destroy()
    return out


PROPORTIONED_VARIANTS = [(8000, 1.0), (8000, 0.5), (2000, 1.0)]
"""(vocabulary, max_live as a fraction of the scaled 1e9) of the full run; `--quick` runs the first."""


def proportioned_knobs(live_scale: float = 1.0) -> dict[str, int]:
    """HF "auto" values from the hidden size; max_live and max_reuse scaled from 1e9 by the layer size (max_live
    further by `live_scale`)."""
    h, i = PROPORTIONED["hidden_size"], PROPORTIONED["intermediate_size"]
    kv = h * PROPORTIONED["num_key_value_heads"] // PROPORTIONED["num_attention_heads"]
    layer = 2 * h * h + 2 * h * kv + 3 * h * i
    window = 10**9 * layer // LLAMA3_8B_LAYER
    return {"max_live": int(window * live_scale), "max_reuse": window, "prefetch": int(0.9 * h * h),
            "persistence": 10 * h, "bucket": h * h, "layer": layer}  # fmt: skip


def _proportioned_working_set(vocab: int, live_scale: float, steps: int = 3) -> dict[str, Any]:
    import deepspeed
    import torch
    from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus
    from transformers import LlamaConfig, LlamaForCausalLM

    k = proportioned_knobs(live_scale)
    cfg = _ds_config(k["max_live"], k["max_reuse"], k["prefetch"], k["persistence"], offload=True)
    cfg["zero_optimization"]["reduce_bucket_size"] = k["bucket"]
    with deepspeed.zero.Init(config_dict_or_path=cfg):
        model = LlamaForCausalLM(LlamaConfig(**COMMON, **{**PROPORTIONED, "vocab_size": vocab}))
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    params = list(model.parameters())
    held = (ZeroParamStatus.AVAILABLE, ZeroParamStatus.INFLIGHT)
    peaks = [0] * steps
    step = [0]

    def sample() -> None:
        n = sum(p.ds_numel for p in params if p.ds_status in held and not p.ds_persist)
        peaks[step[0]] = max(peaks[step[0]], n)

    for m in model.modules():  # before DeepSpeed's own hooks: before its fetch and before its release
        m.register_forward_pre_hook(lambda *a: sample())
        m.register_forward_hook(lambda *a: sample())
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=params, config=cfg)
    for p in params:
        p.register_hook(lambda g: (sample(), g)[1])
    gen = torch.Generator().manual_seed(0)
    for s in range(steps):
        step[0] = s
        ids = torch.randint(0, vocab, (1, 16), generator=gen)
        engine.backward(engine(input_ids=ids, labels=ids).loss)
        engine.step()
    out = {
        **k,
        "vocab": vocab,
        "total": sum(p.ds_numel for p in params),
        "persistent": sum(p.ds_numel for p in params if p.ds_persist),
        "largest_module": max(sum(p.ds_numel for p in m.parameters(recurse=False)) for m in model.modules()),
        "largest_param": max(p.ds_numel for p in params),
        "first_step": peaks[0],
        "later_steps": max(peaks[1:]),
    }
    engine.destroy()
    return out


def _host(offload: bool) -> dict[str, Any]:
    import gc

    import deepspeed
    import psutil
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    gc.collect()
    proc = psutil.Process()
    before = proc.memory_info().rss
    cfg = _ds_config(10**9, 10**9, 50_000_000, 0, offload=offload)
    with deepspeed.zero.Init(config_dict_or_path=cfg):
        model = LlamaForCausalLM(LlamaConfig(**COMMON, **HOST))
    total = sum(p.ds_numel for p in model.parameters())
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    after_init = proc.memory_info().rss
    ids = torch.randint(0, HOST["vocab_size"], (1, 16))
    engine.backward(engine(input_ids=ids, labels=ids).loss)
    engine.step()
    gc.collect()
    after_step = proc.memory_info().rss
    # The save path: what HF Trainer's save_model does under ZeRO-3 with stage3_gather_16bit_weights_on_model_save
    # (engine._zero3_consolidated_16bit_state_dict): every module gathered in turn, rank 0 keeps a CPU copy.
    state = engine._zero3_consolidated_16bit_state_dict()
    after_gather = proc.memory_info().rss
    held = sum(t.numel() * t.element_size() for t in state.values()) if state else 0
    del state
    engine.destroy()
    return {
        "offload": offload,
        "total": total,
        "before": before,
        "after_init": after_init,
        "after_step": after_step,
        "after_gather": after_gather,
        "state_dict_bytes": held,
    }


def worker(out_dir: Path, quick: bool) -> int:
    import deepspeed

    deepspeed.init_distributed()
    rank = int(os.environ.get("RANK", "0"))
    res = {
        "working_set": [_working_set(g) for g in (QUICK if quick else GRID)],
        "proportioned": [
            _proportioned_working_set(v, scale) for v, scale in PROPORTIONED_VARIANTS[: 1 if quick else None]
        ],
        "host": [_host(True)],
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"rank{rank}.json").write_text(json.dumps(res))
    sys.stdout.flush()
    os._exit(0)  # skip interpreter teardown (gloo/cpu_adam threads; src/zerodoctor/engine/tiny_job.py)


def launch(*, quick: bool = False, timeout_s: int = 900) -> list[dict[str, Any]]:
    work = Path(tempfile.mkdtemp(prefix="zd-z3-engine-"))
    out = work / "out"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu", "TOKENIZERS_PARALLELISM": "false"}
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(port),
           str(HERE), "--worker", str(out)] + (["--quick"] if quick else [])  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env, cwd=work)
    files = sorted(out.glob("rank*.json")) if out.exists() else []
    if proc.returncode != 0 or len(files) != 2:
        raise RuntimeError(
            f"torchrun failed (rc {proc.returncode}):\n{proc.stdout[-2000:]}{proc.stderr[-4000:]}"
        )
    return [json.loads(f.read_text()) for f in files]


def compare(ranks: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Predicted vs measured, per grid point (rank 0; ranks agree) and per rank for host memory."""
    from pathlib import Path as _P

    from zerodoctor.models import model_from_config
    from zerodoctor.plan import model_states as ms
    from zerodoctor.plan.inputs import Cluster, PlanInputs, Training
    from zerodoctor.plan.phases import _persistent_params, zero3_working_set_numel

    spec = model_from_config({**COMMON, **SMALL}, name="tiny", source=_P("tiny.json"))
    cluster = Cluster(nodes=1, gpus_per_node=2, gpu_memory_bytes=1, host_ram_bytes=1)
    rows = []
    for r in ranks[0]["working_set"]:
        max_live, max_reuse, prefetch, persist, ckpt = r["grid"]
        persistent = _persistent_params(PlanInputs(spec, cluster, Training()), persist)
        predicted = zero3_working_set_numel(
            partitioned=spec.params.total - persistent,
            largest_module=spec.params.largest_module_numel,
            max_live=max_live,
            max_reuse=max_reuse,
            prefetch_bucket=prefetch,
            gradient_checkpointing=ckpt,
            largest_param=spec.params.embedding,
        )
        measured = max(r["forward"], r["backward"])
        rows.append({**r, "measured": measured, "predicted": predicted, "persistent_predicted": persistent,
                     "error": (predicted - measured) / measured})  # fmt: skip
    host = []
    for rank, res in enumerate(ranks):
        for h in res["host"]:
            comps = ms.model_state_components(
                trainable=h["total"], frozen=0, stage=3, world_size=2, offload_optimizer="cpu",
                offload_param="cpu", param_bytes=2, pin_memory=True,
            )  # fmt: skip
            predicted = sum(c.bytes for c in comps if c.device == ms.HOST)
            measured = h["after_step"] - h["before"]
            host.append({"rank": rank, "predicted": predicted, "measured": measured,
                         "error": (predicted - measured) / measured,
                         "save_growth": h["after_gather"] - h["after_step"],
                         "save_predicted": 2 * h["total"] if rank == 0 else 0,
                         "state_dict_bytes": h["state_dict_bytes"]})  # fmt: skip
    proportioned = []
    for pr in ranks[0]["proportioned"]:
        pspec = model_from_config(
            {**COMMON, **PROPORTIONED, "vocab_size": pr["vocab"]}, name="proportioned", source=_P("p.json")
        )
        ppersist = _persistent_params(PlanInputs(pspec, cluster, Training()), pr["persistence"])
        knobs = {"partitioned": pspec.params.total - ppersist, "largest_module": pspec.params.largest_module_numel,
                 "max_live": pr["max_live"], "max_reuse": pr["max_reuse"], "prefetch_bucket": pr["prefetch"],
                 "gradient_checkpointing": True}  # fmt: skip
        proportioned.append({
            **pr,
            "persistent_predicted": ppersist,
            "predicted": zero3_working_set_numel(**knobs, largest_param=pspec.params.embedding),
            "predicted_without_overshoot": zero3_working_set_numel(**knobs),  # type: ignore[arg-type]
        })  # fmt: skip
    return {"working_set": rows, "host": host, "proportioned": proportioned}


def markdown(cmp: dict[str, list[dict[str, Any]]]) -> str:
    lines = [
        "| max_live | max_reuse | prefetch | persistence | ckpt | measured (fwd / bwd) | predicted | error | "
        "persistent measured / predicted |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in cmp["working_set"]:
        ml, mr, pf, ps, ck = r["grid"]
        lines.append(
            f"| {ml:,} | {mr:,} | {pf:,} | {ps:,} | {'on' if ck else 'off'} | {r['forward']:,} / {r['backward']:,} "
            f"| {r['predicted']:,} | {r['error'] * 100:+.1f} % | {r['persistent']:,} / {r['persistent_predicted']:,} |"
        )
    if cmp.get("proportioned"):
        lines += [
            "",
            "| Llama proportioned like Llama-3-8B, ZeRO-3 + both offloads: max_live / vocabulary | decoder layer / "
            "head / model | measured: first step / later steps | predicted: max_live + largest parameter / "
            "max_live only |",
            "|---|---|---|---|",
        ]
    for r in cmp.get("proportioned", []):
        lines.append(
            f"| {r['max_live']:,} / {r['vocab']:,} | {r['layer']:,} / {r['largest_param']:,} / {r['total']:,} | "
            f"{r['first_step']:,} / {r['later_steps']:,} | {r['predicted']:,} / {r['predicted_without_overshoot']:,} |"
        )
    lines += ["", "| rank | host RSS growth, init to after first step | predicted offloaded states | error | "
              "16-bit gather for save: RSS growth / state dict held / predicted |", "|---|---|---|---|---|"]  # fmt: skip
    for h in cmp["host"]:
        lines.append(f"| {h['rank']} | {h['measured'] / 2**20:.1f} MiB | {h['predicted'] / 2**20:.1f} MiB | "
                     f"{h['error'] * 100:+.1f} % | {h['save_growth'] / 2**20:.1f} / "
                     f"{h['state_dict_bytes'] / 2**20:.1f} / {h['save_predicted'] / 2**20:.1f} MiB |")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", type=Path)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    if args.worker:
        return worker(args.worker, args.quick)
    sys.stdout.write(markdown(compare(launch(quick=args.quick))) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
