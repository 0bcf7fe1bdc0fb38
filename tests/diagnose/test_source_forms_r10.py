"""Round 10 (issue 10): the tune split's phase misses that the log itself shows, each generalised to the line or frame
as the library prints it (extract.py / patterns.py name each source beside its rule).

- torch's DistributedDataParallel.__init__ (torch/nn/parallel/distributed.py) checks the model across ranks with a
  collective - `_verify_model_across_ranks` (torch 1.8-1.9), `_verify_params_across_processes` (1.10-1.11),
  `_verify_param_shape_across_processes` (>= 1.12): wrapping the model is the engine set-up.
- safetensors' save_file (safetensors/torch.py; `_flatten` raises `Some tensors share memory` in older releases,
  `_flatten_as_ptr` -> `_evaluate_tensors_for_save` in 0.8.0; serialize_file `SafetensorError: Error while
  serializing`): a checkpoint being written.
- ZeRO-1/2's gradient reduction (deepspeed/runtime/zero/stage_1_and_2.py reduce_ipg_grads and its hooks; ZeRO-3's
  reduce_partition_and_remove_grads): a backward pass.
- HF datasets' map losing a worker (utils/py_utils.py iflatmap_unordered: `One of the subprocesses has abruptly died
  during map operation.`): dataset tokenization; transformers' from_pretrained refusing a device_map under ZeRO-3
  (modeling_utils.py): a load.
- a tqdm bar described as an evaluation (`{desc}: {percentage}%|`, tqdm format_meter), mmcv's EpochBasedRunner.val and
  a trainer's private `__val`: evaluation; a traceback of modules' forward only is training's or evaluation's, as the
  callers' traceback printed right after it says.
- tqdm redraws a bar when it is closed (std.py __del__ -> close -> display): a bar printed right after a failure, with
  none before it, is where the run was; a single log's progress past its last hit places a failure report that has
  no traceback.
- Ray titles a worker `ray::{task_name}` while a task runs (python/ray/_raylet.pyx): a memory monitor kill report
  listing a `ray::X.*from_pretrained` worker was taken while a model was loading.
"""

from __future__ import annotations

import json

import pytest

SITE = "/env/lib/python3.10/site-packages"
NCCL_ERROR = (
    "RuntimeError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:911, unhandled system "
    "error, NCCL version 2.7.8\n"
)
OOM = (
    "RuntimeError: CUDA out of memory. Tried to allocate 4.10 GiB (GPU 3; 10.92 GiB total capacity; 5.46 GiB already "
    "allocated; 1019.50 MiB free; 3.89 GiB cached)\n"
)


def _doc(tmp_path, run_cli, text: str) -> dict:
    log = tmp_path / "run.log"
    log.write_text(text, encoding="utf-8")
    code, out, err = run_cli("diagnose", str(log), "--format", "json")
    assert code in (0, 1), err
    return json.loads(out)


def _phase(tmp_path, run_cli, text: str) -> str:
    """The verdict's phase (the top finding's: the first failure's, else where the log ends)."""
    findings = _doc(tmp_path, run_cli, text)["findings"]
    assert findings and findings[0]["severity"] == "error", findings[:1]
    return findings[0]["data"]["phase"]


def _frame(path: str, line: int, func: str, code: str) -> str:
    return f'  File "{path}", line {line}, in {func}\n    {code}\n'


# ---- torch DDP construction: engine set-up, in every torch release's words -----------------------------------------
@pytest.mark.parametrize(
    "verify",
    [
        "dist._verify_model_across_ranks(self.process_group, parameters)",  # torch 1.8-1.9
        "dist._verify_params_across_processes(self.process_group, parameters)",  # 1.10-1.11
        "_verify_param_shape_across_processes(self.process_group, parameters)",  # >= 1.12
        "self._sync_module_states(module=self.module, process_group=self.process_group)",  # broadcast of the states
    ],
)
def test_a_failure_while_ddp_wraps_the_model_is_in_engine_init(tmp_path, run_cli, verify):
    text = (
        "Traceback (most recent call last):\n"
        + _frame(
            "train.py", 217, "main", "model = nn.parallel.DistributedDataParallel(model, device_ids=[0])"
        )
        + _frame(f"{SITE}/torch/nn/parallel/distributed.py", 641, "__init__", verify)
        + NCCL_ERROR
    )
    assert _phase(tmp_path, run_cli, text) == "engine_init"


