"""Accuracy of `zerodoctor.plan.model_states` against the real DeepSpeed engine.

For each world size (one `torchrun` launch each, DeepSpeed's CPU accelerator and gloo), every rank
builds tiny Llama models from configs (random weights), hands each with a ZeRO config to
`deepspeed.initialize`, runs two optimizer steps and measures, by introspecting DeepSpeed's optimizer
objects, the bytes it holds for every model-state component: 16-bit partitions, frozen partitions,
gradient partitions, fp32 master, fp32 gradients (persistent, or at their peak inside the optimizer step),
optimizer states (checked absent before the first step: lazy), IPG buckets, offload staging buffers.
Storages are deduplicated by `data_ptr()` and counted whole (`untyped_storage().nbytes()`), so a
narrow view of a bigger buffer counts the buffer. Which buffers DeepSpeed asked to pin is recorded by
wrapping `get_accelerator().pin_memory` (on CPU pinning itself is a no-op: the flag is checked, the
page-locking and PyTorch's power-of-two rounding are not).

The prediction for the same case comes from `model_state_components` (with the model's trainable
tensor sizes, and again from the counts alone), next to DeepSpeed's own
`estimate_zero{2,3}_model_states_mem_needs` (what `*_all_cold` prints).

Usage:
    python benchmarks/plan_accuracy.py                   # world sizes 1 2 4, all shapes and configs
    python benchmarks/plan_accuracy.py --world-sizes 2 --json out.json
    torchrun ... benchmarks/plan_accuracy.py --worker CASES.json OUT_DIR   (internal)
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT / "src"))

from zerodoctor.plan.model_states import Component, model_state_components  # noqa: E402

# Tiny Llama-style shapes: different hidden sizes, depths, vocabularies (odd ones, so padding shows),
# tied and untied embeddings, GQA and MHA.
SHAPES: dict[str, dict[str, Any]] = {
    "h64-L2-v256": {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 256,
        "tie_word_embeddings": False,
    },
    "h128-L6-v1000-tied": {
        "hidden_size": 128,
        "intermediate_size": 344,
        "num_hidden_layers": 6,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "vocab_size": 1000,
        "tie_word_embeddings": True,
    },
    "h256-L3-v4099": {
        "hidden_size": 256,
        "intermediate_size": 704,
        "num_hidden_layers": 3,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "vocab_size": 4099,
        "tie_word_embeddings": False,
    },
}
COMMON_SHAPE = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "max_position_embeddings": 64}

NOT_PREDICTED = ("grads_in_flight",)
"""Measured and reported (`in_flight` rows), but not a model state: activations-phase gradients."""

REDUCE_BUCKET = 200_000
"""Elements; small so that the buffers are real on a CPU machine but still measurable."""
SUB_GROUP = {"h64-L2-v256": 1_000_000_000, "h128-L6-v1000-tied": 150_000, "h256-L3-v4099": 400_000}
"""ZeRO-3 sub_group_size per shape: the default for one, several sub-groups for the others."""

OFFLOADS = {  # name -> (offload_optimizer, offload_param)
    "none": ("none", "none"),
    "optimizer": ("cpu", "none"),
    "both": ("cpu", "cpu"),
}
LORA_LIKE = ("q_proj", "v_proj")
"""The `frozen` variant trains only these (like LoRA's base/adapter split, without peft)."""


@dataclass(frozen=True)
class Case:
    shape: str
    stage: int
    offload: str
    frozen: bool = False
    gas: int = 1

    @property
    def id(self) -> str:
        return f"z{self.stage}-{self.offload}-{self.shape}{'-frozen' if self.frozen else ''}" + (
            f"-gas{self.gas}" if self.gas > 1 else ""
        )


def default_cases() -> list[Case]:
    cases = []
    for stage, offloads in ((2, ("none", "optimizer")), (3, ("none", "optimizer", "both"))):
        for off in offloads:
            for shape in SHAPES:
                cases.append(Case(shape, stage, off))
            cases.append(Case("h128-L6-v1000-tied", stage, off, frozen=True))
    cases.append(Case("h256-L3-v4099", 2, "optimizer", gas=2))
    return cases


def ds_config(case: Case) -> dict[str, Any]:
    off_opt, off_param = OFFLOADS[case.offload]
    zero: dict[str, Any] = {"stage": case.stage, "reduce_bucket_size": REDUCE_BUCKET}
    if case.stage == 3:
        zero["sub_group_size"] = SUB_GROUP[case.shape]
    if off_opt != "none":
        zero["offload_optimizer"] = {"device": off_opt, "pin_memory": True}
    if off_param != "none":
        zero["offload_param"] = {"device": off_param, "pin_memory": True}
    return {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": case.gas,
        "gradient_clipping": 1.0,
        "bf16": {"enabled": True},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
        "zero_optimization": zero,
    }


# --------------------------------------------------------------------------------------------------
# Worker (one process per rank, under torchrun)
# --------------------------------------------------------------------------------------------------


class _Storages:
    """Unique storages (by data_ptr) per component, with their bytes; the max over snapshots is kept."""

    def __init__(self) -> None:
        self.peak: dict[str, int] = {}
        self.pinned: dict[str, bool] = {}
        self.devices: dict[str, str] = {}
        self.snapshots: dict[str, dict[str, int]] = {}

    def record(self, tag: str, comps: dict[str, list[Any]], pinned_ptrs: set[int]) -> None:
        snap: dict[str, int] = {}
        claimed: set[int] = set()  # a storage counts once, for the first component that names it
        for name, tensors in comps.items():
            seen: dict[int, int] = {}
            devices = set()
            for t in tensors:
                if t is None or not hasattr(t, "untyped_storage"):
                    continue
                st = t.untyped_storage()
                if st.nbytes() == 0 or (st.data_ptr() in claimed and st.data_ptr() not in seen):
                    continue
                seen[st.data_ptr()] = st.nbytes()
                devices.add(str(t.device))
            claimed |= set(seen)
            total = sum(seen.values())
            snap[name] = total
            if total >= self.peak.get(name, 0) and total:
                self.peak[name] = total
                self.pinned[name] = all(p in pinned_ptrs for p in seen)
                self.devices[name] = ",".join(sorted(devices))
            self.peak.setdefault(name, 0)
        self.snapshots[tag] = snap


def _optimizer_state_tensors(opt: Any) -> list[Any]:
    import torch

    out = []
    for state in opt.optimizer.state.values():
        for key, value in state.items():
            if key != "step" and isinstance(value, torch.Tensor):
                out.append(value)
    return out


def _components_stage3(opt: Any, model: Any) -> dict[str, list[Any]]:
    fp16 = [t for t in opt.fp16_partitioned_groups_flat if t is not None]
    fp16_ptrs = {t.untyped_storage().data_ptr() for t in fp16}
    fp32 = [t for t in opt.fp32_partitioned_groups_flat if t.untyped_storage().data_ptr() not in fp16_ptrs]
    buckets = []
    for bucket in getattr(opt, "ipg_buckets", {}).values():
        buf = getattr(bucket, "buffer", None)
        buckets.extend(buf if isinstance(buf, list) else [buf])
    return {
        "ipg_bucket": buckets,
        "param16": fp16,
        "frozen16": [p.ds_tensor for p in model.parameters() if not p.requires_grad],
        "grad16": [getattr(opt, "grad_partitions_flat_buffer", None)],
        "fp32_master": fp32,
        "fp32_grad": [t.grad for t in opt.fp32_partitioned_groups_flat],
        "optimizer_states": _optimizer_state_tensors(opt),
    }


def _components_stage12(opt: Any, model: Any) -> dict[str, list[Any]]:
    buckets = []
    for bucket in getattr(opt, "ipg_buckets", {}).values():
        buf = getattr(bucket, "buffer", None)
        buckets.extend(buf if isinstance(buf, list) else [buf])
    # grads_in_partition is dropped from the optimizer after backward (_release_ipg_buffers, snapshotted
    # just before) but lives on in averaged_gradients views until the step.
    grad16 = [getattr(opt, "grads_in_partition", None)]
    grad16 += list(getattr(opt, "accumulated_grads_in_cpu", {}).values())
    for avg in getattr(opt, "averaged_gradients", {}).values():
        if isinstance(avg, list):
            grad16.extend(avg)
    # Any other param.grad storage: gradients autograd produced that DeepSpeed has not yet copied into
    # a bucket or partition (a parameter larger than reduce_bucket_size keeps its own until the step).
    in_flight = []
    for group in opt.bit16_groups:
        for p in group:
            in_flight += [getattr(p, "grad", None), getattr(p, "grad_accum", None)]
    return {
        "ipg_bucket": buckets,
        "param16": list(opt.bit16_groups_flat),
        "frozen16": [p.data for p in model.parameters() if not p.requires_grad],
        "grad16": grad16,
        "grads_in_flight": in_flight,
        "fp32_master": list(opt.single_partition_of_fp32_groups),
        "fp32_grad": [t.grad for t in opt.single_partition_of_fp32_groups],
        "optimizer_states": _optimizer_state_tensors(opt),
        "param16_staging": list(getattr(opt, "param_buffer_of_bit16_for_cpu_offload_groups", [])),
        "grad_staging@gpu": [getattr(opt, "temp_grad_buffer_for_gpu_offload", None)],
        "grad_staging@host": [getattr(opt, "temp_grad_buffer_for_cpu_offload", None)],
    }


def _run_case(case: Case, pinned_ptrs: set[int]) -> dict[str, Any]:
    import deepspeed
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    t0 = time.time()
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**COMMON_SHAPE, **SHAPES[case.shape]))
    if case.frozen:
        for name, p in model.named_parameters():
            p.requires_grad_(any(f".{t}." in name for t in LORA_LIKE))
    trainable_params = [p for p in model.parameters() if p.requires_grad]
    numels = [p.numel() for p in trainable_params]
    frozen = sum(p.numel() for p in model.parameters() if not p.requires_grad)
    total = sum(dict((p.data_ptr(), p.numel()) for p in model.parameters()).values())
    largest_layer = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())
    pinned_ptrs.clear()
    engine, opt, _, _ = deepspeed.initialize(
        model=model, model_parameters=trainable_params, config=ds_config(case)
    )
    comps = _components_stage3 if case.stage == 3 else _components_stage12
    store = _Storages()
    store.record("init", comps(opt, engine.module), pinned_ptrs)

    def wrap(obj: Any, method: str, tag: str, before: bool = False) -> None:
        orig = getattr(obj, method)

        def wrapper(*a: Any, **k: Any) -> Any:
            if before:
                store.record(tag, comps(opt, engine.module), pinned_ptrs)
            out = orig(*a, **k)
            if not before:
                store.record(tag, comps(opt, engine.module), pinned_ptrs)
            return out

        setattr(obj, method, wrapper)

    wrap(opt, "_optimizer_step", "in_step", before=True)
    if case.stage != 3:
        wrap(opt, "setup_buckets", "buckets")
        wrap(opt, "_release_ipg_buffers", "release_ipg", before=True)
    gen = torch.Generator().manual_seed(int(os.environ.get("RANK", "0")))
    vocab = SHAPES[case.shape]["vocab_size"]
    states_before_first_step = None
    for micro in range(2 * case.gas):
        ids = torch.randint(0, vocab, (1, 16), generator=gen).to(engine.device)
        loss = engine(input_ids=ids, labels=ids).loss
        engine.backward(loss)
        store.record(f"backward{micro}", comps(opt, engine.module), pinned_ptrs)
        if micro == case.gas - 1:
            states_before_first_step = store.snapshots[f"backward{micro}"]["optimizer_states"]
        engine.step()
        store.record(f"after_step{micro}", comps(opt, engine.module), pinned_ptrs)
    final = store.snapshots[f"after_step{2 * case.gas - 1}"]
    result = {
        "case": case.id,
        "shape": case.shape,
        "stage": case.stage,
        "offload": case.offload,
        "frozen_variant": case.frozen,
        "gas": case.gas,
        "world_size": int(os.environ.get("WORLD_SIZE", "1")),
        "rank": int(os.environ.get("RANK", "0")),
        "optimizer": type(opt).__name__,
        "inner_optimizer": type(opt.optimizer).__name__,
        "param_dtype": str(trainable_params[0].dtype) if case.stage != 3 else str(opt.dtype),
        "trainable_numels": numels,
        "frozen": frozen,
        "total_params": total,
        "largest_layer_params": largest_layer,
        "measured": store.peak,
        "pinned": store.pinned,
        "devices": store.devices,
        "optimizer_states_before_first_step": states_before_first_step,
        "fp32_grad_after_step": final.get("fp32_grad", 0),
        "seconds": round(time.time() - t0, 2),
    }
    engine.destroy()
    engine = opt = model = None  # free this case's tensors before the next one
    gc.collect()
    return result


