"""OFT's adapter as PEFT builds it (the OFTConfig LLaMA-Factory's adapter.py passes r=oft_rank, oft_block_size): in
x (b-1)/2 trainable parameters per targeted linear layer, which the planner charges as LoRA of rank (b-1)/4 -- equal
on square layers, the approximation its note states elsewhere (issue 9)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")


def _tiny(intermediate: int) -> object:
    cfg = transformers.LlamaConfig(
        hidden_size=64,
        intermediate_size=intermediate,
        num_attention_heads=4,
        num_key_value_heads=4,
        num_hidden_layers=2,
        vocab_size=128,
    )
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg)


def _trainable(model: object) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)  # type: ignore[attr-defined]


@pytest.mark.parametrize("block", [16, 32])
def test_oft_trains_in_times_b_minus_1_over_2_per_layer(block):
    model = _tiny(intermediate=128)
    linears = [
        m for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and not n.endswith("lm_head")
    ]
    expected = sum(m.in_features * (block - 1) // 2 for m in linears)
    oft = peft.get_peft_model(model, peft.OFTConfig(r=0, oft_block_size=block, target_modules="all-linear"))
    assert _trainable(oft) == expected


def test_planner_lora_rank_matches_oft_on_square_layers(tmp_path):
    """The rank the setup reader plans OFT at (LLaMA-Factory's default block 32 -> 8) has the adapter size of
    PEFT's OFT within the rounding of (b-1)/4 = 7.75 on square layers."""
    import shutil
    from pathlib import Path

    from zerodoctor.setup.load import load_setup
    from zerodoctor.setup.run import describe_run

    root = Path(__file__).resolve().parents[2] / "examples" / "healthy-llamafactory-lora"
    shutil.copytree(root, tmp_path / "lf")
    yaml = tmp_path / "lf" / "qwen2_5_7b_lora_sft.yaml"
    yaml.write_text(yaml.read_text().replace("finetuning_type: lora", "finetuning_type: oft"))
    rank = describe_run(load_setup([str(yaml)])).lora_rank.value
    assert rank == 8
    oft = _trainable(
        peft.get_peft_model(_tiny(64), peft.OFTConfig(r=0, oft_block_size=32, target_modules="all-linear"))
    )
    lora = _trainable(peft.get_peft_model(_tiny(64), peft.LoraConfig(r=rank, target_modules="all-linear")))
    assert abs(lora - oft) / oft < 0.04, (lora, oft)
