"""Issue 11: a 2 GB log read in bounded memory, four ways: a plain file, gzip, stdin, and a truncated gzip.

The log is the speed benchmark's hit-dense log of real-run lines (8 ranks, per-step DeepSpeed memory lines,
trace-cache warnings) ending in a host OOM kill, built to `--size-mb`. Each way runs `zerodoctor diagnose` in a
fresh process under `/usr/bin/time -v` and records wall time, peak RSS and the verdict's first line; the
truncated gzip must still name what it could read and say where it stopped.

Usage:
    python benchmarks/diagnose_big_log.py [--size-mb 2048] [--work /tmp/zd-big] [--keep]
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from diagnose_speed import generate  # noqa: E402

TARGET_RSS_MB = 200


def _zd() -> str:
    here = Path(sys.executable).parent / "zerodoctor"
    return str(here) if here.exists() else "zerodoctor"


def _measure(label: str, shell: str) -> dict[str, object]:
    proc = subprocess.run(
        ["/usr/bin/time", "-v", "bash", "-c", shell], capture_output=True, text=True, check=False
    )
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", proc.stderr)
    wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): ([\d:.]+)", proc.stderr)
    first = next((ln for ln in proc.stdout.splitlines() if ln.strip()), "")
    stopped = next((ln.strip() for ln in proc.stdout.splitlines() if "stopped" in ln.lower()), "")
    return {
        "way": label,
        "exit": proc.returncode,
        "peak_rss_mb": int(rss.group(1)) / 1024 if rss else None,
        "wall": wall.group(1) if wall else None,
        "verdict": first[:160],
        "stopped_note": stopped[:200],
        "traceback": "Traceback" in proc.stderr,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-mb", type=int, default=2048)
    ap.add_argument("--work", type=Path, default=Path("/tmp/zd-big"))
    ap.add_argument("--keep", action="store_true", help="keep the logs in --work")
    args = ap.parse_args()
    work = args.work
    work.mkdir(parents=True, exist_ok=True)
    plain = work / "run.log"
    fresh = (
        not plain.exists() or abs(plain.stat().st_size - args.size_mb * 2**20) > args.size_mb * 2**20 * 0.05
    )
    if fresh:
        generate(plain, args.size_mb, dense=True)
    gz = work / "run.log.gz"
    if fresh or not gz.exists():
        subprocess.run(f"gzip -1 -c {plain} > {gz}", shell=True, check=True)
    cut = work / "run.truncated.log.gz"
    with gz.open("rb") as src, cut.open("wb") as dst:
        dst.write(src.read(gz.stat().st_size * 2 // 3))  # two thirds of the compressed stream
    zd = _zd()
    rows = [
        _measure("plain file", f"{zd} diagnose {plain}"),
        _measure("gzip", f"{zd} diagnose {gz}"),
        _measure("stdin", f"cat {plain} | {zd} diagnose -"),
        _measure("truncated gzip", f"{zd} diagnose {cut}"),
    ]
    print(f"log: {plain.stat().st_size / 2**30:.2f} GiB plain, {gz.stat().st_size / 2**20:,.0f} MiB gzip\n")
    print(f"{'way':16} {'exit':>4} {'peak RSS MiB':>13} {'wall':>9}  verdict / where it stopped")
    for r in rows:
        print(f"{r['way']:16} {r['exit']:>4} {r['peak_rss_mb']:>13.0f} {r['wall']:>9}  {r['verdict']}")
        if r["stopped_note"]:
            print(f"{'':47}{r['stopped_note']}")
    ok = all(
        r["peak_rss_mb"] is not None and r["peak_rss_mb"] < TARGET_RSS_MB and not r["traceback"] for r in rows
    )
    print(f"\nall under {TARGET_RSS_MB} MiB and no traceback: {ok}")
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
