"""The loss of older transformers: a shifted contiguous fp32 copy of the logits (before 4.49).

transformers 4.46-4.48 `loss/loss_utils.py::ForCausalLMLoss` and, up to 4.45, each model's own forward
(`modeling_llama.py`) do `logits[..., :-1, :].contiguous()` on the upcast logits before `cross_entropy`;
huggingface/transformers#35646 (4.49) pads the labels instead. Checked three ways: the version rule, the
arithmetic of the planner's items, and the storages a real CPU run creates and frees against the allocator
replay's sequence for the same shape.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest

from zerodoctor.models import resolve_model
from zerodoctor.plan.activations import activation_bytes, loss_shift_for
from zerodoctor.plan.allocator import Alloc, Free, Mark, step_shape, training_events
from zerodoctor.plan.inputs import PlanOptions, ZeroSettings, load_inputs
from zerodoctor.plan.phases import plan_strategy

ITEM = "loss: shifted fp32 copy of the logits (transformers < 4.49)"


@pytest.mark.parametrize(
    ("version", "shift"),
    [
        (None, "none"),
        ("not-a-version", "none"),
        ("5.23.0", "none"),
        ("4.49.0", "none"),
        ("4.48.3", "loss_function"),
        ("4.46.1", "loss_function"),
        ("4.46.0.dev0", "loss_function"),
        ("4.45.2", "model_forward"),
        ("4.35.0", "model_forward"),
    ],
)
def test_the_release_decides_the_shift(version: str | None, shift: str) -> None:
    assert loss_shift_for(version) == shift


def test_the_copy_is_b_s_minus_1_rows_of_fp32_logits_at_the_loss() -> None:
    spec = resolve_model("llama-3-8b")
    v = spec.params.vocab_size
    kw = {"micro_batch": 2, "seq_len": 2048, "gradient_checkpointing": True}
    now = activation_bytes(spec, **kw)  # type: ignore[arg-type]
    mid = activation_bytes(spec, loss_shift="loss_function", **kw)  # type: ignore[arg-type]
    early = activation_bytes(spec, loss_shift="model_forward", **kw)  # type: ignore[arg-type]
    tv, rows_v = 4096 * v, 4094 * v  # two sequences lose one row each to the shift
    # now: 16-bit logits + fp32 upcast + log-probabilities (10 TV) at the loss, 12 TV in the loss's backward
    assert (now.logits_and_loss, now.shifted_copy_peak) == (12 * tv, 0)
    # 4.46-4.48: + the fp32 copy, and log_softmax over the shifted rows; the rise is its own item
    assert mid.logits_and_loss == 2 * tv + 4 * tv + 4 * rows_v + 4 * rows_v
    assert mid.peak - now.peak == mid.shifted_copy_peak > 0
    # <= 4.45: the 16-bit logits are gone by then, so the copy stays under the backward's 12 TV of before
    assert early.logits_and_loss == 4 * tv + 8 * rows_v and early.shifted_copy_peak == 0
    # a model computing its own loss in the model dtype is not affected
    own = activation_bytes(spec, loss_dtype_bytes=2, **kw)  # type: ignore[arg-type]
    own_old = activation_bytes(spec, loss_dtype_bytes=2, loss_shift="loss_function", **kw)  # type: ignore[arg-type]
    assert (own_old.peak, own_old.shifted_copy_peak) == (own.peak, 0)


def test_one_sequence_makes_no_copy() -> None:
    # `logits[..., :-1, :]` of a (1, s, V) tensor is contiguous already: `.contiguous()` returns it (measured
    # below: no storage of that size is created before log_softmax's)
    spec = resolve_model("llama-3-8b")
    v = spec.params.vocab_size
    kw = {"micro_batch": 1, "seq_len": 4096, "gradient_checkpointing": True}
    old = activation_bytes(spec, loss_shift="loss_function", **kw)  # type: ignore[arg-type]
    assert old.shifted_copy_peak == 0
    assert old.logits_and_loss == 12 * 4095 * v  # the backward, over the shifted rows
    fp32 = activation_bytes(spec, loss_shift="loss_function", dtype_bytes=4, micro_batch=2, seq_len=1024)
    assert fp32.logits_and_loss == 4 * 2048 * v + 8 * 2046 * v  # an fp32 model copies too (no upcast)


def _inputs(transformers_version: str | None) -> tuple[object, ZeroSettings]:
    inputs = load_inputs(
        PlanOptions(
            model="llama-3-8b", nodes=1, gpus_per_node=8, gpu_memory_gib=80, host_ram_gib=512,
            seq_len=4096, micro_batch=2, gradient_checkpointing=True, attn="sdpa", method="lora", framework="hf",
        )  # fmt: skip
    )
    return dataclasses.replace(inputs, transformers_version=transformers_version), ZeroSettings(stage=3)


def test_the_planner_names_the_item_with_its_version_and_source() -> None:
    new_inputs, zero = _inputs(None)
    old_inputs, _ = _inputs("4.46.1")
    new = plan_strategy(new_inputs, zero).phase("steady")  # type: ignore[arg-type]
    old = plan_strategy(old_inputs, zero).phase("steady")  # type: ignore[arg-type]
    assert ITEM not in [i.name for i in new.gpu]
    item = next(i for i in old.gpu if i.name == ITEM)
    assert "4.46.1" in item.detail and "transformers#35646" in item.source
    v = resolve_model("llama-3-8b").params.vocab_size
    tv, rows_v = 8192 * v, 8190 * v
    assert item.bytes == (6 * tv + 8 * rows_v) - 12 * tv  # LoRA 2 x 4k: the loss is the activation peak
    act = {i.name: i.bytes for i in old.gpu}["activations + logits/loss"]
    assert act == {i.name: i.bytes for i in new.gpu}["activations + logits/loss"]


def _simulated_loss(
    transformers_version: str | None, batch: int = 1
) -> tuple[list[tuple[str, str]], int, int]:
    """The replay's loss storages (+/- and size label) of a `batch` x 64-token stage-0 step, with T and V."""
    inputs = load_inputs(
        PlanOptions(
            model="qwen2.5-1.5b", nodes=1, gpus_per_node=1, gpu_memory_gib=80, host_ram_gib=128,
            seq_len=64, micro_batch=batch, gradient_checkpointing=True, attn="sdpa", framework="hf",
        )  # fmt: skip
    )
    inputs = dataclasses.replace(inputs, transformers_version=transformers_version)
    shape = step_shape(inputs, ZeroSettings(stage=0), inputs.training)
    t, v = shape.tokens, shape.vocab
    label = {2 * t * v: "bf16", 4 * t * v: "fp32", 4 * (t - batch) * v: "fp32-shifted"}
    seq: list[tuple[str, str]] = []
    sizes: dict[object, int] = {}
    for ev in training_events(shape, steps=1):
        if isinstance(ev, Alloc):
            sizes[ev.id] = ev.nbytes
            if ev.nbytes in label:
                seq.append(("+", label[ev.nbytes]))
        elif isinstance(ev, Free) and sizes.get(ev.id) in label:
            seq.append(("-", label[sizes[ev.id]]))
        elif isinstance(ev, Mark) and ev.name == "first_forward_backward":
            break
    return seq, t, v


