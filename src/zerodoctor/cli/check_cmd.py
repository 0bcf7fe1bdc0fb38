"""`zerodoctor check SETUP...`: the preflight of a whole training setup, one verdict, a CI exit code."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from zerodoctor.cli.common import EXIT_CLEAN, EXIT_FINDINGS
from zerodoctor.findings import Severity
from zerodoctor.safeio import count_arg, gib_arg

EXIT_HELP = """check exit codes:
  0  ready (or ready with warnings, unless --fail-on warning)
  1  will fail, or could not check (an unknown is never a pass; --fail-on never keeps 0)
  2  usage or input error (a file that cannot be read, two DeepSpeed configs, a config naming a missing file)
  3  internal error (a bug in zerodoctor)
"""


def add_parser(sub: argparse._SubParsersAction, epilog: str) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "check",
        help="preflight a whole training setup: environment + configs + memory plan, one verdict",
        description="Check a training setup before launch: the installed stack against known-bad versions, the "
        "configs together as the framework will run them, and the memory plan per GPU and per node, phase by "
        "phase. SETUP is a directory (its config files are found; a cluster.yaml and an env.json / env.txt "
        "(pip freeze) in it are used) or the config files. One verdict: ready, ready with warnings, could "
        "not check, will fail.",
        epilog=EXIT_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("setup", nargs="*", metavar="SETUP", help="setup directory or config files")
    p.add_argument(
        "--model", help="model when the configs do not name it (catalog name, hub id, config.json)"
    )
    g = p.add_argument_group("cluster (or a cluster.yaml in the setup directory)")
    g.add_argument("--nodes", type=count_arg, help="number of nodes")
    g.add_argument("--gpus-per-node", type=count_arg, help="GPUs per node")
    g.add_argument("--world-size", type=count_arg, help="total GPUs (ranks), when nodes x GPUs is not given")
    g.add_argument("--gpu-memory", type=gib_arg, metavar="GIB", help="memory per GPU in GiB")
    g.add_argument("--host-ram", type=gib_arg, metavar="GIB", help="host RAM per node in GiB")
    p.add_argument(
        "--env",
        metavar="FILE",
        help="environment of the training nodes: `zerodoctor env --format json` output or a `pip freeze` "
        "(default: env.json / env.txt in the setup directory, else this machine's packages); `--env none`: "
        "the versions are not known (known-bad versions are then not checked)",
    )
    p.add_argument(
        "--deep", action="store_true", help="when probing this machine, ask DeepSpeed which ops build"
    )
    p.add_argument(
        "--run",
        action="store_true",
        dest="selftest",  # `run` is the command's entry point on the namespace
        help="deepest tier: also run the setup's ZeRO config for real on a shrunken model of its family "
        "(`zerodoctor selftest`: 2 local ranks, clipping, save, reload; needs torch and DeepSpeed)",
    )
    p.add_argument(
        "--run-timeout", type=count_arg, default=600, metavar="S", help="seconds for --run (default 600)"
    )
    p.add_argument(
        "--framework",
        choices=("hf", "llamafactory", "accelerate", "xtuner", "deepspeed"),
        help="how the job is launched, when the files do not say",
    )
    p.add_argument("--samples", type=count_arg, help="training samples per epoch (checks step counts)")
    p.add_argument("--margin", type=float, default=10.0, metavar="PERCENT", help="memory safety margin (10)")
    p.add_argument("--only", action="append", metavar="ID", help="run only these checks (id, prefix or name)")
    p.add_argument("--skip", action="append", metavar="ID", help="skip these checks")
    p.add_argument(
        "--list-checks", action="store_true", help="list every check with its id and phase, and exit"
    )
    p.add_argument(
        "--format", choices=("text", "json", "markdown", "sarif"), default="text", help="output format"
    )
    p.add_argument(
        "--github",
        action="store_true",
        help="also print GitHub Actions annotations and append the report to $GITHUB_STEP_SUMMARY",
    )
    p.add_argument(
        "--fail-on",
        choices=("error", "warning", "info", "never"),
        default="error",
        help="exit 1 at or above this severity (default error); 'could not check' exits 1 unless never",
    )
    p.add_argument(
        "--fix",
        metavar="DIR",
        help="write corrected copies of the configs and the recommended DeepSpeed config into DIR "
        "(never over your files)",
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from zerodoctor.check.registry import all_checks, resolve_check_ids
    from zerodoctor.errors import UsageError

    if args.list_checks:
        if args.format == "json":
            import json

            rows = [
                {"id": i.id, "judge": i.judge, "phase": i.phase, "name": i.name, "title": i.title}
                for i in all_checks().values()
            ]
            sys.stdout.write(json.dumps({"checks": rows}, indent=2) + "\n")
            return EXIT_CLEAN
        for info in all_checks().values():
            sys.stdout.write(f"{info.id:<8} {info.judge:<5} {info.phase:<21} {info.name}: {info.title}\n")
        return EXIT_CLEAN
    if not args.setup:
        raise UsageError("no setup given", hint="pass a setup directory or its config files")
    if not 0 <= args.margin < 100:
        raise UsageError(f"--margin must be between 0 and 100 percent, got {args.margin:g}")
    from zerodoctor.check.pipeline import CheckOptions, run_check
    from zerodoctor.setup.run import RunFlags

    flags = RunFlags(
        model=args.model,
        nodes=args.nodes,
        gpus_per_node=args.gpus_per_node,
        world_size=args.world_size,
        gpu_memory_gib=args.gpu_memory,
        host_ram_gib=args.host_ram,
        framework=args.framework,
        samples=args.samples,
    )
    report = run_check(
        CheckOptions(
            paths=tuple(args.setup),
            flags=flags,
            env_path=args.env,
            deep=args.deep,
            only=resolve_check_ids(args.only, "--only"),
            skip=resolve_check_ids(args.skip, "--skip"),
            margin=args.margin / 100,
            selftest=args.selftest,
            selftest_timeout_s=args.run_timeout,
        )
    )
    from zerodoctor.report import check as render
    from zerodoctor.report.render import to_json

    out = sys.stdout
    fix_doc = None
    if args.fix:
        from zerodoctor.check.fix import write_fix_dir

        fix_doc = write_fix_dir(report, Path(args.fix))
    if args.format == "json":
        doc = render.json_document(report)
        if fix_doc is not None:
            doc["fix"] = fix_doc
        out.write(to_json(doc))
    elif args.format == "sarif":
        from zerodoctor.report.sarif import repository_root, to_sarif

        out.write(to_json(to_sarif(report.findings, root=repository_root(Path.cwd()))))
    elif args.format == "markdown":
        out.write(render.render_markdown(report))
    else:
        out.write(render.render_text(report, color=out.isatty()))
        if fix_doc is not None:
            for w in fix_doc["written"]:
                out.write(f"wrote {w}\n")
            for c in fix_doc.get("changes", []):
                out.write(f"changed: {c}\n")
            for s in fix_doc["not_fixed"]:
                out.write(f"not fixed: {s}\n")
    if args.github:
        from zerodoctor.report.github import workflow_annotations, write_step_summary
        from zerodoctor.report.sarif import repository_root

        out.write(workflow_annotations(report.findings, root=repository_root(Path.cwd())))
        write_step_summary(render.render_markdown(report))
    return exit_code(report.verdict, report.findings, args.fail_on)


def exit_code(verdict: str, findings: tuple, fail_on: str) -> int:  # type: ignore[type-arg]
    if fail_on == "never":
        return EXIT_CLEAN
    if verdict in ("will fail", "could not check"):
        return EXIT_FINDINGS
    threshold = Severity.parse(fail_on)
    return EXIT_FINDINGS if any(f.severity >= threshold for f in findings) else EXIT_CLEAN