def worker(cases_path: Path, out_dir: Path) -> int:
    import deepspeed
    from deepspeed.accelerator import get_accelerator

    rank = int(os.environ.get("RANK", "0"))
    deepspeed.init_distributed()
    acc = get_accelerator()
    pinned_ptrs: set[int] = set()
    orig_pin = acc.pin_memory

    keep: list[Any] = []  # hold pinned storages so a freed address cannot be reused and misread as pinned

    def pin_memory(tensor: Any, *a: Any, **k: Any) -> Any:
        out = orig_pin(tensor, *a, **k)
        if not pinned_ptrs:
            keep.clear()  # _run_case cleared the set: a new case
        pinned_ptrs.add(out.untyped_storage().data_ptr())
        keep.append(out.untyped_storage())
        return out

    acc.pin_memory = pin_memory
    results = []
    for raw in json.loads(cases_path.read_text()):
        case = Case(**raw)
        try:
            results.append(_run_case(case, pinned_ptrs))
        except Exception as exc:  # report and go on: one broken case must not hide the others
            import traceback

            results.append(
                {"case": case.id, "error": f"{type(exc).__name__}: {exc}", "tb": traceback.format_exc()}
            )
    out_dir.mkdir(parents=True, exist_ok=True)
    versions = {"deepspeed": deepspeed.__version__}
    (out_dir / f"rank{rank}.json").write_text(json.dumps({"versions": versions, "results": results}))
    return 0


