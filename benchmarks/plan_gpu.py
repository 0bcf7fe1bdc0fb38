"""The planner's per-phase GPU and host prediction against a real DeepSpeed run on one GPU.

Each case builds a catalog model (0.5B-3B) from its config with random weights, runs it under the case's ZeRO
stage and offload with synthetic full-length sequences on the real engine (nccl, one rank), and records per phase:

* `torch.cuda.max_memory_allocated` and `max_memory_reserved` (peaks reset and the allocator's cache emptied at
  each phase boundary, so a phase's reserved peak is its own; with `--keep-cache` the cache is kept, as a real
  training run keeps it (`allocator.RUN_KEEPS_CACHE`), so a phase's reserved peak is the run's so far: what
  ms-swift's `memory(GiB)` log and an OOM message read),
* the memory outside PyTorch's allocator at the phase's end (device total - free - reserved: CUDA context,
  cuBLAS workspaces, NCCL),
* the device-level used memory (NVML total - free, sampled every 2 ms by a thread: what nvidia-smi and an OOM
  see, including the CUDA context, NCCL and anything outside PyTorch's allocator),
* the process's host RSS peak (same sampler).

Phases, as the planner names them: `load` (model build, zero.Init for ZeRO-3, `deepspeed.initialize`),
`first_step` (the first `engine.step()`, where the optimizer states are allocated), `steady` (forward, backward and
step of steps 2..N), `save` (`engine.save_checkpoint`).

The measurement needs a GPU and runs on one (`--measure OUT.json`); the table compares those measurements with
the planner's prediction computed from the case's own description on any machine (`--table OUT.json`), so a
planner change is re-scored without a GPU:

    python benchmarks/plan_gpu.py --measure results.json          # on the GPU machine (minutes)
    python benchmarks/plan_gpu.py --measure kept.json --keep-cache   # the same, the cache kept between phases
    python benchmarks/plan_gpu.py --table benchmarks/plan_gpu_h100.json   # here: markdown rows
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
ROOT = HERE.parents[1]
CATALOG = ROOT / "src" / "zerodoctor" / "models" / "catalog"
GIB = 1 << 30


@dataclass(frozen=True)
class Case:
    name: str
    model: str  # catalog file stem
    stage: int
    offload_optimizer: bool
    offload_param: bool
    micro_batch: int
    seq_len: int
    checkpointing: bool
    method: str = "full"  # full | lora
    steps: int = 3


CASES = [
    Case("q05-z2", "qwen2.5-0.5b", 2, False, False, 4, 1024, True),
    Case("q15-z3", "qwen2.5-1.5b", 3, False, False, 4, 1024, True),
    Case("q15-z3-off", "qwen2.5-1.5b", 3, True, True, 4, 1024, True),
    Case("l1-z2-nockpt", "llama-3.2-1b", 2, False, False, 2, 2048, False),
    Case("l3-z2-offopt", "llama-3.2-3b", 2, True, False, 4, 2048, True),
    Case("l3-z3", "llama-3.2-3b", 3, False, False, 4, 2048, True),
    Case("l3-z3-off", "llama-3.2-3b", 3, True, True, 4, 2048, True),
    Case("q3-z3-lora", "qwen2.5-3b", 3, False, False, 4, 2048, True, method="lora"),
]


def model_config(stem: str) -> dict[str, Any]:
    cfg = json.loads((CATALOG / f"{stem}.json").read_text())
    cfg.pop("_zerodoctor", None)
    return cfg


def ds_config(case: Case) -> dict[str, Any]:
    zero: dict[str, Any] = {"stage": case.stage}
    if case.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if case.offload_param:
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    if case.stage == 3:
        zero["stage3_gather_16bit_weights_on_model_save"] = False
    return {
        "train_micro_batch_size_per_gpu": case.micro_batch,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 1.0,
        "bf16": {"enabled": True},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-5, "weight_decay": 0.0}},
        "zero_optimization": zero,
        "steps_per_print": 10**9,
    }


# ---- measuring (GPU machine) ------------------------------------------------------------------------------


class Sampler:
    """Device-level used memory (NVML) and host RSS, sampled by a thread; `mark()` closes a phase."""

    def __init__(self) -> None:
        import psutil
        import pynvml

        pynvml.nvmlInit()
        self._nvml = pynvml
        self._handle = pynvml.nvmlDeviceGetHandleByIndex(int(os.environ.get("LOCAL_RANK", "0")))
        self._proc = psutil.Process()
        self._lock = threading.Lock()
        self._dev = 0
        self._rss = 0
        self._stop = False
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        used = int(self._nvml.nvmlDeviceGetMemoryInfo(self._handle).used)
        rss = int(self._proc.memory_info().rss)
        with self._lock:
            self._dev = max(self._dev, used)
            self._rss = max(self._rss, rss)

    def _loop(self) -> None:
        while not self._stop:
            self._sample()
            time.sleep(0.002)

    def mark(self) -> tuple[int, int]:
        self._sample()
        with self._lock:
            out = (self._dev, self._rss)
            self._dev = 0
            self._rss = 0
        return out

    def close(self) -> None:
        self._stop = True
        self._thread.join()


def measure_one(case: Case, work: Path, keep_cache: bool = False) -> dict[str, Any]:
    import deepspeed
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.integrations import HfDeepSpeedConfig

    torch.cuda.set_device(0)
    sampler = Sampler()
    phases: dict[str, dict[str, int]] = {}

    def close(name: str) -> None:
        torch.cuda.synchronize()
        dev, rss = sampler.mark()
        free, total = torch.cuda.mem_get_info()
        phases[name] = {
            # memory outside PyTorch's allocator now: CUDA context, cuBLAS workspaces, NCCL buffers
            "outside": int(total - free - torch.cuda.memory_reserved()),
            "allocated": int(torch.cuda.max_memory_allocated()),
            "reserved": int(torch.cuda.max_memory_reserved()),
            "device_used": dev,
            "host_rss": rss,
        }
        # the cache kept from this phase would count as the next phase's reserved peak: give it back, so
        # each phase's reserved peak is what that phase itself took from the device (its own fragmentation);
        # keep_cache: as a training run does, so the reserved peak is the run's so far
        if not keep_cache:
            torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()

    deepspeed.init_distributed(dist_backend="nccl")
    torch.cuda.init()
    baseline_used, _ = sampler.mark()  # before any tensor: other processes' and the driver's share
    cfg_dict = model_config(case.model)
    config = AutoConfig.for_model(**cfg_dict)
    ds = ds_config(case)
    keep = HfDeepSpeedConfig(ds) if case.stage == 3 else None  # zero.Init inside from_config
    t0 = time.time()
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16, attn_implementation="sdpa")
    if case.checkpointing:
        model.gradient_checkpointing_enable()
        model.config.use_cache = False
    params = None
    if case.method == "lora":
        from peft import LoraConfig, get_peft_model

        if case.checkpointing:
            model.enable_input_require_grads()
        model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules="all-linear"))
        params = [p for p in model.parameters() if p.requires_grad]
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=params, config=ds)
    close("load")
    load_s = time.time() - t0
    vocab = int(cfg_dict["vocab_size"])
    gen = torch.Generator(device="cuda").manual_seed(0)
    step_times = []
    for step in range(case.steps):
        ids = torch.randint(0, vocab, (case.micro_batch, case.seq_len), device="cuda", generator=gen)
        t = time.time()
        loss = engine(input_ids=ids, labels=ids).loss
        engine.backward(loss)
        if step == 0:
            close("first_forward_backward")
        engine.step()
        if step == 0:
            close("first_step")
        step_times.append(time.time() - t)
    close("steady")
    t = time.time()
    engine.save_checkpoint(str(work / "ckpt"))
    close("save")
    save_s = time.time() - t
    sampler.close()
    free, total = torch.cuda.mem_get_info()
    del keep
    return {
        "case": asdict(case),
        "keep_cache": keep_cache,
        "gpu_name": torch.cuda.get_device_name(0),
        "gpu_total": int(total),
        "host_total": int(__import__("psutil").virtual_memory().total),
        "baseline_device_used": baseline_used,
        "versions": {"torch": torch.__version__, "deepspeed": deepspeed.__version__,
                     "transformers": __import__("transformers").__version__,
                     "safetensors": __import__("safetensors").__version__},  # fmt: skip
        "phases": phases,
        "seconds": {"load": round(load_s, 1), "steps": [round(s, 2) for s in step_times], "save": round(save_s, 1)},
        "loss": float(loss.item()),
    }


def measure(out: Path, only: list[str], keep_cache: bool = False) -> int:
    results = []
    by_name = {c.name: c for c in CASES}
    for case in [by_name[n] for n in only] if only else CASES:  # --only also sets the order
        with tempfile.TemporaryDirectory() as tmp:
            env = dict(os.environ, RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1",
                       MASTER_ADDR="127.0.0.1", MASTER_PORT="29517")  # fmt: skip
            res_file = Path(tmp) / "r.json"
            t = time.time()
            proc = subprocess.run(
                [sys.executable, str(HERE), "--worker", case.name, "--worker-out", str(res_file)]
                + (["--keep-cache"] if keep_cache else []),
                env=env, capture_output=True, text=True, timeout=900,
            )  # fmt: skip
            if proc.returncode != 0 or not res_file.exists():
                print(f"{case.name}: FAILED rc={proc.returncode}\n{proc.stderr[-3000:]}", flush=True)
                results.append({"case": asdict(case), "error": proc.stderr[-3000:]})
                continue
            r = json.loads(res_file.read_text())
            results.append(r)
            peak = max(p["device_used"] for p in r["phases"].values()) / GIB
            print(f"{case.name}: {time.time() - t:.0f} s, device peak {peak:.1f} GiB", flush=True)
        out.write_text(json.dumps(results, indent=1))
    return 0


# ---- comparing (any machine) ------------------------------------------------------------------------------


def predict(r: dict[str, Any]) -> dict[str, dict[str, int]]:
    sys.path.insert(0, str(ROOT / "src"))
    from zerodoctor.plan.inputs import PlanOptions, load_inputs
    from zerodoctor.plan.phases import plan_strategy

    case = Case(**r["case"])
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "config.json"
        cfg.write_text(json.dumps(model_config(case.model)))
        ds = Path(tmp) / "ds.json"
        ds.write_text(json.dumps(ds_config(case)))
        opts = PlanOptions(
            model=str(cfg), deepspeed=str(ds), nodes=1, gpus_per_node=1,
            gpu_memory_gib=r["gpu_total"] / GIB, host_ram_gib=r["host_total"] / GIB,
            seq_len=case.seq_len, gradient_checkpointing=case.checkpointing, attn="sdpa",
            method=case.method, lora_rank=16 if case.method == "lora" else None,
            lora_targets="all" if case.method == "lora" else None, framework="deepspeed",
        )  # fmt: skip
        inputs = load_inputs(opts)
        assert inputs.zero is not None
        sp = plan_strategy(inputs, inputs.zero)
    return {p.name: {"gpu": p.gpu_bytes, "host": p.host_bytes} for p in sp.phases}


def table(path: Path) -> int:
    results = json.loads(path.read_text())
    print("GiB per phase. need = reserved peak + memory outside PyTorch's allocator (what an OOM runs into; the")
    print("allocator frees its cached blocks and retries before it raises); device used = NVML peak (incl. the cache")
    print("kept from earlier phases, what nvidia-smi shows).\n")
    print("| case | phase | allocated | reserved | outside | need | device used | predicted GPU | error vs need "
          "| host RSS | predicted host | error host |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    errors: list[float] = []
    host_errors: list[float] = []
    for r in results:
        if "error" in r:
            print(f"| {r['case']['name']} | failed | | | | | | | |")
            continue
        pred = predict(r)
        meas = dict(r["phases"])
        # the planner's first_step is the optimizer step's own peak; the forward/backward before it is `steady`
        meas["steady"] = {k: max(meas["steady"][k], meas["first_forward_backward"][k]) for k in meas["save"]}
        for phase in ("load", "first_step", "steady", "save"):
            m, p = meas[phase], pred.get(phase)
            if p is None:
                continue
            need = m["reserved"] + m.get("outside", 0)
            err = (p["gpu"] - need) / need
            herr = (p["host"] - m["host_rss"]) / m["host_rss"]
            errors.append(abs(err))
            host_errors.append(abs(herr))
            print(
                f"| {r['case']['name']} | {phase} | {m['allocated'] / GIB:.2f} | {m['reserved'] / GIB:.2f} | "
                f"{m.get('outside', 0) / GIB:.2f} | {need / GIB:.2f} | {m['device_used'] / GIB:.2f} | "
                f"{p['gpu'] / GIB:.2f} | {100 * err:+.0f} % | {m['host_rss'] / GIB:.2f} | {p['host'] / GIB:.2f} | "
                f"{100 * herr:+.0f} % |"
            )
    if errors:
        errors.sort()
        host_errors.sort()
        print(f"\nmedian |error| GPU vs need: {100 * errors[len(errors) // 2]:.1f} % over {len(errors)} phases; "
              f"host vs RSS: {100 * host_errors[len(host_errors) // 2]:.1f} %")  # fmt: skip
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--measure", type=Path, help="run every case on this machine's GPU, write results here")
    ap.add_argument("--only", nargs="*", default=[], help="case names to run")
    ap.add_argument("--table", type=Path, help="compare recorded measurements with the planner")
    ap.add_argument(
        "--keep-cache", action="store_true", help="do not empty the cache between phases (a real run's reading)"
    )
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--worker-out", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        case = next(c for c in CASES if c.name == args.worker)
        with tempfile.TemporaryDirectory() as tmp:
            args.worker_out.write_text(json.dumps(measure_one(case, Path(tmp), args.keep_cache)))
        return 0
    if args.measure:
        return measure(args.measure, args.only, args.keep_cache)
    if args.table:
        return table(args.table)
    ap.print_help()
    return 2


if __name__ == "__main__":
    sys.exit(main())
