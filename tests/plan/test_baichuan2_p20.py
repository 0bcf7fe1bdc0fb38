"""Baichuan2's remote code, two facts the planner charges (issue 9).

* `BaichuanForCausalLM.forward` computes `CrossEntropyLoss()(shift_logits, shift_labels)` on the 16-bit logits (no
  `.float()`): the bundled baichuan2-7b / baichuan2-13b entries say `"loss_dtype": "model"`, as the Qwen (v1) ones do.
* `NormHead.forward` runs `F.normalize(self.weight)` on every training forward and `F.linear` saves that vocab x hidden
  16-bit copy for the hidden states' gradient until the head's backward: a named item at the loss
  (`activations.remote_norm_head`, `phases.NORM_HEAD_ITEM`). Sources: baichuan-inc/Baichuan2-13B-Chat
  modeling_baichuan.py (copy read in jrd77/Baichuan2-13B-Chat@35e3d5af), modelscope/ms-swift@a5f1a113a
  examples/pytorch/llm/src/utils/model.py:87-97 (the same head body for the 7B).
"""

from __future__ import annotations

import json
import sys
import weakref
from pathlib import Path

import pytest

from zerodoctor.models import model_from_config_file, resolve_model
from zerodoctor.plan.activations import activation_bytes, remote_norm_head
from zerodoctor.plan.inputs import PlanOptions, ZeroSettings, load_inputs
from zerodoctor.plan.phases import NORM_HEAD_ITEM, TRAINING_ONLY_ITEMS, plan_strategy

CATALOG = Path(__file__).resolve().parents[2] / "src" / "zerodoctor" / "models" / "catalog"
BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
V2 = 125_696  # Baichuan2's vocabulary


def _users_config(tmp_path: Path, slug: str, **changes: object) -> Path:
    """The bundled entry's config keys as a user's own config.json (no `_zerodoctor` block)."""
    cfg = json.loads((CATALOG / f"{slug}.json").read_text())
    cfg.pop("_zerodoctor")
    cfg.update(changes)
    path = tmp_path / slug / "config.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(cfg))
    return path


def test_the_norm_head_is_recognised_in_the_catalog_and_in_a_users_baichuan2_config(tmp_path: Path) -> None:
    for name in ("baichuan-inc/Baichuan2-7B-Chat", "baichuan2-13b", "baichuan-inc/Baichuan2-13B-Base"):
        assert remote_norm_head(resolve_model(name)), name
    # Baichuan-1 has a plain nn.Linear head (vocab 64,000, no z_loss_weight); other models are not touched
    for name in ("baichuan-7b", "baichuan-inc/Baichuan-13B-Chat", "llama-2-13b", "qwen-7b"):
        assert not remote_norm_head(resolve_model(name)), name
    assert remote_norm_head(model_from_config_file(_users_config(tmp_path, "baichuan2-7b")))
    # a Baichuan2 fine-tune with added tokens still carries Baichuan2's `z_loss_weight` key
    grown = _users_config(tmp_path, "baichuan2-13b", vocab_size=V2 + 8, z_loss_weight=0)
    assert remote_norm_head(model_from_config_file(grown))
    assert not remote_norm_head(model_from_config_file(_users_config(tmp_path, "baichuan-13b")))


def test_the_bundled_baichuan2_entries_compute_the_loss_in_the_model_dtype() -> None:
    for slug in ("baichuan2-7b", "baichuan2-13b"):
        spec = resolve_model(slug)
        assert spec.loss_in_model_dtype, slug
        assert "BaichuanForCausalLM.forward" in spec.notes and "no .float()" in spec.notes
    assert not resolve_model("baichuan-13b").loss_in_model_dtype  # Baichuan-1's loss code was not read


