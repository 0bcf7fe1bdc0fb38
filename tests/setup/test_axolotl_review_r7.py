"""Review R7 of the axolotl reader (issue 9): each case is one of R7's probes (axolotl's own examples at 067b021c8 and
variants), read and described without the engine. Before the fix each one planned an unsafe "fits" (a written key
ignored, an axolotl YAML read as a DeepSpeed config, a client optimizer's 8-bit states under offload) or made `check`
report an error that axolotl's own shipped files do not have."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from zerodoctor.env.model import Environment, PackageInfo
from zerodoctor.lint.rules import hf001_ds_args_mismatch, ql001_zero3_quant_storage
from zerodoctor.plan.inputs import PlanOptions, load_inputs
from zerodoctor.setup.load import load_setup
from zerodoctor.setup.reader import read_document
from zerodoctor.setup.run import RunDescription, describe_run

# examples/llama-3/qlora.yml, no packing, micro 2 (R7's p03 / eager.yml)
QLORA = """base_model: NousResearch/Meta-Llama-3-8B
load_in_8bit: false
load_in_4bit: true
datasets:
  - path: aaditya/alpaca_subset_1
    type: alpaca
val_set_size: 0
output_dir: ./outputs/qlora-out
adapter: qlora
sequence_len: 4096
sample_packing: false
lora_r: 32
lora_alpha: 16
lora_dropout: 0.05
lora_target_linear: true
gradient_accumulation_steps: 4
micro_batch_size: 2
optimizer: paged_adamw_32bit
learning_rate: 0.0002
bf16: auto
gradient_checkpointing: true
"""

# examples/llama-3/fft-8b.yml with deepspeed_configs/zero2.json (R7's p08)
FFT = """base_model: NousResearch/Meta-Llama-3-8B
datasets:
  - path: tatsu-lab/alpaca
    type: alpaca
val_set_size: 0.05
output_dir: ./outputs/out
sequence_len: 8192
sample_packing: true
gradient_accumulation_steps: 8
optimizer: {optimizer}
learning_rate: 2e-5
bf16: auto
gradient_checkpointing: true
flash_attention: true
deepspeed: zero2.json
"""
ZERO2_OFFLOAD = {
    "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}, "overlap_comm": True},
    "bf16": {"enabled": "auto"},
    "fp16": {"enabled": "auto"},
    "gradient_accumulation_steps": "auto",
    "gradient_clipping": "auto",
    "train_batch_size": "auto",
    "train_micro_batch_size_per_gpu": "auto",
}

# examples/qwen2/dpo.yaml (R7's p05 / dpo7.yaml): full fine-tuning with `rl: dpo`
DPO = """base_model: Qwen/Qwen2.5-7B
chat_template: qwen_25
rl: {rl}
datasets:
  - path: fozziethebeat/alpaca_messages_2k_dpo_test
    type: chat_template.default
