"""Load and validate the bundled knowledge-base entries (one YAML file per entry)."""

from __future__ import annotations

import functools
from importlib import resources
from pathlib import Path

import yaml
from pydantic import ValidationError

from zerodoctor.errors import KnowledgeBaseError
from zerodoctor.kb.schema import Entry

ENTRIES_DIR = Path(str(resources.files("zerodoctor.kb") / "entries"))


def load_entry_file(path: Path) -> Entry:
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
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
def _load_all(directory: str) -> tuple[Entry, ...]:
    entries = tuple(load_entry_file(p) for p in sorted(Path(directory).glob("*.yaml")))
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
