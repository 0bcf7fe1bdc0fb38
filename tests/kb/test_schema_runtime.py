"""The knowledge base's runtime types (`kb.schema`, what every command reads) against its validation (`kb.validate`,
pydantic, run on the YAML): the same fields in the same order, and every entry read back from the cache equal to
the entry the YAML gives, field for field."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from zerodoctor.errors import KnowledgeBaseError
from zerodoctor.kb import schema, validate
from zerodoctor.kb.loader import ENTRIES_DIR, _load_all, load_entry_file

PAIRS = [
    (schema.VersionRange, validate.VersionRange),
    (schema.PackageCondition, validate.PackageCondition),
    (schema.ConfigPredicate, validate.ConfigPredicate),
    (schema.Conditions, validate.Conditions),
    (schema.Signature, validate.Signature),
    (schema.Symptoms, validate.Symptoms),
    (schema.KbFix, validate.KbFix),
    (schema.Reference, validate.Reference),
    (schema.Example, validate.Example),
    (schema.Examples, validate.Examples),
    (schema.Entry, validate.Entry),
]


@pytest.mark.parametrize(("runtime", "model"), PAIRS, ids=[r.__name__ for r, _ in PAIRS])
def test_runtime_type_has_the_models_fields_in_order(runtime: Any, model: type[BaseModel]) -> None:
    assert runtime._fields == tuple(model.model_fields)


def test_every_entry_round_trips_through_its_data() -> None:
    for path in sorted(ENTRIES_DIR.glob("*.yaml")):
        model = validate.Entry.model_validate(yaml.safe_load(path.read_text(encoding="utf-8")))
        entry = load_entry_file(path)
        assert schema.entry_data(entry) == model.model_dump(mode="json"), path.name
        assert schema.entry_from_data(schema.entry_data(entry)) == entry


@pytest.fixture
def entries_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("ZERODOCTOR_CACHE_DIR", str(tmp_path / "cache"))
    d = tmp_path / "entries"
    shutil.copytree(ENTRIES_DIR, d)
    _load_all.cache_clear()
    yield d
    _load_all.cache_clear()


def test_cached_entries_have_the_runtime_types(entries_copy: Path) -> None:
    _load_all(str(entries_copy))  # writes the cache
    _load_all.cache_clear()
    for e in _load_all(str(entries_copy)):  # read back without pydantic
        assert type(e) is schema.Entry and type(e.symptoms) is schema.Symptoms
        assert all(type(s) is schema.Signature for s in e.symptoms.signatures)
        assert all(type(f) is schema.KbFix for f in e.fixes)
        assert type(e.examples.match[0]) is schema.Example


def test_a_bad_entry_is_still_refused_when_a_cache_exists(entries_copy: Path) -> None:
    _load_all(str(entries_copy))  # the cache of the good entries
    path = entries_copy / "host-oom-sigkill.yaml"
    path.write_text(path.read_text().replace("severity: error", "severity: fatal", 1))
    _load_all.cache_clear()
    with pytest.raises(KnowledgeBaseError, match=r"host-oom-sigkill.yaml: severity: Input should be"):
        _load_all(str(entries_copy))


def test_a_forbidden_pattern_is_refused() -> None:
    with pytest.raises(ValueError, match="no lookaround"):
        validate.Signature(id="x", pattern=r"foo(?=bar)", kind="message")