# --------------------------------------------------------------------------------------------------
# Launcher and comparison
# --------------------------------------------------------------------------------------------------


def launch(world_size: int, cases: Sequence[Case], *, timeout_s: int = 900) -> list[dict[str, Any]]:
    """Run `cases` on `world_size` ranks in one torchrun launch; returns every rank's results."""
    work = Path(tempfile.mkdtemp(prefix=f"zd-plan-acc-ws{world_size}-"))
    cases_path = work / "cases.json"
    cases_path.write_text(json.dumps([c.__dict__ for c in cases]))
    out = work / "out"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "DS_ACCELERATOR": "cpu"}
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        str(world_size),
        "--master_port",
        str(port),
        str(HERE),
        "--worker",
        str(cases_path),
        str(out),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env, cwd=work)
    files = sorted(out.glob("rank*.json")) if out.exists() else []
    if proc.returncode != 0 or len(files) != world_size:
        raise RuntimeError(
            f"torchrun ws={world_size} failed (rc {proc.returncode}):\n{proc.stdout[-3000:]}{proc.stderr[-5000:]}"
        )
    ranks = [json.loads(p.read_text()) for p in files]
    shutil.rmtree(work, ignore_errors=True)
    results = []
    for r in ranks:
        for res in r["results"]:
            res["deepspeed_version"] = r["versions"]["deepspeed"]
            results.append(res)
    return results


