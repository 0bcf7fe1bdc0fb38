"""`zerodoctor guard [OPTIONS] -- CMD...`: run a training launch with the runtime guard switched on in every
Python process it starts, without editing the training code. Returns the command's exit code."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from zerodoctor.safeio import count_arg, gib_arg, positive_arg


def add_parser(sub: argparse._SubParsersAction, epilog: str) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "guard",
        help="run a training command with the runtime guard on every rank (no code changes)",
        description="Run CMD (torchrun, deepspeed, accelerate launch, llamafactory-cli, python ...) with the "
        "guard active in every Python process: each HF Trainer gets ZeroDoctorCallback, each mmengine Runner / "
        "FlexibleRunner (XTuner) gets ZeroDoctorHook, and each plain deepspeed.initialize engine is watched. "
        "Per-rank telemetry, findings, error files and stack dumps go to RUN_DIR/zerodoctor/ (default: the "
        "Trainer's output_dir or the mmengine runner's work_dir, else the working directory); render them "
        "with `zerodoctor report RUN_DIR`. Options can also be given as ZERODOCTOR_GUARD_* variables. "
        "Exit code: the command's.",
        epilog="example: zerodoctor guard --run-dir out -- torchrun --nproc_per_node 8 train.py --deepspeed ds.json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--run-dir",
        metavar="DIR",
        help="where the guard writes (default: the Trainer's output_dir or the mmengine runner's work_dir)",
    )
    p.add_argument("--every", type=count_arg, metavar="N", help="sample every N optimizer steps (default 1)")
    p.add_argument(
        "--host-measure",
        choices=("auto", "node", "rss"),
        help="what the host-RAM trend watches (default auto: the job's cgroup if limited, else the node)",
    )
    p.add_argument(
        "--host-limit-gib",
        type=gib_arg,
        metavar="GIB",
        help="project the host-RAM trend against this limit instead of the cgroup/node's",
    )
    p.add_argument(
        "--hang-factor",
        type=positive_arg,
        metavar="X",
        help="dump every rank's stacks after X times the longest step (default 10)",
    )
    p.add_argument(
        "--hang-first-s",
        type=positive_arg,
        metavar="S",
        help="timeout before the first optimizer step completes (default 1800)",
    )
    p.add_argument("--no-watchdog", action="store_true", help="no hang watchdog / stack dumps")
    p.add_argument(
        "--save-without-optimizer",
        action="store_true",
        help="opt in: when a save's predicted spike does not fit, save that checkpoint without "
        "optimizer state (HF Trainer)",
    )
    p.add_argument(
        "--no-flight-recorder",
        action="store_true",
        help="do not arm PyTorch's NCCL flight recorder (TORCH_NCCL_TRACE_BUFFER_SIZE ...)",
    )
    p.add_argument("launch", nargs=argparse.REMAINDER, metavar="-- CMD", help="the launch command")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from zerodoctor.errors import UsageError
    from zerodoctor.guard.autoinstall import ENABLE_VAR, SITECUSTOMIZE
    from zerodoctor.guard.options import GuardOptions

    cmd = list(args.launch)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd or not cmd[0].strip():
        raise UsageError(
            "no command to run", hint="put the launch command after --, e.g. zerodoctor guard -- torchrun ..."
        )
    if args.every is not None and args.every < 1:
        raise UsageError(f"--every must be 1 or more, got {args.every}")
    opts = GuardOptions.from_env(
        run_dir=Path(args.run_dir).resolve() if args.run_dir else None,
        every=args.every,
        host_measure=args.host_measure,
        host_limit_bytes=int(args.host_limit_gib * (1 << 30)) if args.host_limit_gib else None,
        hang_factor=args.hang_factor,
        hang_first_s=args.hang_first_s,
        watchdog=False if args.no_watchdog else None,
        save_without_optimizer=True if args.save_without_optimizer else None,
    )
    base = opts.run_dir or Path.cwd()
    boot = base / "zerodoctor" / "boot"
    try:
        boot.mkdir(parents=True, exist_ok=True)
        (boot / "sitecustomize.py").write_text(SITECUSTOMIZE)
    except OSError as exc:
        raise UsageError(
            f"{boot}: cannot write the guard's start-up file: {exc.strerror}",
            hint="pass --run-dir to a writable directory",
        ) from None
    env = dict(os.environ)
    env.update(opts.to_env())
    env[ENABLE_VAR] = "1"
    env["PYTHONPATH"] = os.pathsep.join([str(boot), *filter(None, [env.get("PYTHONPATH")])])
    if not args.no_flight_recorder:
        # PyTorch's collective flight recorder: ring buffer of recent collectives, dumped on a watchdog timeout
        env.setdefault("TORCH_NCCL_TRACE_BUFFER_SIZE", "2000")
        env.setdefault("TORCH_NCCL_DUMP_ON_TIMEOUT", "1")
        env.setdefault("TORCH_NCCL_DEBUG_INFO_TEMP_FILE", str(base / "zerodoctor" / "nccl_trace_rank_"))
    try:
        code = subprocess.call(cmd, env=env)
    except FileNotFoundError:
        raise UsageError(f"{cmd[0]}: command not found", hint="check the launch command after --") from None
    except OSError as exc:  # not executable, a directory, an exec format error
        raise UsageError(
            f"{cmd[0]}: cannot run: {exc.strerror}", hint="check the launch command after --"
        ) from None
    except KeyboardInterrupt:
        sys.stderr.write("zerodoctor guard: interrupted\n")
        return 130
    # a command killed by a signal: subprocess gives -N; report 128 + N as shells and schedulers do (137 for
    # SIGKILL, often the kernel's OOM killer), not the -N % 256 (247) that exiting with -N would give
    return 128 - code if code < 0 else code
