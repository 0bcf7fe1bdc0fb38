"""bitsandbytes paged optimizers (HF Trainer `optim="paged_adamw_32bit"`): their states are CUDA unified memory that
the driver evicts to the host when the GPU is full, so they are no part of what the GPU needs; their update is a
fused kernel (no foreach temporary). And FSDP loads the model in its load dtype, not the compute dtype."""

from __future__ import annotations

from dataclasses import replace

from zerodoctor.models import resolve_model
from zerodoctor.plan import inputs as pi
from zerodoctor.plan import model_states as ms
from zerodoctor.plan.inputs import GIB, PlanInputs, Training
from zerodoctor.plan.phases import plan_strategy


def _inputs(optimizer: str, gpus: int = 8) -> PlanInputs:
    return PlanInputs(
        model=resolve_model("llama-2-70b"),
        cluster=pi.Cluster(2, gpus, 80 * GIB, 1000 * GIB),
        training=Training(method="full", optimizer=optimizer, seq_len=2048, attn="flash"),
        framework="hf",
    )


def _gpu(plan, phase: str) -> dict[str, int]:  # type: ignore[no-untyped-def]
    return {i.name: i.bytes for i in plan.phase(phase).gpu}


def _host(plan, phase: str) -> dict[str, int]:  # type: ignore[no-untyped-def]
    return {i.name: i.bytes for i in plan.phase(phase).host}


def test_paged_states_are_not_part_of_the_gpu_need_under_fsdp():
    z = pi.fsdp_as_zero(pi.FsdpSettings(version=1, sharding="full_shard"))
    adamw = plan_strategy(_inputs("adamw"), z)
    paged = plan_strategy(_inputs("paged_adamw_32bit"), z)
    states = _gpu(adamw, "steady")["optimizer states"]
    assert abs(states - 8 * adamw.trainable_params / 16) / states < 0.01  # fp32 exp_avg + exp_avg_sq per shard
    assert _gpu(paged, "steady")["paged optimizer states (unified memory)"] == 0
    assert "AdamW update temporary" not in _gpu(paged, "first_step")
    assert adamw.phase("steady").gpu_bytes - paged.phase("steady").gpu_bytes == states
    # on the host, all of them in the worst case: 8 local ranks
    assert _host(paged, "steady")["paged optimizer states evicted to the host (at most)"] == 8 * states


def test_paged_states_under_zero_and_without_deepspeed():
    for z in (pi.ZeroSettings(stage=2), pi.ZeroSettings(stage=0)):
        plan = plan_strategy(_inputs("paged_adamw_32bit", gpus=1), z)
        gpu = _gpu(plan, "steady")
        assert gpu["paged optimizer states (unified memory)"] == 0
        assert "model states: optimizer_states" not in gpu
        assert _host(plan, "steady")["paged optimizer states evicted to the host (at most)"] > 0
    # 32-bit states whatever the parameters' dtype; 8-bit blockwise as adamw_8bit
    assert ms.optimizer_state_bytes_per_param("paged_adamw_32bit", 2) == 8.0
    assert ms.optimizer_state_bytes_per_param("paged_adamw_8bit") == ms.ADAM_8BIT_STATE_BYTES


def test_fsdp_loads_in_the_load_dtype():
    z = pi.fsdp_as_zero(pi.FsdpSettings(version=1, sharding="full_shard", cpu_ram_efficient_loading=True))
    bf16 = _inputs("adamw")
    fp32_load = replace(bf16, training=replace(bf16.training, weights_dtype="fp32"))
    a, b = (plan_strategy(i, z).phase("load").host_bytes for i in (bf16, fp32_load))
    p = bf16.model.params.total
    assert b - a >= 2 * p  # rank 0 of the node holds the whole model in fp32 instead of bf16


def test_optimizer_names_map_to_the_planner_s_optimizers():
    from zerodoctor.setup.run import optimizer_kind

    assert optimizer_kind("paged_adamw_32bit") == "paged_adamw_32bit"
    assert optimizer_kind("paged_adamw_8bit") == "paged_adamw_8bit"
    assert optimizer_kind("PagedAdamW32bit") == "paged_adamw_32bit"  # bitsandbytes.optim class names (XTuner)
    assert optimizer_kind("PagedAdamW8bit") == "paged_adamw_8bit"
    assert optimizer_kind("PagedAdamW") == "paged_adamw_32bit"
    assert optimizer_kind("adamw_torch_fused") == "adamw"
    assert optimizer_kind("adamw_bnb_8bit") == "adamw_8bit"
    assert optimizer_kind("sgd") == "sgd"
    assert optimizer_kind("adafactor") is None


def test_paged_optimizer_reaches_the_plan_from_llamafactory_hf_and_xtuner(tmp_path):
    """HF `optim` (LLaMA-Factory YAML, TrainingArguments JSON) and an XTuner optimizer class: a paged AdamW is
    planned as paged, not folded into plain AdamW (before, every `paged_adamw_*` became `adamw`)."""
    from pathlib import Path

    from zerodoctor.plan.inputs import inputs_from_run
    from zerodoctor.setup.load import load_setup
    from zerodoctor.setup.run import RunFlags, describe_run

    cluster = RunFlags(nodes=1, gpus_per_node=2, gpu_memory_gib=80, host_ram_gib=512)
    lf = tmp_path / "sft.yaml"
    lf.write_text(
        "model_name_or_path: Qwen/Qwen2.5-7B-Instruct\nstage: sft\nfinetuning_type: lora\n"
        "optim: paged_adamw_8bit\nbf16: true\n"
    )
    run = describe_run(load_setup([lf], world_size=2), cluster)
    assert run.optimizer.value == "paged_adamw_8bit" and run.optimizer.origin.kind != "default"
    assert inputs_from_run(run).training.optimizer == "paged_adamw_8bit"

    hf = tmp_path / "args.json"
    hf.write_text('{"optim": "paged_adamw_32bit", "bf16": true, "per_device_train_batch_size": 1}')
    run = describe_run(load_setup([hf], framework="hf", world_size=2, model="qwen2.5-7b"), cluster)
    assert run.optimizer.value == "paged_adamw_32bit"

    example = Path(__file__).parents[2] / "examples/xtuner-yi34b-sp/yi_34b_200k_full_alpaca_enzh_128k_sp8.py"
    text = example.read_text()
    assert "optim_type = AdamW" in text
    xt = tmp_path / "xtuner_cfg.py"
    xt.write_text(
        text.replace("from torch.optim import AdamW", "from bitsandbytes.optim import PagedAdamW32bit").replace(
            "optim_type = AdamW", "optim_type = PagedAdamW32bit"
        )
    )
    run = describe_run(load_setup([xt], world_size=8), RunFlags(nodes=1, gpus_per_node=8))
    assert run.optimizer.value == "paged_adamw_32bit"
    assert run.optimizer.origin.line is not None
    run = describe_run(load_setup([example], world_size=8), RunFlags(nodes=1, gpus_per_node=8))
    assert run.optimizer.value == "adamw"
