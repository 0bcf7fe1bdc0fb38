"""One rank of a real DeepSpeed ZeRO-2 / ZeRO-3 job on CPU (DeepSpeed's CPU accelerator, gloo) that counts every
call to the accelerator's `empty_cache` (what `torch.cuda.empty_cache` is on a GPU: `runtime/utils.py empty_cache`
and the direct `get_accelerator().empty_cache()` calls both go through it) during `deepspeed.initialize`, each
forward/backward and each `engine.step()` of three steps, for the tiny Llama of step_moment_job.py in bf16.

Run by tests/plan/test_cache_carry.py: `torchrun --nproc_per_node 2 cache_carry_job.py OUT STAGE[,STAGE...]`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from step_moment_job import (  # the same tiny Llama (this folder is on sys.path under torchrun)
    CONFIG,
    build_engine,
)


def main() -> int:
    import deepspeed
    import torch

    deepspeed.init_distributed()
    record = {"rank": torch.distributed.get_rank(), "stages": [_one(int(x)) for x in sys.argv[2].split(",")]}
    Path(sys.argv[1]).mkdir(parents=True, exist_ok=True)
    Path(sys.argv[1], f"rank{record['rank']}.json").write_text(json.dumps(record))
    torch.distributed.barrier()
    return 0


def _one(stage: int) -> dict[str, Any]:
    import torch
    from deepspeed.accelerator import get_accelerator

    calls: list[str] = []
    phase = ["init"]
    accelerator = get_accelerator()
    original = accelerator.empty_cache

    def counted() -> None:
        calls.append(phase[0])
        original()

    accelerator.empty_cache = counted  # type: ignore[method-assign]
    try:
        engine = build_engine(stage)
        for step in range(3):
            ids = torch.randint(0, CONFIG["vocab_size"], (1, 16))
            phase[0] = f"forward_backward{step}"
            engine.backward(engine(input_ids=ids, labels=ids).loss)
            phase[0] = f"step{step}"
            engine.step()
    finally:
        accelerator.empty_cache = original  # type: ignore[method-assign]
    return {"stage": stage, "calls": calls}


if __name__ == "__main__":
    sys.exit(main())
