"""The host at load for a run whose model is not built under zero.Init, by transformers version
(src/zerodoctor/plan/host_load.py): transformers 5 leaves weights loaded in the checkpoint's dtype as views of the
safetensors mapping (one page-cache copy per node), and copies only what it converts (MoE experts) per rank.
Unit cases on the plan, and the real transformers loader on checkpoints saved from configs."""

from __future__ import annotations

from pathlib import Path

import pytest

from zerodoctor.models import resolve_model
from zerodoctor.plan.host_load import converted_expert_numel
from zerodoctor.plan.inputs import GIB, Cluster, PlanInputs, Training, ZeroSettings
from zerodoctor.plan.phases import plan_strategy

WHOLE = "whole model loaded per rank"
MAPPED = "checkpoint mapped by from_pretrained (page cache, one copy per node)"
EXPERTS = "MoE experts converted on load, per rank"


def _load(model: str, transformers: str | None, **kw: object) -> tuple[dict[str, int], int]:
    spec = resolve_model(model)
    inputs = PlanInputs(
        model=spec,
        cluster=Cluster(1, 4, 80 * GIB, 1024 * GIB),
        training=Training(method="lora", micro_batch=1, seq_len=512, **kw),  # type: ignore[arg-type]
        zero=ZeroSettings(stage=3, offload_optimizer="cpu", offload_param="cpu"),
        framework="hf",
        transformers_version=transformers,
        zero3_init=False,
    )
    return {i.name: i.bytes for i in plan_strategy(inputs, inputs.zero).phase("load").host}, spec.params.total  # type: ignore[arg-type]


def test_transformers_5_maps_a_dense_checkpoint_once_per_node_instead_of_a_copy_per_rank():
    items, total = _load("pythia-2.8b", "5.23.0", weights_dtype="bf16")
    assert items[MAPPED] == total * 2 and WHOLE not in items and EXPERTS not in items
    items, total = _load("pythia-2.8b", "4.46.3", weights_dtype="bf16")
    assert items[WHOLE] == 4 * total * 2 and MAPPED not in items
    items, _ = _load("pythia-2.8b", None, weights_dtype="bf16")  # unknown: the private copy per rank, as before
    assert WHOLE in items and MAPPED not in items


def test_transformers_5_copies_converted_moe_experts_on_every_rank():
    items, total = _load("Qwen/Qwen3-VL-30B-A3B-Instruct", "5.8.0", weights_dtype="bf16")
    experts = converted_expert_numel(resolve_model("Qwen/Qwen3-VL-30B-A3B-Instruct"))
    assert experts == 28_991_029_248
    assert items[MAPPED] == total * 2 and items[EXPERTS] == 4 * experts * 2


def test_a_dtype_change_copies_every_tensor_beside_the_mapped_checkpoint():
    items, total = _load("pythia-2.8b", "5.23.0", weights_dtype="fp32")
    assert items[WHOLE] == 4 * total * 2 and items[MAPPED] == total * 2


@pytest.mark.engine
def test_the_real_loader_maps_same_dtype_weights_and_copies_merged_experts(tmp_path: Path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from packaging.version import Version

    if Version(transformers.__version__).major < 5:
        pytest.skip("the mapped-load item is charged from transformers 5.0 on")
    from transformers import (
        AutoModelForCausalLM,
        LlamaConfig,
        LlamaForCausalLM,
        MixtralConfig,
        MixtralForCausalLM,
    )

    small = {"num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000, "tie_word_embeddings": False}
    torch.manual_seed(0)
    built = {
        "llama": LlamaForCausalLM(LlamaConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=2, **small)),
        "mixtral": MixtralForCausalLM(
            MixtralConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_local_experts=4, **small)
        ),
    }
    for name, model in built.items():
        model.to(torch.bfloat16).save_pretrained(tmp_path / name)
    for name in built:
        model = AutoModelForCausalLM.from_pretrained(tmp_path / name, dtype=torch.bfloat16)
        ranges = []
        for line in Path("/proc/self/maps").read_text().splitlines():
            parts = line.split()
            if len(parts) >= 6 and parts[5].endswith(".safetensors"):
                lo, hi = (int(x, 16) for x in parts[0].split("-"))
                ranges.append((lo, hi))
        private = sum(
            p.numel()
            for p in model.parameters()
            if not any(lo <= p.untyped_storage().data_ptr() < hi for lo, hi in ranges)
        )
        spec = resolve_model(str(tmp_path / name))
        assert sum(p.numel() for p in model.parameters()) == spec.params.total
        # what the planner charges per rank is exactly what the loader copied out of the mapping
        assert private == converted_expert_numel(spec), name
    assert converted_expert_numel(resolve_model(str(tmp_path / "mixtral"))) == 2 * 4 * 3 * 128 * 256
