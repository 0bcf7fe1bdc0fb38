"""Apple's Cut Cross-Entropy in the planner (issue 9): the loss from the final hidden states and the head weight
without logits, in training and evaluation, and the keys that switch it on (plan/cce.py)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from zerodoctor.models import resolve_model
from zerodoctor.plan.activations import activation_bytes, eval_forward_bytes
from zerodoctor.plan.cce import CutCrossEntropy, cut_ce_bytes
from zerodoctor.plan.inputs import GIB, Cluster, PlanInputs, PlanOptions, Training, ZeroSettings, load_inputs
from zerodoctor.plan.phases import CCE_LOSS_ITEM, LIGER_LOSS_ITEM, cce_for, plan_strategy

MODEL = "qwen2.5-0.5b"
B, S, D = 1, 4096, 2


def _spec():
    return resolve_model(MODEL)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def test_bytes_follow_the_source() -> None:
    """save_for_backward(e, c, bias, lse, targets, valids, logit_avg); backward de / dc = zeros_like, argsort."""
    p = _spec().params
    t, h, v = B * S, p.hidden_size, p.vocab_size
    rows = t - B  # shift=True: the label rows after the shift
    c = cut_ce_bytes(tokens=t, batch=B, hidden=h, vocab=v, dtype_bytes=D, head_trainable=True, cce=CutCrossEntropy())
    assert c.rows == rows
    # e (the final hidden states, T x H), fp32 LSE and int64 valids per row, fp32 logit_avg per vocabulary entry
    assert c.saved == D * t * h + 4 * rows + 8 * rows + 4 * v
    # backward: de (T x H), dc (V x H), the int32 order, the int32 locks of cdiv(B,128) / cdiv(V,128) x cdiv(H,64)
    locks = 4 * _cdiv(h, 64) * (_cdiv(rows, 128) + _cdiv(v, 128))
    assert (c.grad_input, c.grad_weight, c.locks) == (D * t * h, D * v * h, locks)
    assert c.transient == max(24 * rows, 12 * v, 4 * v + D * t * h + D * v * h + locks)
    # no T x V tensor anywhere
    assert c.saved + c.transient < D * t * v
    # a frozen head: no dc, no dc locks; a head whose gradient another item charges: dc not counted, its locks are
    frozen = cut_ce_bytes(
        tokens=t, batch=B, hidden=h, vocab=v, dtype_bytes=D, head_trainable=False, cce=CutCrossEntropy()
    )
    assert frozen.grad_weight == 0 and frozen.locks == 4 * _cdiv(h, 64) * _cdiv(rows, 128)
    assert frozen.saved == c.saved  # e is saved whether the head trains or not
    charged = cut_ce_bytes(
        tokens=t, batch=B, hidden=h, vocab=v, dtype_bytes=D, head_trainable=True,
        cce=CutCrossEntropy(head_grad_charged=True),
    )  # fmt: skip
    assert charged.grad_weight == 0 and charged.locks == locks


@pytest.mark.parametrize("lora", [False, True])
def test_cce_replaces_the_logits_terms(lora: bool) -> None:
    spec = _spec()
    p = spec.params
    t, h, v = B * S, p.hidden_size, p.vocab_size
    kw = {"micro_batch": B, "seq_len": S, "attn_impl": "flash", "gradient_checkpointing": True}
    if lora:
        kw["lora_rank"] = 8
    hf = activation_bytes(spec, **kw)  # type: ignore[arg-type]
    cce = activation_bytes(spec, cut_ce=CutCrossEntropy(), **kw)  # type: ignore[arg-type]
    c = cce.cut_loss
    assert c is not None and hf.cut_loss is None and cce.fused_loss is None
    assert hf.logits_and_loss >= (D + 4 + 4) * t * v  # 16-bit logits + fp32 upcast + fp32 log-probabilities
    assert cce.logits_and_loss == c.transient
    assert c.grad_weight == (0 if lora else D * v * h)
    # at the loss: checkpointed inputs (+ the embedding's ids when it trains) + the final norm's saved tensors
    # (fp32 input + rsqrt, + the 16-bit normalised tensor with a trainable weight) + CCE's saved and transient
    kept = p.num_layers * D * t * h + (0 if lora else 8 * t)
    norm = 4 * t * h + 4 * t + (0 if lora else D * t * h)
    assert cce.at_loss == kept + norm + c.saved + c.transient
    assert cce.peak < hf.peak
    assert cce.fused_loss_peak == cce.peak - max(kept + norm, cce.in_backward)


def test_eval_forward_has_no_logits() -> None:
    """`use_lce(labels, training)` is true in eval mode: no logits, so none kept for metrics either."""
    spec = _spec()
    p = spec.params
    t, rows = 8 * S, 8 * S - 8
    kw = {"micro_batch": 8, "seq_len": S, "keep_logits": True}
    hf = eval_forward_bytes(spec, **kw)  # type: ignore[arg-type]
    cce = eval_forward_bytes(spec, cut_cross_entropy=True, **kw)  # type: ignore[arg-type]
    assert hf.kept_logits == D * t * p.vocab_size and cce.kept_logits == 0
    assert cce.loss == D * t * p.hidden_size + max(24 * rows, 16 * rows + 4 * _cdiv(rows, 128))
    assert cce.loss < hf.loss


def _inputs(*, cce: bool, liger: bool = False, model: str = MODEL, method: str = "full") -> PlanInputs:
    return PlanInputs(
        model=resolve_model(model),
        cluster=Cluster(1, 4, 80 * GIB, 512 * GIB),
        training=Training(
            method=method, micro_batch=1, seq_len=8192, attn="flash", gradient_checkpointing=True,
            liger_kernel=liger, cut_cross_entropy=cce, eval_micro_batch=8, eval_keeps_logits=True,
        ),  # fmt: skip
        framework="hf",
    )


def test_when_cce_applies() -> None:
    zero = ZeroSettings(stage=3)
    on = _inputs(cce=True)
    got = cce_for(on, on.training, zero)
    assert got is not None and got.head_grad_charged  # ZeRO-3 full fine-tune: the head's gradient charged there
    assert cce_for(on, on.training, ZeroSettings(stage=1)) == CutCrossEntropy(head_grad_charged=False)
    off = _inputs(cce=False)
    assert cce_for(off, off.training, zero) is None
    # Liger's fused loss replaces the same forward later (Trainer init): Liger wins
    both = _inputs(cce=True, liger=True)
    assert cce_for(both, both.training, zero) is None
    # preference training passes no labels; a remote-code model is outside cce_patch and the generic patch
    assert cce_for(on, replace(on.training, paired_inputs=True), zero) is None
    remote = _inputs(cce=True, model="internlm2-7b")
    assert cce_for(remote, remote.training, zero) is None


def test_plan_items_steady_and_eval() -> None:
    zero = ZeroSettings(stage=3)
    plans = {cce: plan_strategy(_inputs(cce=cce), zero) for cce in (False, True)}
    steady = {cce: {i.name: i for i in plan.phase("steady").gpu} for cce, plan in plans.items()}
    assert CCE_LOSS_ITEM in steady[True] and CCE_LOSS_ITEM not in steady[False]
    assert LIGER_LOSS_ITEM not in steady[True]
    act = "activations + logits/loss"
    assert steady[True][act].bytes < steady[False][act].bytes
    ev = {cce: next(i for i in plan.phase("eval").gpu if i.name.startswith("evaluation forward")) for cce, plan in
          plans.items()}  # fmt: skip
    assert "Cut Cross-Entropy (no logits)" in ev[True].detail and "Cut Cross-Entropy" not in ev[False].detail
    assert ev[True].bytes < ev[False].bytes  # no logits made, none kept
    # both on: Liger's item, and the activation item says why CCE is not applied
    both = {i.name: i for i in plan_strategy(_inputs(cce=True, liger=True), zero).phase("steady").gpu}
    assert LIGER_LOSS_ITEM in both and CCE_LOSS_ITEM not in both
    assert "Cut Cross-Entropy not applied: Liger" in both[act].detail


AXOLOTL = (
    "base_model: Qwen/Qwen2.5-0.5B\ndeepspeed: ds.json\nbf16: true\nmicro_batch_size: 1\nsequence_len: 4096\n"
)
PLUGIN = "plugins:\n  - axolotl.integrations.cut_cross_entropy.CutCrossEntropyPlugin\n"
OTHER = "plugins:\n  - axolotl.integrations.liger.LigerPlugin\n"


@pytest.mark.parametrize(
    ("text", "on", "key"),
    [
        (AXOLOTL + "cut_cross_entropy: true\n", True, "cut_cross_entropy"),
        (AXOLOTL + PLUGIN, False, "plugins"),  # on by default from axolotl v0.9.0 only: version unknown, off
        (AXOLOTL + PLUGIN + "cut_cross_entropy: true\n", True, "cut_cross_entropy"),
        (AXOLOTL + PLUGIN + "cut_cross_entropy: false\n", False, "cut_cross_entropy"),
        (AXOLOTL + OTHER + "cut_cross_entropy: true\n", False, "plugins"),  # no plugin: axolotl never patches
        (AXOLOTL + OTHER, False, "plugins"),
        (AXOLOTL + "plugins: axolotl.integrations.cut_cross_entropy.CutCrossEntropyPlugin\n", False, "plugins"),
        (AXOLOTL + "plugins: axolotl.integrations.cut_cross_entropy.CutCrossEntropyPlugin\ncut_cross_entropy: 1\n",
         True, "cut_cross_entropy"),
        (AXOLOTL + 'cut_cross_entropy: "false"\n', False, "cut_cross_entropy"),
        (AXOLOTL, False, None),
    ],
)
def test_reader_forms(tmp_path: Path, text: str, on: bool, key: str | None) -> None:
    (tmp_path / "ds.json").write_text('{"zero_optimization": {"stage": 3}}')
    args = tmp_path / "axolotl.yaml"
    args.write_text(text)
    opts = PlanOptions(files=(str(args),), model=MODEL, gpus_per_node=4, gpu_memory_gib=80, host_ram_gib=512)
    inputs = load_inputs(opts)
    assert inputs.training.cut_cross_entropy is on
    assert inputs.run is not None
    known = inputs.run.cut_cross_entropy
    if key is None:
        assert known is None
    else:
        assert known is not None and known.value is on and "axolotl.yaml" in known.origin.describe()
    assert (CCE_LOSS_ITEM in {i.name for i in plan_strategy(inputs, ZeroSettings(stage=3)).phase("steady").gpu}) is on


@pytest.mark.parametrize(("axolotl", "on"), [("0.9.0", True), ("0.12.2", True), ("0.8.1", False), (None, False)])
def test_plugin_default_by_axolotl_release(tmp_path: Path, axolotl: str | None, on: bool) -> None:
    """`cut_cross_entropy` unwritten with the plugin listed: axolotl's default, None (off) in v0.6.0-v0.8.x and true
    from v0.9.0 (#2562); with no release known, planned off and the note says what turns it on."""
    from zerodoctor.env.model import Environment, PackageInfo

    (tmp_path / "ds.json").write_text('{"zero_optimization": {"stage": 3}}')
    args = tmp_path / "axolotl.yaml"
    args.write_text(AXOLOTL + PLUGIN)
    env = Environment(python="3.11", platform="linux", packages={"axolotl": PackageInfo("axolotl", axolotl)}) if (
        axolotl
    ) else None  # fmt: skip
    opts = PlanOptions(files=(str(args),), model=MODEL, gpus_per_node=4, gpu_memory_gib=80, host_ram_gib=512)
    inputs = load_inputs(opts, env=env)
    assert inputs.training.cut_cross_entropy is on
    assert inputs.run is not None
    note = [n for n in inputs.run.notes if "CutCrossEntropyPlugin is listed" in n]
    if axolotl is None:
        assert len(note) == 1 and "axolotl.yaml" in note[0]
        assert "cut_cross_entropy: true" in note[0] and ">= 0.9.0" in note[0]
    else:
        assert not note
        known = inputs.run.cut_cross_entropy
        assert known is not None and f"axolotl {axolotl}" in known.origin.describe()


def test_llamafactory_has_no_cut_cross_entropy(tmp_path: Path) -> None:
    """LLaMA-Factory's parser refuses `cut_cross_entropy` (lint HF004): the run never gets CCE, nothing is read."""
    (tmp_path / "ds.json").write_text('{"zero_optimization": {"stage": 3}}')
    args = tmp_path / "lf.yaml"
    args.write_text(
        "model_name_or_path: Qwen/Qwen2.5-0.5B\nstage: sft\ndo_train: true\nfinetuning_type: lora\n"
        "dataset: alpaca_en_demo\ntemplate: qwen\ncutoff_len: 4096\nper_device_train_batch_size: 1\n"
        "bf16: true\noutput_dir: out\ndeepspeed: ds.json\ncut_cross_entropy: true\n"
    )
    opts = PlanOptions(files=(str(args),), model=MODEL, gpus_per_node=4, gpu_memory_gib=80, host_ram_gib=512)
    inputs = load_inputs(opts)
    assert inputs.framework == "llamafactory"
    assert inputs.run is not None and inputs.run.cut_cross_entropy is None
    assert not inputs.training.cut_cross_entropy
    assert CCE_LOSS_ITEM not in {i.name for i in plan_strategy(inputs, ZeroSettings(stage=3)).phase("steady").gpu}


def test_the_flag_wins(run_cli, tmp_path: Path) -> None:
    import json

    (tmp_path / "ds.json").write_text('{"zero_optimization": {"stage": 3}}')
    args = tmp_path / "axolotl.yaml"
    args.write_text(AXOLOTL + PLUGIN)
    cluster = ("--model", MODEL, "--nodes", "1", "--gpus-per-node", "4", "--gpu-memory", "80", "--host-ram", "512")
    for flag, on in (("--no-cut-cross-entropy", False), ("--cut-cross-entropy", True)):
        code, out, err = run_cli("plan", str(args), *cluster, flag, "--format", "json")
        assert code in (0, 1), err
        steady = next(p for p in json.loads(out)["yours"]["phases"] if p["name"] == "steady")
        assert (CCE_LOSS_ITEM in {i["name"] for i in steady["gpu"]}) is on
    code, out, _ = run_cli("plan", "--help")
    assert code == 0 and "--cut-cross-entropy" in out


def test_allocator_replays_no_logits() -> None:
    """The allocator replay of a CCE step never allocates the T x V logits, their fp32 upcast or the log-probabilities;
    it allocates the fp32 logit average and the vocabulary order (V entries) and keeps the head gathered."""
    from zerodoctor.plan.allocator import Alloc, step_shape, training_events

    zero = ZeroSettings(stage=3)
    p = _spec().params
    t, v = 8192, p.vocab_size
    sizes = {}
    for cce in (False, True):
        inputs = _inputs(cce=cce)
        shape = step_shape(inputs, zero, inputs.training, exact_load=False)
        assert shape.cut_ce is cce
        events = training_events(shape, steps=1, simulated_layers=2)
        sizes[cce] = {e.nbytes for e in events if isinstance(e, Alloc)}
    assert {D * t * v, 4 * t * v} <= sizes[False]
    assert not {D * t * v, 4 * t * v} & sizes[True]
    assert {4 * v, 8 * v} <= sizes[True]


def test_liger_without_its_fused_loss_leaves_cut_cross_entropy_running() -> None:
    """Liger replaces the model's forward only when its fused loss is on (`apply_liger_kernel_to_<type>`'s
    `fused_linear_cross_entropy`): switched off in `liger_kernel_config`, the plugin's CCE forward stays and runs."""
    both = _inputs(cce=True, liger=True)
    no_flce = replace(both.training, liger_kernel_config=(("fused_linear_cross_entropy", False),))
    zero = ZeroSettings(stage=3)
    assert cce_for(both, no_flce, zero) is not None
    plan = plan_strategy(replace(both, training=no_flce), zero)
    steady = {i.name: i for i in plan.phase("steady").gpu}
    assert CCE_LOSS_ITEM in steady and LIGER_LOSS_ITEM not in steady
    assert "planned as HF" not in steady["activations + logits/loss"].detail


def test_each_reason_named_and_remote_code_by_type() -> None:
    """`_cce_note` names the one reason of the user's run; remote code is `ModelSpec.remote_code`, not a text."""
    zero = ZeroSettings(stage=3)
    remote = _inputs(cce=True, model="internlm2-7b")
    assert remote.model.remote_code and not _spec().remote_code
    act = {i.name: i for i in plan_strategy(remote, zero).phase("steady").gpu}["activations + logits/loss"].detail
    assert "remote-code internlm2, not a type of the CCE fork" in act and "preference" not in act
    paired = _inputs(cce=True)
    paired = replace(paired, training=replace(paired.training, paired_inputs=True))
    act = {i.name: i for i in plan_strategy(paired, zero).phase("steady").gpu}["activations + logits/loss"].detail
    assert "not applied (preference training" in act and "remote" not in act


def test_fork_types_have_their_own_forward() -> None:
    """qwen3 has its own `cce_forward` in axolotl's fork: no "generic llama-like patch" label."""
    zero = ZeroSettings(stage=3)
    for model, generic in (("qwen3-0.6b", False), (MODEL, False)):
        steady = {i.name: i for i in plan_strategy(_inputs(cce=True, model=model), zero).phase("steady").gpu}
        assert ("generic llama-like patch" in steady[CCE_LOSS_ITEM].detail) is generic


def test_modules_to_save_head_trains() -> None:
    """LoRA with `modules_to_save: [lm_head]`: the copy's weight requires grad, so CCE's backward makes dc."""
    zero = ZeroSettings(stage=0)
    base = _inputs(cce=True, method="lora")
    saved = replace(base, training=replace(base.training, lora_rank=8, trainable_modules=("lm_head",)))
    plain = replace(base, training=replace(base.training, lora_rank=8))
    got = cce_for(saved, saved.training, zero)
    assert got is not None and got.head_trains
    assert not cce_for(plain, plain.training, zero).head_trains  # type: ignore[union-attr]
    items = {i.name: i for i in plan_strategy(saved, zero).phase("steady").gpu}
    detail = items[CCE_LOSS_ITEM].detail
    assert "frozen head" not in detail and "dc (the head's gradient)" in detail
    frozen = {i.name: i for i in plan_strategy(plain, zero).phase("steady").gpu}
    assert "frozen head: no dc" in frozen[CCE_LOSS_ITEM].detail
    kw = {"micro_batch": 1, "seq_len": 8192, "attn_impl": "flash", "gradient_checkpointing": True, "lora_rank": 8}
    with_dc = activation_bytes(_spec(), cut_ce=got, **kw).cut_loss  # type: ignore[arg-type]
    no_dc = activation_bytes(_spec(), cut_ce=CutCrossEntropy(), **kw).cut_loss  # type: ignore[arg-type]
    p = _spec().params
    assert with_dc is not None and no_dc is not None
    assert (with_dc.grad_weight, no_dc.grad_weight) == (D * p.vocab_size * p.hidden_size, 0)


LIGER_PLUGIN = "  - axolotl.integrations.liger.LigerPlugin\n"


@pytest.mark.parametrize(("plugins", "on"), [(PLUGIN + LIGER_PLUGIN, False), ("plugins:\n" + LIGER_PLUGIN +
                                             PLUGIN.split("\n", 1)[1], True)])  # fmt: skip
def test_axolotl_plugin_order_with_liger(tmp_path: Path, plugins: str, on: bool) -> None:
    """Both plugins patch the forward in `pre_model_load`, in list order: the last one's loss runs."""
    (tmp_path / "ds.json").write_text('{"zero_optimization": {"stage": 3}}')
    args = tmp_path / "axolotl.yaml"
    args.write_text(AXOLOTL + plugins + "cut_cross_entropy: true\nliger_fused_linear_cross_entropy: true\n")
    opts = PlanOptions(files=(str(args),), model=MODEL, gpus_per_node=4, gpu_memory_gib=80, host_ram_gib=512)
    inputs = load_inputs(opts)
    assert inputs.training.cut_cross_entropy is on
    assert inputs.run is not None
    assert any("LigerPlugin is listed after" in n for n in inputs.run.notes) is not on
