"""A tiny real mmengine job for the guard's hook: mmengine's FlexibleRunner with a DeepSpeedStrategy (XTuner's
runner under `xtuner train --deepspeed`), ZeRO-3 with offload_optimizer + offload_param, 2 gloo ranks on CPU,
a tiny Llama from a config wrapped in an mmengine BaseModel as XTuner wraps its `llm`.

Run under torchrun: python -m torch.distributed.run --nproc_per_node 2 mmengine_job.py OUT [flags]

The config is written as a file and read with mmengine's `Config.fromfile`, as `xtuner train` does; unless
--no-hook it switches the guard on the way a user's config would:
    custom_imports = dict(imports=["zerodoctor.guard.mmengine_hook"], allow_failed_imports=False)
    custom_hooks = [dict(type="ZeroDoctorHook")]
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
from guard_job import DS as GUARD_DS  # this folder is on sys.path: the script's own
from guard_job import INJECTED, Ids
from mmengine.model import BaseModel
from mmengine.registry import DATASETS, MODELS

from zerodoctor.engine.tiny_job import TINY_LLAMA, exit_without_teardown

# the guard job's ZeRO-3 config (offload_optimizer + offload_param, 16-bit weights gathered on save); mmengine
# passes the config's torch optimizer to deepspeed.initialize, which XTuner's offload JSON allows this way
DS = {**GUARD_DS, "zero_force_ds_cpu_optimizer": False}


@MODELS.register_module()
class TinyLlamaLM(BaseModel):
    def __init__(self) -> None:
        super().__init__()
        from transformers import LlamaConfig, LlamaForCausalLM

        torch.manual_seed(0)
        self.llm = LlamaForCausalLM(LlamaConfig(**TINY_LLAMA))

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor, mode: str = "loss") -> dict:
        return {"loss": self.llm(input_ids=input_ids, labels=labels).loss}


DATASETS.register_module(name="TinyIds", module=Ids)  # the HF/DeepSpeed guard job's data


def tolerate_removed_onebit_optimizers() -> None:
    """mmengine 0.10.7's DeepSpeedStrategy registers DeepSpeed's optimizers by importing
    `deepspeed.runtime.fp16.onebit`, which the installed DeepSpeed (0.19.8) no longer has, so constructing the
    strategy raises ModuleNotFoundError (mmengine/_strategy/deepspeed.py register_deepspeed_optimizers). This
    registers the optimizers this DeepSpeed does have instead; the engine, ZeRO-3 and the runner stay real."""
    import mmengine._strategy.deepspeed as mm_ds
    from mmengine.registry import OPTIMIZERS

    def register() -> list[str]:
        from deepspeed.ops.adam import DeepSpeedCPUAdam, FusedAdam

        for cls in (DeepSpeedCPUAdam, FusedAdam):
            if cls.__name__ not in OPTIMIZERS.module_dict:
                OPTIMIZERS.register_module(module=cls)
        return ["DeepSpeedCPUAdam", "FusedAdam"]

    try:
        import deepspeed.runtime.fp16.onebit  # noqa: F401
    except ImportError:
        mm_ds.register_deepspeed_optimizers = register


def write_config(a: argparse.Namespace, out: Path) -> Path:
    ds = {**DS, "gradient_accumulation_steps": a.accum}
    cfg = {
        "model": {"type": "TinyLlamaLM"},
        "work_dir": str(out),
        "launcher": "pytorch",
        "env_cfg": {"dist_cfg": {"backend": "gloo"}},
        "log_level": "WARNING",
        "strategy": {"type": "DeepSpeedStrategy", "config": ds},
        "optim_wrapper": {"type": "DeepSpeedOptimWrapper", "optimizer": {"type": "AdamW", "lr": 1e-3}},
        "train_dataloader": {
            "batch_size": 2,
            "num_workers": 0,
            "dataset": {"type": "TinyIds", "n": a.samples, "seed": 0},
            "sampler": {"type": "DefaultSampler", "shuffle": False},
            "collate_fn": {"type": "default_collate"},
        },
        "train_cfg": {"by_epoch": False, "max_iters": a.iters},
        "default_hooks": {
            "checkpoint": {"type": "CheckpointHook", "interval": a.ckpt_interval, "by_epoch": False},
            "logger": {"type": "LoggerHook", "interval": 2},
        },
    }
    lines = [f"{k} = {v!r}" for k, v in cfg.items()]
    if not a.no_hook:
        lines += [
            "custom_imports = dict(imports=['zerodoctor.guard.mmengine_hook'], allow_failed_imports=False)",
            "custom_hooks = [dict(type='ZeroDoctorHook')]",
        ]
    # one file per rank: every rank writes its config, and a rank that rewrites a shared file while another reads it
    # hands that one an empty config (`KeyError: 'model'` in FlexibleRunner.from_cfg, seen once in CI)
    path = out / f"tiny_config_rank{os.environ.get('RANK', '0')}.py"
    path.write_text("\n".join(lines) + "\n")
    return path


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out", type=Path)
    p.add_argument("--iters", type=int, default=8)
    p.add_argument("--accum", type=int, default=1)
    p.add_argument("--samples", type=int, default=64)
    p.add_argument("--ckpt-interval", type=int, default=4)
    p.add_argument("--no-hook", action="store_true")
    p.add_argument("--raise-on-rank", type=int)
    a = p.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    rank = int(os.environ.get("RANK", "0"))
    import deepspeed
    from mmengine.config import Config
    from mmengine.runner import FlexibleRunner

    # NOTE: mmengine's own init for launcher="pytorch" calls torch.cuda.set_device (mmengine/dist/utils.py,
    # v0.10.7), which a CPU-only machine refuses; initialised here first, the runner uses this process group.
    deepspeed.init_distributed(dist_backend="gloo")
    tolerate_removed_onebit_optimizers()
    cfg = Config.fromfile(str(write_config(a, a.out)))
    runner = FlexibleRunner.from_cfg(cfg)
    runner.train()
    engine = runner.model.model
    (a.out / f"done_rank{rank}.json").write_text(
        json.dumps(
            {
                "iters": runner.iter,
                "global_steps": engine.global_steps,
                "hooks": [type(h).__name__ for h in runner.hooks],
                "logged": sorted(k for k in runner.message_hub.log_scalars if "zerodoctor" in k),
            }
        )
    )
    if a.raise_on_rank is not None and rank == a.raise_on_rank:
        raise RuntimeError(INJECTED)
    exit_without_teardown(0)


if __name__ == "__main__":
    main()
