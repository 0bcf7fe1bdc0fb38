"""DPO/KTO with a reference model: the reference forward runs while the policy's tensors are held.

LLaMA-Factory (train/dpo/trainer.py at 3c4f8eaa) and TRL run the policy first, keep its fp32 logits for the metrics
and its fp32 log-probs for backward, then run the reference model under no_grad and take its log-probs the same way
(`logits.to(float32)`, `log_softmax` of the `[:, :-1]` slice). Checked against the arithmetic and the storages a real
CPU run of that call order creates.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from zerodoctor.models import resolve_model
from zerodoctor.models.spec import model_from_config
from zerodoctor.plan import phases as ph
from zerodoctor.plan.inputs import GIB, Cluster, PlanInputs, Training, ZeroSettings

ITEM = "reference model forward while the policy's logits are held (DPO/KTO)"


def _inputs(framework: str | None, **kw: object) -> PlanInputs:
    t = Training(method="full", seq_len=2048, paired_inputs=True, reference_model=True, **kw)  # type: ignore[arg-type]
    return PlanInputs(
        model=resolve_model("llama-3-8b"), cluster=Cluster(1, 8, 80 * GIB, 1024 * GIB), training=t, framework=framework
    )


def _item(inputs: PlanInputs, zero: ZeroSettings) -> ph.Item:
    return next(i for i in ph.plan_strategy(inputs, zero).phase("steady").gpu if i.name == ITEM)


def test_only_runs_with_a_reference_model_have_the_item() -> None:
    inputs = _inputs("llamafactory")
    no_ref = dataclasses.replace(inputs, training=dataclasses.replace(inputs.training, reference_model=False))
    steady = ph.plan_strategy(no_ref, ZeroSettings(stage=3)).phase("steady")
    assert all(i.name != ITEM for i in steady.gpu)
    assert _item(inputs, ZeroSettings(stage=3)).bytes > 0


def test_the_policy_logits_are_held_where_the_framework_keeps_them() -> None:
    zero = ZeroSettings(stage=2)
    lf, openrlhf = _item(_inputs("llamafactory"), zero), _item(_inputs(None), zero)
    f = 2 * 2048 * resolve_model("llama-3-8b").params.vocab_size * 4  # chosen + rejected, fp32
    assert lf.bytes - openrlhf.bytes == f
    assert "3c4f8eaa" in lf.source


def test_zero3_charges_both_engines_output_layers_over_the_working_set() -> None:
    inputs = _inputs("llamafactory")
    spec = inputs.model
    act = ph.activations_for(inputs, inputs.training, ZeroSettings(stage=3))
    head = spec.params.lm_head * 2
    small = ph.reference_forward_item(inputs, inputs.training, ZeroSettings(stage=3), act, head)
    none = ph.reference_forward_item(inputs, inputs.training, ZeroSettings(stage=2), act, 0)
    assert small.bytes - none.bytes == head  # 2 heads against a working set of one
    assert "output layers" in small.detail


TINY = {
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 32000,
    "max_position_embeddings": 256,
    "tie_word_embeddings": False,
}


@pytest.mark.engine
def test_the_reference_moment_is_what_a_cpu_run_holds() -> None:
    """Two real transformers Llamas (bf16, CPU) in LLaMA-Factory's order: the policy's forward with labels and its
    log-probs (get_batch_logps), then the reference model's under no_grad. The storages alive at once peak within 2 %
    of the planned moment (activation peak + the item)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from torch.profiler import ProfilerActivity, profile
    from torch.profiler._memory_profiler import Action, MemoryProfile

    cfg = transformers.LlamaConfig(
        **{k: v for k, v in TINY.items() if k != "model_type"}, attn_implementation="sdpa", use_cache=False
    )
    torch.manual_seed(0)
    policy = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16).train()
    ref = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
    b, s = 2, 64  # one chosen/rejected pair
    ids = torch.randint(0, TINY["vocab_size"], (b, s))

    def batch_logps(logits: object, labels: object) -> object:  # LLaMA-Factory trainer_utils.get_batch_logps
        labels = labels[:, 1:].clone()  # type: ignore[index]
        logits = logits[:, :-1, :]  # type: ignore[index]
        return torch.gather(logits.log_softmax(-1), dim=2, index=labels.unsqueeze(2)).squeeze(2).sum(-1)

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        all_logits = policy(input_ids=ids, labels=ids).logits.to(torch.float32)
        logps = batch_logps(all_logits, ids)
        with torch.no_grad():
            ref_logps = batch_logps(ref(input_ids=ids, labels=ids).logits.to(torch.float32), ids)
    assert logps.requires_grad and not ref_logps.requires_grad  # type: ignore[attr-defined]
    live = peak = 0
    for _, action, _, size in MemoryProfile(prof.profiler.kineto_results).timeline:
        live += size if action == Action.CREATE else -size if action == Action.DESTROY else 0
        peak = max(peak, live)
    spec = model_from_config(TINY, name="tiny-llama", source=Path("tiny/config.json"))
    t = Training(
        method="full", seq_len=s, gradient_checkpointing=False, paired_inputs=True, reference_model=True, attn="sdpa"
    )
    inputs = PlanInputs(model=spec, cluster=Cluster(1, 1, 80 * GIB, 512 * GIB), training=t, framework="llamafactory")
    zero = ZeroSettings(stage=0)
    act = ph.activations_for(inputs, t, zero)
    item = ph.reference_forward_item(inputs, t, zero, act, 0)
    assert item.bytes > 0 and peak > act.peak  # the reference moment, not the policy's loss, is the peak
    assert abs(act.peak + item.bytes - peak) <= 0.02 * peak
