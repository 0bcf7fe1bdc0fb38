"""Review R10 of the offload-optimizer and axolotl changes (issue 9): each case is one of R10's probes (/tmp/r10/p),
read and planned without the engine. Before each fix the plan was too large (a no-offload strategy planned fp32 Adam),
too small (an unknown launcher kept 8-bit states on the host, a dev install planned 4-bit), or read the wrong
precision."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_axolotl_review_r7 import FFT as FFT_EXAMPLE
from test_axolotl_review_r7 import QLORA as QLORA_EXAMPLE

from zerodoctor.env.model import Environment, PackageInfo
from zerodoctor.plan.inputs import PlanInputs, PlanOptions, ZeroSettings, load_inputs
from zerodoctor.plan.model_states import OPTIMIZER_STATES
from zerodoctor.plan.phases import plan_strategy

# examples/llama-3/fft-8b.yml with deepspeed_configs/zero2.json plus optimizer offload (R10's ax_fft_z2)
FFT = FFT_EXAMPLE.format(optimizer="paged_adamw_8bit")
# examples/llama-3/qlora.yml without its `bf16: auto` (R10's ax_bfloat16 / ax_float16only)
QLORA = QLORA_EXAMPLE.replace("bf16: auto\n", "")
assert "bf16" not in QLORA
ZERO2_OFFLOAD = {
    "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}},
    "bf16": {"enabled": "auto"},
    "train_micro_batch_size_per_gpu": "auto",
}


def _env(axolotl: str | None) -> Environment | None:
    if axolotl is None:
        return None
    return Environment(python="3.11", platform="linux", packages={"axolotl": PackageInfo("axolotl", axolotl)})


def _inputs(
    tmp_path: Path, text: str | None, *, ds: dict | None = None, axolotl: str | None = "0.13.0", **flags: str
) -> PlanInputs:
    """Plan inputs for an axolotl YAML `text` (and zero2.json `ds`), or for `ds` alone when `text` is None."""
    files: tuple[str, ...] = ()
    if ds is not None:
        (tmp_path / "zero2.json").write_text(json.dumps(ds))
        files = (str(tmp_path / "zero2.json"),)
    if text is not None:
        (tmp_path / "axolotl.yaml").write_text(text)
        files = (str(tmp_path / "axolotl.yaml"),)
    opts = PlanOptions(files=files, gpus_per_node=8, gpu_memory_gib=80, host_ram_gib=256, **flags)
    return load_inputs(opts, env=_env(axolotl))


def _states(inputs: PlanInputs, zero: ZeroSettings) -> int:
    return sum(c.bytes for c in plan_strategy(inputs, zero).components if c.name == OPTIMIZER_STATES)


def test_no_offload_candidate_keeps_the_client_optimizer(tmp_path: Path) -> None:
    """1. accelerate swaps the client optimizer only under optimizer offload (accelerator.py prepare_deepspeed): the
    run keeps its 8-bit optimizer, so a candidate without offload plans 8-bit states, one with offload fp32 Adam."""
    inputs = _inputs(tmp_path, FFT, ds=ZERO2_OFFLOAD)
    assert inputs.run is not None
    assert inputs.training.optimizer == "paged_adamw_8bit" and inputs.training.offload_swaps_optimizer
    assert any("DeepSpeedCPUAdam" in n and "paged_adamw_8bit" in n for n in inputs.run.notes)
    trainable = inputs.model.params.total
    assert _states(inputs, ZeroSettings(stage=2, offload_optimizer="cpu")) == pytest.approx(trainable, rel=0.01)
    assert _states(inputs, ZeroSettings(stage=2)) < 3 * trainable / 8


def test_unknown_launcher_swaps_like_hf(tmp_path: Path) -> None:
    """2. A DeepSpeed config alone (launcher unknown, read as HF Trainer) with `--optimizer adamw_8bit` and
    optimizer offload: DeepSpeedCPUAdam steps (accelerate), or a raw DeepSpeed script raises (engine.py)."""
    inputs = _inputs(
        tmp_path, None, ds=ZERO2_OFFLOAD, model="NousResearch/Meta-Llama-3-8B", optimizer="adamw_8bit"
    )
    assert inputs.run is not None and inputs.run.framework.name is None
    assert inputs.training.offload_swaps_optimizer
    trainable = inputs.model.params.total
    assert _states(inputs, ZeroSettings(stage=2, offload_optimizer="cpu")) == pytest.approx(trainable, rel=0.01)


@pytest.mark.parametrize("axolotl", [None, "0.4.0", "0.8.0"])
@pytest.mark.parametrize(("key", "precision"), [("bfloat16", "bf16"), ("float16", "fp16")])
def test_unwritten_bf16_reads_bfloat16_and_float16(tmp_path: Path, axolotl: str | None, key: str, precision: str) -> None:
    """4. bf16 unwritten: resolve_dtype gives bf16 weights for `bfloat16`, fp16 for `float16` in every release (from
    v0.5.0 the unwritten bf16 is "auto", which wins over float16); not the unknown version's fp32 fallback."""
    run = _inputs(tmp_path, QLORA + f"{key}: true\n", axolotl=axolotl).run
    assert run is not None
    want = "bf16" if axolotl == "0.8.0" else precision
    assert run.precision.value == want
    if axolotl != "0.8.0":
        assert key in run.precision.origin.describe()
        assert not any("bf16 is not written" in n for n in run.notes)
    # nothing written: the version decides (fp32 where it is not known, with its note)
    assert _inputs(tmp_path, QLORA, axolotl=None).run.precision.value == "fp32"  # type: ignore[union-attr]


