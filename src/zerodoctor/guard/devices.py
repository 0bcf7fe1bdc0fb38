"""Where tensors really are, against where ZeRO should have put them; and device consistency across ranks.

ZeRO-3 keeps each parameter's shard in `param.ds_tensor` (on CPU when `offload_param.device` is cpu) and
leaves `param.data` empty between gathers; the fp32 master partitions (`fp32_partitioned_groups_flat`, ZeRO-3;
`single_partition_of_fp32_groups`, ZeRO-1/2) and the optimizer states live on CPU when
`offload_optimizer.device` is cpu, on the compute device otherwise. A tensor anywhere else is the
`Expected all tensors to be on the same device ... cuda:0 and cpu` crash waiting to happen.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping
from typing import Any

from zerodoctor.findings import Evidence, Finding, Fix, Severity

MAX_LISTED = 5


def _offload_device(config: Mapping[str, Any] | None, key: str) -> str:
    zero = (config or {}).get("zero_optimization") or {}
    block = zero.get(key) or {}
    dev = str(block.get("device", "none")).lower() if isinstance(block, Mapping) else "none"
    return dev


def _same(actual: Any, expected: str) -> bool:
    """cpu matches cpu; cuda:N matches cuda:N (a bare "cuda" matches any index)."""
    a = str(actual)
    if a == expected:
        return True
    at, _, ai = a.partition(":")
    et, _, ei = expected.partition(":")
    return at == et and (not ai or not ei)


def _unwrap(model_or_engine: Any) -> tuple[Any, Any, Mapping[str, Any] | None, str | None]:
    """(module, optimizer, ds config, compute device) from a DeepSpeed engine or a plain module."""
    engine = model_or_engine
    module = getattr(engine, "module", None)
    if module is not None and hasattr(engine, "zero_optimization_stage"):
        config = getattr(engine, "config", None)
        if not isinstance(config, Mapping):
            config = getattr(engine, "_config", None)
            config = getattr(config, "_param_dict", None)
        return module, getattr(engine, "optimizer", None), config, str(getattr(engine, "device", "")) or None
    return model_or_engine, None, None, None


def _compute_device(module: Any) -> str:
    import torch

    try:
        from deepspeed.accelerator import get_accelerator  # the device DeepSpeed computes on

        return str(torch.device(get_accelerator().current_device_name()))
    except Exception:  # noqa: BLE001 - no DeepSpeed: the module's first floating tensor decides
        for p in module.parameters():
            return str(p.device)
    return "cpu"


def _inner_state_tensors(optimizer: Any) -> Iterator[tuple[str, Any]]:
    import torch

    inner = getattr(optimizer, "optimizer", optimizer)
    state = getattr(inner, "state", None)
    if not isinstance(state, Mapping):
        return
    for i, st in enumerate(state.values()):
        if isinstance(st, Mapping):
            for k, v in st.items():
                if isinstance(v, torch.Tensor) and v.dim() > 0:
                    yield f"optimizer state [{i}].{k}", v


def _fp32_masters(optimizer: Any) -> Iterator[tuple[str, Any]]:
    for attr in ("fp32_partitioned_groups_flat", "single_partition_of_fp32_groups"):
        for i, t in enumerate(getattr(optimizer, attr, None) or []):
            if t is not None and hasattr(t, "device"):
                yield f"fp32 master partition {attr}[{i}]", t


def placement(
    model_or_engine: Any,
    *,
    optimizer: Any = None,
    config: Mapping[str, Any] | None = None,
    device: str | None = None,
) -> list[tuple[str, str, str, str]]:
    """Every tensor ZeRO manages as (what, name, actual device, expected device)."""
    module, eng_opt, eng_cfg, eng_dev = _unwrap(model_or_engine)
    optimizer = optimizer if optimizer is not None else eng_opt
    config = config if config is not None else eng_cfg
    compute = device or eng_dev or _compute_device(module)
    param_dev = "cpu" if _offload_device(config, "offload_param") == "cpu" else compute
    opt_dev = "cpu" if _offload_device(config, "offload_optimizer") == "cpu" else compute
    out: list[tuple[str, str, str, str]] = []
    for name, p in module.named_parameters():
        ds = getattr(p, "ds_tensor", None)
        if ds is not None:
            out.append(("parameter partition (ds_tensor)", name, str(ds.device), param_dev))
            if p.data.numel() > 0:  # gathered right now (or persistent): on the compute device
                out.append(("gathered parameter", name, str(p.device), compute))
        else:
            out.append(("parameter", name, str(p.device), compute))
    for name, b in module.named_buffers():
        out.append(("buffer", name, str(b.device), compute))
    # NVMe offload keeps a CPU buffer for the working partition; only cpu/none are judged strictly.
    if optimizer is not None and _offload_device(config, "offload_optimizer") != "nvme":
        for name, t in _fp32_masters(optimizer):
            out.append(("fp32 master", name, str(t.device), opt_dev))
        for name, t in _inner_state_tensors(optimizer):
            out.append(("optimizer state", name, str(t.device), opt_dev))
    return out


def check_tensors_device(
    model_or_engine: Any,
    *,
    optimizer: Any = None,
    config: Mapping[str, Any] | None = None,
    device: str | None = None,
) -> list[Finding]:
    """Check that parameters (ZeRO-3 partitions included), buffers, fp32 master partitions and optimizer
    states are where the DeepSpeed config says. Pass a DeepSpeed engine (its module, optimizer and config are
    used), or a module with `optimizer=`, `config=` and `device=`. Returns one ERROR finding listing the
    misplaced tensors, or nothing. Costs one pass over the tensors' metadata: no data is read or moved."""
    rows = placement(model_or_engine, optimizer=optimizer, config=config, device=device)
    wrong = [r for r in rows if not _same(r[2], r[3])]
    if not wrong:
        return []
    _module, _o, cfg, _d = _unwrap(model_or_engine)
    cfg = config if config is not None else cfg
    counts = Counter(what for what, *_ in wrong)
    listed = "; ".join(
        f"{what} {name} is on {actual}, expected {exp}" for what, name, actual, exp in wrong[:MAX_LISTED]
    )
    more = f" (and {len(wrong) - MAX_LISTED} more)" if len(wrong) > MAX_LISTED else ""
    offl = (
        f"offload_param.device={_offload_device(cfg, 'offload_param')}, "
        f"offload_optimizer.device={_offload_device(cfg, 'offload_optimizer')}"
    )
    return [
        Finding(
            id="guard.tensor-wrong-device",
            severity=Severity.ERROR,
            title="tensors are not where ZeRO placed them",
            message=(
                f"{len(wrong)} of {len(rows)} tensors are on an unexpected device ({offl}): {listed}{more}. "
                "The next operation that mixes them fails with 'Expected all tensors to be on the same "
                "device'"
            ),
            fixes=(
                Fix(
                    "do not call .to()/.cuda()/.cpu() on the model or its buffers after deepspeed.initialize "
                    "(or after Trainer creation); let DeepSpeed place them"
                ),
                Fix(
                    "create buffers and caches (rotary tables, position embeddings) with the device of the "
                    "input tensor inside forward, not at __init__, under ZeRO-3"
                ),
                Fix(
                    "keep offload_param and offload_optimizer devices consistent with the config the run "
                    "was started with"
                ),
            ),
            evidence=tuple(
                Evidence(key=name, text=f"{what}: {actual} (expected {exp})")
                for what, name, actual, exp in wrong[:MAX_LISTED]
            ),
            references=(
                "OpenBMB/MiniCPM-V#184",
                "huggingface/transformers#32312",
                "deepspeedai/DeepSpeed#5422",
            ),
            data={"counts": dict(counts), "wrong": [list(r) for r in wrong[:50]], "checked": len(rows)},
        )
    ]


