"""An axolotl YAML is planned with axolotl's own defaults, each with its source (issue 9): where a key is absent,
axolotl's schema decides (micro_batch_size 1, sequence_len 512, eval_batch_size = micro_batch_size, bf16 auto,
gradient checkpointing off, sdpa), and a QLoRA adapter is loaded and prepared as axolotl does it (bf16 quant storage,
norms / embedding / head back in 16-bit after prepare_model_for_kbit_training)."""

from __future__ import annotations

from pathlib import Path

from zerodoctor.env.model import Environment, PackageInfo
from zerodoctor.plan.inputs import PlanOptions, load_inputs
from zerodoctor.setup.axolotl import is_axolotl

# shaped like axolotl's examples/llama-3/qlora.yml (a catalog model in place of Meta-Llama-3-8B)
QLORA = """base_model: Qwen/Qwen2.5-0.5B
load_in_8bit: false
load_in_4bit: true
datasets:
  - path: aaditya/alpaca_subset_1
    type: alpaca
val_set_size: 0.05
output_dir: ./outputs/qlora-out
adapter: qlora
sequence_len: 4096
sample_packing: true
lora_r: 32
lora_alpha: 16
lora_target_linear: true
gradient_accumulation_steps: 4
optimizer: paged_adamw_32bit
lr_scheduler: cosine
learning_rate: 0.0002
bf16: auto
logging_steps: 1
evals_per_epoch: 4
"""

# the least an axolotl YAML says: every memory key left to axolotl
BARE = """base_model: Qwen/Qwen2.5-0.5B
datasets:
  - path: mhenrichsen/alpaca_2k_test
    type: alpaca
output_dir: ./outputs/out
"""


def _inputs(tmp_path: Path, text: str):
    """Planned with axolotl 0.13.0 installed (`--env`): the defaults hold from v0.5.0 (test_axolotl_review_r7.py has
    the unknown and older releases)."""
    args = tmp_path / "axolotl.yaml"
    args.write_text(text)
    opts = PlanOptions(files=(str(args),), gpus_per_node=1, gpu_memory_gib=24, host_ram_gib=64)
    env = Environment(python="3.11", platform="linux", packages={"axolotl": PackageInfo("axolotl", "0.13.0")})
    return load_inputs(opts, env=env)


def test_axolotl_defaults_replace_hf_ones_with_their_source(tmp_path: Path) -> None:
    inputs = _inputs(tmp_path, BARE)
    run, t = inputs.run, inputs.training
    assert run is not None
    assert (t.micro_batch, t.seq_len, t.gradient_checkpointing, t.attn, t.precision) == (1, 512, False, "sdpa", "bf16")
    assert "axolotl micro_batch_size default 1" in run.micro_batch.origin.describe()
    assert "HF" not in run.micro_batch.origin.describe()
    assert "axolotl sequence_len default 512" in run.seq_len.origin.describe()
    assert "axolotl gradient_checkpointing default false" in run.gradient_checkpointing.origin.describe()
    assert "axolotl" in run.attn.origin.describe() and "axolotl bf16" in run.precision.origin.describe()
    # no eval set (val_set_size defaults to 0): no evaluation phase
    assert run.eval_micro_batch is None and t.eval_micro_batch is None
    assert run.kbit_preparation is None  # full fine-tuning: nothing to prepare


def test_axolotl_qlora_example(tmp_path: Path) -> None:
    inputs = _inputs(tmp_path, QLORA)
    run, t = inputs.run, inputs.training
    assert run is not None
    assert (t.method, t.micro_batch, t.seq_len, t.lora_rank, t.quant_storage) == ("qlora", 1, 4096, 32, "bfloat16")
    assert t.lora_targets == "all-linear" and "lora_target_linear" in run.lora_targets.origin.describe()
    assert t.optimizer == "paged_adamw_32bit" and "optimizer" in run.optimizer.origin.describe()
    assert "bf16: auto" in run.precision.origin.describe() and t.precision == "bf16"
    assert "bnb_4bit_quant_storage=torch.bfloat16" in run.quant_storage.origin.describe()
    # an eval set evaluates at the micro batch (eval_batch_size unwritten)
    assert t.eval_micro_batch == 1 and "eval_batch_size default: micro_batch_size" in (
        run.eval_micro_batch.origin.describe() if run.eval_micro_batch else ""
    )
    # axolotl puts the norms, embedding and head back in bf16 after PEFT's k-bit preparation
    assert t.kbit_preparation == "none" and run.kbit_preparation is not None
    assert "_configure_embedding_dtypes" in run.kbit_preparation.origin.describe()
    assert t.lora_dropout == 0.0


def test_axolotl_written_values_win_and_precision_follows_resolve_dtype(tmp_path: Path) -> None:
    text = BARE + "micro_batch_size: 4\neval_batch_size: 2\nval_set_size: 0.1\nevals_per_epoch: 2\nsequence_len: 2048\n"
    text += "bf16: false\n"
    inputs = _inputs(tmp_path, text + "gradient_checkpointing: true\nflash_attention: true\n")
    t = inputs.training
    assert (t.micro_batch, t.eval_micro_batch, t.seq_len, t.gradient_checkpointing, t.attn) == (4, 2, 2048, True, "flash")
    assert t.precision == "fp32"  # bf16 false and no fp16: axolotl's resolve_dtype loads fp32
    assert _inputs(tmp_path, text + "fp16: true\n").training.precision == "fp16"
    offload = _inputs(tmp_path, text + "gradient_checkpointing: offload\n")
    assert offload.training.gradient_checkpointing is True
    assert any("gradient_checkpointing: offload" in n for n in offload.notes)


def test_only_axolotl_keys_mark_an_axolotl_yaml() -> None:
    assert is_axolotl({"base_model": "x", "output_dir": "o"})
    assert is_axolotl({"micro_batch_size": 2})
    assert not is_axolotl({"model_name_or_path": "x", "per_device_train_batch_size": 2})
    assert not is_axolotl(None)
