"""`zerodoctor report RUN_DIR`: render what the runtime guard recorded (HTML page + PNGs, or JSON)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_parser(sub: argparse._SubParsersAction, epilog: str) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "report",
        help="render a guarded run: per-rank memory timelines, saves, host RAM vs limit (HTML + PNG, or JSON)",
        description="Read RUN_DIR/zerodoctor/ (written by ZeroDoctorCallback, zerodoctor.guard.watch or "
        "`zerodoctor guard`) and write one self-contained HTML page (works offline) plus one PNG per chart; "
        "--format json prints the same data and findings instead.",
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "run_dir", metavar="RUN_DIR", help="the run's output directory (or its zerodoctor/ folder)"
    )
    p.add_argument(
        "--format",
        choices=("html", "json"),
        default="html",
        help="html (default): write the page and PNGs; json: print the data to stdout",
    )
    p.add_argument(
        "--out",
        metavar="DIR",
        help="where the page and PNGs go (default RUN_DIR/zerodoctor/report); an earlier report's files there "
        "are replaced, any other file of the same name (index.html, CHART.png) is never overwritten",
    )
    p.add_argument(
        "--fail-on",
        choices=("error", "warning", "info", "never"),
        default="never",
        help="exit 1 when a finding is at or above this severity (default: never)",
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from zerodoctor.cli.common import exit_code
    from zerodoctor.report.render import envelope, summary, to_json
    from zerodoctor.report.run_report import guard_folder, load_run

    report = load_run(args.run_dir)
    findings = list(report.findings)
    if args.format == "json":
        sys.stdout.write(to_json(envelope("report", findings, **report.to_dict())))
        return exit_code(findings, args.fail_on)
    from zerodoctor.errors import UsageError
    from zerodoctor.report.plots import is_report_png, render_charts
    from zerodoctor.report.run_html import is_report_page, render_run_html
    from zerodoctor.safeio import check_replaceable, replace_file, shown

    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UsageError(
            "the HTML report needs matplotlib, which is not installed",
            hint='pip install "zerodoctor[report]", or use --format json',
        ) from None

    out = Path(args.out) if args.out else guard_folder(Path(args.run_dir)) / "report"
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(
            f"{shown(out)}: cannot write the report: {exc.strerror}",
            hint="pass --out to a writable directory",
        ) from None
    charts = render_charts(report)
    page = out / "index.html"
    files = {page: render_run_html(report, charts, findings).encode("utf-8")}
    files.update((out / f"{c.name}.png", c.png) for c in charts)
    # Only files of an earlier report are replaced: `--out .` in a web project must not eat its index.html.
    hint = "pass --out to a new or empty directory, or move the file away"
    check_replaceable(page, is_report_page, hint=hint)
    page_is_ours = page.exists()
    for path in files:
        if path != page:
            check_replaceable(
                path, lambda head: is_report_png(head, beside_report_page=page_is_ours), hint=hint
            )
    for path, data in files.items():
        replace_file(path, data)
    counts = summary(findings)
    sys.stdout.write(
        f"zerodoctor report: {page} ({len(charts)} chart(s): {', '.join(c.name + '.png' for c in charts)}); "
        f"{len(report.ranks)} rank(s); findings: {counts['error']} error, {counts['warning']} warning, "
        f"{counts['info']} info\n"
    )
    for f in findings:
        if f.severity.label != "info":
            sys.stdout.write(f"  {f.severity.label}: {f.title}: {f.message[:240]}\n")
    return exit_code(findings, args.fail_on)
