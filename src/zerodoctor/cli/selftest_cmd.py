"""`zerodoctor selftest [SETUP...]`: run the setup's ZeRO config for real on a tiny model of the same family."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from zerodoctor.cli.common import add_output_options, emit, exit_code
from zerodoctor.errors import UsageError
from zerodoctor.safeio import count_arg
from zerodoctor.setup.document import KINDS
from zerodoctor.setup.model import FRAMEWORKS


def add_parser(sub: argparse._SubParsersAction, epilog: str) -> None:  # type: ignore[type-arg]
    from zerodoctor.selftest.spec import SAVE_PATHS

    p = sub.add_parser(
        "selftest",
        help="run your ZeRO config for real on a tiny model (2 ranks, clipping, save, reload)",
        description="Run the setup's DeepSpeed config (after the framework's \"auto\" filling) on a shrunken "
        "model of the same family with random weights and synthetic tokens, on N local ranks under torchrun "
        "(nccl on GPUs, gloo + DeepSpeed's CPU accelerator otherwise): distributed init, zero.Init, engine "
        "init, forward/backward, a forced clipping step, optimizer steps, checkpoint save and reload, each "
        "timed under a watchdog, with positive checks (partitioning, placement, loss against a plain "
        "reference, saved weights, zero_to_fp32). Without SETUP: a default ZeRO-3 offload setup.",
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("files", nargs="*", metavar="SETUP", help="config files or a directory holding them")
    add_output_options(p)
    p.add_argument("--kind", choices=sorted(KINDS), help="read every file as this kind (default: detect)")
    p.add_argument(
        "--framework", choices=FRAMEWORKS, help="how the job is launched, when the files do not say"
    )
    p.add_argument("--world-size", type=count_arg, help="total ranks of the real job (to rescale the batch)")
    p.add_argument("--nodes", type=count_arg, help="number of nodes of the real job")
    p.add_argument("--gpus-per-node", type=count_arg, help="GPUs per node of the real job")
    p.add_argument(
        "--model", help="model (catalog name, hub id or config.json path) when the files do not name it"
    )
    p.add_argument(
        "--ranks",
        type=count_arg,
        help="local ranks to run (default: 2; 1 on a one-GPU machine): at most one per GPU on the nccl path, "
        "one per CPU core on the CPU path",
    )
    p.add_argument("--steps", type=count_arg, default=3, help="optimizer steps (default: 3)")
    p.add_argument(
        "--save-path",
        choices=sorted(SAVE_PATHS),
        help="how your training saves the model (default: trainer for HF/LLaMA-Factory/accelerate, "
        "checkpoint otherwise): " + "; ".join(f"{k} = {v}" for k, v in SAVE_PATHS.items()),
    )
    p.add_argument("--timeout", type=count_arg, default=600, help="seconds for the whole run (default: 600)")
    p.add_argument(
        "--workdir",
        help="keep the run's files (log, checkpoint, per-rank phase logs) here: in DIR when it is new or empty, "
        "else in a new DIR/zerodoctor-selftest-N (nothing already there is deleted or overwritten)",
    )
    p.set_defaults(run=run)


def setup_files(items: list[str]) -> list[Path]:
    """Files given, with a directory expanded to the config files directly inside it (for --kind, which reads
    every file as that kind)."""
    out: list[Path] = []
    for item in items:
        path = Path(item)
        if path.is_dir():
            found = sorted(
                f
                for f in path.iterdir()
                if f.is_file() and f.suffix.lower() in (".json", ".yaml", ".yml", ".py")
            )
            if not found:
                raise UsageError(f"{item}: no .json, .yaml or .py config files in this directory")
            out.extend(found)
        else:
            out.append(path)
    return out


def run(args: argparse.Namespace) -> int:
    from zerodoctor.report.selftest import render_selftest_markdown, summary_text
    from zerodoctor.selftest import default_spec, run_selftest, spec_from_run

    if args.files:
        from zerodoctor.setup.load import setup_from_documents

        if args.kind:
            from zerodoctor.setup.reader import read_document

            docs = [read_document(p, args.kind) for p in setup_files(args.files)]
        else:
            from zerodoctor.setup.discover import discover

            # as `check` finds a setup: a directory's configs, its cluster.yaml / env files / notes skipped
            docs = list(discover(args.files).documents)
        setup = setup_from_documents(
            docs,
            framework=args.framework,
            world_size=args.world_size,
            num_nodes=args.nodes,
            gpus_per_node=args.gpus_per_node,
            model=args.model,
        )
        if args.model and setup.model_spec is None and setup.model_note:
            raise UsageError(setup.model_note)
        from zerodoctor.selftest.refusals import launch_refusals, not_launched_note
        from zerodoctor.setup.run import describe_run

        run_description = describe_run(setup, strict=True)
        refusals = launch_refusals(run_description)
        if refusals:
            header = f"zerodoctor selftest: {not_launched_note(refusals)}"
            emit(args, "selftest", refusals, title="zerodoctor selftest: not launched", header=header)
            return exit_code(refusals, args.fail_on)
        spec = spec_from_run(run_description, save_path=args.save_path, steps=args.steps)
    else:
        if args.model or args.framework or args.kind:
            raise UsageError("--model, --framework and --kind describe a SETUP: give its files too")
        spec = default_spec(save_path=args.save_path, steps=args.steps)
    workdir = Path(args.workdir) if args.workdir else None
    result = run_selftest(spec, ranks=args.ranks, timeout_s=args.timeout, workdir=workdir)
    if args.format == "markdown":
        sys.stdout.write(render_selftest_markdown(result, source=spec.source))
        return exit_code(list(result.findings), args.fail_on)
    emit(
        args,
        "selftest",
        list(result.findings),
        title="zerodoctor selftest",
        header=summary_text(result, source=spec.source),
        extra={"selftest": result.to_dict(), "source": spec.source},
        clean_message="Selftest passed.",
    )
    return exit_code(list(result.findings), args.fail_on)
