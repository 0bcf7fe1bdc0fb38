"""HF004's bundled argument names agree with the installed transformers (the list is read with ast so that
`lint` never imports transformers; this test is where the real dataclasses are imported)."""

from __future__ import annotations

import dataclasses
import importlib.metadata

import pytest

from zerodoctor.lint.rules._arg_fields import (
    LLAMAFACTORY_ARGS,
    TRANSFORMERS_4_ONLY,
    TRANSFORMERS_TRAINING_ARGS,
    TRANSFORMERS_VERSION,
)


def test_transformers_fields_match_the_installed_seq2seq_training_arguments():
    if importlib.metadata.version("transformers") != TRANSFORMERS_VERSION:
        pytest.skip(f"the bundled list is transformers {TRANSFORMERS_VERSION}'s")
    from transformers import Seq2SeqTrainingArguments

    installed = {f.name for f in dataclasses.fields(Seq2SeqTrainingArguments)}
    assert installed == set(TRANSFORMERS_TRAINING_ARGS)
    assert not installed & TRANSFORMERS_4_ONLY


def test_llamafactory_list_has_its_memory_keys_and_no_training_argument_typos():
    for key in ("cutoff_len", "finetuning_type", "lora_rank", "lora_target", "quantization_bit", "template"):
        assert key in LLAMAFACTORY_ARGS
    assert "per_device_train_batchsize" not in LLAMAFACTORY_ARGS | TRANSFORMERS_TRAINING_ARGS


def test_lint_does_not_import_transformers(run_cli, tmp_path):
    import subprocess
    import sys

    (tmp_path / "sft.yaml").write_text("stage: sft\nfinetuning_type: lora\nper_device_train_batchsize: 1\n")
    code = (
        "import sys; from zerodoctor.cli.main import main; rc = main(['lint', sys.argv[1]]); "
        "print('transformers' in sys.modules, 'torch' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "sft.yaml")], capture_output=True, text=True, check=False
    ).stdout
    assert out.strip().splitlines()[-1] == "False False", out
