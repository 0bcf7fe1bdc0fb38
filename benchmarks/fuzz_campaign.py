"""Issue 11's long fuzz campaign: N generated bad and odd inputs for every command, each through
`zerodoctor.cli.main.main([...])` in a forked child with a time limit, judged like the test suite
(tests/fuzz/runner.py): exit code in {0, 1, 2}, no traceback, one error line naming the file on exit 2, no
harmed or unasked-for file, under the CPU limit.

    python benchmarks/fuzz_campaign.py --cases 10000 --seconds 2400 --out /tmp/fuzz.json

Cases come from `tests/fuzz/generators.py` with `random.Random(seed)` for seeds start..start+N-1, so any case
is reproduced by its seed: `--only SEED`. Prints a summary (cases, crashes by cause and module with a
reproducing seed, hangs, slowest case by CPU and by wall time, peak RSS of one case) and writes it as JSON.
"""

from __future__ import annotations

import argparse
import collections
import json
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "fuzz"))

from generators import COMMANDS, NEW_COMMANDS, RandomDraw, build_case, named_cases  # noqa: E402
from runner import LAUNCH_REACHED, preload, run_case  # noqa: E402

CPU_LIMIT = 5.0


def _cause(problem: str) -> str:
    """Group problems by kind and place: the message's head and the innermost zerodoctor frame."""
    if problem.startswith("traceback:"):
        head, _, where = problem.partition(" at ")
        kind = head.removeprefix("traceback: ").split(":")[0]
        return f"crash {kind} at {where.split(',')[0].strip(chr(34))}"
    if problem.startswith("exit "):
        return "exit code " + problem.split()[1]
    return problem.split(":")[0]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", type=int, default=10_000)
    ap.add_argument(
        "--start", type=int, default=100_000, help="first seed (the suite uses hypothesis instead)"
    )
    ap.add_argument("--seconds", type=float, default=3600, help="stop generating after this much wall time")
    ap.add_argument("--timeout", type=float, default=20.0, help="wall seconds before a case counts as a hang")
    ap.add_argument("--only", type=int, help="run this one seed and print its output")
    ap.add_argument("--out", type=Path, help="write the summary as JSON here")
    ap.add_argument(
        "--named", action="store_true", help="run the cases issue 11 names; print a markdown table"
    )
    ap.add_argument(
        "--inputs",
        choices=("issue11", "added", "all"),
        default="issue11",
        help="which generators a seed draws from: issue 11's (the first campaign's seeds build the same "
        "cases), those added after it (report, guard, selftest, --fix, run directories, new plan inputs), "
        "or both",
    )
    ap.add_argument("--command", help="only this generator (e.g. report, guard, selftest, fix, rundir)")
    ap.add_argument(
        "--seeds-from", type=Path, help="run the seeds listed under 'causes' in an earlier --out summary"
    )
    args = ap.parse_args(argv)
    pool = {"issue11": COMMANDS, "added": NEW_COMMANDS, "all": COMMANDS + NEW_COMMANDS}[args.inputs]

    preload()  # imported once here, shared by every forked case

    work = Path(tempfile.mkdtemp(prefix="zd-fuzz-"))
    if args.only is not None:
        case = build_case(RandomDraw(args.only), args.command, pool)
        o = run_case(case, work / "case", timeout=args.timeout)
        print(case.describe()[:2000])
        print(
            f"exit {o.code}  {o.seconds:.2f} s wall  {o.cpu_seconds:.2f} s CPU  {o.max_rss_kib / 1024:.0f} MiB"
        )
        print("problems:", o.problems)
        print(o.stderr[-4000:])
        return 0

    if args.named:
        print("| case | exit | CPU s | wall s | outcome |\n|---|---|---|---|---|")
        for name, case in named_cases().items():
            o = run_case(case, work / f"n{len(name)}{abs(hash(name))}", timeout=args.timeout)
            lines = [ln for ln in o.stderr.splitlines() if ln.strip()]
            if o.code is None:
                what = f"killed after {args.timeout:g} s (hang)"
            elif o.problems:
                what = "; ".join(p[:140] for p in o.problems)
            else:
                what = (lines[-1] if lines else (o.stdout.splitlines() or [""])[-1])[:140]
            what = what.replace("|", "\\|")
            print(f"| {name} | {o.code} | {o.cpu_seconds:.2f} | {o.seconds:.2f} | {what} |", flush=True)
        shutil.rmtree(work, ignore_errors=True)
        return 0

    start = time.monotonic()
    by_cause: dict[str, list[int]] = collections.defaultdict(list)
    examples: dict[str, str] = {}
    labels: collections.Counter[str] = collections.Counter()
    codes: collections.Counter[str] = collections.Counter()
    slowest_cpu = (0.0, -1, "")
    slowest_wall = (0.0, -1, "")
    peak = (0, -1, "")
    peak_by_command: dict[str, int] = collections.defaultdict(int)
    cpu_by_command: dict[str, float] = collections.defaultdict(float)
    done = 0
    launched: list[int] = []
    refused_cpu: dict[str, float] = {}
    seeds: list[int] = list(range(args.start, args.start + args.cases))
    if args.seeds_from:  # every seed of every cause (the summary keeps the first 5 per cause, and all_seeds)
        earlier = json.loads(args.seeds_from.read_text())
        seeds = sorted({s for c in earlier["causes"].values() for s in c.get("all_seeds", c["seeds"])})
    for seed in seeds:
        if time.monotonic() - start > args.seconds:
            break
        case = build_case(RandomDraw(seed), args.command, pool)
        root = work / f"c{seed}"
        o = run_case(case, root, timeout=args.timeout * (3 if case.slow else 1))  # slow: a big input
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(work / f"c{seed}.io", ignore_errors=True)
        done += 1
        labels[case.label.split("/")[0]] += 1
        codes[str(o.code)] += 1
        problems = list(o.problems)
        if o.cpu_seconds > CPU_LIMIT:
            problems.append(f"slow: over {CPU_LIMIT:g} s of CPU")
        crashed = any(p.startswith("traceback") for p in problems)
        for p in problems:
            if crashed and p.startswith("exit "):
                continue
            c = _cause(p)
            by_cause[c].append(seed)
            examples.setdefault(c, f"seed {seed}: {case.describe()[:240]} -> {p[:240]}")
        if o.cpu_seconds > slowest_cpu[0]:
            slowest_cpu = (o.cpu_seconds, seed, case.describe()[:160])
        if o.seconds > slowest_wall[0] and o.code is not None:
            slowest_wall = (o.seconds, seed, case.describe()[:160])
        if LAUNCH_REACHED in o.stdout:  # selftest: not refused; the real run would have started here
            launched.append(seed)
            refused_cpu.setdefault("launch", 0.0)
            refused_cpu["launch"] = max(refused_cpu["launch"], o.cpu_seconds)
        elif case.no_launch:
            refused_cpu["refused"] = max(refused_cpu.get("refused", 0.0), o.cpu_seconds)
        command = case.label.split("/")[0]
        peak_by_command[command] = max(peak_by_command[command], o.max_rss_kib)
        cpu_by_command[command] = max(cpu_by_command[command], o.cpu_seconds)
        if o.max_rss_kib > peak[0]:
            peak = (o.max_rss_kib, seed, case.describe()[:160])
        if done % 500 == 0:
            print(
                f"... {done} cases, {time.monotonic() - start:.0f} s, {sum(map(len, by_cause.values()))} problems",
                flush=True,
            )
    elapsed = time.monotonic() - start
    shutil.rmtree(work, ignore_errors=True)

    def count(prefix: str) -> int:
        return len({s for c, seeds in by_cause.items() if c.startswith(prefix) for s in seeds})

    summary = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{platform.machine()} {platform.processor() or ''} Python {platform.python_version()}".strip(),
        "seeds": [seeds[0], seeds[done - 1]] if done else [],
        "inputs": args.command or args.inputs,
        "cases": done,
        "wall_seconds": round(elapsed, 1),
        "by_command": dict(labels),
        "exit_codes": dict(codes),
        "cases_with_crash": count("crash") + count("exit code"),
        "cases_with_hang": count("hang"),
        "cases_harmed_or_unasked_write": count("harmed") + count("wrote"),
        "cases_slow": count("slow"),
        "causes": {
            c: {"cases": len(s), "seeds": s[:5], "all_seeds": s, "example": examples[c]}
            for c, s in sorted(by_cause.items(), key=lambda kv: -len(kv[1]))
        },
        "slowest_cpu": {
            "cpu_seconds": round(slowest_cpu[0], 2),
            "seed": slowest_cpu[1],
            "case": slowest_cpu[2],
        },
        "slowest_wall": {
            "seconds": round(slowest_wall[0], 2),
            "seed": slowest_wall[1],
            "case": slowest_wall[2],
        },
        "peak_rss_mib": {"mib": round(peak[0] / 1024, 1), "seed": peak[1], "case": peak[2]},
        "peak_rss_mib_by_command": {k: round(v / 1024, 1) for k, v in sorted(peak_by_command.items())},
        "slowest_cpu_by_command": {k: round(v, 2) for k, v in sorted(cpu_by_command.items())},
        "selftest_reached_launch": {"cases": len(launched), "seeds": launched[:20]},
        "selftest_slowest_cpu_until_refused_or_launch": {k: round(v, 2) for k, v in refused_cpu.items()},
    }
    print(json.dumps(summary, indent=2))
    if args.out:
        args.out.write_text(json.dumps(summary, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
