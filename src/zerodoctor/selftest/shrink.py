"""Shrink a model config to a tiny one of the same architecture family, and scale the DeepSpeed config to it.

Pure data: no torch, no transformers (the worker builds the model). The tiny model keeps the module types
that change what ZeRO does (grouped-query attention, MoE experts and router, multi-head latent attention,
tied embeddings, a vision tower) and loses size: 2 decoder layers, hidden size 64, vocabulary 512.

DeepSpeed's size knobs are element counts. Copied unchanged onto a model 10^5 times smaller they would
change behaviour (one bucket instead of dozens, every parameter "persistent" and never partitioned), so
they are scaled by the ratio of the tiny model to the real one, and every change is listed with its reason.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

TINY_HIDDEN = 64
TINY_HEADS = 4
TINY_HEAD_DIM = TINY_HIDDEN // TINY_HEADS
TINY_INTERMEDIATE = 128
TINY_LAYERS = 2
TINY_VOCAB = 512
TINY_POSITIONS = 256
TINY_EXPERTS = 4
TINY_MOE_INTERMEDIATE = 32
TINY_VISION_HIDDEN = 32
TINY_IMAGE = 28
TINY_PATCH = 14

# transformers model types the worker builds as a plain causal LM (AutoModelForCausalLM.from_config).
CAUSAL_LM_TYPES = frozenset(
    {
        "llama",
        "mistral",
        "mixtral",
        "qwen2",
        "qwen2_moe",
        "qwen3",
        "qwen3_moe",
        "gemma",
        "gemma2",
        "deepseek_v2",
        "deepseek_v3",
        "phi3",
        "yi",
    }
)
# Multimodal types whose language model and vision tower transformers builds without remote code.
IMAGE_TEXT_TYPES = frozenset({"llava", "llava_next"})

# DeepSpeed's code defaults (0.19.8 runtime/zero/config.py) for the element-count knobs that are scaled.
DS_DEFAULTS = {
    "reduce_bucket_size": 500_000_000,
    "allgather_bucket_size": 500_000_000,
    "stage3_prefetch_bucket_size": 50_000_000,
    "stage3_max_live_parameters": 1_000_000_000,
    "stage3_max_reuse_distance": 1_000_000_000,
    "sub_group_size": 1_000_000_000,
    "stage3_param_persistence_threshold": 100_000,
}
# Accepted spellings of each knob (DeepSpeed's pydantic aliases).
ALIASES = {
    "stage3_prefetch_bucket_size": ("stage3_prefetch_bucket_size", "prefetch_bucket_size"),
    "stage3_max_live_parameters": ("stage3_max_live_parameters", "max_live_parameters"),
    "stage3_max_reuse_distance": ("stage3_max_reuse_distance", "max_reuse_distance"),
    "stage3_param_persistence_threshold": (
        "stage3_param_persistence_threshold",
        "param_persistence_threshold",
    ),
    "reduce_bucket_size": ("reduce_bucket_size",),
    "allgather_bucket_size": ("allgather_bucket_size",),
    "sub_group_size": ("sub_group_size",),
}
STAGE3_ONLY = frozenset(
    {
        "stage3_prefetch_bucket_size",
        "stage3_max_live_parameters",
        "stage3_max_reuse_distance",
        "stage3_param_persistence_threshold",
        "sub_group_size",
    }
)
MONITOR_KEYS = ("tensorboard", "wandb", "csv_monitor", "comet", "comms_logger", "flops_profiler")


@dataclass(frozen=True)
class Adaptation:
    """One difference between the user's setup and what the selftest runs, and why."""

    key: str
    user_value: Any
    run_value: Any
    why: str

    def describe(self) -> str:
        return f"{self.key}: {self.user_value!r} -> {self.run_value!r} ({self.why})"

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "user_value": self.user_value, "run_value": self.run_value, "why": self.why}


@dataclass(frozen=True)
class TinyModel:
    """The shrunken model: the HF config dict the worker builds, how to build it, and what it keeps."""

    config: dict[str, Any]
    builder: str  # "causal-lm" or "image-text-to-text"
    family: str  # what the user's model is, in words
    keeps: tuple[str, ...]  # module types kept (GQA, MoE experts, tied embeddings, vision tower, ...)
    notes: tuple[str, ...]  # what could not be kept, and why