val_set_size: 0.0
output_dir: ./outputs/dpo-out
sequence_len: 2048
sample_packing: false
gradient_accumulation_steps: 4
micro_batch_size: 2
optimizer: adamw_bnb_8bit
bf16: auto
gradient_checkpointing: true
"""

ZERO3_BF16 = {
    "zero_optimization": {"stage": 3, "overlap_comm": True, "stage3_prefetch_bucket_size": "auto"},
    "bf16": {"enabled": True},
    "gradient_accumulation_steps": "auto",
    "gradient_clipping": "auto",
    "train_batch_size": "auto",
    "train_micro_batch_size_per_gpu": "auto",
}


def _env(axolotl: str | None) -> Environment | None:
    if axolotl is None:
        return None
    return Environment(python="3.11", platform="linux", packages={"axolotl": PackageInfo("axolotl", axolotl)})


def _run(tmp_path: Path, text: str, ds: dict | None = None, axolotl: str | None = "0.13.0") -> RunDescription:
    args = tmp_path / "axolotl.yaml"
    args.write_text(text)
    if ds is not None:
        (tmp_path / "zero2.json").write_text(json.dumps(ds))
    inputs = load_inputs(
        PlanOptions(files=(str(args),), gpus_per_node=8, gpu_memory_gib=80, host_ram_gib=310), env=_env(axolotl)
    )
    assert inputs.run is not None
    return inputs.run


def test_eager_attention_is_eager(tmp_path: Path) -> None:
    """1. `eager_attention: true` (utils/schemas/enums.py LEGACY_ATTN_FLAG_TO_IMPL) loads eager attention."""
    run = _run(tmp_path, QLORA + "eager_attention: true\n")
    assert run.attn.value == "eager" and "eager_attention" in run.attn.origin.describe()
    # flash_attention comes first in axolotl's order of the legacy flags
    assert _run(tmp_path, QLORA + "eager_attention: true\nflash_attention: true\n").attn.value == "flash"
    assert _run(tmp_path, QLORA + "eager_attention: false\n").attn.value == "sdpa"


@pytest.mark.parametrize("optimizer", ["adamw_bnb_8bit", "paged_adamw_8bit", "adamw_torch_fused"])
def test_client_optimizer_under_offload_is_deepspeed_cpu_adam(tmp_path: Path, optimizer: str) -> None:
    """2. With offload_optimizer and no `optimizer` block accelerate hands DeepSpeed DeepSpeedCPUAdam: fp32 states."""
    run = _run(tmp_path, FFT.format(optimizer=optimizer), ZERO2_OFFLOAD)
    assert run.zero is not None and run.zero.offload_optimizer.value == "cpu"
    # the run keeps its optimizer; the offload strategy plans AdamW (plan/phases.py, review R10 1) and says why
    assert run.framework.swaps_offloaded_optimizer
    notes = [n for n in run.notes if "DeepSpeedCPUAdam" in n]
    if optimizer != "adamw_torch_fused":
        assert notes and "axolotl.yaml:10:1 (optimizer)" in notes[0]
    else:
        assert not notes
    # no offload: the client optimizer is what steps
    no_offload = {**ZERO2_OFFLOAD, "zero_optimization": {"stage": 2}}
    assert _run(tmp_path, FFT.format(optimizer="adamw_bnb_8bit"), no_offload).optimizer.value == "adamw_8bit"
    # `zero_force_ds_cpu_optimizer: false`: accelerate keeps the client optimizer
    kept = {**ZERO2_OFFLOAD, "zero_force_ds_cpu_optimizer": False}
    assert _run(tmp_path, FFT.format(optimizer="adamw_bnb_8bit"), kept).optimizer.value == "adamw_8bit"


def test_lora_modules_to_save(tmp_path: Path) -> None:
    """3. axolotl's `lora_modules_to_save` (loaders/adapter.py modules_to_save=cfg.lora_modules_to_save)."""
    text = QLORA.replace("adapter: qlora", "adapter: lora").replace("load_in_4bit: true", "load_in_4bit: false")
    run = _run(tmp_path, text + "lora_modules_to_save:\n  - embed_tokens\n  - lm_head\n")
    assert run.trainable_modules.value == ("embed_tokens", "lm_head")
    assert "lora_modules_to_save" in run.trainable_modules.origin.describe()


@pytest.mark.parametrize(
    ("rl", "adapter", "reference", "paired"),
    [
        ("dpo", "", True, True),
        ("ipo", "", True, True),
        ("simpo", "", True, True),
        ("kto", "", True, False),
        ("orpo", "", False, True),
        ("dpo", "adapter: lora\n", False, True),  # the base with the adapter off is the reference
        ("dpo", "adapter: lora\nrl_adapter_ref_model: true\n", True, True),
    ],
)
def test_rl_is_preference_training(tmp_path: Path, rl: str, adapter: str, reference: bool, paired: bool) -> None:
    """4. `rl:` (train.py setup_reference_model): a reference model for all but orpo without an adapter."""
    run = _run(tmp_path, DPO.format(rl=rl) + adapter)
    assert (run.reference_model.value, run.paired_inputs.value) == (reference, paired)
    assert "rl" in run.paired_inputs.origin.describe()