def rank_identity(local_rank: int) -> dict[str, Any]:
    """What one rank tells the others at train begin (host, local rank, devices)."""
    import socket

    from zerodoctor.guard.probes import gpu_identity

    return {"host": socket.gethostname(), "local_rank": local_rank, **gpu_identity()}


def gather_identities(local_rank: int) -> list[dict[str, Any]]:
    """One all_gather_object of every rank's identity (train begin only, never on the hot path)."""
    import torch.distributed as dist

    me = rank_identity(local_rank)
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return [{**me, "rank": 0}]
    me["rank"] = dist.get_rank()
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, me)
    return [o for o in out if isinstance(o, dict)]


def judge_identities(ids: list[dict[str, Any]]) -> list[Finding]:
    """Two ranks on one GPU, a rank whose device is not its local rank, or ranks of one node that see
    different CUDA_VISIBLE_DEVICES."""
    findings: list[Finding] = []
    gpu_ids = [i for i in ids if str(i.get("device", "cpu")).startswith("cuda")]
    by_gpu: dict[tuple[str, str], list[int]] = {}
    for i in gpu_ids:
        key = (str(i.get("host")), str(i.get("gpu_uuid") or i.get("device")))
        by_gpu.setdefault(key, []).append(int(i.get("rank", -1)))
    shared = {k: v for k, v in by_gpu.items() if len(v) > 1}
    if shared:
        (host, dev), ranks = next(iter(shared.items()))
        findings.append(
            Finding(
                id="guard.ranks-share-gpu",
                severity=Severity.ERROR,
                title="several ranks use the same GPU",
                message=f"ranks {ranks} on {host} all compute on {dev}; each rank must own one GPU, or they "
                "run out of memory and their collectives deadlock",
                fixes=(
                    Fix(
                        "call torch.cuda.set_device(LOCAL_RANK) (or deepspeed.init_distributed / the launcher) "
                        "before creating tensors, and do not set CUDA_VISIBLE_DEVICES per rank by hand"
                    ),
                ),
                evidence=tuple(Evidence(key=f"rank{r}", text=f"{host} {dev}") for r in ranks),
                data={"identities": ids},
            )
        )
    for i in gpu_ids:
        dev = str(i.get("device"))
        vis = i.get("visible_devices")
        if (
            dev.startswith("cuda:")
            and (vis is None or "," in str(vis))
            and dev != f"cuda:{i.get('local_rank')}"
        ):
            findings.append(
                Finding(
                    id="guard.device-not-local-rank",
                    severity=Severity.WARNING,
                    title="a rank computes on a GPU other than its local rank's",
                    message=f"rank {i.get('rank')} (local rank {i.get('local_rank')}) on {i.get('host')} uses {dev} "
                    f"with CUDA_VISIBLE_DEVICES={vis}",
                    fixes=(Fix("set the device from LOCAL_RANK before building the model"),),
                    data={"identity": i},
                )
            )
            break
    vis_by_host: dict[str, set[str]] = {}
    for i in ids:
        vis_by_host.setdefault(str(i.get("host")), set()).add(str(i.get("visible_devices")))
    for host, vis in vis_by_host.items():
        if len(vis) > 1:
            findings.append(
                Finding(
                    id="guard.visible-devices-differ",
                    severity=Severity.INFO,
                    title="ranks of one node see different CUDA_VISIBLE_DEVICES",
                    message=f"on {host}: {sorted(vis)}; fine when a launcher gives each rank one GPU on purpose",
                    data={"host": host},
                )
            )
    return findings