@pytest.mark.parametrize("axolotl", ["0.13.0.dev0", "0.13.0rc1", "0.13.0.dev"])
def test_pre_release_of_0_13_is_an_unknown_version(tmp_path: Path, axolotl: str) -> None:
    """6. `adapter: lora` + load_in_4bit on a 0.13.0 pre-release (main carried "0.13.0.dev" before #3205 landed):
    not the 4-bit plan of the releases before, but the unknown version's unquantized LoRA plan with its note."""
    run = _inputs(tmp_path, QLORA.replace("adapter: qlora", "adapter: lora"), axolotl=axolotl).run
    assert run is not None and run.method.value == "lora"
    assert any("pre-release" in n and axolotl in n for n in run.notes)
    # releases decide: 0.12.2 quantizes, 0.13.0 does not
    old = _inputs(tmp_path, QLORA.replace("adapter: qlora", "adapter: lora"), axolotl="0.12.2").run
    assert old is not None and old.method.value == "qlora"


@pytest.mark.parametrize("rl", ["grpo", "gdpo", "ebft"])
def test_online_rl_has_no_fits_verdict(tmp_path: Path, rl: str) -> None:
    """8. `rl: grpo` (R10's dpo7_grpo): generation and the reward / reference models are not modelled, so a strategy
    whose planned peak fits is a lower bound, not "fits"; offline preference training keeps its verdict."""
    from zerodoctor.plan.candidates import plan

    text = QLORA.replace("adapter: qlora\n", "").replace("load_in_4bit: true", "load_in_4bit: false")
    inputs = _inputs(tmp_path, text + f"rl: {rl}\nbf16: true\n")
    assert inputs.training.lower_bound is not None and f"rl: {rl}" in inputs.training.lower_bound
    z3 = plan_strategy(inputs, ZeroSettings(stage=3))
    assert z3.fits and z3.status == "lower bound"
    assert z3.to_dict()["lower_bound"] == inputs.training.lower_bound
    result = plan(inputs)
    assert result.recommended is not None and result.recommended.status == "lower bound"
    assert any("only a lower bound" in f.message for f in result.findings)
    offline = _inputs(tmp_path, text + "rl: dpo\nbf16: true\n")
    assert offline.training.lower_bound is None
    assert plan_strategy(offline, ZeroSettings(stage=3)).status == "fits"


