"""`zerodoctor diagnose RUN_DIR`: a directory of a run's logs, read as the list of its log files.

A run directory holds one or more log files per rank (`rank3.log`, `node-1/stderr.log`, torchrun's
`--log-dir` tree `<run_id>/attempt_<n>/<local_rank>/{stdout,stderr}.log`) and torchrun's error files
(`error.json`, written by `@record` / TORCHELASTIC_ERROR_FILE). Log files are taken by name; an error file
is turned into the text of the traceback it records, so it is read like any other log. The rank of a file
with no rank prefix in its lines comes from its name or its directory (`.../3/stderr.log`: see extract).

A run the runtime guard watched also has a `zerodoctor/` folder: its hang watchdog's per-rank stack dumps are
merged into one finding (who waits in which collective, who never arrived); see `hang_findings`.
"""

from __future__ import annotations

import io
import json
import re
import stat
from dataclasses import asdict, dataclass
from pathlib import Path

from zerodoctor.diagnose.source import Source
from zerodoctor.errors import DiagnoseError
from zerodoctor.findings import Evidence, Finding, Fix, Severity

MAX_FILES = 4096
MAX_DEPTH = 6
MAX_ERROR_FILE_BYTES = 4 << 20
_LOG_SUFFIXES = (".log", ".txt", ".out", ".err", ".gz", ".stdout", ".stderr")
_LOG_NAMES = frozenset({"stdout", "stderr", "error.json"})


def _is_log(p: Path) -> bool:
    name = p.name.lower()
    return name in _LOG_NAMES or name.endswith(_LOG_SUFFIXES) or (name.endswith(".json") and "error" in name)


def _is_dir(p: Path) -> bool:
    try:
        return p.is_dir()
    except (OSError, ValueError):  # a name the file system refuses is not a directory
        return False


def expand(paths: list[str]) -> list[str]:
    """Every path as given, a directory replaced by its log files (sorted, depth and count bounded)."""
    out: list[str] = []
    for path in paths:
        p = Path(path)
        if path == "-" or not _is_dir(p):
            out.append(
                path
            )  # the reader says what is wrong with it (no such file, a device, a name too long)
            continue
        found: list[str] = []
        stack = [(p, 0)]
        while stack:
            d, depth = stack.pop()
            try:
                children = sorted(d.iterdir())
            except OSError as exc:
                raise DiagnoseError(
                    f"{d}: cannot list: {exc.strerror or exc}", hint="check the permissions"
                ) from None
            for c in children:
                if c.is_symlink():
                    continue
                if c.is_dir() and depth < MAX_DEPTH:
                    stack.append((c, depth + 1))
                elif c.is_file() and _is_log(c) and not _STACKS.match(c.name):
                    # the guard's stack dumps are merged by hang_findings, not read as logs
                    found.append(str(c))
            if len(found) > MAX_FILES:
                raise DiagnoseError(
                    f"{path}: more than {MAX_FILES} log files under this directory",
                    hint="give the run's own directory, or the log files themselves",
                )
        if not found and not guard_dirs([path]):
            raise DiagnoseError(
                f"{path}: no log files in this directory (looked for *.log, *.txt, *.out, *.err, *.gz, "
                "stdout/stderr and torchrun's error.json)",
                hint="give the log files themselves",
            )
        out.extend(sorted(found))
    return out


def error_file_text(path: str) -> bytes | None:
    """The traceback recorded in a torchrun error file, as log text (None when it is not one)."""
    p = Path(path)
    if not p.name.lower().endswith(".json"):
        return None
    try:
        st = p.stat()
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_ERROR_FILE_BYTES:
            return None  # a device (/dev/zero) or a pipe is no torchrun error file: the log reader handles it
        with p.open("rb") as fh:
            raw = fh.read(MAX_ERROR_FILE_BYTES + 1)  # bounded even if the size changed since stat
        if len(raw) > MAX_ERROR_FILE_BYTES:
            return None
        doc = json.loads(raw)
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(doc, dict) or "message" not in doc:
        return None
    msg = doc["message"]
    lines: list[str] = []
    if isinstance(msg, dict):
        extra = msg.get("extraInfo") if isinstance(msg.get("extraInfo"), dict) else {}
        stack = extra.get("py_callstack") if isinstance(extra, dict) else None
        if isinstance(stack, str) and stack.strip():
            lines.append(stack.rstrip("\n"))
        elif isinstance(msg.get("message"), str):
            lines.append(msg["message"])
    elif isinstance(msg, str):
        lines.append(msg)
    if not lines:
        return None
    return ("\n".join(lines) + "\n").encode("utf-8", "replace")


