"""Run one generated case through `zerodoctor.cli.main.main(argv)` in a forked child with a time limit, and
judge the outcome against issue 11's contract: exit code in {0, 1, 2}, no traceback, on exit 2 one error
line that names the file or option, under the time limit, no input file changed or removed, and nothing
written beside the inputs that the user did not ask for.

A fork (not a fresh interpreter) keeps a case at a few milliseconds of overhead, and still lets a hang be
killed and the child's peak RSS be read from wait4().
"""

from __future__ import annotations

import hashlib
import os
import resource
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from generators import Case

MEMORY_LIMIT = 3 * 2**30  # address space of a case: /dev/zero read to the end must fail, not take the machine


@dataclass
class Outcome:
    code: int | None  # None: killed for the time limit
    seconds: float  # wall clock (the machine may be shared: see cpu_seconds)
    stdout: str
    stderr: str
    max_rss_kib: int
    cpu_seconds: float = 0.0  # user + system time of the child: what the case itself cost
    problems: list[str] = field(default_factory=list)


PRELOAD = (
    "zerodoctor.cli.main",
    "zerodoctor.lint.engine",
    "zerodoctor.lint.fixer",
    "zerodoctor.setup.load",
    "zerodoctor.plan.candidates",
    "zerodoctor.plan.inputs",
    "zerodoctor.plan.emit",
    "zerodoctor.env.snapshot",
    "zerodoctor.kb.loader",
    "zerodoctor.diagnose.judge",
    "zerodoctor.diagnose.scan",
    "zerodoctor.check.pipeline",
    "zerodoctor.report.render",
)


def preload() -> None:
    """Import what the commands import lazily, once, so that every forked case starts warm (a case then
    costs what the command costs, not the imports). A module that does not exist (yet) is skipped."""
    import contextlib
    import importlib

    for name in PRELOAD:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)


def materialize(case: Case, root: Path) -> None:
    root.mkdir(parents=True, exist_ok=True)
    for name, data in case.files.items():
        p = root / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    for name, what in case.special.items():
        p = root / name
        if len(name) > 255 or any(len(part) > 255 for part in Path(name).parts):
            continue  # an overlong path cannot be created; the command gets it as given
        p.parent.mkdir(parents=True, exist_ok=True)
        if what == "fifo":
            os.mkfifo(p)
        elif what == "dir":
            p.mkdir(parents=True, exist_ok=True)
        elif what == "devzero":
            p.symlink_to("/dev/zero")
        elif what == "devnull":
            p.symlink_to("/dev/null")
        elif what == "loop":
            p.symlink_to(p.name)
        elif what == "dirloop":  # a directory link to the directory holding it
            p.symlink_to(".")


