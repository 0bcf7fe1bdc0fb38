"""A tiny real ZeRO-3 (offload_optimizer + offload_param) job on CPU/gloo for the guard's tests.

Run under torchrun: python -m torch.distributed.run --nproc_per_node 2 guard_job.py MODE OUT [flags]
MODE hf: HF Trainer (callback unless --no-callback, for `zerodoctor guard --`); MODE ds: plain
deepspeed.initialize loop with zerodoctor.guard.watch (unless --no-watch, for `zerodoctor guard --`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
from pathlib import Path
from typing import Any

from zerodoctor.engine.tiny_job import TINY_LLAMA, exit_without_teardown

DS = {
    "train_micro_batch_size_per_gpu": 2,
    "gradient_accumulation_steps": 1,
    "gradient_clipping": 1.0,
    "zero_optimization": {
        "stage": 3,
        "offload_optimizer": {"device": "cpu", "pin_memory": True},
        "offload_param": {"device": "cpu", "pin_memory": True},
        "stage3_gather_16bit_weights_on_model_save": True,
    },
}
INJECTED = "Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!"
OOM = (
    "CUDA out of memory. Tried to allocate 3.39 GiB. GPU 0 has a total capacity of 79.32 GiB of which 1.20 GiB "
    "is free. Of the allocated memory 73.29 GiB is allocated by PyTorch, and 2.11 GiB is reserved by PyTorch but "
    "unallocated."
)
GROW: list[bytearray] = []


class Ids:
    def __init__(self, n: int, seed: int) -> None:
        import torch

        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, 256, (n, 16), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def grow() -> None:
    block = bytearray(48 << 20)
    block[::4096] = b"x" * len(block[::4096])  # touch every page so RSS grows
    GROW.append(block)


def busy_elsewhere(seconds: float) -> None:
    import time

    time.sleep(seconds)


def wrong_device_check(engine, out: Path, rank: int) -> None:
    import torch

    from zerodoctor.guard import check_tensors_device

    before = check_tensors_device(engine)
    name, p = next((n, p) for n, p in engine.module.named_parameters() if hasattr(p, "ds_tensor"))
    p.ds_tensor = torch.empty(p.ds_tensor.shape, dtype=p.ds_tensor.dtype, device="meta")
    after = check_tensors_device(engine)
    (out / f"wrong_device_rank{rank}.json").write_text(
        json.dumps(
            {"before": [f.to_dict() for f in before], "after": [f.to_dict() for f in after], "moved": name}
        )
    )


def run_hf(a: argparse.Namespace, out: Path) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback, TrainingArguments

    rank = int(os.environ.get("RANK", "0"))
    args = TrainingArguments(
        output_dir=str(out),
        deepspeed=DS,
        per_device_train_batch_size=2,
        gradient_accumulation_steps=1,
        max_steps=a.steps,
        save_steps=a.save_steps,
        save_strategy="steps",
        eval_strategy="steps",
        eval_steps=a.save_steps,
        per_device_eval_batch_size=2,
        logging_steps=2,
        learning_rate=1e-3,
        report_to=[],
        use_cpu=True,
        dataloader_num_workers=0,
        save_total_limit=1,
        disable_tqdm=True,
    )
    model = LlamaForCausalLM(LlamaConfig(**TINY_LLAMA))

    class Grow(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            if a.grow and state.global_step >= 2:
                grow()

    class Late(
        TrainerCallback
    ):  # rank 1 is held up after a step; rank 0 goes on into the next step's gathers
        def on_step_end(self, args, state, control, **kw):
            if a.hang_seconds and rank == 1 and state.global_step == a.steps - 2:
                busy_elsewhere(a.hang_seconds)

    reported: list[dict] = []

    class Reporter(TrainerCallback):  # stands for TensorBoard / W&B: sees what on_log hands to reporters
        def on_log(self, args, state, control, logs=None, **kw):
            reported.append(dict(logs or {}))

    trainer = Trainer(model=model, args=args, train_dataset=Ids(64, rank), eval_dataset=Ids(4, 7))
    trainer.add_callback(Grow())
    trainer.add_callback(Late())
    trainer.add_callback(Reporter())
    if not a.no_callback:
        from zerodoctor.guard import ZeroDoctorCallback

        ZeroDoctorCallback.attach(trainer)
    trainer.train()
    (out / f"done_rank{rank}.json").write_text(
        json.dumps({"global_step": trainer.state.global_step, "reported": reported})
    )
    if a.wrong_device:
        wrong_device_check(trainer.model_wrapped, out, rank)
    if a.raise_on_rank is not None and rank == a.raise_on_rank:
        import torch

        raise torch.OutOfMemoryError(OOM)


def run_ds(a: argparse.Namespace, out: Path) -> None:
    import deepspeed
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    import zerodoctor.guard

    deepspeed.init_distributed()
    rank = int(os.environ.get("RANK", "0"))
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**TINY_LLAMA))
    cfg = {**DS, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}
    engine, _opt, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    data = Ids(128, rank)
    guard: Any = contextlib.nullcontext()  # --no-watch: `zerodoctor guard --` watches the engine
    if not a.no_watch:
        guard = zerodoctor.guard.watch(engine, run_dir=out, samples=len(data), max_steps=a.steps)
    with guard:
        for step in range(a.steps):
            ids = data.ids[2 * step : 2 * step + 2].to(engine.device)
            loss = engine(input_ids=ids, labels=ids).loss
            engine.backward(loss)
            engine.step()
            if a.grow and step >= 1:
                grow()
            if (step + 1) % a.save_steps == 0:
                engine.save_checkpoint(str(out / "ckpt"), tag=f"step{step + 1}")
        (out / f"done_rank{rank}.json").write_text(json.dumps({"global_step": engine.global_steps}))
        if a.wrong_device:
            wrong_device_check(engine, out, rank)
        if a.hang_seconds:
            if rank == 1:
                busy_elsewhere(a.hang_seconds)  # rank 1 is late; rank 0 waits in the collective
            torch.distributed.barrier()
        if a.raise_on_rank is not None and rank == a.raise_on_rank:
            raise RuntimeError(INJECTED)
    if not a.no_watch:
        guard.close()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["hf", "ds"])
    p.add_argument("out", type=Path)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--save-steps", type=int, default=4)
    p.add_argument("--grow", action="store_true")
    p.add_argument("--wrong-device", action="store_true")
    p.add_argument("--raise-on-rank", type=int)
    p.add_argument("--no-callback", action="store_true")
    p.add_argument("--no-watch", action="store_true")
    p.add_argument(
        "--local_rank", type=int, help="passed by the deepspeed launcher (LOCAL_RANK is read instead)"
    )
    p.add_argument("--hang-seconds", type=float, default=0)
    a = p.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    (run_hf if a.mode == "hf" else run_ds)(a, a.out)
    exit_without_teardown(0)


if __name__ == "__main__":
    main()
