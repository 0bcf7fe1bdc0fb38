"""Odd inputs found by the fuzz campaign in the run description, the model reader, accelerate configs and the
log reader: each ends in an answer or a one-line error."""

from __future__ import annotations

import os

import pytest


def _one_line(err: str) -> None:
    assert err.startswith("zerodoctor: error: ") and err.count("\n") == 1 and "Traceback" not in err, err


def test_model_config_with_zero_heads(run_cli, tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(
        '{"model_type": "llama", "hidden_size": 64, "num_attention_heads": 0, "num_hidden_layers": 2, '
        '"vocab_size": 100, "intermediate_size": 128}'
    )
    code, _, err = run_cli(
        "plan", "--model", str(cfg), "--gpus-per-node", "1", "--gpu-memory", "8", "--host-ram", "8"
    )
    assert code == 2 and "num_attention_heads' must be a whole number above 0" in err
    _one_line(err)


@pytest.mark.parametrize("value", ["5", "true", "[bf16]"])
def test_accelerate_mixed_precision_of_the_wrong_type(run_cli, tmp_path, value):
    acc = tmp_path / "acc.yaml"
    acc.write_text(
        f"distributed_type: DEEPSPEED\nmixed_precision: {value}\nnum_processes: 2\ndeepspeed_config:\n  zero_stage: 3\n"
    )
    code, out, err = run_cli("lint", str(acc))
    assert code in (0, 1) and "Traceback" not in err, err


def test_sequence_parallel_error_names_where_both_values_came_from(run_cli):
    code, _, err = run_cli(
        "plan", "--model", "llama-3.1-8b", "--gpus-per-node", "5", "--sequence-parallel", "8",
        "--gpu-memory", "80", "--host-ram", "100",
    )  # fmt: skip
    assert code == 2 and "(--sequence-parallel)" in err
    _one_line(err)


def test_unknown_model_names_the_config_line(run_cli, tmp_path):
    args = tmp_path / "m.yaml"
    args.write_text("model_name_or_path: 5e8\nstage: sft\nfinetuning_type: lora\n")
    code, _, err = run_cli(
        "plan", str(args), "--gpus-per-node", "8", "--gpu-memory", "80", "--host-ram", "100"
    )
    assert code == 2 and "m.yaml:1:1 (model_name_or_path): unknown model '5e8'" in err
    _one_line(err)


def test_diagnose_odd_paths(run_cli, tmp_path):
    code, _, err = run_cli("diagnose", "x" * 300)
    assert code == 2 and "File name too long" in err
    _one_line(err)
    code, _, err = run_cli("diagnose", "/dev/zero")
    assert code == 2 and "is a device or socket" in err
    fifo = tmp_path / "f"
    os.mkfifo(fifo)
    code, _, err = run_cli("diagnose", str(fifo))  # no writer: empty, not a hang
    assert code == 2 and "the log is empty" in err
