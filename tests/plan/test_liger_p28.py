"""Liger Kernel in the planner (issue 9): the fused linear cross-entropy instead of the logits and the loss, the
RMSNorm / SwiGLU saved tensors, and the framework arguments that switch it on (plan/liger.py)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from zerodoctor.models import resolve_model
from zerodoctor.plan.activations import activation_bytes
from zerodoctor.plan.inputs import GIB, Cluster, PlanInputs, Training, ZeroSettings
from zerodoctor.plan.liger import flce_chunk_rows, fused_linear_ce_bytes, liger_kernels
from zerodoctor.plan.phases import LIGER_LOSS_ITEM, liger_for, plan_strategy

MODEL = "qwen2.5-0.5b"
B, S = 1, 4096


def _spec():
    return resolve_model(MODEL)


def _shape(version: str | None):
    """Tokens, hidden, vocab, dtype bytes of the test model and its Liger kernels at `version`."""
    p = _spec().params
    kernels = liger_kernels("qwen2", version)
    assert kernels is not None
    return B * S, p.hidden_size, p.vocab_size, 2, kernels


def test_chunk_rows_follow_the_source_formula() -> None:
    # fused_linear_cross_entropy_forward's own comment: BT = 4096*4, V = 32000, H = 4096 -> inc_factor 8, chunk 2048
    assert flce_chunk_rows(4096 * 4, 4096, 32000) == 2048
    # Qwen2.5-7B at 16k tokens: cdiv(152064, 3584) = 43, cdiv(16384, 43) = 382 -> next power of two 512
    assert flce_chunk_rows(16384, 3584, 152064) == 512
    # never more rows than tokens
    assert flce_chunk_rows(3, 4096, 4096) == 3


def test_kernels_by_model_type_and_version() -> None:
    assert liger_kernels("gpt_neox", None) is None  # no apply_liger_kernel_to_<type>: trains as the HF model
    dense = liger_kernels("qwen2", None)
    assert dense is not None and dense.fused_linear_ce and dense.rms_norm and dense.swiglu
    assert dense.weight_grad_copy  # unknown version: a current release (>= 0.6.2)
    old = liger_kernels("llama", "0.6.1")
    assert old is not None and not old.weight_grad_copy  # addmm into grad_weight up to 0.6.1
    assert liger_kernels("llama", "0.6.2").weight_grad_copy  # type: ignore[union-attr]
    moe = liger_kernels("mixtral", "0.5.10")
    assert moe is not None and moe.fused_linear_ce and not moe.swiglu  # MoE layers keep the HF count here


def test_fused_loss_replaces_the_logits_terms() -> None:
    spec = _spec()
    p = spec.params
    t, h, v, d, kernels = _shape("0.5.10")
    hf = activation_bytes(spec, micro_batch=B, seq_len=S, attn_impl="flash", gradient_checkpointing=True)
    lig = activation_bytes(
        spec, micro_batch=B, seq_len=S, attn_impl="flash", gradient_checkpointing=True, liger=kernels
    )
    # transformers' loss holds the 16-bit logits, the fp32 upcast and the fp32 log-probabilities at once
    assert hf.logits_and_loss >= (d + 4 + 4) * t * v
    f = lig.fused_loss
    assert f is not None
    rows = flce_chunk_rows(t, h, v)
    assert (f.chunk_rows, f.chunks) == (rows, -(-t // rows))
    # saved for backward: grad_input (T x h) and grad_weight (V x h) in the model dtype; in its forward the final
    # hidden states, the fp32 loss + bool mask per token, one chunk of logits and the chunk's input-gradient product
    assert f.saved == d * t * h + d * v * h
    assert f.transient == d * t * h + 5 * t + d * rows * v + d * rows * h
    assert lig.logits_and_loss == f.transient < d * t * v
    # at the loss: the checkpointed inputs + embedding ids + the final LigerRMSNorm (input + rstd) + the function
    kept = p.num_layers * d * t * h + 8 * t
    assert lig.at_loss == kept + (d * t * h + 4 * t) + f.saved + f.transient
    assert lig.peak < hf.peak
    assert lig.fused_loss_peak == lig.peak - max(kept + d * t * h + 4 * t, lig.in_backward)


def test_weight_gradient_copy_from_062_and_a_frozen_head() -> None:
    t, h, v, d, new = _shape("0.6.2")
    f = fused_linear_ce_bytes(tokens=t, hidden=h, vocab=v, dtype_bytes=d, head_trainable=True, kernels=new)
    assert f.chunk_step == v * h * (d + 4)  # torch.mm(...) in bf16 and its .float() copy
    frozen = fused_linear_ce_bytes(tokens=t, hidden=h, vocab=v, dtype_bytes=d, head_trainable=False, kernels=new)
    assert frozen.grad_weight == 0 and frozen.chunk_step == d * flce_chunk_rows(t, h, v) * h
    charged = fused_linear_ce_bytes(
        tokens=t, hidden=h, vocab=v, dtype_bytes=d, head_trainable=True, kernels=replace(new, head_grad_charged=True)
    )
    assert charged.grad_weight == 0 and charged.grad_input == d * t * h


@pytest.mark.parametrize("lora", [False, True])
def test_rmsnorm_and_swiglu_saved_tensors(lora: bool) -> None:
    spec = _spec()
    p = spec.params
    t, h, i, d = B * S, p.hidden_size, p.intermediate_size, 2
    kernels = liger_kernels("qwen2", None)
    assert kernels is not None
    kw = {"micro_batch": B, "seq_len": S, "attn_impl": "sdpa", "lora_rank": 8 if lora else 0}
    hf = activation_bytes(spec, **kw)  # type: ignore[arg-type]
    lig = activation_bytes(spec, liger=kernels, **kw)  # type: ignore[arg-type]
    # per norm: HF keeps the fp32 input copy + rsqrt (+ the 16-bit normalised tensor with a trainable weight),
    # LigerRMSNorm its 16-bit input + fp32 rstd; per MLP SwiGLU keeps gate and up outputs, not SiLU's output
    norm_delta = (4 * t * h + (0 if lora else d * t * h)) - d * t * h
    assert hf.per_layer_saved - lig.per_layer_saved == 2 * norm_delta + d * t * i
    assert lig.liger_layer_delta > 0


def _inputs(*, liger: bool, method: str = "full", version: str | None = "0.6.1") -> PlanInputs:
    return PlanInputs(
        model=_spec(),
        cluster=Cluster(1, 4, 80 * GIB, 512 * GIB),
        training=Training(
            method=method, micro_batch=1, seq_len=8192, attn="flash", gradient_checkpointing=True, liger_kernel=liger
        ),
        framework="hf",
        liger_version=version,
    )


def _steady(inputs: PlanInputs, zero: ZeroSettings) -> dict[str, int]:
    return {i.name: i.bytes for i in plan_strategy(inputs, zero).phase("steady").gpu}


def test_plan_shows_the_fused_loss_item() -> None:
    zero = ZeroSettings(stage=3)
    on, off = _inputs(liger=True), _inputs(liger=False)
    items_on, items_off = _steady(on, zero), _steady(off, zero)
    assert LIGER_LOSS_ITEM in items_on and LIGER_LOSS_ITEM not in items_off
    # the logits and the loss are gone from the activation item
    assert items_on["activations + logits/loss"] < items_off["activations + logits/loss"]
    # ZeRO-3, full fine-tuning: the head's gradient made in the forward is the full-size gradient item's tensor
    kernels = liger_for(on, on.training, zero)
    assert kernels is not None and kernels.head_grad_charged
    assert liger_for(on, on.training, ZeroSettings(stage=1)).head_grad_charged is False  # type: ignore[union-attr]
    # preference training keeps the logits (fused loss off), RMSNorm/SwiGLU stay (tests/plan/test_liger_p33.py)
    paired = liger_for(on, replace(on.training, paired_inputs=True), zero)
    assert paired is not None and not paired.fused_linear_ce and paired.rms_norm


def _plan_json(run_cli, *files: str) -> dict[str, int]:
    cluster = ("--nodes", "1", "--gpus-per-node", "4", "--gpu-memory", "80", "--host-ram", "512", "--format", "json")
    code, out, err = run_cli("plan", *files, *cluster)
    assert code in (0, 1), err
    phases = json.loads(out)["yours"]["phases"]
    steady = next(p for p in phases if p["name"] == "steady")
    return {i["name"]: i["bytes"] for i in steady["gpu"]}


HF_ARGS = (
    "model_name_or_path: Qwen/Qwen2.5-0.5B\noutput_dir: out\ndeepspeed: ds.json\nbf16: true\n"
    "per_device_train_batch_size: 1\nmax_length: 4096\ngradient_checkpointing: true\n"
)


@pytest.mark.parametrize(
    ("text", "on"),
    [
        (HF_ARGS + "use_liger_kernel: true\n", True),  # TrainingArguments / TRL SFTConfig / ms-swift
        (HF_ARGS + 'use_liger_kernel: "false"\n', False),
        (HF_ARGS, False),
    ],
)
def test_hf_arguments_switch_it(run_cli, tmp_path: Path, text: str, on: bool) -> None:
    (tmp_path / "ds.json").write_text('{"zero_optimization": {"stage": 3}}')
    args = tmp_path / "args.yaml"
    args.write_text(text)
    assert (LIGER_LOSS_ITEM in _plan_json(run_cli, str(args))) is on


def test_hf_arguments_json_and_the_flag(run_cli, tmp_path: Path) -> None:
    (tmp_path / "ds.json").write_text('{"zero_optimization": {"stage": 3}}')
    args = tmp_path / "args.json"
    args.write_text(
        json.dumps(
            {"model_name_or_path": "Qwen/Qwen2.5-0.5B", "output_dir": "out", "deepspeed": "ds.json", "bf16": True,
             "per_device_train_batch_size": 1, "use_liger_kernel": True}
        )
    )  # fmt: skip
    assert LIGER_LOSS_ITEM in _plan_json(run_cli, str(args))
    # the command-line flag wins over the file
    assert LIGER_LOSS_ITEM not in _plan_json(run_cli, str(args), "--no-liger-kernel")


def test_llamafactory_enable_liger_kernel(tmp_path: Path) -> None:
    from zerodoctor.plan.inputs import PlanOptions, load_inputs

    args = tmp_path / "sft.yaml"
    base = (
        "model_name_or_path: Qwen/Qwen2.5-0.5B\nstage: sft\nfinetuning_type: full\nbf16: true\n"
        "per_device_train_batch_size: 1\ncutoff_len: 2048\n"
    )
    opts = PlanOptions(files=(str(args),), gpus_per_node=1, gpu_memory_gib=80, host_ram_gib=512)
    args.write_text(base)
    assert not load_inputs(opts).training.liger_kernel
    args.write_text(base + "enable_liger_kernel: true\n")
    inputs = load_inputs(opts)
    assert inputs.training.liger_kernel and inputs.framework == "llamafactory"
    assert inputs.run is not None and inputs.run.liger_kernel is not None
    assert "sft.yaml" in inputs.run.liger_kernel.origin.describe()


def test_allocator_replays_the_chunks_not_the_logits() -> None:
    """The allocator replay (plan/allocator.py) of a Liger step allocates one chunk of logits at a time and never the
    T x V logits, their fp32 upcast or the log-probabilities; without Liger it does."""
    from zerodoctor.plan.allocator import Alloc, step_shape, training_events

    zero = ZeroSettings(stage=3)
    p = _spec().params
    t, d = 8192, 2
    sizes = {}
    for liger in (False, True):
        inputs = _inputs(liger=liger)
        shape = step_shape(inputs, zero, inputs.training, exact_load=False)
        events = training_events(shape, steps=1, simulated_layers=2)
        sizes[liger] = {e.nbytes for e in events if isinstance(e, Alloc)}
    rows = flce_chunk_rows(t, p.hidden_size, p.vocab_size)
    assert d * t * p.vocab_size in sizes[False] and 4 * t * p.vocab_size in sizes[False]
    assert not {d * t * p.vocab_size, 4 * t * p.vocab_size} & sizes[True]
    assert d * rows * p.vocab_size in sizes[True]


def test_trl_sft_config_with_packing_plans_the_packed_row(run_cli, tmp_path: Path) -> None:
    """A TRL `trl sft --config` file: `use_liger_kernel` switches the fused loss on; `packing` / `padding_free` need no
    key of their own, the packed row is planned at `max_length` (the cap)."""
    (tmp_path / "ds.json").write_text('{"zero_optimization": {"stage": 3}}')
    args = tmp_path / "sft.yaml"
    args.write_text(
        "model_name_or_path: Qwen/Qwen2.5-0.5B\ndataset_name: trl-lib/Capybara\noutput_dir: out\ndeepspeed: ds.json\n"
        "bf16: true\nper_device_train_batch_size: 2\nmax_length: 4096\npacking: true\npadding_free: true\n"
        "attn_implementation: flash_attention_2\ngradient_checkpointing: true\nuse_liger_kernel: true\n"
    )
    cluster = ("--nodes", "1", "--gpus-per-node", "4", "--gpu-memory", "80", "--host-ram", "512", "--format", "json")
    code, out, err = run_cli("plan", str(args), *cluster)
    assert code in (0, 1), err
    steady = next(p for p in json.loads(out)["yours"]["phases"] if p["name"] == "steady")["gpu"]
    act = next(i for i in steady if i["name"] == "activations + logits/loss")
    assert "micro batch 2 x seq 4096" in act["detail"] and "flash" in act["detail"]
    fused = next(i for i in steady if i["name"] == LIGER_LOSS_ITEM)
    p = _spec().params
    assert f"{-(-2 * 4096 // flce_chunk_rows(2 * 4096, p.hidden_size, p.vocab_size))} chunk(s)" in fused["detail"]
