"""What the guard does when the run raises: a per-rank error file, an allocator summary on CUDA OOM, and
zerodoctor's diagnosis of the exception printed on the failing rank. Hooks are chained, never replaced,
and the original exception always reaches the original hook (or is re-raised) unchanged."""

from __future__ import annotations

import contextlib
import json
import socket
import sys
import threading
import time
import traceback
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from zerodoctor.guard.monitor import Monitor

_MARK = "_zerodoctor_recorded"


def record_exception(
    monitor: Monitor, exc: BaseException, tb: TracebackType | None = None, *, where: str = "main thread"
) -> dict[str, Any] | None:
    """Write `error-rank{R}.json` and `.log`, diagnose the traceback, print the finding. Never raises; does
    nothing the second time it sees the same exception (the hook and a context manager may both see it)."""
    if getattr(exc, _MARK, False) or isinstance(exc, KeyboardInterrupt | SystemExit):
        return None
    # an id() set would confuse a later exception reusing a freed id; __slots__ types: record it (maybe twice)
    with contextlib.suppress(Exception):
        setattr(exc, _MARK, True)
    result: dict[str, Any] | None = None
    with monitor.safe("exception"):
        text = "".join(traceback.format_exception(type(exc), exc, tb or exc.__traceback__))
        rank = monitor.rank
        result = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())
            + f".{int(time.time() * 1000) % 1000:03d}Z",
            "rank": rank,
            "local_rank": monitor.local_rank,
            "host": socket.gethostname(),
            "where": where,
            "step": monitor.step,
            "phase": monitor.phase,
            "type": f"{type(exc).__module__}.{type(exc).__qualname__}",
            "message": str(exc)[:4000],
            "traceback": text[-20000:],
        }
        if "out of memory" in str(exc).lower():
            from zerodoctor.guard.probes import oom_summary

            result["allocator"] = oom_summary()
        monitor.dir.mkdir(parents=True, exist_ok=True)
        stem = f"error-rank{rank}" if where == "main thread" else f"error-rank{rank}-{_slug(where)}"
        log_path = monitor.dir / f"{stem}.log"
        log_path.write_text("".join(f"[rank{rank}]: {line}\n" for line in text.splitlines()))
        if where == "main thread":
            result["flight_recorder"] = dump_flight_recorder(monitor.dir / f"flight-recorder-rank{rank}.json")
        if monitor.options.diagnose_on_error:
            result["diagnosis"] = _diagnose(log_path)
        (monitor.dir / f"{stem}.json").write_text(json.dumps(result, indent=1, default=str))
        monitor.event(
            "exception",
            type=result["type"],
            message=result["message"][:500],
            diagnosis=(result.get("diagnosis") or {}).get("id"),
        )
        d = result.get("diagnosis")
        if d:
            fixes = "; ".join(d.get("fixes", [])[:2])
            sys.stderr.write(
                f"zerodoctor guard [rank {rank}, step {monitor.step}, {monitor.phase}]: {d['title']}: "
                f"{d['message']}"
                + (f"\n  fix: {fixes}" if fixes else "")
                + f"\n  details: {monitor.dir / f'{stem}.json'}\n"
            )
        if where == "main thread":
            monitor.close()
    return result


FLIGHT_RECORDER_TIMEOUT_S = 10.0


def dump_flight_recorder(path: Path) -> str | None:
    """Write PyTorch's collective flight recorder (the last collectives of every process group of this rank:
    which ran, which are still pending) to `path`; the file's name, or None when there is no process group or
    no recorder. Runs in a helper thread with a timeout, so a recorder stuck behind a wedged communicator
    cannot hold up the exception it documents."""
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is None or not dist.is_available() or not dist.is_initialized():
            return None
    except Exception:  # noqa: BLE001
        return None
    from zerodoctor.guard.probes import flight_recorder

    fn, _state = flight_recorder()
    if fn is None:
        return None
    box: list[bytes] = []

    def read() -> None:
        with contextlib.suppress(Exception):  # never an uncaught error in the guard's own thread
            box.append(fn())

    t = threading.Thread(target=read, name="zerodoctor-flight-recorder", daemon=True)
    t.start()
    t.join(FLIGHT_RECORDER_TIMEOUT_S)
    if not box:
        return None
    data = box[0]
    path.write_bytes(data if isinstance(data, bytes) else str(data).encode())
    return path.name


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "-" for c in text)[:60]


def _diagnose(log_path: Any) -> dict[str, Any] | None:
    from zerodoctor.diagnose import diagnose

    found = diagnose([str(log_path)])
    if not found.findings:
        return None
    return found.findings[0].to_dict()


_installed: list[Monitor] = []


def install_hooks(monitor: Monitor) -> None:
    """Chain sys.excepthook and threading.excepthook (once per process; the newest monitor is used)."""
    if _installed:
        _installed[0] = monitor
        return
    _installed.append(monitor)
    prev_sys = sys.excepthook
    prev_thread = threading.excepthook

    def sys_hook(t: type[BaseException], e: BaseException, tb: TracebackType | None) -> None:
        with contextlib.suppress(Exception):
            record_exception(_installed[0], e, tb)
        prev_sys(t, e, tb)

    def thread_hook(args: threading.ExceptHookArgs) -> None:
        if args.exc_value is not None:
            with contextlib.suppress(Exception):
                name = args.thread.name if args.thread is not None else "?"
                record_exception(_installed[0], args.exc_value, args.exc_traceback, where=f"thread {name}")
        prev_thread(args)

    sys.excepthook = sys_hook
    threading.excepthook = thread_hook
