"""The phase of a traceback from the frameworks' own save / resume / load code (issue 10, round 12).

Each case is a traceback made of a framework's real frames - the file path and function as that framework's source
has them, the line the function was running - placed in the phase those functions run in
(zerodoctor.diagnose.extract: _SAVE_FUNCS, _RESUME_FUNCS, _RESUME_FRAMES, _LOAD_FUNCS, _LOAD_FILES,
_MODEL_LOAD_FRAMES, _OPT_STATE_FILES, _DATA_PREP_FILES; patterns.py code-save / code-resume / code-load). The
negatives: a name that a framework uses for another phase in another file, or a function that runs in several
phases, does not decide.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from zerodoctor.diagnose import diagnose

SITE = "/opt/conda/lib/python3.10/site-packages/"


def _traceback(frames: list[str]) -> str:
    """A Python traceback of these frames, outermost first, each `FILE:LINE FUNCTION | SOURCE LINE` (a file without
    a leading `/` lies in site-packages)."""
    lines = ["Traceback (most recent call last):"]
    for frame in frames:
        where, source = frame.split(" | ", 1)
        place, func = where.split(" ")
        file, lineno = place.rsplit(":", 1)
        lines.append(f'  File "{file if file.startswith("/") else SITE + file}", line {lineno}, in {func}')
        lines.append(f"    {source}")
    lines.append("RuntimeError: something unusual happened")
    return "\n".join(lines) + "\n"


def _phase(tmp_path: Path, frames: list[str]) -> str:
    log = tmp_path / "run.log"
    log.write_text(_traceback(frames))
    d = diagnose([str(log)])
    assert d.first_failure is not None
    return d.phase


SCRIPT = "/work/train.py:212 <module> | main()"

CASES = {
    # DeepSpeed deepspeed/runtime/engine.py: a paste cut to save_checkpoint's inner frames (ZeRO files written one
    # rank after the other)
    "deepspeed-save": (
        [
            "deepspeed/runtime/engine.py:5235 _create_zero_checkpoint_files | success = self._create_checkpoint_file(save_dir, tag, True)",
            "deepspeed/runtime/engine.py:5222 _create_checkpoint_file | self._save_zero_checkpoint(save_dir, tag)",
        ],
        "checkpoint_save",
    ),
    # DeepSpeed universal checkpoint read back into the ZeRO-1/2 optimizer (stage_1_and_2.py load_state_dict ->
    # base_optimizer.py -> checkpoint/universal_checkpoint.py), the engine's frames cut off
    "deepspeed-resume-universal": (
        [
            "deepspeed/runtime/zero/stage_1_and_2.py:2756 load_state_dict | self._load_universal_checkpoint(checkpoint_folder, load_optimizer_states, load_from_fp32_weights)",
            'deepspeed/runtime/zero/stage_1_and_2.py:2761 _load_universal_checkpoint | self.load_hp_checkpoint_state_from_checkpoint_dir("bit16_groups", checkpoint_folder)',
            "deepspeed/runtime/base_optimizer.py:361 load_hp_checkpoint_state_from_checkpoint_dir | step = lp.load_hp_checkpoint_state(os.path.join(checkpoint_dir, self.param_names[lp]),",
            "deepspeed/checkpoint/universal_checkpoint.py:164 load_hp_checkpoint_state | ckpt_dict = torch.load(ckpt_file, weights_only=False)",
        ],
        "resume",
    ),
    # transformers trainer.py: the checkpoint's RNG state written after the model (a save's inner frame)
    "transformers-save-rng": (
        [
            SCRIPT,
            'transformers/trainer.py:3480 _save_rng_state | torch.save(rng_states, os.path.join(output_dir, f"rng_state_{self.args.process_index}.pth"))',
        ],
        "checkpoint_save",
    ),
    # transformers 5.x modeling_utils.py _load_pretrained_model -> core_model_loading.py
    "transformers-load-5x": (
        [
            SCRIPT,
            "transformers/core_model_loading.py:1700 convert_and_load_state_dict_in_model | realized_value = mapping.convert(first_param_name, model=model, config=model.config)",
        ],
        "load",
    ),
    # accelerate: Accelerator.load_state (accelerator.py) -> checkpointing.py load_accelerator_state
    "accelerate-resume": (
        [
            SCRIPT,
            "/work/train.py:150 main | accelerator.load_state(args.resume_from_checkpoint)",
            "accelerate/accelerator.py:3890 load_state | override_attributes = load_accelerator_state(",
            "accelerate/checkpointing.py:245 load_accelerator_state | optimizer.load_state_dict(optimizer_state)",
        ],
        "resume",
    ),
    # accelerate utils/fsdp_utils.py save_fsdp_model, under Accelerator.save_state
    "accelerate-save-fsdp": (
        [SCRIPT, "accelerate/utils/fsdp_utils.py:160 save_fsdp_model | dist_cp.save("],
        "checkpoint_save",
    ),
    # peft: PeftModel.from_pretrained -> load_adapter -> utils/save_and_load.py set_peft_model_state_dict
    "peft-load-adapter": (
        [
            SCRIPT,
            "peft/peft_model.py:1474 load_adapter | load_result = set_peft_model_state_dict(",
            "peft/utils/save_and_load.py:560 set_peft_model_state_dict | load_result = model.load_state_dict(peft_model_state_dict, strict=False)",
        ],
        "load",
    ),
    # ColossalAI: Booster.boost -> plugin.configure -> LazyInitContext.materialize (colossalai/lazy/lazy_init.py)
    "colossalai-materialize": (
        [
            SCRIPT,
            "colossalai/booster/booster.py:154 boost | model, optimizer, criterion, dataloader, lr_scheduler = self.plugin.configure(",
            "colossalai/lazy/lazy_init.py:600 apply_fn | p.materialize()",
            "colossalai/lazy/lazy_init.py:217 materialize | target = self._materialize_data()",
            "colossalai/lazy/lazy_init.py:242 _materialize_data | init_val = func(",
        ],
        "load",
    ),
    # ColossalAI: Booster.save_model -> checkpoint_io_base.py -> save_sharded_model
    "colossalai-save": (
        [
            SCRIPT,
            "/work/train.py:180 main | booster.save_model(model, args.save_dir, shard=True)",
            "colossalai/checkpoint_io/checkpoint_io_base.py:190 save_model | self.save_sharded_model(",
            "colossalai/checkpoint_io/hybrid_parallel_checkpoint_io.py:240 save_sharded_model | state_dict_shard = HybridParallelCheckpointIO._model_sharder(model, size_per_shard=size_per_shard)",
        ],
        "checkpoint_save",
    ),
    # ColossalAI: Booster.load_optimizer -> checkpoint_io_base.py load_sharded_optimizer
    "colossalai-resume": (
        [
            SCRIPT,
            "colossalai/booster/booster.py:368 load_optimizer | self.checkpoint_io.load_optimizer(",
            "colossalai/checkpoint_io/checkpoint_io_base.py:224 load_optimizer | self.load_sharded_optimizer(",
        ],
        "resume",
    ),
    # Lightning: fit(ckpt_path=...) restores the training state (trainer/connectors/checkpoint_connector.py)
    "lightning-resume": (
        [
            SCRIPT,
            "lightning/pytorch/trainer/connectors/checkpoint_connector.py:257 restore | self.restore_training_state()",
            "lightning/pytorch/trainer/connectors/checkpoint_connector.py:309 restore_training_state | self.restore_optimizers_and_schedulers()",
            "lightning/pytorch/trainer/connectors/checkpoint_connector.py:379 restore_optimizers_and_schedulers | self.restore_optimizers()",
        ],
        "resume",
    ),
    # Lightning: ModelCheckpoint writing the top-k checkpoint (callbacks/model_checkpoint.py)
    "lightning-save": (
        [
            SCRIPT,
            "lightning/pytorch/callbacks/model_checkpoint.py:484 on_validation_end | self._save_topk_checkpoint(trainer, monitor_candidates)",
            "lightning/pytorch/callbacks/model_checkpoint.py:590 _save_topk_checkpoint | self._save_monitor_checkpoint(trainer, monitor_candidates)",
        ],
        "checkpoint_save",
    ),
    # Lightning: LightningModule.load_from_checkpoint -> core/saving.py _load_from_checkpoint: a model load, though
    # the HF Trainer's resume function has the same name
    "lightning-load-from-checkpoint": (
        [
            SCRIPT,
            "lightning/pytorch/core/module.py:1819 load_from_checkpoint | loaded = _load_from_checkpoint(",
            "lightning/pytorch/core/saving.py:99 _load_from_checkpoint | model = _load_state(cls, checkpoint, strict=strict, **kwargs)",
        ],
        "load",
    ),
    # litgpt: litgpt/utils.py load_checkpoint -> Fabric.load_raw -> the strategy's load_checkpoint: pretrained weights
    "litgpt-load": (
        [
            "litgpt/finetune/lora.py:236 fit | load_checkpoint(fabric, model, checkpoint_path, strict=False)",
            "litgpt/utils.py:385 load_checkpoint | fabric.load_raw(checkpoint_path, model, strict=strict)",
            "lightning/fabric/fabric.py:953 load_raw | self._strategy.load_checkpoint(path=path, state=obj, strict=strict, weights_only=weights_only)",
            'lightning/fabric/strategies/strategy.py:330 load_checkpoint | checkpoint = torch.load(path, map_location="cpu")',
        ],
        "load",
    ),
    # lit-llama / litgpt: the HF -> lit conversion run before fine-tuning (scripts/convert_hf_checkpoint.py)
    "lit-llama-convert": (
        [
            "/work/lit-llama/scripts/convert_hf_checkpoint.py:160 <module> | CLI(convert_hf_checkpoint)",
            '/work/lit-llama/scripts/convert_hf_checkpoint.py:95 convert_hf_checkpoint | hf_weights = torch.load(bin_file, map_location="cpu")',
        ],
        "load",
    ),
    # mmengine: CheckpointHook saving by step (hooks/checkpoint_hook.py)
    "mmengine-save": (
        [
            SCRIPT,
            "mmengine/hooks/checkpoint_hook.py:476 after_train_iter | self._save_checkpoint_with_step(runner, step, meta=meta)",
            "mmengine/hooks/checkpoint_hook.py:443 _save_checkpoint_with_step | runner.save_checkpoint(",
        ],
        "checkpoint_save",
    ),
    # mmengine: `load_from` (Runner.load_or_resume -> Runner.load_checkpoint -> runner/checkpoint.py): a model load
    "mmengine-load-from": (
        [
            SCRIPT,
            "mmengine/runner/runner.py:1765 train | self.load_or_resume()",
            "mmengine/runner/runner.py:1699 load_or_resume | self.load_checkpoint(self._load_from)",
            "mmengine/runner/runner.py:2130 load_checkpoint | checkpoint = _load_checkpoint(filename, map_location=map_location)",
            "mmengine/runner/checkpoint.py:330 load_checkpoint | return checkpoint_loader(filename, map_location)",
        ],
        "load",
    ),
    # mmengine: `resume` (Runner.resume -> Runner.load_checkpoint): a resume
    "mmengine-resume": (
        [
            SCRIPT,
            "mmengine/runner/runner.py:1697 load_or_resume | self.resume(resume_from)",
            "mmengine/runner/runner.py:2017 resume | checkpoint = self.load_checkpoint(filename, map_location=device)",
            "mmengine/runner/runner.py:2130 load_checkpoint | checkpoint = _load_checkpoint(filename, map_location=map_location)",
        ],
        "resume",
    ),
    # XTuner: mmengine's runner building SupervisedFinetune (xtuner/model/sft.py), the LLM built from its config
    "xtuner-build": (
        [
            "mmengine/runner/runner.py:830 build_model | model = MODELS.build(model)",
            "xtuner/model/sft.py:97 __init__ | self.llm = self.build_llm_from_cfg(",
            "xtuner/model/sft.py:143 build_llm_from_cfg | llm = self._build_from_cfg_or_module(llm)",
            "xtuner/model/sft.py:296 _build_from_cfg_or_module | return BUILDER.build(cfg_or_mod)",
        ],
        "load",
    ),
    # OpenRLHF: train_sft.py -> DeepspeedStrategy.load_ckpt (openrlhf/utils/deepspeed/deepspeed.py), cut there
    "openrlhf-resume": (
        [
            "openrlhf/cli/train_sft.py:120 train | load_path, states = strategy.load_ckpt(model.model, args.ckpt.path)",
            "openrlhf/utils/deepspeed/deepspeed.py:771 load_ckpt | load_path, states = model.load_checkpoint(",
        ],
        "resume",
    ),
    # LLaMA-Factory: model/loader.py load_model -> model/adapter.py init_adapter -> _setup_lora_tuning
    "llamafactory-adapter": (
        [
            "llamafactory/train/sft/workflow.py:52 run_sft | model = load_model(tokenizer, model_args, finetuning_args, training_args.do_train)",
            "llamafactory/model/loader.py:197 load_model | model = init_adapter(config, model, model_args, finetuning_args, is_trainable)",
            "llamafactory/model/adapter.py:360 init_adapter | model = _setup_lora_tuning(",
        ],
        "load",
    ),
    # LLaMA-Factory: HF's CallbackHandler.on_save -> train/callbacks.py SaveProcessorCallback.on_save
    "llamafactory-on-save": (
        [
            'transformers/trainer_callback.py:520 on_save | return self.call_event("on_save", args, state, control)',
            "transformers/trainer_callback.py:556 call_event | result = getattr(callback, event)(",
            "llamafactory/train/callbacks.py:108 on_save | self.processor.save_pretrained(output_dir)",
        ],
        "checkpoint_save",
    ),
    # ms-swift: the model registry (swift/llm/model/register.py get_model_tokenizer_*)
    "ms-swift-load": (
        [
            SCRIPT,
            "swift/llm/model/register.py:260 get_model_tokenizer_with_flash_attn | return get_model_tokenizer_from_local(model_dir, model_info, model_kwargs, load_model, **kwargs)",
        ],
        "load",
    ),
    # ms-swift 4.x: SwiftSft.__init__ -> _prepare_model_tokenizer (swift/pipelines/train/sft.py), and its dataset
    # encoding (_prepare_dataset -> _encode_dataset, a paste cut below _prepare_dataset)
    "ms-swift-prepare-model": (
        [
            "swift/pipelines/train/sft.py:30 __init__ | self._prepare_model_tokenizer()",
            "swift/pipelines/train/sft.py:55 _prepare_model_tokenizer | self.model, self.processor = args.get_model_processor(**kwargs)",
        ],
        "load",
    ),
    "ms-swift-encode": (
        [
            "swift/pipelines/train/sft.py:320 _encode_dataset | dataset = preprocessor(dataset, num_proc=args.dataset_num_proc)",
        ],
        "tokenization",
    ),
    # axolotl: loaders/model.py ModelLoader
    "axolotl-load": (
        [
            SCRIPT,
            "axolotl/loaders/model.py:180 load | self._build_model()",
            "axolotl/loaders/model.py:860 _load_model_from_pretrained | return model_loader_class.from_config(",
        ],
        "load",
    ),
    # axolotl: utils/data/sft.py preparing the datasets before training
    "axolotl-datasets": (
        [
            SCRIPT,
            "axolotl/utils/data/sft.py:280 _load_tokenized_prepared_datasets | dataset = _load_and_process_single_dataset(",
        ],
        "tokenization",
    ),
    # LLaVA / FastChat: gathering the ZeRO-3 LoRA weights to save them (llava/train/train.py)
    "llava-save": (
        [
            "/work/LLaVA/llava/train/train.py:960 train | state_dict = get_peft_state_maybe_zero_3(",
            "/work/LLaVA/llava/train/train.py:150 get_peft_state_maybe_zero_3 | to_return = {k: maybe_zero_3(v, ignore_status=True) for k, v in to_return.items()}",
        ],
        "checkpoint_save",
    ),
    # FastChat fastchat/train/train.py: a frame's source line calling its save helper (code-save)
    "fastchat-save-line": (
        [
            "/work/FastChat/fastchat/train/train.py:300 train | trainer_save_model_safe(trainer)",
            "/work/FastChat/fastchat/train/train.py:88 helper | cpu_state_dict = trainer.model.state_dict()",
        ],
        "checkpoint_save",
    ),
}


NEGATIVES = {
    # `load_state` outside accelerate/accelerator.py (a script's own helper) is no resume
    "load_state-elsewhere": (
        [SCRIPT, "/work/utils.py:30 load_state | return json.load(f)"],
        "resume",
    ),
    # `load_ckpt` outside OpenRLHF (a script loading pretrained weights) is no resume
    "load_ckpt-elsewhere": (
        [SCRIPT, '/work/models/builder.py:12 load_ckpt | sd = torch.load(path, map_location="cpu")'],
        "resume",
    ),
    # LazyTensor's materialize decides only in ColossalAI's lazy_init.py
    "materialize-elsewhere": (
        [SCRIPT, "/work/lazy.py:40 materialize | return self.fn()"],
        "load",
    ),
    # OpenRLHF's save_logs_and_checkpoints logs, evaluates and saves: an evaluation under it is no save
    "openrlhf-save-logs-eval": (
        [
            "openrlhf/trainer/sft_trainer.py:190 fit | self.save_logs_and_checkpoints(args, global_step, step_bar, logs_dict)",
            "openrlhf/trainer/sft_trainer.py:240 save_logs_and_checkpoints | self.evaluate(self.eval_dataloader, global_step)",
            "openrlhf/trainer/sft_trainer.py:270 evaluate | output = self.model(inputs, attention_mask=attention_mask)",
        ],
        "checkpoint_save",
    ),
    # mmengine's load_or_resume runs for a load and for a resume: alone it says neither
    "mmengine-load_or_resume-alone": (
        [
            SCRIPT,
            "mmengine/runner/runner.py:1690 load_or_resume | resume_from = find_latest_checkpoint(self.work_dir)",
        ],
        "resume",
    ),
    # Lightning's on_load_checkpoint hook runs under a resume and under LightningModule.load_from_checkpoint
    "lightning-on_load_checkpoint": (
        [SCRIPT, '/work/model.py:80 on_load_checkpoint | self.ema.load(checkpoint["ema"])'],
        "resume",
    ),
    # the Fabric strategy's load_checkpoint under Fabric.load_raw is pretrained weights, not a resume
    "fabric-load_raw": (
        [
            SCRIPT,
            "lightning/fabric/fabric.py:953 load_raw | self._strategy.load_checkpoint(path=path, state=obj, strict=strict, weights_only=weights_only)",
            'lightning/fabric/strategies/strategy.py:330 load_checkpoint | checkpoint = torch.load(path, map_location="cpu")',
        ],
        "resume",
    ),
}


@pytest.mark.parametrize(
    ("frames", "phase", "decides"),
    [pytest.param(f, p, True, id=k) for k, (f, p) in sorted(CASES.items())]
    + [pytest.param(f, p, False, id=k) for k, (f, p) in sorted(NEGATIVES.items())],
)
def test_frames_place_a_failure_only_where_their_framework_runs_them(
    tmp_path: Path, frames: list[str], phase: str, decides: bool
) -> None:
    """A framework's own frames place the failure in their phase (CASES); a name that other files or other phases
    use too does not decide that phase (NEGATIVES)."""
    assert (_phase(tmp_path, frames) == phase) is decides


def test_the_evaluation_under_a_mixed_save_function_is_evaluation(tmp_path: Path) -> None:
    """OpenRLHF's save_logs_and_checkpoints is no save marker: the evaluate frame under it decides."""
    assert _phase(tmp_path, NEGATIVES["openrlhf-save-logs-eval"][0]) == "evaluation"


def test_a_zero_optimizers_load_state_dict_is_a_resume_and_a_modules_is_a_load(tmp_path: Path) -> None:
    """load_state_dict is a resume in an optimizer's file (torch.optim, DeepSpeed's ZeRO optimizers: only a resume
    reads optimizer state back) and a load in torch.nn.Module's."""
    zero = "deepspeed/runtime/zero/stage3.py:3370 load_state_dict | self._rigid_load_state_dict(state_dict[dist.get_rank(group=self.dp_process_group)],"
    module = "torch/nn/modules/module.py:2152 load_state_dict | raise RuntimeError('Error(s) in loading state_dict for {}:\\n\\t{}'.format("
    assert _phase(tmp_path, [SCRIPT, zero]) == "resume"
    assert _phase(tmp_path, [SCRIPT, module]) == "load"
