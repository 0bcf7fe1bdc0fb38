"""Fixes are shown to every user whose log matches: they must not carry another run's numbers (a model's
parameter count, a node's RAM); a command takes placeholders or the user's own values."""

from __future__ import annotations

import re

from zerodoctor.kb.loader import load_entries

# a literal of 7+ digits (underscores allowed) is a size or a count from some particular run
_BIG_LITERAL = re.compile(r"\b\d[\d_]{6,}\b")


def test_fix_commands_carry_no_case_numbers() -> None:
    offenders = [
        f"{e.id}: {f.command}"
        for e in load_entries()
        for f in e.fixes
        if f.command and _BIG_LITERAL.search(f.command)
    ]
    assert not offenders, offenders
