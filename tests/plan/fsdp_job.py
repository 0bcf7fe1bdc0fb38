"""One rank of a real torch FSDP job on CPU (gloo), as accelerate sets it up: a tiny Llama built from a config,
every decoder layer one unit, trainable parameters in fp32 (accelerate's upcast), bf16 MixedPrecision.
Writes what the rank holds: sharded parameter, gradient and AdamW-state bytes, and the largest number of
unsharded elements sampled at every module's forward and backward (an all-gather in flight counts).

Run by tests/plan/test_fsdp_engine.py: `torchrun --nproc_per_node 2 fsdp_job.py OUT V:OFFLOAD:PREFETCH[:PURE] ...`
(one model per configuration, in one process group; FSDP1 CPU offload pins memory, which needs a GPU). PURE 1 is
llama-recipes' `pure_bf16`: the model cast to bf16 and FSDP1 without MixedPrecision (its llama_finetuning.py).
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.models.llama.modeling_llama import LlamaDecoderLayer

CONFIG = {
    "hidden_size": 64,
    "intermediate_size": 160,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 250,
    "max_position_embeddings": 64,
    "tie_word_embeddings": False,
}


def _nbytes(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.numel() * t.element_size()


def main() -> int:
    out = Path(sys.argv[1])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    results = []
    for spec in sys.argv[2:]:
        version, offload, prefetch, *pure = (int(x) for x in spec.split(":"))
        results.append({"config": spec, **run_one(version, bool(offload), bool(prefetch), bool(pure and pure[0]))})
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank{rank}.json").write_text(json.dumps(results))
    dist.destroy_process_group()
    return 0


def run_one(version: int, offload: bool, prefetch: bool, pure: bool = False) -> dict[str, int]:
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**CONFIG)).float()  # fp32 = the upcast trainable storage
    if pure:
        model = model.to(torch.bfloat16)  # llama_finetuning.py: `if fsdp_config.pure_bf16: model.to(torch.bfloat16)`
    live = [0]
    if version == 1:
        from torch.distributed.fsdp import BackwardPrefetch, CPUOffload, MixedPrecision, ShardingStrategy
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

        model = FSDP(
            model,
            auto_wrap_policy=functools.partial(
                transformer_auto_wrap_policy, transformer_layer_cls={LlamaDecoderLayer}
            ),
            sharding_strategy=ShardingStrategy.FULL_SHARD,
            cpu_offload=CPUOffload(offload_params=offload),
            mixed_precision=None if pure else MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16),
            backward_prefetch=BackwardPrefetch.BACKWARD_PRE if prefetch else None,
            use_orig_params=True,
            device_id=torch.device("cpu"),
        )
        handles = [m._handle for m in FSDP.fsdp_modules(model) if m._handle is not None]

        def sample(*_: object) -> None:
            # An unsharded FlatParameter's padded buffer has storage; resharding frees it (resize_(0)).
            n = sum(
                h.flat_param._full_param_padded.numel()
                for h in handles
                if h.flat_param._full_param_padded.untyped_storage().size() > 0
            )
            live[0] = max(live[0], n)

        for m in model.modules():
            m.register_forward_hook(sample)
            m.register_full_backward_hook(sample)
    else:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        kw = {
            "mesh": mesh,
            "mp_policy": MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16),
            **({"offload_policy": CPUOffloadPolicy(pin_memory=False)} if offload else {}),
        }
        for layer in model.model.layers:
            fully_shard(layer, **kw)
        fully_shard(model.model.embed_tokens, **kw)
        fully_shard([model.model.norm, model.lm_head], **{**kw, "reshard_after_forward": False})
        fully_shard(model, **kw)
        from torch.distributed.fsdp._fully_shard._fsdp_param import ShardedState

        groups = [
            g
            for m in model.modules()
            if hasattr(m, "_get_fsdp_state") and (g := m._get_fsdp_state()._fsdp_param_group) is not None
        ]

        def sample(*_: object) -> None:
            # a group counts from its all-gather (in flight, `_all_gather_result`) until it is resharded
            n = sum(
                sum(fp._orig_size.numel() for fp in g.fsdp_params)
                for g in groups
                if g._all_gather_result is not None
                or any(fp.sharded_state == ShardedState.UNSHARDED for fp in g.fsdp_params)
            )
            live[0] = max(live[0], n)

        for m in model.modules():
            m.register_forward_hook(sample)
            m.register_full_backward_hook(sample)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, CONFIG["vocab_size"], (1, 16))
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    if version == 1:
        grad_bytes = sum(_nbytes(h.flat_param.grad) for h in handles)
    else:
        grad_bytes = sum(_nbytes(p.grad.to_local()) for p in model.parameters() if p.grad is not None)
    opt.step()
    if version == 1:  # the shard exists after FSDP's lazy init (first forward)
        param_bytes = sum(_nbytes(h.flat_param._local_shard) for h in handles)
    else:
        param_bytes = sum(_nbytes(p.to_local()) for p in model.parameters())
    opt_bytes = 0
    for state in opt.state.values():
        for key in ("exp_avg", "exp_avg_sq"):
            t = state[key]
            opt_bytes += _nbytes(t.to_local() if hasattr(t, "to_local") else t)
    no_sync_grad_bytes = 0
    if version == 1 and not offload:
        # A gradient-accumulation micro-batch as HF Trainer / accelerate run it: zero_grad (set_to_none), then a
        # backward under no_sync: what each FlatParameter's .grad holds until the micro-batch that syncs.
        opt.zero_grad(set_to_none=True)
        with model.no_sync():
            model(input_ids=ids, labels=ids).loss.backward()
        no_sync_grad_bytes = sum(_nbytes(h.flat_param.grad) for h in handles)
    return {
        "param_bytes": param_bytes,
        "grad_bytes": grad_bytes,
        "optimizer_bytes": opt_bytes,
        "max_unsharded_numel": live[0],
        "no_sync_grad_bytes": no_sync_grad_bytes,
    }


if __name__ == "__main__":
    raise SystemExit(main())
