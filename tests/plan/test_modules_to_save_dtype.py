"""A run without DeepSpeed or FSDP with PEFT `modules_to_save` (Qwen's "LoRA (emb)": wte and lm_head trained
beside the adapters): PEFT upcasts only its adapter layers to fp32 (`cast_adapter_dtype` walks `BaseTunerLayer`
modules), the `ModulesToSaveWrapper` copies keep the model's dtype, and torch AdamW keeps each state in its
parameter's dtype. The plan's groups against a real PEFT model and a real AdamW step on CPU."""

from __future__ import annotations

from pathlib import Path

import pytest

from zerodoctor.models.spec import model_from_config
from zerodoctor.plan import model_states as ms
from zerodoctor.plan.inputs import GIB, Cluster, PlanInputs, Training, ZeroSettings
from zerodoctor.plan.phases import (
    plain_trainable_bytes,
    plain_trainable_groups,
    plan_strategy,
    trainable_frozen,
)

CONFIG = {
    "model_type": "llama",
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "vocab_size": 96,
    "max_position_embeddings": 32,
    "tie_word_embeddings": False,
}
SAVED = ("embed_tokens", "lm_head")


def _inputs(framework: str = "hf", **kw: object) -> PlanInputs:
    spec = model_from_config(CONFIG, name="tiny-llama", source=Path("<test>"))
    t = Training(method="lora", lora_rank=4, trainable_modules=SAVED, weights_dtype="bf16", **kw)  # type: ignore[arg-type]
    return PlanInputs(model=spec, cluster=Cluster(1, 1, 80 * GIB, 64 * GIB), training=t, framework=framework)


def test_adapters_are_fp32_and_the_saved_copies_keep_the_model_dtype():
    inputs = _inputs()
    trainable, _ = trainable_frozen(inputs, inputs.training)
    saved = 2 * CONFIG["vocab_size"] * CONFIG["hidden_size"]
    assert plain_trainable_groups(inputs, inputs.training) == ((trainable - saved, 4), (saved, 2))
    plan = plan_strategy(inputs, ZeroSettings(stage=0))
    comps = {c.name: c.bytes for c in plan.components}
    assert comps["param16"] == comps["grad16"] == (trainable - saved) * 4 + saved * 2
    assert comps["optimizer_states"] == (trainable - saved) * 8 + saved * 4
    step = {i.name: i.bytes for i in plan.phase("first_step").gpu}
    assert step["AdamW update temporary"] == max((trainable - saved) * 4, saved * 2)  # one dtype group at a time


def test_llamafactory_upcasts_the_copies_too_unless_pure_bf16():
    inputs = _inputs("llamafactory")
    trainable, _ = trainable_frozen(inputs, inputs.training)
    assert plain_trainable_groups(inputs, inputs.training) == ((trainable, 4),)
    pure = _inputs("llamafactory", pure_bf16=True)  # the copies stay 16-bit; the adapters follow PEFT's fp32
    saved = 2 * CONFIG["vocab_size"] * CONFIG["hidden_size"]
    assert plain_trainable_bytes(pure, pure.training) == (trainable - saved) * 4 + saved * 2


def test_a_real_peft_model_and_adamw_step_hold_what_the_groups_say():
    torch = pytest.importorskip("torch")
    pytest.importorskip("peft")
    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model(**CONFIG)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    model = get_peft_model(model, LoraConfig(r=4, target_modules="all-linear", modules_to_save=list(SAVED)))
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-3)
    ids = torch.randint(0, CONFIG["vocab_size"], (1, 8))
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    held = sum(p.numel() * p.element_size() for p in params)
    grads = sum(p.grad.numel() * p.grad.element_size() for p in params if p.grad is not None)
    states = sum(
        t.numel() * t.element_size() for s in opt.state.values() for t in s.values() if torch.is_tensor(t) and t.dim()
    )
    inputs = _inputs(lora_targets="all-linear")
    groups = plain_trainable_groups(inputs, inputs.training)
    comps = {
        c.name: c.bytes
        for c in ms.torch_optimizer_components(
            trainable=sum(n for n, _ in groups), frozen=0, trainable_bytes=4, frozen_bytes_per_param=2,
            trainable_groups=groups,
        )  # fmt: skip
    }
    assert held == grads == comps["param16"] == comps["grad16"]
    assert states == comps["optimizer_states"]
