"""`zerodoctor selftest` on the real engine: 2 ranks under torchrun, gloo + DeepSpeed's CPU accelerator.

Every run is real (no mocks). Healthy ZeRO-2 (LoRA) and ZeRO-3 offload setups pass with every
positive check; real breakage is caught: a config DeepSpeed rejects, a batch size that does not fit the world
size, a save that writes ZeRO-3's empty views, a model whose build fails inside zero.Init, a rank that dies
mid-step and a rank that hangs (the watchdog ends the others), each named as the rank that failed.

Runs that several tests look at are module-scoped fixtures: one launch, several assertions.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from zerodoctor.cli.main import main
from zerodoctor.findings import Severity
from zerodoctor.lint.engine import lint_setup
from zerodoctor.report.selftest import render_selftest_markdown, summary_text
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


@pytest.fixture(scope="module")
def zero3_offload(tmp_path_factory):
    """One healthy ZeRO-3 offload run through the CLI (HF arguments + ds.json, world size 16), shared by the
    tests below: (exit code, JSON document, seconds without JIT builds)."""
    import contextlib
    import io

    tmp = tmp_path_factory.mktemp("z3")
    (tmp / "ds.json").write_text(json.dumps(Z3_OFFLOAD))
    (tmp / "args.yaml").write_text(HF_ARGS)
    t0 = time.time()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(
            ["selftest", str(tmp), "--world-size", "16", "--workdir", str(tmp / "run"), "--format", "json"]
        )
    doc = json.loads(out.getvalue())
    return code, doc, time.time() - t0 - doc["selftest"]["jit_build_seconds"], tmp


def test_healthy_zero3_offload_setup_passes_every_check(zero3_offload):
    code, doc, seconds, _ = zero3_offload
    st = doc["selftest"]
    assert seconds < 60  # under a minute with DeepSpeed's ops built
    assert code == 0, st
    assert st["path"].startswith("gloo + DeepSpeed cpu accelerator, 2 ranks")
    assert [p["status"] for p in st["phases"]] == ["passed"] * 10
    assert all(p["seconds"] is not None for p in st["phases"][:-1])
    assert {c["name"]: c["status"] for c in st["checks"]} == dict.fromkeys(CHECKS, "passed")


def test_zero3_offload_positive_checks_measure_partitions_and_placement(zero3_offload):
    st = zero3_offload[1]["selftest"]
    part = next(c for c in st["checks"] if c["name"] == "partitioning")
    ranks = part["values"]["ranks"]
    assert all(r["partitioned_local"] * 2 <= r["partitioned_full"] + 64 for r in ranks)
    placement = next(c for c in st["checks"] if c["name"] == "placement")
    assert placement["values"]["rank0"]["optimizer_class"] == "DeepSpeedCPUAdam"
    assert placement["values"]["rank0"]["master_devices"] == ["cpu"]
    assert "cannot tell GPU from host placement" in placement["detail"]
    clip = next(c for c in st["checks"] if c["name"] == "clipping")
    assert clip["values"]["grad_norm"] > clip["values"]["clip"] == 1.0
    assert "cpu_adam" in st["phases"][2]["detail"]


def test_lint_verdict_on_the_setup_holds_on_the_engine(zero3_offload):
    """lint finds nothing wrong with this ZeRO-3 offload setup, and the real engine runs it with every check
    passing (was tests/engine's clean-run test: one launch now serves both)."""
    code, _doc, _seconds, tmp = zero3_offload
    findings = lint_setup(load_setup([tmp / "args.yaml"], world_size=16))
    assert not [f for f in findings if f.severity >= Severity.WARNING], findings
    assert code == 0


def test_zero3_offload_reports_adaptations_and_what_the_cpu_path_cannot_show(zero3_offload):
    doc = zero3_offload[1]
    st = doc["selftest"]
    # HF filled "auto" from the real Qwen2.5-7B (hidden 3584), and the selftest scaled it to the tiny model
    keys = {a["key"]: a for a in st["adaptations"]}
    assert keys["zero_optimization.reduce_bucket_size"]["user_value"] == 3584 * 3584
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


def test_healthy_zero2_lora_setup_passes_every_check_markdown(tmp_path, capsys):
    (tmp_path / "ds.json").write_text(json.dumps(Z2))
    (tmp_path / "train.yaml").write_text(LLAMAFACTORY_Z2_LORA)
    code = main(
        ["selftest", str(tmp_path / "train.yaml"), "--workdir", str(tmp_path / "run"), "--format", "markdown"]
    )
    md = capsys.readouterr().out
    assert code == 0, md
    assert md.startswith("# zerodoctor selftest: passed")
    phases = _table(md, "## Phases")
    assert [row[0] for row in phases] == [
        "distributed init",
        "zero.Init + model build",
        "engine init (deepspeed.initialize)",
        "forward/backward",
        "first optimizer step, clipping forced",
        "optimizer steps",
        "partition and placement inspection",
        "checkpoint save",
        "reload + zero_to_fp32",
        "single-process reference",
    ]
    assert {row[1] for row in phases} == {"passed"}
    assert all(row[2].endswith(" s") for row in phases)  # every phase timed
    checks = {row[0]: row for row in _table(md, "## Checks")}
    assert {name: row[1] for name, row in checks.items()} == dict.fromkeys(CHECKS, "passed")
    assert "ZeRO-2" in checks["partitioning"][2]
    assert "## What this run cannot show" in md and "### INFO selftest-cpu-path" in md


def _table(markdown: str, heading: str) -> list[list[str]]:
    """The body rows of the Markdown table under `heading`, as cells."""
    after = markdown.split(heading + "\n", 1)[1].lstrip("\n").splitlines()
    rows = []
    for line in after:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split(" | ")])
    return rows[2:]  # header and separator


