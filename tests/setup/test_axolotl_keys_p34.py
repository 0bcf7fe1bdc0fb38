"""An axolotl YAML read as a generic arguments file (issue 9): its string `optimizer` does not make it a DeepSpeed
config, and its own names for the batch, the sequence, the model, the adapter and flash attention are read."""

from __future__ import annotations

from pathlib import Path

from zerodoctor.plan.inputs import PlanOptions, load_inputs
from zerodoctor.setup.reader import read_document

AXOLOTL = """base_model: Qwen/Qwen2.5-0.5B
adapter: lora
sequence_len: 8192
micro_batch_size: 4
gradient_accumulation_steps: 2
optimizer: adamw_torch_fused
lr_scheduler: cosine
learning_rate: 0.0002
bf16: auto
flash_attention: true
gradient_checkpointing: true
output_dir: ./out
deepspeed: ds.json
"""


def _write(tmp_path: Path, text: str = AXOLOTL) -> Path:
    (tmp_path / "ds.json").write_text('{"zero_optimization": {"stage": 3}, "optimizer": {"type": "AdamW"}}')
    args = tmp_path / "axolotl.yaml"
    args.write_text(text)
    return args


def test_a_string_optimizer_is_not_deepspeed(tmp_path: Path) -> None:
    args = _write(tmp_path)
    assert read_document(args).kind == "hf"
    # DeepSpeed's own shape still is: a mapping optimizer / scheduler and nothing else
    assert read_document(tmp_path / "ds.json").kind == "deepspeed"
    sched = tmp_path / "sched.json"
    sched.write_text('{"scheduler": {"type": "WarmupLR", "params": {}}}')
    assert read_document(sched).kind == "deepspeed"


def test_check_and_lint_read_it_as_arguments(run_cli, tmp_path: Path) -> None:
    _write(tmp_path)
    cluster = ("--nodes", "1", "--gpus-per-node", "2", "--gpu-memory", "80", "--host-ram", "256")
    code, out, err = run_cli("check", str(tmp_path), *cluster)
    assert "two DeepSpeed configs" not in out + err
    assert "axolotl.yaml (hf)" in out and "ds.json (deepspeed)" in out
    code, out, err = run_cli("lint", str(tmp_path / "axolotl.yaml"))
    assert "DS001" not in out and "DS004" not in out


def test_axolotl_names_are_read(tmp_path: Path) -> None:
    args = _write(tmp_path)
    opts = PlanOptions(files=(str(args),), gpus_per_node=2, gpu_memory_gib=80, host_ram_gib=256)
    inputs = load_inputs(opts)
    t = inputs.training
    assert (t.micro_batch, t.seq_len, t.method, t.attn) == (4, 8192, "lora", "flash")
    assert inputs.model.name == "qwen2.5-0.5b"
    run = inputs.run
    assert run is not None and run.model_ref is not None
    assert "base_model" in run.model_ref.origin.describe()
    assert "micro_batch_size" in run.micro_batch.origin.describe()
    assert "sequence_len" in run.seq_len.origin.describe()
    assert run.grad_accum.value == 2
