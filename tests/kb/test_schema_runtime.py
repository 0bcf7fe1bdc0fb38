"""The knowledge base's runtime types (`kb.schema`, what every command reads) against its validation (`kb.validate`,
pydantic, run on the YAML): the same fields in the same order, and every entry read back from the cache equal to
the entry the YAML gives, field for field."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from zerodoctor.kb import schema, validate
from zerodoctor.kb.loader import ENTRIES_DIR, load_entry_file

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


def test_a_forbidden_pattern_is_refused() -> None:
    with pytest.raises(ValueError, match="no lookaround"):
        validate.Signature(id="x", pattern=r"foo(?=bar)", kind="message")
