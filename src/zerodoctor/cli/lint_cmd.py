"""`zerodoctor lint FILE...`: judge DeepSpeed / HF / LLaMA-Factory / accelerate / XTuner configs together."""

from __future__ import annotations

import argparse
import sys

from zerodoctor.cli.common import (
    add_env_option,
    add_output_options,
    emit,
    exit_code,
    load_env_option,
)
from zerodoctor.errors import UsageError
from zerodoctor.safeio import count_arg
from zerodoctor.setup.document import KINDS
from zerodoctor.setup.model import FRAMEWORKS
from zerodoctor.textutil import printable


def add_parser(sub: argparse._SubParsersAction, epilog: str) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "lint",
        help="lint training configs (DeepSpeed JSON, HF/LLaMA-Factory/accelerate YAML, XTuner .py)",
        description="Lint the files of one training setup together: a DeepSpeed JSON is judged with the HF / "
        'LLaMA-Factory arguments or accelerate config that use it (HF fills "auto" values, HF '
        "rejects mismatches). Files a config names (deepspeed: ds.json) are read too. "
        "Kinds: " + "; ".join(f"{k} = {v}" for k, v in KINDS.items()),
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("files", nargs="+", metavar="FILE")
    add_output_options(p)
    add_env_option(p)
    p.add_argument("--kind", choices=sorted(KINDS), help="read every FILE as this kind (default: detect)")
    p.add_argument(
        "--framework",
        choices=FRAMEWORKS,
        help="how the job is launched, when the files do not say (deepspeed = plain deepspeed.initialize)",
    )
    p.add_argument("--world-size", type=count_arg, help="total number of GPUs (ranks) of the job")
    p.add_argument("--nodes", type=count_arg, help="number of nodes")
    p.add_argument("--gpus-per-node", type=count_arg, help="GPUs per node")
    p.add_argument(
        "--model", help="model (catalog name, hub id or config.json path) when the configs do not name it"
    )
    p.add_argument("--samples", type=count_arg, help="training samples per epoch (expected step counts)")
    p.add_argument(
        "--select", action="append", metavar="CODE", help="only these rules (code, prefix or name)"
    )
    p.add_argument("--ignore", action="append", metavar="CODE", help="skip these rules")
    p.add_argument(
        "--deepspeed-validate",
        action="store_true",
        help="also validate with DeepSpeed's own config models (imports DeepSpeed in a subprocess, ~3 s)",
    )
    p.add_argument(
        "--fix", action="store_true", help="write a corrected copy next to each changed file (NAME.fixed.EXT)"
    )
    p.add_argument(
        "--in-place", action="store_true", help="with --fix: change the files themselves, after a .bak backup"
    )
    p.add_argument(
        "--unsafe-fixes",
        action="store_true",
        help="with --fix: also apply fixes that change training behaviour",
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from zerodoctor.lint.engine import lint_setup, select_rules, setup_notes
    from zerodoctor.setup.load import load_setup

    if (args.in_place or args.unsafe_fixes) and not args.fix:
        raise UsageError("--in-place and --unsafe-fixes only make sense with --fix")
    if args.fix and any(str(f) == "-" for f in args.files):
        raise UsageError(
            "--fix cannot write the fixed copy of standard input (-)",
            hint="save the config to a file and run `zerodoctor lint FILE --fix`",
        )
    if args.world_size and args.nodes and args.gpus_per_node and args.world_size != args.nodes * args.gpus_per_node:
        raise UsageError(
            f"world size {args.world_size} (--world-size) is not {args.nodes} node(s) x {args.gpus_per_node} GPUs",
            hint="pass --nodes and --gpus-per-node that multiply to the world size, or only --world-size",
        )
    env = load_env_option(args.env)
    setup = load_setup(
        args.files,
        kind=args.kind,
        env=env,
        framework=args.framework,
        world_size=args.world_size,
        num_nodes=args.nodes,
        gpus_per_node=args.gpus_per_node,
        model=args.model,
        dataset_samples=args.samples,
    )
    if args.model and setup.model_spec is None and setup.model_note:
        raise UsageError(setup.model_note)
    findings = setup_notes(setup) + lint_setup(setup, select_rules(args.select, args.ignore))
    if args.deepspeed_validate:
        from zerodoctor.lint.deepspeed_validate import merge_with_builtin, validate_with_deepspeed

        findings += merge_with_builtin(findings, validate_with_deepspeed(setup))
    extra: dict[str, object] = {
        "files": [{"path": d.display, "kind": d.kind} for d in setup.documents],
        "framework": setup.framework,
    }
    if args.fix:
        from zerodoctor.lint.fixer import plan_fixes, write_fixes

        # (from every finding, not the shown ones: a rule shows at most 50, a file is fixed in one pass)
        every = setup_notes(setup) + lint_setup(setup, select_rules(args.select, args.ignore), cap=False)
        changes, skipped = plan_fixes(setup, every, unsafe=args.unsafe_fixes)
        written = write_fixes(setup, changes, in_place=args.in_place)
        extra["fixes"] = {
            "changes": [c.describe() for c in changes],
            "written": [{"path": str(p), "backup": str(b) if b else None} for p, b in written],
            "skipped": [f"{s.rule}: {s.reason}" for s in skipped],
        }
    emit(args, "lint", findings, title="zerodoctor lint", extra=extra)
    if args.fix and args.format == "text":
        fx = extra["fixes"]
        assert isinstance(fx, dict)
        for line in fx["changes"]:  # a change names the user's keys and values: control characters escaped
            sys.stdout.write(f"fixed: {printable(line)}\n")
        for w in fx["written"]:
            sys.stdout.write(
                printable(f"wrote {w['path']}" + (f" (backup {w['backup']})" if w["backup"] else "")) + "\n"
            )
        for s in fx["skipped"]:
            sys.stdout.write(f"not fixed: {printable(s)}\n")
        if not fx["changes"]:
            sys.stdout.write("nothing to fix automatically\n")
    return exit_code(findings, args.fail_on)
