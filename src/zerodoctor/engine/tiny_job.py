"""A tiny real DeepSpeed training job, one process per rank (run under `torchrun --nproc_per_node N`).

It builds a 2-layer Llama from a config (no download, random weights), hands it with the given DeepSpeed
config to `deepspeed.initialize`, runs optimizer steps with gradient clipping, saves a checkpoint, reloads it,
and writes one JSON result per rank: what worked, the exception (type, message, traceback) if something
failed, and the optimizer/engine facts DeepSpeed reports. Without a GPU, DeepSpeed uses its CPU accelerator
and gloo, and ZeRO-3 with optimizer and parameter offload takes the same code paths (docs/memory-model.md, what CPU can show).

Usage: torchrun --nproc_per_node 2 -m zerodoctor.engine.tiny_job CONFIG.json OUT_DIR [--steps N] [--client-optimizer]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 256,
    "max_position_embeddings": 128,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
}


def _result_path(out_dir: Path, rank: int) -> Path:
    return out_dir / f"rank{rank}.json"


def run(config_path: Path, out_dir: Path, steps: int, client_optimizer: bool = False) -> dict[str, Any]:
    rank = int(os.environ.get("RANK", "0"))
    result: dict[str, Any] = {
        "rank": rank,
        "world_size": int(os.environ.get("WORLD_SIZE", "1")),
        "stages": [],
    }
    t0 = time.time()
    try:
        import deepspeed
        import torch

        # imported before zero.Init (inside it: `zerodoctor kb` zero-init signature mismatch)
        from transformers import LlamaConfig, LlamaForCausalLM

        result["versions"] = {"torch": torch.__version__, "deepspeed": deepspeed.__version__}
        config = json.loads(config_path.read_text())
        deepspeed.init_distributed()
        torch.manual_seed(0)
        model = LlamaForCausalLM(LlamaConfig(**TINY_LLAMA))
        result["stages"].append("model")
        if client_optimizer:  # the script builds its optimizer, as plain DeepSpeed scripts and mmengine do
            client = torch.optim.AdamW(model.parameters(), lr=1e-3)
            engine, optimizer, _, _ = deepspeed.initialize(model=model, optimizer=client, config=config)
        else:
            engine, optimizer, _, _ = deepspeed.initialize(
                model=model, model_parameters=model.parameters(), config=config
            )
        result["stages"].append("initialize")
        result["optimizer"] = type(optimizer).__name__
        result["zero_stage"] = engine.zero_optimization_stage()
        result["offload_optimizer"] = bool(
            engine.zero_offload_optimizer() and engine.zero_offload_optimizer().device != "none"
        )
        result["offload_param"] = bool(
            engine.zero_offload_param() and engine.zero_offload_param().device != "none"
        )
        gen = torch.Generator().manual_seed(rank)
        losses = []
        for _ in range(steps * engine.gradient_accumulation_steps()):
            ids = torch.randint(
                0, TINY_LLAMA["vocab_size"], (engine.train_micro_batch_size_per_gpu(), 16), generator=gen
            )
            ids = ids.to(engine.device)
            loss = engine(input_ids=ids, labels=ids).loss
            engine.backward(loss)
            engine.step()
            losses.append(float(loss))
        result["stages"].append("train")
        result["losses"] = losses
        result["global_steps"] = engine.global_steps
        ckpt = out_dir / "ckpt"
        engine.save_checkpoint(str(ckpt), tag="step")
        result["stages"].append("save")
        engine.load_checkpoint(str(ckpt), tag="step")
        result["stages"].append("load")
        result["ok"] = True
    except BaseException as exc:  # the point is to report it, whatever it is
        result["ok"] = False
        result["error"] = {
            "type": type(exc).__name__,
            "message": str(exc),
            "traceback": traceback.format_exc(),
        }
    result["seconds"] = round(time.time() - t0, 2)
    out_dir.mkdir(parents=True, exist_ok=True)
    _result_path(out_dir, rank).write_text(json.dumps(result, indent=2, default=str))
    _shutdown_distributed()
    return result


def _shutdown_distributed() -> None:
    """Leave the process group cleanly; a failure here must not hide the result already written."""
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.barrier()
            dist.destroy_process_group()
    except Exception:  # noqa: BLE001 - teardown is best effort, the verdict is in the result file
        pass


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="zerodoctor.engine.tiny_job")
    p.add_argument("config", type=Path)
    p.add_argument("out_dir", type=Path)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument(
        "--client-optimizer", action="store_true", help="pass a torch AdamW to deepspeed.initialize"
    )
    a = p.parse_args(argv)
    return 0 if run(a.config, a.out_dir, a.steps, a.client_optimizer).get("ok") else 1


def exit_without_teardown(code: int) -> None:
    """End a torchrun worker without interpreter teardown. With gloo and DeepSpeed's CPU ops, a C++ worker
    thread still alive at exit can abort the process ("terminate called without an active exception",
    SIGABRT) after the job succeeded: about one run in four on a busy 2-core machine. Call it once the result
    file is written."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_without_teardown(main())
