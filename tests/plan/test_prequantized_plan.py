"""`plan` on a pre-quantized checkpoint (a GPTQ/AWQ hub id or a config.json with `quantization_config`): the run
is planned as a QLoRA of the checkpoint's own method, and what cannot be trained or modelled is refused by name."""

from __future__ import annotations

import json

from zerodoctor.models import resolve_model

CLUSTER = ("--nodes", "1", "--gpus-per-node", "2", "--gpu-memory", "80", "--host-ram", "512", "--stage", "2")


def _plan(run_cli, model: str, *extra: str) -> tuple[int, dict | None, str]:
    code, out, err = run_cli("plan", "--model", model, *CLUSTER, "--seq-len", "2048", *extra, "--format", "json", "--fail-on", "never")
    return code, (json.loads(out) if code == 0 else None), err


def test_a_gptq_hub_id_with_lora_is_planned_as_a_qlora_of_its_own_method(run_cli):
    code, doc, err = _plan(run_cli, "Qwen/Qwen-72B-Chat-Int4", "--method", "lora")
    assert code == 0, err
    assert doc["training"]["method"] == "qlora" and doc["training"]["quant_method"] == "gptq"
    assert any("pre-quantized base: gptq 4-bit" in n and "'-Int4'" in n for n in doc["notes"]), doc["notes"]
    assert "gptq 4-bit base" in doc["recommended"] and "quant_storage" not in doc["recommended"]
    # the 4-bit base is far smaller on the GPU than the same LoRA on the 16-bit checkpoint
    code16, doc16, err16 = _plan(run_cli, "Qwen/Qwen-72B-Chat", "--method", "lora")
    assert code16 == 0, err16
    assert doc["yours"]["gpu_peak_bytes"] < 0.6 * doc16["yours"]["gpu_peak_bytes"]


def test_a_pre_quantized_checkpoint_cannot_be_fully_fine_tuned(run_cli):
    code, _, err = _plan(run_cli, "Qwen/Qwen-72B-Chat-Int4", "--method", "full")
    assert code == 2
    assert "Qwen/Qwen-72B-Chat-Int4 is a pre-quantized checkpoint" in err and "--method lora" in err
    assert "Traceback" not in err


def test_an_8bit_base_is_refused_with_the_users_own_id_only(run_cli):
    code, _, err = _plan(run_cli, "Qwen/Qwen-72B-Chat-Int8", "--method", "lora")
    assert code == 2
    assert "Qwen/Qwen-72B-Chat-Int8" in err and "4-bit quantized bases only" in err
    # the suffix table's example ids are its sources, never shown as if they were the user's checkpoint
    assert "Qwen-7B-Chat-Int8" not in err


def test_a_local_awq_config_is_planned_with_its_group_size(run_cli, tmp_path):
    config = {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "hidden_size": 3584,
        "intermediate_size": 18944,
        "num_hidden_layers": 28,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "vocab_size": 152064,
        "tie_word_embeddings": False,
        "quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 64, "version": "gemm"},
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config), encoding="utf-8")
    code, doc, err = _plan(run_cli, str(path), "--method", "lora")
    assert code == 0, err
    assert doc["training"]["quant_method"] == "awq" and doc["training"]["quant_group_size"] == 64
    assert resolve_model(str(path)).quantization is not None


def test_the_recorded_source_names_the_rule_not_another_checkpoint():
    """What a user is shown about where the quantization was read names the suffix and the naming rule; the real
    ids the suffix table cites as its sources (Cohere's, XuanYuan's, Qwen's own) never appear as if they were theirs."""
    quant = resolve_model("Qwen/Qwen2.5-7B-Instruct-4bit").quantization
    assert quant is not None and "'-4bit'" in quant.source
    assert "Cohere" not in quant.source and "XuanYuan" not in quant.source
