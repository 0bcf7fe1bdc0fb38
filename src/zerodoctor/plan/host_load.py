"""What `from_pretrained` holds on the host while a run loads a safetensors checkpoint, by transformers version.

Measured on CPU with the real loaders (benchmarks/RESULTS.md, "Session 9: host RAM of loading, measured (P17)") and
read in their source; every constant here names its file at the version it was read in. Pure arithmetic: no torch,
transformers or DeepSpeed import.

Two load paths matter to the planner:
- **without zero.Init** (ZeRO-1/2, or ZeRO-3 when no HfDeepSpeedConfig is alive at load): transformers 5 builds the
  model on meta and fills it from `safe_open` slices (core_model_loading.py `_materialize_copy`: `tensor[...]`, then
  `.to(dtype)` only when the dtype differs). A tensor loaded in the checkpoint's dtype and not converted stays a view
  of the file mapping: page cache, shared by every rank of the node that maps the same files. What a conversion
  (conversion_mapping.py: MoE experts merged with `MergeModulelist`/`Concatenate`, or transposed with
  `Transpose(...).contiguous()`) or a dtype change produces is a private copy in each rank.
- **under zero.Init** (HfDeepSpeedConfig alive) the planner keeps `phases.LOAD_SHARD_BYTES` per rank. Source says
  more (transformers 5.0-5.22 `_load_pretrained_model` merges the whole checkpoint into one state dict on every rank,
  5.23 on rank 0 only; transformers 4 reads one shard at a time on every rank, its safetensors branch returning before
  the rank > 0 "meta" shortcut of huggingface/transformers#24964), but the 2-rank CPU measurement did not show the
  whole-model difference between the ranks that implies, so nothing is charged for it yet (RESULTS, P17).
"""

from __future__ import annotations

from dataclasses import dataclass

from zerodoctor.models.spec import EXPERTS, ModelSpec
from zerodoctor.versions import parse_version

GIB = 2**30

TRANSFORMERS_MMAP_LOAD_FROM = (5, 0)
"""transformers 5.0.0 core_model_loading.py `_materialize_copy` (`tensor = tensor[...]` on a `safe_open` slice, then
`.to(device=..., dtype=...)`): a parameter loaded in its checkpoint dtype is a view of the safetensors mmap. Read in
5.0.0, 5.8.0 and 5.23.0; measured with 5.8.0 and 5.23.0 (every parameter's storage inside a *.safetensors mapping).
transformers 4.46.3 was measured to leave same-dtype weights mapped too (`check_support_param_buffer_assignment` ->
`load_state_dict(assign=True)`), but the 4.x release that began it is not pinned here, so 4.x keeps the per-rank
private copy the planner charged before."""

EXPERTS_CONVERTED_ON_LOAD = frozenset(
    {
        # MergeModulelist + Concatenate: per-expert checkpoint tensors stacked into one fused parameter.
        "mixtral", "minimax", "phimoe", "qwen2_moe", "qwen3_moe", "qwen3_next", "qwen3_omni_moe", "deepseek_v2",
        "deepseek_v3", "dots1", "ernie4_5_moe", "glm4_moe", "glm4v_moe", "hunyuan_v1_moe", "olmoe", "flex_olmo",
        "longcat_flash", "jamba",
        # Transpose(1, 2).contiguous(): the hub stores (E, hidden, 2I), transformers 5 builds (E, 2I, hidden).
        "qwen3_vl_moe",
    }
)  # fmt: skip
"""Model types whose experts transformers 5 converts on load, so they are private per rank even when loaded in the
checkpoint's dtype: transformers 5.0.0 and 5.23.0 conversion_mapping.py (`_MODEL_TO_CONVERSION_PATTERN` onto the
"mixtral" / "qwen2_moe" converters, and the "qwen3_vl_moe" `Transpose`), the types of that file the planner builds.
gpt_oss is not among them: its checkpoint already holds fused experts."""


def _release(version: str | None) -> tuple[int, ...] | None:
    v = parse_version(version)
    return tuple(v.release) if v is not None else None


def loads_as_mapped_views(transformers_version: str | None) -> bool:
    """Whether this transformers leaves parameters loaded in the checkpoint dtype as views of the file mapping.
    False for an unknown version: the planner then keeps its per-rank private copy."""
    release = _release(transformers_version)
    return release is not None and release >= TRANSFORMERS_MMAP_LOAD_FROM


def converted_expert_numel(spec: ModelSpec) -> int:
    """Elements of the experts transformers 5 converts on load (0 for dense models and types it loads as stored)."""
    if spec.model_type not in EXPERTS_CONVERTED_ON_LOAD:
        return 0
    return sum(m.total for m in spec.modules if m.kind == EXPERTS)


@dataclass(frozen=True)
class LoadAmount:
    """One host amount of the load phase, per node (the planner turns it into a `phases.Item`)."""

    name: str
    bytes: int
    detail: str
    source: str


