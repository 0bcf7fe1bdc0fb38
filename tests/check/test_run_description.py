"""The one description of a run: every judge reads the same values, each with where it came from."""

from __future__ import annotations

import json
import textwrap

from zerodoctor.lint.engine import lint_run
from zerodoctor.plan.inputs import inputs_from_run
from zerodoctor.setup.load import load_setup
from zerodoctor.setup.run import RunFlags, describe_run

CLUSTER = RunFlags(nodes=1, gpus_per_node=8, gpu_memory_gib=80, host_ram_gib=1024)


def _write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


def test_stage2_with_offload_param_is_one_answer_for_lint_and_plan(tmp_path):
    """DeepSpeed ignores offload_param below ZeRO-3: lint warns (DS005), the plan plans it as not offloaded."""
    ds = _write(
        tmp_path, "ds.json", '{"zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}}'
    )
    run = describe_run(load_setup([ds], framework="deepspeed", model="llama-3.1-8b"), CLUSTER)
    assert run.zero is not None
    assert (run.zero.offload_param.value, run.zero.offload_param_written) == ("none", "cpu")
    assert "ignored at ZeRO stage 2" in run.zero.offload_param.origin.detail
    inputs = inputs_from_run(run)  # no "needs ZeRO stage 3" refusal any more
    assert inputs.zero is not None and inputs.zero.offload_param == "none"
    assert any(f.id == "DS005" for f in lint_run(run))


def test_unknown_deepspeed_version_pins_for_both_judges_and_says_so(tmp_path):
    ds = _write(
        tmp_path, "ds.json", '{"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}}}'
    )
    run = describe_run(load_setup([ds], framework="deepspeed", model="llama-3.1-8b"), CLUSTER)
    assert run.zero is not None and run.zero.pin_memory.value is True
    assert (
        run.zero.pin_memory.origin.kind == "default"
        and "version unknown" in run.zero.pin_memory.origin.detail
    )
    assert inputs_from_run(run).zero.pin_memory is True  # type: ignore[union-attr]
    # an assumption is not a fact: the knowledge base does not see it
    assert "setup.pin_memory" not in run.facts()


def test_llamafactory_gradient_checkpointing_reaches_the_knowledge_base(tmp_path, run_cli):
    """LLaMA-Factory turns gradient checkpointing on unless disabled and passes use_reentrant_gc (default
    true): the ZeRO-3 + non-reentrant CheckpointError entry fires only when the user turns reentrancy off."""
    _write(tmp_path, "ds.json", '{"zero_optimization": {"stage": 3}, "bf16": {"enabled": "auto"}}')
    _write(tmp_path, "env.txt", "deepspeed==0.19.2\ntorch==2.7.0\ntransformers==4.57.0\npeft==0.17.0\n")
    base = "model_name_or_path: Qwen/Qwen2.5-7B-Instruct\nstage: sft\nfinetuning_type: lora\ndeepspeed: ds.json\n"
    _write(tmp_path, "sft.yaml", base)
    run = describe_run(load_setup([tmp_path / "sft.yaml"], world_size=8), CLUSTER)
    assert run.gradient_checkpointing.value is True and run.gradient_checkpointing.origin.kind == "framework"
    assert run.use_reentrant is not None and run.use_reentrant.value is True

    def kb_ids():
        code, out, err = run_cli(
            "lint",
            str(tmp_path / "sft.yaml"),
            "--env",
            str(tmp_path / "env.txt"),
            "--world-size",
            "8",
            "--format",
            "json",
        )
        return {f.get("data", {}).get("kb_id") for f in json.loads(out)["findings"]}

    assert "z3-gradckpt-checkpointerror" not in kb_ids()
    _write(tmp_path, "sft.yaml", base + "use_reentrant_gc: false\n")
    assert "z3-gradckpt-checkpointerror" in kb_ids()


