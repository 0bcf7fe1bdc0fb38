"""`zerodoctor selftest` on the real engine: 2 ranks under torchrun, gloo + DeepSpeed's CPU accelerator.

Each test is one real run (no mocks). Healthy ZeRO-2 (LoRA) and ZeRO-3 offload setups pass with every
positive check; real breakage is caught: a config DeepSpeed rejects, a batch size that does not fit the world
size, a save that writes ZeRO-3's empty views, a model whose build fails inside zero.Init, a rank that dies
mid-step and a rank that hangs (the watchdog ends the others).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from zerodoctor.cli.main import main
from zerodoctor.selftest import run_selftest, spec_from_setup
from zerodoctor.selftest.spec import with_test_hooks
from zerodoctor.setup.load import load_setup

pytest.importorskip("deepspeed")
pytestmark = pytest.mark.engine
HERE = Path(__file__).resolve().parent
CHECKS = (
    "partitioning",
    "placement",
    "clipping",
    "loss-vs-reference",
    "saved-weights",
    "reload",
    "zero-to-fp32",
)

Z3_OFFLOAD = {
    "train_micro_batch_size_per_gpu": "auto",
    "gradient_accumulation_steps": "auto",
    "gradient_clipping": "auto",
    "bf16": {"enabled": "auto"},
    "zero_optimization": {
        "stage": 3,
        "offload_optimizer": {"device": "cpu", "pin_memory": True},
        "offload_param": {"device": "cpu", "pin_memory": True},
        "reduce_bucket_size": "auto",
        "stage3_prefetch_bucket_size": "auto",
        "stage3_param_persistence_threshold": "auto",
        "sub_group_size": 1e9,
        "stage3_gather_16bit_weights_on_model_save": True,
    },
}
HF_ARGS = (
    "output_dir: out\ndeepspeed: ds.json\nper_device_train_batch_size: 2\ngradient_accumulation_steps: 2\n"
    "bf16: true\nlearning_rate: 1.0e-5\nmax_grad_norm: 1.0\nmodel_name_or_path: Qwen/Qwen2.5-7B\n"
)


def _selftest_json(capsys, argv):
    code = main(["selftest", *argv, "--format", "json"])
    doc = json.loads(capsys.readouterr().out)
    return code, doc


def test_healthy_zero3_offload_setup_passes_every_check(tmp_path, capsys):
    (tmp_path / "ds.json").write_text(json.dumps(Z3_OFFLOAD))
    (tmp_path / "args.yaml").write_text(HF_ARGS)
    t0 = time.time()
    code, doc = _selftest_json(
        capsys, [str(tmp_path), "--world-size", "16", "--workdir", str(tmp_path / "run")]
    )
    st = doc["selftest"]
    assert time.time() - t0 - st["jit_build_seconds"] < 60  # under a minute with DeepSpeed's ops built
    assert code == 0, st
    assert st["path"].startswith("gloo + DeepSpeed cpu accelerator, 2 ranks")
    assert [p["status"] for p in st["phases"]] == ["passed"] * 10
    assert {c["name"]: c["status"] for c in st["checks"]} == dict.fromkeys(CHECKS, "passed")
    part = next(c for c in st["checks"] if c["name"] == "partitioning")
    ranks = part["values"]["ranks"]
    assert all(r["partitioned_local"] * 2 <= r["partitioned_full"] + 64 for r in ranks)
    placement = next(c for c in st["checks"] if c["name"] == "placement")
    assert placement["values"]["rank0"]["optimizer_class"] == "DeepSpeedCPUAdam"
    assert "cannot tell GPU from host placement" in placement["detail"]
    # HF filled "auto" from the real Qwen2.5-7B (hidden 3584), and the selftest scaled it to the tiny model
    keys = {a["key"]: a for a in st["adaptations"]}
    assert keys["zero_optimization.reduce_bucket_size"]["user_value"] == 3584 * 3584
    assert "cpu_adam" in st["phases"][2]["detail"]
    assert any("CUDA/CPU device mismatch" in text for text in st["limits"])
    assert "selftest-cpu-path" in {f["id"] for f in doc["findings"]}


LLAMAFACTORY_Z2_LORA = (
    "model_name_or_path: meta-llama/Llama-3.2-1B\nstage: sft\nfinetuning_type: lora\nlora_rank: 8\n"
    "lora_target: all\ndeepspeed: ds.json\nper_device_train_batch_size: 2\ngradient_accumulation_steps: 1\n"
    "bf16: true\ncutoff_len: 1024\noutput_dir: out\ndisable_gradient_checkpointing: true\n"
)
Z2 = {
    "train_batch_size": "auto",
    "train_micro_batch_size_per_gpu": "auto",
    "gradient_accumulation_steps": "auto",
    "gradient_clipping": "auto",
    "bf16": {"enabled": "auto"},
    "zero_optimization": {
        "stage": 2,
        "overlap_comm": False,
        "contiguous_gradients": True,
        "reduce_bucket_size": 5e8,
        "allgather_bucket_size": 5e8,
    },
}


def test_healthy_zero2_lora_setup_passes_every_check(tmp_path, capsys):
    (tmp_path / "ds.json").write_text(json.dumps(Z2))
    (tmp_path / "train.yaml").write_text(LLAMAFACTORY_Z2_LORA)
    code, doc = _selftest_json(capsys, [str(tmp_path / "train.yaml"), "--workdir", str(tmp_path / "run")])
    st = doc["selftest"]
    assert code == 0, st
    assert {c["name"]: c["status"] for c in st["checks"]} == dict.fromkeys(CHECKS, "passed")
    assert "ZeRO-2" in next(c for c in st["checks"] if c["name"] == "partitioning")["detail"]


def _ds_only(tmp_path, config, **kw):
    (tmp_path / "ds.json").write_text(json.dumps(config))
    setup = load_setup([tmp_path / "ds.json"], framework="deepspeed", model="llama-3.2-1b")
    return spec_from_setup(setup, **kw)


BASE = {
    "train_micro_batch_size_per_gpu": 2,
    "gradient_accumulation_steps": 2,
    "gradient_clipping": 1.0,
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
}


def test_config_deepspeed_rejects_is_caught_and_diagnosed(tmp_path):
    config = {**BASE, "bf16": {"enabled": True}, "fp16": {"enabled": True}, "zero_optimization": {"stage": 2}}
    result = run_selftest(_ds_only(tmp_path, config), workdir=tmp_path / "run")
    assert not result.ok
    assert result.phase("engine-init").status == "failed"
    assert result.phase("forward-backward").status == "not reached"
    first = result.findings[0]
    assert first.id == "selftest-failed" and first.data["phase"] == "engine-init"
    assert "fp16-bf16-both-enabled" in {f.id for f in result.findings}


def test_batch_size_not_matching_world_size(tmp_path):
    config = {**BASE, "train_batch_size": 16, "zero_optimization": {"stage": 1}}
    result = run_selftest(_ds_only(tmp_path, config), workdir=tmp_path / "run")
    assert not result.ok
    assert result.first_error and result.first_error["phase"] == "engine-init"
    assert "16 != 2 * 2 * 2" in str(result.first_error["message"])
    assert "batch-size-assertion" in {f.id for f in result.findings}


def test_save_that_writes_empty_weights(tmp_path):
    config = {
        **BASE,
        "bf16": {"enabled": True},
        "zero_optimization": {"stage": 3, "stage3_gather_16bit_weights_on_model_save": False},
    }
    result = run_selftest(_ds_only(tmp_path, config, save_path="state_dict"), workdir=tmp_path / "run")
    assert not result.ok
    assert all(p.status == "passed" for p in result.phases)
    assert result.check("saved-weights").status == "failed"
    assert "empty" in result.check("saved-weights").detail
    assert result.check("zero-to-fp32").status == "passed"  # the checkpoint itself is fine
    finding = next(f for f in result.findings if f.id == "selftest-saved-weights")
    assert finding.fixes[0].patch == {"zero_optimization.stage3_gather_16bit_weights_on_model_save": True}
    assert finding.evidence[0].file and finding.evidence[0].file.endswith("ds.json")


def test_model_whose_build_fails_inside_zero_init(tmp_path):
    config = {**BASE, "zero_optimization": {"stage": 3}}
    spec = with_test_hooks(
        _ds_only(tmp_path, config), model_factory=f"{HERE / 'bad_models.py'}:table_at_init"
    )
    result = run_selftest(spec, workdir=tmp_path / "run")
    assert result.phase("model-build").status == "failed"
    assert "must be 2-D" in str(result.first_error and result.first_error["message"])
    assert "z3-weight-must-be-2d" in {f.id for f in result.findings}


@pytest.mark.parametrize("kind", ["exit", "hang"])
def test_rank_that_dies_or_hangs_mid_step_does_not_hang_the_others(tmp_path, kind):
    config = {**BASE, "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}}}
    spec = with_test_hooks(
        _ds_only(tmp_path, config), fault={"rank": 1, "phase": "optimizer-steps", "kind": kind}
    )
    t0 = time.time()
    result = run_selftest(spec, workdir=tmp_path / "run", phase_timeout_s=8)
    assert time.time() - t0 - result.jit_build_seconds < 90
    assert not result.ok
    step = result.phase("optimizer-steps")
    assert step.status == ("timed out" if kind == "hang" else "interrupted")
    assert step.rank is not None
    assert result.phase("checkpoint-save").status == "not reached"
    failed = result.findings[0]
    assert failed.data["phase"] == "optimizer-steps"
