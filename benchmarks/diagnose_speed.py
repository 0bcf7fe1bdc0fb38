"""Speed of `zerodoctor diagnose` against `grep -E` with the same patterns, on two generated multi-rank logs.

    python benchmarks/diagnose_speed.py [--sizes 32,128,300,1024] [--repeat 3] [--cold-runs 11] [--keep DIR]
                                        [--scaling 128,256,512,1024]

Two logs (a third on request), each built at every size of --sizes (MiB; `--size-mb N` is `--sizes N`), measured one after the other
in the same run:
  * generated: few hits per MB. It imitates an 8-rank DeepSpeed ZeRO-3 run: torchrun rank prefixes, pdsh
    host prefixes, timestamps, tqdm bars with carriage returns, trainer loss dicts, DeepSpeed info lines,
    warnings, and near the end a rank OOM-killed (SIGKILL) with NCCL errors on the other ranks.
  * dense: built from the lines real DeepSpeed 0.14.4 ZeRO-3 offload runs print every step on 8 ranks
    (`see_memory_usage` lines, `Invalidate trace cache` warnings, timer and log_dist lines, loss dicts), about
    8 % of lines hitting a knowledge-base signature; a normal save in the middle (transformers'
    `stage3_gather_16bit_weights_on_model_save=false` message) and a host OOM kill at the end.
  * bars (`--logs bars`, added in session 11 after a reviewer found it slow): a data-preparation job's output,
    progress bars in units other than steps on nearly every line -- the Hub's download bars
    (`model-00001-of-00004.safetensors:  45%|####5     | 2.23G/4.98G [00:10<00:12, 246MB/s]`), datasets' `Map` /
    `Filter` / `Running tokenizer on dataset` bars (`examples/s`), `Loading checkpoint shards` -- with a training
    bar in one block of sixteen (stretches of thousands of lines without a step bar), and a host OOM kill at the end: every `%|` is a progress literal that does not parse as steps.
grep gets every pattern the diagnose scan uses (all KB signatures and the extractor patterns) translated from
Python `re` to POSIX ERE (\\d -> [0-9], \\s -> [[:space:]], \\S -> [^[:space:]], \\w -> [[:alnum:]_], `(?:` -> `(`;
`(?i)` dropped, the two case-insensitive context patterns then match case-sensitively), run as
`LC_ALL=C grep -E -c -f`; a second grep runs in the same rounds without the patterns that have a counted
repetition bound above 255 (`.{1,2000}`: GNU grep expands it into a much larger automaton, so the full set makes
grep several times slower than the rest do). Both read the same file from the page cache (one warm-up read first), alternating, and
the best of --repeat runs is shown: wall seconds of the whole process (start included, for both tools), CPU
seconds (user + system: the steadier figure when other jobs load the machine) and peak RSS (the child's
ru_maxrss). The zerodoctor runs alternate PYTHONHASHSEED between the --seeds values and their JSON outputs must
be byte-identical (checked at every size). The load average (/proc/loadavg) is printed before and after each
part: on a shared machine a comparison is only valid side by side within one run.

Cold start: `zerodoctor diagnose` on a small real log from the test corpus, --cold-runs fresh processes, min and
median wall and CPU seconds, with the cache (kb.cache) warm and turned off.
"""

from __future__ import annotations

import argparse
import compileall
import json
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


