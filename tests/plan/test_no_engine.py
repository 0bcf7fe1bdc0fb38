"""A run without DeepSpeed or FSDP (HF Trainer / DDP): the torch optimizer steps the model's own weights, in the
dtype they were loaded in, with no fp32 master; and the safetensors shard copy of a save, by safetensors version.

The model-state layout is checked against real torch (AdamW's state dtype and bytes) and real transformers (the
dtype `from_pretrained` loads without a dtype argument); DeepSpeed's own stage 0 keeps its fp32 master."""

from __future__ import annotations

from dataclasses import replace

import pytest

from zerodoctor.models import resolve_model
from zerodoctor.plan import model_states as ms
from zerodoctor.plan.inputs import GIB, Cluster, PlanInputs, Training, ZeroSettings
from zerodoctor.plan.phases import (
    loaded_weight_bytes,
    plan_strategy,
    trainable_weight_bytes,
    without_engine,
)


def _inputs(method: str = "full", **kw: object) -> PlanInputs:
    return PlanInputs(
        model=resolve_model("qwen-7b-chat"),
        cluster=Cluster(1, 1, 80 * GIB, 512 * GIB),
        training=Training(method=method, micro_batch=1, seq_len=512, grad_accum=16, attn="flash"),
        framework="hf",
        **kw,  # type: ignore[arg-type]
    )


def _states(plan) -> dict[str, int]:  # type: ignore[no-untyped-def]
    return {c.name: c.bytes for c in plan.components}


def test_bf16_weights_train_without_a_master_copy():
    inputs = _inputs()
    plan = plan_strategy(inputs, ZeroSettings(stage=0))
    p = inputs.model.params.total
    states = _states(plan)
    assert states == {ms.PARAM16: 2 * p, ms.GRAD16: 2 * p, ms.OPTIMIZER_STATES: 4 * p}
    step = {i.name: i.bytes for i in plan.phase("first_step").gpu}
    assert step["AdamW update temporary"] == 2 * p
    # gradients appear at the first backward, not at load
    assert "model states: grad16" not in {i.name for i in plan.phase("load").gpu}
    assert "a current transformers loads dtype='auto'" in loaded_weight_bytes(inputs, inputs.training)[1]


def test_transformers_4_loads_fp32_unless_a_dtype_is_given():
    old = _inputs(transformers_version="4.46.1")
    p = old.model.params.total
    assert _states(plan_strategy(old, ZeroSettings(stage=0))) == {
        ms.PARAM16: 4 * p,
        ms.GRAD16: 4 * p,
        ms.OPTIMIZER_STATES: 8 * p,
    }
    param_item = next(i for i in plan_strategy(old, ZeroSettings(stage=0)).phase("steady").gpu if i.name.endswith("param16"))
    assert "no DeepSpeed: transformers 4.46.1 loads fp32 when no torch_dtype is given (assumed" in param_item.detail
    given = replace(old, training=replace(old.training, weights_dtype="bf16"))
    assert _states(plan_strategy(given, ZeroSettings(stage=0)))[ms.OPTIMIZER_STATES] == 4 * p


def test_peft_adapters_and_llamafactory_trainables_are_fp32():
    lora = _inputs("lora")
    wb, why = trainable_weight_bytes(lora, lora.training)
    assert wb == 4 and "PEFT" in why
    plan = plan_strategy(lora, ZeroSettings(stage=0))
    p = lora.model.params.total
    assert _states(plan)[ms.FROZEN16] == 2 * p  # the base stays in its loaded 16-bit dtype
    lf = replace(_inputs(), framework="llamafactory")
    assert trainable_weight_bytes(lf, lf.training)[0] == 4
    pure = replace(lf, training=replace(lf.training, pure_bf16=True))
    assert trainable_weight_bytes(pure, pure.training)[0] == 2


def test_deepspeed_stage0_keeps_its_fp32_master():
    z = ZeroSettings(stage=0)
    for inputs in (_inputs(zero=z), replace(_inputs(), framework="deepspeed")):
        assert not without_engine(inputs, z)
        assert ms.FP32_MASTER in _states(plan_strategy(inputs, z))
    assert without_engine(_inputs(), z)
    assert not without_engine(_inputs(), ZeroSettings(stage=2))


