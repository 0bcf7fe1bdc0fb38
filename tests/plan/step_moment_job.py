"""One rank of a real DeepSpeed ZeRO-2 / ZeRO-3 job on CPU (DeepSpeed's CPU accelerator, gloo) that records which
tensors the first `engine.step()` creates and when each is freed: every storage an aten op returns during the step
(not a view or an in-place op's result) is counted until its last reference goes (polled through `StorageWeakRef` after every op, in a
`TorchDispatchMode`). Writes per rank the peak of those live bytes, the fp32 master / gradient partition sizes, and
the flattened 16-bit gradient copy's size, for a Llama built from a config in bf16 with torch AdamW
(`optimizer.params.torch_adam: true`: single-tensor on CPU, one fp32 temporary per updated tensor).

Run by tests/plan/test_step_moment.py: `torchrun --nproc_per_node 2 step_moment_job.py OUT STAGE[,STAGE...]`
(one launch for several stages: the launch and DeepSpeed's import are most of the time).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

CONFIG = {
    "hidden_size": 128,
    "intermediate_size": 344,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "vocab_size": 1000,
    "max_position_embeddings": 64,
    "tie_word_embeddings": False,
}


def main() -> int:
    import deepspeed
    import torch

    out, stages = Path(sys.argv[1]), [int(x) for x in sys.argv[2].split(",")]
    deepspeed.init_distributed()
    rank = torch.distributed.get_rank()
    results = [_one(stage) for stage in stages]
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank{rank}.json").write_text(json.dumps({"rank": rank, "stages": results}))
    torch.distributed.barrier()
    return 0


def build_engine(stage: int) -> Any:
    """`deepspeed.initialize` of the tiny Llama in bf16 under ZeRO `stage`, torch AdamW (also cache_carry_job.py)."""
    import deepspeed
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**CONFIG)).to(torch.bfloat16)
    cfg = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "bf16": {"enabled": True},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True}},
        "zero_optimization": {"stage": stage},
    }
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    return engine


def _one(stage: int) -> dict[str, Any]:
    import torch
    from torch.multiprocessing.reductions import StorageWeakRef
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    engine = build_engine(stage)
    ids = torch.randint(0, CONFIG["vocab_size"], (1, 16))
    engine.backward(engine(input_ids=ids, labels=ids).loss)

    class Live(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.live: dict[int, tuple[Any, int]] = {}
            self.now = 0
            self.peak = 0
            self.trace: list[tuple[str, int, int]] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            res = func(*args, **(kwargs or {}))
            if any(r.alias_info is not None for r in func._schema.returns):
                return res  # an in-place op or a view returns a storage that existed before it
            for key in [k for k, (ref, _) in self.live.items() if ref.expired()]:
                self.now -= self.live.pop(key)[1]
            for t in tree_flatten(res)[0]:
                if isinstance(t, torch.Tensor) and t.untyped_storage().nbytes():
                    st = t.untyped_storage()
                    key = st.data_ptr()
                    if key not in self.live:
                        self.live[key] = (StorageWeakRef(st), st.nbytes())
                        self.now += st.nbytes()
                        if st.nbytes() >= 1 << 18:  # the step's large tensors, in order, for a reader
                            self.trace.append((str(func), st.nbytes(), self.now))
            self.peak = max(self.peak, self.now)
            return res

    opt = engine.optimizer
    with Live() as live:
        engine.step()
    if stage == 3:
        part = sum(int(t.numel()) for t in opt.fp32_partitioned_groups_flat)
    else:
        part = sum(int(t.numel()) for t in opt.single_partition_of_fp32_groups)
    return {"stage": stage, "partition_numel": part, "step_created_peak": live.peak, "trace": live.trace}


if __name__ == "__main__":
    raise SystemExit(main())
