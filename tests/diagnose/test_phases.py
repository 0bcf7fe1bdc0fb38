"""Phase detection from the run's own markers when there is no traceback (a SIGKILL shows none)."""

from __future__ import annotations

from pathlib import Path

import pytest

from zerodoctor.diagnose import diagnose

KILL = (
    "[2024-06-21 14:00:00,003] [ERROR] [launch.py:434:sigkill_handler] ['/usr/bin/python3', '-u', 'train.py', "
    "'--local_rank=1'] exits with return code = -9\n"
)


@pytest.mark.parametrize(
    ("before", "phase"),
    [
        # LLaMA-Factory / HF datasets map with workers
        (
            "Running tokenizer on dataset (num_proc=16):  41%|####      | 41000/100000 [01:10<01:40, 587.0 examples/s]\n",
            "tokenization",
        ),
        ("Loading checkpoint shards:  43%|####2     | 3/7 [00:41<00:55, 13.9s/it]\n", "load"),
        # DeepSpeed's checkpoint engine reading ZeRO states back (HF resume_from_checkpoint)
        (
            "Continuing training from checkpoint, will skip to saved global_step\n"
            "[2024-06-21 13:59:00,000] [INFO] [torch_checkpoint_engine.py:27:load] [Torch] Loading checkpoint from "
            "out/checkpoint-500/global_step500/zero_pp_rank_1_mp_rank_00_optim_states.pt...\n",
            "resume",
        ),
        (
            "{'loss': 1.02, 'learning_rate': 1e-05, 'epoch': 0.5}\nSaving model checkpoint to out/checkpoint-500\n",
            "checkpoint_save",
        ),
        ("***** Running training *****\n", "first_optimizer_step"),
        ("***** Running Evaluation *****\n  Num examples = 1000\n", "evaluation"),
        # HF Trainer's _load_from_checkpoint names its checkpoint-N folder (a resume); scripts' own first load
        ("[INFO|trainer.py:2145] 2024-06-21 13:59:00,000 >> Loading model from out/checkpoint-500.\n", "resume"),
        ("2024-06-21 13:59:00 - INFO - Loading model from /models/llama-2-7b\n", "load"),
    ],
)
def test_phase_of_a_sigkill_from_the_markers_before_it(tmp_path: Path, before: str, phase: str) -> None:
    log = tmp_path / "run.log"
    log.write_text(before + KILL)
    d = diagnose([str(log)])
    assert d.findings[0].severity.name == "ERROR" and d.first_failure is not None
    assert d.first_failure.exit_code == -9
    assert d.phase == phase, d.findings[0].data


# A paste with no marker and a traceback cut before its frames: the frames' source lines and the failure's own
# message still say the phase (each reason in zerodoctor.diagnose.extract._MESSAGE_PHASE / patterns.py).
_RICH_TO = (
    "│ ❱  905 │   │   │   return t.to(device, dtype if t.is_floating_point() or t.i │\n"
    "│    906 │   │                                                                 │\n"
    "│    907 │   │   return self._apply(convert)                                   │\n"
    "╰──────────────────────────────────────────────────────────────────────────────╯\n"
)
_OOM = (
    "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 896.00 MiB (GPU 2; 79.17 GiB total capacity; "
    "76.68 GiB already allocated; 381.31 MiB free; 77.24 GiB reserved in total by PyTorch)\n"
)
_INDEX_ASSERT = (
    "RuntimeError: CUDA device-side assertion in indexSelectLargeIndex: Assertion `srcIndex < srcSelectDimSize` "
    "failed.\n"
)


