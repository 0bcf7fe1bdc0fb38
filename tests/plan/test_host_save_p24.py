"""The host side of a PEFT (LoRA) checkpoint save under ZeRO-3 by transformers version (plan/host_save.py): 4.x
consolidates the whole 16-bit model, frozen base included, on rank 0's host before PEFT keeps the adapters;
5.0+ gathers only the adapters (read in 5.17.0, 5.18.0, 5.23.0; 5.0.0 per huggingface/trl#4416). Arithmetic on a catalog model, and the real DeepSpeed engine on CPU (2 gloo ranks,
tests/plan/zero3_peft_save_job.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from zerodoctor.models import resolve_model
from zerodoctor.models.spec import model_from_config
from zerodoctor.plan import host_save as hs
from zerodoctor.plan.candidates import plan
from zerodoctor.plan.inputs import GIB, Cluster, PlanInputs, Training, ZeroSettings
from zerodoctor.plan.phases import plan_strategy

HERE = Path(__file__).resolve().parent
FULL = "rank 0: consolidated 16-bit state dict, frozen base included (PEFT)"
ADAPTERS = "rank 0: adapter state dict"


def _plan(version: str | None, *, spec=None, gather: bool = True, framework: str = "llamafactory", rank: int = 8):  # type: ignore[no-untyped-def]
    inputs = PlanInputs(
        model=spec or resolve_model("Qwen/Qwen1.5-32B-Chat"),
        cluster=Cluster(1, 2, int(47.5 * GIB), 64 * GIB),
        training=Training(method="lora", lora_rank=rank, lora_targets=("q_proj", "v_proj"), precision="bf16"),
        framework=framework,
        transformers_version=version,
    )
    return plan_strategy(inputs, ZeroSettings(stage=3, gather_16bit_on_save=gather))


def _save_host(plan) -> dict[str, int]:  # type: ignore[no-untyped-def]
    return {i.name: i.bytes for i in plan.phase("save").host}


@pytest.mark.parametrize(
    ("version", "adapters_only"),
    [("4.41.2", False), ("4.57.6", False), ("5.0.0.dev0", False), ("5.0.0", True), ("5.17.0", True), ("5.18.0", True),
     ("5.23.0", True), (None, False), ("not-a-version", False)],
)  # fmt: skip
def test_adapter_only_gather_from_5_0(version, adapters_only):
    assert hs.peft_z3_save_gathers_adapters_only(version) is adapters_only


def test_transformers_4_holds_the_whole_model_on_rank_0():
    plan = _plan("4.41.2")
    host = _save_host(plan)
    whole = (plan.frozen_params + plan.trainable_params) * 2
    assert host[FULL] == whole  # 32.5B x 2 B: more than the 64 GiB node once the ranks' baselines are added
    assert ADAPTERS not in host
    assert plan.phase("save").host_bytes > 64 * GIB > plan.phase("steady").host_bytes
    assert plan.checkpoint.weights_bytes == plan.trainable_params * 2  # PEFT still writes the adapters only
    assert "16-bit gather of the largest module" in {i.name for i in plan.phase("save").gpu}


def test_transformers_5_gathers_the_adapters_only():
    plan = _plan("5.23.0")
    host = _save_host(plan)
    assert FULL not in host
    # The adapters (a few MiB) are a smaller moment of the save than the engine checkpoint after them.
    assert host.get(ADAPTERS, plan.trainable_params * 2) == plan.trainable_params * 2
    assert "saving the weights: 0.0 GiB" in plan.phase("save").note
    assert plan.phase("save").host_bytes < 16 * GIB


def test_unknown_version_is_charged_the_whole_model():
    assert FULL in _save_host(_plan(None))


def test_gather_false_under_4x_falls_back_to_the_zero_checkpoint():
    """4.x: accelerate's get_state_dict raises ValueError without the 16-bit gather; the Trainer then writes the ZeRO
    shards (engine.save_checkpoint), no consolidated state dict."""
    old = _plan("4.41.2", gather=False)
    assert FULL not in _save_host(old) and ADAPTERS not in _save_host(old)
    assert old.checkpoint.weights_bytes == 0 and "ZeRO shards only" in old.checkpoint.weights_kind
    # ... after `_save(output_dir, state_dict={})`: the adapter file PEFT writes is empty (huggingface/trl#4416)
    assert old.checkpoint.weights_kind.startswith("EMPTY adapter file")
    new = _plan("5.23.0", gather=False)  # 5.0+ gathers the adapters for PEFT whatever the flag says
    assert new.checkpoint.weights_bytes == new.trainable_params * 2


def _result(version: str | None):  # type: ignore[no-untyped-def]
    """The whole planner (candidates and verdicts) on the review's case: LoRA of a 70B model under ZeRO-3, gather on,
    8 x 80 GiB GPUs and 128 GiB of host RAM: rank 0's whole-model gather does not fit the node on transformers 4.x."""
    inputs = PlanInputs(
        model=resolve_model("meta-llama/Llama-3.1-70B"),
        cluster=Cluster(1, 8, 80 * GIB, 128 * GIB),
        training=Training(method="lora", precision="bf16"),
        zero=ZeroSettings(stage=3, gather_16bit_on_save=True),
        framework="hf",
        transformers_version=version,
    )
    return plan(inputs)