def test_a_failure_in_ddps_forward_is_not_the_engine_set_up(tmp_path, run_cli):
    text = (
        " 37%|███▋      | 111/300 [01:02<01:46,  1.78it/s]\n"
        "Traceback (most recent call last):\n"
        + _frame("train.py", 80, "train", "loss = model(batch).loss")
        + _frame(
            f"{SITE}/torch/nn/parallel/distributed.py",
            1040,
            "forward",
            "output = self._run_ddp_forward(*inputs)",
        )
        + OOM
    )
    assert _phase(tmp_path, run_cli, text) == "training_step"


# ---- safetensors writing a file: a checkpoint save ------------------------------------------------------------------
@pytest.mark.parametrize(
    "site,exc",
    [
        (
            SITE,
            "RuntimeError: \n            Some tensors share memory, this will lead to duplicate memory on disk and "
            "potential differences when loading them again: [{'a', 'b'}].\n",
        ),
        (
            "D:\\venv\\Lib\\site-packages",  # a Windows venv: backslashes
            "safetensors_rust.SafetensorError: Error while serializing: IoError(Os { code: 1224, kind: Uncategorized, "
            'message: "..." })\n',
        ),
    ],
)
def test_safetensors_save_file_failing_is_a_checkpoint_save(tmp_path, run_cli, site, exc):
    sep = "\\" if "\\" in site else "/"
    st = sep.join([site, "safetensors", "torch.py"])
    text = (
        "Traceback (most recent call last):\n"
        + _frame(
            "sdxl_train.py", 600, "train", "sdxl_model_util.save_stable_diffusion_checkpoint(ckpt, unet)"
        )
        + _frame(
            "sdxl_model_util.py",
            312,
            "save_stable_diffusion_checkpoint",
            "save_file(state_dict, output_file)",
        )
        + _frame(st, 232, "save_file", "serialize_file(_flatten(tensors), filename, metadata=metadata)")
        + _frame(st, 394, "_flatten", "raise RuntimeError(")
        + exc
    )
    assert _phase(tmp_path, run_cli, text) == "checkpoint_save"


def test_safetensors_080_shared_tensors_refused_is_a_checkpoint_save(tmp_path, run_cli):
    st = f"{SITE}/safetensors/torch.py"  # (safetensors 0.8.0: save_file -> _flatten_as_ptr -> the check)
    text = (
        "Traceback (most recent call last):\n"
        + _frame("export.py", 40, "export", "write_weights(state_dict, out)")
        + _frame("export.py", 12, "write_weights", "save_file(state, path)")
        + _frame(st, 324, "save_file", "_flatten_as_ptr(tensors, keep_references_alive), filename, metadata=metadata")
        + _frame(st, 569, "_flatten_as_ptr", "_evaluate_tensors_for_save(tensors)")
        + _frame(st, 557, "_evaluate_tensors_for_save", "raise RuntimeError(")
        + "RuntimeError: \n            Some tensors share memory, this will lead to duplicate memory on disk and "
        "potential differences when loading them again: [{'a', 'b'}].\n"
    )
    assert _phase(tmp_path, run_cli, text) == "checkpoint_save"


def test_safetensors_reading_weights_is_no_save(tmp_path, run_cli):
    st = f"{SITE}/safetensors/torch.py"
    text = (
        "Traceback (most recent call last):\n"
        + _frame("train.py", 20, "main", "model = AutoModelForCausalLM.from_pretrained(path)")
        + _frame(st, 311, "load_file", "with safe_open(filename, framework='pt', device=device) as f:")
        + "safetensors_rust.SafetensorError: Error while deserializing header: HeaderTooLarge\n"
    )
    assert _phase(tmp_path, run_cli, text) != "checkpoint_save"