def make_dense_block(rng: random.Random, block: int) -> str:
    """One step of every rank of an 8-rank ZeRO-3 offload run, with the lines real runs print per step
    (DeepSpeed 0.14.4: `see_memory_usage` per step, `Invalidate trace cache` warnings from a model whose
    module order changes, timer and log_dist lines, the trainer loss dict, a tqdm update): about 8 % of the
    lines hit a knowledge-base signature, as in the 8-rank log of issue 10 (174,000 of 2.2 M lines)."""
    out: list[str] = []
    for i in range(50):
        step = block * 50 + i + 1
        ts = f"[2024-06-21 {10 + step // 3600 % 10:02d}:{step // 60 % 60:02d}:{step % 60:02d},{rng.randrange(1000):03d}]"
        for r in range(8):
            pre = f"[rank{r}]: "
            out.append(
                f"{pre}{ts} [INFO] [logging.py:96:log_dist] [Rank {r}] step={step}, skipped=0, "
                f"lr=[{2e-5 * (1 - step / 90000):.6e}], mom=[(0.9, 0.999)]\n"
            )
            out.append(
                f"{pre}{ts} [INFO] [timer.py:259:stop] epoch=0/micro_step={step}/global_step={step}, "
                f"RunningAvgSamplesPerSec=10.8{r}, CurrSamplesPerSec=10.90, MemAllocated=6.61GB, "
                "MaxMemAllocated=21.3GB\n"
            )
            out.append(f"{pre}{ts} [INFO] [utils.py:779:see_memory_usage] After step {step}\n")
            out.append(
                f"{pre}{ts} [INFO] [utils.py:780:see_memory_usage] MA 6.61 GB         Max_MA 21.3 GB         "
                f"CA 23.{r} GB         Max_CA 24 GB \n"
            )
            out.append(
                f"{pre}{ts} [INFO] [utils.py:787:see_memory_usage] CPU Virtual Memory:  used = "
                f"{391 + rng.random():.1f} GB, percent = 38.9%\n"
            )
            if (step + r) % 12 == 0:
                out.append(
                    f"{pre}Invalidate trace cache @ step {step % 7}: expected module {rng.randrange(400)}, "
                    f"but got module {rng.randrange(400)}\n"
                )
            out.append(
                f"{pre}/opt/conda/lib/python3.10/site-packages/torch/utils/checkpoint.py:464: UserWarning: "
                "torch.utils.checkpoint: the use_reentrant parameter should be passed explicitly.\n"
            )
            out.append(f"{pre}  return fn(*args, **kwargs)\n")
            out.append(
                f"{pre}{ts} [INFO] [stage3.py:2069:step] optimizer step done, micro_step={step}, params=291\n"
            )
            out.append(f"{pre}{ts} [INFO] [engine.py:2210:_take_model_step] reduce-scatter of 291 buckets\n")
            out.append(f"{pre}{ts} [INFO] [partitioned_param_coordinator.py:405:fetch] prefetch 12 params\n")
            out.append(f"{pre}{ts} [INFO] [engine.py:1951:backward] backward done in 2{r}1 ms\n")
        out.append(
            f"[rank0]: {{'loss': {rng.random() + 1:.4f}, 'grad_norm': {rng.random():.4f}, "
            f"'learning_rate': 1.98e-05, 'epoch': {step / 90000:.2f}}}\n"
        )
        out.append(
            f"[rank0]: \r  {step * 100 // 90000}%|#         | {step}/90000 [1:00:00<40:00:00,  1.61s/it]\n"
        )
    return "".join(out)


