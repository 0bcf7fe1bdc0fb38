"""Read the files of a training setup, follow the files they name, and build one TrainingSetup."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from zerodoctor.errors import InputError, ZeroDoctorError
from zerodoctor.setup.document import ConfigDocument
from zerodoctor.setup.model import TrainingSetup, build_setup, resolve_reference
from zerodoctor.setup.reader import read_document

if TYPE_CHECKING:
    from zerodoctor.env.model import Environment


def _referenced_ds_config(doc: ConfigDocument) -> tuple[str, str] | None:
    """(key, path) of the DeepSpeed JSON a file names, if it names one."""
    if doc.kind in ("hf", "llamafactory"):
        ref = doc.get("deepspeed")
        if isinstance(ref, str) and ref.strip():
            return "deepspeed", ref
    if doc.kind == "accelerate":
        ref = doc.get("deepspeed_config.deepspeed_config_file")
        if isinstance(ref, str) and ref.strip() and ref.strip().lower() != "none":
            return "deepspeed_config.deepspeed_config_file", ref
    return None


def resolve_model_quietly(model_ref: str | None) -> tuple[object | None, str | None]:
    """(ModelSpec, None) if the catalog or a config.json knows the model, else (None, why not).
    Imported lazily: the catalog is the planner's, and lint must not pay for it when no model is named."""
    if not model_ref:
        return None, None
    from zerodoctor.models import resolve_model

    try:
        return resolve_model(model_ref), None
    except ZeroDoctorError as exc:
        return None, str(exc)


def load_setup(
    paths: Sequence[str | Path],
    *,
    kind: str | None = None,
    env: Environment | None = None,
    framework: str | None = None,
    world_size: int | None = None,
    num_nodes: int | None = None,
    gpus_per_node: int | None = None,
    model: str | None = None,
    dataset_samples: int | None = None,
) -> TrainingSetup:
    docs: list[ConfigDocument] = [read_document(p, kind) for p in paths]
    seen = {d.path.resolve() for d in docs}
    missing: list[tuple[ConfigDocument, str, str]] = []
    for doc in list(docs):
        ref = _referenced_ds_config(doc)
        if ref is None:
            continue
        key, target = ref
        found = resolve_reference(doc.path, target)
        if found is None:
            missing.append((doc, key, target))
            continue
        if found.resolve() in seen:
            continue
        try:
            docs.append(read_document(found, "deepspeed"))
        except InputError:
            raise
        seen.add(found.resolve())
    setup = build_setup(
        docs,
        env=env,
        framework=framework,
        world_size=world_size,
        num_nodes=num_nodes,
        gpus_per_node=gpus_per_node,
    )
    setup.missing_references = missing
    setup.dataset_samples = dataset_samples
    if model:
        setup.model_ref = model
    spec, note = resolve_model_quietly(setup.model_ref)
    if spec is not None:
        setup.attach_model(spec)
    setup.model_note = note
    return setup
