"""The evaluation phase: HF Trainer / LLaMA-Factory evaluate during training (`eval_strategy` steps|epoch) or after it
(`do_eval`) at `per_device_eval_batch_size` (transformers' default 8, not the train micro-batch), under
`torch.no_grad()` (transformers trainer.py `prediction_step`): the model states stay resident, nothing is saved for
backward, and with labels in the batch the model computes its loss -- 16-bit logits, their fp32 upcast and the
log-probabilities. Checked against the arithmetic, the run's arguments through `main()`, and the storages a real
transformers Llama creates in a no_grad forward with labels on the CPU.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from zerodoctor.models import resolve_model
from zerodoctor.models.spec import model_from_config
from zerodoctor.plan.activations import eval_forward_bytes
from zerodoctor.plan.inputs import Cluster, PlanInputs, Training, ZeroSettings
from zerodoctor.plan.phases import GIB, TRAINING_ONLY_ITEMS, plan_strategy

ITEM = "evaluation forward (no_grad) at the eval batch"


def _inputs(training: Training, *, gpu_gib: float = 80, gpus: int = 2) -> PlanInputs:
    return PlanInputs(
        model=resolve_model("llama-3-8b"),
        cluster=Cluster(1, gpus, int(gpu_gib * GIB), 512 * GIB),
        training=training,
        framework="hf",
    )


def test_no_evaluation_no_phase() -> None:
    plan = plan_strategy(_inputs(Training(method="lora")), ZeroSettings(stage=3))
    assert [p.name for p in plan.phases] == ["load", "first_step", "steady", "save"]


def test_the_eval_phase_keeps_the_states_and_drops_the_backward() -> None:
    t = Training(method="full", seq_len=2048, eval_micro_batch=8)
    plan = plan_strategy(_inputs(t), ZeroSettings(stage=3))
    assert [p.name for p in plan.phases] == ["load", "first_step", "steady", "eval", "save"]
    ev, steady = plan.phase("eval"), plan.phase("steady")
    names = {i.name for i in ev.gpu}
    assert ITEM in names and not names & TRAINING_ONLY_ITEMS
    # every model state and the ZeRO-3 working set of the steady step stay resident (optimizer states included)
    kept = [i for i in steady.gpu if i.name not in TRAINING_ONLY_ITEMS]
    assert all(i in ev.gpu for i in kept)
    assert any(i.name == "model states: optimizer_states" for i in ev.gpu)
    assert any(i.name == "ZeRO-3 fetched parameters (working set)" for i in ev.gpu)
    assert ev.title == "evaluation"


def test_the_loss_at_the_eval_batch_is_three_logits_tensors() -> None:
    spec = resolve_model("llama-3-8b")
    v = spec.params.vocab_size
    ev = eval_forward_bytes(spec, micro_batch=8, seq_len=2048)
    tv = 8 * 2048 * v
    # bf16 logits + their fp32 upcast + fp32 log-probabilities (ForCausalLMLoss, transformers >= 4.49)
    assert ev.loss == 2 * tv + 4 * tv + 4 * tv
    assert ev.peak == max(ev.layer, ev.loss) and ev.kept_logits == 0
    kept = eval_forward_bytes(spec, micro_batch=8, seq_len=2048, keep_logits=True)
    assert kept.peak - ev.peak == 2 * tv


def test_an_oom_at_the_first_evaluation_is_not_fits() -> None:
    # LoRA of an 8B model on one 40 GB card: the training step fits, the eval forward at HF's default batch 8 not.
    t = Training(method="lora", seq_len=4096, micro_batch=1)
    inputs = _inputs(t, gpu_gib=39.39, gpus=1)
    zero = ZeroSettings(stage=0)
    assert plan_strategy(inputs, zero).status == "fits"
    plan = plan_strategy(dataclasses.replace(inputs, training=dataclasses.replace(t, eval_micro_batch=8)), zero)
    assert plan.gpu_peak()[1] == "eval"
    assert plan.status == "does not fit"
    assert [f[0] for f in plan.failing_phases()] == ["eval"]
    item = next(i for i in plan.phase("eval").gpu if i.name == ITEM)
    assert "eval batch 8" in item.detail and "prediction_step" in item.source


def test_fsdp_plans_the_evaluation_too() -> None:
    from zerodoctor.plan.inputs import FsdpSettings, fsdp_as_zero

    t = Training(method="full", seq_len=1024, eval_micro_batch=4)
    plan = plan_strategy(_inputs(t), fsdp_as_zero(FsdpSettings()))
    ev = plan.phase("eval")
    assert any(i.name == ITEM for i in ev.gpu)
    assert not any(i.name.startswith("activations") for i in ev.gpu)


def _args(tmp_path: Path, text: str) -> Path:
    (tmp_path / "ds.json").write_text('{"zero_optimization": {"stage": 3}}')
    args = tmp_path / "args.yaml"
    args.write_text(
        "model_name_or_path: meta-llama/Meta-Llama-3-8B\noutput_dir: out\ndeepspeed: ds.json\n"
        "per_device_train_batch_size: 1\n" + text
    )
    return args


CLUSTER = ("--nodes", "1", "--gpus-per-node", "2", "--gpu-memory", "80", "--host-ram", "512", "--format", "json")


@pytest.mark.parametrize(
    ("text", "batch"),
    [
        ("", None),
        ("eval_strategy: \"no\"\n", None),
        ("eval_strategy: steps\neval_steps: 500\n", 8),  # transformers' default per_device_eval_batch_size
        ("evaluation_strategy: epoch\nper_device_eval_batch_size: 2\n", 2),  # the 4.x name
        ("do_eval: true\nper_device_eval_batch_size: 4\n", 4),
    ],
)
def test_the_run_arguments_decide_the_evaluation(run_cli, tmp_path, text, batch) -> None:
    code, out, err = run_cli("plan", str(_args(tmp_path, text)), *CLUSTER)
    assert code in (0, 1), err
    phases = {p["name"]: p for p in json.loads(out)["yours"]["phases"]}
    if batch is None:
        assert "eval" not in phases
    else:
        item = next(i for i in phases["eval"]["gpu"] if i["name"] == ITEM)
        assert f"eval batch {batch} x" in item["detail"]


def test_llamafactory_needs_an_eval_set(run_cli, tmp_path) -> None:
    base = "stage: sft\nfinetuning_type: lora\ncutoff_len: 1024\neval_strategy: steps\n"
    for extra, evaluates in (("", False), ("val_size: 0.01\n", True), ("eval_dataset: alpaca_en_demo\n", True)):
        args = tmp_path / "lf.yaml"
        args.write_text("model_name_or_path: meta-llama/Meta-Llama-3-8B\ndeepspeed: ds.json\n" + base + extra)
        (tmp_path / "ds.json").write_text('{"zero_optimization": {"stage": 3}}')
        code, out, err = run_cli("plan", str(args), "--framework", "llamafactory", *CLUSTER)
        assert code in (0, 1), err
        names = [p["name"] for p in json.loads(out)["yours"]["phases"]]
        assert ("eval" in names) is evaluates, extra


TINY = {
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 32000,
    "max_position_embeddings": 256,
    "tie_word_embeddings": False,
}


@pytest.mark.engine
def test_a_no_grad_forward_with_labels_peaks_at_the_planned_loss() -> None:
    """A real transformers Llama (bf16, CPU) evaluated as prediction_step does: torch.no_grad() and labels in the
    batch. The storages created during the forward peak at the planned loss (16-bit logits + fp32 upcast + fp32
    log-probabilities) plus every layer's KV cache (the model is in eval mode with use_cache on) and the last hidden
    states; what stays is the 16-bit logits and the cache the output holds."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from torch.profiler import ProfilerActivity, profile
    from torch.profiler._memory_profiler import Action, MemoryProfile

    cfg = transformers.LlamaConfig(**{k: v for k, v in TINY.items() if k != "model_type"}, attn_implementation="sdpa")
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
    b, s = 4, 64
    ids = torch.randint(0, TINY["vocab_size"], (b, s))
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof, torch.no_grad():
        out = model(input_ids=ids, labels=ids)
    live = peak = 0
    for _, action, _, size in MemoryProfile(prof.profiler.kineto_results).timeline:
        live += size if action == Action.CREATE else -size if action == Action.DESTROY else 0
        peak = max(peak, live)
    spec = model_from_config(TINY, name="tiny-llama", source=Path("tiny/config.json"))
    ev = eval_forward_bytes(spec, micro_batch=b, seq_len=s, use_cache=True)
    hidden = 2 * b * s * TINY["hidden_size"]
    assert ev.loss >= ev.layer
    # the cache: 2 layers x (K, V) x 4 x 64 tokens x 2 kv heads x head_dim 16 x 2 B, left in the output
    assert ev.kv_cache == 2 * 2 * b * s * 2 * 16 * 2 == live - out.logits.numel() * 2 - 4  # + the fp32 loss scalar
    assert ev.loss + ev.kv_cache <= peak <= ev.peak + 4 * hidden  # the residual stream and loss scalars beside it


def test_a_run_that_breaks_only_at_the_evaluation_is_told_to_lower_the_eval_batch(run_cli, tmp_path) -> None:
    args = tmp_path / "args.yaml"
    (tmp_path / "ds.json").write_text('{"zero_optimization": {"stage": 3}}')
    args.write_text(
        "model_name_or_path: meta-llama/Meta-Llama-3-8B\noutput_dir: out\ndeepspeed: ds.json\nuse_peft: true\n"
        "per_device_train_batch_size: 1\nmax_length: 4096\neval_strategy: steps\nper_device_eval_batch_size: 16\n"
    )
    code, out, err = run_cli("plan", str(args), "--nodes", "1", "--gpus-per-node", "2", "--gpu-memory", "80",
                             "--host-ram", "512", "--format", "json")
    assert code == 1, err
    doc = json.loads(out)
    plan001 = next(f for f in doc["findings"] if f["id"] == "PLAN001")
    assert plan001["data"]["phase"] == "eval"
    assert "per_device_eval_batch_size (now 16" in plan001["message"]