# ---- ZeRO-1/2/3 gradient reduction: a backward pass -----------------------------------------------------------------
ZERO12 = f"{SITE}/deepspeed/runtime/zero/stage_1_and_2.py"


@pytest.mark.parametrize(
    "frames",
    [
        # DeepSpeed 0.9-0.19: the assert inside reduce_ipg_grads, reached from the gradient hook
        _frame(
            ZERO12,
            882,
            "reduce_partition_and_remove_grads",
            "self.reduce_ready_partitions_and_remove_grads(p, i)",
        )
        + _frame(
            ZERO12,
            1419,
            "reduce_ready_partitions_and_remove_grads",
            "self.reduce_independent_p_g_buckets_and_remove_grads(p, i)",
        )
        + _frame(ZERO12, 936, "reduce_independent_p_g_buckets_and_remove_grads", "self.reduce_ipg_grads()")
        + _frame(
            ZERO12, 1394, "reduce_ipg_grads", "assert self.params_already_reduced[param_id] == False, \\"
        ),
        # the paste keeps only the last frame
        _frame(ZERO12, 1394, "reduce_ipg_grads", "assert self.params_already_reduced[param_id] == False, \\"),
        # engine.backward's epilogue (engine.py allreduce_gradients)
        _frame(
            f"{SITE}/deepspeed/runtime/engine.py",
            1880,
            "allreduce_gradients",
            "self.optimizer.overlapping_partition_gradients_reduce_epilogue()",
        )
        + _frame(
            ZERO12,
            1212,
            "overlapping_partition_gradients_reduce_epilogue",
            "self.independent_gradient_partition_epilogue()",
        )
        + _frame(ZERO12, 1018, "independent_gradient_partition_epilogue", "self.reduce_ipg_grads()")
        + _frame(
            ZERO12, 1394, "reduce_ipg_grads", "assert self.params_already_reduced[param_id] == False, \\"
        ),
    ],
)
def test_zero12_gradient_reduction_is_a_training_step(tmp_path, run_cli, frames):
    text = (
        "Traceback (most recent call last):\n"
        + frames
        + "AssertionError: The parameter 323 has already been reduced.                     Gradient computed twice "
        "for this partition.                     Multiple gradient reduction is currently not supported\n"
    )
    assert _phase(tmp_path, run_cli, text) == "training_step"


def test_an_assertion_in_the_zero12_optimizers_constructor_stays_engine_init(tmp_path, run_cli):
    text = (
        "Traceback (most recent call last):\n"
        + _frame(
            f"{SITE}/deepspeed/runtime/engine.py",
            1600,
            "_configure_zero_optimizer",
            "optimizer = DeepSpeedZeroOptimizer(",
        )
        + _frame(ZERO12, 120, "__init__", "assert self.reduce_scatter")
        + "AssertionError\n"
    )
    assert _phase(tmp_path, run_cli, text) == "engine_init"


# ---- HF datasets' map worker death; transformers refusing a device_map under ZeRO-3 --------------------------------
DATASETS_MAP_DIED = "One of the subprocesses has abruptly died during map operation.To debug the error, disable multiprocessing."


@pytest.mark.parametrize(
    "text",
    [
        f"RuntimeError: {DATASETS_MAP_DIED}\n",  # datasets' own exception, no frames pasted
        # a framework re-raising it (unsloth_zoo dataset_utils.py standardize_data_formats)
        f"RuntimeError: {DATASETS_MAP_DIED}\n\nThe above exception was the direct cause of the following exception:\n\n"
        f"RuntimeError: Unsloth: Process crashed: {DATASETS_MAP_DIED}\nTry reducing num_proc (currently 8)\n",
    ],
)
def test_a_datasets_map_worker_death_is_in_tokenization(tmp_path, run_cli, text):
    assert _phase(tmp_path, run_cli, text) == "tokenization"