def test_plain_save_copies_one_shard_from_the_gpu_on_rank_0():
    plan = plan_strategy(_inputs(), ZeroSettings(stage=0))
    host = {i.name: i.bytes for i in plan.phase("save").host}
    assert "every rank: 16-bit state dict on CPU" not in host
    assert host["rank 0: safetensors shard copied from the GPU"] == 5 * 10**9
    assert plan.checkpoint.optimizer_bytes == 4 * plan.trainable_params  # no master copy in the checkpoint


@pytest.mark.parametrize(("version", "charged"), [(None, True), ("0.7.0", True), ("0.8.0", False), ("0.9.1", False)])
def test_zero2_save_charges_the_shard_bytes_copy_up_to_safetensors_0_7(version, charged):
    inputs = replace(_inputs(), cluster=Cluster(1, 8, 80 * GIB, 2048 * GIB), safetensors_version=version)
    host = {i.name for i in plan_strategy(inputs, ZeroSettings(stage=2)).phase("save").host}
    assert "every rank: 16-bit state dict on CPU" in host
    assert ("safetensors shard being written" in host) is charged


def test_torch_adamw_state_follows_the_parameter_dtype():
    torch = pytest.importorskip("torch")
    for dtype, wb in ((torch.bfloat16, 2), (torch.float32, 4)):
        lin = torch.nn.Linear(64, 32, bias=False, dtype=dtype)
        lin(torch.randn(4, 64, dtype=dtype)).sum().backward()
        opt = torch.optim.AdamW(lin.parameters(), foreach=False)
        opt.step()
        state = opt.state[lin.weight]
        held = sum(t.numel() * t.element_size() for t in (state["exp_avg"], state["exp_avg_sq"]))
        grad = lin.weight.grad.numel() * lin.weight.grad.element_size()
        comps = {
            c.name: c.bytes
            for c in ms.torch_optimizer_components(
                trainable=lin.weight.numel(), frozen=0, trainable_bytes=wb, frozen_bytes_per_param=2
            )
        }
        assert comps[ms.OPTIMIZER_STATES] == held
        assert comps[ms.GRAD16] == grad


def test_from_pretrained_without_dtype_loads_the_checkpoint_dtype(tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from zerodoctor.plan.phases import DTYPE_AUTO_DEFAULT
    from zerodoctor.versions import in_range, parse_version

    version = parse_version(transformers.__version__)
    assert version is not None
    cfg = transformers.LlamaConfig(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2
    )
    transformers.LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(tmp_path)
    loaded = transformers.LlamaForCausalLM.from_pretrained(tmp_path)
    expected = torch.float32 if in_range(version, fixed=DTYPE_AUTO_DEFAULT) else torch.bfloat16
    assert {p.dtype for p in loaded.parameters()} == {expected}
    inputs = _inputs(transformers_version=transformers.__version__)
    assert loaded_weight_bytes(inputs, inputs.training)[0] == expected.itemsize


def test_the_runs_torch_dtype_reaches_the_plan(tmp_path):
    from zerodoctor.plan.inputs import PlanOptions, load_inputs

    args = tmp_path / "args.yaml"
    args.write_text(
        "model_name_or_path: Qwen/Qwen-7B-Chat\ntorch_dtype: float32\nbf16: true\nper_device_train_batch_size: 1\n"
    )
    opts = PlanOptions(files=(str(args),), gpus_per_node=1, gpu_memory_gib=80, host_ram_gib=512, framework="hf")
    inputs = load_inputs(opts)
    assert inputs.training.weights_dtype == "fp32"
    assert loaded_weight_bytes(inputs, inputs.training)[0] == 4
    args.write_text("model_name_or_path: Qwen/Qwen-7B-Chat\nbf16: true\npure_bf16: true\n")
    inputs = load_inputs(opts)
    assert inputs.training.weights_dtype is None and inputs.training.pure_bf16
