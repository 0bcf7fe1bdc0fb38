"""Which rank stopped first, and how every other rank ended, from the evidence the ranks and torchrun left.

When one rank dies or hangs mid-step, every other rank soon stops too: it waits in a collective for the
missing partner until the watchdog ends it, or torchrun ends it (SIGTERM) as soon as one rank's process is
gone. Naming the first rank in rank order, or the first rank past a phase limit, names rank 0 every time.
The evidence, strongest first:

* torchrun's failure summary: an exit code per rank and its "first observed failure";
* the SIGTERM stacks (`rank<R>.term`): a rank that has them was ended by torchrun or the watchdog;
* progress marks: every rank runs the same sequence of phases and forward/backward/step marks, so a rank
  waiting for a hung partner has marked further than the partner;
* the watchdog's SIGUSR1 stacks (`rank<R>.stack`): a rank whose innermost frames are a collective
  (torch.distributed, DeepSpeed's comm layer, a work handle's `wait`) was waiting; the other one was not.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from zerodoctor.selftest.result import PHASE_TITLES
from zerodoctor.selftest.run import Launch, RankLog
from zerodoctor.textutil import clip

_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)', re.M)
_THREAD = re.compile(r"^(?:Current thread|Thread) 0x[0-9a-fA-F]+.*$", re.M)
_COLLECTIVE_FILES = (
    "torch/distributed/",
    "deepspeed/comm/",
    "deepspeed/runtime/comm/",
)
_WAIT_FUNCS = frozenset({"wait", "wait_stream", "synchronize", "barrier"})
_SIGTERM = -15
_ECHO_MARKERS = (
    "Connection reset by peer",
    "Connection closed by peer",
    "remote worker",
    "Broken pipe",
    "Socket Timeout",
    "NCCL communicator was aborted",
    "Watchdog caught collective operation timeout",
)


def is_echo(event: dict[str, Any]) -> bool:
    """An error that says a peer went away, not what went wrong (gloo / NCCL after another rank died)."""
    message = str(event.get("message") or "")
    return any(marker in message for marker in _ECHO_MARKERS)


@dataclass(frozen=True)
class Frame:
    file: str
    line: int
    func: str

    def short(self) -> str:
        parts = self.file.replace("\\", "/").split("/")
        tail = "/".join(parts[-3:]) if "site-packages" in self.file else "/".join(parts[-2:])
        return f"{tail}:{self.line} in {self.func}"


def main_stack(text: str) -> list[Frame]:
    """The main thread's frames, innermost first, from a faulthandler dump (all threads)."""
    starts = [m.start() for m in _THREAD.finditer(text)]
    blocks = [text[a:b] for a, b in zip(starts, [*starts[1:], len(text)], strict=True)] or [text]
    frames_of = [
        [Frame(m["file"], int(m["line"]), m["func"]) for m in _FRAME.finditer(block)] for block in blocks
    ]
    # the main thread runs the worker module (and runpy below it); the others are DeepSpeed/torch helpers
    for frames in frames_of:
        if any("zerodoctor/selftest/worker" in f.file.replace("\\", "/") for f in frames):
            return frames
    return next((f for f in frames_of if f), [])


def waiting_in_collective(frames: Sequence[Frame]) -> bool:
    """The innermost frames are a collective, or DeepSpeed waiting on a collective's handle: the rank was
    waiting for its partners. (torch's JIT-build lock, `file_baton.wait`, is no collective.)"""
    inner = list(frames[:3])
    files = [f.file.replace("\\", "/") for f in inner]
    return any(any(c in path for c in _COLLECTIVE_FILES) for path in files) or bool(
        inner and inner[0].func in _WAIT_FUNCS and "deepspeed/" in files[0]
    )


def where(frames: Sequence[Frame]) -> str:
    """The innermost frame, and the innermost frame of the selftest's own code when that is another."""
    if not frames:
        return ""
    own = next((f for f in frames if "zerodoctor/" in f.file.replace("\\", "/")), None)
    text = frames[0].short()
    if own is not None and own is not frames[0]:
        text += f", called from {own.short()}"
    return text


@dataclass(frozen=True)
class Stop:
    """The first failure (rank None: no rank can be singled out) and how each other rank ended."""

    rank: int | None
    phase: str | None
    how: str  # what the first rank did, in words
    others: dict[int, str] = field(default_factory=dict)  # rank -> how it ended, in words
    evidence: tuple[str, ...] = ()

    def describe(self) -> str:
        who = f"rank {self.rank}" if self.rank is not None else "every rank"
        text = f"{who} {self.how}"
        if self.others:
            text += "; " + "; ".join(f"rank {r} {how}" for r, how in sorted(self.others.items()))
        return text


def _position(rl: RankLog) -> str:
    mark = rl.last_mark
    if mark is None:
        cur = rl.current()
        return f"in {PHASE_TITLES.get(cur[0], cur[0])}" if cur else ""
    step, micro = int(mark.get("step", 0)) + 1, int(mark.get("micro", 0)) + 1
    at = {"step": "optimizer step"}.get(str(mark.get("at")), str(mark.get("at")))
    return f"in step {step}, micro batch {micro}, at the {at}"


