"""DS006 deepspeed.offload-host-memory: CPU offload against the node's host RAM, pinned memory and memlock.

Why it matters: with `offload_optimizer: cpu`, each rank keeps on the host its fp32 master weights (4 B per
trainable parameter), fp32 gradient buffers (4 B), 16-bit gradient partitions (2 B) and, from the first
optimizer step on, the Adam moments (8 B, allocated lazily by DeepSpeedCPUAdam); `offload_param: cpu` adds the
16-bit parameter partitions (2 B). Summed over a node's ranks that is about 18 (20 with parameters) bytes per
trainable parameter divided by the number of nodes (failures.md A3; memory.md §11.2). Yi-34B full fine-tuning
on one 8-GPU node is about 34.4e9 x 20 B = 690 GB before buffers, which is why the seed report needed "1 TB"
and died with `exitcode -9` at iteration accumulative_counts-1 (the first optimizer step). Pinned buffers
(`pin_memory: true`, the default since DeepSpeed PR #8207; false in 0.16.x) cannot be swapped, and PyTorch
rounds each pinned block up to a power of two (pytorch#95823). Whether a low `ulimit -l` breaks pinning
outside WSL is not confirmed (failures.md, pin-memory-failure), so that part is information only.

This is a coarse check from the model size; `zerodoctor plan` gives the full per-phase budget.
Fixes: more nodes (the host share shrinks per node), NVMe offload, `pin_memory: false`, LoRA.
"""

from __future__ import annotations

from collections.abc import Iterator

from zerodoctor.findings import Evidence, Finding, Fix, Severity
from zerodoctor.lint.rule import Rule
from zerodoctor.lint.rules._common import gib, offload_device, truthy
from zerodoctor.setup.model import TrainingSetup

# Host bytes per trainable parameter, summed over all ranks (DeepSpeed source, memory.md §11.2 / §11.3).
HOST_BYTES_OPTIMIZER_OFFLOAD = 18  # fp32 master 4 + fp32 grads 4 + Adam 8 + 16-bit grad partitions 2
HOST_BYTES_PARAM_OFFLOAD = 2  # 16-bit parameter partitions (ZeRO-3 only)
MEMLOCK_SMALL = 64 * 2**20  # below this, pinning more than a few buffers needs a raised limit


def _trainable(setup: TrainingSetup) -> int | None:
    if setup.total_params is None:
        return None
    if setup.method in ("lora", "qlora"):
        return None  # adapters are small; the base model's frozen share is the planner's business
    return setup.total_params


def check(setup: TrainingSetup) -> Iterator[Finding]:
    if setup.ds_written is None:
        return
    opt, param = offload_device(setup, "optimizer"), offload_device(setup, "param")
    if opt != "cpu" and param != "cpu":
        return
    flat = setup.ds_flat()
    pinned = [p for p, d in (("optimizer", opt), ("param", param))
              if d == "cpu" and truthy(flat.get(f"zero_optimization.offload_{p}.pin_memory"))]
    facts = setup.facts()
    memlock = facts.get("env.memlock_bytes")
    if pinned and memlock is not None and memlock != float("inf") and memlock < MEMLOCK_SMALL:
        yield RULE.finding(
            f"Offload pins host memory ({', '.join('offload_' + p for p in pinned)} pin_memory true) and this host's "
            f"locked-memory limit (ulimit -l) is {memlock / 2**20:,.0f} MiB. Pinning of large buffers can fail or be "
            "slow with low limits (reported under WSL and containers; not confirmed as a DeepSpeed issue elsewhere).",
            evidence=[setup.ds_evidence(f"zero_optimization.offload_{pinned[0]}.pin_memory"),
                      Evidence(file=setup.env.source if setup.env else None, key="host.memlock_soft_bytes",
                               text=f"{memlock} bytes")],
            fixes=[Fix("Raise the limit: docker --ulimit memlock=-1, or `ulimit -l unlimited` in the job script"),
                   Fix("Or set pin_memory: false (slower host-device copies)", target="deepspeed",
                       patch={f"zero_optimization.offload_{p}.pin_memory": False for p in pinned})],
            severity=Severity.INFO,
        )
    trainable = _trainable(setup)
    ram = facts.get("env.host_ram_bytes")
    if trainable is None or not ram:
        return
    nodes = setup.num_nodes
    if nodes is None and setup.world_size and facts.get("env.gpu_count"):
        nodes = max(1, setup.world_size // int(facts["env.gpu_count"]))
    if nodes is None:
        return
    per_byte = (HOST_BYTES_OPTIMIZER_OFFLOAD if opt == "cpu" else 0) + \
        (HOST_BYTES_PARAM_OFFLOAD if param == "cpu" and setup.zero_stage == 3 else 0)
    need = trainable * per_byte / nodes
    if need < 0.8 * ram:
        return
    severity = Severity.ERROR if need > ram else Severity.WARNING
    yield RULE.finding(
        f"Offloaded model states need about {gib(need)} of host RAM per node ({trainable / 1e9:,.1f}B trainable "
        f"parameters x {per_byte} B / {nodes} node(s)), from the first optimizer step on, and this node has "
        f"{gib(ram)}. Expect the kernel OOM killer (exitcode -9) at the first optimizer step"
        + (" (pinned buffers make it worse: they cannot swap)." if pinned else "."),
        evidence=[setup.ds_evidence("zero_optimization.offload_optimizer.device"),
                  Evidence(file=setup.env.source if setup.env else None, key="host.ram_total_bytes", text=gib(ram))],
        fixes=[Fix("Spread the job over more nodes (host need per node falls with the node count)"),
               Fix("Offload the optimizer to NVMe instead", target="deepspeed",
                   patch={"zero_optimization.offload_optimizer.device": "nvme"}),
               Fix("Use LoRA, which offloads only the adapters' optimizer state"),
               Fix("Run `zerodoctor plan` for the per-phase host budget")],
        severity=severity,
    )


RULE = Rule(
    code="DS006",
    name="deepspeed.offload-host-memory",
    title="CPU offload vs host RAM, pinned memory and memlock",
    severity=Severity.WARNING,
    references=("deepspeedai/DeepSpeed#2984", "deepspeedai/DeepSpeed#4380", "deepspeedai/DeepSpeed#2977",
                "InternLM/xtuner#589"),
    check=check,
)
