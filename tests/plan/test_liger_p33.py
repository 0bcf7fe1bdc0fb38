"""Liger Kernel in the planner, review R2 of issue 9: LoRA through the HF Trainer before transformers 4.49, Granite's
default without the fused loss, `liger_kernel_config` / TRL `use_liger` / `use_liger_loss`, and preference training
(plan/liger.py, phases.liger_plan)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from zerodoctor.models import resolve_model
from zerodoctor.plan.activations import activation_bytes
from zerodoctor.plan.inputs import GIB, Cluster, PlanInputs, PlanOptions, Training, ZeroSettings, load_inputs
from zerodoctor.plan.liger import FUSED_CE_OFF_TYPES, LIGER_MODEL_TYPES, liger_kernels
from zerodoctor.plan.phases import LIGER_LOSS_ITEM, liger_for, plan_strategy

ACT = "activations + logits/loss"
ZERO3 = ZeroSettings(stage=3)


def _inputs(
    model: str = "qwen2.5-0.5b", framework: str | None = "hf", transformers: str | None = None, **t
) -> PlanInputs:
    training = dict(method="lora", micro_batch=1, seq_len=4096, attn="flash", gradient_checkpointing=True)
    training.update({"liger_kernel": True, **t})
    return PlanInputs(
        model=resolve_model(model),
        cluster=Cluster(1, 4, 80 * GIB, 512 * GIB),
        training=Training(**training),  # type: ignore[arg-type]
        framework=framework,
        transformers_version=transformers,
        liger_version="0.6.2",
    )


def _steady(inputs: PlanInputs) -> dict[str, tuple[int, str]]:
    return {i.name: (i.bytes, i.detail) for i in plan_strategy(inputs, ZERO3).phase("steady").gpu}


# ---- 1. LoRA through the HF Trainer: no Liger before transformers 4.49 -------------------------------------------


@pytest.mark.parametrize(
    ("framework", "transformers", "at_load", "applied"),
    [
        (
            "hf",
            "4.46.3",
            False,
            False,
        ),  # Trainer.__init__ patches only a PreTrainedModel (transformers#34016)
        ("hf", "4.48.3", False, False),
        ("hf", "4.49.0", False, True),  # transformers#35680: model.get_base_model() patched
        ("hf", None, False, False),  # unknown version: the larger case
        ("llamafactory", "4.46.3", False, True),  # LLaMA-Factory patches the classes before loading
        ("hf", "4.46.3", True, True),  # TRL < 0.16 `use_liger`: AutoLigerKernelForCausalLM before PEFT
    ],
)
def test_peft_through_the_trainer_before_449_gets_no_liger(
    framework: str, transformers: str | None, at_load: bool, applied: bool
) -> None:
    inputs = _inputs(framework=framework, transformers=transformers, liger_at_load=at_load)
    assert (liger_for(inputs, inputs.training, ZERO3) is not None) is applied
    items = _steady(inputs)
    assert (LIGER_LOSS_ITEM in items) is applied
    if not applied:
        detail = items[ACT][1]
        assert "PeftModel" in detail and "transformers#34016" in detail
        assert (f"transformers {transformers}" if transformers else "version unknown") in detail
        # the same run planned with Liger off: the same activations
        off = _steady(replace(inputs, training=replace(inputs.training, liger_kernel=False)))
        assert items[ACT][0] == off[ACT][0]


def test_full_fine_tuning_is_patched_on_old_transformers() -> None:
    inputs = _inputs(transformers="4.46.3", method="full")
    assert liger_for(inputs, inputs.training, ZERO3) is not None


# ---- 2. Granite: fused_linear_cross_entropy=False by default --------------------------------------------------------


def test_granite_keeps_its_logits() -> None:
    assert "granite" in FUSED_CE_OFF_TYPES and FUSED_CE_OFF_TYPES <= LIGER_MODEL_TYPES
    kernels = liger_kernels("granite", None)
    assert kernels is not None and not kernels.fused_linear_ce
    inputs = _inputs(model="granite-3-8b", transformers="4.49.0")
    assert inputs.model.model_type == "granite"
    items = _steady(inputs)
    assert LIGER_LOSS_ITEM not in items
    assert "apply_liger_kernel_to_granite defaults to fused_linear_cross_entropy=False" in items[ACT][1]
    off = _steady(replace(inputs, training=replace(inputs.training, liger_kernel=False)))
    assert (
        items[ACT][0] == off[ACT][0]
    )  # granite's norms/MLP are not the Llama-layer count here: HF as a whole
    # a config that asks for the fused loss gets it
    asked = replace(
        inputs, training=replace(inputs.training, liger_kernel_config=(("fused_linear_cross_entropy", True),))
    )
    assert LIGER_LOSS_ITEM in _steady(asked)


# ---- 3. liger_kernel_config, TRL use_liger / use_liger_loss -----------------------------------------------------


def test_liger_kernel_config_switches_kernels_off() -> None:
    kernels = liger_kernels("qwen2", None, {"fused_linear_cross_entropy": False, "swiglu": False})
    assert kernels is not None and not kernels.fused_linear_ce and kernels.rms_norm and not kernels.swiglu
    inputs = _inputs(
        method="full", liger_kernel_config=(("fused_linear_cross_entropy", False), ("rope", True))
    )
    items = _steady(inputs)
    assert LIGER_LOSS_ITEM not in items
    assert "liger_kernel_config fused_linear_cross_entropy: false" in items[ACT][1]
    assert "Liger RMSNorm and SwiGLU save" in items[ACT][1]  # the norm/MLP patches stay


HF = (
    "model_name_or_path: Qwen/Qwen2.5-0.5B\noutput_dir: out\nbf16: true\nper_device_train_batch_size: 1\n"
    "max_length: 2048\ngradient_checkpointing: true\n"
)


def _load(tmp_path: Path, text: str) -> PlanInputs:
    args = tmp_path / "args.yaml"
    args.write_text(text)
    return load_inputs(PlanOptions(files=(str(args),), gpus_per_node=1, gpu_memory_gib=80, host_ram_gib=512))


def test_arguments_liger_kernel_config_and_trl_use_liger(tmp_path: Path) -> None:
    inputs = _load(
        tmp_path, HF + "use_liger_kernel: true\nliger_kernel_config:\n  fused_linear_cross_entropy: false\n"
    )
    assert inputs.training.liger_kernel
    assert inputs.training.liger_kernel_config == (("fused_linear_cross_entropy", False),)
    inputs = _load(tmp_path, HF + "use_liger_kernel: true\nliger_kernel_config: '{\"rms_norm\": false}'\n")
    assert inputs.training.liger_kernel_config == (("rms_norm", False),)
    inputs = _load(tmp_path, HF + "use_liger: true\n")  # TRL < 0.16 SFTConfig
    assert inputs.training.liger_kernel and inputs.training.liger_at_load
    assert not _load(tmp_path, HF + "use_liger_kernel: true\n").training.liger_at_load


def test_trl_use_liger_loss_is_said_not_modelled(tmp_path: Path) -> None:
    inputs = _load(tmp_path, HF + "use_liger_loss: true\n")
    assert not inputs.training.liger_kernel
    assert any("use_liger_loss" in n and "upper bound" in n and "args.yaml" in n for n in inputs.notes)
    assert not any("use_liger_loss" in n for n in _load(tmp_path, HF).notes)


# ---- 4. preference training: fused loss off, RMSNorm/SwiGLU kept; the reason in the user's values --------------


@pytest.mark.parametrize("field", ["paired_inputs", "reference_model"])
def test_preference_training_keeps_logits_and_the_layer_kernels(field: str) -> None:
    inputs = _inputs(framework="llamafactory", method="full", **{field: True})
    kernels = liger_for(inputs, inputs.training, ZERO3)
    assert kernels is not None and not kernels.fused_linear_ce and kernels.rms_norm and kernels.swiglu
    assert not kernels.head_grad_charged
    items = _steady(inputs)
    assert LIGER_LOSS_ITEM not in items
    detail = items[ACT][1]
    assert ("paired (chosen/rejected) inputs" if field == "paired_inputs" else "a reference model") in detail
    assert "Liger RMSNorm and SwiGLU save" in detail and "not applied" not in detail
    off = _steady(replace(inputs, training=replace(inputs.training, liger_kernel=False)))
    assert items[ACT][0] < off[ACT][0]


def test_unpatched_model_type_is_named() -> None:
    inputs = _inputs(model="gpt2", method="full")
    assert liger_for(inputs, inputs.training, ZERO3) is None
    assert "no patch for model_type 'gpt2'" in _steady(inputs)[ACT][1]


# ---- R2 item 8: the HF re-estimate gets every argument ----------------------------------------------------------


def test_layer_delta_reestimates_the_same_step() -> None:
    spec = resolve_model("qwen2.5-0.5b")
    kernels = liger_kernels("qwen2", None)
    assert kernels is not None
    kw = dict(
        micro_batch=2, seq_len=1024, attn_impl="sdpa", lora_rank=8, lora_dropout=0.1, trainable_layers=None
    )
    lig = activation_bytes(spec, liger=kernels, **kw)  # type: ignore[arg-type]
    hf = activation_bytes(spec, liger=replace(kernels, rms_norm=False, swiglu=False), **kw)  # type: ignore[arg-type]
    assert lig.liger_layer_delta == (hf.peak - hf.fused_loss_peak) - (lig.peak - lig.fused_loss_peak) > 0


# ---- R2 item 5: the head's / embedding's fp64 norm slice is taken outside any layer's backward -------------------


def test_head_sized_norm_slice_sits_beside_the_kept_layers_only() -> None:
    from zerodoctor.plan.activations import ActivationEstimate
    from zerodoctor.plan.phases import NORM_BYTES, offload_norm_items

    # 4 GiB kept layers + a 1 GiB recomputed layer (in_backward 5 GiB, the peak, as under Liger); a 1 GiB fp64 head
    # slice: 4 + 1 = 5 GiB beside the kept layers -> nothing over the peak (the old charge: 5 + 1 - 5 = 1 GiB); the
    # largest layer tensor's slice (1/8 GiB) beside the recomputed layer is what goes over it
    act = ActivationEstimate(
        per_layer_saved=0, layers=1, checkpointed_input=0, saved_total=4 * GIB, logits_and_loss=0,
        backward_transient=GIB, peak=5 * GIB, in_backward=5 * GIB,
    )  # fmt: skip
    head = GIB // NORM_BYTES
    (old,) = offload_norm_items(act, largest_trainable=head, partition=10 * GIB)
    assert old.bytes == GIB  # not known to be the head: charged beside the recomputed layer
    (item,) = offload_norm_items(
        act, largest_trainable=head, partition=10 * GIB, largest_layer_tensor=head // 8
    )
    assert item.bytes == GIB // 8 and f"{head // 8:,} elements" in item.detail
    (item,) = offload_norm_items(
        act, largest_trainable=head, partition=10 * GIB, largest_layer_tensor=head // 2
    )
    assert item.bytes == GIB // 2 and f"{head // 2:,} elements" in item.detail


def test_full_fine_tuning_names_the_largest_layer_tensor() -> None:
    from zerodoctor.plan.phases import _head_largest_layer_tensor

    inputs = _inputs(model="llama-3.1-8b", method="full")
    assert _head_largest_layer_tensor(inputs, inputs.training) == 4096 * 14336  # gate/up/down_proj
    assert _head_largest_layer_tensor(inputs, replace(inputs.training, method="lora")) is None
    # without Liger's fused loss the head's slice keeps its old, larger charge
    assert _head_largest_layer_tensor(inputs, replace(inputs.training, liger_kernel=False)) is None


# ---- R2 item 6: the allocator replays LigerRMSNorm and LigerSiLUMulFunction -------------------------------------


def test_allocator_replays_liger_norm_and_swiglu() -> None:
    """Under Liger no fp32 T x h copy of a norm's input and no SiLU tensor are allocated (ops/rms_norm.py,
    ops/swiglu.py); the norms and SwiGLU of an HF step are replayed as before."""
    from zerodoctor.plan.allocator import Alloc, step_shape, training_events

    def sizes(liger: bool) -> list[int]:
        inputs = _inputs(method="full", liger_kernel=liger, transformers="4.49.0")
        shape = step_shape(inputs, ZERO3, inputs.training, exact_load=False)
        assert shape.liger_norm is liger and shape.liger_swiglu is liger
        return [e.nbytes for e in training_events(shape, steps=1, simulated_layers=2) if isinstance(e, Alloc)]

    p = resolve_model("qwen2.5-0.5b").params
    t, h, i = 4096, p.hidden_size, p.intermediate_size
    hf, lig = sizes(False), sizes(True)
    assert hf.count(4 * t * h) > 0 and lig.count(4 * t * h) == 0  # x.to(fp32) and its products
    assert lig.count(4 * t) > 0  # the fp32 RSTD per row
    # per layer and pass: HF gate, silu, up, prod, gprod, gup, gsilu, ggate; Liger gate, up, c, dc (in place after)
    assert lig.count(2 * t * i) < hf.count(2 * t * i)
