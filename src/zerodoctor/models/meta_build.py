"""Exact parameter counts for any architecture transformers knows, read from its meta-device build.

The analytic builders in `spec.py` cover the families users fine-tune most and need no torch. A config
whose `model_type` has no builder of its own (gpt-oss, Llama 4, Gemma 3 with its vision tower, Qwen2.5-VL,
GLM-4.5 MoE, OLMo 2, T5 ...) is counted here instead, when torch and transformers are installed: the
config is handed to transformers' own config class (`AutoConfig.for_model`, never remote code: only
model types registered in transformers itself) and the model is built under `torch.device("meta")`, which
creates every module and parameter shape without allocating storage (a 120B model builds in a few
seconds). The modules are then folded into the same `ModuleShape` / `_Shape` description the analytic
builders produce, so the planner treats both alike.

What is read from the built model: every module's own parameters (`recurse=False`), its class (Linear,
Embedding, a norm, fused 3-D expert weights, a router), tied parameters (the same tensor under two names,
as `tie_weights()` leaves them). What is read from the built config (`get_text_config()`, with
transformers' defaults filled in): hidden size, heads, KV heads, head_dim, intermediate and vocabulary
sizes, experts per token.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections import Counter, defaultdict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from zerodoctor.errors import PlanError
from zerodoctor.models.spec import (
    CONV,
    COUNT_LIMITS,
    EMBEDDING,
    EXPERTS,
    LINEAR,
    NORM,
    PARAMS,
    PROJECTOR,
    ROUTER,
    TEXT,
    VISION,
    ModuleShape,
    _Shape,
    count_limit_error,
)

_LAYER = re.compile(r"^(?P<stack>.*?\b(?:layers|layer|h|blocks|block))\.(?P<i>\d+)\.")
"""A module inside a repeated layer stack: `model.layers.3.`, `transformer.h.3.`, `encoder.block.3.`."""
_INDEX = re.compile(r"\.\d+(?=\.|$)")
_VISION_WORDS = ("vision", "visual", "vpm", "image_encoder", "vit.", "patch_embed")
_PROJECTOR_WORDS = ("projector", "merger", "multi_modal", "mm_proj", "connector", "resampler", "adapter")
_TOP_K_KEYS = ("num_experts_per_tok", "num_experts_per_token", "moe_topk", "experts_per_token", "top_k")
_EXPERT_INTER_KEYS = ("moe_intermediate_size", "expert_intermediate_size", "intermediate_size")


_CACHE_NAME = "meta-build-v1"


def transformers_version() -> str | None:
    """The installed transformers' version (from its metadata: no import), or None when torch or
    transformers is not installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        version("torch")
        return version("transformers")
    except PackageNotFoundError:
        return None


def knows(model_type: str) -> bool:
    """True when the installed transformers registers `model_type` itself (no remote code needed)."""
    if transformers_version() is None:
        return False
    try:
        from transformers import CONFIG_MAPPING
    except Exception:  # a broken install: the analytic path still works
        return False
    return model_type in CONFIG_MAPPING


def count_shapes(
    config: Mapping[str, Any], source: Path
) -> tuple[list[ModuleShape], _Shape, tuple[int, int], str] | None:
    """`build_shapes` through the on-disk cache (keyed by the config and the zerodoctor, torch and
    transformers versions: importing torch and transformers costs seconds, the cached answer milliseconds);
    None when the installed transformers does not know the model type."""
    from zerodoctor import __version__
    from zerodoctor.kb import cache

    version = transformers_version()
    if version is None:
        return None
    key = cache.key_of(
        [json.dumps(config, sort_keys=True, default=str).encode(), version.encode(), __version__.encode()]
    )
    hit = cache.read(_CACHE_NAME, key)
    if hit is not None:
        try:
            return _loads(hit)
        except (ValueError, KeyError, TypeError):  # a damaged or older entry: rebuild
            pass
    if not knows(str(config.get("model_type"))):
        return None
    built = build_shapes(config, source)
    cache.write(_CACHE_NAME, key, _dumps(built))
    return built


def _dumps(built: tuple[list[ModuleShape], _Shape, tuple[int, int], str]) -> bytes:
    modules, shape, layer_sizes, name = built
    return json.dumps(
        {
            "modules": [dataclasses.astuple(m) for m in modules],
            "shape": dataclasses.asdict(shape),
            "layer_sizes": list(layer_sizes),
            "built": name,
        }
    ).encode()


def _loads(payload: bytes) -> tuple[list[ModuleShape], _Shape, tuple[int, int], str]:
    data = json.loads(payload)
    dense, moe = data["layer_sizes"]
    return (
        [ModuleShape(*m) for m in data["modules"]],
        _Shape(**data["shape"]),
        (int(dense), int(moe)),
        str(data["built"]),
    )


