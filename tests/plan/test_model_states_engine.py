"""`model_state_components` against the bytes the real DeepSpeed engine holds: one torchrun launch,
2 ranks, DeepSpeed's CPU accelerator and gloo, a tiny Llama built from a config (no download).

The same comparison as benchmarks/plan_accuracy.py, cut to two cases so that CI notices a regression
(in zerodoctor or in a DeepSpeed upgrade) in about half a minute.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

pytest.importorskip("deepspeed")
pytest.importorskip("transformers")

pytestmark = pytest.mark.engine
BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "plan_accuracy.py"


def _bench():
    spec = importlib.util.spec_from_file_location("zd_plan_accuracy", BENCH)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look the module up while building the class
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def rows():
    pa = _bench()
    cases = [
        pa.Case("h64-L2-v256", 3, "both", frozen=True),  # LoRA-like: q_proj/v_proj trainable
        pa.Case("h64-L2-v256", 2, "optimizer"),
        pa.Case("h64-L2-v256", 2, "none"),
    ]
    return pa.compare(pa.launch(2, cases, timeout_s=600))


def test_every_component_within_one_percent(rows):
    assert {r["case"] for r in rows} == {
        "z3-both-h64-L2-v256-frozen",
        "z2-optimizer-h64-L2-v256",
        "z2-none-h64-L2-v256",
    }
    bad = [r for r in rows if abs(r["error"]) > 0.01]
    assert not bad, "\n".join(
        f"{r['case']} {r['component']}: {r['measured']} vs {r['predicted']}" for r in bad
    )
    z3 = {r["component"] for r in rows if r["case"] == "z3-both-h64-L2-v256-frozen"}
    assert {
        "param16",
        "frozen16",
        "grad16",
        "fp32_master",
        "fp32_grad",
        "optimizer_states",
        "ipg_bucket",
    } <= z3


def test_pin_requests_match(rows):
    # CPU cannot page-lock; what is checked is which buffers DeepSpeed passes to pin_memory().
    bad = [r for r in rows if r["pinned_predicted"] != r["pinned_requested"]]
    assert not bad, [(r["case"], r["component"]) for r in bad]


def test_adam_states_are_lazy_and_fp32_grads_transient_without_offload(rows):
    states = [r for r in rows if r["component"] == "optimizer_states"]
    assert states and all(r["lazy_predicted"] and r["lazy_measured"] for r in states)
    grads = [r for r in rows if r["component"] == "fp32_grad"]
    assert all(r["transient_predicted"] == r["transient_measured"] for r in grads)
    assert any(r["transient_measured"] for r in grads)  # the z2-none case