def error_file_source(path: str) -> Source | None:
    text = error_file_text(path)
    return None if text is None else Source(path, io.BytesIO(text))


# ---- the runtime guard's hang-watchdog dumps ------------------------------------------------------------------
#
# `zerodoctor.guard` arms faulthandler on every rank; a rank that does not reach its next step boundary in time
# writes every thread's Python stack to `RUN_DIR/zerodoctor/stacks-rank{R}.txt` (appended, one block per dump
# beginning "Timeout (H:MM:SS)!"). Merged, the dumps say which ranks wait in a collective, which ranks never
# arrived at it (they were elsewhere), and which never dumped.

GUARD_DIR = "zerodoctor"
MAX_STACK_FILE_BYTES = 8 << 20
MAX_WORLD_SIZE = 1 << 17  # a larger world_size in a telemetry file is not a real run's: ignored
_STACKS = re.compile(r"^stacks-rank(\d+)\.txt$")
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')
_THREAD = re.compile(r"^(?:Current thread|Thread) 0x[0-9a-fA-F]+")
COLLECTIVES = frozenset(
    {
        "barrier",
        "monitored_barrier",
        "all_reduce",
        "all_gather",
        "all_gather_into_tensor",
        "_all_gather_base",
        "all_gather_object",
        "reduce_scatter",
        "reduce_scatter_tensor",
        "_reduce_scatter_base",
        "broadcast",
        "broadcast_object_list",
        "reduce",
        "gather",
        "gather_object",
        "scatter",
        "all_to_all",
        "all_to_all_single",
        "send",
        "recv",
        "wait",
    }
)
"""torch.distributed / deepspeed.comm calls a rank blocks in while it waits for the others."""
_COMM_PATHS = ("torch/distributed/", "deepspeed/comm/")


@dataclass(frozen=True)
class Frame:
    file: str
    line: int
    func: str

    def where(self) -> str:
        return f"{self.func} ({_short(self.file)}:{self.line})"


@dataclass(frozen=True)
class RankStack:
    """Where one rank's main thread stood in its watchdog's last dump."""

    rank: int
    path: str
    dumps: int
    timeout: str
    frames: tuple[Frame, ...]
    """The main thread, innermost first."""
    collective: Frame | None
    """The torch.distributed / deepspeed.comm call it blocks in, when it is in one."""
    caller: Frame | None
    """The first frame outside the communication library: who called the collective."""
    went_on: bool | None
    """It wrote telemetry after its last dump (slow, not stuck); None when there is no telemetry to tell."""

    @property
    def innermost(self) -> Frame | None:
        return self.frames[0] if self.frames else None


def _short(path: str) -> str:
    for marker in ("site-packages/", "dist-packages/"):
        if marker in path:
            return path.split(marker, 1)[1]
    return Path(path).name


def guard_dirs(paths: list[str]) -> list[Path]:
    """The guard folders among the paths: a run directory's `zerodoctor/` or the folder itself."""
    out: list[Path] = []
    for path in paths:
        p = Path(path)
        if path == "-" or not _is_dir(p):
            continue
        for d in (p / GUARD_DIR, p):
            if (
                _is_dir(d)
                and any(_STACKS.match(c.name) and c.is_file() for c in _children(d))
                and d not in out
            ):
                out.append(d)
                break
    return out


def _children(d: Path) -> list[Path]:
    try:
        return sorted(d.iterdir())
    except OSError:
        return []


