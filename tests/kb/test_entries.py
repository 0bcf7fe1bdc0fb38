"""Every knowledge-base entry validates against the schema and its own examples behave as documented."""

from __future__ import annotations

import pytest

from zerodoctor.kb.loader import load_entries
from zerodoctor.kb.matcher import evaluate_example, example_matches

ENTRIES = load_entries()
MATCH = [(e, x) for e in ENTRIES for x in e.examples.match]
NO_MATCH = [(e, x) for e in ENTRIES for x in e.examples.no_match]


def test_entries_exist():
    assert len(ENTRIES) >= 1


@pytest.mark.parametrize(("entry", "example"), MATCH, ids=[f"{e.id}::{x.name}" for e, x in MATCH])
def test_example_matches(entry, example):
    verdict = evaluate_example(entry, example)
    assert example_matches(entry, example), verdict


@pytest.mark.parametrize(("entry", "example"), NO_MATCH, ids=[f"{e.id}::{x.name}" for e, x in NO_MATCH])
def test_example_does_not_match(entry, example):
    verdict = evaluate_example(entry, example)
    assert not example_matches(entry, example), verdict
