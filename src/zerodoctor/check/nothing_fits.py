"""PLAN006 ("no strategy fits") in `check`: the same answer `zerodoctor plan` gives, built by
`zerodoctor.plan.nothing_fits` (the phase the closest candidate fails in, by how much, the item that dominates
it, and the changes found by planning the run again), named by the user's own keys."""

from __future__ import annotations

from zerodoctor.plan.nothing_fits import PHASE_WORDS as _PHASE_WORDS
from zerodoctor.plan.nothing_fits import reword_nothing_fits

__all__ = ["_PHASE_WORDS", "reword_nothing_fits"]