def _read_text(p: Path, limit: int = MAX_STACK_FILE_BYTES) -> str:
    """The file's text, its last `limit` bytes when larger (the last dump is what counts); "" for anything
    but a regular file (a FIFO would block)."""
    try:
        if not stat.S_ISREG(p.stat().st_mode):
            return ""
        with p.open("rb") as fh:
            size = fh.seek(0, 2)
            fh.seek(max(size - limit, 0))
            return fh.read(limit).decode("utf-8", "replace")
    except OSError:
        return ""


def parse_stacks(text: str) -> tuple[int, str, list[list[Frame]]]:
    """(number of dumps, the last dump's timeout, the last dump's threads as frames innermost first)."""
    blocks = text.split("Timeout (")
    dumps = len(blocks) - 1
    last = blocks[-1]
    timeout = last.split(")", 1)[0] if dumps else ""
    threads: list[list[Frame]] = []
    for line in last.splitlines():
        if _THREAD.match(line):
            threads.append([])
            continue
        m = _FRAME.match(line)
        if m and threads:
            threads[-1].append(Frame(m["file"], int(m["line"]), m["func"]))
    return dumps, timeout, [t for t in threads if t]


def _main_thread(threads: list[list[Frame]]) -> list[Frame]:
    """The script's thread: the one whose outermost frame runs a module; else the last listed (the oldest)."""
    for t in threads:
        if t[-1].func == "<module>":
            return t
    return threads[-1] if threads else []


def _is_comm(f: Frame) -> bool:
    path = f.file.replace("\\", "/")
    return any(p in path for p in _COMM_PATHS)


def _collective(frames: list[Frame]) -> tuple[Frame | None, Frame | None]:
    """The outermost collective call of the communication library at the top of the stack, and its caller."""
    coll: Frame | None = None
    for i, f in enumerate(frames):
        if not _is_comm(f):
            if coll is not None:
                return coll, f
            if i > 2:  # a collective is the innermost frames; deeper than that is not a wait in one
                return None, None
            continue
        if f.func in COLLECTIVES:
            coll = f
    return coll, None


def _last_record_time(path: Path) -> float | None:
    """`t` of the last complete JSON line of a guard telemetry file."""
    text = _read_text(path, 1 << 16)
    for line in reversed(text.splitlines()):
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        t = rec.get("t") if isinstance(rec, dict) else None
        if isinstance(t, int | float):
            return float(t)
    return None


def _world_size(d: Path) -> int | None:
    sizes: set[int] = set()
    for p in _children(d):
        if re.match(r"^rank\d+\.jsonl$", p.name):
            first = _read_text(p, 1 << 16).split("\n", 1)[0]
            try:
                meta = json.loads(first)
            except ValueError:
                continue
            size = meta.get("world_size") if isinstance(meta, dict) else None
            if isinstance(size, int) and 0 < size <= MAX_WORLD_SIZE:
                sizes.add(size)
    return max(sizes) if sizes else None


def read_rank_stacks(d: Path) -> list[RankStack]:
    out: list[RankStack] = []
    for p in _children(d):
        m = _STACKS.match(p.name)
        if not m:
            continue
        dumps, timeout, threads = parse_stacks(_read_text(p))
        if not dumps:
            continue  # the watchdog opened its file but never fired
        rank = int(m.group(1))
        frames = _main_thread(threads)
        coll, caller = _collective(frames)
        went_on: bool | None = None
        last_t = _last_record_time(d / f"rank{rank}.jsonl")
        if last_t is not None:
            try:
                went_on = last_t > p.stat().st_mtime + 0.5
            except OSError:
                went_on = None
        out.append(RankStack(rank, str(p), dumps, timeout, tuple(frames), coll, caller, went_on))
    return out


def hang_findings(paths: list[str]) -> list[Finding]:
    """One finding per guard folder whose watchdog fired: who waits where, who never arrived, who never
    dumped (see the section comment above)."""
    out: list[Finding] = []
    for d in guard_dirs(paths):
        stacks = read_rank_stacks(d)
        if stacks:
            out.append(_hang_finding(d, stacks, _world_size(d)))
    return out