def _ds_only(where, config, **kw):
    (where / "ds.json").write_text(json.dumps(config))
    setup = load_setup([where / "ds.json"], framework="deepspeed", model="llama-3.2-1b")
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


def test_exception_in_the_clipping_step_is_that_ranks_failure(tmp_path):
    """An exception in the hand-marked training phases (forward/backward, the clipping step) is the rank's own
    error with its phase, not a silent death; the rank it left waiting is named as ended."""
    config = {**BASE, "zero_optimization": {"stage": 2}}
    spec = with_test_hooks(
        _ds_only(tmp_path, config), model_factory=f"{HERE / 'bad_models.py'}:fails_in_clip_step"
    )
    result = run_selftest(spec, workdir=tmp_path / "run")
    step = result.phase("clip-step")
    assert step.status == "failed" and step.rank == 1, step
    assert "RuntimeError: injected failure in the second backward on rank 1" in step.detail
    assert result.phase("forward-backward").status == "passed"
    failed = result.findings[0]
    assert failed.title == "Selftest failed in phase 'first optimizer step, clipping forced' on rank 1"
    assert result.first_error["type"] == "RuntimeError"
    assert "Then: rank 0 " in failed.message


@pytest.fixture(scope="module", params=["exit", "hang"])
def rank1_fault(request, tmp_path_factory):
    """Rank 1 ends (exit code 17) or hangs between its forward and backward in the second optimizer step,
    under ZeRO-3 with optimizer offload: (kind, result, seconds without JIT builds)."""
    kind = request.param
    tmp = tmp_path_factory.mktemp(f"fault-{kind}")
    config = {**BASE, "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}}}
    spec = with_test_hooks(_ds_only(tmp, config), fault={"rank": 1, "phase": "optimizer-steps", "kind": kind})
    t0 = time.time()
    result = run_selftest(spec, workdir=tmp / "run", phase_timeout_s=6)
    return kind, result, time.time() - t0 - result.jit_build_seconds


def test_rank_that_dies_or_hangs_mid_step_does_not_hang_the_others(rank1_fault):
    kind, result, seconds = rank1_fault
    assert seconds < 90
    assert not result.ok
    step = result.phase("optimizer-steps")
    assert step.status == ("timed out" if kind == "hang" else "interrupted")
    assert result.phase("checkpoint-save").status == "not reached"
    assert result.findings[0].data["phase"] == "optimizer-steps"


def test_the_rank_that_died_or_hung_is_named_and_the_others_as_ended(rank1_fault):
    kind, result, _ = rank1_fault
    step = result.phase("optimizer-steps")
    failed = result.findings[0]
    assert step.rank == 1 and failed.data["rank"] == 1 and result.first_error["rank"] == 1
    assert failed.title == "Selftest failed in phase 'optimizer steps' on rank 1"
    if kind == "exit":
        # torchrun's summary: rank 1 exit code 17 (its "first observed failure"), rank 0 -15 (SIGTERM from torchrun)
        assert failed.id == "selftest-failed"
        assert "rank 1 ended without a Python exception (exit code 17)" in step.detail
        # rank 0 is either stopped by torchrun's SIGTERM or first sees gloo's "Connection reset by peer"
        assert "rank 0 was ended by torchrun" in step.detail or "rank 0 then failed because" in step.detail
        # torchrun names rank 1 as its first observed failure, unless rank 0's own "peer gone" error reached
        # torchrun first (a race on a busy machine): then rank 1 is still the one named, by its silent exit
        assert "torchrun's first observed failure: rank 1" in result.first_error["evidence"] or (
            "rank 0 then failed because" in step.detail
        ), (step.detail, result.first_error["evidence"])
    else:
        # rank 1's own stack is in the injected sleep, rank 0's in a collective waiting for it
        assert failed.id == "selftest-timeout"
        assert "rank 1 stopped making progress in step 2, micro batch 1, at the forward" in step.detail
        assert "in _fault" in step.detail
        assert (
            "rank 0 was ended by the watchdog (waiting in a collective at torch/distributed/" in step.detail
        )
        assert any(
            e.startswith("progress marks: rank 0 in step 2, micro batch 1, at the backward")
            for e in result.first_error["evidence"]
        )
        assert "rank 0 was ended by the watchdog" in failed.message


def test_failure_outside_the_knowledge_base_shows_its_class(rank1_fault):
    kind, result, _ = rank1_fault
    failed = result.findings[0]
    assert failed.data["diagnosis"] is None
    assert not any(f.id.startswith("class:") for f in result.findings)  # not shown as a KB entry
    if kind == "exit":
        assert failed.data["failure_class"] == "class:crash"
        assert "Not in the knowledge base; zerodoctor diagnose names its class:" in failed.message
        assert "(`class:crash`)" in failed.message
    assert any("rank 1, phase optimizer steps" in fix.text for fix in failed.fixes)


def test_failed_run_renders_the_phase_table_with_the_rank(rank1_fault):
    kind, result, _ = rank1_fault
    md = render_selftest_markdown(result, source="ds.json")
    assert md.startswith("# zerodoctor selftest: FAILED")
    rows = {row[0]: row for row in _table(md, "## Phases")}
    status = "timed out" if kind == "hang" else "interrupted"
    assert rows["optimizer steps"][1:4] == [f"**{status}**", rows["optimizer steps"][2], "1"]
    assert rows["checkpoint save"][1] == "not reached"
    assert "### ERROR selftest-" in md
    text = summary_text(result, source="ds.json")
    assert ("HUNG" if kind == "hang" else "DIED") in text and "rank 1" in text