def test_online_rl_is_noted(tmp_path: Path) -> None:
    run = _run(tmp_path, DPO.format(rl="grpo"))
    assert any("rl: grpo" in n and "not modelled" in n for n in run.notes)


def test_fp8_bool_does_not_make_a_deepspeed_config(tmp_path: Path) -> None:
    """5. axolotl's `fp8: true` (examples/llama-3/3b-fp8-fsdp2.yaml) is no DeepSpeed `fp8` block."""
    path = tmp_path / "fp8.yaml"
    path.write_text("base_model: meta-llama/Llama-3.2-3B\nfp8: true\nsequence_len: 512\noutput_dir: ./out\n")
    assert read_document(path).kind == "hf"
    block = tmp_path / "ds.yaml"
    block.write_text("fp8:\n  enabled: true\nzero_optimization:\n  stage: 3\n")
    assert read_document(block).kind == "deepspeed"


@pytest.mark.parametrize(("axolotl", "method"), [("0.13.0", "lora"), (None, "lora"), ("0.12.2", "qlora")])
def test_lora_with_load_in_4bit(tmp_path: Path, axolotl: str | None, method: str) -> None:
    """6. `adapter: lora` + `load_in_4bit`: unquantized from v0.13.0 (only adapter qlora quantizes, #3205); before,
    the legacy kwarg quantized with bitsandbytes' default uint8 storage. Unknown version: the 16-bit plan, noted."""
    run = _run(tmp_path, QLORA.replace("adapter: qlora", "adapter: lora"), axolotl=axolotl)
    assert run.method.value == method
    if method == "qlora":
        assert run.quant_storage.value == "uint8"  # not axolotl's qlora bf16 storage
    else:
        assert "#3205" in run.method.origin.describe()
    assert any("load_in_4bit" in n for n in run.notes) is (axolotl is None)
    # adapter qlora keeps axolotl's bf16 storage
    assert _run(tmp_path, QLORA, axolotl=axolotl).quant_storage.value == "bfloat16"


def test_stray_base_model_does_not_make_an_hf_yaml_axolotl(tmp_path: Path) -> None:
    """7. A TRL YAML with a stray `base_model` (R7's p14): HF's micro batch 8, not axolotl's 1."""
    text = "base_model: Qwen/Qwen2.5-7B\nmodel_name_or_path: Qwen/Qwen2.5-7B\noutput_dir: ./out\nmax_length: 4096\n"
    run = _run(tmp_path, text + "bf16: true\n")
    assert run.micro_batch.value == 8 and "HF" in run.micro_batch.origin.describe()


def _check(tmp_path: Path, text: str) -> list[str]:
    (tmp_path / "zero3_bf16.json").write_text(json.dumps(ZERO3_BF16))
    args = tmp_path / "axolotl.yaml"
    args.write_text(text + "deepspeed: zero3_bf16.json\n")
    run = describe_run(load_setup([args]), strict=False)
    rules = (ql001_zero3_quant_storage, hf001_ds_args_mismatch)
    return [f.id for rule in rules for f in rule.check(run)]


def test_check_sees_axolotl_quant_storage_and_bf16(tmp_path: Path) -> None:
    """8. axolotl's shipped qlora + zero3_bf16 (R7's c04, c02): its loader sets bf16 storage and its bf16 is "auto",
    so neither QL001 nor HF001 fires; a written `bf16: false` against a DeepSpeed bf16 still does."""
    assert _check(tmp_path, QLORA) == []
    bare = "base_model: NousResearch/Meta-Llama-3-8B\noutput_dir: ./out\nmicro_batch_size: 1\n"
    assert _check(tmp_path, bare) == []
    assert _check(tmp_path, bare + "bf16: false\n") == ["HF001"]


@pytest.mark.parametrize(("axolotl", "precision"), [("0.5.0", "bf16"), ("0.4.0", "fp32"), (None, "fp32")])
def test_unwritten_bf16_by_release(tmp_path: Path, axolotl: str | None, precision: str) -> None:
    """9c. The schema defaults hold from v0.5.0 (#1415): an unwritten bf16 trained fp32 before; unknown: fp32."""
    run = _run(tmp_path, QLORA.replace("bf16: auto\n", ""), axolotl=axolotl)
    assert run.precision.value == precision
    assert any("bf16 is not written" in n for n in run.notes) is (axolotl is None)
    assert "v0.5.0" in run.seq_len.origin.describe() or "sequence_len" in run.seq_len.origin.describe()


