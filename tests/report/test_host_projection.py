"""The report's host-RAM projection (review R2 finding 10): no trend from a few warm-up steps, the job's own
RSS (summed over the node's ranks) rather than node memory when there is no cgroup limit, and a confidence
that says how far to trust the line. Through `main(["report", ...])` on runs in the guard's record format."""

from __future__ import annotations

import json
from pathlib import Path

from zerodoctor.cli.main import main

GIB = 1 << 30
MIB = 1 << 20


def _run(root: Path, *, steps: int, rss_per_step: int, node_per_step: int, ranks: int = 2) -> Path:
    d = root / "zerodoctor"
    d.mkdir(parents=True)
    t0 = 1_800_000_000.0
    for rank in range(ranks):
        recs: list[dict] = [
            {
                "kind": "meta",
                "t": t0,
                "rank": rank,
                "host": "vm",
                "local_rank": rank,
                "world_size": ranks,
                "versions": {},
                "not_available": [],
            },
        ]
        for step in range(steps + 1):
            phase = "first_optimizer_step" if step <= 1 else "save" if step and step % 50 == 0 else "train"
            recs.append(
                {
                    "kind": "sample",
                    "t": t0 + 10 * step,
                    "rank": rank,
                    "step": step,
                    "phase": phase,
                    "rss": 2 * GIB + step * rss_per_step,
                    "node_used": 8 * GIB + step * node_per_step,
                    "node_total": 24 * GIB,
                    "cgroup_usage": 3 * GIB + step * rss_per_step,
                }
            )
        (d / f"rank{rank}.jsonl").write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    return root


def _report(run_dir: Path, capsys) -> dict:
    assert main(["report", str(run_dir), "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)


def _projections(doc: dict) -> list[dict]:
    return [f for f in doc["findings"] if f["id"] == "report.host-ram-projection"]


def test_four_steps_of_a_tiny_job_are_no_trend(tmp_path, capsys):
    # the README demo's shape: node memory rises ~40 MiB per step over 4 steps of warm-up
    doc = _report(_run(tmp_path, steps=4, rss_per_step=2 * MIB, node_per_step=40 * MIB), capsys)
    assert not _projections(doc)
    assert doc["nodes"][0]["projection"] is None


def test_other_processes_growing_node_memory_are_not_the_job(tmp_path, capsys):
    doc = _report(_run(tmp_path, steps=200, rss_per_step=0, node_per_step=60 * MIB), capsys)
    assert not _projections(doc)
    node = doc["nodes"][0]
    assert node["measure"] == "job RSS" and node["projection"]["exhaustion_step"] is None


def test_a_job_whose_rss_grows_gets_a_projection_with_its_confidence(tmp_path, capsys):
    doc = _report(_run(tmp_path, steps=200, rss_per_step=20 * MIB, node_per_step=40 * MIB), capsys)
    (f,) = _projections(doc)
    node = doc["nodes"][0]
    # two ranks: 40 MiB per step of job RSS; 24 - (8 + 200 x 40 MiB) GiB free at step 200 on top of its RSS
    assert abs(node["projection"]["slope_bytes_per_step"] - 40 * MIB) < MIB
    assert node["projection"]["confidence"] == "high" and node["projection"]["calm_steps"] == 60
    assert "the job RSS on vm grows 40.0 MiB per step" in f["message"]
    assert "confidence high: a straight line through 60 calm steps" in f["message"]