def _shrink_text(cfg: Mapping[str, Any], keeps: list[str]) -> dict[str, Any]:
    c = {k: v for k, v in cfg.items() if not k.startswith("_")}
    for k in (
        "auto_map",
        "quantization_config",
        "torch_dtype",
        "dtype",
        "transformers_version",
        "architectures",
        "name_or_path",
    ):
        c.pop(k, None)
    heads = int(cfg.get("num_attention_heads") or TINY_HEADS)
    kv = int(cfg.get("num_key_value_heads") or heads)
    tiny_kv = TINY_HEADS if kv == heads else (1 if kv == 1 else 2)
    keeps.append(
        "multi-head attention"
        if kv == heads
        else f"grouped-query attention ({TINY_HEADS} query / {tiny_kv} kv heads)"
    )
    c.update(
        hidden_size=TINY_HIDDEN,
        num_attention_heads=TINY_HEADS,
        num_key_value_heads=tiny_kv,
        intermediate_size=TINY_INTERMEDIATE,
        num_hidden_layers=TINY_LAYERS,
        vocab_size=TINY_VOCAB,
        max_position_embeddings=TINY_POSITIONS,
        use_cache=False,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    if "head_dim" in c:
        c["head_dim"] = TINY_HEAD_DIM
    if "query_pre_attn_scalar" in c:  # Gemma-2 scales queries by this (= head_dim in the real configs)
        c["query_pre_attn_scalar"] = TINY_HEAD_DIM
    if isinstance(c.get("sliding_window"), int):
        c["sliding_window"] = min(int(c["sliding_window"]), 16)
    experts_key = next(
        (k for k in ("num_local_experts", "n_routed_experts", "num_experts") if c.get(k)), None
    )
    if experts_key:
        c[experts_key] = min(int(c[experts_key]), TINY_EXPERTS)
        c["num_experts_per_tok"] = min(int(c.get("num_experts_per_tok") or 2), 2)
        if "moe_intermediate_size" in c:
            c["moe_intermediate_size"] = TINY_MOE_INTERMEDIATE
        if c.get("n_shared_experts"):
            c["n_shared_experts"] = 1
        if "first_k_dense_replace" in c:  # DeepSeek: keep one dense layer and one MoE layer
            c["first_k_dense_replace"] = min(int(c["first_k_dense_replace"]), 1)
        for k in ("n_group", "topk_group"):
            if k in c:
                c[k] = 1
        if "moe_layer_freq" in c:
            c["moe_layer_freq"] = 1
        keeps.append(f"MoE ({c[experts_key]} experts, {c['num_experts_per_tok']} per token)")
    if c.get("kv_lora_rank"):  # DeepSeek-V2 multi-head latent attention
        c["kv_lora_rank"] = 16
        if c.get("q_lora_rank"):
            c["q_lora_rank"] = 16
        c["qk_rope_head_dim"] = 8
        c["qk_nope_head_dim"] = 8
        c["v_head_dim"] = TINY_HEAD_DIM
        keeps.append("multi-head latent attention")
    return c


def _shrink_vision(cfg: Mapping[str, Any]) -> dict[str, Any]:
    v = {k: val for k, val in cfg.items() if not k.startswith("_")}
    v.update(
        hidden_size=TINY_VISION_HIDDEN,
        intermediate_size=2 * TINY_VISION_HIDDEN,
        num_hidden_layers=2,
        num_attention_heads=2,
        image_size=TINY_IMAGE,
        patch_size=TINY_PATCH,
        projection_dim=TINY_VISION_HIDDEN,
    )
    return v


def shrink_model(config: Mapping[str, Any], display_name: str) -> TinyModel:
    """A tiny config of the same family as `config` (a Hugging Face config.json, parsed)."""
    model_type = str(config.get("model_type") or "")
    keeps: list[str] = []
    notes: list[str] = []
    if model_type in IMAGE_TEXT_TYPES:
        text = _shrink_text(dict(config.get("text_config") or {}), keeps)
        tied = bool(config.get("tie_word_embeddings", text.get("tie_word_embeddings", False)))
        out = {
            k: v
            for k, v in config.items()
            if not k.startswith("_") and k not in ("auto_map", "architectures")
        }
        out.update(text_config=text, vision_config=_shrink_vision(config.get("vision_config") or {}))
        out["image_token_index"] = TINY_VOCAB - 1
        out.pop("image_token_id", None)
        if "image_grid_pinpoints" in out:
            out["image_grid_pinpoints"] = [[TINY_IMAGE, TINY_IMAGE], [TINY_IMAGE, 2 * TINY_IMAGE]]
        out["tie_word_embeddings"] = tied
        keeps.append("vision tower and projector (built, partitioned and saved)")
        notes.append(
            "batches are text-only synthetic tokens: the vision tower's forward is not exercised, so a "
            "rank-divergent image path (some ranks with images, some without) is not tested"
        )
        if tied:
            keeps.append("tied input/output embeddings")
        return TinyModel(
            out, "image-text-to-text", f"{display_name} ({model_type})", tuple(keeps), tuple(notes)
        )
    builder_type = model_type
    source = dict(config)
    if model_type not in CAUSAL_LM_TYPES:
        text_cfg = config.get("text_config") or config.get("llm_config")
        lm_type = str((text_cfg or {}).get("model_type") or "")
        if isinstance(text_cfg, Mapping) and lm_type in CAUSAL_LM_TYPES:
            source, builder_type = dict(text_cfg), lm_type
        else:
            # MiniCPM-V: its language model is Llama-3; the resampler and SigLIP tower need remote code.
            source, builder_type = dict(config), "llama"
        notes.append(
            f"model type '{model_type}' needs remote code (never run by zerodoctor): the selftest builds its "
            f"language model as '{builder_type}'; its own modules (vision tower, resampler) are not built"
        )
    text = _shrink_text(source, keeps)
    text["model_type"] = builder_type
    if bool(text.get("tie_word_embeddings", False)):
        keeps.append("tied input/output embeddings")
    return TinyModel(
        text, "causal-lm", f"{display_name} ({model_type or builder_type})", tuple(keeps), tuple(notes)
    )


# ---------------------------------------------------------------------------------------------------------
# DeepSpeed config scaling
# ---------------------------------------------------------------------------------------------------------


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    return None


def scale_ds_config(
    effective: Mapping[str, Any],
    *,
    param_ratio: float,
    hidden_ratio: float,
    tiny_largest_tensor: int,
    scaled_from: str,
) -> tuple[dict[str, Any], list[Adaptation]]:
    """The user's DeepSpeed config (after "auto" filling) with its size knobs scaled to the tiny model.

    Bucket, live-parameter, reuse-distance and sub-group sizes scale with the parameter count
    (`param_ratio` = tiny / real), never below the tiny model's largest tensor, so the number of buckets
    and sub-groups per step stays close to the real run's. The persistence threshold scales with the
    hidden size (`hidden_ratio`), so norms stay persistent and projections stay partitioned as in the real
    model. A knob the user left out gets DeepSpeed's default, scaled. A value that is not a number (an
    "auto" nobody filled) is left alone: DeepSpeed will judge it.
    """
    cfg = copy.deepcopy(dict(effective))
    changes: list[Adaptation] = []
    zero = cfg.get("zero_optimization")
    if not isinstance(zero, dict):
        return cfg, changes
    stage = _number(zero.get("stage")) or 0
    for knob, default in DS_DEFAULTS.items():
        if knob in STAGE3_ONLY and stage != 3:
            continue
        spelled = next((a for a in ALIASES[knob] if a in zero), None)
        raw = zero.get(spelled) if spelled else default
        value = _number(raw)
        if value is None:
            continue
        if knob == "stage3_param_persistence_threshold":
            new = int(round(value * hidden_ratio))
            why = f"scaled by the hidden-size ratio {hidden_ratio:.4g}, so norms stay whole and projections partitioned"
        elif value == 0:
            continue
        else:
            # a multiple of 64: DeepSpeed asserts bucket sizes are multiples of its alignment factor (2 on gloo)
            new = _round_up(max(int(value * param_ratio), tiny_largest_tensor), 64)
            why = (
                f"scaled by the parameter ratio {param_ratio:.3g} ({scaled_from}), not below the tiny "
                f"model's largest tensor ({tiny_largest_tensor} elements)"
            )
        key = spelled or knob
        zero[key] = new
        shown = raw if spelled else f"{int(default)} (DeepSpeed default)"
        changes.append(Adaptation(f"zero_optimization.{key}", shown, new, why))
    for part in ("offload_optimizer", "offload_param"):
        block = zero.get(part)
        if isinstance(block, dict) and str(block.get("device", "")).lower() == "nvme":
            changes.append(
                Adaptation(
                    f"zero_optimization.{part}.nvme_path",
                    block.get("nvme_path"),
                    "<selftest dir>/nvme",
                    "the selftest swaps to a scratch directory, not your NVMe volume",
                )
            )
            block["nvme_path"] = "<NVME>"
    return cfg, changes


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def param_ratio(tiny_total: int, real_total: int | None) -> float:
    if not real_total:
        return 1.0
    return tiny_total / real_total


def hidden_ratio(real_hidden: int | None) -> float:
    return TINY_HIDDEN / real_hidden if real_hidden else 1.0
