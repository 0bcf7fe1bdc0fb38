"""The HF Trainer gives a PEFT model PEFT's FSDP wrap policy (transformers `_fsdp_qlora_plugin_updates` from 4.39,
`update_fsdp_plugin_peft` in 5.x): every adapter is a unit of its own, so the decoder layers' FlatParameters hold
only frozen weights and accelerate's mixed-precision upcast (trainable FlatParameters only) leaves them 16-bit, even
with `use_orig_params=True`. A custom accelerate loop keeps the policy its config names."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest

from zerodoctor.models.spec import resolve_model
from zerodoctor.plan.fsdp import fsdp_states, trainer_wraps_adapters
from zerodoctor.plan.inputs import GIB, Cluster, FsdpSettings, PlanInputs, Training


def _inputs(framework: str | None, transformers_version: str | None = None) -> PlanInputs:
    return PlanInputs(
        model=resolve_model("llama-3.1-8b"),
        cluster=Cluster(1, 8, 80 * GIB, 1024 * GIB),
        training=Training(method="lora", seq_len=4096),
        framework=framework,
        transformers_version=transformers_version,
    )


@pytest.mark.parametrize("framework", ["hf", "llamafactory"])
def test_trainer_runs_upcast_only_the_adapters(framework: str) -> None:
    orig = FsdpSettings(use_orig_params=True)
    custom = _inputs("accelerate")
    trainer = _inputs(framework)
    whole = fsdp_states(custom, orig, custom.training)
    wrapped = fsdp_states(trainer, orig, trainer.training)
    peft_policy = fsdp_states(custom, FsdpSettings(use_orig_params=False), custom.training)
    assert whole.upcast_frozen and not wrapped.upcast_frozen
    assert (wrapped.params, wrapped.grads) == (peft_policy.params, peft_policy.grads)
    assert whole.params > 1.8 * wrapped.params


def test_transformers_before_4_39_kept_the_configured_policy() -> None:
    assert trainer_wraps_adapters(_inputs("hf", "4.39.0"), _inputs("hf").training)
    assert not trainer_wraps_adapters(_inputs("hf", "4.38.2"), _inputs("hf").training)
    old = _inputs("hf", "4.38.2")
    assert fsdp_states(old, FsdpSettings(use_orig_params=True), old.training).upcast_frozen
    full = _inputs("hf")
    assert not trainer_wraps_adapters(full, replace(full.training, method="full"))


def test_the_installed_trainer_sets_peft_policy_and_it_wraps_each_adapter() -> None:
    """The real functions: transformers' hook installs PEFT's policy on the accelerator's FSDP plugin, and that
    policy makes a LoRA leaf (a weight that requires grad) a unit while a frozen projection is not one."""
    pytest.importorskip("torch")
    peft = pytest.importorskip("peft")
    fsdp_hook = pytest.importorskip("transformers.distributed.fsdp")
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4
    )
    model = peft.get_peft_model(
        LlamaForCausalLM(config), peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"])
    )
    accelerator = SimpleNamespace(state=SimpleNamespace(fsdp_plugin=SimpleNamespace(auto_wrap_policy=None)))
    fsdp_hook.update_fsdp_plugin_peft(model, accelerator)
    policy = accelerator.state.fsdp_plugin.auto_wrap_policy
    assert policy is not None
    layer = model.base_model.model.model.layers[0]
    lora_a = layer.self_attn.q_proj.lora_A["default"]
    frozen = layer.self_attn.k_proj
    assert policy(module=lora_a, recurse=False, nonwrapped_numel=lora_a.weight.numel())
    assert not policy(module=frozen, recurse=False, nonwrapped_numel=frozen.weight.numel())


def test_the_trainer_policy_is_cited_for_fsdp1_plans_only() -> None:
    """transformers' Trainer runs `update_fsdp_plugin_peft` only when it delays the optimizer's creation, which
    `is_fsdp2` turns off (4.57.6 and 5.23 trainer.py): an FSDP2 plan does not cite PEFT's policy."""
    from zerodoctor.plan.fsdp import SRC_PEFT_WRAP
    from zerodoctor.plan.inputs import fsdp_as_zero
    from zerodoctor.plan.phases import plan_strategy

    hf = _inputs("hf", "5.23.0")

    def sources(version: int) -> str:
        plan = plan_strategy(hf, fsdp_as_zero(FsdpSettings(version=version)))
        return " ".join(i.source for ph in plan.phases for i in (*ph.gpu, *ph.host))

    assert SRC_PEFT_WRAP in sources(1)
    assert SRC_PEFT_WRAP not in sources(2)
