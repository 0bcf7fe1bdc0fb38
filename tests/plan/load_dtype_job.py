"""One rank of a real DeepSpeed ZeRO-2 engine on CPU (DeepSpeed's CPU accelerator, gloo) given a model that was not
built under zero.Init and is still in fp32 -- what transformers 4 `from_pretrained` returns without `torch_dtype`
(and any run that states fp32 weights). Writes per rank the parameters' dtype and bytes before
`deepspeed.initialize` and after it: the engine casts them to bf16 itself (engine.py
`_configure_distributed_model`, before `module.to(device)`), so until then the host holds the fp32 model.

Run by tests/plan/test_load_dtype.py: `torchrun --nproc_per_node 2 load_dtype_job.py OUT`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from zero2_save_job import CONFIG  # noqa: E402  (the same tiny Llama as the ZeRO-2 save job)


def _params(model) -> tuple[list[str], int]:  # type: ignore[no-untyped-def]
    ps = list(model.parameters())
    return sorted({str(p.dtype) for p in ps}), sum(p.numel() * p.element_size() for p in ps)


def main() -> int:
    import deepspeed
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    out = Path(sys.argv[1])
    deepspeed.init_distributed()
    rank = torch.distributed.get_rank()
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**CONFIG))  # fp32: torch's default dtype, no torch_dtype given
    total = sum(p.numel() for p in model.parameters())
    dtypes_before, bytes_before = _params(model)
    cfg = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "bf16": {"enabled": True},
        "zero_optimization": {"stage": 2},
        "zero_allow_untested_optimizer": True,
    }
    # A plain SGD (no op to build): the cast happens in _configure_distributed_model, before the optimizer is wrapped.
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=sgd, config=cfg)
    dtypes_after, bytes_after = _params(engine.module)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank{rank}.json").write_text(
        json.dumps(
            {
                "numel": total,
                "dtypes_before": dtypes_before,
                "bytes_before": bytes_before,
                "dtypes_after": dtypes_after,
                "bytes_after": bytes_after,
            }
        )
    )
    torch.distributed.barrier()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
