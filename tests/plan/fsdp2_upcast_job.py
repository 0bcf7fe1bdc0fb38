"""One rank of accelerate's real FSDP2 prepare on CPU (gloo): a Llama built from a config in bf16 (what
`from_pretrained` leaves on the host), then `accelerate.utils.fsdp_utils.fsdp2_prepare_model` under bf16 mixed
precision, which upcasts every trainable parameter to fp32 before `fully_shard` and keeps the upcast tensors in its
captured state dict until it returns.

Writes per rank: the bytes of the bf16 model, the RSS it added, the peak RSS growth over `fsdp2_prepare_model` (the
kernel's high-water mark, `/proc/self/status` VmHWM, reset through `/proc/self/clear_refs`) and the bytes of the
rank's own fp32 shards (on a GPU those live on the device; on the CPU accelerator they are host memory too).

Run by tests/plan/test_fsdp2_upcast_p24.py: `torchrun --nproc_per_node 2 fsdp2_upcast_job.py OUT`.
"""

from __future__ import annotations

import gc
import json
import sys
from pathlib import Path
from types import SimpleNamespace

from zero2_save_job import _peak, _reset_peak, _rss
from zero3_peft_save_job import CONFIG


def main() -> int:
    import torch
    import torch.distributed as dist
    from accelerate import PartialState
    from accelerate.utils import FullyShardedDataParallelPlugin
    from accelerate.utils.fsdp_utils import fsdp2_prepare_model
    from torch.distributed.fsdp import MixedPrecisionPolicy
    from transformers import LlamaConfig, LlamaForCausalLM

    out = Path(sys.argv[1])
    PartialState()  # gloo on CPU under torchrun; accelerate's logger needs it
    rank = dist.get_rank()
    torch.manual_seed(0)
    gc.collect()
    before_model = _rss()
    model = LlamaForCausalLM(LlamaConfig(**CONFIG)).to(torch.bfloat16)
    gc.collect()
    before_prepare = _rss()
    plugin = FullyShardedDataParallelPlugin(
        fsdp_version=2,
        auto_wrap_policy="transformer_based_wrap",
        transformer_cls_names_to_wrap=["LlamaDecoderLayer"],
        mixed_precision_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32),
        cpu_ram_efficient_loading=False,
    )
    accelerator = SimpleNamespace(
        state=SimpleNamespace(fsdp_plugin=plugin),
        mixed_precision="bf16",
        is_main_process=rank == 0,
        torch_device_mesh=None,
        device=torch.device("cpu"),
    )
    hwm = _reset_peak()
    model = fsdp2_prepare_model(accelerator, model)
    peak = _peak() - before_prepare
    shards = [p.to_local() if hasattr(p, "to_local") else p for p in model.parameters()]
    res = {
        "rank": rank,
        "hwm_reset": hwm,
        "total": sum(p.numel() for p in model.parameters()),
        "model_rss": before_prepare - before_model,
        "prepare_peak": peak,
        "shard_bytes": sum(s.numel() * s.element_size() for s in shards),
        "shard_dtypes": sorted({str(s.dtype) for s in shards}),
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank{rank}.json").write_text(json.dumps(res))
    sys.stdout.flush()
    import os

    os._exit(0)  # skip interpreter teardown (gloo threads)


if __name__ == "__main__":
    sys.exit(main())
