"""PEFT `lora_dropout` > 0 (PEFT's example scripts use 0.1): every adapter runs `lora_A(dropout(x))`, so each keeps
its own dropped copy of its input and `native_dropout`'s bool mask instead of sharing x. The formula against
saved_tensors_hooks on a real transformers Llama with PEFT adapters (bf16, as DeepSpeed casts them), and the
value read from a run's arguments."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from zerodoctor.models.spec import model_from_config
from zerodoctor.plan.activations import activation_bytes

CONFIG = {
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 172,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 128,
    "max_position_embeddings": 64,
    "tie_word_embeddings": False,
}
RANK = 4


def _middle_layer_saved(dropout: float, attn: str, batch: int, seq: int) -> int:
    torch = pytest.importorskip("torch")
    pytest.importorskip("peft")
    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model(**CONFIG)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation=attn, dtype=torch.bfloat16)
    model = get_peft_model(model, LoraConfig(r=RANK, target_modules="all-linear", lora_dropout=dropout))
    model.to(torch.bfloat16).train()
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    region = [""]
    seen: dict[int, tuple[str, int]] = {}

    def pack(x):  # type: ignore[no-untyped-def]
        st = x.untyped_storage()
        if st.data_ptr() not in params:
            seen.setdefault(st.data_ptr(), (region[0], st.nbytes()))
        return x

    layers = model.get_base_model().model.layers
    hooks = [
        layer.register_forward_pre_hook(lambda m, a, i=i: region.__setitem__(0, f"L{i}"))
        for i, layer in enumerate(layers)
    ]
    hooks.append(model.get_base_model().model.norm.register_forward_pre_hook(lambda m, a: region.__setitem__(0, "")))
    ids = torch.randint(0, CONFIG["vocab_size"], (batch, seq))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
        model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
    for h in hooks:
        h.remove()
    return sum(n for r, n in seen.values() if r == "L1")


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_each_adapter_keeps_its_dropped_input_and_mask(dropout: float, attn: str):
    spec = model_from_config(CONFIG, name="tiny-llama", source=Path("<test>"))
    for batch, seq in ((1, 16), (2, 24)):
        est = activation_bytes(
            spec, micro_batch=batch, seq_len=seq, attn_impl=attn, lora_rank=RANK, lora_targets=("all-linear",),
            lora_dropout=dropout,
        )  # fmt: skip
        # on CPU `dropout` keeps a mask in the input's dtype (`_dropout_impl`: input * noise); on CUDA the fused
        # `native_dropout` keeps a bool mask, which the plan charges: one byte less per element on CPU
        h, q, i = CONFIG["hidden_size"], CONFIG["hidden_size"], CONFIG["intermediate_size"]
        cpu_mask = (2 - 1) * batch * seq * (5 * h + q + i) if dropout else 0
        assert est.per_layer_saved + cpu_mask == _middle_layer_saved(dropout, attn, batch, seq), (batch, seq)


def test_dropout_grows_the_recomputed_layer_of_a_checkpointed_70b_lora():
    from zerodoctor.models import resolve_model

    spec = resolve_model("llama-2-70b")
    kw = dict(micro_batch=8, seq_len=2048, attn_impl="flash", gradient_checkpointing=True, lora_rank=8,
              lora_targets=("all-linear",))  # fmt: skip
    plain, dropped = activation_bytes(spec, **kw), activation_bytes(spec, **kw, lora_dropout=0.1)  # type: ignore[arg-type]
    t, h, i = 8 * 2048, spec.params.hidden_size, spec.params.intermediate_size
    q = spec.params.num_heads * spec.params.head_dim
    # the shared norm outputs (q/k/v, gate/up) and down_proj's input were kept once; now each adapter keeps a
    # copy and a mask, and o_proj's adapter no longer reads the attention output's own storage
    added = (3 * 3 - 2) * t * h + (2 * 3 - 2) * t * h + (3 - 2) * t * i + 3 * t * q
    assert dropped.per_layer_saved - plain.per_layer_saved == added
    assert dropped.checkpointed_input == plain.checkpointed_input  # checkpointing keeps layer inputs only
    assert dropped.peak > plain.peak
    assert any("lora_dropout 0.1" in n for n in dropped.notes)


def test_the_run_arguments_carry_lora_dropout(run_cli, tmp_path):
    (tmp_path / "ds.json").write_text('{"zero_optimization": {"stage": 3}}')
    args = tmp_path / "args.yaml"
    cluster = ("--nodes", "1", "--gpus-per-node", "2", "--gpu-memory", "80", "--host-ram", "512", "--format", "json")
    steady = {}
    for value in ("0.0", "0.1"):
        args.write_text(
            "model_name_or_path: meta-llama/Meta-Llama-3-8B\noutput_dir: out\ndeepspeed: ds.json\n"
            f"use_peft: true\nlora_r: 8\nlora_dropout: {value}\ngradient_checkpointing: false\n"
        )
        code, out, err = run_cli("plan", str(args), *cluster)
        assert code in (0, 1), err
        phases = json.loads(out)["yours"]["phases"]
        steady[value] = next(p for p in phases if p["name"] == "steady")["gpu"]
    act = {v: next(i for i in items if i["name"].startswith("activations")) for v, items in steady.items()}
    assert act["0.1"]["bytes"] > act["0.0"]["bytes"]