@pytest.mark.parametrize(
    ("text", "phase"),
    [
        # Module.to() moving a loaded model onto the GPU (rich traceback, no frame header pasted)
        (_RICH_TO + _OOM, "load"),
        # torch.nn.functional.softmax inside a model's forward, lines prefixed by pdsh's host name
        ("gpu-q-13:     ret = input.softmax(dim, dtype=dtype)\ngpu-q-13: " + _OOM, "training_step"),
        # the same forward while HF Trainer evaluates
        (
            "***** Running Evaluation *****\n  Num examples = 1000\n    ret = input.softmax(dim, dtype=dtype)\n" + _OOM,
            "evaluation",
        ),
        # a token id past the embedding: CUDA's index kernel assertion in Embedding.forward
        (_INDEX_ASSERT, "training_step"),
        # DeepSpeed >= 0.16 refusing no_sync under ZeRO-3: raised when the loop accumulates gradients
        (
            "AssertionError: no_sync context manager is incompatible with gradient partitioning logic of ZeRO stage 3\n",
            "training_step",
        ),
        ("[rank2]: NotImplementedError: Cannot copy out of meta tensor; no data!\n", "load"),
        # a JIT op build failing: deepspeed.initialize builds the optimizer's op
        (
            "FAILED: multi_tensor_adam.cuda.o \nninja: build stopped: subcommand failed.\n"
            "RuntimeError: Error building extension 'fused_adam'\n",
            "engine_init",
        ),
    ],
)
def test_phase_from_frame_source_lines_and_failure_messages(tmp_path: Path, text: str, phase: str) -> None:
    log = tmp_path / "paste.log"
    log.write_text(text, encoding="utf-8")
    d = diagnose([str(log)])
    assert d.findings, text
    assert d.phase == phase, (d.phase, d.findings[0].id, d.findings[0].data)


def test_a_forward_line_outside_a_traceback_does_not_place_a_later_failure(tmp_path: Path) -> None:
    """Hints are read only around the failure: a forward source line printed long before does not count."""
    log = tmp_path / "run.log"
    filler = "".join(f"[INFO] step {i} done\n" for i in range(30))
    log.write_text("    ret = input.softmax(dim, dtype=dtype)\n" + filler + KILL, encoding="utf-8")
    d = diagnose([str(log)])
    assert d.phase == "unknown", d.findings[0].data


def _traceback(*frames: tuple[str, int, str, str], exc: str) -> str:
    body = "".join(f'  File "{f}", line {n}, in {fn}\n    {src}\n' for f, n, fn, src in frames)
    return "Traceback (most recent call last):\n" + body + exc + "\n"


@pytest.mark.parametrize(
    ("text", "phase"),
    [
        # HF datasets' map with workers (a framework's tokenization), Windows paths
        (
            _traceback(
                ("D:\\proj\\train.py", 655, "main", "raw_datasets = raw_datasets.map("),
                ("D:\\venv\\lib\\site-packages\\datasets\\arrow_dataset.py", 3165, "map", "for rank, done in x("),
                ("D:\\venv\\lib\\site-packages\\datasets\\utils\\py_utils.py", 711, "iflatmap_unordered", "raise"),
                exc="RuntimeError: One of the subprocesses has abruptly died during map operation.",
            ),
            "tokenization",
        ),
        # an optimizer's state read back from a checkpoint: a resume, not the first load of the model
        (
            _traceback(
                ("/code/utils/checkpoint.py", 242, "restore", 'self.optimizer.load_state_dict(ckpt["optimizer"])'),
                ("/env/lib/python3.6/site-packages/torch/optim/optimizer.py", 103, "load_state_dict", "deepcopy(sd)"),
                exc="RuntimeError: CUDA out of memory. Tried to allocate 39.12 MiB (GPU 0; 10.76 GiB total capacity; "
                "9.71 GiB already allocated; 5.56 MiB free; 10.13 MiB cached)",
            ),
            "resume",
        ),
        # a model's own load_state_dict is still the load
        (
            _traceback(
                ("/code/train.py", 10, "main", "model.load_state_dict(torch.load(path))"),
                ("/env/lib/python3.10/site-packages/torch/nn/modules/module.py", 2152, "load_state_dict", "raise"),
                exc="RuntimeError: Error(s) in loading state_dict for LlamaForCausalLM:",
            ),
            "load",
        ),
    ],
)
def test_phase_from_what_the_frames_do(tmp_path: Path, text: str, phase: str) -> None:
    log = tmp_path / "tb.log"
    log.write_text(text, encoding="utf-8")
    assert diagnose([str(log)]).phase == phase