def _recorded_loss(loss_fn: Callable[..., object], t: int, v: int, batch: int = 1) -> list[tuple[str, str]]:
    """Run `loss_fn(hidden, head_weight, labels)` forward and backward on the CPU under torch.profiler and
    return the storages of the logits' sizes created and destroyed, in order."""
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile
    from torch.profiler._memory_profiler import Action, MemoryProfile

    torch.manual_seed(0)
    hidden = torch.randn(batch, t // batch, 8, dtype=torch.bfloat16)
    head = torch.randn(v, 8, dtype=torch.bfloat16, requires_grad=True)  # lm_head: small, its grad is V x 8
    labels = torch.randint(0, v, (batch, t // batch))
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        loss = loss_fn(hidden, head, labels)
        loss.backward()  # type: ignore[attr-defined]
    label = {2 * t * v: "bf16", 4 * t * v: "fp32", 4 * (t - batch) * v: "fp32-shifted"}
    out = []
    for _, action, _, size in MemoryProfile(prof.profiler.kineto_results).timeline:
        if size in label and action in (Action.CREATE, Action.DESTROY):
            out.append(("+" if action == Action.CREATE else "-", label[size]))
    return out


def _loss_now(hidden: object, head: object, labels: object) -> object:
    """transformers as installed (5.x: labels padded, no shifted copy)."""
    import torch
    from transformers.loss.loss_utils import ForCausalLMLoss

    assert isinstance(hidden, torch.Tensor) and isinstance(head, torch.Tensor)
    logits = torch.nn.functional.linear(hidden, head)
    return ForCausalLMLoss(logits, labels, vocab_size=head.shape[0])


def _for_causal_lm_loss_4_46(logits: object, labels: object, vocab_size: int) -> object:
    """transformers 4.46.1 `loss/loss_utils.py::ForCausalLMLoss` (no `num_items_in_batch`), statement for
    statement (two transformers releases cannot be installed side by side)."""
    import torch

    assert isinstance(logits, torch.Tensor) and isinstance(labels, torch.Tensor)
    logits = logits.float()
    shift_logits = logits[..., :-1, :].contiguous()
    shift_labels = labels[..., 1:].contiguous()
    shift_logits = shift_logits.view(-1, vocab_size)
    shift_labels = shift_labels.view(-1)
    return torch.nn.functional.cross_entropy(shift_logits, shift_labels, ignore_index=-100, reduction="mean")


def _loss_4_46(hidden: object, head: object, labels: object) -> object:
    """4.46-4.48: the model's forward holds the 16-bit logits while `ForCausalLMLoss` runs."""
    import torch

    assert isinstance(hidden, torch.Tensor) and isinstance(head, torch.Tensor)
    logits = torch.nn.functional.linear(hidden, head)
    return _for_causal_lm_loss_4_46(logits, labels, head.shape[0])


def _loss_4_45(hidden: object, head: object, labels: object) -> object:
    """transformers 4.45.2 `LlamaForCausalLM.forward`: `self.lm_head(...).float()`, then the same shift."""
    import torch

    assert isinstance(hidden, torch.Tensor) and isinstance(head, torch.Tensor) and isinstance(labels, torch.Tensor)
    logits = torch.nn.functional.linear(hidden, head).float()
    logits = logits.float()
    shift_logits = logits[..., :-1, :].contiguous()
    shift_labels = labels[..., 1:].contiguous()
    loss_fct = torch.nn.CrossEntropyLoss()
    return loss_fct(shift_logits.view(-1, head.shape[0]), shift_labels.view(-1))


@pytest.mark.parametrize(
    ("version", "loss_fn", "batch"),
    [
        (None, _loss_now, 1),
        (None, _loss_now, 2),
        ("4.46.1", _loss_4_46, 1),  # one sequence: the shifted slice is contiguous, no copy
        ("4.46.1", _loss_4_46, 2),  # two: the copy
        ("4.45.2", _loss_4_45, 1),
        ("4.45.2", _loss_4_45, 2),
    ],
)
def test_the_replayed_loss_is_what_a_cpu_run_creates_and_frees(
    version: str | None, loss_fn: Callable[..., object], batch: int
) -> None:
    simulated, t, v = _simulated_loss(version, batch)
    recorded = _recorded_loss(loss_fn, t, v, batch)
    # The recording stops at the lm_head (its bf16 gradient freed by the matmul backward, as replayed); the
    # replay goes on into the decoder layers, whose tensors have other sizes.
    assert recorded == simulated
    if version == "4.46.1":
        assert (("+", "fp32-shifted") in recorded) and recorded.count(("+", "fp32-shifted")) == 3 + (batch > 1)
