"""DS006 deepspeed.offload-host-memory: CPU offload against the node's host RAM, pinned memory and memlock.

Why it matters: with `offload_optimizer: cpu`, each rank keeps on the host its fp32 master weights (4 B per
trainable parameter), fp32 gradient buffers (4 B), 16-bit gradient partitions (2 B) and, from the first
optimizer step on, the Adam moments (8 B, allocated lazily by DeepSpeedCPUAdam); `offload_param: cpu` adds the
16-bit parameter partitions (2 B). Summed over a node's ranks that is about 18 (20 with parameters) bytes per
trainable parameter divided by the number of nodes (docs/memory-model.md, per node: offloaded model states; measured on DeepSpeed 0.19.8 by benchmarks/plan_accuracy.py). Yi-34B full fine-tuning
on one 8-GPU node is about 34.4e9 x 20 B = 690 GB before buffers, which is why Yi-34B reports on one node ask for "1 TB" (InternLM/xtuner#589)
and died with `exitcode -9` at iteration accumulative_counts-1 (the first optimizer step). Pinned buffers
(`pin_memory: true`, the default since DeepSpeed PR #8207; false in 0.16.x) cannot be swapped, and PyTorch
rounds each pinned block up to a power of two (pytorch#95823). Whether a low `ulimit -l` breaks pinning
outside WSL is not confirmed upstream (deepspeedai/DeepSpeed#2977), so that part is information only.

The bytes come from the planner's model-state accounting (`zerodoctor.plan.model_states`, within 0.000 % of
what DeepSpeed 0.19.8 holds, benchmarks/RESULTS.md), with pinned blocks rounded when the ranks per node are
known; per-process baselines, loading and save spikes are left to `zerodoctor plan`, which gives the full
per-phase budget.
Fixes: more nodes (the host share shrinks per node), NVMe offload, `pin_memory: false`, LoRA.
"""

from __future__ import annotations

from collections.abc import Iterator

from zerodoctor.findings import Evidence, Finding, Fix, Severity
from zerodoctor.lint.rule import Rule
from zerodoctor.lint.rules._common import gib, offloaded_host_bytes_per_node
from zerodoctor.setup.run import RunDescription

MEMLOCK_SMALL = 64 * 2**20  # below this, pinning more than a few buffers needs a raised limit


def _size(n: float) -> str:
    return f"{n / 2**20:,.0f} MiB" if n >= 2**20 else f"{n / 2**10:,.0f} KiB"


def check(run: RunDescription) -> Iterator[Finding]:
    setup = run.files
    if setup.ds_written is None or run.zero is None:
        return
    # Effective devices: the run description already drops what DeepSpeed ignores (param offload below
    # ZeRO-3, any offload at stage 0; DS005 reports those) and spellings DeepSpeed rejects (DS001).
    opt, param = run.zero.offload_optimizer.value, run.zero.offload_param.value
    if opt != "cpu" and param != "cpu":
        return
    pinned = (
        [p for p, d in (("optimizer", opt), ("param", param)) if d == "cpu"]
        if run.zero.pin_memory.value
        else []
    )
    facts = setup.facts()
    memlock = facts.get("env.memlock_bytes")
    if pinned and memlock is not None and memlock != float("inf") and memlock < MEMLOCK_SMALL:
        yield RULE.finding(
            f"Offload pins host memory ({', '.join('offload_' + p for p in pinned)} pin_memory true) and this host's "
            f"locked-memory limit (ulimit -l) is {_size(memlock)}. Pinning of large buffers can fail or be "
            "slow with low limits (reported under WSL and containers; not confirmed as a DeepSpeed issue elsewhere).",
            evidence=[
                setup.ds_evidence(f"zero_optimization.offload_{pinned[0]}.pin_memory"),
                Evidence(
                    file=setup.env.source if setup.env else None,
                    key="host.memlock_soft_bytes",
                    text=f"{memlock} bytes",
                ),
            ],
            fixes=[
                Fix(
                    "Raise the limit: docker --ulimit memlock=-1, or `ulimit -l unlimited` in the job script"
                ),
                Fix(
                    "Or set pin_memory: false (slower host-device copies)",
                    target="deepspeed",
                    patch={f"zero_optimization.offload_{p}.pin_memory": False for p in pinned},
                ),
            ],
            severity=Severity.INFO,
        )
    host = run.cluster.host_ram_bytes  # --host-ram, cluster.yaml or the environment snapshot
    ram = host.value if host is not None else None
    share = offloaded_host_bytes_per_node(run)
    if share is None or not ram:
        return
    need, per_byte, nodes = share
    params = setup.total_params or 0
    if need < 0.8 * ram:
        return
    severity = Severity.ERROR if need > ram else Severity.WARNING
    pin = run.zero.pin_memory
    assumed = (
        f" This assumes pin_memory is on ({pin.origin.detail}); give --env with the installed DeepSpeed to know."
        if pin.origin.kind == "default"
        else ""
    )
    if assumed:
        severity = Severity.WARNING  # a verdict that rests on an assumption is not an error
    when = (
        "from the first optimizer step on (the Adam moments are allocated then), and this node has "
        if opt == "cpu"
        else "from the start, and this node has "
    )
    where = "optimizer" if opt == "cpu" else "param"
    yield RULE.finding(
        f"Offloaded model states need about {gib(need)} of host RAM per node ({params / 1e9:,.1f}B "
        f"trainable parameters x {per_byte:.0f} B / {nodes} node(s), pinned blocks rounded up as PyTorch does), "
        f"{when}{gib(ram)}. Expect the kernel OOM killer "
        f"(exitcode -9)"
        + (" at the first optimizer step" if opt == "cpu" else "")
        + (" (pinned buffers make it worse: they cannot swap)." if pinned else ".")
        + assumed,
        evidence=[
            setup.ds_evidence(f"zero_optimization.offload_{where}.device"),
            host.origin.evidence(gib(ram)) if host is not None else Evidence(text=gib(ram)),
        ],
        fixes=[
            Fix("Spread the job over more nodes (host need per node falls with the node count)"),
            Fix(f"Offload to NVMe instead (offload_{where}.device: nvme with an nvme_path)"),
            Fix("Use LoRA, which offloads only the adapters' optimizer state"),
            Fix("Run `zerodoctor plan` for the per-phase host budget"),
        ],
        severity=severity,
    )


RULE = Rule(
    code="DS006",
    name="deepspeed.offload-host-memory",
    title="CPU offload vs host RAM, pinned memory and memlock",
    severity=Severity.WARNING,
    references=(
        "deepspeedai/DeepSpeed#2984",
        "deepspeedai/DeepSpeed#4380",
        "deepspeedai/DeepSpeed#2977",
        "InternLM/xtuner#589",
    ),
    check=check,
)
