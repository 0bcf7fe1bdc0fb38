"""Start-up and total wall time of `zerodoctor check` beside `ds_report` and `accelerate env`, in one run.

All three answer "is this stack/setup sane?" before a launch. Each run is a fresh process (imports included),
timed from the parent with `time.perf_counter`, interleaved round by round so machine noise hits all three
alike. Reported: median, min and max of `--runs` rounds.

* `zerodoctor check examples/llava-zero3-offload` (the README's main job: discovery, run description, env +
  lint + knowledge base + memory plan, text report), with the setup's `env.txt` (no probe of this machine);
* `zerodoctor check ... --env <none>`: the same, probing this machine (no deep DeepSpeed probe);
* `python -c "import zerodoctor.cli.main"`: the CLI's import cost alone;
* `ds_report` (DeepSpeed's environment report: imports torch and DeepSpeed);
* `accelerate env` (imports torch and accelerate).

It also records which heavy modules `check` imported (must be none of torch, deepspeed, transformers).

Usage:
    python benchmarks/check_speed.py [--runs 7]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SETUP = ROOT / "examples" / "llava-zero3-offload"

HEAVY_PROBE = (
    "import sys, io, contextlib\n"
    "from zerodoctor.cli.main import main\n"
    "with contextlib.redirect_stdout(io.StringIO()):\n"
    f"    main(['check', {str(SETUP)!r}, '--fail-on', 'never'])\n"
    "print(sorted(m for m in ('torch', 'deepspeed', 'transformers', 'accelerate') if m in sys.modules))\n"
)


def _bin(name: str) -> str | None:
    here = Path(sys.executable).parent / name
    return str(here) if here.exists() else shutil.which(name)


def _time(cmd: list[str]) -> tuple[float, int]:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    return time.perf_counter() - t0, proc.returncode


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=7)
    args = ap.parse_args()
    zd = _bin("zerodoctor")
    commands: dict[str, list[str]] = {
        "zerodoctor check (setup env.txt)": [zd or "zerodoctor", "check", str(SETUP), "--fail-on", "never"],
        "zerodoctor check (probe this machine)": [
            zd or "zerodoctor", "check", str(SETUP / "train_args.yaml"), "--nodes", "1", "--gpus-per-node", "8",
            "--gpu-memory", "80", "--host-ram", "1024", "--fail-on", "never",
        ],
        "import zerodoctor.cli.main": [sys.executable, "-c", "import zerodoctor.cli.main"],
    }  # fmt: skip
    if _bin("ds_report"):
        commands["ds_report"] = [_bin("ds_report") or "ds_report"]
    if _bin("accelerate"):
        commands["accelerate env"] = [_bin("accelerate") or "accelerate", "env"]
    times: dict[str, list[float]] = {k: [] for k in commands}
    codes: dict[str, set[int]] = {k: set() for k in commands}
    _time(commands["import zerodoctor.cli.main"])  # warm the page cache once for everyone
    for _ in range(args.runs):
        for name, cmd in commands.items():
            t, rc = _time(cmd)
            times[name].append(t)
            codes[name].add(rc)
    heavy = subprocess.run([sys.executable, "-c", HEAVY_PROBE], capture_output=True, text=True, cwd=ROOT)
    print(f"runs per command: {args.runs} (interleaved)\n")
    print(f"{'command':40} {'median s':>9} {'min s':>7} {'max s':>7}  exit")
    for name, ts in times.items():
        print(f"{name:40} {statistics.median(ts):9.3f} {min(ts):7.3f} {max(ts):7.3f}  {sorted(codes[name])}")
    print(f"\nheavy modules imported by `check`: {heavy.stdout.strip() or heavy.stderr.strip()[-300:]}")
    print(json.dumps({k: statistics.median(v) for k, v in times.items()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