def _hashes(root: Path) -> dict[str, str]:
    out = {}
    for dirpath, _dirs, names in os.walk(root):
        for n in names:
            p = Path(dirpath) / n
            if p.is_symlink() or not p.is_file():
                continue
            out[str(p.relative_to(root))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


LAUNCH_REACHED = "fuzz: the real run would start here"


def _stop_at_launch() -> None:
    """selftest cases: the run is not started; reaching its launch ends the case (exit 0, this line)."""
    import zerodoctor.selftest.run as st_run

    def launch(*_a: object, **_k: object) -> None:
        sys.stdout.write(LAUNCH_REACHED + "\n")
        sys.stdout.flush()
        os._exit(0)

    st_run.launch = launch  # type: ignore[assignment]


def _child(argv: list[str], root: Path, stdin: bytes | None, case: Case | None = None) -> None:
    try:
        if case is not None:
            os.environ.update(case.env)
            if case.no_launch:
                _stop_at_launch()
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
        os.chdir(root)
        logs = root.parent / (root.name + ".io")
        logs.mkdir(exist_ok=True)
        (logs / "in").write_bytes(stdin or b"")
        out = open(logs / "out", "w", encoding="utf-8", errors="replace")  # noqa: SIM115
        err = open(logs / "err", "w", encoding="utf-8", errors="replace")  # noqa: SIM115
        os.dup2(out.fileno(), 1)
        os.dup2(err.fileno(), 2)
        sys.stdout, sys.stderr = out, err
        sys.stdin = open(logs / "in", encoding="utf-8", errors="surrogateescape")  # noqa: SIM115
        os.environ["COLUMNS"] = "100"
        os.environ["NO_COLOR"] = "1"
        from zerodoctor.cli.main import main

        code = main(argv)
        out.flush()
        err.flush()
        os._exit(code if 0 <= code < 256 else 99)
    except BaseException:  # noqa: BLE001 - anything escaping main() is a failure of the contract
        import traceback

        traceback.print_exc()
        sys.stderr.flush()
        os._exit(98)


def run_case(case: Case, root: Path, timeout: float = 10.0) -> Outcome:
    materialize(case, root)
    before = _hashes(root)
    argv = [a.replace("{d}", str(root)) for a in case.argv]
    sys.stdout.flush()
    sys.stderr.flush()
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:
        _child(argv, root, case.stdin, case)
    code: int | None = None
    rss = 0
    cpu = 0.0
    while True:
        wpid, status, usage = os.wait4(pid, os.WNOHANG)
        if wpid:
            code = os.waitstatus_to_exitcode(status)
            rss, cpu = usage.ru_maxrss, usage.ru_utime + usage.ru_stime
            break
        if time.monotonic() - start > timeout:
            os.kill(pid, signal.SIGKILL)
            _, _, usage = os.wait4(pid, 0)
            rss, cpu = usage.ru_maxrss, usage.ru_utime + usage.ru_stime
            break
        time.sleep(0.005)
    seconds = time.monotonic() - start
    logs = root.parent / (root.name + ".io")

    def read(name: str) -> str:
        p = logs / name
        return p.read_text(encoding="utf-8", errors="replace") if p.exists() else ""

    outcome = Outcome(code, seconds, read("out"), read("err"), rss, cpu)
    outcome.problems = judge(case, argv, outcome, before, _hashes(root))
    return outcome


def judge(
    case: Case, argv: list[str], o: Outcome, before: dict[str, str], after: dict[str, str]
) -> list[str]:
    problems = []
    if o.code is None:
        problems.append(f"hang: killed after {o.seconds:.1f} s")
    elif o.code not in (0, 1, 2):
        problems.append(f"exit {o.code}")
    if "Traceback (most recent call last)" in o.stdout + o.stderr:
        lines = [ln for ln in o.stderr.splitlines() if ln.strip()]
        frames = [ln.strip() for ln in lines if ln.strip().startswith('File "') and "zerodoctor" in ln]
        where = frames[-1].split("zerodoctor/")[-1] if frames else "?"
        problems.append(f"traceback: {(lines or ['?'])[-1][:200]} at {where}")
    if o.code == 2:
        lines = [ln for ln in o.stderr.splitlines() if ln.strip()]
        errors = [ln for ln in lines if ln.startswith("zerodoctor: error:")]
        if len(errors) != 1:
            problems.append(f"exit 2 with {len(errors)} error lines: {o.stderr[-300:]!r}")
        else:
            err = errors[0]
            given = [a[:40] for a in argv if len(a) >= 3 and not a.startswith("--")]  # a value the user typed
            names = [m for m in case.mentions if m] + given + ["argument ", "--"]
            if not any(m in err for m in names):
                problems.append(f"error names no file or option: {err[:300]}")
    in_place = "--in-place" in argv
    for name, digest in before.items():
        if name not in after:
            problems.append(f"harmed: {name} removed")
        elif after[name] != digest:
            backups = [n for n in after if n.startswith(name + ".bak") and after[n] == digest]
            if not (in_place and backups):
                problems.append(f"harmed: {name} changed" + (" without a backup" if in_place else ""))
    flags = ("--emit-ds-config", "--fix", "--out", "--workdir", "--run-dir")
    asked = [argv[argv.index(flag) + 1] for flag in flags if flag in argv[:-1]]
    if argv[0] == "report" and "--out" not in argv and "--format" not in argv:  # the page's default place
        asked += [f"{argv[1].rstrip('/')}/zerodoctor/report", f"{argv[1].rstrip('/')}/report"]
    asked = [
        os.path.normpath(a) for a in asked if not a.startswith("-")
    ]  # `check --fix DIR`; lint's --fix is a flag
    for name in after.keys() - before.keys():
        ok = ("--fix" in argv and (".fixed" in name or ".bak" in name)) or any(
            a == "." or name == a or name.startswith(a + "/") for a in asked
        )
        if not ok:
            problems.append(f"wrote {name} (not asked for)")
    return problems