def test_a_dataloader_worker_death_in_training_is_not_tokenization(tmp_path, run_cli):
    text = (
        " 37%|███▋      | 111/300 [01:02<01:46,  1.78it/s]\n"
        "RuntimeError: DataLoader worker (pid 4242) is killed by signal: Killed.\n"
    )
    assert _phase(tmp_path, run_cli, text) != "tokenization"


@pytest.mark.parametrize(
    "quote", ["`", '"', ""]
)  # transformers' backticks, and as pastes change or drop them
def test_from_pretrained_refusing_a_device_map_under_zero3_is_a_load(tmp_path, run_cli, quote):
    text = (
        f"ValueError: DeepSpeed Zero-3 is not compatible with {quote}low_cpu_mem_usage=True{quote} or with passing "
        f"a {quote}device_map{quote}.\n"
    )
    assert _phase(tmp_path, run_cli, text) == "load"


def test_transformers_other_device_map_refusal_is_not_read_as_this_one(tmp_path, run_cli):
    # from_pretrained's neighbouring check (`Passing along a `device_map` requires `low_cpu_mem_usage=True``) is not the
    # ZeRO-3 refusal: the hint is that one message, and a failure in training after it keeps the training phase
    text = (
        " 37%|███▋      | 111/300 [01:02<01:46,  1.78it/s]\n"
        "ValueError: Passing along a `device_map` requires `low_cpu_mem_usage=True`\n"
    )
    assert _phase(tmp_path, run_cli, text) == "training_step"


# ---- evaluation: its bars, mmcv's val, a forward's callers ----------------------------------------------------------
WATCHDOG = (
    "[E ProcessGroupNCCL.cpp:475] [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=22134630, "
    "OpType=ALLGATHER, NumelIn=499, NumelOut=998, Timeout(ms)=18000000) ran for 18000109 milliseconds before timing out.\n"
)


TRAIN_BAR = " 37%|███▋      | 111/300 [01:02<01:46,  1.78it/s]\n"


@pytest.mark.parametrize(
    "before,phase",
    [
        # LMOps MiniLLM's bar, the watchdog glued onto it
        (
            TRAIN_BAR + "Generation Evaluation: 100%|█████████▉| 497/499 [18:29:58<05:20, 160.10s/it]",
            "evaluation",
        ),
        (TRAIN_BAR + "Evaluation:   7%|▋         | 11/147 [00:08<01:44,  1.30it/s]\n", "evaluation"),
        (TRAIN_BAR + "Validation:  50%|█████     | 5/10 [00:01<00:01,  4.10it/s]\n", "evaluation"),
        # training progress after the evaluation bar: evaluation was over
        ("Evaluation: 100%|██████████| 147/147 [01:52<00:00,  1.30it/s]\n" + TRAIN_BAR, "training_step"),
    ],
)
def test_an_evaluation_bar_places_the_failure_in_evaluation_until_training_goes_on(
    tmp_path, run_cli, before, phase
):
    assert _phase(tmp_path, run_cli, before + WATCHDOG) == phase


FORWARD_TAIL = (
    _frame(f"{SITE}/torch/nn/modules/module.py", 541, "__call__", "result = self.forward(*input, **kwargs)")
    + _frame(
        "lib/models/modules/base_oc_block.py", 89, "forward", "sim_map = (self.key_channels**-.5) * sim_map"
    )
    + OOM
)


@pytest.mark.parametrize(
    "val",
    [
        _frame(
            f"{SITE}/mmcv/runner/epoch_based_runner.py", 127, "run", "epoch_runner(data_loaders[i], **kwargs)"
        )
        + _frame(
            f"{SITE}/mmcv/runner/epoch_based_runner.py",
            68,
            "val",
            "self.run_iter(data_batch, train_mode=False)",
        ),
        _frame("segmentor/trainer.py", 240, "__train", "self.__val()")
        + _frame("segmentor/trainer.py", 308, "__val", "outputs = self.seg_net(*inputs)"),
    ],
)
def test_a_validation_function_is_evaluation(tmp_path, run_cli, val):
    text = "Traceback (most recent call last):\n" + val + FORWARD_TAIL
    assert _phase(tmp_path, run_cli, text) == "evaluation"


