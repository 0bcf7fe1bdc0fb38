"""The planner's per-phase prediction for a live run: the one place the guard asks `zerodoctor.plan`.

It writes what the live run knows (the model's config, the engine's final DeepSpeed config) into the guard
folder and asks the planner through `load_inputs`, which reads those files into the same run description
`check` reads (`zerodoctor.setup.run.describe_run`) and maps it with `inputs_from_run`: the prediction the
guard holds against its measurements is the one `check` would have printed for this run.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

GIB = 1 << 30


def predict_for_run(
    *,
    guard_dir: Path,
    model_config: Mapping[str, Any] | None,
    ds_config: Mapping[str, Any] | None,
    world_size: int,
    gpus_per_node: int,
    gpu_memory_bytes: int | None,
    host_ram_bytes: int,
    seq_len: int | None = None,
    samples: int | None = None,
    method: str | None = None,
) -> dict[str, Any]:
    """{"available": True, "phases": {name: {gpu_bytes, host_bytes_per_node}}, "strategy": ...} or
    {"available": False, "reason": ...}. Never raises: a prediction that cannot be made is a record."""
    if not model_config:
        return {"available": False, "reason": "the model has no config the planner can read"}
    if not ds_config:
        return {"available": False, "reason": "no DeepSpeed config (not a ZeRO run)"}
    try:
        from zerodoctor.guard.checks import write_live_config
        from zerodoctor.plan.inputs import PlanOptions, load_inputs
        from zerodoctor.plan.phases import plan_strategy

        guard_dir.mkdir(parents=True, exist_ok=True)
        cfg_path = guard_dir / "model_config.json"
        cfg_path.write_text(json.dumps(dict(model_config), default=str))
        ds_path = write_live_config(ds_config, guard_dir)
        nodes = max(world_size // max(gpus_per_node, 1), 1)
        opts = PlanOptions(
            model=str(cfg_path),
            deepspeed=str(ds_path),
            nodes=nodes,
            gpus_per_node=min(gpus_per_node, world_size),
            # CPU run: there is no GPU; the planner still needs a size, the GPU side is not compared
            gpu_memory_gib=(gpu_memory_bytes or 80 * GIB) / GIB,
            host_ram_gib=host_ram_bytes / GIB,
            seq_len=seq_len,
            samples=samples,
            method=method,
            framework="deepspeed",
        )
        inputs = load_inputs(opts)
        if inputs.zero is None:
            return {"available": False, "reason": "the planner found no ZeRO settings in the live config"}
        sp = plan_strategy(inputs, inputs.zero)
    except Exception as exc:  # noqa: BLE001 - a prediction is optional data, never a reason to stop
        return {"available": False, "reason": f"{type(exc).__name__}: {exc}"}
    return {
        "available": True,
        "strategy": sp.name,
        "gpu_is_real": gpu_memory_bytes is not None,
        "ranks_per_node": min(max(gpus_per_node, 1), world_size),
        "seq_len": inputs.training.seq_len,
        "seq_len_from": "the run"
        if seq_len is not None
        else "the planner's default (not in the run's arguments)",
        "phases": {
            p.name: {
                "gpu_bytes": p.gpu_bytes if gpu_memory_bytes is not None else None,
                "host_bytes_per_node": p.host_bytes,
                # what the figures are made of (the gap is data for the planner: which item was off)
                "gpu_items": {i.name: i.bytes for i in p.gpu} if gpu_memory_bytes is not None else {},
                "host_items": {i.name: i.bytes for i in p.host},
            }
            for p in sp.phases
        },
        "save_spike": {
            "gpu_bytes": sp.phase("save").gpu_bytes - sp.phase("steady").gpu_bytes,
            "host_bytes_per_node": sp.phase("save").host_bytes - sp.phase("steady").host_bytes,
        },
        "checkpoint": sp.checkpoint.to_dict(),
    }
