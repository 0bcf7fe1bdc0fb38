"""PLAN006 through `main([...])`: placed in the phase the closest candidate fails in, and its action follows
the item that dominates there, named by the user's own keys (review R2 finding 6)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LF_LORA = ROOT / "examples" / "healthy-llamafactory-lora"
HF_Z3 = ROOT / "examples" / "healthy-hf-zero3"


def _plan006(run_cli, *args: str) -> dict:
    code, out, err = run_cli("check", *args, "--format", "json")
    assert out, err
    doc = json.loads(out)
    hits = [f for f in doc["findings"] if f["id"] == "PLAN006"]
    assert len(hits) == 1, [f["id"] for f in doc["findings"]]
    return hits[0]


def test_activations_dominate_names_batch_and_cutoff_keys_not_gpus(run_cli, tmp_path):
    case = tmp_path / "bs"
    shutil.copytree(LF_LORA, case)
    yaml = case / "qwen2_5_7b_lora_sft.yaml"
    text = yaml.read_text().replace("per_device_train_batch_size: 1", "per_device_train_batch_size: 64")
    yaml.write_text(text.replace("cutoff_len: 2048", "cutoff_len: 8192"))
    f = _plan006(run_cli, str(case))
    assert f["data"]["phase"] == "steady_state"
    assert "activations" in f["data"]["dominant"]
    assert "per_device_train_batch_size (64, qwen2_5_7b_lora_sft.yaml:" in f["message"]
    assert "cutoff_len (8192, qwen2_5_7b_lora_sft.yaml:" in f["message"]
    assert "add GPUs" not in f["message"] and "--micro-batch" not in f["message"]
    assert f["evidence"][0]["key"] == "per_device_train_batch_size"
    code, text_out, _ = run_cli("check", str(case))
    assert "WILL FAIL while loading the model" not in text_out


def test_host_ram_at_load_is_not_told_to_offload(run_cli):
    f = _plan006(run_cli, str(HF_Z3), "--gpu-memory", "12", "--host-ram", "16")
    assert f["data"]["phase"] == "load" and f["data"]["resource"] == "host"
    assert "per node at the model load" in f["message"]
    assert "fewer ranks per node" in f["message"] and "NVMe" not in f["message"]


def test_parameter_working_set_points_at_the_zero3_knobs(run_cli, tmp_path):
    # transformers 5 builds each layer's 160 experts as one fused module (3.8B elements): the working set dominates.
    # The example's env.txt pins 4.45.2, whose (remote-code) DeepSeek-V2 has one nn.Linear per expert.
    example = tmp_path / "dsv2"
    shutil.copytree(ROOT / "examples" / "llamafactory-deepseek-coder-v2-z3", example)
    env = example / "env.txt"
    env.write_text(env.read_text().replace("transformers==4.45.2", "transformers==5.23.0"))
    f = _plan006(run_cli, str(example), "--nodes", "1", "--gpu-memory", "8", "--host-ram", "256")
    assert f["data"]["dominant"].startswith("ZeRO-3 fetched parameters")
    assert "stage3_max_live_parameters" in f["message"] and "add GPUs" not in f["message"]


def test_a_setup_that_fits_has_no_plan006(run_cli):
    code, out, _ = run_cli("check", str(LF_LORA), "--format", "json")
    assert not [f for f in json.loads(out)["findings"] if f["id"] == "PLAN006"]


def test_every_plan_phase_has_words_in_the_nothing_fits_text():
    """A phase the planner adds (the evaluation, 583057b) must not reach the user as its internal name."""
    from zerodoctor.check.nothing_fits import _PHASE_WORDS
    from zerodoctor.plan.phases import PHASES

    assert set(PHASES) <= set(_PHASE_WORDS)
    assert all(" " in w or w.isalpha() for w in _PHASE_WORDS.values())