def test_the_copy_is_what_autograd_keeps_from_the_heads_forward_to_its_backward(tmp_path: Path) -> None:
    """NormHead.forward's training branch on the CPU, a frozen 16-bit head under LoRA (the hidden states require
    grad): `F.linear` saves the normalised weight -- its own storage, V x h x 2 bytes, the planner's item -- and it
    lives until the backward has run."""
    torch = pytest.importorskip("torch")
    v, h, tokens = 1000, 64, 32
    weight = torch.randn(v, h, dtype=torch.bfloat16)  # frozen (requires_grad False)
    hidden = torch.randn(1, tokens, h, dtype=torch.bfloat16, requires_grad=True)
    saved: list[tuple[int, int, weakref.ref[torch.Tensor]]] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        st = t.untyped_storage()
        saved.append((st.data_ptr(), st.nbytes(), weakref.ref(t)))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        logits = torch.nn.functional.linear(hidden, torch.nn.functional.normalize(weight))
        shift = logits[..., :-1, :].contiguous().view(-1, v)
        loss = torch.nn.CrossEntropyLoss()(shift, torch.randint(0, v, (tokens - 1,)))
    assert loss.dtype == torch.bfloat16  # no .float() on the path: the loss is 16-bit
    copies = [(ptr, ref) for ptr, nbytes, ref in saved if nbytes == v * h * 2]
    assert len(copies) == 1 and copies[0][0] != weight.untyped_storage().data_ptr()
    assert copies[0][1]() is not None  # alive at the loss
    del logits, shift
    loss.backward()
    del loss
    assert copies[0][1]() is None  # freed once the head's backward ran

    # the planner's activation estimate of a tiny Baichuan2-shaped model gains exactly that tensor at the loss
    tiny = {"model_type": "baichuan", "hidden_size": h, "intermediate_size": 4 * h, "num_hidden_layers": 2,
            "num_attention_heads": 4, "vocab_size": v, "tie_word_embeddings": False}  # fmt: skip
    plain, norm = (
        activation_bytes(
            model_from_config_file(_write(tmp_path / name, cfg)),
            micro_batch=1, seq_len=tokens, gradient_checkpointing=True, lora_rank=8, lora_targets=("W_pack",),
        )  # fmt: skip
        for name, cfg in (("plain", tiny), ("baichuan2", {**tiny, "z_loss_weight": 0}))
    )
    assert norm.saved_total - plain.saved_total == v * h * 2
    assert norm.peak - plain.peak == norm.norm_head_peak == v * h * 2 and plain.norm_head_peak == 0
    assert any("NormHead" in n for n in norm.notes)


def _write(tmp: Path, cfg: dict[str, object]) -> Path:
    tmp.mkdir()
    path = tmp / "config.json"
    path.write_text(json.dumps(cfg))
    return path


def _steady(model: str, zero: ZeroSettings, **opts: object) -> dict[str, object]:
    kw: dict[str, object] = {"nodes": 1, "gpus_per_node": 2, "gpu_memory_gib": 80, "host_ram_gib": 256,
                             "seq_len": 4096, "micro_batch": 1, "gradient_checkpointing": True, "attn": "sdpa",
                             "method": "lora", "framework": "hf"}  # fmt: skip
    kw.update(opts)
    plan = plan_strategy(load_inputs(PlanOptions(model=model, **kw)), zero)  # type: ignore[arg-type]
    return {i.name: i for i in plan.phase("steady").gpu}


@pytest.mark.parametrize(
    ("model", "hidden", "seq", "batch"), [("baichuan2-7b", 4096, 4096, 1), ("baichuan2-13b", 5120, 512, 4)]
)
def test_the_planner_charges_the_copy_at_the_loss_beside_the_gathered_head(
    model: str, hidden: int, seq: int, batch: int
) -> None:
    copy = V2 * hidden * 2
    z2 = _steady(model, ZeroSettings(stage=2), seq_len=seq, micro_batch=batch)
    item = z2[NORM_HEAD_ITEM]
    assert item.bytes == copy  # 0.96 GiB (7B), 1.20 GiB (13B): the loss is the activation peak of these runs
    assert f"{V2:,} x {hidden:,} copy in 2 B" in item.detail and "NormHead.forward" in item.source
    z3 = _steady(model, ZeroSettings(stage=3), seq_len=seq, micro_batch=batch)
    assert z3[NORM_HEAD_ITEM].bytes == copy and "ZeRO-3 fetched parameters (working set)" in z3
    # the evaluation forward (self.training False) makes no copy
    assert NORM_HEAD_ITEM in TRAINING_ONLY_ITEMS
    # Baichuan-1 of the same size: no such item
    other = "baichuan-7b" if hidden == 4096 else "baichuan-13b"
    assert NORM_HEAD_ITEM not in _steady(other, ZeroSettings(stage=2), seq_len=seq, micro_batch=batch)