def build_shapes(
    config: Mapping[str, Any], source: Path
) -> tuple[list[ModuleShape], _Shape, tuple[int, int], str]:
    """Modules, shape facts and (dense, MoE) parameters per layer of `config` from transformers'
    meta-device build; the last value names the class built. Call only when `knows(config["model_type"])`. Raises PlanError naming `source` when
    transformers refuses the config."""
    import torch
    import transformers
    from transformers import AutoConfig

    data = {k: v for k, v in config.items() if k not in ("model_type", "_zerodoctor", "auto_map")}
    model_type = str(config["model_type"])
    _check_counts(config, source)
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()  # type: ignore[no-untyped-call]  # token-id and "weights not initialised" chatter
    try:
        hf_config = AutoConfig.for_model(model_type, **data)
        text = hf_config.get_text_config()
    except Exception as exc:  # transformers validates sizes and types in its own words
        raise PlanError(
            f"{source}: transformers {transformers.__version__} refuses this {model_type} config: {_one_line(exc)}",
            hint="pass the model's config.json as published with its weights",
        ) from None
    finally:
        transformers.logging.set_verbosity(verbosity)
    transformers.logging.set_verbosity_error()  # type: ignore[no-untyped-call]
    try:
        with torch.device("meta"):
            model = _build(hf_config)
        if hasattr(model, "tie_weights"):
            model.tie_weights()
    except PlanError:
        raise
    except Exception as exc:
        raise PlanError(
            f"{source}: transformers {transformers.__version__} cannot build this {model_type} config: "
            f"{_one_line(exc)}",
            hint="pass the model's config.json as published with its weights, or a catalog name",
        ) from None
    finally:
        transformers.logging.set_verbosity(verbosity)
    modules = _module_shapes(model)
    shape, layer_sizes = _shape_of(model, hf_config, text, modules)
    return modules, shape, layer_sizes, type(model).__name__


SIZE_KEYS = (
    ("hidden_size", "d_model", "n_embd"),
    ("num_hidden_layers", "num_layers", "n_layer"),
    ("num_attention_heads", "num_heads", "n_head"),
    ("vocab_size",),
)
"""The sizes every published config states (aliases per row). One the config leaves out takes the default of
transformers' config class -- what `from_pretrained` would build from that file too -- and is named."""


def defaulted_sizes(config: Mapping[str, Any]) -> list[str]:
    """The standard sizes neither the config nor its `text_config` states (see `SIZE_KEYS`)."""
    text = config.get("text_config")
    scopes = [config, text] if isinstance(text, Mapping) else [config]
    return [row[0] for row in SIZE_KEYS if not any(k in scope for scope in scopes for k in row)]




def _check_counts(config: Mapping[str, Any], source: Path) -> None:
    for scope_key in (None, "text_config", "vision_config"):
        scope = config if scope_key is None else config.get(scope_key)
        if not isinstance(scope, Mapping):
            continue
        for names, _limit in COUNT_LIMITS:
            for name in names:
                value = scope.get(name)
                if isinstance(value, int) and not isinstance(value, bool):
                    too_many = count_limit_error(source, f"{scope_key}.{name}" if scope_key else name, value)
                    if too_many is not None:
                        raise too_many


def _build(hf_config: Any) -> Any:
    """The model a fine-tuning framework loads for this config: image-text-to-text when it has a vision
    tower, else causal LM, else sequence-to-sequence (T5), else the bare model."""
    from transformers import (
        AutoModel,
        AutoModelForCausalLM,
        AutoModelForImageTextToText,
        AutoModelForSeq2SeqLM,
    )

    order = [AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoModel]
    if getattr(hf_config, "vision_config", None) is not None:
        order.insert(0, AutoModelForImageTextToText)
    last: Exception | None = None
    for auto in order:
        try:
            return auto.from_config(hf_config)  # type: ignore[no-untyped-call]
        except ValueError as exc:  # "Unrecognized configuration class ... for this kind of AutoModel"
            last = exc
    raise PlanError(f"no transformers model class builds '{hf_config.model_type}': {_one_line(last)}")


def _kind(module: Any, own: list[tuple[str, Any]]) -> str:
    import torch

    if isinstance(module, torch.nn.Linear):
        return LINEAR
    if isinstance(module, torch.nn.Embedding):
        return EMBEDDING
    if isinstance(module, torch.nn.modules.conv._ConvNd):
        return CONV
    name = type(module).__name__.lower()
    if "norm" in name:
        return NORM
    if any(p.dim() == 3 for _, p in own):
        return EXPERTS
    if "router" in name or "gate" in name or any(n in ("router", "gate") for n, _ in own):
        return ROUTER
    return PARAMS


def _component(path: str) -> str:
    low = path.lower()
    if any(w in low for w in _PROJECTOR_WORDS):
        return PROJECTOR
    if any(w in low for w in _VISION_WORDS):
        return VISION
    return TEXT


