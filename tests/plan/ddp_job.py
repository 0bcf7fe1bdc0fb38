"""One rank of a real torch DDP LoRA job on CPU (gloo): the tiny Llama with PEFT adapters of fsdp_lora_job.py,
wrapped in DistributedDataParallel as the HF Trainer / accelerate wrap it (gradient_as_bucket_view left at its
default False), one forward/backward. Writes, per rank, the reducer's bucket sizes in bytes (DDP's own logging data)
and the trainable parameters' numel and gradient bytes.

Run by tests/plan/test_ddp_buckets.py: `torchrun --nproc_per_node 2 ddp_job.py OUT`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fsdp_job import CONFIG  # noqa: E402  (the same tiny Llama as the FSDP tests)
from fsdp_lora_job import tiny_lora_model  # noqa: E402


def main() -> int:
    out = Path(sys.argv[1])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = tiny_lora_model()
    ddp = DDP(model)
    ids = torch.randint(0, CONFIG["vocab_size"], (1, 16))
    ddp(input_ids=ids, labels=ids).loss.backward()
    data = ddp._get_ddp_logging_data()
    sizes = [int(x) for x in str(data.get("bucket_sizes", "")).replace(" ", "").split(",") if x]
    trainable = [p for p in model.parameters() if p.requires_grad]
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank{rank}.json").write_text(
        json.dumps(
            {
                "bucket_bytes": sizes,
                "trainable_numel": sum(p.numel() for p in trainable),
                "grad_bytes": sum(
                    p.grad.numel() * p.grad.element_size() for p in trainable if p.grad is not None
                ),
                "gradient_as_bucket_view": bool(data.get("gradient_as_bucket_view", 0)),
            }
        )
    )
    del ddp  # the reducer goes before the process group it holds
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