# Failure lines and frames a paste keeps when the rest is gone (extract._EVAL_NAME, _SAVE_FUNCS, _RUNPY,
# _CUDA_ERROR_OOM; reader: inline-code backticks).
@pytest.mark.parametrize(
    ("text", "class_id", "phase"),
    [
        # a script's own evaluation function, by name
        (
            _traceback(
                ("train.py", 108, "main", "test(epoch, model, testloader, evaluator_val)"),
                ("train.py", 193, "test", "stats = evaluator.evaluate_predictions(results)"),
                ("/x/models/common.py", 363, "score_fast_model", "scores[~mask] += bias"),
                exc="RuntimeError: CUDA out of memory. Tried to allocate 4.18 GiB (GPU 0; 10.92 GiB total capacity; "
                "4.68 GiB already allocated; 2.44 GiB free; 7.85 GiB reserved in total by PyTorch)",
            ),
            "class:gpu-oom",
            "evaluation",
        ),
        # torch.nn.Module.eval() only switches the mode: an RL rollout inside a training iteration calls it, and the
        # rollout (DeepSpeed-Chat's generate_experience) is the training step
        (
            _traceback(
                ("/x/ppo_trainer.py", 97, "generate_experience", "self.eval()"),
                ("/x/ppo_trainer.py", 237, "eval", "self.actor_model.eval()"),
                exc="TypeError: unsupported operand type(s) for *: 'float' and 'NoneType'",
            ),
            "class:crash",
            "training_step",
        ),
        # Module.state_dict's per-module hook: a state dict built to be written
        (
            _traceback(
                ("/x/bitsandbytes/nn/modules.py", 336, "_save_to_state_dict", "self.weight.data = undo_layout(w)"),
                ("/x/bitsandbytes/autograd/_functions.py", 96, "undo_layout", "outputs = torch.empty_like(tensor)"),
                exc="torch.cuda.OutOfMemoryError: CUDA out of memory.",
            ),
            "class:gpu-oom",
            "checkpoint_save",
        ),
        # CUDA's own allocation failure (cudaErrorMemoryAllocation through C10_CUDA_CHECK): a GPU OOM without numbers
        (
            _traceback(
                ("info.py", 409, "<module>", "loss.backward()"),
                ("/x/torch/autograd/__init__.py", 90, "backward", "allow_unreachable=True)"),
                exc="RuntimeError: CUDA error: out of memory",
            ),
            "class:gpu-oom",
            "training_step",
        ),
        (
            "terminate called after throwing an instance of 'c10::Error'\n  what():  CUDA error: out of memory\n",
            "class:gpu-oom",
            "unknown",
        ),
        # `python -m` with a module that is not installed: runpy's one line, no traceback
        (
            "/root/env/bin/python: Error while finding module specification for 'axolotl.cli.train' "
            "(ModuleNotFoundError: No module named 'axolotl')\n",
            "class:import-error",
            "unknown",
        ),
        # a line pasted as Markdown inline code
        (
            "`ImportError: cannot import name 'log' from 'torch.distributed.elastic.agent.server.api' "
            "(/env/torch/distributed/elastic/agent/server/api.py)` \n",
            "class:import-error",
            "unknown",
        ),
        # a ValueError in accelerate's state/config files is a refused setting only when it names one
        (
            _traceback(
                ("train.py", 910, "main", "accelerator = Accelerator("),
                ("/env/accelerate/accelerator.py", 322, "__init__", "plugins = AcceleratorState().deepspeed_plugins"),
                ("/env/accelerate/state.py", 944, "__init__", "raise ValueError("),
                exc="ValueError: Please make sure to properly initialize your accelerator via `accelerator = "
                "Accelerator()` before using any functionality from the `accelerate` library.",
            ),
            "class:crash",
            "unknown",
        ),
        (
            _traceback(
                ("train.py", 20, "main", "model = accelerator.prepare(model)"),
                ("/env/accelerate/accelerator.py", 1466, "_prepare_deepspeed", "raise ValueError("),
                exc="ValueError: Please specify the ZeRO optimization config in the DeepSpeed config.",
            ),
            "class:config-rejected",
            "engine_init",
        ),
        # a native stack printed after a crash inside torch.save (its zip writer)
        (
            "!!!!!!! Segfault encountered !!!!!!!\n"
            '  File "<unknown>", line 0, in crc32_16bytes(void const*, unsigned long, unsigned int)\n'
            '  File "<unknown>", line 0, in mz_zip_writer_add_mem_ex_v2\n'
            '  File "<unknown>", line 0, in caffe2::serialize::PyTorchStreamWriter::writeRecord(std::string const&, '
            "void const*, unsigned long, bool)\n",
            "class:crash",
            "checkpoint_save",
        ),
    ],
)
def test_class_and_phase_from_the_lines_a_paste_keeps(tmp_path: Path, text: str, class_id: str, phase: str) -> None:
    log = tmp_path / "run.log"
    log.write_text(text)
    d = diagnose([str(log)])
    assert d.findings[0].id == class_id, [(f.id, f.title) for f in d.findings]
    assert d.phase == phase, d.findings[0].data