def test_the_copy_adds_nothing_where_the_backward_is_the_activation_peak() -> None:
    """Baichuan2-13B at 4096 tokens: the recomputed ALiBi layer's dense score tensors in backward outweigh the loss
    moment, and the copy is freed by then (the head's backward runs first)."""
    spec = resolve_model("baichuan2-13b")
    est = activation_bytes(spec, micro_batch=1, seq_len=4096, gradient_checkpointing=True, lora_rank=8,
                           lora_targets=("W_pack",), loss_dtype_bytes=2)  # fmt: skip
    assert est.norm_head_peak == 0 and any("NormHead" in n for n in est.notes)
    assert NORM_HEAD_ITEM not in _steady("baichuan2-13b", ZeroSettings(stage=2))


def test_a_users_baichuan2_config_json_gets_the_item_through_the_cli(run_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    path = _users_config(tmp_path, "baichuan2-7b", z_loss_weight=0)
    code, out, err = run_cli(
        "plan", "--model", str(path), "--nodes", "1", "--gpus-per-node", "2", "--gpu-memory", "24", "--host-ram", "128",
        "--method", "lora", "--seq-len", "4096", "--stage", "2", "--gradient-checkpointing", "--format", "json",
        "--fail-on", "never",
    )  # fmt: skip
    assert code == 0, err
    steady = next(p for p in json.loads(out)["yours"]["phases"] if p["name"] == "steady")
    item = next(i for i in steady["gpu"] if i["name"] == NORM_HEAD_ITEM)
    assert item["bytes"] == V2 * 4096 * 2


def test_the_published_baichuan2_cases_it_moves() -> None:
    """msswift1 7B (21 GiB reserved on an A10): "does not fit" at 24.7 GiB becomes "tight" at 21.8; baichuan2#370
    (a real OOM on five 3090s) stays right only with both changes: "tight" at 22.4 GiB of 23.70."""
    sys.path.insert(0, str(BENCH))
    import plan_published as pp

    cases = {c["id"]: c for c in pp.load_all_cases()}
    swift = pp.evaluate(cases["msswift1-ex-baichuan2-7b-chat-lora-z2-offload-2xa10-4096-21g"])
    assert swift.plan.status == "tight" and swift.verdict_right
    assert 21.5 * 2**30 < swift.predicted_gpu < 22.2 * 2**30
    oom = pp.evaluate(cases["baichuan2-370-13b-lora-z3-5x3090-512-bs16-oom"])
    assert oom.plan.status == "tight" and oom.verdict_right
    assert NORM_HEAD_ITEM in {i.name for i in oom.plan.phase("steady").gpu}


def test_a_users_own_baichuan2_config_json_computes_its_loss_in_the_model_dtype(tmp_path):
    """The catalog's `loss_dtype: model` is not the only way in: a user's Baichuan2 config.json (no `_zerodoctor`
    block) gets the 16-bit loss too; a Baichuan-1 config does not."""
    import json

    from zerodoctor.models import resolve_model
    from zerodoctor.models.spec import CATALOG_DIR

    raw = json.loads((CATALOG_DIR / "baichuan2-7b.json").read_text())
    raw.pop("_zerodoctor", None)
    own = tmp_path / "b2" / "config.json"
    own.parent.mkdir()
    own.write_text(json.dumps(raw))
    assert resolve_model(str(own)).loss_in_model_dtype
    b1 = json.loads((CATALOG_DIR / "baichuan-7b.json").read_text())
    b1.pop("_zerodoctor", None)
    first = tmp_path / "b1" / "config.json"
    first.parent.mkdir()
    first.write_text(json.dumps(b1))
    assert not resolve_model(str(first)).loss_in_model_dtype
