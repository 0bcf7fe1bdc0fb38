"""A synthetic guarded run (4 ranks on 2 nodes, with GPU telemetry) written in the guard's record format, so
the report's judgements and charts are tested without a GPU; the real-engine run is reported in tests/guard."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

GIB = 1 << 30
MIB = 1 << 20


def write_run(root: Path, *, steps: int = 40) -> Path:
    d = root / "zerodoctor"
    d.mkdir(parents=True)
    t0 = 1_800_000_000.0
    for rank in range(4):
        host, local = ("node-a", rank) if rank < 2 else ("node-b", rank - 2)
        recs = [
            {
                "kind": "meta",
                "t": t0,
                "rank": rank,
                "host": host,
                "local_rank": local,
                "world_size": 4,
                "versions": {"torch": "2.4.0", "deepspeed": "0.15.0"},
                "not_available": [],
            },
            {"kind": "event", "t": t0, "rank": rank, "event": "train_begin", "step": 0},
        ]
        if rank == 0:
            recs.append(
                {
                    "kind": "prediction",
                    "t": t0,
                    "rank": 0,
                    "available": True,
                    "strategy": "ZeRO-3",
                    "phases": {
                        "steady": {"gpu_bytes": 30 * GIB, "host_bytes_per_node": 200 * GIB},
                        "save": {"gpu_bytes": 34 * GIB, "host_bytes_per_node": 230 * GIB},
                    },
                }
            )
        for step in range(1, steps + 1):
            t = t0 + step * 10
            phase = "first_optimizer_step" if step == 1 else "save" if step % 20 == 0 else "train"
            alloc = (28 + (6 if rank == 3 else 0)) * GIB + (2 * GIB if phase == "save" else 0)
            if step == 1:
                recs.append(
                    {"kind": "event", "t": t, "rank": rank, "event": "first_optimizer_step", "step": 1}
                )
            if step % 20 == 0:
                recs.append({"kind": "event", "t": t, "rank": rank, "event": "save_begin", "step": step})
            if step == 30:
                recs.append(
                    {"kind": "event", "t": t, "rank": rank, "event": "evaluation_begin", "step": step}
                )
            if step == 25:
                recs.append({"kind": "event", "t": t, "rank": rank, "event": "epoch_end", "step": step})
            recs.append(
                {
                    "kind": "sample",
                    "t": t,
                    "rank": rank,
                    "step": step,
                    "optimizer_step": step,
                    "phase": phase,
                    "gpu_allocated": alloc,
                    "gpu_allocated_peak": alloc + GIB,
                    "gpu_reserved": alloc + 3 * GIB,
                    "gpu_reserved_peak": alloc + 4 * GIB,
                    "gpu_active": alloc,
                    "gpu_alloc_retries": 2 if rank == 1 else 0,
                    "gpu_ooms": 0,
                    "gpu_free": 80 * GIB - alloc - 5 * GIB,
                    "gpu_total": 80 * GIB,
                    "gpu_non_pytorch": 2 * GIB,
                    "rss": 40 * GIB + step * 50 * MIB,
                    "rss_hwm": 41 * GIB + step * 50 * MIB,
                    "node_used": 150 * GIB + step * GIB,
                    "node_total": 1024 * GIB,
                    "cgroup_usage": 150 * GIB + step * GIB,
                    "cgroup_limit": 250 * GIB,
                }
            )
            if step % 20 == 0:
                recs.append(
                    {
                        "kind": "event",
                        "t": t + 5,
                        "rank": rank,
                        "event": "save_end",
                        "step": step,
                        "seconds": 5.0,
                        "gpu_allocated_peak": alloc + 2 * GIB,
                        "rss_hwm": None,
                    }
                )
        recs.append(
            {
                "kind": "finding",
                "t": t0,
                "rank": rank,
                "step": 1,
                "finding": {
                    "id": "guard.max-steps-below-epoch",
                    "severity": "warning",
                    "title": "training will stop early",
                    "message": "max_steps=40 ...",
                    "fixes": ["remove max_steps"],
                    "evidence": [],
                    "references": [],
                },
            }
        )
        lines = [json.dumps(r) for r in recs]
        if rank == 2:
            lines.append('{"kind":"sample","t":1,"ra')  # killed mid-write
        (d / f"rank{rank}.jsonl").write_text("\n".join(lines) + "\n")
    (d / "stacks-rank1.txt").write_text(
        "Timeout (0:10:00)!\nThread 0x00007f (most recent call first):\n"
        '  File "/x/torch/distributed/distributed_c10d.py", line 3700 in all_reduce\n'
        '  File "/x/deepspeed/runtime/zero/stage3.py", line 2100 in _reduce\n'
        '  File "train.py", line 50 in main\n'
    )
    (d / "error-rank3.json").write_text(
        json.dumps(
            {
                "time": "2027-01-15T08:00:00.000Z",
                "rank": 3,
                "host": "node-b",
                "step": 40,
                "phase": "save",
                "type": "torch.OutOfMemoryError",
                "message": "CUDA out of memory. Tried to allocate 3.39 GiB.",
                "diagnosis": {
                    "id": "z3-save-consolidation-oom",
                    "title": "OOM while saving",
                    "message": "...",
                    "fixes": ["set save_only_model"],
                    "references": ["hiyouga/LlamaFactory#7532"],
                },
            }
        )
    )
    return root


@pytest.fixture(scope="session")
def synthetic_run(tmp_path_factory) -> Path:
    return write_run(tmp_path_factory.mktemp("report") / "run")
