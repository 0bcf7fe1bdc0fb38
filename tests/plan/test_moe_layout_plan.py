"""The planner sizes ZeRO-3's fetched working set and full-size gradient by the MoE layout of the run's
transformers: a layer's fused experts module from transformers 5, one expert's `nn.Linear` (or the embedding)
before (`zerodoctor.plan.phases.with_moe_layout`)."""

from __future__ import annotations

import dataclasses

from zerodoctor.plan.inputs import PlanInputs, PlanOptions, ZeroSettings, load_inputs
from zerodoctor.plan.phases import plan_strategy, with_moe_layout

FETCHED = "ZeRO-3 fetched parameters (working set)"
GRAD = "full-size gradient before reduce-scatter"


def _inputs(model: str, transformers_version: str | None) -> PlanInputs:
    inputs = load_inputs(
        PlanOptions(
            model=model, nodes=2, gpus_per_node=8, gpu_memory_gib=80, host_ram_gib=1024,
            seq_len=4096, micro_batch=1, gradient_checkpointing=True, attn="flash", method="full", framework="hf",
        )  # fmt: skip
    )
    return dataclasses.replace(inputs, transformers_version=transformers_version)


def _items(inputs: PlanInputs) -> dict[str, int]:
    steady = plan_strategy(inputs, ZeroSettings(stage=3)).phase("steady")
    return {i.name: i.bytes for i in steady.gpu}


def test_mixtral_under_transformers_4_fetches_and_reduces_per_expert_linear() -> None:
    new = _items(_inputs("mixtral-8x7b", "5.23.0"))
    old = _items(_inputs("mixtral-8x7b", "4.36.0"))
    fused, per_expert_head = 8 * 3 * 4096 * 14336, 32000 * 4096
    assert new[GRAD] == fused * 2  # bf16 gradient of the fused experts module
    assert old[GRAD] == per_expert_head * 2  # the largest tensor is the embedding / head
    assert old[FETCHED] < new[FETCHED]
    assert new[FETCHED] - old[FETCHED] == (fused - per_expert_head) * 2  # the parameter crossing max_live


def test_the_layout_is_named_in_the_notes_and_a_dense_model_is_unchanged() -> None:
    old = with_moe_layout(_inputs("mixtral-8x7b", "4.36.0"))
    assert any("one nn.Linear per expert" in n and "4.36.0" in n for n in old.notes)
    dense = _inputs("llama-3-8b", "4.36.0")
    assert with_moe_layout(dense) is dense
    old_items, new_items = _items(dense), _items(dataclasses.replace(dense, transformers_version="5.23.0"))
    assert (old_items[FETCHED], old_items[GRAD]) == (new_items[FETCHED], new_items[GRAD])


def _env_snapshot(tmp_path, transformers_version: str):  # type: ignore[no-untyped-def]
    import json

    from zerodoctor.env.model import Environment, PackageInfo

    env = Environment(
        python="3.10",
        platform="linux",
        packages={"transformers": PackageInfo("transformers", transformers_version)},
    )
    snap = tmp_path / "env.json"
    snap.write_text(json.dumps(env.to_dict()))
    return snap


def test_a_transformers_4_env_plans_lora_on_the_experts_by_their_4x_names(run_cli, tmp_path):  # type: ignore[no-untyped-def]
    import json

    args = ["plan", "--model", "mixtral-8x7b", "--nodes", "1", "--gpus-per-node", "8", "--gpu-memory", "80",
            "--host-ram", "1024", "--method", "lora", "--lora-targets", "q_proj,w1,w2,w3", "--format", "json"]  # fmt: skip
    code, out, err = run_cli(*args, "--env", str(_env_snapshot(tmp_path, "4.36.0")))
    assert code == 0, err
    assert "one nn.Linear per expert (w1/w3/w2)" in out and "transformers 4.36.0" in out
    assert json.loads(out)
    # transformers 5: the fused layout, no per-expert note (PEFT finds no w1/w2/w3 Linear there)
    code, out5, err = run_cli(*args, "--env", str(_env_snapshot(tmp_path, "5.23.0")))
    assert code == 0, err
    assert "one nn.Linear per expert" not in out5
    assert out5 != out
