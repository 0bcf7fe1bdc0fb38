"""Predicted vs measured activation bytes saved for backward, on real transformers layers (CPU).

Builds small real transformers models from configs (Llama-style with GQA + SwiGLU, Qwen2 with q/k/v
biases, Mistral, Mixtral MoE), runs one training forward (labels given, so the HF loss runs) inside
`torch.autograd.graph.saved_tensors_hooks` and sums the bytes of every tensor autograd saves for
backward, deduplicated by storage (`untyped_storage().data_ptr()`, counting the storage's full size)
and excluding model parameters and their views (parameters are not activations; PEFT's
`scripts/train_memory.py` separates them the same way). It compares that with
`zerodoctor.plan.activations.activation_bytes` for several (micro batch, sequence length), gradient
checkpointing on/off (HF default, non-reentrant), sdpa and eager attention, bf16 (and fp32 and LoRA for
the Llama model). Flash-attention-2 is CUDA-only and is predicted only.

Run: `python benchmarks/plan_activations.py` (add `--quick` for a subset). Prints a table and the
worst error; exits 1 if any error exceeds 5 %.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM

from zerodoctor.models.spec import ModelSpec, model_from_config
from zerodoctor.plan.activations import activation_bytes

TARGET = 0.05

# Small configs that keep the real architecture (GQA ratios, SwiGLU, biases, MoE routing).
CONFIGS: dict[str, dict[str, Any]] = {
    "llama-gqa": {
        "model_type": "llama",
        "hidden_size": 256,
        "intermediate_size": 688,
        "num_hidden_layers": 3,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "vocab_size": 1024,
        "max_position_embeddings": 4096,
    },
    "qwen2": {
        "model_type": "qwen2",
        "hidden_size": 384,
        "intermediate_size": 1024,
        "num_hidden_layers": 2,
        "num_attention_heads": 6,
        "num_key_value_heads": 2,
        "vocab_size": 1500,
        "max_position_embeddings": 4096,
    },
    "mistral": {
        "model_type": "mistral",
        "hidden_size": 512,
        "intermediate_size": 1408,
        "num_hidden_layers": 2,
        "num_attention_heads": 8,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "vocab_size": 2048,
        "sliding_window": 4096,
        "max_position_embeddings": 4096,
    },
    "mixtral": {
        "model_type": "mixtral",
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_hidden_layers": 2,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "vocab_size": 1024,
        "max_position_embeddings": 4096,
    },
}


@dataclass
class Case:
    model: str
    attn: str
    batch: int
    seq: int
    gc: bool
    dtype: torch.dtype = torch.bfloat16
    lora: int = 0
    adapter_bytes: int = 2  # 2: adapters cast to bf16 as DeepSpeed bf16 does; 4: PEFT's fp32 default


def build(
    name: str, attn: str, dtype: torch.dtype, lora: int = 0, adapter_bytes: int = 2
) -> tuple[torch.nn.Module, ModelSpec]:
    """A real transformers model (random weights) and the planner's ModelSpec of the same config.

    LoRA: PEFT all-linear, rank `lora`, dropout 0. PEFT leaves the adapters in fp32
    (`autocast_adapter_dtype=True`); `adapter_bytes=2` casts the whole model to `dtype` afterwards, which
    is what the DeepSpeed engine does with bf16 enabled.
    """
    raw = dict(CONFIGS[name])
    cfg = AutoConfig.for_model(**raw)
    cfg._attn_implementation = attn
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation=attn, dtype=dtype)
    model.train()
    spec = model_from_config(cfg.to_dict(), name=name, source=Path(f"<{name}>"))
    if lora:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=lora, target_modules="all-linear", lora_dropout=0.0))
        if adapter_bytes == dtype.itemsize:
            model.to(dtype)
        model.train()
    return model, spec


def measure(model: torch.nn.Module, batch: int, seq: int, gc: bool, vocab: int) -> dict[str, int]:
    """Bytes saved for backward: 'total' (all) and 'layer' (the middle decoder layer's own storages)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if gc:
        base.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        if hasattr(model, "get_base_model"):
            base.enable_input_require_grads()  # what PEFT/Trainer do for LoRA + checkpointing
    param_storages = {p.untyped_storage().data_ptr() for p in model.parameters()}
    region = ["embed"]
    seen: dict[int, tuple[str, int]] = {}

    def pack(x: torch.Tensor) -> torch.Tensor:
        storage = x.untyped_storage()
        ptr = storage.data_ptr()
        if ptr not in param_storages and ptr not in seen:
            seen[ptr] = (region[0], storage.nbytes())
        return x

    layers = base.model.layers
    hooks = [
        layer.register_forward_pre_hook(lambda m, a, i=i: region.__setitem__(0, f"L{i}"))
        for i, layer in enumerate(layers)
    ]
    hooks.append(base.model.norm.register_forward_pre_hook(lambda m, a: region.__setitem__(0, "head")))
    torch.manual_seed(1)
    ids = torch.randint(0, vocab, (batch, seq))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
        out = model(input_ids=ids, labels=ids, use_cache=False)
    out.loss.backward()  # proves the graph is complete; frees it
    for h in hooks:
        h.remove()
    mid = f"L{len(layers) // 2}"
    return {
        "total": sum(n for _, n in seen.values()),
        "layer": sum(n for r, n in seen.values() if r == mid),
    }


def cases(quick: bool) -> list[Case]:
    shapes = [(1, 128), (2, 256)] if quick else [(1, 128), (2, 64), (2, 256), (4, 512)]
    out: list[Case] = []
    for name in CONFIGS:
        for attn in ("sdpa", "eager"):
            for b, s in shapes:
                for gc in (False, True):
                    out.append(Case(name, attn, b, s, gc))
    for b, s in shapes[:2]:
        for attn in ("sdpa", "eager"):
            out.append(Case("llama-gqa", attn, b, s, False, dtype=torch.float32))
            for gc in (False, True):
                out.append(Case("llama-gqa", attn, b, s, gc, lora=8))
                out.append(Case("llama-gqa", attn, b, s, gc, lora=8, adapter_bytes=4))
    return out


def run(selected: list[Case], emit: Callable[[str], None] = print) -> float:
    header = (
        "| model | attn | dtype | LoRA | b | s | GC | measured total | predicted | err | "
        "measured layer | predicted | err |"
    )
    emit(header)
    emit("|" + "---|" * 13)
    worst = 0.0
    cache: dict[tuple[str, str, torch.dtype, int, int], tuple[torch.nn.Module, ModelSpec]] = {}
    for c in selected:
        key = (c.model, c.attn, c.dtype, c.lora, c.adapter_bytes)
        if key not in cache:
            cache.clear()
            cache[key] = build(c.model, c.attn, c.dtype, c.lora, c.adapter_bytes)
        model, spec = cache[key]
        got = measure(model, c.batch, c.seq, c.gc, spec.params.vocab_size)
        model.zero_grad(set_to_none=True)
        if c.gc:
            base = model.get_base_model() if hasattr(model, "get_base_model") else model
            base.activation_checkpointing_disable()
        est = activation_bytes(
            spec,
            micro_batch=c.batch,
            seq_len=c.seq,
            attn_impl=c.attn,
            gradient_checkpointing=c.gc,
            dtype_bytes=c.dtype.itemsize,
            lora_rank=c.lora,
            lora_targets=("all-linear",) if c.lora else (),
            lora_adapter_bytes=c.adapter_bytes if c.lora else None,
        )
        err_total = est.saved_total / got["total"] - 1
        worst = max(worst, abs(err_total))
        layer_cells = "- | - | -"
        if not c.gc:
            err_layer = est.per_layer_saved / got["layer"] - 1
            worst = max(worst, abs(err_layer))
            layer_cells = f"{got['layer']:,} | {est.per_layer_saved:,} | {err_layer:+.2%}"
        dtype = str(c.dtype).replace("torch.", "")
        lora = f"r{c.lora} {'fp32' if c.adapter_bytes == 4 else 'bf16'}" if c.lora else "-"
        emit(
            f"| {c.model} | {c.attn} | {dtype} | {lora} | {c.batch} | {c.seq} | "
            f"{'on' if c.gc else 'off'} | {got['total']:,} | {est.saved_total:,} | {err_total:+.2%} | "
            f"{layer_cells} |"
        )
    return worst


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer shapes")
    args = parser.parse_args(argv)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    start = time.perf_counter()
    print(
        f"torch {torch.__version__}, transformers {transformers.__version__}, "
        f"{platform.machine()} CPU x{torch.get_num_threads()} threads"
    )
    worst = run(cases(args.quick))
    print(f"\nworst |error| {worst:.4%} (target {TARGET:.0%}); {time.perf_counter() - start:.1f} s")
    return 0 if worst <= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
