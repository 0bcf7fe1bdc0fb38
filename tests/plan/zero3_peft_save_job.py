"""One rank of a real DeepSpeed ZeRO-3 job on CPU (DeepSpeed's CPU accelerator, gloo) with a PEFT LoRA model, and
the two state dicts HF Trainer's `save_model` can take from it:

- transformers 4.x: `accelerator.get_state_dict(engine)` -> `engine._zero3_consolidated_16bit_state_dict()`: every
  parameter, the frozen base included, gathered and kept on rank 0's host;
- transformers >= 5.0: `engine._zero3_consolidated_16bit_state_dict(exclude_frozen_parameters=True)`: the adapters.

Writes per rank the bytes of each state dict and the process's RSS growth while it is alive (psutil), and the peak
of each gather (the kernel's high-water mark, `/proc/self/status` VmHWM, reset through `/proc/self/clear_refs`).

Run by tests/plan/test_host_save_p24.py: `torchrun --nproc_per_node 2 zero3_peft_save_job.py OUT`.
"""

from __future__ import annotations

import gc
import json
import sys
from pathlib import Path

from zero2_save_job import CONFIG, _peak, _reset_peak, _rss  # the same Llama as the ZeRO-2 save job

LORA_RANK = 8
LORA_TARGETS = ("q_proj", "v_proj")


def _gather(engine, exclude: bool) -> dict[str, int]:  # type: ignore[no-untyped-def]
    gc.collect()
    _reset_peak()
    start = _rss()
    state = engine._zero3_consolidated_16bit_state_dict(exclude_frozen_parameters=exclude)
    held = _rss() - start
    peak = _peak() - start
    nbytes = sum(t.numel() * t.element_size() for t in (state or {}).values())
    del state
    gc.collect()
    return {"bytes": nbytes, "rss_held": held, "peak": peak}


def main() -> int:
    import deepspeed
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    out = Path(sys.argv[1])
    deepspeed.init_distributed()
    rank = torch.distributed.get_rank()
    torch.manual_seed(0)
    base = LlamaForCausalLM(LlamaConfig(**CONFIG)).to(torch.bfloat16)
    model = get_peft_model(base, LoraConfig(r=LORA_RANK, lora_alpha=16, target_modules=list(LORA_TARGETS)))
    total = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    cfg = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "bf16": {"enabled": True},
        "zero_allow_untested_optimizer": True,
        "zero_optimization": {"stage": 3, "stage3_gather_16bit_weights_on_model_save": True},
    }
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=cfg)
    hwm = _reset_peak()
    full = _gather(engine, exclude=False)  # transformers 4.x (accelerate get_state_dict)
    adapters = _gather(engine, exclude=True)  # transformers >= 5.0 (PEFT under ZeRO-3)
    res = {"rank": rank, "total": total, "trainable": trainable, "hwm_reset": hwm, "full": full, "adapters": adapters}
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank{rank}.json").write_text(json.dumps(res))
    sys.stdout.flush()
    import os

    os._exit(0)  # skip interpreter teardown (gloo threads; src/zerodoctor/engine/tiny_job.py)


if __name__ == "__main__":
    sys.exit(main())
