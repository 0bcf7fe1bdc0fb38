"""Knowledge-base entries for training-framework failures (LLaMA-Factory, TRL, OpenRLHF/Ray, ms-swift, HF Trainer
with DeepSpeed): each is named by `zerodoctor diagnose` on a realistic multi-rank log, above the generic failure
class, and not on its look-alikes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from zerodoctor.cli.main import main
from zerodoctor.kb.loader import load_entries

# A healthy ZeRO-3 start that precedes every failure below (what a real log carries before the error).
PREFIX = """\
[2024-06-11 10:00:01,100] [INFO] [real_accelerator.py:203:get_accelerator] Setting ds_accelerator to cuda (auto detect)
[INFO|trainer.py:2134] 2024-06-11 10:00:05,284 >> ***** Running training *****
[rank1]: Invalidate trace cache @ step 0 and module 412: cache has only 0 modules
"""

CASES = {
    "fw-trl-create-reference-model-zero3": """\
[rank1]: Traceback (most recent call last):
[rank1]:   File "/opt/conda/lib/python3.10/site-packages/swift/trainers/dpo_trainer.py", line 26, in __init__
[rank1]:     self.ref_model = create_reference_model(model)
[rank1]:   File "/opt/conda/lib/python3.10/site-packages/trl/models/modeling_base.py", line 624, in create_reference_model
[rank1]:     raise ValueError(
[rank1]: ValueError: DeepSpeed ZeRO-3 is enabled and is not compatible with `create_reference_model()`. Please instantiate your reference model directly with `AutoCausalLM.from_pretrained()`.
""",
    "fw-z3-defragment-mixed-dtype": """\
[rank0]: Traceback (most recent call last):
[rank0]:   File "/opt/conda/lib/python3.11/site-packages/deepspeed/runtime/zero/stage3.py", line 302, in __init__
[rank0]:     self._create_fp16_partitions_with_defragmentation(self.trainable_param_groups)
[rank0]:   File "/opt/conda/lib/python3.11/site-packages/deepspeed/runtime/zero/stage3.py", line 525, in defragment
[rank0]:     assert len(set(t.dtype for t in tensors)) == 1
[rank0]: AssertionError
""",
    "fw-dummyoptim-not-replaced": """\
Traceback (most recent call last):
  File "/usr/local/lib/python3.10/site-packages/transformers/trainer.py", line 1881, in _inner_training_loop
    self.optimizer.step()
AttributeError: 'DummyOptim' object has no attribute 'step'
""",
    "fw-zero-stage-requires-optimizer": """\
[rank3]:   File "/usr/local/lib/python3.10/site-packages/deepspeed/runtime/engine.py", line 1563, in _configure_zero_optimizer
[rank3]:     assert not isinstance(optimizer, DummyOptim), "zero stage {} requires an optimizer".format(zero_stage)
[rank3]: AssertionError: zero stage 1 requires an optimizer
""",
    "fw-lf-z3-ptq-quantized-model": """\
[rank2]:   File "/app/src/llamafactory/model/model_utils/quantization.py", line 112, in configure_quantization
[rank2]:     raise ValueError("DeepSpeed ZeRO-3 or FSDP is incompatible with PTQ-quantized models.")
[rank2]: ValueError: DeepSpeed ZeRO-3 or FSDP is incompatible with PTQ-quantized models.
""",
    "fw-ray-memory-monitor-oom": """\
(CriticModelRayActor pid=5313) [2024-01-24 13:07:02,955] [INFO] [logging.py:96:log_dist] [Rank 0] DeepSpeed Basic Optimizer = DeepSpeedCPUAdam
Traceback (most recent call last):
  File "/usr/local/lib/python3.10/dist-packages/ray/_private/worker.py", line 863, in get_objects
    raise value
ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on memory.
""",
    "fw-ray-worker-died-system-error": """\
(pid=4102) Train epoch [1/1]: 100%|##########| 8/8 [00:15<00:00,  1.88s/it]
The actor is dead because its worker process has died. Worker exit type: SYSTEM_ERROR Worker exit detail: Worker unexpectedly exits with a connection error code 2. End of file. There are some potential root causes. (1) The process is killed by SIGKILL by OOM killer due to high memory usage. (2) ray stop --force is called. (3) The worker is crashed unexpectedly due to SIGSEGV or other unexpected errors.
""",
    "fw-trl-z3-generation-hook-trace": """\
[rank0]:   File "/opt/conda/lib/python3.11/site-packages/trl/trainer/gkd_trainer.py", line 340, in training_step
[rank0]:   File "/opt/conda/lib/python3.11/site-packages/deepspeed/runtime/zero/partitioned_param_coordinator.py", line 217, in record_parameters
[rank0]:     step_id = self.__step_id_module_fetched_for[sub_module.ds_id].popleft()
[rank0]: IndexError: pop from an empty deque
""",
    "fw-lf-parser-refuses-deepspeed-combo": """\
[rank1]:   File "/app/src/llamafactory/hparams/parser.py", line 298, in get_train_args
[rank1]:     raise ValueError("GaLore and APOLLO are incompatible with DeepSpeed yet.")
[rank1]: ValueError: GaLore and APOLLO are incompatible with DeepSpeed yet.
""",
    "fw-accelerate-transformers-version-mismatch": """\
{'train_runtime': 42088.2092, 'train_samples_per_second': 8.1, 'train_steps_per_second': 0.018, 'train_loss': 0.7072, 'epoch': 1.0}
Traceback (most recent call last):
  File "/opt/conda/lib/python3.10/site-packages/transformers/trainer.py", line 2758, in save_model
    state_dict = self.accelerator.get_state_dict(self.deepspeed)
  File "/opt/conda/lib/python3.10/site-packages/accelerate/accelerator.py", line 2920, in get_state_dict
    if self.deepspeed_config["zero_optimization"]["stage"] == 3:
AttributeError: 'Accelerator' object has no attribute 'deepspeed_config'
""",
    "fw-accelerate-optimizer-in-config-and-code": """\
  File "/opt/conda/lib/python3.10/site-packages/accelerate/accelerator.py", line 1537, in _prepare_deepspeed
    raise ValueError(
ValueError: You cannot specify an optimizer in the config file and in the code at the same time. Please remove the optimizer from the config file or create `accelerate.utils.DummyOptim` in the code.
""",
    "fw-exitcode-7-sigbus-shm": """\
[2024-06-11 10:00:09,500] [INFO] [launch.py:316:sigkill_handler] Killing subprocess 402434
[2024-06-11 10:00:09,700] [ERROR] [launch.py:322:sigkill_handler] ['/usr/bin/python3', '-u', 'train.py', '--local_rank=1'] exits with return code = -7
""",
    "fw-z3-init-meta-tensor-copy": """\
[INFO|modeling_utils.py:3880] 2025-07-14 02:55:11,441 >> Detected DeepSpeed ZeRO-3: activating zero.init() for this model
[rank1]: Traceback (most recent call last):
[rank1]:   File "/opt/conda/lib/python3.10/site-packages/deepspeed/runtime/zero/partition_parameters.py", line 521, in wrapper
[rank1]:     f(module, *args, **kwargs)
[rank1]: NotImplementedError: Cannot copy out of meta tensor; no data!
""",
    "fw-accelerate-device-map-auto-distributed": """\
[rank1]:   File "/opt/conda/lib/python3.10/site-packages/accelerate/accelerator.py", line 1472, in prepare
[rank1]:     raise ValueError(
[rank1]: ValueError: You can't train a model that has been loaded with `device_map='auto'` in any distributed mode. Please rerun your script specifying `--num_processes=1` or by launching with `python {{myscript.py}}`.
""",
    "fw-z3-init-weights-padding-idx-size0": """\
[rank0]:   File "/opt/conda/lib/python3.12/site-packages/transformers/modeling_utils.py", line 2952, in _initialize_weights
[rank0]:     self._init_weights(module)
[rank0]: IndexError: index 0 is out of bounds for dimension 0 with size 0
""",
}


def _findings(tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str) -> list[dict[str, object]]:
    log = tmp_path / "run.log"
    log.write_text(text, encoding="utf-8")
    code = main(["diagnose", str(log), "--format", "json"])
    out = capsys.readouterr().out
    assert code in (0, 1)
    report = json.loads(out)
    return report["findings"] if isinstance(report, dict) else report


def test_every_framework_entry_has_a_case() -> None:
    ids = {e.id for e in load_entries() if e.id.startswith("fw-")}
    assert ids == set(CASES)


@pytest.mark.parametrize("entry_id", sorted(CASES))
def test_framework_failure_is_named(
    entry_id: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    findings = _findings(tmp_path, capsys, PREFIX + CASES[entry_id])
    assert findings[0]["id"] == entry_id, [f["id"] for f in findings]
    assert findings[0]["severity"] == "error"


def test_cuda_oom_inside_a_ray_actor_is_not_a_host_oom(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = PREFIX + (
        "(ActorModelRayActor pid=8249) torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. "
        "GPU 0 has a total capacity of 79.15 GiB of which 1.10 GiB is free.\n"
    )
    ids = [f["id"] for f in _findings(tmp_path, capsys, text)]
    assert "fw-ray-memory-monitor-oom" not in ids
    assert "fw-ray-worker-died-system-error" not in ids


def test_healthy_trace_cache_warnings_raise_no_framework_entry(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    findings = _findings(
        tmp_path, capsys, PREFIX + "{'loss': 0.8527, 'learning_rate': 1.28e-07, 'epoch': 0.0}\n"
    )
    assert not [f["id"] for f in findings if f["severity"] == "error"]
    assert not [f["id"] for f in findings if str(f["id"]).startswith("fw-")]
