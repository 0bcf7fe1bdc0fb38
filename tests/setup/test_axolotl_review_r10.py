"""Review R10 of the offload-optimizer and axolotl changes (issue 9): each case is one of R10's probes (/tmp/r10/p),
read and planned without the engine. Before each fix the plan was too large (a no-offload strategy planned fp32 Adam),
too small (an unknown launcher kept 8-bit states on the host, a dev install planned 4-bit), or read the wrong
precision."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from zerodoctor.env.model import Environment, PackageInfo
from zerodoctor.plan.inputs import PlanInputs, PlanOptions, ZeroSettings, load_inputs
from zerodoctor.plan.model_states import OPTIMIZER_STATES
from zerodoctor.plan.phases import plan_strategy

# examples/llama-3/fft-8b.yml with deepspeed_configs/zero2.json plus optimizer offload (R10's ax_fft_z2)
FFT = """base_model: NousResearch/Meta-Llama-3-8B
datasets:
  - path: tatsu-lab/alpaca
    type: alpaca
val_set_size: 0.05
output_dir: ./outputs/out
sequence_len: 8192
sample_packing: true
gradient_accumulation_steps: 8
optimizer: paged_adamw_8bit
learning_rate: 2e-5
bf16: auto
gradient_checkpointing: true
flash_attention: true
deepspeed: zero2.json
"""
ZERO2_OFFLOAD = {
    "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}},
    "bf16": {"enabled": "auto"},
    "train_micro_batch_size_per_gpu": "auto",
}


def _env(axolotl: str | None) -> Environment | None:
    if axolotl is None:
        return None
    return Environment(python="3.11", platform="linux", packages={"axolotl": PackageInfo("axolotl", axolotl)})


def _inputs(
    tmp_path: Path, text: str | None, *, ds: dict | None = None, axolotl: str | None = "0.13.0", **flags: str
) -> PlanInputs:
    """Plan inputs for an axolotl YAML `text` (and zero2.json `ds`), or for `ds` alone when `text` is None."""
    files: tuple[str, ...] = ()
    if ds is not None:
        (tmp_path / "zero2.json").write_text(json.dumps(ds))
        files = (str(tmp_path / "zero2.json"),)
    if text is not None:
        (tmp_path / "axolotl.yaml").write_text(text)
        files = (str(tmp_path / "axolotl.yaml"),)
    opts = PlanOptions(files=files, gpus_per_node=8, gpu_memory_gib=80, host_ram_gib=256, **flags)
    return load_inputs(opts, env=_env(axolotl))


def _states(inputs: PlanInputs, zero: ZeroSettings) -> int:
    return sum(c.bytes for c in plan_strategy(inputs, zero).components if c.name == OPTIMIZER_STATES)


def test_no_offload_candidate_keeps_the_client_optimizer(tmp_path: Path) -> None:
    """1. accelerate swaps the client optimizer only under optimizer offload (accelerator.py prepare_deepspeed): the
    run keeps its 8-bit optimizer, so a candidate without offload plans 8-bit states, one with offload fp32 Adam."""
    inputs = _inputs(tmp_path, FFT, ds=ZERO2_OFFLOAD)
    assert inputs.run is not None
    assert inputs.training.optimizer == "paged_adamw_8bit" and inputs.training.offload_swaps_optimizer
    assert any("DeepSpeedCPUAdam" in n and "paged_adamw_8bit" in n for n in inputs.run.notes)
    trainable = inputs.model.params.total
    assert _states(inputs, ZeroSettings(stage=2, offload_optimizer="cpu")) == pytest.approx(trainable, rel=0.01)
    assert _states(inputs, ZeroSettings(stage=2)) < 3 * trainable / 8


def test_unknown_launcher_swaps_like_hf(tmp_path: Path) -> None:
    """2. A DeepSpeed config alone (launcher unknown, read as HF Trainer) with `--optimizer adamw_8bit` and
    optimizer offload: DeepSpeedCPUAdam steps (accelerate), or a raw DeepSpeed script raises (engine.py)."""
    inputs = _inputs(
        tmp_path, None, ds=ZERO2_OFFLOAD, model="NousResearch/Meta-Llama-3-8B", optimizer="adamw_8bit"
    )
    assert inputs.run is not None and inputs.run.framework.name is None
    assert inputs.training.offload_swaps_optimizer
    trainable = inputs.model.params.total
    assert _states(inputs, ZeroSettings(stage=2, offload_optimizer="cpu")) == pytest.approx(trainable, rel=0.01)
