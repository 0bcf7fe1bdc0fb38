"""One rank of a real DeepSpeed ZeRO-2 + offload_optimizer job on CPU (DeepSpeed's CPU accelerator, gloo), and the
host side of what HF Trainer's checkpoint save does with it: a Llama built from a config in bf16, one optimizer
step, then `save_model` (accelerate get_state_dict = `clone_tensors_for_torch_save` of the module's state dict on
every rank, safetensors `save_file` of it on rank 0) and `engine.save_checkpoint`.

Writes per rank: the bytes each step holds and the process's RSS growth (psutil), the peak of each save measured
with the kernel's high-water mark (`/proc/self/status` VmHWM, reset through `/proc/self/clear_refs`).

Run by tests/plan/test_zero2_save_engine.py: `torchrun --nproc_per_node 2 zero2_save_job.py OUT`.
"""

from __future__ import annotations

import gc
import json
import sys
import tempfile
from pathlib import Path

CONFIG = {
    "hidden_size": 512,
    "intermediate_size": 1376,
    "num_hidden_layers": 6,
    "num_attention_heads": 8,
    "num_key_value_heads": 8,
    "vocab_size": 8000,
    "max_position_embeddings": 64,
    "tie_word_embeddings": False,
}


def _rss() -> int:
    import psutil

    return int(psutil.Process().memory_info().rss)


def _reset_peak() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def _peak() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def main() -> int:
    import deepspeed
    import torch
    from deepspeed.checkpoint.utils import clone_tensors_for_torch_save
    from safetensors.torch import save_file
    from transformers import LlamaConfig, LlamaForCausalLM

    out = Path(sys.argv[1])
    deepspeed.init_distributed()
    rank = torch.distributed.get_rank()
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**CONFIG)).to(torch.bfloat16)
    total = sum(p.numel() for p in model.parameters())
    cfg = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "bf16": {"enabled": True},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
        "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": True}},
    }
    gc.collect()
    before = _rss()
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    gc.collect()
    after_init = _rss()
    ids = torch.randint(0, CONFIG["vocab_size"], (1, 16))
    engine.backward(engine(input_ids=ids, labels=ids).loss)
    engine.step()
    gc.collect()
    after_step = _rss()
    opt = engine.optimizer
    adam = sum(
        t.numel() * t.element_size()
        for s in opt.optimizer.state.values()
        for t in s.values()
        if torch.is_tensor(t) and t.numel() > 1
    )

    # HF Trainer.save_model under ZeRO-1/2: every rank clones the module's state dict to the host.
    hwm = _reset_peak()
    base = _rss()
    state = clone_tensors_for_torch_save(engine.module.state_dict())
    clone_bytes = sum(t.numel() * t.element_size() for t in state.values())
    clone_rss = _rss() - base
    save_file_peak = 0
    with tempfile.TemporaryDirectory() as tmp:
        if rank == 0:  # should_save: rank 0 writes it with safetensors
            _reset_peak()
            start = _rss()
            save_file({k: v.contiguous() for k, v in state.items()}, f"{tmp}/model.safetensors")
            save_file_peak = _peak() - start
        del state
        gc.collect()
        # Trainer._save_optimizer_and_scheduler -> engine.save_checkpoint: dp rank 0 writes the module, every rank its
        # optimizer partition (offloaded: already host tensors, written as they are).
        _reset_peak()
        start = _rss()
        engine.save_checkpoint(tmp)
        save_checkpoint_peak = _peak() - start
    res = {
        "rank": rank,
        "total": total,
        "hwm_reset": hwm,
        "rss_init": after_init - before,
        "rss_step": after_step - after_init,
        "adam_bytes": adam,
        "fp32_master_bytes": sum(t.numel() * t.element_size() for t in opt.single_partition_of_fp32_groups),
        "clone_bytes": clone_bytes,
        "clone_rss": clone_rss,
        "save_file_peak": save_file_peak,
        "save_checkpoint_peak": save_checkpoint_peak,
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank{rank}.json").write_text(json.dumps(res))
    sys.stdout.flush()
    import os

    os._exit(0)  # skip interpreter teardown (gloo / cpu_adam threads; src/zerodoctor/engine/tiny_job.py)


if __name__ == "__main__":
    sys.exit(main())
