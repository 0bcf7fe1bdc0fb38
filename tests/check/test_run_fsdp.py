"""FSDP in the run description: an accelerate FSDP config or HF `--fsdp` arguments become `strategy: fsdp`
with each FSDP setting and where it came from, and the planner plans it beside ZeRO."""

from __future__ import annotations

import textwrap

from zerodoctor.plan.candidates import plan
from zerodoctor.plan.inputs import inputs_from_run
from zerodoctor.setup.hf_args import hf_fsdp_options
from zerodoctor.setup.load import load_setup
from zerodoctor.setup.run import RunFlags, describe_run

CLUSTER = RunFlags(nodes=1, gpus_per_node=8, gpu_memory_gib=80, host_ram_gib=1024)

ACCELERATE_FSDP = """\
compute_environment: LOCAL_MACHINE
distributed_type: FSDP
fsdp_config:
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
  fsdp_backward_prefetch: BACKWARD_PRE
  fsdp_offload_params: true
  fsdp_sharding_strategy: FULL_SHARD
  fsdp_state_dict_type: SHARDED_STATE_DICT
  fsdp_use_orig_params: true
mixed_precision: bf16
num_machines: 1
num_processes: 8
"""


def _write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


def test_accelerate_fsdp_config_is_read_with_origins(tmp_path):
    acc = _write(tmp_path, "fsdp.yaml", ACCELERATE_FSDP)
    run = describe_run(load_setup([acc], model="llama-3.1-8b"), CLUSTER)
    assert run.zero is None
    assert run.strategy is not None and run.strategy.value == "fsdp"
    assert run.strategy.origin.file and run.strategy.origin.file.endswith("fsdp.yaml")
    assert run.strategy.origin.line == 2  # distributed_type
    f = run.fsdp
    assert f is not None
    assert (f.version.value, f.sharding.value, f.offload_params.value) == (1, "full_shard", True)
    assert (
        f.offload_params.origin.line == 6 and f.offload_params.origin.key == "fsdp_config.fsdp_offload_params"
    )
    assert f.backward_prefetch.value == "backward_pre"
    assert f.state_dict_type.value == "sharded"
    # absent keys take accelerate's defaults and say so
    assert f.forward_prefetch.value is False and f.forward_prefetch.origin.kind == "framework"
    assert "accelerate default" in f.cpu_ram_efficient_loading.origin.detail
    assert "fsdp_offload_params" in run.sources()
    # the existing fields are untouched by FSDP
    assert run.micro_batch.value >= 1


def test_accelerate_defaults_when_fsdp_config_is_bare(tmp_path):
    acc = _write(tmp_path, "fsdp.yaml", "distributed_type: FSDP\nmixed_precision: bf16\nnum_processes: 8\n")
    run = describe_run(load_setup([acc], model="llama-3.1-8b"), CLUSTER)
    f = run.fsdp
    assert f is not None
    assert (f.version.value, f.sharding.value, f.offload_params.value) == (1, "full_shard", False)
    assert f.backward_prefetch.value == "none"  # accelerate passes backward_prefetch=None unless set
    assert f.state_dict_type.value == "full"  # FSDP1 default FULL_STATE_DICT
    assert f.use_orig_params.value is False


def test_fsdp2_from_accelerate(tmp_path):
    text = ACCELERATE_FSDP.replace(
        "  fsdp_sharding_strategy: FULL_SHARD\n", "  fsdp_version: 2\n  fsdp_reshard_after_forward: true\n"
    )
    acc = _write(tmp_path, "fsdp.yaml", text)
    f = describe_run(load_setup([acc], model="llama-3.1-8b"), CLUSTER).fsdp
    assert f is not None and f.version.value == 2 and f.sharding.value == "full_shard"
    assert f.backward_prefetch.value == "backward_pre"  # FSDP2 always prefetches in backward


def test_hf_fsdp_words_translate_like_transformers():
    assert hf_fsdp_options(None, None) is None
    assert hf_fsdp_options("", None) is None
    assert hf_fsdp_options([], None) is None
    assert hf_fsdp_options(0, None) is None and hf_fsdp_options("false", None) is None
    opts = hf_fsdp_options("full_shard auto_wrap offload", {"fsdp_version": 1})
    assert opts == {"version": 1, "cpu_offload": True, "reshard_after_forward": "full_shard"}
    assert hf_fsdp_options(True, {"cpu_offload": False}) == {"cpu_offload": False}


def test_hf_fsdp_args(tmp_path):
    args = _write(
        tmp_path,
        "train.yaml",
        """\
        model_name_or_path: meta-llama/Llama-3.1-8B
        per_device_train_batch_size: 2
        bf16: true
        fsdp: "full_shard auto_wrap offload"
        fsdp_config:
          fsdp_version: 1
          backward_prefetch: backward_pre
        """,
    )
    run = describe_run(load_setup([args], framework="hf", model="llama-3.1-8b"), CLUSTER)
    assert run.strategy is not None and run.strategy.value == "fsdp"
    f = run.fsdp
    assert f is not None
    assert (f.version.value, f.offload_params.value, f.backward_prefetch.value) == (1, True, "backward_pre")
    assert f.offload_params.origin.key == "fsdp"  # the word "offload" in --fsdp
    assert f.state_dict_type.value == "full" and "HF Trainer default" in f.state_dict_type.origin.detail
    inputs = inputs_from_run(run)
    assert inputs.zero is not None and inputs.zero.fsdp is not None
    assert inputs.zero.label == "FSDP1 full_shard + CPU offload"


def test_strategy_is_deepspeed_or_ddp(tmp_path):
    ds = _write(tmp_path, "ds.json", '{"zero_optimization": {"stage": 3}}')
    run = describe_run(load_setup([ds], framework="deepspeed", model="llama-3.1-8b"), CLUSTER)
    assert run.strategy is not None and run.strategy.value == "deepspeed" and run.fsdp is None
    plain = _write(tmp_path, "train.yaml", "model_name_or_path: x\nper_device_train_batch_size: 1\n")
    run = describe_run(load_setup([plain], framework="hf", model="llama-3.1-8b"), CLUSTER)
    assert run.strategy is not None and run.strategy.value == "ddp" and run.strategy.origin.kind == "default"


def test_fsdp_run_is_planned_beside_zero(tmp_path):
    acc = _write(
        tmp_path,
        "fsdp.yaml",
        ACCELERATE_FSDP.replace("fsdp_offload_params: true", "fsdp_offload_params: false"),
    )
    run = describe_run(load_setup([acc], model="llama-3.1-8b"), CLUSTER)
    result = plan(inputs_from_run(run))
    assert result.yours is not None and result.yours.zero.fsdp is not None
    labels = {c.zero.label for c in result.candidates}
    assert {"FSDP1 full_shard", "FSDP1 full_shard + CPU offload", "ZeRO-3"} <= labels
    # an FSDP user whose FSDP run fits keeps FSDP
    assert result.recommended is not None and result.recommended.zero.fsdp is not None