@pytest.mark.parametrize(
    ("name", "kind", "per_param", "paged"),
    [
        ("ademamix", "ademamix", 12.0, False),
        ("ademamix_8bit", "ademamix_8bit", 3.0 + 12 / 256, False),
        ("paged_ademamix_32bit", "paged_ademamix_32bit", 12.0, True),
        ("paged_ademamix_8bit", "paged_ademamix_8bit", 3.0 + 12 / 256, True),
    ],
)
def test_ademamix_8bit_states_are_uint8(tmp_path: Path, name: str, kind: str, per_param: float, paged: bool) -> None:
    """3. bitsandbytes AdEMAMix with optim_bits 8 keeps its three states in uint8 plus fp32 absmax per 256-element
    block (ademamix.py init_state), not 12 B; the paged variants are cudaMallocManaged like paged AdamW."""
    from zerodoctor.plan.model_states import PAGED_OPTIMIZERS, optimizer_state_bytes_per_param

    inputs = _inputs(tmp_path, FFT.replace("paged_adamw_8bit", name).replace("deepspeed: zero2.json\n", ""))
    assert inputs.training.optimizer == kind
    assert optimizer_state_bytes_per_param(kind) == pytest.approx(per_param)
    assert (kind in PAGED_OPTIMIZERS) is paged


@pytest.mark.parametrize(
    ("stage", "ds_fp16", "precision"), [(3, "auto", "fp32"), (3, None, "fp32"), (3, True, "fp16"), (2, "auto", "fp16")]
)
def test_float16_under_zero3_init_is_fp32(tmp_path: Path, stage: int, ds_fp16: object, precision: str) -> None:
    """7. `bf16: false` + `float16: true` (R10's prec2): axolotl's TrainingArguments say bf16 / fp16 false, so under
    ZeRO-3 a DeepSpeed config that does not enable fp16 itself makes zero.Init cast the parameters to fp32."""
    ds: dict = {"zero_optimization": {"stage": stage}, "train_micro_batch_size_per_gpu": "auto"}
    if ds_fp16 is not None:
        ds["fp16"] = {"enabled": ds_fp16}
    text = QLORA.replace("adapter: qlora\n", "").replace("load_in_4bit: true", "load_in_4bit: false")
    run = _inputs(tmp_path, text + "bf16: false\nfloat16: true\ndeepspeed: zero2.json\n", ds=ds).run
    assert run is not None and run.precision.value == precision
    assert any("zero.Init" in n and "float16" in n for n in run.notes) is (precision == "fp32")


@pytest.mark.parametrize(("axolotl", "hf_bf16"), [("0.4.0", False), ("0.8.0", True), (None, True)])
def test_check_reads_the_release_for_unwritten_bf16(tmp_path: Path, axolotl: str | None, hf_bf16: bool) -> None:
    """5. bf16 unwritten: the TrainingArguments `check` compares are those of the installed release (bf16 stays None
    before v0.5.0: HF001 against a DeepSpeed bf16 true), and `plan` reads a DeepSpeed `bf16.enabled: true` as bf16
    whatever the release (fp32 is never the outcome: bf16, or the run stops)."""
    from zerodoctor.setup.hf_args import effective_args

    assert effective_args({"base_model": "x", "sequence_len": 8}, axolotl_version=axolotl)["bf16"] is hf_bf16
    ds = {"zero_optimization": {"stage": 3}, "bf16": {"enabled": True}, "train_micro_batch_size_per_gpu": "auto"}
    run = _inputs(tmp_path, QLORA + "deepspeed: zero2.json\n", ds=ds, axolotl=axolotl).run
    assert run is not None and run.precision.value == "bf16"
    assert not any("bf16 is not written" in n for n in run.notes)
