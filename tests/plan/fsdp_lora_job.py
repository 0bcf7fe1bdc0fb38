"""One rank of a real torch FSDP1 LoRA job on CPU (gloo), wrapped as PEFT documents it for FSDP: PEFT's own
`fsdp_auto_wrap_policy` (every LoRA Linear a unit of its own, every decoder layer a unit) with
`use_orig_params=False` (fp32 throughout: which FlatParameter gets a gradient does not depend on the dtype, and
CPU autocast across nested units is not what is tested). Writes, per rank, which FlatParameters require grad and how large they are unsharded,
and the largest unsharded gradient any FlatParameter held during backward (sampled in every module's backward
hook and in each FlatParameter's post-accumulate-grad hook).

Run by tests/plan/test_fsdp_lora_engine.py: `torchrun --nproc_per_node 2 fsdp_lora_job.py OUT`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from peft import LoraConfig, get_peft_model
from peft.utils.other import fsdp_auto_wrap_policy
from transformers import LlamaConfig, LlamaForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fsdp_job import CONFIG  # noqa: E402  (the same tiny Llama as the FSDP state test)

LORA_RANK = 4
TARGETS = ["q_proj", "v_proj"]


def tiny_lora_model() -> torch.nn.Module:
    """The tiny Llama in fp32 with PEFT LoRA adapters on TARGETS (seeded: every rank builds the same)."""
    torch.manual_seed(0)
    base = LlamaForCausalLM(LlamaConfig(**CONFIG)).float()
    return get_peft_model(base, LoraConfig(r=LORA_RANK, target_modules=TARGETS, lora_dropout=0.0))


def main() -> int:
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import ShardingStrategy

    out = Path(sys.argv[1])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = tiny_lora_model()
    model = FSDP(
        model,
        auto_wrap_policy=fsdp_auto_wrap_policy(model),
        sharding_strategy=ShardingStrategy.FULL_SHARD,
        use_orig_params=False,
        device_id=torch.device("cpu"),
    )
    handles = [m._handle for m in FSDP.fsdp_modules(model) if m._handle is not None]
    peak = [0]

    def sample(*_: object) -> None:
        # autograd writes a FlatParameter's gradient unsharded before the post-backward hook reduce-scatters it
        for h in handles:
            g = h.flat_param.grad
            if g is not None:
                peak[0] = max(peak[0], g.numel())

    for m in model.modules():
        m.register_full_backward_hook(sample)
    for h in handles:
        if h.flat_param.requires_grad:
            h.flat_param.register_post_accumulate_grad_hook(lambda p: sample())
    ids = torch.randint(0, CONFIG["vocab_size"], (1, 16))
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    units = [
        {
            "unsharded": int(h.flat_param._unpadded_unsharded_size.numel()),
            "requires_grad": h.flat_param.requires_grad,
        }
        for h in handles
    ]
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank{rank}.json").write_text(json.dumps({"units": units, "max_unsharded_grad_numel": peak[0]}))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
