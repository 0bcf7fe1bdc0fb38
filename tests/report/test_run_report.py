"""`zerodoctor report RUN_DIR`: judgements across ranks, JSON, HTML page and PNGs; the page in headless
Chromium must render every chart without a console error."""

from __future__ import annotations

import json

import pytest

from zerodoctor.cli.main import main
from zerodoctor.report.run_report import load_run

from .chromium import open_in_chromium


def test_findings_across_ranks(synthetic_run):
    r = load_run(synthetic_run)
    ids = [f.id for f in r.findings]
    assert r.outliers == (3,)  # rank 3 holds 6 GiB more than the others
    assert ids.count("guard.max-steps-below-epoch") == 1  # same finding from 4 ranks, reported once
    assert "report.fragmentation" in ids  # rank 1 had allocator retries
    (hang,) = [f for f in r.findings if f.id == "report.hang-stacks"]
    assert hang.data["ranks_dumped"] == [1] and hang.data["ranks_quiet"] == [0, 2, 3]
    assert "all_reduce (distributed_c10d.py:3700)" in hang.message
    (fail,) = [f for f in r.findings if f.id == "report.rank-failed"]
    assert "rank 3" in fail.message and "OOM while saving" in fail.message
    proj = {f.data["host"]: f for f in r.findings if f.id == "report.host-ram-projection"}
    # 1 GiB per step from 150 + 40 GiB at step 40 toward the 250 GiB cgroup limit: step 100
    assert proj["node-a"].data["exhaustion_step"] == 100
    assert any("unreadable line" in n for n in r.notes)
    assert r.markers()["save"] == [20, 40] and r.markers()["first_optimizer_step"] == [1]


def test_json_has_the_same_data(synthetic_run, capsys):
    assert main(["report", str(synthetic_run), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["command"] == "report" and doc["outlier_ranks"] == [3]
    assert [r["rank"] for r in doc["ranks"]] == [0, 1, 2, 3] and len(doc["nodes"]) == 2
    assert doc["nodes"][0]["limit"] == 250 * 2**30 and doc["summary"]["error"] == 1


def test_fail_on_and_bad_input(synthetic_run, tmp_path, capsys):
    assert main(["report", str(synthetic_run), "--format", "json", "--fail-on", "error"]) == 1
    assert main(["report", str(tmp_path)]) == 2
    assert "no zerodoctor/ folder" in capsys.readouterr().err
    (tmp_path / "zerodoctor").mkdir()
    assert main(["report", str(tmp_path)]) == 2
    assert "no rank*.jsonl guard records" in capsys.readouterr().err


def test_html_page_and_pngs_render_in_headless_chromium(synthetic_run, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    out = tmp_path / "page"
    assert main(["report", str(synthetic_run), "--out", str(out)]) == 0
    assert "index.html" in capsys.readouterr().out
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert pngs == ["gpu_outside.png", "gpu_per_rank.png", "host_nodes.png", "host_per_rank.png"]
    assert all((out / p).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in pngs)
    html = (out / "index.html").read_text()
    for ref in ('src="http', "src='http", 'href="http', "url(http", "@import", "<link"):  # nothing to fetch
        assert ref not in html
    assert "rank 3" in html and "OUTLIER" in html
    dom, console = open_in_chromium(out / "index.html", tmp_path / "profile")
    assert console == []
    assert 'data-charts="4/4"' in dom


def test_charts_hold_what_the_report_promises(synthetic_run):
    """Each chart's own text (kept as text in the inline SVG): the event markers, the planner's band, the
    limit with the projected exhaustion point, the outlier rank, fragmentation and non-PyTorch memory apart."""
    pytest.importorskip("matplotlib")
    from zerodoctor.report.plots import render_charts

    charts = {c.name: c for c in render_charts(load_run(synthetic_run))}
    gpu = charts["gpu_per_rank"].svg
    for label in ("first optimizer step", "epoch end", "evaluation", "checkpoint save"):
        assert label in gpu, label
    assert "planner prediction (phases)" in gpu and "optimizer step" in gpu
    for rank in range(4):  # small multiples: one panel per rank on the shared step axis
        assert f"rank {rank} (node-" in gpu
    assert "rank 3 (node-b, local 1)  OUTLIER" in gpu
    outside = charts["gpu_outside"].svg
    assert "reserved but not allocated (fragmentation)" in outside and "allocator retries" in outside
    assert "outside PyTorch&#39;s allocator" in outside or "outside PyTorch's allocator" in outside
    host = charts["host_nodes"].svg
    assert "host RAM on node-a" in host and "host RAM on node-b" in host
    assert "limit 250.0 GiB" in host and "trend: limit at step 100" in host
    assert "used (job cgroup)" in host and "planner prediction (phases)" in host
    assert charts["host_per_rank"].points == 4 * 40 * 2  # RSS and its high-water mark, 40 steps, 4 ranks
    assert (
        "planner prediction (phases)" in charts["host_per_rank"].svg
    )  # the per-rank share of the node figure


def test_empty_chart_is_caught_by_the_page_check(tmp_path):
    page = tmp_path / "bad.html"
    page.write_text(
        '<html><body><figure class="chart" id="chart-x"><svg width="10" height="10"></svg></figure>'
        + _page_script()
        + "</body></html>"
    )
    dom, console = open_in_chromium(page, tmp_path / "profile")
    assert 'data-charts="0/1"' in dom and any("empty chart chart-x" in c for c in console)


def _page_script() -> str:
    from zerodoctor.report.run_html import _SCRIPT

    return f"<script>{_SCRIPT}</script>"
