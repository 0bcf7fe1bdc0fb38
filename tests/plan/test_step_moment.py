"""The first optimizer step's moments under DeepSpeed without optimizer offload: the flattened 16-bit gradient copy
is freed once cast to fp32, before the optimizer creates its state (stage_1_and_2.py `step`, stage3.py
`_prepare_fp32_grad_for_sub_group` then `_optimizer_step`), so the plan no longer adds it on top of the state; and a
DeepSpeed config with an Adam/AdamW `optimizer` block makes DeepSpeed build FusedAdam, which has no update
temporary (engine.py `get_optimizer_configuration`). Unit cases on the plan and the run description, and the real
engine's first step on 2 gloo ranks (tests/plan/step_moment_job.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from zerodoctor.models import resolve_model
from zerodoctor.models.spec import model_from_config
from zerodoctor.plan.allocator import step_shape
from zerodoctor.plan.inputs import GIB, Cluster, PlanInputs, Training, ZeroSettings
from zerodoctor.plan.phases import plan_strategy

HERE = Path(__file__).resolve().parent
FLAT = "model states: grad_flat_copy"
TEMP = "AdamW update temporary"


def _inputs(gpus: int = 1, optimizer: str = "adamw") -> PlanInputs:
    return PlanInputs(
        model=resolve_model("qwen2.5-1.5b"),
        cluster=Cluster(1, gpus, 80 * GIB, 512 * GIB),
        training=Training(method="full", micro_batch=1, seq_len=256, optimizer=optimizer),
        framework="hf",
    )


def _first(inputs: PlanInputs, zero: ZeroSettings) -> dict[str, int]:
    return {i.name: i.bytes for i in plan_strategy(inputs, zero).phase("first_step").gpu}


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_the_flat_gradient_copy_is_not_added_on_top_of_the_new_adam_state(stage: int):
    items = _first(_inputs(2), ZeroSettings(stage=stage))
    assert items[FLAT] == 0  # 2 B per element of copy, freed before 8 B of Adam state appear
    assert items["model states: optimizer_states"] > 0 and items["model states: fp32_grad"] > 0


def test_the_first_step_drops_exactly_the_copy():
    inputs = _inputs(1)
    plan = plan_strategy(inputs, ZeroSettings(stage=2))
    step = plan.phase("first_step")
    flat = next(i for i in step.gpu if i.name == FLAT)
    assert "freed once cast to fp32" in flat.detail and "stage_1_and_2.py step" in flat.source
    comps = {c.name: c.bytes for c in plan.components}
    assert comps["grad_flat_copy"] == comps["param16"]  # the copy itself is still a model-state component


def test_a_deepspeed_optimizer_block_has_no_update_temporary_in_the_items_or_the_replay():
    inputs = _inputs(1)
    torch_adamw = _first(inputs, ZeroSettings(stage=2))
    fused = _first(inputs, ZeroSettings(stage=2, optimizer_from_config=True))
    assert TEMP in torch_adamw and TEMP not in fused
    assert sum(torch_adamw.values()) - sum(fused.values()) >= torch_adamw[TEMP] - 1 * GIB // 8
    assert step_shape(inputs, ZeroSettings(stage=2), inputs.training).adamw_temporary
    assert not step_shape(inputs, ZeroSettings(stage=2, optimizer_from_config=True), inputs.training).adamw_temporary


def test_the_run_description_reads_the_optimizer_block(tmp_path, run_cli):
    base = {"zero_optimization": {"stage": 2}, "train_micro_batch_size_per_gpu": 1}
    cases = {
        "none": (base, True),
        "adamw": ({**base, "optimizer": {"type": "AdamW", "params": {"lr": 1e-5}}}, False),
        "adam": ({**base, "optimizer": {"type": "Adam"}}, False),
        "torch_adam": ({**base, "optimizer": {"type": "AdamW", "params": {"torch_adam": True}}}, True),
        "lamb": ({**base, "optimizer": {"type": "Lamb"}}, True),
    }
    for name, (cfg, has_temp) in cases.items():
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(cfg))
        code, out, err = run_cli(
            "plan", "--model", "qwen2.5-1.5b", "--deepspeed", str(path), "--nodes", "1", "--gpus-per-node", "1",
            "--gpu-memory", "80", "--host-ram", "512", "--format", "json",
        )
        assert code in (0, 1), err
        step = next(p for p in json.loads(out)["yours"]["phases"] if p["name"] == "first_step")
        assert (TEMP in {i["name"] for i in step["gpu"]}) is has_temp, name


@pytest.mark.engine
def test_the_real_first_step_frees_the_flat_copy_before_the_adam_state():
    """torch AdamW on CPU is single-tensor: `exp_avg_sq.sqrt() / bias_correction2_sqrt` holds two fp32 temporaries
    of the partition at once (the CUDA default, foreach, holds one: `_foreach_sqrt` then in-place ops). The step's
    own tensors peak at fp32 gradient + Adam state + those two; the 16-bit flat copy (2 B per element) is gone by
    then. ZeRO-2 and ZeRO-3 in one launch."""
    sys.path.insert(0, str(HERE))
    from step_moment_job import CONFIG
    from test_fsdp_engine import torchrun_job

    ranks = torchrun_job(HERE / "step_moment_job.py", "2,3")
    assert len(ranks) == 2
    spec = model_from_config({"model_type": "llama", **CONFIG}, name="tiny-llama", source=Path("<step_moment_job>"))
    inputs = PlanInputs(
        model=spec,
        cluster=Cluster(1, 2, 80 * GIB, 64 * GIB),
        training=Training(method="full", precision="bf16", micro_batch=1, seq_len=16),
        framework="deepspeed",
    )
    for rank in ranks:
        assert [r["stage"] for r in rank["stages"]] == [2, 3]
        for run in rank["stages"]:
            items = _first(inputs, ZeroSettings(stage=run["stage"]))
            part = run["partition_numel"]
            grad32, state = 4 * part, 8 * part
            assert items["model states: fp32_grad"] == pytest.approx(grad32, rel=0.01)
            assert items["model states: optimizer_states"] == pytest.approx(state, rel=0.01)
            assert items[FLAT] == 0
            single_tensor_temps = 2 * 4 * part
            # the peak is the update moment (small scalars aside), not the flatten moment plus the state
            assert run["step_created_peak"] == pytest.approx(grad32 + state + single_tensor_temps, rel=0.001)
            assert run["step_created_peak"] < grad32 + state + single_tensor_temps + 2 * part
            ops = [op for op, _, _ in run["trace"]]
            assert ops.index("aten.cat.default") < ops.index("aten.zeros_like.default")  # flatten, then the state