def test_val_dataloader_is_not_an_evaluation_frame(tmp_path, run_cli):
    text = (
        "Traceback (most recent call last):\n"
        + _frame("model.py", 50, "val_dataloader", "return DataLoader(self.val_set, batch_size=8)")
        + "FileNotFoundError: [Errno 2] No such file or directory: 'val.json'\n"
    )
    assert _doc(tmp_path, run_cli, text)["findings"][0]["data"]["phase"] != "evaluation"


def test_a_valid_helper_in_a_dataloader_fetch_is_not_evaluation(tmp_path, run_cli):
    # (a data check named `valid`: no framework's evaluation loop is so named; mmcv's is `val`)
    text = (
        TRAIN_BAR
        + "Traceback (most recent call last):\n"
        + _frame("/home/u/train.py", 80, "main", "for batch in loader:")
        + _frame(f"{SITE}/torch/utils/data/dataloader.py", 630, "__next__", "data = self._next_data()")
        + _frame(
            f"{SITE}/torch/utils/data/_utils/fetch.py",
            51,
            "fetch",
            "data = [self.dataset[idx] for idx in possibly_batched_index]",
        )
        + _frame("/home/u/data.py", 40, "__getitem__", 'assert valid(sample), f"bad sample {idx}"')
        + _frame("/home/u/data.py", 12, "valid", 'return sample["labels"][0] >= -100')
        + "KeyError: 'labels'\n"
    )
    assert _doc(tmp_path, run_cli, text)["findings"][0]["data"]["phase"] != "evaluation"


@pytest.mark.parametrize("caller,phase", [("__val", "evaluation"), ("__train", "training_step")])
def test_a_forward_only_traceback_is_placed_by_the_callers_printed_after_it(tmp_path, run_cli, caller, phase):
    # the bottom of the stack first, then the rest of it (another rank's copy, cut before its exception)
    text = (
        "Traceback (most recent call last):\n"
        + FORWARD_TAIL
        + "Traceback (most recent call last):\n"
        + _frame("main.py", 227, "<module>", "model.train()")
        + _frame("segmentor/trainer.py", 308, caller, "outputs = self.seg_net(*inputs)")
        + _frame(
            f"{SITE}/torch/nn/modules/module.py", 541, "__call__", "result = self.forward(*input, **kwargs)"
        )
    )
    assert _phase(tmp_path, run_cli, text) == phase


# ---- a bar printed after the failure: tqdm's redraw when it closes --------------------------------------------------
FLASH = (
    "[rank0]: Traceback (most recent call last):\n"
    '[rank0]:   File "/x/flash_attn/flash_attn_interface.py", line 170, in _flash_attn_varlen_forward\n'
    "[rank0]:     out, softmax_lse, S_dmask, rng_state = flash_attn_gpu.varlen_fwd(\n"
    "[rank0]: RuntimeError: FlashAttention only supports Ampere GPUs or newer.\n"
)
NCCL_NOT_DESTROYED = (
    "[rank0]:[W221 15:59:50.953384675 ProcessGroupNCCL.cpp:1250] Warning: WARNING: process group has NOT been "
    "destroyed before we destruct ProcessGroupNCCL. On normal program exit, the application should call "
    "destroy_process_group to ensure that any pending NCCL operations have finished in this process.\n"
)


@pytest.mark.parametrize(
    "bar,phase",
    [
        ("  0%|          | 0/6 [00:50<?, ?it/s]\n", "first_optimizer_step"),
        (" 37%|███▋      | 111/300 [01:02<01:46,  1.78it/s]\n", "training_step"),
    ],
)
def test_a_bar_redrawn_right_after_the_failure_places_it(tmp_path, run_cli, bar, phase):
    assert _phase(tmp_path, run_cli, FLASH + bar + NCCL_NOT_DESTROYED) == phase


