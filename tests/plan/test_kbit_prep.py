"""QLoRA's k-bit preparation without DeepSpeed or FSDP (plan/kbit_prep.py): PEFT's `prepare_model_for_kbit_training`
casts every 16-bit parameter that is not a `Params4bit` to fp32, bitsandbytes' Linear4bit returns its output in its
input's dtype, so the residual stream and every checkpointed layer input become fp32, and under the HF Trainer's
autocast the fp32 head is copied to 16-bit and kept for backward. Checked with the real peft and transformers on CPU:
a tiny Llama / Qwen2 whose decoder Linears carry bitsandbytes' forward (cast the input to the compute dtype, return
the input's dtype; bitsandbytes itself needs CUDA here) and a weight class named `Params4bit`, as PEFT tests it."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from zerodoctor.models.spec import model_from_config
from zerodoctor.plan.activations import activation_bytes
from zerodoctor.plan.inputs import GIB, Cluster, PlanInputs, Training, ZeroSettings
from zerodoctor.plan.kbit_prep import kbit_preparation, stream_cost
from zerodoctor.plan.phases import (
    KBIT_PARAMS_ITEM,
    KBIT_STREAM_ITEM,
    activations_for,
    plain_trainable_bytes,
    plain_trainable_groups,
    plan_strategy,
    qlora_unquantised_params,
)

BASE = dict(  # a tiny decoder with GQA and an untied head
    hidden_size=64, intermediate_size=172, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
    vocab_size=128, max_position_embeddings=64, tie_word_embeddings=False,
)  # fmt: skip
CONFIGS = {"llama": {"model_type": "llama", **BASE}, "qwen2": {"model_type": "qwen2", **BASE}}
BATCH, SEQ, RANK = 2, 16, 4


def _inputs(config: dict[str, object], *, framework: str | None = "hf", **training: object) -> PlanInputs:
    spec = model_from_config(config, name=f"tiny-{config['model_type']}", source=Path("<test>"))
    t = Training(
        method="qlora", lora_rank=RANK, micro_batch=BATCH, seq_len=SEQ, gradient_checkpointing=True, **training
    )  # type: ignore[arg-type]
    return PlanInputs(model=spec, cluster=Cluster(1, 1, 80 * GIB, 512 * GIB), training=t, framework=framework)


def _run(
    config: dict[str, object], *, trl_bf16: bool, checkpointing: bool = True, autocast: bool = True
) -> dict[str, object]:
    """Prepare, wrap and train one step of the tiny model under bf16 autocast (accelerate's mixed precision);
    return the fp32 parameters after the preparation and what autograd saved (with checkpointing: outside the
    checkpointed layers; without: every layer's tensors)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("peft")
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
    from torch import nn
    from torch.nn import functional as F
    from transformers import AutoConfig, AutoModelForCausalLM

    class Params4bit(nn.Parameter):
        """Named as bitsandbytes' class: prepare_model_for_kbit_training skips it by `__class__.__name__`."""

    class Linear4bitLike(nn.Linear):
        """bitsandbytes nn/modules.py Linear4bit.forward's dtypes: bias cast to the input's dtype in place, the
        matmul in the compute dtype, the output in the input's dtype."""

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if self.bias is not None and self.bias.dtype != x.dtype:
                self.bias.data = self.bias.data.to(x.dtype)
            bias = None if self.bias is None else self.bias.to(torch.bfloat16)
            return F.linear(x.to(torch.bfloat16), self.weight, bias).to(x.dtype)

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(
        AutoConfig.for_model(**config), attn_implementation="sdpa", dtype=torch.bfloat16
    )
    for layer in model.model.layers:
        for mod in layer.modules():
            if type(mod) is nn.Linear:
                mod.__class__ = Linear4bitLike
                mod.weight = Params4bit(mod.weight.data, requires_grad=False)
    model.is_loaded_in_4bit = True
    model = prepare_model_for_kbit_training(
        model, use_gradient_checkpointing=checkpointing, gradient_checkpointing_kwargs={"use_reentrant": False}
    )
    if not checkpointing:
        model.enable_input_require_grads()  # as the frameworks do for adapters on a frozen embedding
    model = get_peft_model(model, LoraConfig(r=RANK, target_modules="all-linear"))
    if trl_bf16:
        # trl 0.8-0.24 trainer/utils.py peft_module_casting_to_bf16 (TRL is not installed here), run by SFTTrainer
        # after get_peft_model when args.bf16 and the model is loaded in 4-bit
        for name, module in model.named_modules():
            if isinstance(module, nn.LayerNorm) or "norm" in name:
                module.to(torch.float32)
            elif (
                any(x in name for x in ["lm_head", "embed_tokens", "wte", "wpe"])
                and hasattr(module, "weight")
                and module.weight.dtype == torch.float32
            ):
                module.to(torch.bfloat16)
    fp32_base = sum(
        p.numel() for n, p in model.named_parameters() if p.dtype == torch.float32 and "lora_" not in n
    )
    model.train()
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    base = model.get_base_model()
    region = [""]
    seen: dict[int, tuple[str, torch.dtype, tuple[int, ...], int]] = {}

    def pack(x: torch.Tensor) -> torch.Tensor:
        st = x.untyped_storage()
        if st.data_ptr() not in params:
            seen.setdefault(st.data_ptr(), (region[0], x.dtype, tuple(x.shape), st.nbytes()))
        return x

    for i, layer in enumerate(base.model.layers):
        layer.register_forward_pre_hook(lambda m, a, i=i: region.__setitem__(0, f"L{i}"))
    base.model.norm.register_forward_pre_hook(lambda m, a: region.__setitem__(0, "head"))
    ids = torch.randint(0, BASE["vocab_size"], (BATCH, SEQ))  # type: ignore[arg-type]
    with (
        torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast),
        torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x),
    ):
        out = model(input_ids=ids, labels=ids, use_cache=False)
    out.loss.backward()
    h, v = BASE["hidden_size"], BASE["vocab_size"]
    layer_inputs = [(d, n) for r, d, s, n in seen.values() if r.startswith("L")]
    return {
        "layer1_saved": sum(n for r, d, s, n in seen.values() if r == "L1"),
        "fp32_params": fp32_base,
        "fp32_layer_inputs": sum(d == torch.float32 for d, _ in layer_inputs),
        "layer_input_bytes": sum(n for _, n in layer_inputs),
        "head_copy_bytes": sum(n for r, d, s, n in seen.values() if r == "head" and s == (h, v)),
        "logits_dtype": out.logits.dtype,
    }


