"""Step time of a real DeepSpeed ZeRO-3 run with and without the runtime guard, measured so that a noisy
machine (2 cores shared with other jobs) cannot fake a result either way:

* one process, one engine; optimizer steps are interleaved in ABBA blocks (bare, guarded, guarded, bare), so
  a linear drift and a neighbour's burst hit both sides alike; many repeats, medians, and the median of the
  per-block ratios (each block compares steps taken seconds apart);
* wall time and the process's CPU time per step (CPU time does not count the time a neighbour holds the core);
* the guard's own per-step cost measured directly inside the same run: every `Monitor.step_end` call of the
  guarded steps is timed, and the overhead is that cost over the bare step's median (the estimate the noisy
  side-by-side ratio cannot resolve to 1 %); plus `Monitor.step_end` timed alone over thousands of calls.

Default guard settings (a sample every optimizer step, watchdog armed, train-begin checks).

    python benchmarks/guard_overhead.py [--steps 200] [--hidden 256] [--layers 2] [--seq 128] [--offload both|none]

Runs `torchrun --nproc_per_node 1` on itself (CPU accelerator + gloo without a GPU; on a GPU machine the engine
is on the GPU, and each timed step ends with a device synchronize of the benchmark's own) and prints a JSON
summary.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def ds_config(offload: str) -> dict[str, Any]:
    zero: dict[str, Any] = {"stage": 3}
    if offload == "both":
        zero |= {"offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}}
    return {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 1.0,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
        "zero_optimization": zero,
    }


def _ci_median(xs: list[float], *, n: int = 2000, seed: int = 0) -> tuple[float, float]:
    """95 % bootstrap interval of the median."""
    rng = random.Random(seed)
    meds = sorted(statistics.median(rng.choices(xs, k=len(xs))) for _ in range(n))
    return meds[int(0.025 * n)], meds[int(0.975 * n) - 1]


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
    engine, *_ = deepspeed.initialize(
        model=model, model_parameters=model.parameters(), config=ds_config(a.offload)
    )
    ids = torch.randint(0, cfg["vocab_size"], (2, a.seq)).to(engine.device)
    cuda = torch.cuda.is_available()
    run_dir = Path(a.out)

    def step() -> tuple[float, float]:
        t, c = time.perf_counter(), time.process_time()
        loss = engine(input_ids=ids, labels=ids).loss
        engine.backward(loss)
        engine.step()
        if cuda:
            torch.cuda.synchronize()  # the benchmark's, so a step's time is its work; the guard never syncs
        return time.perf_counter() - t, time.process_time() - c

    for _ in range(3):  # warm-up: first Adam allocation, CPU-Adam build
        step()
    # One watcher for the whole run; the engine's `step` switches between the bare method and the guard's
    # wrapper in ABBA blocks. The guard's own per-step work is timed inside the guarded steps.
    w = watch(engine, run_dir=run_dir, exception_hooks=False)
    bare_step = w._orig_step
    inner = [0.0]
    own: list[float] = []  # the wrapper's time minus the engine's own step: everything the guard adds

    def timed_bare_step(*args: Any, **kwargs: Any) -> Any:
        t = time.perf_counter()
        out = bare_step(*args, **kwargs)
        inner[0] = time.perf_counter() - t
        return out

    def guarded_step(*args: Any, **kwargs: Any) -> Any:
        t = time.perf_counter()
        out = w._step(*args, **kwargs)
        own.append(time.perf_counter() - t - inner[0])
        return out

    w._orig_step = timed_bare_step
    wall: dict[str, list[float]] = {"bare": [], "guard": []}
    cpu: dict[str, list[float]] = {"bare": [], "guard": []}
    block_ratios: list[float] = []
    blocks = max(a.steps // 4, 1)
    for _ in range(blocks):
        got: dict[str, float] = {"bare": 0.0, "guard": 0.0}
        for mode in ("bare", "guard", "guard", "bare"):
            engine.__dict__["step"] = guarded_step if mode == "guard" else bare_step
            dt, dc = step()
            wall[mode].append(dt)
            cpu[mode].append(dc)
            got[mode] += dt
        block_ratios.append(got["guard"] / got["bare"])
    w._orig_step = bare_step
    engine.__dict__["step"] = w._step
    unwatch(engine)
    micro = Monitor(GuardOptions(run_dir=run_dir / "micro"), rank=0, local_rank=0, world_size=1)
    micro.train_begin()
    n = 3000
    t = time.perf_counter()
    for i in range(1, n + 1):
        micro.step_end(i)
    per_call = (time.perf_counter() - t) / n
    micro.close()
    bare, guard = statistics.median(wall["bare"]), statistics.median(wall["guard"])
    cbare, cguard = statistics.median(cpu["bare"]), statistics.median(cpu["guard"])
    own_med = statistics.median(own) if own else 0.0
    lo, hi = _ci_median(block_ratios)
    result = {
        "device": str(engine.device),
        "model": f"llama hidden {a.hidden}, {a.layers} layers, vocab 8192, seq {a.seq}, micro batch 2",
        "zero": "stage 3" + (", offload_optimizer cpu, offload_param cpu" if a.offload == "both" else ""),
        "order": "ABBA blocks (bare, guarded, guarded, bare)",
        "blocks": blocks,
        "steps_each": len(wall["bare"]),
        "bare_median_s": round(bare, 4),
        "guard_median_s": round(guard, 4),
        "ratio_median_wall": round(guard / bare, 4),
        "ratio_median_cpu": round(cguard / cbare, 4),
        "ratio_block_median": round(statistics.median(block_ratios), 4),
        "ratio_block_median_ci95": [round(lo, 4), round(hi, 4)],
        "guard_own_per_step_median_us": round(own_med * 1e6, 1),
        "guard_own_per_step_max_us": round(max(own) * 1e6, 1) if own else None,
        "guard_own_calls": len(own),
        "ratio_direct": round(1 + own_med / bare, 6),
        "guard_step_end_alone_us": round(per_call * 1e6, 1),
    }
    (run_dir / "result.json").write_text(json.dumps(result, indent=1))
    exit_without_teardown(0)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=200, help="optimizer steps, in ABBA blocks of 4")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument(
        "--offload", choices=["both", "none"], default="both", help="ZeRO-3 offload of optimizer+params"
    )
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        worker(a)
        return 0
    from zerodoctor.engine.launch import torchrun_command

    out = Path(tempfile.mkdtemp(prefix="zd-guard-bench-"))
    cmd = torchrun_command([
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
        "--offload",
        a.offload,
    ], 1)
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
