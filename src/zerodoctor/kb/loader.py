"""Load and validate the bundled knowledge-base entries (one YAML file per entry).

The entries stay YAML (people edit them). Parsing them is the larger part of a cold start, so a validated copy
is cached as JSON (`kb.cache`, keyed by the SHA-256 of every entry file's name and bytes and the versions of
zerodoctor and pydantic): an edited, added or removed entry changes the key and the cache is rebuilt from the
YAML. YAML is read with libyaml's C loader where PyYAML has it, and PyYAML is imported only when YAML is read: a
start that finds the cache (every `diagnose` but the first after an install or an edit) does not load it.
"""

from __future__ import annotations

import functools
from importlib import resources
from pathlib import Path

import pydantic
from pydantic import TypeAdapter, ValidationError

from zerodoctor import __version__
from zerodoctor.errors import KnowledgeBaseError
from zerodoctor.kb import cache
from zerodoctor.kb.schema import Entry

ENTRIES_DIR = Path(str(resources.files("zerodoctor.kb") / "entries"))


def load_entry_file(path: Path) -> Entry:
    return _entry_from_text(path, path.read_text(encoding="utf-8"))


def _entry_from_text(path: Path, text: str) -> Entry:
    import yaml  # only here: about 20 ms of a start that reads the KB from the cache

    loader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        raw = yaml.load(text, Loader=loader)  # noqa: S506 - a SafeLoader (C or Python)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark else None
        raise KnowledgeBaseError(f"{path}:{line}: invalid YAML: {getattr(exc, 'problem', exc)}") from None
    try:
        entry = Entry.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise KnowledgeBaseError(f"{path}: {where}: {first['msg']}") from None
    if path.stem != entry.id:
        raise KnowledgeBaseError(f"{path}: file name must be the entry id {entry.id!r}")
    return entry


@functools.cache
def _adapter() -> TypeAdapter[list[Entry]]:
    return TypeAdapter(list[Entry])


def _parse_all(files: list[tuple[Path, bytes]], key: str) -> tuple[Entry, ...]:
    entries = tuple(_entry_from_text(p, b.decode("utf-8")) for p, b in files)
    cache.write("kb", key, _adapter().dump_json(list(entries)))
    return entries


@functools.cache
def _load_all(directory: str) -> tuple[Entry, ...]:
    files = [(p, p.read_bytes()) for p in sorted(Path(directory).glob("*.yaml"))]
    key = cache.key_of(
        [__version__.encode(), pydantic.VERSION.encode()]
        + [x for p, b in files for x in (p.name.encode(), b)]
    )
    cached = cache.read("kb", key)
    entries: tuple[Entry, ...] | None = None
    if cached is not None:
        try:
            entries = tuple(_adapter().validate_json(cached, context={"from_cache": True}))
        except (ValidationError, ValueError):
            entries = None
    if entries is None or len(entries) != len(files):
        entries = _parse_all(files, key)
    ids = [e.id for e in entries]
    dupes = {i for i in ids if ids.count(i) > 1}
    if dupes:
        raise KnowledgeBaseError(f"duplicate knowledge-base ids: {sorted(dupes)}")
    known = set(ids)
    for e in entries:
        for rel in e.related:
            if rel not in known:
                raise KnowledgeBaseError(f"{e.id}: related entry {rel!r} does not exist")
    return entries


def load_entries(directory: Path | None = None) -> tuple[Entry, ...]:
    return _load_all(str(directory or ENTRIES_DIR))


def get_entry(entry_id: str) -> Entry:
    for e in load_entries():
        if e.id == entry_id:
            return e
    raise KnowledgeBaseError(f"no knowledge-base entry {entry_id!r}", hint="`zerodoctor kb` lists them")