def _hang_finding(d: Path, stacks: list[RankStack], world: int | None) -> Finding:
    waiting = [s for s in stacks if s.collective is not None]
    elsewhere = [s for s in stacks if s.collective is None]
    dumped = {s.rank for s in stacks}
    silent = sorted(set(range(world)) - dumped) if world else []
    errors = {r: d / f"error-rank{r}.json" for r in silent if (d / f"error-rank{r}.json").exists()}
    parts: list[str] = []
    for s in waiting:
        assert s.collective is not None
        called = f", called from {s.caller.where()}" if s.caller else ""
        parts.append(f"rank {s.rank} waits in {s.collective.where()}{called}")
    for s in elsewhere:
        at = s.innermost.where() if s.innermost else "an unknown place (no Python frame)"
        verb = "never arrived: it was in" if waiting else "was in"
        parts.append(f"rank {s.rank} {verb} {at}")
    for r in silent:
        parts.append(
            f"rank {r} raised an exception (see {errors[r].name})"
            if r in errors
            else f"rank {r} never dumped: it finished its step, died, or has no guard"
        )
    names = sorted({s.collective.func for s in waiting if s.collective})
    if waiting and (elsewhere or silent):
        late = sorted([s.rank for s in elsewhere] + silent)
        title = f"rank(s) {sorted(s.rank for s in waiting)} wait in {'/'.join(names)} for rank(s) {late}"
    elif waiting:
        title = f"every rank that dumped waits in {'/'.join(names)}: the collective itself does not complete"
    else:
        title = f"rank(s) {sorted(dumped)} stopped reaching step boundaries, outside any collective"
    stuck = [s.rank for s in stacks if s.went_on is not True]
    recovered = not stuck
    message = "; ".join(parts) + (
        ". Every rank that dumped went on afterwards: a slow rank held the others up, not a hang."
        if recovered
        else f". Rank(s) {stuck} wrote nothing after the dump: the run was stuck there."
    )
    fixes = [
        Fix(
            "look first at the ranks that never arrived: they are the cause; the waiting ranks only wait (a rank "
            "that skips a collective, takes a different branch or data path, or died, leaves the others waiting)"
        ),
        Fix(
            "when every rank waits in the same collective, suspect the network or NCCL: rerun with "
            "NCCL_DEBUG=INFO and TORCH_NCCL_ASYNC_ERROR_HANDLING=1, and check that every rank runs the same "
            "number of steps (an uneven last batch, an uneven number of samples per rank)"
        ),
    ]
    return Finding(
        id="guard.hang",
        severity=Severity.WARNING if recovered else Severity.ERROR,
        title=title,
        message=message,
        fixes=tuple(fixes),
        evidence=tuple(
            Evidence(file=s.path, text=(s.innermost.where() if s.innermost else "no frames")) for s in stacks
        ),
        source="diagnose",
        data={
            "phase": "hang",
            "ranks_waiting": [s.rank for s in waiting],
            "ranks_elsewhere": [s.rank for s in elsewhere],
            "ranks_silent": silent,
            "ranks_stuck": stuck,
            "world_size": world,
            "collectives": names,
            "stacks": [
                {
                    "rank": s.rank,
                    "file": s.path,
                    "dumps": s.dumps,
                    "timeout": s.timeout,
                    "innermost": asdict(s.innermost) if s.innermost else None,
                    "collective": asdict(s.collective) if s.collective else None,
                    "caller": asdict(s.caller) if s.caller else None,
                    "went_on": s.went_on,
                    "frames": [f.where() for f in s.frames[:8]],
                }
                for s in stacks
            ],
        },
    )


def with_hang_findings(findings: list[Finding], paths: list[str]) -> list[Finding]:
    """The findings with the guard's hang findings inserted after those at least as severe."""
    out = list(findings)
    for h in hang_findings(paths):
        i = next((k for k, f in enumerate(out) if f.severity < h.severity), len(out))
        out.insert(i, h)
    return out
