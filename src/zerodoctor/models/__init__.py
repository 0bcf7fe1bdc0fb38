"""Models as data: parameter counts and module shapes from a config.json, the bundled offline catalog, and
resolution of what a user names (catalog slug, hub id, local directory or config.json path).

This package sits below `setup/` and `plan/`: both read models through it, neither owns it. Nothing here
imports torch or transformers."""

from __future__ import annotations

from zerodoctor.models.spec import (
    CATALOG_META_KEY,
    LORA_ALL_LINEAR,
    CatalogEntry,
    ModelSpec,
    ParamCounts,
    Quantization,
    catalog,
    close_matches,
    model_from_config,
    model_from_config_file,
    resolve_model,
)

__all__ = [
    "CATALOG_META_KEY",
    "LORA_ALL_LINEAR",
    "CatalogEntry",
    "ModelSpec",
    "ParamCounts",
    "Quantization",
    "catalog",
    "close_matches",
    "model_from_config",
    "model_from_config_file",
    "resolve_model",
]
