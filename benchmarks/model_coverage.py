"""How many of the hub ids users pick resolve offline from the bundled catalog (issue 9).

Reads a list of hub ids (one per line, `#` starts a comment; default: every model LLaMA-Factory registers,
`benchmarks/data/llamafactory_model_ids.txt`, whose header names the source commit) and resolves each one
with `zerodoctor.models.resolve_model` exactly as `zerodoctor plan --model <id>` would, with the Hugging
Face cache pointed at an empty directory so that only the bundled catalog can answer. Reports the share
that resolves, per family (the hub id's name up to its size, `Qwen2.5-7B-Instruct` -> `Qwen2.5`), and lists
the ids that do not.

Pre-quantized checkpoints (GPTQ, AWQ, `-Int4`, `-8bits`, ...) are counted apart as well: they resolve to their
16-bit base's shapes with the quantization recorded (`ModelSpec.quantization`: method and bits from the hub id's
suffix), only when the base itself resolves exactly; the report says how many of them resolve, how many are
4-bit (what the planner models) and how many 8-bit (resolved, refused by the planner with its reason), and the
share without them says how much of what users fine-tune in 16 bits is covered.

Usage:
    python benchmarks/model_coverage.py [IDS_FILE] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

DEFAULT_IDS = Path(__file__).resolve().parent / "data" / "llamafactory_model_ids.txt"

_SIZE = re.compile(r"^(\d+(\.\d+)?[bBmMkK]|\d+x\d+[bB]|[eE]\d+[bB]|[aA]\d+(\.\d+)?[bB])$")
"""A size word (`7B`, `270m`, `8x7B`, `E4B`, `A3B`); a bare number (`gemma-3`) is a version."""


_PREQUANTIZED = re.compile(r"(gptq|awq|[-_]int[48]\b|[-_][48]bits?\b)", re.IGNORECASE)
"""A hub id naming a pre-quantized checkpoint (`-GPTQ-Int4`, `-AWQ`, `-Chat-4bits`, `-Chat-8bit`)."""


def is_prequantized(hub_id: str) -> bool:
    return bool(_PREQUANTIZED.search(hub_id.rsplit("/", 1)[-1]))


def _bits(hub_id: str) -> int | None:
    """The bits `resolve_model` records for a pre-quantized id (None: not resolved or not quantized)."""
    from zerodoctor.errors import ZeroDoctorError
    from zerodoctor.models import resolve_model

    try:
        q = resolve_model(hub_id).quantization
    except ZeroDoctorError:
        return None
    return q.bits if q is not None else None


def family(hub_id: str) -> str:
    """The hub id's name up to its first size-like word: `Qwen/Qwen2.5-7B-Instruct` -> `Qwen2.5`."""
    name = hub_id.rsplit("/", 1)[-1]
    words: list[str] = []
    for word in re.split(r"[-_]", name):
        if words and _SIZE.match(word):
            break
        words.append(word)
    return "-".join(words) or name


def read_ids(path: Path) -> list[str]:
    ids: list[str] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line and line not in ids:
            ids.append(line)
    return ids


def coverage(ids: list[str]) -> dict[str, tuple[list[str], list[tuple[str, str]]]]:
    """family -> (resolved ids, [(unresolved id, why)])."""
    from zerodoctor.errors import ZeroDoctorError
    from zerodoctor.models import resolve_model

    out: dict[str, tuple[list[str], list[tuple[str, str]]]] = defaultdict(lambda: ([], []))
    for hub_id in ids:
        fam = family(hub_id)
        try:
            resolve_model(hub_id)
        except ZeroDoctorError as exc:
            out[fam][1].append((hub_id, str(exc).split(";", 1)[0]))
        else:
            out[fam][0].append(hub_id)
    return dict(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ids", nargs="?", type=Path, default=DEFAULT_IDS)
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    args = parser.parse_args(argv)
    ids = read_ids(args.ids)
    with tempfile.TemporaryDirectory() as empty:
        for var in ("HF_HOME", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
            os.environ[var] = empty
        result = coverage(ids)
    done = sum(len(ok) for ok, _ in result.values())
    if args.json:
        print(json.dumps({"ids": len(ids), "resolved": done,
                          "prequantized": sorted(i for i in ids if is_prequantized(i)), "families": {
            fam: {"resolved": ok, "unresolved": [i for i, _ in miss]} for fam, (ok, miss) in result.items()
        }}, indent=1))  # fmt: skip
        return 0
    print(
        f"{args.ids.name}: {done}/{len(ids)} hub ids resolve offline ({100 * done / max(len(ids), 1):.1f} %)"
    )
    plain = [i for i in ids if not is_prequantized(i)]
    resolved = {i for ok, _ in result.values() for i in ok}
    plain_done = sum(i in resolved for i in plain)
    print(
        f"without the {len(ids) - len(plain)} pre-quantized checkpoints (GPTQ/AWQ/Int4/Int8/4-8 bit): "
        f"{plain_done}/{len(plain)} ({100 * plain_done / max(len(plain), 1):.1f} %)"
    )
    quantized = [i for i in ids if is_prequantized(i)]
    q_done = [i for i in quantized if i in resolved]
    eight = [i for i in q_done if _bits(i) == 8]
    print(
        f"pre-quantized checkpoints that resolve to their 16-bit base: {len(q_done)}/{len(quantized)} "
        f"({len(q_done) - len(eight)} 4-bit, {len(eight)} 8-bit: resolved, refused by the planner)"
    )
    print(f"{'family':<28} {'resolved':>8} {'of':>4}")
    rows = sorted(result.items(), key=lambda kv: (-len(kv[1][0]) - len(kv[1][1]), kv[0].lower()))
    for fam, (ok, miss) in rows:
        print(f"{fam:<28} {len(ok):>8} {len(ok) + len(miss):>4}")
    print("\nunresolved:")
    for fam, (_, miss) in rows:
        for hub_id, _why in miss:
            print(f"  {fam:<26} {hub_id}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