def _key(components: Iterable[Component]) -> dict[str, Component]:
    comps = list(components)
    names = [c.name for c in comps]
    return {(c.name if names.count(c.name) == 1 else f"{c.name}@{c.device}"): c for c in comps}


def predict(res: dict[str, Any], *, with_layout: bool) -> dict[str, Component]:
    off_opt, off_param = OFFLOADS[res["offload"]]
    numels = res["trainable_numels"]
    comps = model_state_components(
        trainable=sum(numels),
        frozen=res["frozen"],
        stage=res["stage"],
        world_size=res["world_size"],
        offload_optimizer=off_opt,
        offload_param=off_param if res["stage"] == 3 else "none",
        param_bytes=2,
        sub_group_size=SUB_GROUP[res["shape"]] if res["stage"] == 3 else 1_000_000_000,
        reduce_bucket_size=REDUCE_BUCKET,
        gradient_accumulation_steps=res["gas"],
        deepspeed_version=res["deepspeed_version"],
        param_numels=numels if with_layout else None,
        largest_param_numel=max(numels),
    )
    # The flatten copy at the step is a transient the engine frees before we can see it; not measured.
    return {k: c for k, c in _key(comps).items() if not k.startswith("grad_flat_copy")}


def compare(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (case, world size, component): predicted vs measured (max over ranks)."""
    by_case: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for res in results:
        if "error" in res:
            raise RuntimeError(f"{res['case']}: {res['error']}\n{res.get('tb', '')}")
        by_case.setdefault((res["case"], res["world_size"]), []).append(res)
    rows = []
    for (case_id, ws), ranks in sorted(by_case.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        first = ranks[0]
        pred = predict(first, with_layout=True)
        pred_counts = predict(first, with_layout=False)
        names = sorted(
            set(pred) | {k for r in ranks for k, v in r["measured"].items() if v} - set(NOT_PREDICTED)
        )
        for name in names:
            measured = max(r["measured"].get(name, 0) for r in ranks)
            pinned = [r["pinned"].get(name) for r in ranks if r["measured"].get(name)]
            p = pred.get(name)
            pc = pred_counts.get(name)
            predicted = p.bytes if p else 0
            rows.append(
                {
                    "case": case_id,
                    "world_size": ws,
                    "stage": first["stage"],
                    "offload": first["offload"],
                    "component": name,
                    "measured": measured,
                    "predicted": predicted,
                    "error": _err(predicted, measured),
                    "predicted_counts_only": pc.bytes if pc else 0,
                    "error_counts_only": _err(pc.bytes if pc else 0, measured),
                    "device": p.device if p else "?",
                    "pinned_predicted": bool(p and p.pinned),
                    "pinned_requested": bool(pinned) and all(pinned),
                    "lazy_predicted": bool(p and p.lazy),
                    "lazy_measured": name == "optimizer_states"
                    and all(r["optimizer_states_before_first_step"] == 0 for r in ranks),
                    "transient_predicted": bool(p and p.transient),
                    "transient_measured": name == "fp32_grad"
                    and all(r["fp32_grad_after_step"] == 0 for r in ranks),
                }
            )
    return rows


def _err(predicted: int, measured: int) -> float:
    if measured == 0:
        return 0.0 if predicted == 0 else float("inf")
    return (predicted - measured) / measured


def deepspeed_estimates(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """DeepSpeed's estimator (the numbers `*_all_cold` prints) vs the measured per-rank totals."""
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    rows = []
    seen = set()
    comp_rows = compare(results)
    for res in results:
        key = (res["case"], res["world_size"])
        if key in seen or res["rank"] != 0:
            continue
        seen.add(key)
        ws, total, off = res["world_size"], res["total_params"], OFFLOADS[res["offload"]]
        if res["stage"] == 3:
            host, gpu, _ = estimate_zero3_model_states_mem_needs(
                total,
                res["largest_layer_params"],
                ws,
                1,
                cpu_offload=off[0] != "none",
                cpu_offload_params=off[1] != "none",
                zero_init=True,
            )
        else:
            host, gpu = estimate_zero2_model_states_mem_needs(total, ws, 1, cpu_offload=off[0] != "none")
        mine = [r for r in comp_rows if (r["case"], r["world_size"]) == key]
        m_gpu = sum(r["measured"] for r in mine if r["device"] == "gpu")
        m_host = sum(r["measured"] for r in mine if r["device"] == "host")
        rows.append(
            {
                "case": res["case"],
                "world_size": ws,
                "measured_gpu": m_gpu,
                "measured_host": m_host,
                "ds_gpu": gpu,
                "ds_host_per_rank": host / ws,
                "ds_gpu_error": _err(gpu, m_gpu),
                "ds_host_error": _err(int(host / ws), m_host),
            }
        )
    return rows


def markdown(rows: list[dict[str, Any]], ds_rows: list[dict[str, Any]]) -> str:
    out = []
    comps = sorted({r["component"] for r in rows})
    out.append(
        "| component | cases | worst error (with layout) | worst error (counts only) | pin flag agrees | lazy/transient agree |"
    )
    out.append("|---|---|---|---|---|---|")
    for c in comps:
        rs = [r for r in rows if r["component"] == c]
        worst = max(rs, key=lambda r: abs(r["error"]))
        worst_c = max(rs, key=lambda r: abs(r["error_counts_only"]))
        pin_ok = sum(r["pinned_predicted"] == r["pinned_requested"] for r in rs)
        lt = "-"
        if c == "optimizer_states":
            lt = f"lazy {sum(r['lazy_measured'] for r in rs)}/{len(rs)}"
        elif c == "fp32_grad":
            lt = f"transient {sum(r['transient_predicted'] == r['transient_measured'] for r in rs)}/{len(rs)}"
        out.append(
            f"| {c} | {len(rs)} | {worst['error']:+.3%} ({worst['case']}, ws{worst['world_size']}) "
            f"| {worst_c['error_counts_only']:+.2%} ({worst_c['case']}, ws{worst_c['world_size']}) "
            f"| {pin_ok}/{len(rs)} | {lt} |"
        )
    out.append("")
    out.append("DeepSpeed's estimator on the same cases (per rank; host = its per-node figure / ranks):")
    out.append("")
    out.append("| stage/offload | cases | GPU error min..max | host error min..max |")
    out.append("|---|---|---|---|")
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in ds_rows:
        groups.setdefault(r["case"].split("-h")[0], []).append(r)
    for g, rs in sorted(groups.items()):
        ge = [r["ds_gpu_error"] for r in rs]
        he = [r["ds_host_error"] for r in rs if r["measured_host"]]
        host = f"{min(he):+.0%} .. {max(he):+.0%}" if he else "n/a (nothing measured on host)"
        out.append(f"| {g} | {len(rs)} | {min(ge):+.0%} .. {max(ge):+.0%} | {host} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--worker", nargs=2, type=Path, metavar=("CASES", "OUT"), help=argparse.SUPPRESS)
    p.add_argument("--world-sizes", nargs="+", type=int, default=[1, 2, 4])
    p.add_argument("--json", type=Path, help="write all rows here")
    a = p.parse_args(argv)
    if a.worker:
        return worker(*a.worker)
    t0 = time.time()
    results: list[dict[str, Any]] = []
    timings = {}
    for ws in a.world_sizes:
        t = time.time()
        results += launch(ws, default_cases())
        timings[ws] = round(time.time() - t, 1)
    rows = compare(results)
    ds_rows = deepspeed_estimates(results)
    print(
        f"{'case':42} {'ws':>2} {'component':18} {'measured':>10} {'predicted':>10} {'error':>8}  pin(pred/req)"
    )
    for r in rows:
        print(
            f"{r['case']:42} {r['world_size']:>2} {r['component']:18} {r['measured']:>10} {r['predicted']:>10} "
            f"{r['error']:>+8.3%}  {int(r['pinned_predicted'])}/{int(r['pinned_requested'])}"
        )
    print()
    print(
        f"{'case':42} {'ws':>2} {'meas gpu':>10} {'DS gpu':>10} {'err':>8} {'meas host':>10} {'DS host/rank':>12} {'err':>8}"
    )
    for r in ds_rows:
        print(
            f"{r['case']:42} {r['world_size']:>2} {r['measured_gpu']:>10} {r['ds_gpu']:>10} {r['ds_gpu_error']:>+8.0%} "
            f"{r['measured_host']:>10} {int(r['ds_host_per_rank']):>12} {r['ds_host_error']:>+8.0%}"
        )
    print()
    print(markdown(rows, ds_rows))
    flight = [r for r in results if r.get("measured", {}).get("grads_in_flight")]
    if flight:
        worst = max(
            flight, key=lambda r: r["measured"]["grads_in_flight"] / max(r["largest_layer_params"], 1)
        )
        print(
            f"\nZeRO-1/2 gradients in flight (not a model state, not predicted): seen in {len(flight)} rank-cases; "
            f"largest {worst['measured']['grads_in_flight']} B in {worst['case']} ws{worst['world_size']} "
            f"(its largest tensor is {max(worst['trainable_numels'])} elements)"
        )
    print(f"\nlaunch seconds per world size: {timings}; total {time.time() - t0:.0f} s")
    if a.json:
        a.json.write_text(
            json.dumps({"rows": rows, "deepspeed": ds_rows, "timings": timings, "raw": results}, indent=1)
        )
    worst = max(abs(r["error"]) for r in rows)
    return 0 if worst <= 0.01 else 1


if __name__ == "__main__":
    code = main()
    if "--worker" in sys.argv:  # a torchrun rank: see zerodoctor.engine.tiny_job.exit_without_teardown
        from zerodoctor.engine.tiny_job import exit_without_teardown

        exit_without_teardown(code)
    sys.exit(code)