@pytest.mark.parametrize("version", [None, "4.57.6"])
def test_gather_off_is_never_offered_for_a_trainer_peft_save_before_5_0(version):
    """transformers < 5.0 (or unknown) with the gather off writes an empty adapter file: no candidate turns it off,
    and the save warning says to keep it on."""
    result = _result(version)
    assert result.yours is not None and result.yours.status == "save spike"
    assert not any(c.zero.stage == 3 and not c.zero.gather_16bit_on_save for c in result.candidates)
    assert result.recommended is None or result.recommended.zero.gather_16bit_on_save
    (warning,) = [f for f in result.findings if f.id == "PLAN003"]
    assert "set stage3_gather_16bit_weights_on_model_save to false" not in warning.message
    assert "keep stage3_gather_16bit_weights_on_model_save true" in warning.message
    assert "empty adapter_model.safetensors" in warning.message
    whole = _save_host(result.yours)[FULL]
    assert f"{whole / GIB:,.1f} GiB, frozen base included" in warning.message  # the user's own model


def test_unknown_version_save_warning_says_why_and_what_to_do():
    (warning,) = [f for f in _result(None).findings if f.id == "PLAN003"]
    text = warning.message
    assert "transformers version is unknown" in text and "transformers < 5.0" in text
    assert "--env" in text and "zerodoctor check" in text
    known = next(f for f in _result("4.57.6").findings if f.id == "PLAN003").message
    assert "transformers 4.57.6 is older than 5.0" in known and "--env" not in known


def test_transformers_5_has_no_save_spike_to_warn_about():
    result = _result("5.23.0")
    assert result.yours is not None and result.yours.status == "fits"
    assert not [f for f in result.findings if f.id == "PLAN003"]


def test_cli_env_decides_the_save_gather(run_cli, tmp_path):
    """`plan` through main(argv): without --env the warning names the unknown version and asks for --env; with the
    training nodes' transformers 5.23.0 the adapters-only save fits and nothing is said."""
    ds = tmp_path / "ds3.json"
    ds.write_text(json.dumps({"zero_optimization": {"stage": 3, "stage3_gather_16bit_weights_on_model_save": True}}))
    env = tmp_path / "env.txt"
    env.write_text("transformers==5.23.0\naccelerate==1.15.0\ndeepspeed==0.19.8\ntorch==2.9.0\n")
    argv = ("plan", "--model", "meta-llama/Llama-3.1-70B", "--method", "lora", "--deepspeed", str(ds),
            "--gpus-per-node", "8", "--gpu-memory", "80", "--host-ram", "128")  # fmt: skip
    code, out, err = run_cli(*argv)
    assert code == 0, err
    assert "PLAN003" in out and "transformers version is unknown" in out and "Pass --env" in out
    assert "no 16-bit gather" not in out
    code, out, err = run_cli(*argv, "--env", str(env))
    assert code == 0, err
    assert "your configuration: ZeRO-3 -> fits" in out and "PLAN003" not in out


# ---- the real engine -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def measured() -> dict[int, dict]:
    pytest.importorskip("deepspeed")
    pytest.importorskip("peft")
    pytest.importorskip("psutil")
    from test_fsdp_engine import torchrun_job

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DS_ACCELERATOR", "cpu")  # the ranks inherit it: DeepSpeed's CPU accelerator even on a GPU machine
        return {r["rank"]: r for r in torchrun_job(HERE / "zero3_peft_save_job.py")}


def _tiny_plan(version: str):  # type: ignore[no-untyped-def]
    sys.path.insert(0, str(HERE))
    from zero3_peft_save_job import CONFIG, LORA_RANK

    spec = model_from_config({"model_type": "llama", **CONFIG}, name="tiny-llama", source=Path("<zero3_peft_save_job>"))
    return _plan(version, spec=spec, framework="hf", rank=LORA_RANK)


@pytest.mark.engine
def test_engine_full_gather_is_the_planned_whole_model_on_rank_0(measured):
    plan = _tiny_plan("4.57.6")
    item = _save_host(plan)[FULL]
    r0, r1 = measured[0], measured[1]
    assert r0["trainable"] == plan.trainable_params and r0["total"] == plan.trainable_params + plan.frozen_params
    assert r0["full"]["bytes"] == item and r1["full"]["bytes"] == 0
    assert r0["full"]["rss_held"] >= 0.9 * item  # measured 0.95 x: the gathered tensors stay on rank 0's host


@pytest.mark.engine
def test_engine_adapter_gather_keeps_no_model_copy(measured):
    plan = _tiny_plan("5.23.0")
    assert FULL not in _save_host(plan)
    whole = _save_host(_tiny_plan("4.57.6"))[FULL]
    r0 = measured[0]
    assert r0["adapters"]["bytes"] == plan.trainable_params * 2  # the planner's "rank 0: adapter state dict"
    assert r0["adapters"]["rss_held"] < 0.5 * whole  # gather workspace only (measured 0.31 x, rank 1 alike)