NO_KERNEL_IMAGE = (
    "[rank1]: RuntimeError: CUDA error: no kernel image is available for execution on the device\n"
    "[rank1]: CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below "
    "might be incorrect.\n"
)


@pytest.mark.parametrize("rank,phase", [(0, "unknown"), (1, "training_step")])
def test_only_the_failing_ranks_own_bar_places_its_failure(tmp_path, run_cli, rank, phase):
    # (tqdm's redraw at close speaks for its own process: another rank's bar says nothing of rank 1's failure)
    text = NO_KERNEL_IMAGE + f"[rank{rank}]:  10%|█         | 10/100 [00:10<01:30,  1.00it/s]\n"
    assert _phase(tmp_path, run_cli, text) == phase


def test_a_per_rank_files_own_bar_places_its_failure(tmp_path, run_cli):
    # (torchrun --log-dir / `rankN.log`: no prefix on the lines, the file names the rank)
    (tmp_path / "rank0.log").write_text(NCCL_NOT_DESTROYED, encoding="utf-8")
    (tmp_path / "rank1.log").write_text(
        NO_KERNEL_IMAGE.replace("[rank1]: ", "") + " 10%|█         | 10/100 [00:10<01:30,  1.00it/s]\n",
        encoding="utf-8",
    )
    code, out, err = run_cli(
        "diagnose", str(tmp_path / "rank0.log"), str(tmp_path / "rank1.log"), "--format", "json"
    )
    assert code in (0, 1), err
    top = json.loads(out)["findings"][0]
    assert top["severity"] == "error" and top["data"]["phase"] == "training_step", top


def test_a_bar_long_after_the_failure_does_not_place_it(tmp_path, run_cli):
    later = "".join(f"note {i}: retrying in a new process\n" for i in range(8))
    text = FLASH + later + " 37%|███▋      | 111/300 [01:02<01:46,  1.78it/s]\n" + NCCL_NOT_DESTROYED
    assert _phase(tmp_path, run_cli, text) == "unknown"


RAY_KILL = (
    "Memory on the node (IP: 10.0.0.4, ID: 37f3bd9f) where the task (actor ID: 658f7608, "
    "name=RewardModelRayActor.__init__, pid=5315, memory used=1.67GB) was running was 445.48GB / 468.75GB "
    "(0.950365), which exceeds the memory usage threshold of 0.95. Ray killed this worker (ID: 384252cd) because it was "
    "the most recently scheduled task. Top 10 memory users:\nPID\tMEM(GB)\tCOMMAND\n"
)
RAY_DOC = (
    "Refer to the documentation on how to address the out of memory issue: "
    "https://docs.ray.io/en/latest/ray-core/scheduling/ray-oom-prevention.html.\n"
)


def test_the_progress_past_a_ray_kill_report_is_where_the_run_was(tmp_path, run_cli):
    text = (
        RAY_KILL
        + "8800\t1.18\tray::ReferenceModelRayActor\n"
        + RAY_DOC
        + "Episode [1/10000]:   7%|▋         | 11/147 [3:34:08<44:07:37, 1168.07s/it, policy_loss=-0.115]\n"
    )
    assert _phase(tmp_path, run_cli, text) == "training_step"


def test_a_ray_worker_loading_pretrained_weights_places_the_kill_in_load(tmp_path, run_cli):
    text = (
        RAY_KILL
        + "5312\t211.81\tray::ActorModelRayActor\n"
        + "5313\t202.20\tray::CriticModelRayActor.init_model_from_pretrained\n"
        + RAY_DOC
    )
    assert _phase(tmp_path, run_cli, text) == "load"


def test_idle_ray_actors_do_not_say_load(tmp_path, run_cli):
    text = (
        RAY_KILL + "5312\t211.81\tray::ActorModelRayActor\n5313\t202.20\tray::CriticModelRayActor\n" + RAY_DOC
    )
    assert _phase(tmp_path, run_cli, text) != "load"
