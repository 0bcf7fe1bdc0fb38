"""Read the files of a training setup, follow the files they name, and build one TrainingSetup."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from zerodoctor.errors import SetupError, ZeroDoctorError
from zerodoctor.setup import axolotl
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


def _distinct(paths: Sequence[str | Path]) -> list[str | Path]:
    """The files in the order given, each once (`lint ds.json ds.json` is one config, not two); standard input
    (`-`) can be read only once, so naming it twice is an error."""
    if sum(1 for p in paths if str(p) == "-") > 1:
        raise SetupError("- (standard input) can be given only once", hint="name each config once")
    seen: set[str] = set()
    out: list[str | Path] = []
    for p in paths:
        try:
            key = str(Path(p).resolve()) if str(p) != "-" else "-"
        except (OSError, RuntimeError, ValueError):  # a symbolic link loop, a NUL byte: read_document says why
            key = str(p)
        if key not in seen:
            seen.add(key)
            out.append(p)
    return out


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
    return setup_from_documents(
        [read_document(p, kind) for p in _distinct(paths)],
        env=env,
        framework=framework,
        world_size=world_size,
        num_nodes=num_nodes,
        gpus_per_node=gpus_per_node,
        model=model,
        dataset_samples=dataset_samples,
    )


def setup_from_documents(
    docs: list[ConfigDocument],
    *,
    env: Environment | None = None,
    framework: str | None = None,
    world_size: int | None = None,
    num_nodes: int | None = None,
    gpus_per_node: int | None = None,
    model: str | None = None,
    dataset_samples: int | None = None,
) -> TrainingSetup:
    """Follow the DeepSpeed files the documents name, and build the TrainingSetup. A DeepSpeed JSON given
    beside a framework file that names a different one is refused: which one the run uses is ambiguous."""
    docs = list(docs)
    model_docs = [d for d in docs if d.kind == "model"]
    docs = [d for d in docs if d.kind != "model"]
    seen = {d.path.resolve() for d in docs}
    given_ds = [d for d in docs if d.kind == "deepspeed"]
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
        others = [d for d in given_ds if d.path.resolve() != found.resolve()]
        if others:
            pos = doc.position(key)
            where = f"{doc.display}:{pos.line}" if pos else doc.display
            raise SetupError(
                f"two DeepSpeed configs: {others[0].display} was given, but {where} ({key}) names {target}",
                hint=f"pass only the one the run uses (the run reads {found})",
            )
        if found.resolve() in seen:
            continue
        docs.append(read_document(found, "deepspeed"))
        seen.add(found.resolve())
    ds_docs = [d.display for d in docs if d.kind == "deepspeed"]
    if len(ds_docs) > 1:
        names = ", ".join(ds_docs[:3]) + (f" and {len(ds_docs) - 3} more" if len(ds_docs) > 3 else "")
        raise SetupError(f"{len(ds_docs)} DeepSpeed configs: {names}", hint="pass only the one the run uses")
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
    if setup.args_doc is not None and setup.args_doc.kind == "hf" and axolotl.is_axolotl(setup.args_doc.data):
        setup.quant = axolotl.quantization(setup.args_doc.data, setup.quant)
    if model:
        setup.model_ref = model
    elif model_docs and not setup.model_ref:
        setup.model_ref = str(model_docs[0].path)
    spec, note = resolve_model_quietly(setup.model_ref)
    if spec is not None:
        setup.attach_model(spec)
    setup.model_note = note
    return setup
