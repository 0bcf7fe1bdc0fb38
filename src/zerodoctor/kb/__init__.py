"""The knowledge base: one YAML file per known failure (DATA), a schema, and a generic matcher."""

from __future__ import annotations

from zerodoctor.kb.loader import get_entry, load_entries
from zerodoctor.kb.schema import Entry

__all__ = ["Entry", "get_entry", "load_entries"]
