"""The framework-free runtime monitor: one per process (rank). Adapters (HF callback, DeepSpeed engine
watcher) call it at step boundaries; it writes `RUN_DIR/zerodoctor/rank{R}.jsonl` and judges trends.

Every record is one JSON object per line with `kind` in {meta, sample, event, finding, prediction, gap,
guard_error} plus `t` (unix time), `rank` and, for step records, `step`. The hot path (`step_end`) does no
collective, no device synchronize, no gc and no peak reset: it reads counters and appends one line.

The guard never stops, slows or changes a run unless asked: every adapter entry point goes through `safe()`,
which logs the guard's own error once per place and carries on.
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import logging
import os
import socket
import sys
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import IO, Any

from zerodoctor.findings import Evidence, Finding, Fix, Severity
from zerodoctor.guard.options import GuardOptions
from zerodoctor.guard.probes import (
    HostProbe,
    NotAvailable,
    flight_recorder,
    gpu_availability,
    gpu_sample,
    host_limit,
)

log = logging.getLogger("zerodoctor.guard")

GUARD_DIR = "zerodoctor"
SPIKE_PHASES = frozenset({"first_optimizer_step", "evaluation", "save"})
"""Phases the planner predicts as spikes; the host-RAM trend is fitted outside them."""
MIB = 1 << 20
GIB = 1 << 30


class GuardFault(RuntimeError):
    """Raised on purpose inside the guard when `GuardOptions.fault` names a place (tests of the guard)."""


def _env_int(*names: str) -> int | None:
    for n in names:
        v = os.environ.get(n)
        if v is not None and v.strip().lstrip("-").isdigit():
            return int(v)
    return None


def guard_dir(run_dir: Path) -> Path:
    return run_dir / GUARD_DIR


class Monitor:
    def __init__(
        self,
        options: GuardOptions | None = None,
        *,
        rank: int | None = None,
        local_rank: int | None = None,
        world_size: int | None = None,
    ) -> None:
        self.options = options or GuardOptions()
        self.rank = rank if rank is not None else (_env_int("RANK", "SLURM_PROCID") or 0)
        self.local_rank = (
            local_rank if local_rank is not None else (_env_int("LOCAL_RANK", "SLURM_LOCALID") or 0)
        )
        self.world_size = world_size if world_size is not None else (_env_int("WORLD_SIZE") or 1)
        self.host = socket.gethostname()
        self.run_dir = Path(self.options.run_dir or os.getcwd())
        self.dir = guard_dir(self.run_dir)
        self.findings: list[Finding] = []
        self._errors_seen: set[str] = set()
        self._faults_fired: set[str] = set()
        self._file: IO[str] | None = None
        self._stacks: IO[str] | None = None
        self.host_probe = HostProbe()
        self.phase = "init"
        self.step = 0
        self.epoch: float | None = None
        self.optimizer_steps = 0
        self._last_step_t: float | None = None
        self.longest_step_s = 0.0
        self.step_times: deque[float] = deque(maxlen=200)
        self._trend: deque[tuple[float, int, int]] = deque(maxlen=max(self.options.trend_window, 3))
        self._trend_warned = False
        self.last_sample: dict[str, Any] = {}
        self.prediction: dict[str, Any] | None = None
        self._gap_warned: set[tuple[str, str]] = set()
        self._save: dict[str, Any] | None = None
        self.save_peaks: list[dict[str, Any]] = []
        self.closed = False
        with self.safe("open"):
            self.dir.mkdir(parents=True, exist_ok=True)
            self._file = open(self.dir / f"rank{self.rank}.jsonl", "a", buffering=1, encoding="utf-8")  # noqa: SIM115
            self.write(
                "meta",
                host=self.host,
                pid=os.getpid(),
                local_rank=self.local_rank,
                world_size=self.world_size,
                argv=sys.argv[:20],
                versions=_versions(),
                not_available=[na.to_dict() for na in self._unavailable()],
                flight_recorder=flight_recorder()[1],
                options={k: (str(v) if isinstance(v, Path) else v) for k, v in vars(self.options).items()},
            )

    # ---- plumbing ------------------------------------------------------------------------------------------

    def _unavailable(self) -> list[NotAvailable]:
        out = self.host_probe.unavailable()
        gpu = gpu_availability()
        if gpu is not None:
            out.append(gpu)
        return out

    def write(self, kind: str, **fields: Any) -> None:
        if self._file is None:
            return
        rec = {"kind": kind, "t": round(time.time(), 3), "rank": self.rank, **fields}
        self._file.write(json.dumps(rec, default=str, separators=(",", ":")) + "\n")

    @contextlib.contextmanager
    def safe(self, where: str) -> Iterator[None]:
        """Run guard code; its own exception is logged once per place and swallowed, never the run's."""
        try:
            yield
        except Exception as exc:  # noqa: BLE001 - the guard must never stop the run
            self.guard_error(where, exc)

    def fault_point(self, where: str) -> None:
        """Raise GuardFault the first time `where` is reached when `options.fault` names it (tests)."""
        if self.options.fault == where and where not in self._faults_fired:
            self._faults_fired.add(where)
            raise GuardFault(f"injected guard fault in {where!r} (ZERODOCTOR_GUARD_FAULT)")

    def guard_error(self, where: str, exc: BaseException) -> None:
        if where in self._errors_seen:
            return
        self._errors_seen.add(where)
        try:
            self.write("guard_error", where=where, error=f"{type(exc).__name__}: {exc}")
            log.warning(
                "zerodoctor guard [rank %s]: internal error in %s ignored: %s: %s (training goes on)",
                self.rank,
                where,
                type(exc).__name__,
                exc,
            )
        except Exception:  # noqa: BLE001
            pass

    def add_finding(self, finding: Finding, *, announce: bool = True) -> None:
        finding = replace(finding, source="guard")
        self.findings.append(finding)
        self.write("finding", step=self.step, finding=finding.to_dict())
        if announce and finding.severity >= Severity.WARNING:
            log.warning(
                "zerodoctor guard [rank %s] %s: %s: %s",
                self.rank,
                finding.severity.label,
                finding.title,
                finding.message,
            )

    # ---- samples and events --------------------------------------------------------------------------------

    def sample(self, **extra: Any) -> dict[str, Any]:
        rec: dict[str, Any] = {}
        with self.safe("sample"):
            self.fault_point("sample")
            rec = {**gpu_sample(), **self.host_probe.sample()}
        self.last_sample = rec
        self.write(
            "sample",
            step=self.step,
            optimizer_step=self.optimizer_steps,
            epoch=self.epoch,
            phase=self.phase,
            **rec,
            **extra,
        )
        return rec

    def event(self, name: str, **fields: Any) -> None:
        self.write(
            "event",
            event=name,
            step=self.step,
            optimizer_step=self.optimizer_steps,
            epoch=self.epoch,
            **fields,
        )

    def train_begin(self, *, max_steps: int | None = None, **fields: Any) -> None:
        with self.safe("train_begin"):
            self.phase = "first_optimizer_step"
            self._last_step_t = time.perf_counter()
            self.event("train_begin", max_steps=max_steps, **fields)
            self.sample()
            self.arm_watchdog(self.options.hang_first_s)

    def step_end(self, step: int, *, epoch: float | None = None, optimizer_step: bool = True) -> None:
        """The hot path: called at every optimizer-step boundary."""
        with self.safe("step_end"):
            self.fault_point("step_end")
            now = time.perf_counter()
            first = self.optimizer_steps == 0
            if self._last_step_t is not None:
                dt = now - self._last_step_t
                self.step_times.append(dt)
                if not first:
                    self.longest_step_s = max(self.longest_step_s, dt)
            self._last_step_t = now
            self.step = step
            self.epoch = epoch
            if optimizer_step:
                self.optimizer_steps += 1
            if first:
                self.event(
                    "first_optimizer_step", seconds=round(self.step_times[-1], 3) if self.step_times else None
                )
            if first or step % max(self.options.every, 1) == 0:
                s = self.sample(step_s=round(self.step_times[-1], 4) if self.step_times else None)
                if first:
                    self.compare_prediction("first_step", s)
                elif self.optimizer_steps == 2:
                    self.compare_prediction("steady", s)
                if self.phase not in SPIKE_PHASES:
                    self._trend_update(s)
            self.phase = "train"
            self.arm_watchdog(self._hang_timeout())

    def phase_begin(self, phase: str) -> None:
        with self.safe("phase"):
            self.phase = phase
            self.event(f"{phase}_begin")
            self.arm_watchdog(self._hang_timeout(looser=True))

    def phase_end(self, phase: str, **fields: Any) -> None:
        with self.safe("phase"):
            self.event(f"{phase}_end", **fields)
            self.phase = "train"
            self._last_step_t = time.perf_counter()  # the phase's time is not a step's
            self.arm_watchdog(self._hang_timeout())

    def train_end(self) -> None:
        with self.safe("train_end"):
            self.sample()
            self.event("train_end", longest_step_s=round(self.longest_step_s, 4), findings=len(self.findings))
            self.close()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        with contextlib.suppress(Exception):
            faulthandler.cancel_dump_traceback_later()
        for f in (self._file, self._stacks):
            if f is not None:
                with contextlib.suppress(Exception):
                    f.flush()

    # ---- checkpoint saves ----------------------------------------------------------------------------------

    def save_begin(self, step: int, *, predicted_spike: dict[str, int] | None = None) -> None:
        with self.safe("save"):
            s = self.sample()
            self._save = {"step": step, "t0": time.perf_counter(), "before": s}
            self.phase = "save"
            self.event("save_begin", predicted_spike=predicted_spike)
            self.arm_watchdog(self._hang_timeout(looser=True))

    def save_end(self, step: int) -> dict[str, Any] | None:
        """Record the save's real peak: a peak counter that rose during the save is the save's own peak
        (the allocator's peaks are never reset, so an unchanged counter means the save stayed below it)."""
        out: dict[str, Any] | None = None
        with self.safe("save"):
            start = self._save or {"step": step, "t0": time.perf_counter(), "before": self.last_sample}
            before = start["before"]
            after = self.sample()
            out = {"seconds": round(time.perf_counter() - start["t0"], 3)}
            for key in ("gpu_allocated_peak", "gpu_reserved_peak", "rss_hwm"):
                if key in after and key in before:
                    rose = after[key] > before[key]
                    out[key] = after[key] if rose else None
                    out[f"{key}_before"] = before[key]
            for key in ("cgroup_usage", "node_used", "rss"):
                if key in after and key in before:
                    out[f"{key}_delta"] = after[key] - before[key]
            self.save_peaks.append({"step": step, **out})
            self.event("save_end", **out)
            self.compare_prediction("save", after)
            self._save = None
            self.phase = "train"
            self._last_step_t = time.perf_counter()
            self.arm_watchdog(self._hang_timeout())
        return out

    # ---- host RAM trend ------------------------------------------------------------------------------------

    def host_measure(self, s: dict[str, Any]) -> tuple[int, int, str]:
        """(used, limit, what) of host memory as the options say (cgroup/node/rss, limit override)."""
        return self._trend_measure(s)

    def _trend_measure(self, s: dict[str, Any]) -> tuple[int, int, str]:
        m = self.options.host_measure
        if m == "rss":
            limit = self.options.host_limit_bytes or int(s["node_total"])
            return int(s["rss"]), limit, "this process's RSS"
        if m == "node":
            used, limit, what = int(s["node_used"]), int(s["node_total"]), "node"
        else:
            used, limit, what = host_limit(s)
        what = "the job's cgroup" if what == "cgroup" else f"node {self.host}"
        return used, self.options.host_limit_bytes or limit, what

    def _trend_update(self, s: dict[str, Any]) -> None:
        if "node_used" not in s:
            return
        if self.options.host_measure != "rss" and self.local_rank != 0:
            return  # one judge per node: the node's memory is shared by its ranks
        used, limit, what = self._trend_measure(s)
        self._trend.append((time.time(), self.step, used))
        if self._trend_warned or len(self._trend) < self.options.trend_min_points:
            return
        pts = list(self._trend)
        slope_t = _slope([p[0] for p in pts], [p[2] for p in pts])
        growth = pts[-1][2] - pts[0][2]
        if slope_t <= 0 or growth < self.options.trend_min_growth_bytes:
            return
        over = used >= limit
        eta = 0.0 if over else (limit - used) / slope_t
        if eta > self.options.trend_horizon_s:
            return
        slope_s = _slope([p[1] for p in pts], [p[2] for p in pts])
        steps_left = 0 if over else int((limit - used) / slope_s) if slope_s > 0 else None
        self._trend_warned = True
        at = f", around step {self.step + steps_left}" if steps_left is not None else ""
        where = (
            f"at {used / GIB:.2f} GiB it is already over the {limit / GIB:.2f} GiB limit"
            if over
            else f"at {used / GIB:.2f} of {limit / GIB:.2f} GiB it reaches the limit in about {eta / 60:.0f} min{at}"
        )
        self.add_finding(
            Finding(
                id="guard.host-ram-trend",
                severity=Severity.WARNING,
                title="host RAM keeps growing toward the limit",
                message=(
                    f"{what} grew {growth / MIB:.0f} MiB over steps {pts[0][1]}-{pts[-1][1]} "
                    f"({slope_t * 60 / MIB:.0f} MiB/min, {slope_s / MIB:.1f} MiB/step) outside first-step, "
                    f"evaluation and save spikes; {where}, and the kernel then kills the job (exitcode -9)"
                ),
                fixes=(
                    Fix(
                        "look for memory held across steps (lists of tensors or losses kept without "
                        ".item()/.detach(), a growing cache, dataloader workers with copy-on-write growth)"
                    ),
                    Fix(
                        "lower dataloader_num_workers or use persistent_workers=False; with offload, lower "
                        "host pinned buffers (pin_memory: false) or offload fewer states"
                    ),
                    Fix("ask the scheduler for more memory per node (Slurm --mem, Kubernetes limits)"),
                ),
                evidence=(Evidence(key="host_ram", text=f"{used} of {limit} bytes at step {self.step}"),),
                references=("deepspeedai/DeepSpeed#3232", "deepspeedai/DeepSpeed#4380"),
                data={
                    "slope_bytes_per_s": slope_t,
                    "slope_bytes_per_step": slope_s,
                    "eta_s": eta,
                    "used": used,
                    "limit": limit,
                    "measure": what,
                    "projected_step": self.step + steps_left if steps_left is not None else None,
                },
            )
        )

    # ---- prediction ----------------------------------------------------------------------------------------

    def set_prediction(self, prediction: dict[str, Any]) -> None:
        """Record the planner's prediction and hold the load phase against the train-begin sample (taken after
        the model was loaded and the engine built: its peak counters and RSS high-water mark are the load's)."""
        self.prediction = prediction
        self.write("prediction", **prediction)
        if self.last_sample:
            self.compare_prediction("load", self.last_sample)

    def compare_prediction(self, phase: str, s: dict[str, Any]) -> None:
        """Record measured vs predicted for a phase; warn when a measurement exceeds the prediction.

        GPU: this rank's reserved peak against the planner's per-GPU figure. Host: this rank's RSS high-water
        mark against its share of the planner's per-node figure (per node / ranks per node); the node or
        cgroup figure is recorded too, but not judged: it also holds other processes and the page cache, and
        summing the ranks of a node would take a collective."""
        pred = self.prediction
        if not pred or not pred.get("available") or phase not in pred.get("phases", {}):
            return
        p = pred["phases"][phase]
        per_node = p.get("host_bytes_per_node")
        ranks_here = max(int(pred.get("ranks_per_node") or 1), 1)
        gap: dict[str, Any] = {
            "phase": phase,
            "predicted_gpu": p.get("gpu_bytes"),
            "predicted_host_node": per_node,
            "predicted_host_rank_share": per_node // ranks_here if per_node is not None else None,
        }
        if "gpu_reserved_peak" in s:
            gap["measured_gpu"] = s["gpu_reserved_peak"]
        if "rss" in s:
            gap["measured_rss"] = s["rss"]
            gap["measured_rss_peak"] = s.get("rss_hwm", s["rss"])
        if "node_used" in s:
            used, _limit, what = host_limit(s)
            gap["measured_host_node"] = used
            gap["host_measure"] = what
        self.write("gap", step=self.step, **gap)
        where = f"the {phase.replace('_', ' ')} phase"
        pg, mg = gap.get("predicted_gpu"), gap.get("measured_gpu")
        if pg and mg and _above(mg, pg):
            self._above_plan(
                "gpu",
                gap,
                f"rank {self.rank} reserved {mg / GIB:.2f} GiB at its peak up to {where}; zerodoctor plan "
                f"predicted {pg / GIB:.2f} GiB per GPU for this model, config and world size",
                "compare with `zerodoctor plan` for this setup; activation memory (seq length, micro batch, "
                "gradient checkpointing) is the usual difference",
            )
        ph, mh = gap.get("predicted_host_rank_share"), gap.get("measured_rss_peak")
        if ph and mh and per_node and _above(mh, ph):
            self._above_plan(
                "host",
                gap,
                f"rank {self.rank}'s RSS reached {mh / GIB:.2f} GiB up to {where}; zerodoctor plan predicted "
                f"{per_node / GIB:.2f} GiB per node for {ranks_here} rank(s) per node, {ph / GIB:.2f} GiB per rank",
                "compare with `zerodoctor plan` for this setup: the model loaded whole per rank (no zero.Init), "
                "dataloader workers and pinned offload buffers are the usual difference; if the gap keeps "
                "growing, see the host-RAM trend and the job's memory limit",
            )

    def _above_plan(self, side: str, gap: dict[str, Any], message: str, fix: str) -> None:
        """One `guard.{side}-above-prediction` warning per side and phase (every save is compared)."""
        phase = str(gap["phase"])
        if (side, phase) in self._gap_warned:
            return
        self._gap_warned.add((side, phase))
        what = "GPU" if side == "gpu" else "host"
        self.add_finding(
            Finding(
                id=f"guard.{side}-above-prediction",
                severity=Severity.WARNING,
                title=f"{what} memory in the {phase.replace('_', ' ')} is above the plan",
                message=message,
                fixes=(Fix(fix),),
                data=gap,
            )
        )

    # ---- hang watchdog -------------------------------------------------------------------------------------

    def _hang_timeout(self, *, looser: bool = False) -> float:
        if self.optimizer_steps == 0:
            return self.options.hang_first_s
        t = max(self.options.hang_min_s, self.options.hang_factor * self.longest_step_s)
        return t * 3 if looser else t

    def arm_watchdog(self, timeout_s: float) -> None:
        """(Re)arm faulthandler: if this rank does not reach the next boundary in time, every thread's
        Python stack goes to `stacks-rank{R}.txt` (each rank has its own watchdog, so a collective that
        one rank never joins leaves a dump from every rank that waits). Costs a lock and a condition
        signal; no thread is created per step."""
        if not self.options.watchdog or self.closed:
            return
        if self._stacks is None:
            self._stacks = open(self.dir / f"stacks-rank{self.rank}.txt", "a", encoding="utf-8")  # noqa: SIM115
        faulthandler.dump_traceback_later(timeout_s, repeat=False, file=self._stacks, exit=False)


def _above(measured: int, predicted: int) -> bool:
    """Above the plan: more than 10 % and 256 MiB over the prediction (noise and allocator rounding below)."""
    return measured > predicted * 1.10 + 256 * MIB


def _slope(xs: list[float] | list[int], ys: list[int]) -> float:
    n = len(xs)
    mx = sum(xs) / n
    my = sum(ys) / n
    var = sum((x - mx) ** 2 for x in xs)
    if var == 0:
        return 0.0
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var


def _versions() -> dict[str, str]:
    out = {}
    for name in ("torch", "deepspeed", "transformers", "accelerate"):
        mod = sys.modules.get(name)
        v = getattr(mod, "__version__", None) if mod is not None else None
        if v:
            out[name] = str(v)
    return out


_MONITOR: Monitor | None = None


def get_monitor(options: GuardOptions | None = None) -> Monitor:
    """The process's monitor (one per rank), created on first use."""
    global _MONITOR
    if _MONITOR is None or _MONITOR.closed:
        _MONITOR = Monitor(options)
    return _MONITOR
