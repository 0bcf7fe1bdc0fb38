"""The caching-allocator simulation (`zerodoctor.plan.allocator`) against the H100 readings, and its event
sequence against a real forward/backward recorded on the CPU.

Table (default): for each case of `benchmarks/gpu/plan_gpu_h100.json` (recorded by `benchmarks/plan_gpu.py`:
one rank, peaks reset and the cache emptied at each phase boundary, or kept where the file was recorded with
`--keep-cache`; `--results` names another file), the allocation sequence of that run is
derived from the planner's own quantities (`allocator.step_shape` + `allocator.training_events`: the same
model, ZeRO stage, offload, micro-batch and sequence length, DeepSpeed's FusedAdam as the run used, 3 steps,
the same phase marks) and replayed through the simulated allocator. Nothing is fitted to the readings. Printed
per phase: measured `max_memory_allocated`, `max_memory_reserved` and their gap, the simulated ones, the error
of the simulated gap; then, not measured, what the simulation says remains of the gap when the device is full
(the allocator releases its whole cached segments and retries before it raises an OOM: `PhaseStats.floor_gap`),
with the default allocator and with `expandable_segments:True`.

    python benchmarks/plan_allocator.py                      # the table (any machine, ~2 s)
    python benchmarks/plan_allocator.py --record             # + the CPU recording check (minutes)
    python benchmarks/plan_allocator.py --record --min-kib 128   # ... comparing storages down to 128 KiB

`--record` builds a 2-layer Qwen2.5-1.5B (real widths, random bf16 weights, sdpa, gradient checkpointing) with
transformers on the CPU, runs one forward/backward of 1 x 64 tokens under `torch.profiler` with
`profile_memory=True`, takes the storages of 1 MiB or more created and destroyed (`torch.profiler._memory_profiler`)
and compares their order and sizes with the simulated sequence of the same shape (stage 0: plain PyTorch, so
parameter gradients stay allocated instead of being freed by a DeepSpeed hook).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parent))

import plan_gpu  # noqa: E402  (benchmarks/plan_gpu.py: the cases and their configs)

from zerodoctor.plan.allocator import (  # noqa: E402
    Alloc,
    AllocatorConfig,
    Free,
    StepShape,
    least_capacity,
    replay,
    step_shape,
    training_events,
)
from zerodoctor.plan.inputs import PlanInputs, PlanOptions, load_inputs  # noqa: E402
from zerodoctor.plan.phases import ALLOCATOR_SLACK_BYTES  # noqa: E402

GIB = 1 << 30
MIB = 1 << 20
RESULTS = HERE.parent / "gpu" / "plan_gpu_h100.json"


def case_inputs(r: dict[str, Any]) -> PlanInputs:
    """The planner's inputs for one recorded case (the case's model config and DeepSpeed config)."""
    case = plan_gpu.Case(**r["case"])
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "config.json"
        cfg.write_text(json.dumps(plan_gpu.model_config(case.model)))
        ds = Path(tmp) / "ds.json"
        ds.write_text(json.dumps(plan_gpu.ds_config(case)))
        return load_inputs(
            PlanOptions(
                model=str(cfg),
                deepspeed=str(ds),
                nodes=1,
                gpus_per_node=1,
                gpu_memory_gib=r["gpu_total"] / GIB,
                host_ram_gib=r["host_total"] / GIB,
                seq_len=case.seq_len,
                gradient_checkpointing=case.checkpointing,
                attn="sdpa",
                method=case.method,
                framework="deepspeed",
            )
        )


def table(path: Path) -> int:
    results = json.loads(path.read_text())
    print(
        "GiB. gap = reserved - allocated peak of the phase (what an OOM message calls reserved but unallocated)."
    )
    print(f"The planner charges a fixed {ALLOCATOR_SLACK_BYTES / GIB:.1f} GiB for it today.\n")
    print(
        "| case | phase | allocated | reserved | gap | sim allocated | sim reserved | sim gap | gap error "
        "| sim gap at a full device | sim gap, expandable |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    errors: list[float] = []
    fixed_errors: list[float] = []
    edge: list[str] = []
    for r in results:
        if "error" in r:
            continue
        case = plan_gpu.Case(**r["case"])
        inputs = case_inputs(r)
        assert inputs.zero is not None
        # the run used DeepSpeed's own optimizer (the config's AdamW -> FusedAdam), not torch.optim.AdamW
        shape = step_shape(inputs, inputs.zero, inputs.training, torch_adamw=False)
        t0 = time.perf_counter()
        # a run recorded with `plan_gpu.py --keep-cache` kept the cache between phases: so does its replay
        events = training_events(shape, steps=case.steps, keep_cache=bool(r.get("keep_cache")))
        sim = replay(events)
        took = time.perf_counter() - t0
        exp = replay(events, AllocatorConfig(expandable_segments=True))
        meas = dict(r["phases"])
        # the planner's `steady` is any forward/backward after the first step: the max of both readings
        for phase in ("load", "first_step", "steady", "save"):
            m = meas[phase]
            if phase == "steady":
                ffb = meas["first_forward_backward"]
                m = {k: max(m[k], ffb[k]) for k in ("allocated", "reserved")}
                sims = [sim.phase("steady"), sim.phase("first_forward_backward")]
                s_alloc = max(p.allocated_peak for p in sims)
                s_res = max(p.reserved_peak for p in sims)
                f_gap = max(p.floor_gap for p in sims)
                e_gap = max(exp.phase("steady").floor_gap, exp.phase("first_forward_backward").floor_gap)
            else:
                s_alloc, s_res = sim.phase(phase).allocated_peak, sim.phase(phase).reserved_peak
                f_gap = sim.phase(phase).floor_gap
                e_gap = exp.phase(phase).floor_gap
            gap = m["reserved"] - m["allocated"]
            s_gap = s_res - s_alloc
            errors.append(abs(s_gap - gap))
            fixed_errors.append(abs(ALLOCATOR_SLACK_BYTES - gap))
            print(
                f"| {case.name} | {phase} | {m['allocated'] / GIB:.2f} | {m['reserved'] / GIB:.2f} | {gap / GIB:.2f} "
                f"| {s_alloc / GIB:.2f} | {s_res / GIB:.2f} | {s_gap / GIB:.2f} | {(s_gap - gap) / GIB:+.2f} "
                f"| {f_gap / GIB:.2f} | {e_gap / GIB:.2f} |"
            )
        print(f"<!-- {case.name}: {len(events)} events replayed in {took * 1000:.0f} ms -->")
        least = least_capacity(events)
        floor = max(p.floor_peak for p in sim.phases)
        edge.append(
            f"| {case.name} | {sim.allocated_peak / GIB:.2f} | {least / GIB:.2f} | {floor / GIB:.2f} "
            f"| {sim.reserved_peak / GIB:.2f} |"
        )
    print("\nThe whole simulated run at a full device: the least capacity at which it replays without an OOM")
    print(
        "(bisection, release-and-retry rules), the floor estimate the planner gets, the reserved peak with room.\n"
    )
    print("| case | allocated peak | least capacity | floor estimate | reserved peak |")
    print("|---|---:|---:|---:|---:|")
    print("\n".join(edge))
    print(
        f"\nmedian |gap error| over {len(errors)} phase readings: simulated {statistics.median(errors) / GIB:.2f} GiB, "
        f"fixed {ALLOCATOR_SLACK_BYTES / GIB:.1f} GiB slack {statistics.median(fixed_errors) / GIB:.2f} GiB; "
        f"max {max(errors) / GIB:.2f} vs {max(fixed_errors) / GIB:.2f} GiB"
    )
    return 0


# ---- the CPU recording check ---------------------------------------------------------------------------------


def _recorded(layers: int, tokens: int, min_bytes: int) -> tuple[list[tuple[str, int, int]], dict[str, Any]]:
    """(CREATE|DESTROY, storage id, bytes) of storages >= min_bytes in one forward/backward on the CPU."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    from torch.profiler._memory_profiler import Action, MemoryProfile
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = plan_gpu.model_config("qwen2.5-1.5b")
    cfg["num_hidden_layers"] = layers
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(
        AutoConfig.for_model(**cfg), dtype=torch.bfloat16, attn_implementation="sdpa"
    )
    model.gradient_checkpointing_enable()
    model.config.use_cache = False
    model.train()
    ids = torch.randint(0, cfg["vocab_size"], (1, tokens))
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True) as prof:
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
    timeline = MemoryProfile(prof.profiler.kineto_results).timeline
    out = []
    for _, action, (key, _), size in timeline:
        if size >= min_bytes and action in (Action.CREATE, Action.DESTROY):
            out.append((action.name, int(getattr(key, "id", -1)), int(size)))
    return out, cfg