def test_every_value_names_its_origin(tmp_path):
    args = _write(
        tmp_path,
        "args.yaml",
        """\
        output_dir: out
        model_name_or_path: meta-llama/Meta-Llama-3-8B
        deepspeed: ds.json
        per_device_train_batch_size: 4
        bf16: true
        """,
    )
    _write(
        tmp_path, "ds.json", '{"train_micro_batch_size_per_gpu": "auto", "zero_optimization": {"stage": 3}}'
    )
    run = describe_run(load_setup([args]), RunFlags(gpus_per_node=8))
    assert (run.micro_batch.value, run.micro_batch.origin.line, run.micro_batch.origin.key) == (
        4, 4, "per_device_train_batch_size"
    )  # fmt: skip
    assert run.precision.origin.key == "bf16"
    assert (
        run.zero is not None and run.zero.stage.origin.file and run.zero.stage.origin.file.endswith("ds.json")
    )
    assert (
        run.cluster.gpus_per_node is not None
        and run.cluster.gpus_per_node.origin.describe() == "--gpus-per-node"
    )
    assert run.grad_accum.origin.kind == "default"  # nobody said: zerodoctor's assumption, and it says so
    for name, text in run.sources().items():
        assert text, name


def _lf(tmp_path, extra: str):
    _write(tmp_path, "ds.json", '{"zero_optimization": {"stage": 3}, "bf16": {"enabled": "auto"}}')
    return _write(
        tmp_path,
        "run.yaml",
        "model_name_or_path: meta-llama/Meta-Llama-3-8B-Instruct\ndeepspeed: ds.json\nbf16: true\n" + extra,
    )


def test_preference_training_and_what_else_trains_reach_the_planner(tmp_path):
    run = describe_run(load_setup([_lf(tmp_path, "stage: dpo\nfinetuning_type: full\n")]), CLUSTER)
    t = inputs_from_run(run).training
    assert (t.reference_model, t.paired_inputs) == (True, True)
    run = describe_run(load_setup([_lf(tmp_path, "stage: kto\nfinetuning_type: lora\n")]), CLUSTER)
    t = inputs_from_run(run).training
    assert (t.method, t.reference_model, t.paired_inputs) == (
        "lora",
        False,
        False,
    )  # LoRA: base is the reference
    run = describe_run(
        load_setup([_lf(tmp_path, "stage: dpo\nfinetuning_type: full\npref_loss: orpo\n")]), CLUSTER
    )
    assert inputs_from_run(run).training.reference_model is False  # ORPO needs no reference
    run = describe_run(
        load_setup(
            [_lf(tmp_path, "stage: sft\nfinetuning_type: lora\nadditional_target: embed_tokens,lm_head\n")]
        ),
        CLUSTER,
    )
    assert inputs_from_run(run).training.trainable_modules == ("embed_tokens", "lm_head")
    assert run.trainable_modules.origin.key == "additional_target"
    run = describe_run(
        load_setup([_lf(tmp_path, "stage: sft\nfinetuning_type: freeze\nfreeze_trainable_layers: 4\n")]),
        CLUSTER,
    )
    t = inputs_from_run(run).training
    assert (t.method, t.freeze_trainable_layers) == ("freeze", 4)
    run = describe_run(
        load_setup(
            [
                _lf(
                    tmp_path,
                    "stage: sft\nfinetuning_type: lora\nquantization_bit: 4\nquantization_method: gptq\n",
                )
            ]
        ),
        CLUSTER,
    )
    t = inputs_from_run(run).training
    assert (t.method, t.quant_method) == ("qlora", "gptq")


def test_expandable_segments_from_the_environment(tmp_path):
    from zerodoctor.env.model import Environment

    env = Environment(
        python="3.11", platform="linux", env_vars={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    )
    run = describe_run(
        load_setup([_lf(tmp_path, "stage: sft\nfinetuning_type: lora\n")], env=env), CLUSTER, env=env
    )
    assert inputs_from_run(run).expandable_segments is True


def test_selftest_reads_the_same_description():
    """The selftest spec comes from the run description: XTuner's default gradient checkpointing and its
    max_length reach it (read separately, they were missed)."""
    from pathlib import Path

    from zerodoctor.selftest import spec_from_run
    from zerodoctor.setup.discover import discover
    from zerodoctor.setup.load import setup_from_documents

    folder = Path(__file__).resolve().parents[2] / "examples" / "xtuner-yi34b-sp"
    run = describe_run(setup_from_documents(list(discover([folder]).documents)), CLUSTER)
    spec = spec_from_run(run)
    assert run.gradient_checkpointing.value is True and spec.gradient_checkpointing is True
    assert any(a.key == "sequence length" and a.user_value == run.seq_len.value for a in spec.adaptations)
