"""A training run never empties PyTorch's cache between its phases (`allocator.RUN_KEEPS_CACHE`), so the reserved
bytes it reports (ms-swift's `memory(GiB)` = `max_memory_reserved`, an OOM message) include what earlier phases
left cached, where `benchmarks/plan_gpu.py` empties the cache at each phase's end. Checked on the real engine:
DeepSpeed ZeRO-2 and ZeRO-3 on 2 gloo ranks (tests/plan/cache_carry_job.py), and the HF Trainer's loop in one
process."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

HERE = Path(__file__).resolve().parent


@pytest.mark.engine
def test_deepspeed_empties_the_cache_only_while_it_flattens_at_init() -> None:
    """DeepSpeed empties the cache only inside `initialize`: ZeRO-2 in stage_1_and_2.py
    `DeepSpeedZeroOptimizer.__init__` before it flattens each parameter group, ZeRO-3 in runtime/zero/utils.py
    `defragment` (the 16-bit partitions copied through a host buffer into one flat buffer); never in a
    forward/backward or a step."""
    sys.path.insert(0, str(HERE))
    from test_fsdp_engine import torchrun_job

    ranks = torchrun_job(HERE / "cache_carry_job.py", "2,3")
    assert len(ranks) == 2
    for rank in ranks:
        by_stage = {r["stage"]: r["calls"] for r in rank["stages"]}
        assert set(by_stage) == {2, 3}
        for stage in (2, 3):
            assert by_stage[stage] == ["init"], stage  # one parameter group: once, while it is flattened


@pytest.mark.engine
def test_hf_trainer_empties_the_cache_once_before_training(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """transformers `Trainer._inner_training_loop` calls `accelerator.free_memory()` (gc + empty_cache) once, before
    the model is prepared, and `clear_device_cache` per step only with `torch_empty_cache_steps` (default None)."""
    import accelerate.utils.memory as acc_memory
    import torch
    import transformers.trainer as hf_trainer
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

    sys.path.insert(0, str(HERE))
    from cache_carry_job import CONFIG

    calls: list[int] = []
    steps: list[int] = []
    original = acc_memory.clear_device_cache

    def counted(garbage_collection: bool = False) -> None:
        calls.append(len(steps))
        original(garbage_collection=garbage_collection)

    monkeypatch.setattr(acc_memory, "clear_device_cache", counted)
    monkeypatch.setattr(hf_trainer, "clear_device_cache", counted)

    class Steps(hf_trainer.TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
            steps.append(state.global_step)

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**CONFIG))
    ids = torch.randint(0, CONFIG["vocab_size"], (4, 16))
    data = [{"input_ids": row, "labels": row} for row in ids]
    args = TrainingArguments(
        output_dir=str(tmp_path), max_steps=3, per_device_train_batch_size=1, report_to=[], save_strategy="no",
        use_cpu=True, logging_strategy="no",
    )  # fmt: skip
    assert args.torch_empty_cache_steps is None
    Trainer(model=model, args=args, train_dataset=data, callbacks=[Steps()]).train()
    assert steps == [1, 2, 3]
    assert calls == [0]  # once, before the first step; never between steps
