"""Text shown to people is shortened at a word boundary, never in the middle of a word or a number, and
shows a user's control characters as escapes instead of sending them to the terminal."""

from __future__ import annotations

import re
import textwrap

_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")
"""C0 controls but tab and newline, DEL, C1 controls, and the bidirectional marks and overrides."""


def printable(text: str) -> str:
    """`text` with control characters written as Python escapes (ESC as `\\x1b`, CR as `\\r`, U+202E as
    `\\u202e`): a key or a model name read from a user's file that holds `ESC[2J` must not clear the screen
    (or move the cursor, or reorder a line) when a report shows it. Tab and newline are kept."""
    if not _CONTROL.search(text):
        return text
    return _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


def clip(text: str, width: int) -> str:
    """`text` on one line, at most `width` characters, cut between words with " ..." when it is longer."""
    one_line = " ".join(str(text).split())
    if len(one_line) <= width:
        return one_line
    return (
        textwrap.shorten(one_line, width=width, placeholder=" ...") or one_line[: max(width - 4, 1)] + " ..."
    )