def make_bars_block(rng: random.Random, block: int) -> str:
    """Progress bars in other units on nearly every line, as a data-preparation job prints them (see the module
    docstring): the Hub's byte-rate download bars, datasets' examples/s bars, checkpoint-shard loading, and one
    training bar line in twenty."""
    out: list[str] = []
    for i in range(400):
        p = (block * 7 + i) % 101
        bar = ("\u2588" * (p // 10) + "\u258c" * (p % 10 >= 5)).ljust(10)  # tqdm's unicode blocks
        kind = i % 20
        if kind < 8:
            shard = i % 4 + 1
            out.append(
                f"model-0000{shard}-of-00004.safetensors: {p:3d}%|{bar}| {p * 0.05:.2f}G/4.98G "
                f"[00:{p % 60:02d}<00:12, {200 + rng.randrange(100)}MB/s]\n"
            )
        elif kind < 14:
            what = ("Map (num_proc=16)", "Running tokenizer on dataset", "Filter")[i % 3]
            out.append(
                f"{what}: {p:3d}%|{bar}| {p * 500}/50000 [00:{p % 60:02d}<00:05, {rng.random() * 9000:.2f} examples/s]\n"
            )
        elif kind < 19:
            out.append(
                f"Loading checkpoint shards: {p:3d}%|{bar}| {p % 5}/4 [00:0{p % 10}<00:02,  1.{p % 10}s/it]\n"
            )
        elif (
            block % 16 == 15
        ):  # training starts now and then: stretches of thousands of lines have no step bar
            out.append(f"  {p}%|{bar}| {block * 20 + i // 20}/90000 [1:00:00<40:00:00,  1.61s/it]\n")
        else:
            out.append(f"Downloading data: {p:3d}%|{bar}| {p * 3}M/300M [00:0{p % 10}<00:03, 98.4MB/s]\n")
    return "".join(out)


DENSE_HEAD = (
    "[rank0]: [2024-06-21 10:00:00,000] [INFO] [logging.py:96:log_dist] [Rank 0] DeepSpeed info: "
    "version=0.14.4, git-hash=unknown, git-branch=unknown\n"
    "[rank0]: ***** Running training *****\n"
)
# A healthy save (transformers' message for stage3_gather_16bit_weights_on_model_save=false), then, at the
# end, rank 3 killed by the kernel's OOM killer and the launcher tearing the job down.
DENSE_SAVE = (
    "[rank0]: [2024-06-21 11:00:00,000] [INFO] [logging.py:96:log_dist] [Rank 0] [Torch] Checkpoint "
    "global_step500 is about to be saved!\n"
    "[rank0]: stage3_gather_16bit_weights_on_model_save=false. Saving the full checkpoint instead, use "
    "zero_to_fp32.py to recover weights\n"
    "[rank0]: [2024-06-21 11:00:03,000] [INFO] [engine.py:3536:_save_zero_checkpoint] zero checkpoint saved "
    "ckpt/checkpoint-500/global_step500/zero_pp_rank_0_mp_rank_00_optim_states.pt\n"
)
DENSE_FAILURE = (
    "[Fri Jun 21 13:59:58 2024] Out of memory: Killed process 4242 (python) total-vm:812345678kB, "
    "anon-rss:498765432kB, file-rss:0kB, shmem-rss:0kB, UID:1000 pgtables:987654kB oom_score_adj:0\n"
    "[2024-06-21 14:00:00,002] [INFO] [launch.py:315:sigkill_handler] Killing subprocess 4242\n"
    "[2024-06-21 14:00:00,003] [ERROR] [launch.py:434:sigkill_handler] ['/usr/bin/python3', '-u', "
    "'train.py', '--local_rank=3'] exits with return code = -9\n"
)


GENERATED_HEAD = (
    b"[2024-05-01 09:00:00,000] [INFO] [logging.py:96:log_dist] [Rank 0] DeepSpeed info: "
    b"version=0.14.2, git-hash=unknown, git-branch=unknown\n***** Running training *****\n"
)


def generate(path: Path, size_mb: int, *, dense: bool = False, bars: bool = False) -> int:
    """Write the generated log (`dense`: the hit-dense one built from real-run lines; `bars`: the one whose lines
    are progress bars in other units)."""
    rng = random.Random(0)
    target = size_mb << 20
    if bars:
        blocks = [make_bars_block(rng, b).encode() for b in range(64)]
        head, middle, tail = b"", b"", DENSE_FAILURE.encode()
    elif dense:
        blocks = [make_dense_block(rng, b).encode() for b in range(64)]
        head, middle, tail = DENSE_HEAD.encode(), DENSE_SAVE.encode(), DENSE_FAILURE.encode()
    else:
        blocks = [make_block(rng, b).encode() for b in range(64)]
        head, middle, tail = GENERATED_HEAD, b"", FAILURE.encode()
    written = 0
    with path.open("wb") as f:
        f.write(head)
        i = 0
        while written < target:
            b = blocks[i % len(blocks)]
            f.write(b)
            written += len(b)
            i += 1
            if i == 3:
                f.write(middle)
        f.write(tail)
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
        if c == "(" and not in_class and rx.startswith("(?:", i):  # non-capturing group: a plain group in ERE
            out.append("(")
            i += 3
            continue
        if c == "[" and not in_class:
            in_class = True
        elif c == "]" and in_class and out and out[-1] not in ("[", "[^"):
            in_class = False
        out.append(c)
        i += 1
    ere = "".join(out).replace('[^"\n]', '[^"]').replace("\n", "")
    return ere


# GNU grep compiles a counted repetition `{m,n}` by repeating its operand n times: one KB pattern with `.{1,2000}`
# makes its automaton (and its time per MB) several times larger. Those patterns are left out of the second grep.
_BIG_REPEAT = re.compile(r"\{\d*,(\d+)\}")
BIG_REPEAT_BOUND = 255


def slow_for_grep(ere: str) -> bool:
    """Whether a pattern has a counted repetition with an upper bound above BIG_REPEAT_BOUND."""
    return any(int(m.group(1)) > BIG_REPEAT_BOUND for m in _BIG_REPEAT.finditer(ere))


def timed(cmd: list[str], env: dict[str, str] | None = None) -> tuple[float, int, str, float]:
    """Wall seconds, peak RSS (KiB) of the child, stdout, CPU seconds (user + system) of the child. The CPU time
    is what to compare when other jobs load the machine: wall time then swings with their load."""
    wrapper = (
        "import resource, subprocess, sys, time\n"
        "t = time.perf_counter(); p = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
        "dt = time.perf_counter() - t\n"
        "u = resource.getrusage(resource.RUSAGE_CHILDREN)\n"
        "print(dt, u.ru_maxrss, p.returncode, u.ru_utime + u.ru_stime)\n"
        "sys.stderr.write(p.stdout if p.stdout.strip() else p.stderr[-2000:])\n"
    )
    p = subprocess.run([sys.executable, "-c", wrapper, *cmd], capture_output=True, text=True, env=env)
    dt, rss, _rc, cpu = p.stdout.split()
    return float(dt), int(rss), p.stderr, float(cpu)


def load_average() -> str:
    """The 1, 5 and 15 minute load averages (other jobs on the same cores)."""
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def measure(
    log: Path,
    pats: Path,
    env: dict[str, str],
    repeat: int,
    seeds: list[str],
    baseline: str | None = None,
    pats_tame: Path | None = None,
) -> dict[str, object]:
    """grep and zerodoctor over one log, alternating, best of `repeat`; zerodoctor's runs cycle through the hash
    seeds and their outputs are compared byte for byte. With `baseline` (another checkout's src directory), its
    zerodoctor runs in the same rounds and its output is compared with this one's. With `pats_tame`, grep also runs
    on that pattern file (the patterns without a large counted repetition, see `slow_for_grep`) in the same rounds."""
    with log.open("rb") as f:  # warm the page cache
        while f.read(64 << 20):
            pass
    grep = shutil.which("grep") or "grep"
    zd = [sys.executable, "-m", "zerodoctor", "diagnose", "--format", "json", "--fail-on", "never", str(log)]
    g_runs, z_runs, b_runs, t_runs = [], [], [], []
    outputs: dict[str, set[str]] = {}
    b_outputs: set[str] = set()
    for i in range(repeat):
        g_runs.append(timed([grep, "-E", "-c", "-f", str(pats), str(log)], env))
        if pats_tame is not None:
            t_runs.append(timed([grep, "-E", "-c", "-f", str(pats_tame), str(log)], env))
        seed = seeds[i % len(seeds)]
        z_runs.append(timed(zd, {**env, "PYTHONHASHSEED": seed}))
        outputs.setdefault(seed, set()).add(z_runs[-1][2])
        if baseline:
            b_runs.append(timed(zd, {**env, "PYTHONHASHSEED": seed, "PYTHONPATH": baseline}))
            b_outputs.add(b_runs[-1][2])
    z_out = z_runs[-1][2]
    try:
        top = json.loads(z_out)["findings"][0]
        verdict, severity = top["id"], top["severity"]
    except (ValueError, KeyError, IndexError):
        verdict, severity = "?", z_out[-300:]
    distinct = set().union(*outputs.values())
    return {
        "grep": min(g_runs),
        "zd": min(z_runs),
        "base": min(b_runs) if b_runs else None,
        "tame": min(t_runs) if t_runs else None,
        "tame_cpu": min(r[3] for r in t_runs) if t_runs else None,
        "grep_cpu": min(r[3] for r in g_runs),
        "zd_cpu": min(r[3] for r in z_runs),
        "base_cpu": min(r[3] for r in b_runs) if b_runs else None,
        "grep_lines": g_runs[-1][2].strip().splitlines()[0] if g_runs[-1][2].strip() else "?",
        "verdict": verdict,
        "severity": severity,
        "identical": len(distinct) == 1,
        "same_as_baseline": b_outputs == distinct if baseline else None,
        "seeds_used": sorted(outputs),
        "json_bytes": len(z_out.encode()),
    }


COLD_LOG = "tests/diagnose/corpus/healthy_hf_trainer_qwen2_1_5b_full_run.log"


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


def compile_bytecode(src: Path | None = None) -> None:
    """The package's bytecode, as an installed wheel has it (with PYTHONDONTWRITEBYTECODE set, a source checkout
    would otherwise compile every module at every start)."""
    compileall.compile_dir(str((src or Path(__file__).resolve().parents[1] / "src") / "zerodoctor"), quiet=1)


def cold_start(runs: int, log_arg: str = COLD_LOG, baseline: str | None = None) -> None:
    """Wall and CPU seconds of `zerodoctor diagnose` on a small log, each run a fresh process, the package's
    bytecode compiled first: with the cache (kb.cache: validated KB, hyperscan database) warm, and with
    ZERODOCTOR_CACHE_DIR=off (YAML parsed and patterns compiled at every start); with `baseline`, the same for
    another checkout's src directory. The variants take turns in every round, so a change in the machine's load
    falls on all of them. `grep -c` on the same log is the floor of any process start on this machine."""
    log = Path(log_arg)
    if not log.is_absolute():
        log = Path(__file__).resolve().parents[1] / log
    cmd = [sys.executable, "-m", "zerodoctor", "diagnose", "--fail-on", "never", str(log)]
    compile_bytecode()
    variants: list[tuple[str, list[str], dict[str, str]]] = [
        ("cache warm", cmd, {}),
        ("cache off", cmd, {"ZERODOCTOR_CACHE_DIR": "off"}),
    ]
    if baseline:
        compile_bytecode(Path(baseline))
        variants += [
            ("baseline, cache warm", cmd, {"PYTHONPATH": baseline}),
            ("baseline, cache off", cmd, {"PYTHONPATH": baseline, "ZERODOCTOR_CACHE_DIR": "off"}),
        ]
    variants.append(("grep -c, for scale", [shutil.which("grep") or "grep", "-c", "Error", str(log)], {}))
    print(f"cold start on {log.name} ({log.stat().st_size:,} bytes), load average before: {load_average()}")
    walls: dict[str, list[float]] = {label: [] for label, _, _ in variants}
    cpus: dict[str, list[float]] = {label: [] for label, _, _ in variants}
    for _, run_cmd, extra in variants:  # fill the cache and the page cache
        subprocess.run(run_cmd, capture_output=True, env={**os.environ, **extra}, check=False)
    for _ in range(runs):
        for label, run_cmd, extra in variants:
            env = {**os.environ, **extra}
            before = os.times()
            t0 = time.perf_counter()
            subprocess.run(run_cmd, capture_output=True, env=env, check=False)
            walls[label].append(time.perf_counter() - t0)
            after = os.times()
            used = after.children_user + after.children_system - before.children_user - before.children_system
            cpus[label].append(max(0.0, used))
    for label, _, _ in variants:
        w, c = walls[label], cpus[label]
        print(
            f"  {label:<21} wall min {min(w):.3f} s, median {_median(w):.3f} s; CPU min {min(c):.3f} s, "
            f"median {_median(c):.3f} s; {runs} fresh processes"
        )
    print(f"  load average after: {load_average()}")


def _slope(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares line through (x, y): (slope, intercept)."""
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    return slope, my - slope * mx


# The per-step lines of the dense log that hit a knowledge-base signature, and a same-length spelling that hits
# none: the masked log has the same bytes and line structure with a handful of hits.
_MASKS = (
    (b"CPU Virtual Memory:", b"CPU Virtual Memori:"),
    (b"Invalidate trace cache @", b"Invalidate trace cachE @"),
)


def mask_hits(src: Path, dst: Path) -> None:
    """Copy the dense log with its per-step hit lines spelt so that no signature matches them."""
    with src.open("rb") as f, dst.open("wb") as g:
        carry = b""
        while block := f.read(8 << 20):
            data = carry + block
            cut = data.rfind(b"\n") + 1
            chunk, carry = data[:cut], data[cut:]
            for a, b in _MASKS:
                chunk = chunk.replace(a, b)
            g.write(chunk)
        g.write(carry)


def scaling(work: Path, sizes: list[int], env: dict[str, str], repeat: int, pats: Path) -> None:
    """Cost per MB against the number of hits: `zerodoctor diagnose` on both logs cut at several sizes, best of
    `repeat` each; the slope of CPU seconds over MiB is the marginal cost per MB, the intercept the fixed cost
    (start, KB load, the engine rebuilt once the per-step patterns saturate). Three logs: generated (a few hits),
    dense (9 % of lines hit) and dense-masked (the dense bytes with its per-step hit lines spelt so that they do not
    hit): dense against dense-masked is the cost of the hits alone, on the same text; dense against generated
    adds the difference in text (the multi-pattern engine's speed depends on the bytes it reads)."""
    zd = [sys.executable, "-m", "zerodoctor", "diagnose", "--format", "json", "--fail-on", "never"]
    slopes: dict[str, float] = {}
    for kind in ("generated", "dense", "dense-masked"):
        xs: list[float] = []
        ys: list[float] = []
        for size in sizes:
            log = work / f"{kind}-{size}.log"
            mb = generate(log, size, dense=kind != "generated") / (1 << 20)
            if kind == "dense-masked":
                full = work / "dense-unmasked.log"
                log.rename(full)
                mask_hits(full, log)
                full.unlink()
            if size == sizes[-1]:
                hits = timed([shutil.which("grep") or "grep", "-E", "-c", "-f", str(pats), str(log)], env)[2]
                print(f"  scaling {kind}: {hits.strip()} hit lines (grep) at {mb:.0f} MiB")
            runs = [timed([*zd, str(log)], env) for _ in range(repeat)]
            wall, cpu = min(r[0] for r in runs), min(r[3] for r in runs)
            xs.append(mb)
            ys.append(cpu)
            print(f"  scaling {kind:<10}{mb:>7.0f} MiB {wall:>7.2f} s wall {cpu:>7.2f} s CPU")
            log.unlink()
        slope, icpt = _slope(xs, ys)
        slopes[kind] = slope
        print(f"  scaling {kind}: {slope * 1024:.2f} CPU s per GiB (marginal), {icpt:.2f} CPU s fixed")
    print(f"  marginal CPU cost per MB, dense / generated: {slopes['dense'] / slopes['generated']:.2f}")
    print(f"  marginal CPU cost per MB, dense / dense-masked: {slopes['dense'] / slopes['dense-masked']:.2f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--sizes",
        default="32,128,300,1024",
        help="comma-separated log sizes in MiB, each log built at each size",
    )
    ap.add_argument("--size-mb", type=int, help="one size only (the same as --sizes N)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--keep", type=Path, help="write the logs here and keep them")
    ap.add_argument("--engine", default=None, help="force a scan engine (python|hyperscan)")
    ap.add_argument(
        "--logs",
        default="generated,dense",
        help="which logs: generated (few hits), dense (real-run lines), bars (progress bars in other units)",
    )
    ap.add_argument(
        "--seeds",
        default="1,4242",
        help="PYTHONHASHSEED values the zerodoctor runs cycle through (outputs compared)",
    )
    ap.add_argument(
        "--cold-runs", type=int, default=11, help="fresh-process runs for the cold-start figure (0: skip)"
    )
    ap.add_argument(
        "--cold-log", default=COLD_LOG, help="the small log of the cold start (default: %(default)s)"
    )
    ap.add_argument(
        "--scaling",
        default="",
        help="comma-separated sizes in MiB: fit diagnose's seconds per MiB on both logs at these sizes (cost per MB"
        " against hits); empty: skip",
    )
    ap.add_argument(
        "--baseline-src",
        help="another checkout's src directory (e.g. `git archive OLD src`): its zerodoctor runs beside this one"
        " in every round, and the outputs are compared",
    )
    args = ap.parse_args()
    baseline = str(Path(args.baseline_src).resolve()) if args.baseline_src else None
    sizes = [args.size_mb] if args.size_mb else [int(x) for x in args.sizes.split(",") if x]
    seeds = [x for x in args.seeds.split(",") if x]
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    if args.cold_runs:
        cold_start(args.cold_runs, args.cold_log, baseline)
    else:  # the other figures include each process's start too: with the package's bytecode, as installed
        compile_bytecode()
        if baseline:
            compile_bytecode(Path(baseline))
    work = args.keep or Path(tempfile.mkdtemp(prefix="zd-speed-"))
    work.mkdir(parents=True, exist_ok=True)
    pats = work / "patterns.ere"
    regexes = pattern_set().regexes
    eres = [to_ere(r) for r in regexes]
    pats.write_text("\n".join(eres) + "\n")
    tame = [e for e in eres if not slow_for_grep(e)]
    pats_tame = work / "patterns-tame.ere" if len(tame) < len(eres) else None
    if pats_tame is not None:
        pats_tame.write_text("\n".join(tame) + "\n")
        print(
            f"grep also runs without the {len(eres) - len(tame)} pattern(s) with a repetition bound above "
            f"{BIG_REPEAT_BOUND} ({len(tame)} patterns; GNU grep expands them): "
            + ", ".join(e[:60] for e in eres if slow_for_grep(e))
        )
    env = {**os.environ, "LC_ALL": "C"}
    if args.engine:
        env["ZERODOCTOR_SCAN_ENGINE"] = args.engine
    print(f"{len(regexes)} patterns; best of {args.repeat}; hash seeds {', '.join(seeds)}")
    print(
        f"{'log':<11}{'MiB':>6}{'hit lines':>11}{'tool':>22}{'wall s':>8}{'MiB/s':>7}{'CPU s':>7}{'RSS MiB':>9}"
        f"{'zd/grep thr.':>13}"
    )
    all_identical = same_as_baseline = True
    for kind in filter(None, args.logs.split(",")):
        for size_mb in sizes:
            log = work / f"{kind}-{size_mb}.log"
            t0 = time.perf_counter()
            size = generate(log, size_mb, dense=kind == "dense", bars=kind == "bars")
            gen_s = time.perf_counter() - t0
            load_before = load_average()
            r = measure(log, pats, env, args.repeat, seeds, baseline, pats_tame)
            g, z = r["grep"], r["zd"]
            assert isinstance(g, tuple) and isinstance(z, tuple)
            gc, zc = r["grep_cpu"], r["zd_cpu"]
            assert isinstance(gc, float) and isinstance(zc, float)
            mb = size / (1 << 20)
            hits = r["grep_lines"]
            print(
                f"{kind:<11}{mb:>6.0f}{hits:>11}{'grep -E -c -f':>22}{g[0]:>8.2f}{mb / g[0]:>7.0f}{gc:>7.2f}"
                f"{g[1] / 1024:>9.1f}"
            )
            print(
                f"{'':<11}{'':>6}{'':>11}{'zerodoctor diagnose':>22}{z[0]:>8.2f}{mb / z[0]:>7.0f}{zc:>7.2f}"
                f"{z[1] / 1024:>9.1f}{g[0] / z[0]:>7.2f} wall{gc / zc:>6.2f} CPU"
            )
            t, tc = r["tame"], r["tame_cpu"]
            if isinstance(t, tuple) and isinstance(tc, float):
                print(
                    f"{'':<11}{'':>6}{'':>11}{'grep, tame patterns':>22}{t[0]:>8.2f}{mb / t[0]:>7.0f}{tc:>7.2f}"
                    f"{t[1] / 1024:>9.1f}{t[0] / z[0]:>7.2f} wall{tc / zc:>6.2f} CPU"
                )
            b, bc = r["base"], r["base_cpu"]
            if isinstance(b, tuple) and isinstance(bc, float):
                print(
                    f"{'':<11}{'':>6}{'':>11}{'baseline diagnose':>22}{b[0]:>8.2f}{mb / b[0]:>7.0f}{bc:>7.2f}"
                    f"{b[1] / 1024:>9.1f}{g[0] / b[0]:>7.2f} wall{gc / bc:>6.2f} CPU; same JSON as this "
                    f"checkout: {r['same_as_baseline']}"
                )
            all_identical = all_identical and bool(r["identical"])
            same_as_baseline = same_as_baseline and r["same_as_baseline"] is not False
            print(
                f"  {kind} {mb:.0f} MiB: verdict {r['verdict']} ({r['severity']}); JSON {r['json_bytes']} bytes, "
                f"{'identical' if r['identical'] else 'DIFFERENT'} under seeds {', '.join(map(str, r['seeds_used']))}"
                f" ({args.repeat} runs); load {load_before} -> {load_average()}; generated in {gen_s:.1f} s"
            )
            if not args.keep:
                log.unlink()
    print(f"zerodoctor's JSON identical across hash seeds at every size: {all_identical}")
    if args.baseline_src:
        # (a difference is expected where a knowledge-base text or a finding changed on purpose; compare the verdicts)
        print(f"the same JSON as the baseline at every size: {same_as_baseline}")
    if args.scaling:
        scaling(work, [int(x) for x in args.scaling.split(",")], env, args.repeat, pats)
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if all_identical else 1


if __name__ == "__main__":
    raise SystemExit(main())