@pytest.mark.parametrize("family", sorted(CONFIGS))
@pytest.mark.parametrize("mode", ["peft", "norms"])
def test_planner_matches_peft_on_a_tiny_model(family: str, mode: str) -> None:
    config = CONFIGS[family]
    inputs = _inputs(config, kbit_preparation=None if mode == "peft" else "norms")
    t = inputs.training
    prep = kbit_preparation(inputs, t, plain=True, unquantised=qlora_unquantised_params(inputs, t))
    assert prep is not None and prep.mode == mode
    measured = _run(config, trl_bf16=mode == "norms")
    assert prep.upcast_params == measured["fp32_params"]
    assert prep.fp32_layers == measured["fp32_layer_inputs"]
    tokens, h = BATCH * SEQ, BASE["hidden_size"]
    zero = ZeroSettings(stage=0)
    act16 = activations_for(inputs, t, zero)
    act32 = activation_bytes(
        inputs.model, micro_batch=BATCH, seq_len=SEQ, attn_impl="sdpa", gradient_checkpointing=True, dtype_bytes=4,
        lora_rank=RANK, lora_targets=("all-linear",), lora_adapter_bytes=4,
    )  # fmt: skip
    cost = stream_cost(act16, act32, prep, checkpointing=True, dtype_bytes=2)
    # the checkpointed inputs as autograd kept them, against the 16-bit ones the activation estimate charges
    assert act16.checkpointed_input * act16.layers + cost.saved == measured["layer_input_bytes"]
    assert cost.saved == prep.fp32_layers * tokens * h * 2
    # the logits stay 16-bit under autocast; PEFT's fp32 head is copied to bf16 and kept for backward
    assert str(measured["logits_dtype"]) == "torch.bfloat16"
    head_copy = 2 * h * BASE["vocab_size"] if mode == "peft" else 0  # type: ignore[operator]
    assert cost.head_copy == measured["head_copy_bytes"] == head_copy