CHECKPOINT_BYTES = 2
"""Bytes per weight of the checkpoint on disk: 16-bit, as `phases.loaded_weight_bytes` assumes."""


def mapped_checkpoint(spec: ModelSpec, transformers_version: str | None) -> LoadAmount:
    """The checkpoint's pages every rank maps while it loads: one copy per node in the page cache, though each rank's
    RSS counts them (and a cgroup's or Ray's memory monitor with them)."""
    size = spec.params.total * CHECKPOINT_BYTES
    return LoadAmount(
        "checkpoint mapped by from_pretrained (page cache, one copy per node)",
        size,
        f"{size / GIB:.1f} GiB of safetensors pages mapped by every rank (transformers {transformers_version}); "
        "file pages, shared by the ranks that map the same files, reclaimable by the kernel but counted in each "
        "rank's RSS",
        "transformers core_model_loading.py _materialize_copy (tensor[...] on a safe_open slice: a view of the "
        "mmap; .to(dtype) copies only on a dtype change), 5.0.0-5.23.0",
    )


def mapped_load(spec: ModelSpec, transformers_version: str | None, n_local: int) -> list[LoadAmount]:
    """Host at load without zero.Init under transformers 5, weights loaded in the checkpoint's dtype: the mapped
    checkpoint once per node, and per rank the private copies its conversions make (MoE experts)."""
    out = [mapped_checkpoint(spec, transformers_version)]
    experts = converted_expert_numel(spec)
    if experts:
        size = experts * CHECKPOINT_BYTES
        out.append(
            LoadAmount(
                "MoE experts converted on load, per rank",
                size * n_local,
                f"{n_local} ranks x {size / GIB:.1f} GiB: {spec.model_type} experts ({experts:,} elements) are "
                "merged or transposed into new tensors, private to each rank, while the checkpoint stays mapped",
                "transformers conversion_mapping.py (MergeModulelist/Concatenate, qwen3_vl_moe Transpose(1, 2) "
                "-> .contiguous()), core_model_loading.py convert_and_load_state_dict_in_model, 5.0.0-5.23.0",
            )
        )
    return out


ACCELERATE_FSDP2_HOST_UPCAST_FROM = (1, 14)
"""accelerate utils/fsdp_utils.py `fsdp2_prepare_model`: under mixed precision every trainable parameter that is not
fp32 is upcast in place (`param.data = param.data.to(torch.float32)`) BEFORE `fully_shard`, i.e. where the loaded
model lives -- on the host -- and `original_sd = model.state_dict()` is captured after it ("Capture after upcast"),
keeping those fp32 host tensors alive until `fsdp2_prepare_model` returns, after `fully_shard` has moved the
parameters to the device. From huggingface/accelerate#3985 (92cc533e, "Cast model to uniform dtype before
fully_shard"), first released in 1.14.0; read in 1.14.0 and 1.15.0. Before: 1.6.0-1.12.x upcast after `fully_shard`
(`model.to(torch.float32)` on the device shards, #3394), and 1.13.x rebound a local name (`param = param.to(...)`,
#3905) and upcast nothing."""


def fsdp2_upcasts_on_host(accelerate_version: str | None) -> bool:
    """Whether accelerate upcasts FSDP2's trainable parameters to fp32 on the host before sharding them. True from
    1.14 and for an unknown version (the larger case); False for 1.6-1.13 (upcast on the device shards, or not)."""
    release = _release(accelerate_version)
    return release is None or release >= ACCELERATE_FSDP2_HOST_UPCAST_FROM


def fsdp2_host_upcast(
    trainable: int, frozen: int, load_bytes: int, loaders: int, accelerate_version: str | None
) -> LoadAmount:
    """The loaded model on each loading rank's host once accelerate has upcast its trainable parameters to fp32
    (`fsdp2_upcasts_on_host`): 4 B per trainable element, the load dtype for the frozen ones."""
    per_rank = trainable * 4 + frozen * load_bytes
    return LoadAmount(
        "trainable parameters upcast to fp32 on the host before fully_shard",
        per_rank * loaders,
        f"{loaders} x {per_rank / GIB:.1f} GiB: {trainable:,} trainable elements x 4 B (accelerate "
        f"{accelerate_version or 'version unknown'}: the mixed-precision upcast runs on the loaded model, before "
        f"FSDP2 shards it) + {frozen:,} frozen x {load_bytes} B; the 16-bit copies are freed as each parameter is "
        "replaced, the fp32 ones stay referenced by the captured state dict until prepare returns",
        "accelerate utils/fsdp_utils.py fsdp2_prepare_model (param.data = param.data.to(torch.float32) before "
        "fully_shard; original_sd = model.state_dict() after it), 1.14.0-1.15.0 (huggingface/accelerate#3985)",
    )