def _ended_by(rl: RankLog, launch: Launch) -> str | None:
    """'the watchdog' / 'torchrun' when a signal from them ended this rank, else None."""
    terminated = bool(rl.term.strip()) or launch.exit_codes.get(rl.rank) == _SIGTERM
    if not terminated and not (launch.watchdog and not rl.done and rl.error is None):
        return None
    return "the watchdog" if launch.watchdog else "torchrun"


def _waiting_text(rl: RankLog) -> str:
    """Where a rank that others ended was: its watchdog stack, or a collective it was in at SIGTERM."""
    if rl.stack.strip():
        frames = main_stack(rl.stack)
        verb = "waiting in a collective at" if waiting_in_collective(frames) else "at"
        return f" ({verb} {where(frames)})" if frames else ""
    frames = main_stack(rl.term)
    return f" (waiting in a collective at {where(frames)})" if waiting_in_collective(frames) else ""


def stopped_ranks(
    logs: Sequence[RankLog], launch: Launch, *, hung: bool, first_rank: int | None = None
) -> Stop | None:
    """The rank that stopped first among ranks that ended without a Python exception of their own.

    `hung`: the watchdog ended a run that was still going (a phase past its limit, or ranks left running
    after a failure); otherwise the ranks' processes ended (killed, crashed, or stopped by torchrun).
    `first_rank`: a rank whose own Python exception is the first failure; every silent rank is then one of
    the others, described by how it ended."""
    silent = [rl for rl in logs if not rl.done and rl.error is None and rl.events]
    if first_rank is not None:
        others = {
            rl.rank: f"was ended by {_ended_by(rl, launch) or 'its own end'}{_waiting_text(rl)}"
            for rl in silent
        }
        return Stop(first_rank, None, "raised the first error", {**others, **_echoes(logs, first_rank)})
    if not silent:
        return None
    evidence: list[str] = []
    if hung:
        stacks = {rl.rank: main_stack(rl.stack) for rl in silent}
        low = min(rl.progress for rl in silent)
        behind = [rl for rl in silent if rl.progress == low]
        if len(behind) < len(silent):
            evidence.append(
                "progress marks: " + ", ".join(f"rank {rl.rank} {_position(rl)}" for rl in silent)
            )
        not_waiting = [rl for rl in behind if stacks[rl.rank] and not waiting_in_collective(stacks[rl.rank])]
        if len(not_waiting) == 1 or (not_waiting and len(not_waiting) < len(behind)):
            behind = not_waiting
        if any(stacks.values()):
            evidence.append(
                "stacks: "
                + "; ".join(
                    f"rank {r} {'waiting in a collective' if waiting_in_collective(f) else 'not in a collective'}"
                    for r, f in sorted(stacks.items())
                    if f
                )
            )
        if len(behind) > 1:
            cur = behind[0].current()
            return Stop(
                None,
                cur[0] if cur else None,
                f"stopped at the same point ({', '.join(str(rl.rank) for rl in behind)}: {_position(behind[0])}) "
                "and none can be singled out; all were ended by the watchdog",
                evidence=tuple(evidence),
            )
        first = behind[0]
        frames = stacks[first.rank]
        how = f"stopped making progress {_position(first)}".rstrip()
        if frames:
            how += f" (its stack: {where(frames)})"
        how += " and was ended by the watchdog"
    else:
        self_ended = [rl for rl in silent if _ended_by(rl, launch) is None]
        if launch.root_cause_rank is not None and launch.root_cause_rank in {rl.rank for rl in self_ended}:
            first = next(rl for rl in self_ended if rl.rank == launch.root_cause_rank)
            evidence.append(f"torchrun's first observed failure: rank {first.rank}")
        elif self_ended:
            first = min(self_ended, key=lambda rl: rl.last_time or 0.0)
        else:
            first = min(silent, key=lambda rl: rl.last_time or 0.0)
        code = launch.exit_codes.get(first.rank)
        how = "ended without a Python exception" + (
            f" (exit code {code}{', ' + _signal_name(code) if code < 0 else ''})" if code is not None else ""
        )
        if _position(first):
            how += f" {_position(first)}"
    cur = first.current()
    others = {}
    for rl in silent:
        if rl is first:
            continue
        by = _ended_by(rl, launch) or "its own end"
        others[rl.rank] = f"was ended by {by}{_waiting_text(rl)}"
    others.update(_echoes(logs, first.rank))
    return Stop(first.rank, cur[0] if cur else None, how, others, tuple(evidence))


def _echoes(logs: Sequence[RankLog], first_rank: int | None) -> dict[int, str]:
    """Ranks whose error only says that a partner went away (gloo's "Connection reset by peer", ...)."""
    out = {}
    for rl in logs:
        if rl.rank != first_rank and rl.error is not None and is_echo(rl.error):
            message = clip(" ".join(str(rl.error.get("message") or "").split()), 120)
            out[rl.rank] = f"then failed because its partner was gone ({rl.error.get('type')}: {message})"
    return out


def _signal_name(code: int) -> str:
    import signal

    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"
