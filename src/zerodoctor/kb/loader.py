"""Load and validate the bundled knowledge-base entries (one YAML file per entry).

The entries stay YAML (people edit them). Parsing and validating them is the larger part of a cold start, so the
validated data is cached as JSON (`kb.cache`, keyed by the SHA-256 of every entry file's name and bytes, the
zerodoctor version and the source of the schema and its validation): an edited, added or removed entry, or a
changed schema, changes the key and the cache is rebuilt from the YAML. A cache hit is read into the plain
runtime types of `kb.schema` and imports neither PyYAML nor pydantic (together about 0.1 s of CPU); the YAML
path reads with libyaml's C loader where PyYAML has it and validates every entry with `kb.validate`'s pydantic
models, as before.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from zerodoctor import __version__
from zerodoctor.errors import KnowledgeBaseError
from zerodoctor.kb import cache
from zerodoctor.kb.schema import Entry, entry_from_data

# (next to this module; importlib.resources would cost ~15 ms of imports for the same path)
ENTRIES_DIR = Path(__file__).resolve().parent / "entries"
# Changes when the cached data's layout changes (the pydantic models' JSON, read by `entry_from_data`).
_CACHE_FORMAT = b"kb-json-2"


def load_entry_file(path: Path) -> Entry:
    return entry_from_data(_validated(path, path.read_text(encoding="utf-8")))


def _validated(path: Path, text: str) -> dict[str, Any]:
    """The entry in `text` checked by the schema (`kb.validate`), as plain JSON-ready data."""
    import yaml  # only here, like pydantic: a start that reads the KB from the cache needs neither
    from pydantic import ValidationError

    from zerodoctor.kb import validate

    loader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        raw = yaml.load(text, Loader=loader)  # noqa: S506 - a SafeLoader (C or Python)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark else None
        raise KnowledgeBaseError(f"{path}:{line}: invalid YAML: {getattr(exc, 'problem', exc)}") from None
    try:
        entry = validate.Entry.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise KnowledgeBaseError(f"{path}: {where}: {first['msg']}") from None
    if path.stem != entry.id:
        raise KnowledgeBaseError(f"{path}: file name must be the entry id {entry.id!r}")
    return entry.model_dump(mode="json")


def _parse_all(files: list[tuple[Path, bytes]], key: str) -> tuple[Entry, ...]:
    data = [_validated(p, b.decode("utf-8")) for p, b in files]
    cache.write("kb", key, json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode("utf-8"))
    return tuple(entry_from_data(d) for d in data)


def _from_cache(payload: bytes) -> tuple[Entry, ...] | None:
    """The entries of a cache file, or None when it does not hold the expected data (then the YAML is read)."""
    try:
        data = json.loads(payload)
        return tuple(entry_from_data(d) for d in data)
    except (ValueError, TypeError, KeyError, AttributeError):
        return None


def _schema_source() -> list[bytes]:
    """The source of the runtime types and of the validation: a change to either rebuilds the cache."""
    here = Path(__file__).parent
    out = []
    for name in ("schema.py", "validate.py"):
        try:
            out.append((here / name).read_bytes())
        except OSError:  # no source installed (bytecode only): the zerodoctor version still keys the cache
            out.append(b"")
    return out


@functools.cache
def _load_all(directory: str) -> tuple[Entry, ...]:
    files = [(p, p.read_bytes()) for p in sorted(Path(directory).glob("*.yaml"))]
    key = cache.key_of(
        [__version__.encode(), _CACHE_FORMAT, *_schema_source()]
        + [x for p, b in files for x in (p.name.encode(), b)]
    )
    cached = cache.read("kb", key)
    entries = _from_cache(cached) if cached is not None else None
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
