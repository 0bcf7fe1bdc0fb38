"""The planner against published measurements of real runs (benchmarks/plan_published.yaml).

Each case is a run someone published with its config: a measured per-GPU peak, a real CUDA OOM, a host-RAM
kill, or a run that trained. For every case this prints the planner's per-GPU peak (load, first optimizer
step, steady step; the save phase is judged only where a case says so) and its verdict at the default
margin, next to the published figure, for the train split and the held-out split separately.

    python benchmarks/plan_published.py            # markdown table + summary (for RESULTS.md, "Issue 9")
    python benchmarks/plan_published.py --json     # one JSON object per case
    python benchmarks/plan_published.py --batch 2 --split train   # one batch of the truth set, one split

The truth set is every `benchmarks/plan_published*.yaml`: `plan_published.yaml` (batch 1) and the later batches
(`plan_published_batch2.yaml`, ..., each case marked `batch: N`), each with its own held-out part.

No GPU is needed: the planner is arithmetic. The held-out split (`split: heldout` in the data file) was
marked before any constant was tuned and is never used to tune.
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from zerodoctor.models import ModelSpec, resolve_model
from zerodoctor.plan.inputs import (
    GIB,
    Cluster,
    FsdpSettings,
    PlanInputs,
    Training,
    ZeroSettings,
    fsdp_as_zero,
)
from zerodoctor.plan.phases import ALLOCATOR_ITEM, DEFAULT_SAFETY_MARGIN, StrategyPlan, plan_strategy

HERE = Path(__file__).resolve().parent
DATA = HERE / "plan_published.yaml"
DATA_GLOB = "plan_published*.yaml"
UNKNOWN_HOST_GIB = 4096
"""Host RAM where a case does not report it: large enough that only the GPU is judged."""

READING_EXCLUDES = {
    "allocated": frozenset({"CUDA context", "NCCL buffers", ALLOCATOR_ITEM}),
    "reserved": frozenset({"CUDA context", "NCCL buffers"}),
    "device": frozenset(),
}
"""What a published GPU figure counts (`reading:` in a case, from its source's own words): `allocated` is
torch.cuda.max_memory_allocated (or the allocator's active bytes), `reserved` is max_memory_reserved (allocated plus
what the caching allocator keeps), `device` is what nvidia-smi or a device-level chart shows (reserved plus the CUDA
context and NCCL's buffers, outside PyTorch). The planner's phase totals are device-level; a figure is compared with
the planner's items that its reading counts. A case whose source does not say which reading it is (no `reading:`) is
compared at device level, the most a reading can count."""


@dataclass(frozen=True)
class Outcome:
    case: dict[str, Any]
    plan: StrategyPlan
    predicted_gpu: int
    predicted_phase: str
    predicted_host: int
    measured_bytes: int | None
    verdict_right: bool
    raw_fits: bool
    host_measured_bytes: int | None = None

    @property
    def reading(self) -> str | None:
        """Which reading the published figure is (READING_EXCLUDES), or None where its source does not say."""
        value = self.case.get("reading")
        return None if value is None else str(value)

    @property
    def predicted_reading(self) -> int:
        """The planner's peak counted as the published figure counts it: its largest phase (the save only where
        the case is a save) without the per-GPU items the reading does not see."""
        excluded = READING_EXCLUDES[self.reading or "device"]
        with_save = self.case.get("phase") == "save"
        return max(
            sum(i.bytes for i in p.gpu if i.name not in excluded)
            for p in self.plan.phases
            if with_save or p.name != "save"
        )

    @property
    def error(self) -> float | None:
        """Against a published GPU peak, like with like (`predicted_reading`); None for a figure at the card's size
        (`card_full`), which bounds the run's need from above (the caching allocator keeps what it cached) and is
        judged only as a verdict."""
        if self.measured_bytes is None or self.case.get("card_full"):
            return None
        return (self.predicted_reading - self.measured_bytes) / self.measured_bytes

    @property
    def host_predicted(self) -> int:
        """Host use per node in the phase a published reading was taken (`host_phase`): steady (default: a
        reading during training), train (the larger of first step and steady: a peak over a training epoch),
        load (a start-of-training spike) or peak (the largest of all four phases, the checkpoint save included:
        a figure given for "training and saving")."""
        which = self.case.get("host_phase", "steady")
        if which == "peak":
            return max(p.host_bytes for p in self.plan.phases)
        if which == "train":
            return max(self.plan.phase("first_step").host_bytes, self.plan.phase("steady").host_bytes)
        return self.plan.phase(which).host_bytes

    @property
    def host_error(self) -> float | None:
        """Against a published host-RAM reading, in the phase it was taken (`host_predicted`)."""
        if self.host_measured_bytes is None:
            return None
        return (self.host_predicted - self.host_measured_bytes) / self.host_measured_bytes


# libyaml's loader where PyYAML was built with it (the pure-Python one takes seconds per file), the same safe subset
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@functools.lru_cache(maxsize=64)
def _parsed(path: str, mtime_ns: int, size: int) -> list[dict[str, Any]]:
    """One file's cases, parsed once per version of the file (its mtime and size in the key)."""
    cases: list[dict[str, Any]] = yaml.load(Path(path).read_text(), Loader=_YAML_LOADER)  # noqa: S506 (a safe loader)
    return cases


def load_cases(path: Path = DATA) -> list[dict[str, Any]]:
    """The cases of one truth-set file: a fresh copy each call, so a caller that edits a case changes no other's."""
    st = path.stat()
    return copy.deepcopy(_parsed(str(path), st.st_mtime_ns, st.st_size))


def data_files() -> list[Path]:
    """Every file of the truth set, batch 1 (`plan_published.yaml`) first."""
    return sorted(HERE.glob(DATA_GLOB), key=lambda p: (p != DATA, p.name))


def load_all_cases(batch: int | None = None, *, unscored: bool = False) -> list[dict[str, Any]]:
    """The cases of every `plan_published*.yaml` (a case without `batch` is batch 1), or of one batch. A case marked
    `unscored` (with its reason: a model whose config cannot be verified offline) is left out unless asked for."""
    cases = [c for path in data_files() for c in load_cases(path)]
    return [
        c
        for c in cases
        if (batch is None or c.get("batch", 1) == batch) and bool(c.get("unscored")) == unscored
    ]


def _model(name: str) -> ModelSpec:
    return resolve_model(name)  # every model of the truth set is in the bundled catalog


def _zero(case: dict[str, Any], spec: ModelSpec) -> ZeroSettings:
    if case.get("fsdp"):  # torch FSDP through accelerate: the planner's FSDP strategy
        return fsdp_as_zero(FsdpSettings(**case["fsdp"]))
    z = dict(case.get("zero") or {"stage": 0})
    h = spec.params.hidden_size
    auto = z.pop("hf_auto_buckets", False)
    if auto:  # HF Trainer fills "auto" from the hidden size (transformers integrations/deepspeed.py)
        z.setdefault("reduce_bucket_size", h * h)
        z.setdefault("prefetch_bucket_size", int(0.9 * h * h))
        z.setdefault("param_persistence_threshold", 10 * h)
    return ZeroSettings(**z)


def _training(case: dict[str, Any]) -> Training:
    t = {k: v for k, v in case["training"].items() if k != "quant"}
    for key in ("lora_targets", "trainable_modules"):
        if isinstance(t.get(key), list):
            t[key] = tuple(t[key])
    if t.get("method") == "qlora":
        t.setdefault("quant_storage", "uint8")
    return Training(**t)


def build(case: dict[str, Any]) -> tuple[PlanInputs, ZeroSettings]:
    spec = _model(case["model"])
    c = case["cluster"]
    cluster = Cluster(
        nodes=c["nodes"],
        gpus_per_node=c["gpus_per_node"],
        gpu_memory_bytes=int(c["gpu_gib"] * GIB),
        host_ram_bytes=int((c.get("host_gib") or UNKNOWN_HOST_GIB) * GIB),
    )
    inputs = PlanInputs(
        model=spec,
        cluster=cluster,
        training=_training(case),
        framework=case.get("framework"),
        zero3_init=bool(case.get("zero3_init", True)),
        # PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True where the published run's own script sets it.
        expandable_segments=bool(case.get("expandable_segments", False)),
        # Library versions only where the source states them (a pinned requirements file, a thread's env dump);
        # otherwise the planner takes current releases.
        deepspeed_version=case.get("deepspeed_version"),
        transformers_version=case.get("transformers_version"),
        accelerate_version=case.get("accelerate_version"),
    )
    return inputs, _zero(case, spec)


def _measured_bytes(case: dict[str, Any], key: str = "measured", unit_key: str = "unit") -> int | None:
    value = case.get(key)
    if value is None:
        return None
    unit = str(case.get(unit_key, ""))
    if unit.startswith("MiB"):
        return int(float(value) * 2**20)
    return int(float(value) * (10**9 if unit.startswith("GB") else GIB))


def evaluate(case: dict[str, Any], margin: float = DEFAULT_SAFETY_MARGIN) -> Outcome:
    inputs, zero = build(case)
    plan = plan_strategy(inputs, zero, margin=margin)
    with_save = case.get("phase") == "save"
    gpu, phase = plan.gpu_peak(include_save=with_save)
    # A host kill report rarely says when the run died: any phase counts, the checkpoint save included.
    host, _ = plan.host_peak(include_save=with_save or case["kind"] == "host_oom")
    gpu_fits = gpu <= plan.gpu_limit()
    host_fits = host <= plan.host_limit()
    kind = case["kind"]
    if kind == "gpu_oom":
        right, raw = not gpu_fits, gpu <= plan.cluster.gpu_memory_bytes
    elif kind == "host_oom":
        right, raw = not host_fits, host <= plan.cluster.host_ram_bytes
    else:  # a run that trained: gpu_peak or fits; its host too where the case names the node's RAM
        measured = _measured_bytes(case)
        if measured is not None and measured > plan.gpu_limit():
            # The run itself used more than (1 - margin) of its card: "tight" (fits without the margin) is the
            # right answer for it, "fits" would need an under-prediction.
            gpu_fits = gpu <= plan.cluster.gpu_memory_bytes
        if case.get("at_edge"):
            # The sources show this very setup at the card's edge (it trained, and the same script ran out of memory
            # on the same card): only "tight" (over the margin, under the card) agrees with both.
            gpu_fits = plan.gpu_limit() < gpu <= plan.cluster.gpu_memory_bytes
        right, raw = gpu_fits and (host_fits or not case["cluster"].get("host_gib")), True
    host_measured = _measured_bytes(case, "host_measured", "host_unit")
    return Outcome(case, plan, gpu, phase, host, _measured_bytes(case), right, raw, host_measured)


def _unit_word(unit: object) -> str:
    text = str(unit or "")
    return "MiB" if text.startswith("MiB") else "GB" if text.startswith("GB") else "GiB"


def _fmt_err(e: float | None) -> str:
    return "" if e is None else f"{e * 100:+.1f} %"


def summary(outcomes: list[Outcome]) -> dict[str, Any]:
    errs = [abs(o.error) for o in outcomes if o.error is not None]
    ooms = [o for o in outcomes if o.case["kind"].endswith("_oom")]
    return {
        "cases": len(outcomes),
        "verdicts_right": sum(o.verdict_right for o in outcomes),
        "gpu_peaks": len(errs),
        "median_abs_error": statistics.median(errs) if errs else None,
        "worst_abs_error": max(errs) if errs else None,
        "within_10pct": sum(e <= 0.10 for e in errs),
        "real_ooms": len(ooms),
        "real_ooms_predicted_raw_fit": sum(o.raw_fits for o in ooms),
        "host_readings": [o.host_error for o in outcomes if o.host_error is not None],
        "host_median_abs_error": (
            statistics.median(abs(e) for e in hosts)
            if (hosts := [o.host_error for o in outcomes if o.host_error is not None])
            else None
        ),
        "host_judged": sum(1 for o in outcomes if o.case["cluster"].get("host_gib")),
    }


def markdown(outcomes: list[Outcome]) -> str:
    lines = []
    for split in ("train", "heldout"):
        part = [o for o in outcomes if o.case["split"] == split]
        s = summary(part)
        med = "n/a" if s["median_abs_error"] is None else f"{s['median_abs_error'] * 100:.1f} %"
        lines.append(
            f"**{split}** ({s['cases']} cases): verdicts right {s['verdicts_right']}/{s['cases']}; "
            f"GPU peaks: median |error| {med}, {s['within_10pct']}/{s['gpu_peaks']} within 10 %; "
            f"real OOMs predicted to fit even without margin: {s['real_ooms_predicted_raw_fit']}/{s['real_ooms']}"
            + (
                f"; host RAM readings: median |error| {s['host_median_abs_error'] * 100:.1f} % over "
                f"{len(s['host_readings'])} ("
                + ", ".join(f"{e * 100:+.1f} %" for e in s["host_readings"])
                + ")"
                if s["host_readings"]
                else ""
            )
            + f"; cases whose host verdict is judged: {s['host_judged']}"
        )
        lines.append("")
        lines.append("| case | kind | published | predicted (phase) | error | verdict |")
        lines.append("|---|---|---|---|---|---|")
        for o in part:
            pub = "OOM" if o.case["kind"].endswith("oom") else "trains"
            if o.measured_bytes is not None:
                pub = f"{o.case['measured']} {_unit_word(o.case['unit'])}"
                if o.case.get("card_full"):
                    pub = f"<= {pub} (full card)"
            pred = f"{o.predicted_gpu / GIB:.1f} GiB ({o.predicted_phase})"
            if o.error is not None and o.reading not in (None, "device"):
                pred += f", {o.predicted_reading / GIB:.1f} GiB {o.reading}"
            if o.case["kind"] == "host_oom":
                pred = f"host {o.predicted_host / GIB:.0f} GiB of {o.case['cluster']['host_gib']}"
            if o.host_error is not None:
                hunit = _unit_word(o.case.get("host_unit"))
                pred += (
                    f"; host {o.host_predicted / GIB:.1f} GiB ({o.case.get('host_phase', 'steady')}) vs "
                    f"{o.case['host_measured']} {hunit} ({_fmt_err(o.host_error)})"
                )
            elif o.case["kind"] != "host_oom" and o.case["cluster"].get("host_gib"):
                pred += f"; host {o.predicted_host / GIB:.0f} GiB of {o.case['cluster']['host_gib']}"
            moved = " (moved from held-out)" if o.case.get("moved_from_heldout") else ""
            if o.case.get("batch", 1) != 1:
                moved += f" (batch {o.case['batch']})"
            lines.append(
                f"| [{o.case['id']}]({o.case['source']}){moved} | {o.case['kind']} | {pub} | {pred} | "
                f"{_fmt_err(o.error)} | {o.plan.status}{'' if o.verdict_right else ' **WRONG**'} |"
            )
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--split", choices=("train", "heldout", "all"), default="all")
    ap.add_argument(
        "--batch", type=int, default=None, help="only the cases of this batch (1: plan_published.yaml)"
    )
    args = ap.parse_args(argv)
    cases = [c for c in load_all_cases(args.batch) if args.split in ("all", c["split"])]
    outcomes = [evaluate(c) for c in cases]
    if args.json:
        for o in outcomes:
            row = {
                "id": o.case["id"],
                "batch": o.case.get("batch", 1),
                "split": o.case["split"],
                "kind": o.case["kind"],
                "predicted_gpu_bytes": o.predicted_gpu,
                "predicted_phase": o.predicted_phase,
                "predicted_host_bytes": o.predicted_host,
                "measured_bytes": o.measured_bytes,
                "reading": o.reading,
                "predicted_reading_bytes": o.predicted_reading,
                "error": o.error,
                "status": o.plan.status,
                "verdict_right": o.verdict_right,
                "host_error": o.host_error,
                "predicted_host_phase_bytes": o.host_predicted,
            }
            sys.stdout.write(json.dumps(row) + "\n")
    else:
        sys.stdout.write(markdown(outcomes) + "\n")
        for c in load_all_cases(args.batch, unscored=True):
            if args.split in ("all", c["split"]):
                sys.stdout.write(f"\nNot scored: {c['id']} ({c['split']}): {c['unscored']}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
