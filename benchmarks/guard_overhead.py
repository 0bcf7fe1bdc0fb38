"""Step time of a real DeepSpeed ZeRO-3 (offload_optimizer + offload_param) run with and without the runtime
guard, in ONE run: optimizer steps alternate between the bare engine and `zerodoctor.guard.watch`'s wrapper
(every other optimizer step, so drift and neighbours' load hit both sides alike), default guard settings (a sample every step,
watchdog armed). It also times the guard's per-step work on its own (`Monitor.step_end`, thousands of calls),
which is the cost a GPU run pays regardless of its step time.

    python benchmarks/guard_overhead.py [--steps 200] [--hidden 512] [--layers 4] [--seq 256]

Runs `torchrun --nproc_per_node 1` on itself (CPU accelerator + gloo without a GPU) and prints a JSON summary.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DS = {
    "train_micro_batch_size_per_gpu": 2,
    "gradient_accumulation_steps": 1,
    "gradient_clipping": 1.0,
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
    "zero_optimization": {
        "stage": 3,
        "offload_optimizer": {"device": "cpu"},
        "offload_param": {"device": "cpu"},
    },
}


def worker(a: argparse.Namespace) -> None:
    import deepspeed
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from zerodoctor.engine.tiny_job import TINY_LLAMA, exit_without_teardown
    from zerodoctor.guard import unwatch, watch
    from zerodoctor.guard.monitor import Monitor
    from zerodoctor.guard.options import GuardOptions

    deepspeed.init_distributed()
    torch.manual_seed(0)
    cfg = {
        **TINY_LLAMA,
        "hidden_size": a.hidden,
        "intermediate_size": 4 * a.hidden,
        "num_hidden_layers": a.layers,
        "num_attention_heads": 8,
        "num_key_value_heads": 8,
        "vocab_size": 8192,
    }
    model = LlamaForCausalLM(LlamaConfig(**cfg))
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=DS)
    ids = torch.randint(0, cfg["vocab_size"], (2, a.seq))
    run_dir = Path(a.out)

    def step() -> float:
        t = time.perf_counter()
        loss = engine(input_ids=ids, labels=ids).loss
        engine.backward(loss)
        engine.step()
        return time.perf_counter() - t

    for _ in range(3):  # warm-up: first Adam allocation, CPU-Adam build
        step()
    # One watcher for the whole run; the engine's `step` alternates every optimizer step between the bare
    # method and the guard's wrapper, so neighbours' load and drift hit both sides alike (paired steps).
    w = watch(engine, run_dir=run_dir, exception_hooks=False)
    times: dict[str, list[float]] = {"bare": [], "guard": []}
    for i in range(a.steps):
        mode = "guard" if i % 2 else "bare"
        engine.__dict__["step"] = w._step if mode == "guard" else w._orig_step
        times[mode].append(step())
    engine.__dict__["step"] = w._step
    unwatch(engine)
    diffs = [g - b for b, g in zip(times["bare"], times["guard"], strict=False)]
    mon = Monitor(GuardOptions(run_dir=run_dir / "micro"), rank=0, local_rank=0, world_size=1)
    mon.train_begin()
    n = 3000
    t = time.perf_counter()
    for i in range(1, n + 1):
        mon.step_end(i)
    per_call = (time.perf_counter() - t) / n
    mon.close()
    bare, guard = statistics.median(times["bare"]), statistics.median(times["guard"])
    result = {
        "model": f"llama hidden {a.hidden}, {a.layers} layers, vocab 8192, seq {a.seq}, micro batch 2",
        "zero": "stage 3, offload_optimizer cpu, offload_param cpu",
        "steps_each": len(times["bare"]),
        "bare_median_s": round(bare, 4),
        "guard_median_s": round(guard, 4),
        "ratio_median": round(guard / bare, 4),
        "bare_mean_s": round(statistics.mean(times["bare"]), 4),
        "guard_mean_s": round(statistics.mean(times["guard"]), 4),
        "ratio_mean": round(statistics.mean(times["guard"]) / statistics.mean(times["bare"]), 4),
        "paired_median_diff_s": round(statistics.median(diffs), 5),
        "ratio_paired": round(1 + statistics.median(diffs) / bare, 4),
        "guard_step_end_us": round(per_call * 1e6, 1),
        "guard_share_of_step": round(per_call / bare, 6),
    }
    (run_dir / "result.json").write_text(json.dumps(result, indent=1))
    exit_without_teardown(0)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=200, help="optimizer steps, alternating bare / guarded")
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        worker(a)
        return 0
    from zerodoctor.engine.launch import _free_port

    out = Path(tempfile.mkdtemp(prefix="zd-guard-bench-"))
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "1",
        "--master_port",
        str(_free_port()),
        __file__,
        "--worker",
        "--out",
        str(out),
        "--steps",
        str(a.steps),
        "--hidden",
        str(a.hidden),
        "--layers",
        str(a.layers),
        "--seq",
        str(a.seq),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    res = out / "result.json"
    if not res.exists():
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-3000:])
        return 1
    print(res.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