@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_an_fp32_layer_bounds_what_a_prepared_layer_keeps(family: str) -> None:
    """Without checkpointing a prepared layer keeps exactly what the fp32 estimate says when no autocast runs (a
    custom loop), and less under autocast (matmuls and SDPA in bf16): the bound the stream item charges for the
    recomputed layer."""
    config = CONFIGS[family]
    inputs = _inputs(config)
    fp32 = activation_bytes(
        inputs.model, micro_batch=BATCH, seq_len=SEQ, attn_impl="sdpa", gradient_checkpointing=False, dtype_bytes=4,
        lora_rank=RANK, lora_targets=("all-linear",), lora_adapter_bytes=4,
    )  # fmt: skip
    plain = _run(config, trl_bf16=False, checkpointing=False, autocast=False)["layer1_saved"]
    mixed = _run(config, trl_bf16=False, checkpointing=False, autocast=True)["layer1_saved"]
    assert plain == fp32.per_layer_saved
    assert mixed < fp32.per_layer_saved  # type: ignore[operator]


def _items(inputs: PlanInputs, zero: ZeroSettings) -> dict[str, int]:
    plan = plan_strategy(inputs, zero)
    return {i.name: i.bytes for i in plan.phase("steady").gpu}


def test_items_only_where_the_upcasts_survive() -> None:
    config = CONFIGS["llama"]
    plain = ZeroSettings(stage=0)
    items = _items(_inputs(config), plain)
    assert items[KBIT_PARAMS_ITEM] > 0 and items[KBIT_STREAM_ITEM] > 0
    # DeepSpeed casts every float parameter back to bf16 when the engine is built
    stage2 = ZeroSettings(stage=2)
    assert KBIT_PARAMS_ITEM not in _items(replace(_inputs(config), zero=stage2), stage2)
    # LLaMA-Factory prepares the model itself (upcast_layernorm off by default); a script that says none
    assert KBIT_PARAMS_ITEM not in _items(_inputs(config, framework="llamafactory"), plain)
    assert KBIT_PARAMS_ITEM not in _items(_inputs(config, kbit_preparation="none"), plain)
    # PEFT skips the cast for GPTQ models; XTuner calls PEFT's
    assert KBIT_PARAMS_ITEM not in _items(_inputs(config, quant_method="gptq"), plain)
    assert KBIT_PARAMS_ITEM in _items(_inputs(config, framework="xtuner"), plain)
    # PlanInputs built with no framework (a library call; the benchmark's litgpt/torchtune runs): not assumed. The
    # CLI never gets here: it takes an unnamed launcher as hf (test_cli_takes_an_unnamed_launcher_as_hf)
    assert KBIT_PARAMS_ITEM not in _items(_inputs(config, framework=None), plain)


