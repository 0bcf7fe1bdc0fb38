"""Speed of `zerodoctor diagnose` against `grep -E` with the same patterns, on a generated multi-rank log.

    python benchmarks/diagnose_speed.py [--size-mb 1024] [--repeat 2] [--keep DIR]

The log (default 1 GiB) imitates an 8-rank DeepSpeed ZeRO-3 run: torchrun rank prefixes, pdsh host
prefixes, timestamps, tqdm bars with carriage returns, trainer loss dicts, DeepSpeed info lines, warnings,
and near the end a rank OOM-killed (SIGKILL) with NCCL errors on the other ranks. grep gets every pattern
the diagnose scan uses (all KB signatures and the extractor patterns) translated from Python `re` to POSIX
ERE (\\d -> [0-9], \\s -> [[:space:]], \\S -> [^[:space:]], \\w -> [[:alnum:]_]; `(?i)` dropped, the
two case-insensitive context patterns then match case-sensitively), run as `LC_ALL=C grep -E -c -f`.
Both read the same file from the page cache (one warm-up read first); the best of --repeat runs is shown.
Peak RSS is the child's ru_maxrss.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from zerodoctor.diagnose.scan import pattern_set  # noqa: E402


def make_block(rng: random.Random, block: int) -> str:
    out: list[str] = []
    for i in range(400):
        step = block * 400 + i
        r = rng.randrange(8)
        host = f"node-{r // 4}"
        ts = f"[2024-05-01 10:{(step // 60) % 60:02d}:{step % 60:02d},{rng.randrange(1000):03d}]"
        kind = i % 8
        if kind == 0:
            bars = "".join(
                f"\r {p}%|{'#' * (p // 10):<10}| {step * 3 + p}/90000 [01:{p:02d}<40:00,  1.{p}s/it]"
                for p in range(1, 6)
            )
            out.append(f"{host}: [rank0]:{bars}\n")
        elif kind == 1:
            out.append(
                f"{host}: [rank0]: {{'loss': {rng.random():.4f}, 'grad_norm': {rng.random():.4f}, "
                f"'learning_rate': 1.9e-05, 'epoch': {step / 90000:.2f}}}\n"
            )
        elif kind == 2:
            out.append(
                f"{host}: [rank{r}]: {ts} [INFO] [logging.py:96:log_dist] [Rank {r}] step={step}, skipped=0, "
                f"lr=[1.9e-05], mom=[(0.9, 0.95)]\n"
            )
        elif kind == 3:
            out.append(
                f"{host}: [rank{r}]: {ts} [INFO] [timer.py:260:stop] epoch=0/micro_step={step}/global_step="
                f"{step}, RunningAvgSamplesPerSec=12.{r}, CurrSamplesPerSec=12.{r}, MemAllocated=31.2GB, "
                f"MaxMemAllocated=58.9GB\n"
            )
        elif kind == 4:
            out.append(
                f"{host}: [rank{r}]: /usr/lib/python3/dist-packages/torch/utils/checkpoint.py:90: UserWarning: "
                "None of the inputs have requires_grad=True. Gradients will be None\n"
            )
        elif kind == 5:
            out.append(f"{host}: [rank{r}]:   warnings.warn(\n")
        elif kind == 6:
            out.append(
                f"{host}: [rank{r}]: {ts} [WARNING] [stage3.py:2069:step] 1 pytorch allocator cache flushes "
                "since last step. this happens when there is high memory pressure\n"
            )
        else:
            out.append(
                f"{host}: [rank{r}]: {ts} [INFO] [utils.py:781:see_memory_usage] MA 31.2 GB Max_MA 58.9 GB "
                f"CA 60.1 GB Max_CA 61 GB step {step}\n"
            )
    return "".join(out)


FAILURE = (
    "node-1: [rank5]: [E ProcessGroupNCCL.cpp:1182] [Rank 5] NCCL error: remote process exited or there was a "
    "network error\n"
    "node-1: [rank5]: torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, remote "
    "process exited\n"
    "node-0: [2024-05-01 11:00:00,002] [INFO] [launch.py:315:sigkill_handler] Killing subprocess 4242\n"
    "node-0: [2024-05-01 11:00:00,003] [ERROR] [launch.py:434:sigkill_handler] ['/usr/bin/python3', '-u', "
    "'train.py', '--local_rank=3'] exits with return code = -9\n"
)


def generate(path: Path, size_mb: int) -> int:
    rng = random.Random(0)
    target = size_mb << 20
    blocks = [make_block(rng, b).encode() for b in range(64)]
    written = 0
    with path.open("wb") as f:
        f.write(
            b"[2024-05-01 09:00:00,000] [INFO] [logging.py:96:log_dist] [Rank 0] DeepSpeed info: "
            b"version=0.14.2, git-hash=unknown, git-branch=unknown\n***** Running training *****\n"
        )
        i = 0
        while written < target:
            b = blocks[i % len(blocks)]
            f.write(b)
            written += len(b)
            i += 1
        f.write(FAILURE.encode())
    return path.stat().st_size


_CLASS_OUT = {"d": "[0-9]", "s": "[[:space:]]", "S": "[^[:space:]]", "w": "[[:alnum:]_]"}
_CLASS_IN = {"d": "0-9", "s": "[:space:]", "w": "[:alnum:]_"}


def to_ere(rx: str) -> str:
    """Python re -> POSIX ERE for GNU grep (enough for the KB's RE2-compatible subset)."""
    rx = rx.replace("(?i)", "")
    out: list[str] = []
    i, in_class = 0, False
    while i < len(rx):
        c = rx[i]
        if c == "\\" and i + 1 < len(rx):
            n = rx[i + 1]
            if in_class and n in _CLASS_IN:
                out.append(_CLASS_IN[n])
            elif not in_class and n in _CLASS_OUT:
                out.append(_CLASS_OUT[n])
            elif n == "n":
                out.append("\n" if not in_class else "")
            elif n == "b":
                out.append("\\b")
            elif in_class:
                out.append(n if n not in "]^-" else "\\" + n)
            else:
                out.append("\\" + n)
            i += 2
            continue
        if c == "[" and not in_class:
            in_class = True
        elif c == "]" and in_class and out and out[-1] not in ("[", "[^"):
            in_class = False
        out.append(c)
        i += 1
    ere = "".join(out).replace('[^"\n]', '[^"]').replace("\n", "")
    return ere


def timed(cmd: list[str], env: dict[str, str] | None = None) -> tuple[float, int, str]:
    """Wall seconds, peak RSS (KiB) of the child, stdout."""
    wrapper = (
        "import resource, subprocess, sys, time\n"
        "t = time.perf_counter(); p = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
        "dt = time.perf_counter() - t\n"
        "print(dt, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, p.returncode)\n"
        "sys.stderr.write(p.stdout[:4000] + p.stderr[-2000:])\n"
    )
    p = subprocess.run([sys.executable, "-c", wrapper, *cmd], capture_output=True, text=True, env=env)
    dt, rss, _rc = p.stdout.split()
    return float(dt), int(rss), p.stderr


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size-mb", type=int, default=1024)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--keep", type=Path, help="write the log here and keep it")
    ap.add_argument("--engine", default=None, help="force a scan engine (python|hyperscan)")
    args = ap.parse_args()
    work = args.keep or Path(tempfile.mkdtemp(prefix="zd-speed-"))
    work.mkdir(parents=True, exist_ok=True)
    log = work / "multirank.log"
    t0 = time.perf_counter()
    size = generate(log, args.size_mb)
    gen_s = time.perf_counter() - t0
    pats = work / "patterns.ere"
    regexes = pattern_set().regexes
    pats.write_text("\n".join(to_ere(r) for r in regexes) + "\n")
    with log.open("rb") as f:  # warm the page cache
        while f.read(64 << 20):
            pass
    env = {**os.environ, "LC_ALL": "C"}
    if args.engine:
        env["ZERODOCTOR_SCAN_ENGINE"] = args.engine
    grep = shutil.which("grep") or "grep"
    zd = [sys.executable, "-m", "zerodoctor", "diagnose", "--format", "json", "--fail-on", "never", str(log)]
    g_runs, z_runs = [], []
    z_out = ""
    for _ in range(args.repeat):
        g_runs.append(timed([grep, "-E", "-c", "-f", str(pats), str(log)], env))
        z_runs.append(timed(zd, env))
        z_out = z_runs[-1][2]
    g = min(g_runs)
    z = min(z_runs)
    mb = size / (1 << 20)
    verdict = re.search(r'"id": "([^"]+)"', z_out)
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    print(f"log: {mb:.0f} MiB ({size} bytes), generated in {gen_s:.1f} s; {len(regexes)} patterns")
    print(f"{'tool':<22}{'seconds':>9}{'MiB/s':>9}{'peak RSS MiB':>14}")
    print(f"{'grep -E -c -f':<22}{g[0]:>9.2f}{mb / g[0]:>9.0f}{g[1] / 1024:>14.1f}")
    print(f"{'zerodoctor diagnose':<22}{z[0]:>9.2f}{mb / z[0]:>9.0f}{z[1] / 1024:>14.1f}")
    print(f"ratio zerodoctor/grep time: {z[0] / g[0]:.2f}x (throughput {g[0] / z[0]:.2f} of grep's)")
    print(
        f"grep matched lines: {g[2].strip().splitlines()[0] if g[2].strip() else '?'}; "
        f"zerodoctor verdict: {verdict.group(1) if verdict else '?'}"
    )
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
