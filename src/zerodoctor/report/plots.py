"""Charts of a guarded run (matplotlib, Agg, no display): per-rank memory timelines on a shared step axis as
small multiples, with steps, epochs, evaluations, saves and the first optimizer step marked; host RAM per
node against its limit with the projected exhaustion point and the planner's prediction as a band; outlier
ranks highlighted; allocator fragmentation and non-PyTorch memory apart. Each chart is rendered once as PNG
(files next to the page) and once as SVG (inline in the page)."""

from __future__ import annotations

import io
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from zerodoctor.report.run_report import GIB, RankData, RunReport

_MARK_STYLE = {
    "first_optimizer_step": {"color": "#7b3fa0", "linestyle": "-", "label": "first optimizer step"},
    "epoch": {"color": "#888888", "linestyle": "--", "label": "epoch end"},
    "evaluation": {"color": "#2e8b57", "linestyle": ":", "label": "evaluation"},
    "save": {"color": "#d2691e", "linestyle": ":", "label": "checkpoint save"},
    "exception": {"color": "#c00000", "linestyle": "-.", "label": "exception"},
}
OUTLIER_COLOR = "#c00000"


@dataclass(frozen=True)
class Chart:
    name: str
    title: str
    png: bytes
    svg: str
    points: int


MAX_PLOTTED = 2000
"""Points drawn per line at most. A long run samples every step (200k samples a rank made a 128 MB page of
1.2M SVG markers); a chart 11 inches wide shows no more than this, so longer series are decimated."""


def decimate(
    xs: Sequence[float], ys: Sequence[float], limit: int = MAX_PLOTTED
) -> tuple[list[float], list[float]]:
    """At most about `limit` points of the series (xs, ys), keeping its shape: the series is cut into limit/2
    buckets and each keeps its lowest and its highest point, in order, so no peak (an OOM spike, a save) and no
    dip is lost; the first and last points are kept."""
    n = len(xs)
    if n <= limit:
        return list(xs), list(ys)
    size = -(-n // max(limit // 2, 1))
    keep: list[int] = [0]
    for start in range(0, n, size):
        idx = range(start, min(start + size, n))
        lo = min(idx, key=ys.__getitem__)
        hi = max(idx, key=ys.__getitem__)
        keep += sorted({lo, hi})
    keep.append(n - 1)
    picked = sorted(set(keep))
    return [xs[i] for i in picked], [ys[i] for i in picked]


def _figure(rows: int, cols: int, width: float = 11.0, row_h: float = 2.4) -> Any:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, max(row_h * rows, 3.0)), dpi=100, layout="constrained")
    axes = fig.subplots(rows, cols, sharex=True, squeeze=False)
    return fig, axes


def _mark(ax: Any, markers: dict[str, list[int]], *, legend: bool) -> None:
    for kind, steps in markers.items():
        style = _MARK_STYLE[kind]
        for i, s in enumerate(sorted(set(steps))):
            ax.axvline(
                s,
                color=style["color"],
                linestyle=style["linestyle"],
                linewidth=1.0,
                alpha=0.8,
                label=style["label"] if legend and i == 0 else None,
            )


PNG_SOFTWARE = "zerodoctor report"
"""The PNG's Software text chunk: marks a chart as zerodoctor's, so that a later `report --out` may replace it."""
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def is_report_png(head: bytes, *, beside_report_page: bool = False) -> bool:
    """Whether a file starting with `head` is a chart `zerodoctor report` wrote: marked with PNG_SOFTWARE, or
    (charts from before that mark) a matplotlib PNG beside a zerodoctor report page."""
    if not head.startswith(_PNG_SIGNATURE):
        return False
    return PNG_SOFTWARE.encode() in head or (beside_report_page and b"Matplotlib" in head)


def _render(fig: Any, name: str, title: str, points: int) -> Chart:
    import matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    png = io.BytesIO()
    fig.savefig(png, format="png", metadata={"Software": PNG_SOFTWARE})
    svg = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none"}):  # text stays text: selectable, searchable, smaller
        fig.savefig(svg, format="svg")
    text = svg.getvalue()
    text = text[text.index("<svg") :]  # drop the XML prolog and DOCTYPE: the SVG goes inline in HTML
    start, end = text.find("<metadata>"), text.find("</metadata>")
    if 0 <= start < end:  # RDF metadata (creator, date): not needed, and keeps the page reproducible
        text = text[:start] + text[end + len("</metadata>") :]
    return Chart(name, title, png.getvalue(), text, points)


MAX_SMALL_MULTIPLES = 16  # a panel costs about 0.25 s of CPU to draw