def test_modules_to_save_copies_of_upcast_originals_are_fp32() -> None:
    """get_peft_model deep-copies a `modules_to_save` module after the preparation made it fp32 (PEFT mode); TRL's
    bf16 recast puts embed_tokens/lm_head, copies included, back in bf16."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("peft")
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
    from transformers import AutoConfig, AutoModelForCausalLM

    config = CONFIGS["llama"]
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**config), dtype=torch.bfloat16)
    model.is_loaded_in_4bit = True
    model = get_peft_model(
        prepare_model_for_kbit_training(model),
        LoraConfig(r=RANK, target_modules=["q_proj"], modules_to_save=["lm_head"]),
    )
    copy = next(p for n, p in model.named_parameters() if "modules_to_save" in n)
    inputs = _inputs(config, trainable_modules=("lm_head",))
    groups = plain_trainable_groups(inputs, inputs.training)
    assert groups == ((plain_trainable_bytes(inputs, inputs.training) // 4, 4),)
    assert copy.dtype == torch.float32 and copy.element_size() == groups[0][1]
    trl = _inputs(config, trainable_modules=("lm_head",), kbit_preparation="norms")
    assert dict((b, n) for n, b in plain_trainable_groups(trl, trl.training))[2] == copy.numel()


def test_llamafactory_upcast_layernorm_reaches_the_plan(tmp_path: Path) -> None:
    """LLaMA-Factory never calls PEFT's preparation; its own `upcast_layernorm: true` (default off) puts the norm
    weights in fp32, which in a QLoRA run without DeepSpeed is TRL's "norms" case."""
    from zerodoctor.plan.inputs import PlanOptions, load_inputs

    args = tmp_path / "qlora.yaml"
    base = (
        "model_name_or_path: meta-llama/Llama-3.1-8B\nstage: sft\nfinetuning_type: lora\nquantization_bit: 4\n"
        "bf16: true\nper_device_train_batch_size: 1\ncutoff_len: 1024\n"
    )
    opts = PlanOptions(
        files=(str(args),), gpus_per_node=1, gpu_memory_gib=80, host_ram_gib=512, framework="llamafactory"
    )
    args.write_text(base)
    inputs = load_inputs(opts)
    assert inputs.training.method == "qlora" and inputs.training.kbit_preparation is None
    assert KBIT_STREAM_ITEM not in _items(inputs, ZeroSettings(stage=0))
    args.write_text(base + "upcast_layernorm: true\n")
    inputs = load_inputs(opts)
    assert inputs.training.kbit_preparation == "norms"
    items = _items(inputs, ZeroSettings(stage=0))
    assert items[KBIT_STREAM_ITEM] > 0 and KBIT_PARAMS_ITEM in items


def test_cli_takes_an_unnamed_launcher_as_hf(run_cli) -> None:
    """`plan`/`check` read a run through load_inputs -> inputs_from_run, which names "hf" when nothing names the
    launcher: a QLoRA run read that way gets PEFT's preparation (HF Trainer's default), not the "none" of PlanInputs
    built directly; `--framework` changes it."""
    import json

    from zerodoctor.plan.inputs import PlanOptions, load_inputs

    opts = PlanOptions(model="meta-llama/Llama-3.1-8B", method="qlora", gpus_per_node=1, gpu_memory_gib=80,
                       host_ram_gib=512)  # fmt: skip
    inputs = load_inputs(opts)
    assert inputs.training.method == "qlora" and inputs.framework == "hf"
    assert any(n.startswith("launcher unknown: assuming HF Trainer") for n in inputs.notes)
    items = _items(inputs, ZeroSettings(stage=0))
    assert items[KBIT_PARAMS_ITEM] > 0 and items[KBIT_STREAM_ITEM] > 0
    (item,) = [i for i in plan_strategy(inputs, ZeroSettings(stage=0)).phase("steady").gpu if i.name == KBIT_PARAMS_ITEM]
    # what the user reads names the function and the launcher guessed, and how to change the guess
    assert item.detail.startswith("PEFT's prepare_model_for_kbit_training (what HF Trainer does by default; pass --framework")
    named = load_inputs(replace(opts, framework="llamafactory"))
    assert KBIT_PARAMS_ITEM not in _items(named, ZeroSettings(stage=0))
    code, out, err = run_cli(
        "plan", "--model", "meta-llama/Llama-3.1-8B", "--method", "qlora", "--gpus-per-node", "1",
        "--gpu-memory", "80", "--host-ram", "128", "--format", "json",
    )  # fmt: skip
    doc = json.loads(out)  # exit code 1 or 0 by the verdict; the JSON is written either way
    assert doc["framework"] == "hf" and any("assuming HF Trainer where it matters" in n for n in doc["notes"])