def record_check(min_bytes: int = MIB) -> int:
    layers, tokens = 2, 64
    t0 = time.perf_counter()
    real, cfg = _recorded(layers, tokens, min_bytes)
    took = time.perf_counter() - t0
    # the same shape, simulated (stage 0: no DeepSpeed)
    opts = PlanOptions(
        model="qwen2.5-1.5b", nodes=1, gpus_per_node=1, gpu_memory_gib=80, host_ram_gib=128,
        seq_len=tokens, micro_batch=1, gradient_checkpointing=True, attn="sdpa", framework="hf",
    )  # fmt: skip
    inputs = load_inputs(opts)
    from zerodoctor.plan.inputs import ZeroSettings

    base = step_shape(inputs, ZeroSettings(stage=0), inputs.training, torch_adamw=False)
    shape = StepShape(**{**base.__dict__, "layers": layers, "load": (), "full_grads": False})
    events = training_events(shape, steps=1)
    # one forward/backward: the events between the load mark and the first_forward_backward mark
    sizes: dict[int | str, int] = {}
    sim: list[tuple[str, int]] = []
    started = False
    for ev in events:
        if not started:
            started = getattr(ev, "name", "") == "load"
            continue
        if isinstance(ev, Alloc):
            sizes[ev.id] = ev.nbytes
            if ev.nbytes >= min_bytes:
                sim.append(("CREATE", ev.nbytes))
        elif isinstance(ev, Free):
            if sizes.get(ev.id, 0) >= min_bytes:
                sim.append(("DESTROY", sizes[ev.id]))
        else:
            break
    kv = cfg["num_key_value_heads"] * cfg["hidden_size"] // cfg["num_attention_heads"]
    params = {
        int(n * 2)
        for n in (
            cfg["vocab_size"] * cfg["hidden_size"],
            cfg["hidden_size"] * cfg["intermediate_size"],
            cfg["hidden_size"] * cfg["hidden_size"],
            cfg["hidden_size"] * kv,
        )
    }
    # plain PyTorch keeps each parameter's gradient (AccumulateGrad): leave out storages of a parameter's size
    real_seq = [(a, s) for a, _, s in real if s not in params]
    print(
        f"recorded {len(real)} storage events >= {min_bytes / 1024:.0f} KiB in {took:.0f} s "
        f"({layers} layers, {tokens} tokens)"
    )
    print(f"compared: {len(real_seq)} recorded (parameter-sized gradients left out), {len(sim)} simulated")
    same = sum(1 for x, y in zip(real_seq, sim, strict=False) if x == y)
    print(f"identical positions: {same} of {max(len(real_seq), len(sim))}")
    from collections import Counter

    rc, sc = Counter(real_seq), Counter(sim)
    for key in sorted(set(rc) | set(sc), key=lambda k: (k[1], k[0])):
        if rc[key] != sc[key]:
            print(f"  {key[0]:8s} {key[1] / MIB:8.2f} MiB: recorded {rc[key]}, simulated {sc[key]}")
    width = max(len(real_seq), len(sim))
    print("\nfirst differences (recorded | simulated), MiB:")
    shown = 0
    for i in range(width):
        x = real_seq[i] if i < len(real_seq) else ("", 0)
        y = sim[i] if i < len(sim) else ("", 0)
        if x != y and shown < 12:
            print(f"  {i:4d}: {x[0]:8s} {x[1] / MIB:8.2f} | {y[0]:8s} {y[1] / MIB:8.2f}")
            shown += 1
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--results", type=Path, default=RESULTS, help="recorded plan_gpu.py measurements")
    ap.add_argument("--record", action="store_true", help="also run the CPU recording check (minutes)")
    ap.add_argument("--min-kib", type=int, default=1024, help="smallest storage the recording check compares")
    args = ap.parse_args(argv)
    rc = table(args.results)
    if args.record:
        print()
        rc = rc or record_check(args.min_kib * 1024)
    return rc


if __name__ == "__main__":
    sys.exit(main())
