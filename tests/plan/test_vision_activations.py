"""MiniCPM-Llama3-V 2.5's vision side in the plan: the saved tensors of its vision tower (transformers'
Idefics2VisionTransformer, eager attention) and of its resampler (the remote code's `Resampler.forward`, rebuilt
here op for op around torch's nn.MultiheadAttention), measured with saved_tensors_hooks on CPU against
`activations.vision_saved_bytes`; the plan's item for the catalog model; trainable sub-models named by path."""

from __future__ import annotations

import pytest

from zerodoctor.models import resolve_model
from zerodoctor.plan.activations import vision_activation_bytes, vision_saved_bytes
from zerodoctor.plan.inputs import GIB, Cluster, PlanInputs, Training, ZeroSettings
from zerodoctor.plan.phases import plan_strategy, trainable_frozen

torch = pytest.importorskip("torch")
ITEM = "vision tower + resampler activations (images)"
H, INTER, HEADS, PATCH, SIDE, E, QUERIES = 64, 172, 4, 14, 6, 128, 8


def _saved(fn) -> int:  # type: ignore[no-untyped-def]
    """Bytes of the distinct storages autograd saves while `fn` runs, parameters left out."""
    seen: dict[int, int] = {}

    def pack(t):  # type: ignore[no-untyped-def]
        st = t.untyped_storage()
        seen.setdefault(st.data_ptr(), st.nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        module = fn()
    params = {p.untyped_storage().data_ptr() for p in module.parameters()}
    return sum(n for ptr, n in seen.items() if ptr not in params)


def _tower(layers: int, checkpointing: bool, slices: int) -> int:
    from transformers.models.idefics2.configuration_idefics2 import Idefics2VisionConfig
    from transformers.models.idefics2.modeling_idefics2 import Idefics2VisionTransformer

    cfg = Idefics2VisionConfig(
        hidden_size=H, intermediate_size=INTER, num_hidden_layers=layers, num_attention_heads=HEADS,
        patch_size=PATCH, image_size=PATCH * SIDE,
    )  # fmt: skip
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    model = Idefics2VisionTransformer(cfg).to(torch.bfloat16).train()
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    pixels = torch.randn(slices, 3, SIDE * PATCH, SIDE * PATCH, dtype=torch.bfloat16)
    mask = torch.ones(slices, SIDE, SIDE, dtype=torch.bool)

    def run():  # type: ignore[no-untyped-def]
        model(pixel_values=pixels, patch_attention_mask=mask)
        return model

    return _saved(run)


class _Resampler(torch.nn.Module):  # type: ignore[misc]
    """MiniCPM-Llama3-V 2.5 resampler.py `Resampler.forward`, its ops in order (2-D sin-cos positions as an
    untrained tensor, key padding mask of the slices' patches)."""

    def __init__(self) -> None:
        super().__init__()
        self.query = torch.nn.Parameter(torch.randn(QUERIES, E))
        self.kv_proj = torch.nn.Linear(H, E, bias=False)
        self.attn = torch.nn.MultiheadAttention(E, E // 128 or 1)
        self.ln_q, self.ln_kv, self.ln_post = (torch.nn.LayerNorm(E) for _ in range(3))
        self.proj = torch.nn.Parameter(torch.randn(E, E))

    def forward(self, x):  # type: ignore[no-untyped-def]
        bs, length, _ = x.shape
        pos = torch.randn(length, bs, E, dtype=x.dtype)
        pad = torch.zeros(bs, length, dtype=torch.bool)
        x = self.kv_proj(x)
        x = self.ln_kv(x).permute(1, 0, 2)
        q = self.ln_q(self.query)
        out = self.attn(q.unsqueeze(1).repeat(1, bs, 1), x + pos, x, key_padding_mask=pad)[0]
        x = self.ln_post(out.permute(1, 0, 2))
        return x @ self.proj


def _resampler(slices: int) -> int:
    torch.manual_seed(0)
    model = _Resampler().to(torch.bfloat16).train()
    x = torch.randn(slices, SIDE * SIDE, H, dtype=torch.bfloat16, requires_grad=True)

    def run():  # type: ignore[no-untyped-def]
        model(x)
        return model

    return _saved(run)


def _formula(layers: int, checkpointing: bool, slices: int) -> tuple[int, int]:
    return vision_saved_bytes(
        patches=slices * SIDE * SIDE, patches_per_slice=SIDE * SIDE, patch=PATCH, hidden=H, intermediate=INTER,
        heads=HEADS, layers=layers, embed=E, queries=QUERIES, resampler_heads=E // 128 or 1, dtype_bytes=2,
        gradient_checkpointing=checkpointing, tower_trainable=True, resampler_trainable=True,
    )  # fmt: skip


@pytest.mark.parametrize("checkpointing", [True, False])
@pytest.mark.parametrize("layers", [1, 3])
def test_the_tower_keeps_what_the_formula_says(layers: int, checkpointing: bool):
    assert _tower(layers, checkpointing, slices=3) == _formula(layers, checkpointing, 3)[0]


def test_the_resampler_keeps_what_the_formula_says():
    for slices in (1, 3):
        assert _resampler(slices) == _formula(1, True, slices)[1]


def test_the_catalog_model_charges_ten_slices_of_1024_patches_under_the_steady_peak():
    spec = resolve_model("minicpm-llama3-v-2.5")
    vis = vision_activation_bytes(
        spec, micro_batch=1, images_per_sample=1, tower_trainable=True, resampler_trainable=True,
        gradient_checkpointing=True, dtype_bytes=2,
    )  # fmt: skip
    assert vis is not None and (vis.slices, vis.patches_per_slice) == (10, 1024)
    assert 0.5 * GIB < vis.tower < 0.8 * GIB and 0.3 * GIB < vis.resampler < 0.6 * GIB
    cluster = Cluster(1, 2, 80 * GIB, 512 * GIB)
    full = PlanInputs(model=spec, cluster=cluster, training=Training(method="full", seq_len=2048), framework="hf")
    steady = {i.name: i.bytes for i in plan_strategy(full, ZeroSettings(stage=3)).phase("steady").gpu}
    assert steady[ITEM] == vis.total
    lora = PlanInputs(model=spec, cluster=cluster, training=Training(method="lora", seq_len=2048), framework="hf")
    assert ITEM not in {i.name for i in plan_strategy(lora, ZeroSettings(stage=3)).phase("steady").gpu}
    text = PlanInputs(model=resolve_model("llama-3-8b"), cluster=cluster, training=Training(method="full"))
    assert ITEM not in {i.name for i in plan_strategy(text, ZeroSettings(stage=3)).phase("steady").gpu}


def test_trainable_modules_name_whole_sub_models_by_path():
    spec = resolve_model("minicpm-llama3-v-2.5")
    cluster = Cluster(1, 2, 80 * GIB, 512 * GIB)
    base = PlanInputs(model=spec, cluster=cluster, training=Training(method="lora"), framework="hf")
    tuned = PlanInputs(
        model=spec, cluster=cluster, training=Training(method="lora", trainable_modules=("vpm", "resampler")),
        framework="hf",
    )  # fmt: skip
    extra = trainable_frozen(tuned, tuned.training)[0] - trainable_frozen(base, base.training)[0]
    assert extra == spec.params.vision_tower + sum(m.total for m in spec.modules if m.path.startswith("resampler"))
    assert ITEM in {i.name for i in plan_strategy(tuned, ZeroSettings(stage=3)).phase("steady").gpu}
