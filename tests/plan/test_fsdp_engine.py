"""The FSDP planner against the real torch FSDP on CPU: 2 gloo ranks, a tiny Llama wrapped as accelerate
wraps it (tests/plan/fsdp_job.py). Per rank: sharded parameter, gradient and AdamW-state bytes (FSDP1 and
FSDP2 with CPU offload), and the largest number of unsharded elements during forward/backward (FSDP1 with and
without backward prefetch, FSDP2)."""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from zerodoctor.models.spec import model_from_config
from zerodoctor.plan.fsdp import fsdp_states, gathered_numel
from zerodoctor.plan.inputs import GIB, Cluster, FsdpSettings, PlanInputs, Training

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytestmark = pytest.mark.engine

HERE = Path(__file__).resolve().parent
CONFIGS = ("1:0:1", "1:0:0", "2:1:1", "1:0:1:1")  # version:offload:backward_prefetch[:pure_bf16]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def torchrun_job(script: Path, *args: str) -> list[dict]:
    """Run `script OUT *args` on 2 local gloo ranks with torchrun; each rank writes OUT/rank{N}.json."""
    out = Path(tempfile.mkdtemp(prefix=f"zd-{script.stem}-"))
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_port",
        str(_port()),
    ]
    cmd += [str(script), str(out), *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return [json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))]


@pytest.fixture(scope="module")
def measured() -> list[list[dict[str, int | str]]]:
    return torchrun_job(HERE / "fsdp_job.py", *CONFIGS)


def _inputs() -> PlanInputs:
    sys.path.insert(0, str(HERE))
    from fsdp_job import CONFIG

    spec = model_from_config({"model_type": "llama", **CONFIG}, name="tiny-llama", source=Path("<fsdp_job>"))
    return PlanInputs(
        model=spec,
        cluster=Cluster(1, 2, 80 * GIB, 1024 * GIB),
        training=Training(method="full", precision="bf16"),
        framework="accelerate",
    )


def test_per_rank_sharded_states_match(measured):
    inputs = _inputs()
    assert len(measured) == 2
    for rank in measured:
        for row in rank:
            version, offload, prefetch, *pure = (int(x) for x in str(row["config"]).split(":"))
            f = FsdpSettings(
                version=version,
                offload_params=bool(offload),
                backward_prefetch="backward_pre" if prefetch else "none",
            )
            # pure bf16 (llama-recipes): bf16 shards, bf16 gradients, AdamW states zeros_like the bf16 shards
            t = dataclasses.replace(inputs.training, pure_bf16=bool(pure and pure[0]))
            st = fsdp_states(inputs, f, t)
            assert (row["param_bytes"], row["grad_bytes"], row["optimizer_bytes"]) == (
                st.params,
                st.grads,
                st.optimizer,
            ), row


def test_unsharded_working_set_matches(measured):
    """FSDP1: the root + one or two layer units; FSDP2: two layer units (its tail is resharded at the start of
    backward, before the second layer is gathered). In-flight all-gathers count."""
    inputs = _inputs()
    for rank in measured:
        for row in rank:
            version, _, prefetch, *_pure = (int(x) for x in str(row["config"]).split(":"))
            f = FsdpSettings(version=version, backward_prefetch="backward_pre" if prefetch else "none")
            assert row["max_unsharded_numel"] == gathered_numel(inputs, f)[0], row


def test_pure_bf16_halves_the_shards_and_the_adamw_states(measured):
    """llama-recipes `pure_bf16` against its default bf16 mixed precision, same wrapping: every byte halves."""
    for rank in measured:
        rows = {str(r["config"]): r for r in rank}
        mixed, pure = rows["1:0:1"], rows["1:0:1:1"]
        for key in ("param_bytes", "grad_bytes", "optimizer_bytes"):
            assert 2 * pure[key] == mixed[key], key


def test_no_sync_keeps_every_unit_gradient_unsharded_in_the_compute_dtype(measured):
    """A backward under FSDP1's no_sync (gradient accumulation in HF Trainer / accelerate): every FlatParameter's
    .grad is its whole unsharded gradient in bf16 (the compute dtype, mixed precision and pure bf16 alike), what the
    planner's "FSDP no_sync" item charges (`FsdpStates.grad_numel` x 2 B): the whole model's, where the sharded
    gradients are 1/N of it (here N = 2)."""
    inputs = _inputs()
    for rank in measured:
        for row in rank:
            version, offload, prefetch, *pure = (int(x) for x in str(row["config"]).split(":"))
            if version != 1 or offload:
                continue
            f = FsdpSettings(version=version, backward_prefetch="backward_pre" if prefetch else "none")
            st = fsdp_states(inputs, f, dataclasses.replace(inputs.training, pure_bf16=bool(pure and pure[0])))
            assert row["no_sync_grad_bytes"] == st.grad_numel * 2, row
