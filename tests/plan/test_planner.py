"""The planner assembly: inputs -> phases -> candidates -> findings, on the seed scenarios (BRIEF.md)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from zerodoctor.errors import PlanError, SetupError
from zerodoctor.plan.candidates import plan
from zerodoctor.plan.emit import ds_config
from zerodoctor.plan.inputs import GB, GIB, PlanOptions, ZeroSettings, build_inputs, load_inputs
from zerodoctor.plan.phases import plan_strategy

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def inputs(**kw):
    base = dict(nodes=1, gpus_per_node=8, gpu_memory_gib=80, host_ram_gib=1024)
    base.update(kw)
    return build_inputs(PlanOptions(**base))


# ---- DONE-WHEN: the three seed numbers ---------------------------------------------------------------


def test_yi34b_full_offload_both_needs_600_plus_gb_host_per_node():
    """Seed 002 / failures.md A3: Yi-34B full FT, ZeRO-3 optimizer+param offload, one 8-GPU node."""
    i = inputs(model="yi-34b", framework="xtuner", seq_len=4096)
    p = plan_strategy(i, ZeroSettings(stage=3, offload_optimizer="cpu", offload_param="cpu"))
    first = p.phase("first_step")
    assert first.host_bytes > 600 * GB  # the article's "1 TB" advice
    assert first.host_bytes < 1100 * GB
    # The jump at the first optimizer step is the lazily allocated Adam state: 8 B/param on the node (beside the
    # process baseline growing from its load to its training size).
    baseline = {
        ph: next(it.bytes for it in p.phase(ph).host if it.name == "process baseline")
        for ph in ("load", "first_step")
    }
    jump = (
        first.host_bytes
        - p.phase("load").host_bytes
        + sum(it.bytes for it in p.phase("load").host if "shards" in it.name)
        - (baseline["first_step"] - baseline["load"])
    )
    assert jump == pytest.approx(8 * i.model.params.total, rel=0.02)
    assert p.gpu_peak()[0] < 80 * GIB


def test_deepseek_236b_48_gpus_first_step_and_save():
    """Seed 004 / failures.md A5: 236B on 48 x 80 GB, LLaMA-Factory."""
    i = inputs(
        model="deepseek-coder-v2-instruct", nodes=6, framework="llamafactory", seq_len=2048, grad_accum=2
    )
    no_offload = plan_strategy(i, ZeroSettings(stage=3))
    assert no_offload.phase("first_step").gpu_bytes > 80 * GIB  # OOM at exp_avg_sq = zeros_like
    assert ("first_step", "gpu") in {(ph, w) for ph, w, *_ in no_offload.failing_phases(with_margin=False)}

    offload = plan_strategy(i, ZeroSettings(stage=3, offload_optimizer="cpu", offload_param="cpu"))
    assert offload.phase("first_step").gpu_bytes < 0.9 * 80 * GIB
    assert offload.phase("steady").gpu_bytes < 0.9 * 80 * GIB
    rank0 = next(it for it in offload.phase("save").host if it.name.startswith("rank 0"))
    assert rank0.bytes == pytest.approx(470 * GB, rel=0.02)  # 2 B x 235.7e9
    ck = offload.checkpoint
    assert ck.optimizer_bytes == pytest.approx(12 * i.model.params.total, rel=0.01)
    assert ck.save_only_model_skips_optimizer and ck.save_only_model_bytes == ck.weights_bytes


def test_llama3_70b_qlora_z3_without_quant_storage_loads_whole_model_per_gpu():
    """Seed 003 / failures.md A4."""
    i = inputs(model="llama-3-70b", method="qlora", framework="hf")
    assert i.training.quant_storage == "uint8"
    p = plan_strategy(i, ZeroSettings(stage=3))
    whole = next(it for it in p.phase("load").gpu if it.name.startswith("whole 4-bit model"))
    assert 35 * GB < whole.bytes < 45 * GB  # 0.5 B/param + constants + 16-bit embeddings/lm_head
    # Not partitioned afterwards either: the frozen weights stay whole at the steady step.
    frozen = next(it for it in p.phase("steady").gpu if it.name.endswith("frozen16"))
    assert frozen.bytes > 35 * GB
    # With bnb_4bit_quant_storage=bfloat16 the load peak is the same but ZeRO-3 partitions afterwards.
    fixed = build_inputs(
        PlanOptions(
            model="llama-3-70b",
            method="qlora",
            quant_storage="bfloat16",
            nodes=1,
            gpus_per_node=8,
            gpu_memory_gib=80,
            host_ram_gib=1024,
            framework="hf",
        )
    )
    q = plan_strategy(fixed, ZeroSettings(stage=3))
    assert q.phase("load").gpu_bytes == pytest.approx(p.phase("load").gpu_bytes, rel=0.01)
    assert next(it for it in q.phase("steady").gpu if it.name.endswith("frozen16")).bytes < 6 * GB
    r = plan(i)
    f = next(f for f in r.findings if f.id == "PLAN004")
    assert f.severity.label == "error" and "bnb_4bit_quant_storage" in f.message
    assert "GiB per GPU" in f.message


# ---- inputs from files -----------------------------------------------------------------------------------


def test_llamafactory_files_give_model_method_batch_and_zero():
    d = EXAMPLES / "llamafactory-deepseek-coder-v2-z3-offload"
    i = load_inputs(
        PlanOptions(
            files=(str(d / "deepseek_coder_v2_full_sft.yaml"),),
            nodes=6,
            gpus_per_node=8,
            gpu_memory_gib=80,
            host_ram_gib=1024,
        )
    )
    assert i.model.params.total == 235_741_434_880
    assert i.framework == "llamafactory" and i.training.method == "full"
    assert (i.training.micro_batch, i.training.grad_accum, i.training.seq_len) == (1, 2, 2048)
    assert i.training.gradient_checkpointing  # LLaMA-Factory's default
    z = i.zero
    assert z is not None and (z.stage, z.offload_optimizer, z.offload_param) == (3, "cpu", "cpu")
    assert z.reduce_bucket_size == 5120 * 5120  # "auto" filled by HF from the hidden size
    assert z.gather_16bit_on_save and z.pin_memory
    # An explicit option wins over the file.
    j = load_inputs(
        PlanOptions(
            files=(str(d / "deepseek_coder_v2_full_sft.yaml"),),
            nodes=6,
            gpus_per_node=8,
            gpu_memory_gib=80,
            host_ram_gib=1024,
            micro_batch=4,
            offload_param="none",
        )
    )
    assert j.training.micro_batch == 4 and j.sources["micro_batch"] == "--micro-batch"
    assert j.zero is not None and j.zero.offload_param == "none"


def test_xtuner_config_sequence_parallel_and_steps():
    d = EXAMPLES / "xtuner-yi34b-sp"
    i = load_inputs(
        PlanOptions(
            files=(
                str(d / "yi_34b_200k_full_alpaca_enzh_128k_sp8.py"),
                str(d / "deepspeed_zero3_offload.json"),
            ),
            nodes=1,
            gpus_per_node=8,
            gpu_memory_gib=80,
            host_ram_gib=1024,
            samples=52_000,
        )
    )
    t = i.training
    assert (t.sequence_parallel, t.seq_len, t.grad_accum, t.micro_batch) == (8, 131072, 8, 1)
    assert i.data_parallel == 1
    assert i.steps_per_epoch() == 52_000 // 8
    r = plan(i)
    assert any(f.id == "PLAN008" and "6,500" in f.title for f in r.findings)


def test_peft_qlora_example_without_storage():
    d = EXAMPLES / "peft-qlora-zero3-missing-quant-storage"
    i = load_inputs(
        PlanOptions(
            files=(str(d / "train_args.yaml"), str(d / "deepspeed_config_z3_qlora.yaml")),
            nodes=1,
            gpus_per_node=8,
            gpu_memory_gib=80,
            host_ram_gib=1024,
        )
    )
    assert i.training.method == "qlora" and i.training.quant_storage == "uint8"
    assert (i.training.micro_batch, i.training.seq_len, i.training.lora_rank) == (2, 2048, 8)
    assert i.training.attn == "flash"
    assert i.zero is not None and i.zero.stage == 3
    assert any(f.id == "PLAN004" for f in plan(i).findings)


# ---- candidates and recommendation -------------------------------------------------------------------


def test_recommendation_is_cheapest_that_fits_and_keeps_method():
    r = plan(inputs(model="llama-3.1-8b"))
    assert r.recommended is not None and r.recommended.fits
    assert r.recommended.training.method == "full"
    assert r.recommended.zero.offload_rank == 0  # 8B full FT on 8 x 80 GB needs no offload
    assert r.candidates[0] is r.recommended


def test_deepseek_recommendation_offloads_and_yours_fails_first_step():
    i = inputs(
        model="deepseek-coder-v2-instruct",
        nodes=6,
        framework="llamafactory",
        stage=3,
        offload_optimizer="none",
    )
    r = plan(i)
    f = next(f for f in r.findings if f.id == "PLAN001")
    assert "first optimizer step" in f.message and "GiB" in f.message and f.message.rstrip().endswith(")")
    assert r.recommended is not None and r.recommended.zero.offload_optimizer != "none"


def test_host_exhaustion_finding():
    i = inputs(model="yi-34b", host_ram_gib=512, stage=3, offload_optimizer="cpu", offload_param="cpu")
    r = plan(i)
    f = next(f for f in r.findings if f.id == "PLAN002")
    assert f.severity.label == "error" and "first optimizer step" in f.message and "-9" in f.message


def test_nothing_fits_changes_method_or_reports():
    r = plan(inputs(model="llama-3.1-405b", nodes=1, host_ram_gib=256))
    assert r.recommended is None or r.recommended.training.method != "full"
    tiny = plan(inputs(model="llama-3.1-405b", nodes=1, gpus_per_node=1, gpu_memory_gib=8, host_ram_gib=64))
    assert tiny.recommended is None
    assert any(f.id == "PLAN006" for f in tiny.findings)


def test_save_only_model_with_gather_false_does_not_skip_optimizer():
    z = ZeroSettings(stage=3, offload_optimizer="cpu", gather_16bit_on_save=False)
    i = inputs(model="llama-3.1-8b", save_only_model=True, stage=3, framework="hf")
    p = plan_strategy(i, z)
    assert not p.checkpoint.save_only_model_skips_optimizer
    assert p.checkpoint.save_only_model_bytes == p.checkpoint.optimizer_bytes
    i2 = build_inputs(
        PlanOptions(
            model="llama-3.1-8b",
            nodes=1,
            gpus_per_node=8,
            gpu_memory_gib=80,
            host_ram_gib=1024,
            save_only_model=True,
            stage=3,
            offload_optimizer="cpu",
        )
    )
    from dataclasses import replace

    r = plan(replace(i2, zero=z))
    assert any(f.id == "PLAN005" for f in r.findings)


def test_lora_through_hf_trainer_gathers_only_adapters_at_save():
    # transformers >= 5.0 gathers only the adapters (plan/host_save.py); 4.x or an unknown version the whole model
    i = replace(inputs(model="llama-3-70b", method="lora", framework="hf"), transformers_version="5.23.0")
    p = plan_strategy(i, ZeroSettings(stage=3))
    assert p.phase("save").host_bytes - p.phase("steady").host_bytes < 2 * GIB
    old = plan_strategy(replace(i, transformers_version="4.57.6"), ZeroSettings(stage=3))
    assert old.phase("save").host_bytes - old.phase("steady").host_bytes > 130 * GB
    j = inputs(model="llama-3-70b", method="lora", framework="xtuner")
    q = plan_strategy(j, ZeroSettings(stage=3))
    assert q.phase("save").host_bytes - q.phase("steady").host_bytes > 130 * GB


def test_zero2_save_clones_model_on_every_rank():
    p = plan_strategy(inputs(model="llama-3.1-8b"), ZeroSettings(stage=2))
    clone = next(it for it in p.phase("save").host if it.name.startswith("every rank"))
    assert clone.bytes == 8 * 2 * p.trainable_params


def test_pinned_rounding_is_applied():
    i = inputs(model="yi-34b")
    pinned = plan_strategy(i, ZeroSettings(stage=3, offload_optimizer="cpu", offload_param="cpu"))
    unpinned = plan_strategy(
        i, ZeroSettings(stage=3, offload_optimizer="cpu", offload_param="cpu", pin_memory=False)
    )
    assert pinned.phase("first_step").host_bytes > unpinned.phase("first_step").host_bytes


def test_emit_auto_for_hf_concrete_for_deepspeed():
    r = plan(inputs(model="llama-3.1-8b", framework="hf"))
    assert r.recommended is not None
    cfg = ds_config(r.inputs, r.recommended)
    assert cfg["train_micro_batch_size_per_gpu"] == "auto" and cfg["bf16"]["enabled"] == "auto"
    i = inputs(model="llama-3.1-8b", framework="deepspeed", micro_batch=2, grad_accum=4)
    r2 = plan(i)
    assert r2.recommended is not None
    cfg2 = ds_config(i, r2.recommended)
    assert cfg2["train_micro_batch_size_per_gpu"] == 2 and cfg2["gradient_accumulation_steps"] == 4
    assert "auto" not in str(cfg2)


# ---- bad input ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kw", "needle"),
    [
        ({"model": "lama-3.1-8b"}, "close matches: llama-3.1-8b"),
        ({"model": "llama-3.1-8b", "sequence_parallel": 3}, "not divisible by sequence parallel size 3"),
        ({"model": "llama-3.1-8b", "micro_batch": 0}, "--micro-batch must be a whole number above 0"),
        ({"model": "llama-3.1-8b", "gpus_per_node": 0}, "--gpus-per-node must be a whole number above 0"),
        ({"model": "llama-3.1-8b", "method": "qlorra"}, "did you mean qlora"),
        ({"model": "llama-3.1-8b", "method": "lora", "lora_targets": "qq_proj"}, "match no nn.Linear"),
    ],
)
def test_bad_input_is_one_line_plan_error(kw, needle):
    # Values are resolved by the run description (SetupError) and judged by the planner (PlanError).
    with pytest.raises((PlanError, SetupError)) as err:
        inputs(**kw)
    assert needle in str(err.value)
    assert "\n" not in str(err.value)


def test_missing_gpu_memory_says_what_to_pass():
    with pytest.raises(PlanError, match="--gpu-memory"):
        build_inputs(PlanOptions(model="llama-3.1-8b", gpus_per_node=8, host_ram_gib=512))