def _grid(n: int) -> tuple[int, int]:
    cols = 1 if n == 1 else 2 if n <= 8 else 4
    return -(-n // cols), cols


def _small_multiples(
    report: RunReport,
    name: str,
    title: str,
    lines: list[tuple[str, str, str]],
    ylabel: str,
    band: tuple[float, float] | None = None,
) -> Chart | None:
    ranks = [r for r in report.ranks if any(r.has(k) for k, _l, _c in lines)]
    if not ranks:
        return None
    if len(ranks) > MAX_SMALL_MULTIPLES:  # a panel per rank of a 400-rank run: minutes of drawing, no reading
        outlying = set(report.outliers)
        keep = {r.rank for r in ranks if r.rank in outlying}
        keep |= {r.rank for r in ranks[: max(MAX_SMALL_MULTIPLES - len(keep), 0)]}
        shown = [r for r in ranks if r.rank in keep][:MAX_SMALL_MULTIPLES]
        title = f"{title} ({len(shown)} of {len(ranks)} ranks: outliers and the lowest; the JSON has all)"
        ranks = shown
    rows, cols = _grid(len(ranks))
    fig, axes = _figure(rows, cols)
    markers = report.markers()
    points = 0
    outliers = set(report.outliers)
    for i, ax in enumerate(axes.flat):
        if i >= len(ranks):
            ax.set_visible(False)
            continue
        r: RankData = ranks[i]
        for key, label, color in lines:
            xs, ys = r.series(key)
            if xs:
                ax.plot(
                    *decimate(xs, [y / GIB for y in ys]),
                    label=label,
                    color=color,
                    linewidth=1.4,
                    marker=".",
                    markersize=3,
                )
                points += len(xs)
        if band is not None:
            ax.axhspan(
                band[0] / GIB,
                band[1] / GIB,
                color="#2ca02c",
                alpha=0.18,
                label="planner prediction (phases)" if i == 0 else None,
            )
        _mark(ax, markers, legend=i == 0)
        hot = r.rank in outliers
        ax.set_title(
            f"rank {r.rank} ({r.host}, local {r.local_rank})" + ("  OUTLIER" if hot else ""),
            fontsize=9,
            color=OUTLIER_COLOR if hot else "black",
        )
        if hot:
            for side in ax.spines.values():
                side.set_edgecolor(OUTLIER_COLOR)
                side.set_linewidth(2)
        ax.grid(alpha=0.3)
        ax.set_ylabel(ylabel, fontsize=8)
        ax.tick_params(labelsize=8)
        if i == 0:
            ax.legend(fontsize=7, loc="upper left")
    for ax in axes[-1]:
        ax.set_xlabel("optimizer step", fontsize=8)
    fig.suptitle(title, fontsize=11)
    return _render(fig, name, title, points)


def host_per_rank(report: RunReport) -> Chart | None:
    return _small_multiples(
        report,
        "host_per_rank",
        "Host memory per rank (process RSS and its high-water mark)",
        [("rss_hwm", "RSS high-water", "#9ecae1"), ("rss", "RSS", "#1f77b4")],
        "GiB",
        band=_host_rank_band(report),
    )


def _host_rank_band(report: RunReport) -> tuple[float, float] | None:
    """The planner's host figure per node shared by the node's ranks (what the guard holds each rank's RSS
    against), lowest to highest phase."""
    pred = report.prediction
    if not pred or not pred.get("available"):
        return None
    on_a_node = max(
        Counter(r.host for r in report.ranks).values(), default=1
    )  # records older than ranks_per_node
    share = max(int(pred.get("ranks_per_node") or on_a_node), 1)
    vals = [p.get("host_bytes_per_node") for p in pred.get("phases", {}).values()]
    nums = [float(v) / share for v in vals if isinstance(v, int | float) and v > 0]
    return (min(nums), max(nums)) if nums else None


def _gpu_band(report: RunReport) -> tuple[float, float] | None:
    pred = report.prediction
    if not pred or not pred.get("available"):
        return None
    vals = [p.get("gpu_bytes") for p in pred.get("phases", {}).values()]
    nums = [float(v) for v in vals if isinstance(v, int | float) and v > 0]
    return (min(nums), max(nums)) if nums else None


def gpu_per_rank(report: RunReport) -> Chart | None:
    return _small_multiples(
        report,
        "gpu_per_rank",
        "GPU memory per rank (PyTorch caching allocator)",
        [
            ("gpu_allocated", "allocated", "#1f77b4"),
            ("gpu_allocated_peak", "allocated peak", "#9ecae1"),
            ("gpu_reserved", "reserved", "#ff7f0e"),
        ],
        "GiB",
        band=_gpu_band(report),
    )


def gpu_outside(report: RunReport) -> Chart | None:
    """Fragmentation (reserved - allocated, and the allocator's retries) and memory outside PyTorch
    (total - free - reserved) apart."""
    ranks = [r for r in report.ranks if r.has("gpu_reserved")]
    if not ranks:
        return None
    fig, axes = _figure(3, 1, row_h=2.4)
    frag_ax, retry_ax, other_ax = axes[0][0], axes[1][0], axes[2][0]
    points = 0
    for r in ranks:
        rows = [s for s in r.samples if "gpu_reserved" in s]
        steps = [int(s["step"]) for s in rows]
        hot = r.rank in report.outliers
        kw = {
            "linewidth": 2.2 if hot else 1.0,
            "color": OUTLIER_COLOR if hot else None,
            "label": f"rank {r.rank}",
        }
        frag_ax.plot(
            *decimate(steps, [(s["gpu_reserved"] - s.get("gpu_allocated", 0)) / GIB for s in rows]), **kw
        )
        retry_ax.step(
            *decimate(steps, [int(s.get("gpu_alloc_retries", 0)) for s in rows]), where="post", **kw
        )
        other_ax.plot(*decimate(steps, [s.get("gpu_non_pytorch", 0) / GIB for s in rows]), **kw)
        points += 3 * len(steps)
    frag_ax.set_title("reserved but not allocated (fragmentation)", fontsize=9)
    retry_ax.set_title(
        "allocator retries (cudaMalloc failed, cache flushed and retried; cumulative)", fontsize=9
    )
    other_ax.set_title("outside PyTorch's allocator: CUDA context, NCCL, other libraries", fontsize=9)
    for ax, unit in ((frag_ax, "GiB"), (retry_ax, "retries"), (other_ax, "GiB")):
        _mark(ax, report.markers(), legend=False)
        ax.set_ylabel(unit, fontsize=8)
        ax.grid(alpha=0.3)
    if len(ranks) <= 16:
        frag_ax.legend(fontsize=7, ncol=4)
    other_ax.set_xlabel("optimizer step", fontsize=8)
    fig.suptitle("GPU memory the allocator does not hand out", fontsize=11)
    return _render(fig, "gpu_outside", "GPU fragmentation, allocator retries and non-PyTorch memory", points)


def host_nodes(report: RunReport) -> Chart | None:
    nodes = [n for n in report.nodes if n.steps]
    if not nodes:
        return None
    fig, axes = _figure(len(nodes), 1, row_h=3.0)
    points = 0
    pred = report.prediction if report.prediction and report.prediction.get("available") else None
    for ax, n in zip(axes.flat, nodes, strict=False):
        ax.plot(
            *decimate(n.steps, [u / GIB for u in n.used]),
            color="#1f77b4",
            marker=".",
            markersize=3,
            label=f"used ({'job cgroup' if n.measure == 'cgroup' else n.measure})",
        )
        points += len(n.steps)
        if n.limit:
            ax.axhline(
                n.limit / GIB, color=OUTLIER_COLOR, linewidth=1.5, label=f"limit {n.limit / GIB:.1f} GiB"
            )
        pr = n.projection
        if pr and pr.get("exhaustion_step") is not None and n.limit:
            x0, y0, x1 = pr["from_step"], pr["from_bytes"] / GIB, pr["exhaustion_step"]
            ax.plot(
                [x0, x1],
                [y0, n.limit / GIB],
                color=OUTLIER_COLOR,
                linestyle="--",
                linewidth=1.2,
                label=f"trend: limit at step {x1}",
            )
            ax.plot([x1], [n.limit / GIB], marker="X", color=OUTLIER_COLOR, markersize=9)
        if pred:
            vals = [p.get("host_bytes_per_node") for p in pred.get("phases", {}).values()]
            vals = [v for v in vals if v]
            if vals:
                ax.axhspan(
                    min(vals) / GIB,
                    max(vals) / GIB,
                    color="#2ca02c",
                    alpha=0.18,
                    label="planner prediction (phases)",
                )
        _mark(ax, report.markers(), legend=False)
        ax.set_title(f"host RAM on {n.host}", fontsize=9)
        ax.set_ylabel("GiB", fontsize=8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper left")
    axes[-1][0].set_xlabel("optimizer step", fontsize=8)
    fig.suptitle("Host RAM per node against the limit the kernel enforces", fontsize=11)
    return _render(fig, "host_nodes", "Host RAM per node vs limit", points)


def render_charts(report: RunReport) -> list[Chart]:
    """Every chart the run's data supports (GPU charts only when the run had CUDA)."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    charts = [gpu_per_rank(report), gpu_outside(report), host_per_rank(report), host_nodes(report)]
    return [c for c in charts if c is not None]