def _module_shapes(model: Any) -> list[ModuleShape]:
    """Every module with parameters of its own, folded by the template of its name (`{i}` for indices)."""
    first_owner: dict[int, str] = {}
    grouped: Counter[ModuleShape] = Counter()
    for path, module in model.named_modules():
        own = list(module.named_parameters(recurse=False))
        if not own:
            continue
        kind = _kind(module, own)
        numel = sum(p.numel() for _, p in own)
        owners = {first_owner.get(id(p)) for _, p in own}
        tied_to = owners.pop() if len(owners) == 1 and None not in owners else None
        for _, p in own:
            first_owner.setdefault(id(p), _INDEX.sub(".{i}", path))
        n_in = n_out = 0
        bias = False
        if kind == LINEAR:
            n_in, n_out, bias = module.in_features, module.out_features, module.bias is not None
        grouped[
            ModuleShape(
                _INDEX.sub(".{i}", path), kind, numel, 1, _component(path), n_in, n_out, bias, tied_to
            )
        ] += 1
    return [
        ModuleShape(m.path, m.kind, m.numel, n, m.component, m.in_features, m.out_features, m.bias, m.tied_to)
        for m, n in grouped.items()
    ]


def _shape_of(
    model: Any, hf_config: Any, text: Any, modules: list[ModuleShape]
) -> tuple[_Shape, tuple[int, int]]:
    """Layer counts and (dense, MoE) parameters per layer from the built model (a layer holding experts is
    a MoE layer; layers of one kind that differ in size give the floor of their mean), sizes from the
    built config."""
    layer_experts: dict[tuple[str, str], int] = defaultdict(int)
    layer_params: dict[tuple[str, str], int] = defaultdict(int)
    seen: set[int] = set()
    for path, module in model.named_modules():
        m = _LAYER.match(path + ".")
        if m is None or _component(path) != TEXT:
            continue
        key = (m["stack"], m["i"])
        own = [(n, p) for n, p in module.named_parameters(recurse=False) if id(p) not in seen]
        seen.update(id(p) for _, p in own)
        numel = sum(p.numel() for _, p in own)
        layer_params[key] += numel
        layer_experts[key] += 0
        if own and (_kind(module, own) == EXPERTS or ".experts." in path + "."):
            layer_experts[key] += numel
    moe_layers = sum(1 for v in layer_experts.values() if v)
    moe_sizes = [layer_params[k] for k, v in layer_experts.items() if v]
    dense_sizes = [layer_params[k] for k, v in layer_experts.items() if not v]
    layer_sizes = (sum(dense_sizes) // max(len(dense_sizes), 1), sum(moe_sizes) // max(len(moe_sizes), 1))
    num_layers = len(layer_experts) or _int_attr(text, "num_hidden_layers", "num_layers", "n_layer")
    experts = _num_experts(model, text)
    per_expert = 0
    if moe_layers and experts:
        per_expert = sum(layer_experts.values()) // moe_layers // experts
    hidden = _int_attr(text, "hidden_size", "d_model", "n_embd")
    heads = _int_attr(text, "num_attention_heads", "num_heads", "n_head")
    head_dim = getattr(text, "head_dim", None) or hidden // max(heads, 1)
    stacks = Counter(stack for stack, _ in layer_experts)
    prefix = (stacks.most_common(1)[0][0].rsplit("layers", 1)[0]) if stacks else "model."
    vision = getattr(hf_config, "vision_config", None)
    shape = _Shape(
        num_layers=num_layers,
        num_dense_layers=num_layers - moe_layers,
        num_moe_layers=moe_layers,
        hidden_size=hidden,
        intermediate_size=_int_attr(text, "intermediate_size", "d_ff", "ffn_dim", default=0),
        vocab_size=_int_attr(text, "vocab_size"),
        num_heads=heads,
        kv_heads=getattr(text, "num_key_value_heads", None) or heads,
        head_dim=int(head_dim),
        tied=any(m.tied_to for m in modules),
        num_experts=experts if moe_layers else 0,
        experts_per_token=_int_attr(text, *_TOP_K_KEYS, default=0) if moe_layers else 0,
        moe_intermediate_size=_int_attr(text, *_EXPERT_INTER_KEYS, default=0) if moe_layers else 0,
        per_expert=per_expert,
        vision_num_layers=_int_attr(vision, "num_hidden_layers", "depth", "num_layers", default=0)
        if vision
        else 0,
        vision_hidden_size=_int_attr(vision, "hidden_size", "embed_dim", "width", default=0) if vision else 0,
        prefix=prefix,
    )
    return shape, layer_sizes


def _num_experts(model: Any, text: Any) -> int:
    """Routed experts per MoE layer: the first dimension of fused 3-D expert weights, else the config."""
    for path, p in model.named_parameters():
        if ".experts." in path and p.dim() == 3:
            return int(p.shape[0])
    return _int_attr(
        text, "num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts", default=0
    )


def _int_attr(obj: Any, *names: str, default: int | None = None) -> int:
    for name in names:
        value = getattr(obj, name, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    if default is not None:
        return default
    raise PlanError(f"the built {type(obj).__name__} has none of {', '.join(names)}")


def _one_line(exc: BaseException | None) -> str:
    text = " ".join(str(exc).split()) if exc is not None else "unknown error"
    return text[:300]