def test_float16_with_bf16_false(tmp_path: Path) -> None:
    """9b. `bf16: false` + `float16: true`: resolve_dtype loads fp16, not fp32."""
    run = _run(tmp_path, QLORA.replace("bf16: auto", "bf16: false") + "float16: true\n")
    assert run.precision.value == "fp16" and "float16" in run.precision.origin.describe()


def test_offload_candidate_plans_deepspeed_cpu_adam(tmp_path: Path) -> None:
    """2, the recommendation: an offload strategy the planner tries for a run with an 8-bit optimizer and no
    DeepSpeed config (R7's fft-8b example) plans accelerate's DeepSpeedCPUAdam states too; no offload keeps 8-bit."""
    from zerodoctor.plan.inputs import ZeroSettings
    from zerodoctor.plan.model_states import OPTIMIZER_STATES
    from zerodoctor.plan.phases import plan_strategy

    args = tmp_path / "axolotl.yaml"
    args.write_text(FFT.format(optimizer="adamw_bnb_8bit").replace("deepspeed: zero2.json\n", ""))
    inputs = load_inputs(PlanOptions(files=(str(args),), gpus_per_node=8, gpu_memory_gib=80, host_ram_gib=310))
    assert inputs.training.optimizer == "adamw_8bit" and inputs.training.offload_swaps_optimizer

    def states(zero: ZeroSettings) -> int:
        return sum(c.bytes for c in plan_strategy(inputs, zero).components if c.name == OPTIMIZER_STATES)

    trainable = inputs.model.params.total
    assert states(ZeroSettings(stage=2, offload_optimizer="cpu")) == pytest.approx(8 * trainable / 8, rel=0.01)
    assert states(ZeroSettings(stage=2)) < 3 * trainable / 8


@pytest.mark.parametrize(
    ("schedule", "evaluates"),
    [("", False), ("evals_per_epoch: 4\n", True), ("eval_steps: 50\n", True), ("eval_strategy: epoch\n", True)],
)
def test_eval_set_without_a_schedule_is_not_evaluated(tmp_path: Path, schedule: str, evaluates: bool) -> None:
    """9a. An eval set with no eval_steps / evals_per_epoch / eval_strategy (R7's ev2): HF's eval_strategy "no"."""
    text = QLORA.replace("val_set_size: 0\n", "val_set_size: 0.05\neval_batch_size: 16\n") + schedule
    run = _run(tmp_path, text)
    assert (run.eval_micro_batch is not None) is evaluates
    if evaluates:
        assert run.eval_micro_batch is not None and run.eval_micro_batch.value == 16


def test_no_kbit_label_on_unquantised_lora(tmp_path: Path) -> None:
    """9d. Plain LoRA (R7's p11) is not k-bit prepared: no "after prepare_model_for_kbit_training" label."""
    text = QLORA.replace("adapter: qlora", "adapter: lora").replace("load_in_4bit: true", "load_in_4bit: false")
    assert _run(tmp_path, text).kbit_preparation is None
    assert _run(tmp_path, QLORA).kbit_preparation is not None


@pytest.mark.parametrize("name", ["ademamix", "ademamix_8bit", "paged_ademamix_32bit"])
def test_ademamix_keeps_three_states(tmp_path: Path, name: str) -> None:
    """10a. `optimizer: ademamix` (bitsandbytes AdEMAMix: m1, m2 and nu) is not AdamW's two states."""
    from zerodoctor.plan.model_states import optimizer_state_bytes_per_param

    run = _run(tmp_path, QLORA.replace("paged_adamw_32bit", name))
    assert "ademamix" in run.optimizer.value and "optimizer" in run.optimizer.origin.describe()
    assert optimizer_state_bytes_per_param("ademamix") == 12.0  # 8-bit and paged: test_axolotl_review_r10.py
