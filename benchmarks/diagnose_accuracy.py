"""Accuracy of `zerodoctor diagnose` on the corpus of real logs (tests/diagnose/corpus/expected*.yaml).

    python benchmarks/diagnose_accuracy.py [--split tune|heldout|dev|all] [--manifest GLOB] [--batch N ...]

Splits: `dev` = the project's earlier corpus (built with the knowledge base, tuned on); `tune` and `heldout` =
logs from public threads (issue 10), split before any tuning; score `heldout` only at the end of a piece of
work. Reported per split: top-1 (findings[0] is `top` or one of `accept`; for a log without failure: no
`error` finding), the phase rate (where a phase is labelled) three ways: over all phase labels, over those
the pasted log itself shows (`phase_evidence: log`) and over those only the thread's prose gives
(`thread`), the first-failure rank rate (where known), and false alarms (an `error` finding on a log
without failure). Each miss is listed (phase misses with their evidence). `--batch` keeps the cases of the
given collection batches (`batch:` in the manifest; the project's own logs count as batch 1).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from zerodoctor.diagnose import diagnose  # noqa: E402
from zerodoctor.report.diagnose import document  # noqa: E402

CORPUS = ROOT / "tests/diagnose/corpus"


def score(cases: list[dict[str, object]]) -> dict[str, object]:
    n = top_ok = strict_ok = phase_n = phase_ok = rank_n = rank_ok = healthy_n = false_alarms = 0
    by_evidence = {"log": [0, 0], "thread": [0, 0]}  # right, labelled
    misses: list[str] = []
    for case in cases:
        log = CORPUS / str(case["log"])
        env = case.get("env")
        versions: dict[str, str] = {}
        if env:
            for line in (CORPUS / str(env)).read_text().splitlines():
                if "==" in line:
                    k, v = line.split("==", 1)
                    versions[k.strip().lower()] = v.strip()
        result = diagnose([str(log)], versions=versions)
        doc = json.loads(json.dumps(document(result), default=str))
        findings = doc["findings"]
        errors = [f["id"] for f in findings if f["severity"] == "error"]
        n += 1
        if case["top"] is None:
            healthy_n += 1
            ok = not errors
            false_alarms += 0 if ok else 1
        else:
            want = {case["top"], *(case.get("accept") or [])}
            ok = bool(findings) and findings[0]["id"] in want
            # strict: only the label itself, not the `accept` list (where a generic class such as class:crash may
            # stand beside a specific KB entry)
            strict_ok += bool(findings) and findings[0]["id"] == case["top"]
        if case["top"] is None:
            strict_ok += ok
        top_ok += ok
        if not ok:
            got = findings[0]["id"] if findings else None
            misses.append(
                f"top   {case['log']}: got {got} ({findings[0]['severity'] if findings else '-'}), want {case['top']}"
            )
        if case.get("phase") is not None:
            phase_n += 1
            got_phase = findings[0].get("data", {}).get("phase") if findings else None
            evidence = str(case.get("phase_evidence") or "unlabelled")
            right = got_phase == case["phase"]
            phase_ok += right
            if evidence in by_evidence:
                by_evidence[evidence][0] += right
                by_evidence[evidence][1] += 1
            if not right:
                misses.append(
                    f"phase {case['log']}: got {got_phase}, want {case['phase']} ({evidence} evidence)"
                )
        if case.get("first_failure_rank") is not None:
            rank_n += 1
            ff = (findings[0].get("data", {}).get("first_failure") or {}) if findings else {}
            if ff.get("rank") == case["first_failure_rank"]:
                rank_ok += 1
            else:
                misses.append(f"rank  {case['log']}: got {ff.get('rank')}, want {case['first_failure_rank']}")
    return {
        "logs": n,
        "top1": (top_ok, n),
        "top1_strict": (strict_ok, n),
        "phase": (phase_ok, phase_n),
        "phase_log": tuple(by_evidence["log"]),
        "phase_thread": tuple(by_evidence["thread"]),
        "first_failure_rank": (rank_ok, rank_n),
        "false_alarms": (false_alarms, healthy_n),
        "misses": misses,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--split", default="tune", choices=["tune", "heldout", "dev", "all"])
    ap.add_argument("--quiet", action="store_true", help="do not list the misses")
    ap.add_argument(
        "--manifest", default="expected*.yaml", help="which manifests to score (a glob in the corpus)"
    )
    ap.add_argument(
        "--batch",
        type=int,
        action="append",
        help="score only this collection batch (repeatable; own logs: 1)",
    )
    args = ap.parse_args()
    cases = [
        case
        for manifest in sorted(CORPUS.glob(args.manifest))
        for case in yaml.safe_load(manifest.read_text(encoding="utf-8")) or []
    ]
    if args.batch:
        cases = [c for c in cases if int(c.get("batch", 1)) in args.batch]
    splits = ["dev", "tune", "heldout"] if args.split == "all" else [args.split]
    for split in splits:
        chosen = [c for c in cases if c.get("split", "dev") == split]
        r = score(chosen)

        def pct(t: object) -> str:
            a, b = t  # type: ignore[misc]
            return f"{a}/{b} ({100 * a / b:.0f} %)" if b else "n/a"

        print(
            f"{split:8} logs {r['logs']:3}  top-1 {pct(r['top1'])} (strict {pct(r['top1_strict'])})  phase {pct(r['phase'])} "
            f"(log-evidenced {pct(r['phase_log'])}, thread-only {pct(r['phase_thread'])})  "
            f"first-failure rank {pct(r['first_failure_rank'])}  false alarms {pct(r['false_alarms'])}"
        )
        if not args.quiet:
            for m in r["misses"]:  # type: ignore[attr-defined]
                print("   ", m)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
