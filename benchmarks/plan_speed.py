"""Cold-start wall time of `zerodoctor plan` next to `accelerate estimate-memory` on the same model.

Each run is a fresh process (imports included), timed from the parent with `time.perf_counter`. Reported:
the median of `--runs` runs (and min/max).

* zerodoctor: `zerodoctor plan --model llama-3.1-405b --nodes 4 --gpus-per-node 8 --gpu-memory 80
  --host-ram 1024` (the bundled catalog config; analytic counting, no torch).
* accelerate: first `accelerate estimate-memory <local config dir>` is tried with HF_HUB_OFFLINE=1. It
  validates the name against the hub before anything else (memory.md §17), so offline it refuses; then
  its meta-device path is timed directly, the way `commands/estimate.py` does it: `init_empty_weights()` +
  `AutoModelForCausalLM.from_config(config)` + `calculate_maximum_sizes(model)`, in a fresh process.

Usage:
    python benchmarks/plan_speed.py [--runs 7]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CATALOG = ROOT / "src" / "zerodoctor" / "models" / "catalog" / "llama-3.1-405b.json"
PLAN_ARGS = [
    "plan", "--model", "llama-3.1-405b", "--nodes", "4", "--gpus-per-node", "8",
    "--gpu-memory", "80", "--host-ram", "1024",
]  # fmt: skip

META_PATH = """
import sys, json
from accelerate import init_empty_weights
from accelerate.utils import calculate_maximum_sizes
from transformers import AutoConfig, AutoModelForCausalLM
config = AutoConfig.from_pretrained(sys.argv[1])
with init_empty_weights():
    model = AutoModelForCausalLM.from_config(config, torch_dtype="float32")
model.tie_weights()
total, largest = calculate_maximum_sizes(model)
print(json.dumps({"total_bytes_fp32": total, "largest_layer": largest[0]}))
"""


def timed(
    cmd: list[str], env: dict[str, str] | None = None
) -> tuple[float, subprocess.CompletedProcess[str]]:
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    return time.perf_counter() - start, proc


def series(cmd: list[str], runs: int, env: dict[str, str] | None = None) -> tuple[list[float], str]:
    times, last = [], ""
    for _ in range(runs):
        wall, proc = timed(cmd, env)
        if proc.returncode not in (0, 1):
            raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr[-2000:]}")
        times.append(wall)
        last = proc.stdout
    return times, last


def summary(times: list[float]) -> dict[str, float]:
    return {
        "median_s": statistics.median(times),
        "min_s": min(times),
        "max_s": max(times),
        "runs": len(times),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()

    results: dict[str, object] = {"machine": f"{os.cpu_count()} CPUs", "python": sys.version.split()[0]}
    zd = shutil.which("zerodoctor") or ""
    cmd = [zd, *PLAN_ARGS] if zd else [sys.executable, "-m", "zerodoctor", *PLAN_ARGS]
    z_times, _ = series(cmd, args.runs)
    results["zerodoctor_plan"] = summary(z_times)

    with tempfile.TemporaryDirectory() as tmp:
        cfg = json.loads(CATALOG.read_text())
        cfg.pop("_zerodoctor", None)
        (Path(tmp) / "config.json").write_text(json.dumps(cfg))
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        acc = shutil.which("accelerate")
        if acc:
            wall, proc = timed([acc, "estimate-memory", tmp, "--library_name", "transformers"], env)
            results["accelerate_estimate_memory_cli"] = {
                "wall_s": wall,
                "returncode": proc.returncode,
                "error_tail": (proc.stderr or proc.stdout).strip().splitlines()[-1:]
                if proc.returncode
                else [],
            }
        meta_times, out = series([sys.executable, "-c", META_PATH, tmp], args.runs, env)
        results["accelerate_meta_device_path"] = {**summary(meta_times), "output": json.loads(out)}

    print(json.dumps(results, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
