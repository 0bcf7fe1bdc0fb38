"""Text shown to people is shortened at a word boundary, never in the middle of a word or a number."""

from __future__ import annotations

import textwrap


def clip(text: str, width: int) -> str:
    """`text` on one line, at most `width` characters, cut between words with " ..." when it is longer."""
    one_line = " ".join(str(text).split())
    if len(one_line) <= width:
        return one_line
    return (
        textwrap.shorten(one_line, width=width, placeholder=" ...") or one_line[: max(width - 4, 1)] + " ..."
    )
