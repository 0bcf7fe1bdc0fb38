"""One self-contained HTML page for a guarded run: everything inline (CSS, SVG charts, a few lines of
script that check the charts rendered), no network, so it opens on an air-gapped cluster."""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from typing import Any

from zerodoctor import __version__
from zerodoctor.findings import Finding, sort_findings
from zerodoctor.report.plots import Chart
from zerodoctor.report.run_report import GIB, RunReport
from zerodoctor.textutil import clip

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:1.5em auto;max-width:1180px;color:#222}
h1{font-size:1.5em;margin-bottom:.2em} h2{font-size:1.15em;margin-top:1.6em;border-bottom:1px solid #ddd}
.meta{color:#555;font-size:.9em} table{border-collapse:collapse;font-size:.85em;margin:.5em 0}
td,th{border:1px solid #ddd;padding:3px 8px;text-align:left;vertical-align:top} th{background:#f4f4f4}
.finding{border-left:5px solid #999;padding:.4em .8em;margin:.6em 0;background:#fafafa}
.error{border-color:#c00000}.warning{border-color:#e69500}.info{border-color:#3a7bd5}
.sev{font-weight:bold;text-transform:uppercase;font-size:.8em;margin-right:.5em}
.chart svg{width:100%;height:auto} .note{color:#666;font-size:.9em} .fix{margin:.15em 0 0 1em;font-size:.9em}
code{background:#f2f2f2;padding:0 3px}
"""

# Checks, in the reader's browser, that each chart has drawn content; the result lands in the page's
# data-charts attribute (a headless test reads it) and a console error names an empty chart.
_SCRIPT = """
(function(){
  var charts=document.querySelectorAll('figure.chart'); var ok=0;
  charts.forEach(function(f){
    var svg=f.querySelector('svg'); var n=svg?svg.querySelectorAll('path,use,polyline,line').length:0;
    var box=svg?svg.getBoundingClientRect():{width:0,height:0};
    if(n>20&&box.width>100&&box.height>50){ok++;}else{console.error('zerodoctor: empty chart '+f.id);}
  });
  document.body.setAttribute('data-charts', ok+'/'+charts.length);
})();
"""


def _e(text: Any) -> str:
    return html.escape(str(text), quote=True)


def _gib(v: Any) -> str:
    return f"{v / GIB:.2f} GiB" if isinstance(v, int | float) else "-"


def _finding(f: Finding) -> str:
    fixes = "".join(f'<div class="fix">fix: {_e(x.text)}</div>' for x in f.fixes[:3])
    refs = f'<div class="note">sources: {_e(", ".join(f.references))}</div>' if f.references else ""
    return (
        f'<div class="finding {f.severity.label}"><span class="sev">{f.severity.label}</span>'
        f"<b>{_e(f.title)}</b> <code>{_e(f.id)}</code><div>{_e(f.message)}</div>{fixes}{refs}</div>"
    )


def _table(head: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    h = "".join(f"<th>{_e(c)}</th>" for c in head)
    body = "".join("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><tr>{h}</tr>{body}</table>"


GENERATOR_META = '<meta name="generator" content="zerodoctor report">'
"""Marks a page as zerodoctor's, so that a later `report --out` may replace it (and nothing else)."""


def is_report_page(head: bytes) -> bool:
    """Whether a file starting with `head` is a page `zerodoctor report` wrote (pages from before
    GENERATOR_META are known by their title)."""
    return GENERATOR_META.encode() in head or b"<title>zerodoctor report: " in head


def render_run_html(report: RunReport, charts: Sequence[Chart], findings: Sequence[Finding]) -> str:
    ranks = report.ranks
    hosts = sorted({r.host for r in ranks})
    versions = ranks[0].meta.get("versions", {}) if ranks else {}
    last_step = max((int(s.get("step", 0)) for r in ranks for s in r.samples), default=0)
    parts = [
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">{GENERATOR_META}',
        f"<title>zerodoctor report: {_e(report.run_dir)}</title><style>{_CSS}</style></head><body>",
        f'<h1>zerodoctor report</h1><div class="meta">{_e(report.run_dir)} &middot; {len(ranks)} rank(s) on '
        f"{len(hosts)} node(s) ({_e(', '.join(hosts))}) &middot; last step {last_step} &middot; "
        f"{_e(', '.join(f'{k} {v}' for k, v in versions.items()))} &middot; zerodoctor {__version__}</div>",
        "<h2>Findings</h2>",
    ]
    ordered = sort_findings(list(findings))
    parts += [_finding(f) for f in ordered] or ['<p class="note">no findings</p>']
    parts.append("<h2>Memory timelines</h2>")
    na = {d.get("what"): d.get("reason") for r in ranks for d in r.meta.get("not_available", [])}
    if not report.has_gpu:
        parts.append(
            f'<p class="note">GPU telemetry not available: {_e(na.get("gpu", "no CUDA samples"))}</p>'
        )
    for c in charts:
        parts.append(
            f'<figure class="chart" id="chart-{_e(c.name)}"><figcaption><b>{_e(c.title)}</b> '
            f'<span class="note">({c.points} points; also {_e(c.name)}.png)</span></figcaption>{c.svg}</figure>'
        )
    if not charts:
        parts.append('<p class="note">no samples to draw</p>')
    saves = [
        (
            r.rank,
            e.get("step"),
            e.get("seconds"),
            _gib(e.get("gpu_allocated_peak")),
            _gib(e.get("rss_hwm")),
            _gib(e.get("cgroup_usage_delta", e.get("node_used_delta"))),
        )
        for r in ranks
        for e in r.events
        if e.get("event") == "save_end"
    ]
    if saves:
        parts.append("<h2>Checkpoint saves</h2>")
        parts.append(
            _table(
                [
                    "rank",
                    "step",
                    "seconds",
                    "GPU peak (if the save set it)",
                    "RSS peak (if the save set it)",
                    "host change",
                ],
                saves,
            )
        )
    pred = report.prediction
    parts.append("<h2>Prediction and measurement</h2>")
    if pred and pred.get("available"):
        rows = [
            (name, _gib(p.get("gpu_bytes")), _gib(p.get("host_bytes_per_node")))
            for name, p in pred["phases"].items()
        ]
        parts.append(f'<p class="note">planner: {_e(pred.get("strategy"))}</p>')
        parts.append(_table(["phase", "predicted GPU", "predicted host / node"], rows))
        if report.gaps:
            parts.append(
                _table(
                    [
                        "rank",
                        "step",
                        "phase",
                        "predicted GPU",
                        "measured GPU (reserved peak)",
                        "predicted host / node",
                        "predicted host / rank",
                        "measured RSS peak (rank)",
                        "measured host",
                    ],
                    [
                        (
                            g.get("rank"),
                            g.get("step"),
                            g.get("phase"),
                            _gib(g.get("predicted_gpu")),
                            _gib(g.get("measured_gpu")),
                            _gib(g.get("predicted_host_node")),
                            _gib(g.get("predicted_host_rank_share")),
                            _gib(g.get("measured_rss_peak")),
                            f"{_gib(g.get('measured_host_node'))} ({g.get('host_measure')})",
                        )
                        for g in report.gaps
                    ],
                )
            )
    else:
        parts.append(f'<p class="note">no prediction: {_e((pred or {}).get("reason", "none recorded"))}</p>')
    if report.placements:
        parts.append("<h2>Where ZeRO placed the tensors</h2>")
        parts.append(
            _table(
                ["rank", "when", "ok", "placement"],
                [
                    (p.get("rank"), p.get("when"), p.get("ok"), json.dumps(p.get("summary")))
                    for p in report.placements
                ],
            )
        )
    if report.errors or report.stacks:
        parts.append("<h2>Errors and stack dumps</h2>")
        if report.errors:
            parts.append(
                _table(
                    ["rank", "time", "step", "phase", "exception", "diagnosis"],
                    [
                        (
                            e.get("rank"),
                            e.get("time"),
                            e.get("step"),
                            e.get("phase"),
                            f"{e.get('type')}: {clip(str(e.get('message', '')), 200)}",
                            (e.get("diagnosis") or {}).get("title", "-"),
                        )
                        for e in report.errors
                    ],
                )
            )
        if report.stacks:
            parts.append(
                _table(
                    ["rank", "dumps", "innermost frames"],
                    [(s["rank"], s["dumps"], " <- ".join(s["top_frames"])) for s in report.stacks],
                )
            )
    if report.notes or na:
        parts.append("<h2>Notes</h2><ul>")
        parts += [f"<li>{_e(n)}</li>" for n in report.notes]
        parts += [f"<li>{_e(k)}: not available ({_e(v)})</li>" for k, v in na.items()]
        parts.append("</ul>")
    parts.append(f"<script>{_SCRIPT}</script></body></html>")
    return "\n".join(parts)
