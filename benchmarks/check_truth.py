"""Measure `zerodoctor check` against setups from public GitHub threads whose outcome is known.

Every case is a folder in benchmarks/check_truth/cases/<id>/ holding the configs as the thread gave them, a
cluster.yaml with only what the thread states, an env.txt with the versions it states, and truth.yaml (sources,
quote, expected `fails`/`runs`, the failure's phase, and the split, assigned before `check` was run on anything).

This script runs the installed CLI on each case (`zerodoctor check <case> --format json`, one subprocess each),
maps the verdict (`will fail` -> predicts fails; `ready` / `ready with warnings` -> predicts runs; `could not check`
-> abstains) and prints, per split: accuracy on the decided cases, abstentions, false alarms (a `runs` case called
`will fail`), misses (a `fails` case called ready), and, for caught failures with a known phase, whether the first
error's phase matches. Then one row per case.

    python benchmarks/check_truth.py [--cases DIR] [--json OUT]

The cases are run as given. `--probe-host-ram GIB` is a second, labelled measurement that isolates the GPU-memory
judgement from two inputs most threads do not state: each case is copied to a temporary folder, an env.txt that
lists no package is dropped (so `check` judges this machine's stack, which its report names), and `--host-ram GIB`
is passed where cluster.yaml gives no host RAM. It invents no value a thread states otherwise.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
CASES = HERE / "check_truth" / "cases"
PREDICTS = {
    "will fail": "fails",
    "ready": "runs",
    "ready with warnings": "runs",
    "could not check": "abstain",
}


@dataclass(frozen=True)
class Row:
    case: str
    split: str
    expected: str
    verdict: str
    predicted: str
    outcome: str  # hit, miss, false_alarm, abstain
    truth_phase: str
    first_error_phase: str
    first_error: str
    seconds: float
    note: str


def _lists_packages(env: Path) -> bool:
    return any(line.strip() and not line.lstrip().startswith("#") for line in env.read_text().splitlines())


def run_case(cli: str, case: Path, probe_host_ram: float | None = None) -> Row:
    import time

    truth = yaml.safe_load((case / "truth.yaml").read_text())
    target, extra = str(case), []
    if (case / "env.txt").is_file() and not _lists_packages(case / "env.txt"):
        # the thread states no versions: say so (`--env none`), rather than judging this machine's stack
        extra = ["--env", "none"]
    with tempfile.TemporaryDirectory() as tmp:
        if probe_host_ram is not None:
            copy = Path(tmp) / case.name
            shutil.copytree(case, copy)
            if (copy / "env.txt").is_file() and not _lists_packages(copy / "env.txt"):
                (copy / "env.txt").unlink()
            cluster = yaml.safe_load((copy / "cluster.yaml").read_text()) or {}
            if "host_ram_gib" not in cluster:
                extra = [*extra, "--host-ram", str(probe_host_ram)]
            target = str(copy)
        start = time.perf_counter()
        proc = subprocess.run(
            [cli, "check", target, "--format", "json", *extra],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
    seconds = time.perf_counter() - start
    note = ""
    try:
        report = json.loads(proc.stdout)
    except json.JSONDecodeError:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        report = {"verdict": f"exit {proc.returncode}, no report", "findings": []}
        note = tail[0].replace(str(case), "<case>")
    verdict = str(report.get("verdict"))
    predicted = PREDICTS.get(verdict, "abstain")
    errors = [f for f in report.get("findings", []) if f.get("severity") == "error"]
    first = errors[0] if errors else {}
    expected = truth["expected"]
    if predicted == "abstain":
        outcome = "abstain"
    elif predicted == expected:
        outcome = "hit"
    else:
        outcome = "false_alarm" if expected == "runs" else "miss"
    return Row(
        case=case.name,
        split=truth["split"],
        expected=expected,
        verdict=verdict,
        predicted=predicted,
        outcome=outcome,
        truth_phase=str(truth.get("phase") or "-"),
        first_error_phase=str(first.get("data", {}).get("phase", "-")) if first else "-",
        first_error=str(first.get("name") or first.get("id") or "-"),
        seconds=round(seconds, 2),
        note=note,
    )


def summary(rows: list[Row]) -> dict[str, object]:
    decided = [r for r in rows if r.outcome != "abstain"]
    hits = [r for r in decided if r.outcome == "hit"]
    caught = [r for r in hits if r.expected == "fails"]
    phased = [r for r in caught if r.truth_phase not in ("-", "unknown")]
    return {
        "cases": len(rows),
        "fails": sum(r.expected == "fails" for r in rows),
        "runs": sum(r.expected == "runs" for r in rows),
        "decided": len(decided),
        "correct": len(hits),
        "accuracy_on_decided": round(len(hits) / len(decided), 3) if decided else None,
        "abstained": len(rows) - len(decided),
        "abstained_fails": sum(r.outcome == "abstain" and r.expected == "fails" for r in rows),
        "abstained_runs": sum(r.outcome == "abstain" and r.expected == "runs" for r in rows),
        "false_alarms": sum(r.outcome == "false_alarm" for r in rows),
        "misses": sum(r.outcome == "miss" for r in rows),
        "caught_failures": len(caught),
        "caught_with_known_phase": len(phased),
        "phase_matches": sum(r.first_error_phase == r.truth_phase for r in phased),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=Path, default=CASES)
    parser.add_argument("--json", type=Path, help="also write rows and summaries here")
    parser.add_argument(
        "--probe-host-ram",
        type=float,
        metavar="GIB",
        help="labelled probe: drop package-less env.txt files and pass this host RAM where cluster.yaml has none",
    )
    args = parser.parse_args(argv)
    cli = shutil.which("zerodoctor")
    if cli is None:
        print("zerodoctor is not on PATH: activate the virtualenv it is installed in", file=sys.stderr)
        return 2
    cases = sorted(p for p in args.cases.iterdir() if (p / "truth.yaml").is_file())
    rows = [run_case(cli, c, args.probe_host_ram) for c in cases]
    mode = (
        "as given"
        if args.probe_host_ram is None
        else f"probe: host RAM {args.probe_host_ram:g} GiB where unstated"
    )
    print(f"# zerodoctor check on {len(rows)} cases ({mode})")
    sums = {split: summary([r for r in rows if r.split == split]) for split in ("tune", "heldout")}
    sums["all"] = summary(rows)
    for split, s in sums.items():
        print(f"## {split}: " + ", ".join(f"{k}={v}" for k, v in s.items()))
    print()
    print(
        f"{'case':48} {'split':7} {'truth':5} {'verdict':19} {'outcome':11} {'phase truth -> 1st error':40} first error"
    )
    for r in rows:
        phases = f"{r.truth_phase} -> {r.first_error_phase}"
        print(
            f"{r.case:48} {r.split:7} {r.expected:5} {r.verdict:19} {r.outcome:11} {phases:40} {r.first_error} {r.note}"
        )
    if args.json:
        args.json.write_text(
            json.dumps({"summary": sums, "rows": [asdict(r) for r in rows]}, indent=1) + "\n"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
