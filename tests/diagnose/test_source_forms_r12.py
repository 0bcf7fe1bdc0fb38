"""Round 12 (issue 10): fixes from reviews R1 and R4 of round 11, and tune-split misses the log itself proves, each
built from the library's own message text (patterns.py / extract.py / classes.py / the KB entry name each source).

- extract.py keeps its phase markers in a bounded list: a run of bars that the scan does not collapse (interleaved
  ranks' `[rankN]:` bars) after a failure must not push out the markers before the failure (review R4 item 1).
- a tool's report of an exit status 137 (kubectl exec, docker compose, PyCharm) after the run printed its end is named
  as an exit after the end; one the run outlived (a note about an earlier attempt) is no failure (review R1 item 9).
- progress in other forms: tqdm bars whose unit is a step (`5.00step/s`, `2.00s/step`: tqdm's format_meter), mmf's
  `progress: N/M, ... num_updates: N` log line (mmf/utils/logger.py summarize_report) (review R1 item 9, R4's note).
- an exception quoted in double quotes inside prose is read like one in a code span; vLLM's loader refusing a ZeRO-3
  `torch.Size([0])` weight is the partitioned-weight entry; the Trainer's `No valid checkpoint found in output
  directory` is a resume; deepspeed.initialize's config assertions pasted without their type are the failure, in
  engine_init; VS Code's `Exception has occurred: X` widget is read with its message line; transformers'
  Trainer.__init__ judges a configuration; `RayTaskError(OutOfMemoryError)` is a task's own (GPU) OOM; FSDP's
  `Failed to clone() tensor with name` warning places its failure in a checkpoint save.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_source_forms_r11 import _run, _top  # (pytest puts this directory on sys.path)

from zerodoctor.diagnose.patterns import parse_progress
from zerodoctor.findings import Severity

OOM_RANK1 = (
    "[rank1]: Traceback (most recent call last):\n"
    '[rank1]:   File "train.py", line 10, in <module>\n'
    "[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 1 has a total capacity of "
    "79.10 GiB of which 1.06 MiB is free.\n"
)


def _no_error(tmp_path: Path, text: str) -> None:
    d = _run(tmp_path, text)
    assert all(f.severity != Severity.ERROR for f in d.findings), d.findings


# ---- markers kept across a long run of interleaved ranks' bars (review R4 item 1) --------------------------------
def _map_bar(i: int, rank: int) -> str:
    # datasets' Dataset.map bar (arrow_dataset.py: `desc="Map"`, `num_proc`), prefixed by torchrun's `[rankN]:`
    total = 60000
    return f"[rank{rank}]:Map (num_proc=8):  {i * 100 // total:2d}%|##        | {i * 3}/{total} [00:{i % 60:02d}<01:00, 1234.56 examples/s]\n"


def test_a_failure_keeps_its_tokenization_phase_under_a_long_run_of_interleaved_bars(tmp_path):
    before = "".join(_map_bar(i, i % 3) for i in range(900))
    # ranks 0 and 2 go on mapping after rank 1 failed: 10,500 bar lines whose prefixes alternate (no run collapses)
    after = "".join(_map_bar(900 + i, (i % 2) * 2) for i in range(10500))
    top = _top(tmp_path, before + OOM_RANK1 + after)
    assert top.data["phase"] == "tokenization", top
    assert top.data["first_failure"]["rank"] == 1, top


def test_each_guard_line_is_kept(tmp_path):
    # (negative: the runtime guard's lines are markers of one kind that each name their own rank's phase; two in a
    # row stay two, and the failing rank's one names the phase)
    text = (
        "zerodoctor guard [rank 1, step 12, save]: Failure not in the knowledge base: see the traceback\n"
        "zerodoctor guard [rank 0, step 12, train]: Failure not in the knowledge base: see the traceback\n"
        "[rank1]: Traceback (most recent call last):\n"
        '[rank1]:   File "/work/train.py", line 40, in <module>\n'
        "[rank1]:     helper(batch)\n"
        "[rank1]: RuntimeError: something unusual happened\n"
    )
    assert _top(tmp_path, text).data["phase"] == "checkpoint_save"


# ---- an exit status 137 that a tool reports (review R1 item 9) ------------------------------------------------
RUN_START = (
    "***** Running training *****\n"
    "  Num examples = 100\n"
    "  0%|          | 0/10 [00:00<?, ?it/s]\n"
    " 10%|#         | 1/10 [00:01<00:09, 1.00it/s]\n"
)
RUN_END = (
    "{'train_runtime': 12.3, 'train_samples_per_second': 8.1, 'train_loss': 1.15, 'epoch': 1.0}\n"
    "100%|##########| 10/10 [00:10<00:00, 1.00it/s]\n"
    "Training completed. Do not forget to share your model on huggingface.co/models =)\n"
)


def test_an_exit_137_after_the_run_printed_its_end_is_named_after_the_end(tmp_path):
    # kubectl exec's report of the command's exit status (k8s.io/kubectl pkg/cmd/util/helpers.go)
    top = _top(tmp_path, RUN_START + RUN_END + "command terminated with exit code 137\n")
    assert top.severity == Severity.ERROR
    assert top.data["failure_class"]["id"] == "class:crash", top
    assert "code 137 (SIGKILL" in top.title and "after the run had finished" in top.title, top.title


def test_an_exit_137_during_training_is_still_a_kill(tmp_path):
    # (negative: with no end before it, the SIGKILL is the host OOM kill it always was)
    top = _top(tmp_path, RUN_START + "train-1 exited with code 137\n")
    assert top.data["failure_class"]["id"] == "class:host-oom-kill", top


# ---- progress lines of other forms (review R1 item 9, review R4's note) -------------------------------------------
STOP = "WARNING:torch.distributed.elastic.agent.server.api:Received 15 death signal, shutting down workers\n"


@pytest.mark.parametrize(
    ("bar", "step"),
    [
        # tqdm's format_meter with unit="step" / "steps" (std.py rate_noinv_fmt / rate_inv_fmt, tqdm 4.x)
        ("Training:  50%|#####     | 50/100 [00:10<00:10,  5.00step/s]", 50),
        ("Training:   5%|5         | 5/100 [00:30<09:30,  6.00s/steps]", 5),
        ("Training:   5%|5         | 5/100 [00:10<03:10,  2.00s/step, loss=1.2]", 5),
        ("Steps:  50%|#####     | 50/100 [00:10<00:10,  5.00steps/s, loss=1, lr=1e-05]", 50),
        ("Training:   0%|          | 0/100 [00:00<?, ?step/s]", 0),
        # mmf's training log line (mmf/utils/logger.py summarize_report -> log_progress, `simple` and `json` formats)
        (
            "2021-03-04T10:01:00 | mmf.trainers.callbacks.logistics: progress: 100/22000, train/total_loss: 2.7313, "
            "train/total_loss/avg: 3.1254, max mem: 5423.0, experiment: run, epoch: 1, num_updates: 100, "
            "iterations: 100, max_updates: 22000, lr: 0.00005, ups: 1.67, time: 01m 00s 123ms",
            100,
        ),
        (
            '{"progress": "300/22000", "train/total_loss": 2.7, "epoch": 1, "num_updates": 300, "max_updates": 22000}',
            300,
        ),
    ],
)
def test_progress_forms_are_read(tmp_path, bar, step):
    parsed = parse_progress(bar)
    assert parsed is not None and parsed[1] == step, parsed
    top = _top(tmp_path, f"{bar}\n{bar}\n" + STOP)
    assert top.data["phase"] == ("first_optimizer_step" if step == 0 else "training_step"), top


@pytest.mark.parametrize(
    "line",
    [
        # (negatives: a dataset map's bar in steps is data preparation; Keras' Progbar is no tqdm bar; a `progress:`
        # line without mmf's num_updates is anyone's)
        "Map:  50%|#####     | 50/100 [00:10<00:10,  5.00steps/s]",
        "100/100 [==============================] - 10s 100ms/step - loss: 0.1",
        "Download progress: 3/10, please wait",
    ],
)
def test_near_miss_progress_forms_are_not_progress(line):
    assert parse_progress(line) is None


# ---- an exception quoted in double quotes inside prose (tune misses r1v132, acc2821, llava901) ---------------------
@pytest.mark.parametrize(
    ("text", "top_id"),
    [
        # vLLM's default_weight_loader (model_loader/weight_utils.py: `assert param.size() == loaded_weight.size(),
        # f"Attempted to load weight ({loaded_weight.size()}) into parameter ({param.size()})"`) given a ZeRO-3 policy's
        # empty partitioned weight; in bold, with torchrun's rank prefix inside the quotes
        (
            'After the first step, this error appears: **"[rank0]: AssertionError: Attempted to load weight '
            '(torch.Size([0])) into parameter (torch.Size([1280, 3, 2, 14, 14]))"**.\n',
            "z3-empty-partition-outside-engine",
        ),
        # (the releases that raise it as a ValueError; typographic quotes)
        (
            "the weight sync fails with \u201cValueError: Attempted to load weight (torch.Size([0])) into parameter "
            "(torch.Size([151936, 1536]))\u201d every time\n",
            "z3-empty-partition-outside-engine",
        ),
        # transformers' refusal to move a bitsandbytes model (modeling_utils.py PreTrainedModel.to), quoted in prose
        (
            'However, there is always happening: "ValueError: .to is not supported for 4-bit or 8-bit models. Please '
            "use the model as it is, since the model has already been set to the correct devices and casted to the "
            'correct dtype"\n',
            "class:crash",
        ),
    ],
)
def test_an_exception_quoted_in_double_quotes_is_the_failure(tmp_path, text, top_id):
    top = _top(
        tmp_path, "I made the deepspeed config with accelerate config.\n\n" + text + "\nHow to solve?\n"
    )
    assert top.id == top_id and top.severity == Severity.ERROR, top


def test_the_trainer_refusing_to_resume_is_a_resume_failure(tmp_path):
    # transformers' Trainer.train with resume_from_checkpoint=True (trainer.py: `raise ValueError(f"No valid checkpoint
    # found in output directory ({args.output_dir})")`), the whole line quoted, and as a traceback's last line
    for text in (
        '### Question\n\nwhen i resume from the save checkpoint i got this error:\n"ValueError: No valid checkpoint '
        'found in output directory"\n',
        '  File "/opt/transformers/trainer.py", line 1557, in train\n    raise ValueError(f"No valid checkpoint found '
        'in output directory ({args.output_dir})")\nValueError: No valid checkpoint found in output directory (./ckpt)\n',
    ):
        top = _top(tmp_path, text)
        assert top.severity == Severity.ERROR and top.data["phase"] == "resume", top


@pytest.mark.parametrize(
    "said",
    [
        # an exception in double quotes (the Trainer's resume refusal)
        'Last time it said "ValueError: No valid checkpoint found in output directory", now it works:\n',
        # deepspeed.initialize's assertion without its type
        "Fixed 'Not sure how to proceed, we were given both a deepscale_config and deepspeed_config' by dropping args\n",
        # a tool's exit 137 (kubectl exec) about an earlier attempt
        "Pod restarted: previous container command terminated with exit code 137; now with more memory\n",
    ],
)
def test_a_failure_quoted_before_a_run_that_finished_is_no_failure(tmp_path, said):
    # (negatives: what an earlier attempt said, then a run that trains and prints its end)
    _no_error(tmp_path, said + RUN_START + RUN_END)


def test_a_quoted_line_without_an_exception_is_nothing(tmp_path):
    # (negative: a quoted span that names no exception type, a JSON value, a vLLM load of a non-empty weight)
    text = (
        'the log says "loading weights: done" and {"status": "ok", "note": "no Error here"}\n'
        "AssertionError: Attempted to load weight (torch.Size([4096])) into parameter (torch.Size([5120]))\n"
    )
    d = _run(tmp_path, text)
    assert d.findings and d.findings[0].id != "z3-empty-partition-outside-engine", d.findings


# ---- deepspeed.initialize's config assertions pasted without their type (tune miss megads386) ----------------------
@pytest.mark.parametrize(
    "said",
    [
        # deepspeed/__init__.py initialize, 0.3 to 0.19.8 (cut by the user after `deepspeed.`)
        "I meet an assertion error：Not sure how to proceed, we were given deepspeed configs in the deepspeed "
        "arguments and deepspeed. the script I used is run.sh",
        # (the release whose string continued with a backslash: its blanks inside the message)
        "Not sure how to proceed, we were given deepspeed configs in the deepspeed             arguments and "
        "deepspeed.initialize() function call",
        "Not sure how to proceed, we were given both a deepscale_config and deepspeed_config",
        "DeepSpeed requires --deepspeed_config to specify configuration file",
    ],
)
def test_deepspeed_initialize_config_assertions_are_named(tmp_path, said):
    top = _top(tmp_path, f"hello, when I run the script to train a gpt model: {said}\n")
    # (an assertion inside DeepSpeed; where its message names the config, DeepSpeed's refusal of the configuration)
    assert top.id in ("class:library-assertion", "class:config-rejected"), top
    assert top.data["phase"] == "engine_init", top


# ---- VS Code's exception widget: the type on one line, its message below (tune miss qwen3vl1414) -----------------
def test_vscode_exception_widget_names_the_exception_and_its_message(tmp_path):
    # src/vs/workbench/contrib/debug/browser/exceptionWidget.ts: `Exception has occurred: {0}` (the type), then
    # the exception's str(); torch's ProcessGroupWrapper message below it (TORCH_DISTRIBUTED_DEBUG=DETAIL)
    text = (
        "`\nException has occurred: RuntimeError\nDetected mismatch between collectives on ranks. Rank 1 is running "
        "collective: CollectiveFingerPrint(SequenceNumber=6088, OpType=ALLREDUCE, TensorShape=[4096], TensorDtypes="
        "BFloat16), but Rank 0 is running collective: CollectiveFingerPrint(SequenceNumber=6088, OpType=ALLREDUCE, "
        "TensorShape=[3328], TensorDtypes=BFloat16).\n`\n"
    )
    top = _top(tmp_path, text)
    assert top.id in ("class:collective-timeout", "mllm-z3-divergent-modules-hang"), top
    assert top.data["first_failure"]["text"].startswith(
        "RuntimeError: Detected mismatch between collectives"
    ), top


def test_vscode_exception_widget_with_a_message_of_its_own_kind(tmp_path):
    # (the message line is a failure of its own - a CUDA OOM - and keeps its own event; a type with no message line)
    oom = (
        "Exception has occurred: OutOfMemoryError\nCUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
        "capacity of 23.65 GiB of which 1.19 GiB is free.\n"
    )
    assert _top(tmp_path, oom).id == "class:gpu-oom"
    alone = _top(tmp_path, "Exception has occurred: ValueError\n")
    assert alone.severity == Severity.ERROR and alone.data["first_failure"]["text"] == "ValueError", alone


def test_the_words_exception_has_occurred_in_prose_are_nothing(tmp_path):
    # (negative: not the widget's line - no type follows the colon)
    _no_error(tmp_path, "An exception has occurred: the run stopped, see below.\n" + RUN_START + RUN_END)


# ---- transformers' Trainer.__init__ refusing the model or its arguments (tune miss lf826) --------------------------
TRAINER_INIT = (
    "Traceback (most recent call last):\n"
    '  File "src/train_bash.py", line 14, in <module>\n'
    "    main()\n"
    '  File "/env/lib/python3.9/site-packages/transformers/trainer_seq2seq.py", line 56, in __init__\n'
    "    super().__init__(\n"
)


@pytest.mark.parametrize(
    ("frame", "said"),
    [
        # trainer.py 4.26-4.30 (the paste's terminal wrap inside words kept)
        (
            '  File "/env/lib/python3.9/site-packages/transformers/trainer.py", line 401, in __i\nnit__\n'
            "    raise ValueError(\n",
            "ValueError: The model you want to train is loaded in 8-bit precision.  if you want to fine-tune an 8-bit "
            "mode\nl, please make sure that you have installed `bitsandbytes>=0.37.0`.\n",
        ),
        # trainer.py 4.31-4.36
        (
            '  File "/env/lib/python3.10/site-packages/transformers/trainer.py", line 412, in __init__\n'
            "    raise ValueError(\n",
            "ValueError: You cannot perform fine-tuning on purely quantized models. Please attach trainable adapters "
            "on top of the quantized model to correctly perform fine-tuning. Please see: "
            "https://huggingface.co/docs/transformers/peft for more details\n",
        ),
        # trainer.py 5.x
        (
            '  File "/env/lib/python3.12/site-packages/transformers/trainer.py", line 474, in __init__\n'
            "    raise ValueError(\n",
            "ValueError: Using --fsdp xxx together with --deepspeed is not possible, deactivate one of those flags.\n",
        ),
    ],
)
def test_the_trainer_constructor_refusing_its_model_or_arguments_is_config_rejected(tmp_path, frame, said):
    assert _top(tmp_path, TRAINER_INIT + frame + said).id == "class:config-rejected"


def test_a_failure_below_the_trainer_constructor_is_not_a_config_refusal(tmp_path):
    # (negative: the constructor moving the model to the GPU, which ran out of memory below it)
    text = (
        TRAINER_INIT
        + '  File "/env/lib/python3.10/site-packages/transformers/trainer.py", line 495, in __init__\n'
        "    self._move_model_to_device(model, args.device)\n"
        '  File "/env/lib/python3.10/site-packages/torch/nn/modules/module.py", line 1145, in to\n'
        "    return self._apply(convert)\n"
        "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 500.00 MiB. GPU 0 has a total capacity "
        "of 23.65 GiB of which 101.19 MiB is free.\n"
    )
    assert _top(tmp_path, text).id == "class:gpu-oom"


# ---- a task's CUDA OOM that Ray re-raised on the caller (tune miss orz21) -----------------------------------------
@pytest.mark.parametrize(
    "line",
    [
        # python/ray/exceptions.py as_instanceof_cause: `name = f"RayTaskError({cause_cls.__name__})"`, the cause a
        # torch.OutOfMemoryError (the paste cut inside the line, as the thread's is)
        "ray.exceptions.RayTaskError(OutOfMemoryError): ray::LLMActor.backload_to_gpu() (pid=11992, ip=10.0.0.1, "
        "actor_id=94eaf50266",
        "[rank0]: ray.exceptions.RayTaskError(OutOfMemoryError): ray::PolicyActor.fit() (pid=12, ip=10.0.0.2)",
    ],
)
def test_a_ray_task_s_out_of_memory_error_is_a_gpu_oom(tmp_path, line):
    text = (
        "Traceback (most recent call last):\n"
        '  File "/app/orz/ppo/trainer.py", line 1289, in _backload_vllm_engines\n'
        "    await asyncio.gather(*backload_tasks)\n" + line + "\n"
    )
    assert _top(tmp_path, text).id == "class:gpu-oom"


def test_ray_s_own_out_of_memory_error_stays_a_host_oom(tmp_path):
    # (negative: Ray's memory monitor killing a task raises its own error, never wrapped in RayTaskError(...))
    text = (
        "ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on memory.\n"
        "Memory on the node (IP: 10.0.0.1, ID: 1a2b) where the task was running was 240.00GB / 251.00GB (0.95)\n"
    )
    top = _top(tmp_path, text)
    assert top.id != "class:gpu-oom", top


# ---- FSDP's full state dict failing to copy a gathered parameter: a save (tune phase miss fastchat256) ------------
FSDP_END = (
    "{'loss': 1.317, 'learning_rate': 0.0, 'epoch': 1.0}\n"
    "{'train_runtime': 601.9411, 'train_samples_per_second': 7.029, 'train_steps_per_second': 0.219, "
    "'train_loss': 1.4777, 'epoch': 1.0}\n"
)


@pytest.mark.parametrize(
    "warning",
    [
        # torch/distributed/fsdp/_state_dict_utils.py _full_post_state_dict_hook (torch 2.x: `on rank N`)
        "/usr/lib/python3.10/site-packages/torch/distributed/fsdp/_state_dict_utils.py:312: UserWarning: Failed to "
        "clone() tensor with name lm_head.weight on rank 1. This may mean that this state_dict entry could point to "
        "invalid memory regions after returning from state_dict() call if this parameter is managed by FSDP. Please "
        "check clone implementation of lm_head.weight. Error: CUDA out of memory. Tried to allocate 270.00 MiB (GPU 1; "
        "79.35 GiB total capacity; 76.93 GiB already allocated; 99.19 MiB free; 77.50 GiB reserved in total by PyTorch)",
        # (a paste that starts inside the warning: its second sentence, then the error)
        "ayers.39.mlp.gate_proj.weight on rank 1. This may mean that this state_dict entry could point to invalid "
        "memory regions after returning from state_dict() call if this parameter is managed by FSDP. Please check "
        "clone implementation of layers.39.mlp.gate_proj.weight. Error: CUDA out of memory. Tried to allocate 270.00 "
        "MiB (GPU 1; 79.35 GiB total capacity; 76.93 GiB already allocated; 99.19 MiB free; 77.50 GiB reserved in "
        "total by PyTorch)",
    ],
)
def test_fsdp_failing_to_clone_a_gathered_parameter_is_a_save(tmp_path, warning):
    top = _top(tmp_path, FSDP_END + "....\n" + warning + "\n")
    assert top.id == "class:gpu-oom" and top.data["phase"] == "checkpoint_save", top


def test_an_oom_after_the_end_without_the_fsdp_warning_is_not_placed_in_a_save(tmp_path):
    # (negative: the same OOM line after the run's end, with nothing naming the state dict)
    text = (
        FSDP_END
        + "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 270.00 MiB (GPU 1; 79.35 GiB "
    )
    text += "total capacity; 76.93 GiB already allocated; 99.19 MiB free; 77.50 GiB reserved in total by PyTorch)\n"
    assert _top(tmp_path, text).data["phase"] != "checkpoint_save"
