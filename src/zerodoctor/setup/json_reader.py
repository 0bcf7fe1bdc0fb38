"""JSON with positions. `json` validates and builds the values (through `zerodoctor.safeio.load_json`, which
bounds the nesting and refuses non-finite or absurd numbers); a small scanner records where each key is.

DeepSpeed reads its config with `json.load(..., object_pairs_hook=dict_raise_error_on_duplicate_keys)`, so
duplicate keys are recorded (they are an error at launch) rather than silently collapsed.
"""

from __future__ import annotations

import json
import re
from typing import Any

from zerodoctor.errors import InputError
from zerodoctor.safeio import load_json
from zerodoctor.setup.document import KeyPath, Position

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_WS = re.compile(r"[ \t\r\n]*")
_TOKEN = re.compile(r"[^,}\] \t\r\n]*")  # a number, true, false or null


def _line_col(text: str, offset: int, line_starts: list[int]) -> Position:
    import bisect

    i = bisect.bisect_right(line_starts, offset) - 1
    return Position(line=i + 1, column=offset - line_starts[i] + 1)


def parse_json(path: str, text: str) -> tuple[Any, dict[KeyPath, Position], list[tuple[KeyPath, Position]]]:
    """Parse with `zerodoctor.safeio.load_json` (depth limit, numbers checked), then record key positions."""
    if not text.strip():
        raise InputError(path, "the file is empty", hint="expected a JSON object")
    line_starts = [0] + [m.end() for m in re.finditer(r"\n", text)]

    def locate(key: KeyPath) -> tuple[int, int] | None:
        found: dict[KeyPath, Position] = {}
        _Scanner(text, line_starts, found, []).value(0, ())
        while key:
            if key in found:
                return found[key].line, found[key].column
            key = key[:-1]
        return None

    data = load_json(text, path, locate=locate)
    positions: dict[KeyPath, Position] = {}
    duplicates: list[tuple[KeyPath, Position]] = []
    _Scanner(text, line_starts, positions, duplicates).value(0, ())
    return data, positions, duplicates


class _Scanner:
    """Walks text already validated by `json.loads`, so it can assume well-formed input."""

    def __init__(
        self,
        text: str,
        line_starts: list[int],
        positions: dict[KeyPath, Position],
        duplicates: list[tuple[KeyPath, Position]],
    ) -> None:
        self.text = text
        self.line_starts = line_starts
        self.positions = positions
        self.duplicates = duplicates

    def ws(self, i: int) -> int:
        m = _WS.match(self.text, i)
        return m.end() if m else i

    def value(self, i: int, path: KeyPath) -> int:
        i = self.ws(i)
        c = self.text[i]
        if c == "{":
            return self.obj(i + 1, path)
        if c == "[":
            return self.arr(i + 1, path)
        if c == '"':
            m = _STRING.match(self.text, i)
            assert m
            return m.end()
        m = _TOKEN.match(self.text, i)
        return m.end() if m else i

    def obj(self, i: int, path: KeyPath) -> int:
        i = self.ws(i)
        if self.text[i] == "}":
            return i + 1
        while True:
            i = self.ws(i)
            m = _STRING.match(self.text, i)
            assert m
            key = json.loads(m.group(0))
            kp = (*path, key)
            pos = _line_col(self.text, i, self.line_starts)
            if kp in self.positions:
                self.duplicates.append((kp, pos))
            else:
                self.positions[kp] = pos
            i = self.ws(m.end())
            assert self.text[i] == ":"
            i = self.value(i + 1, kp)
            i = self.ws(i)
            if self.text[i] == ",":
                i += 1
                continue
            assert self.text[i] == "}"
            return i + 1

    def arr(self, i: int, path: KeyPath) -> int:
        i = self.ws(i)
        if self.text[i] == "]":
            return i + 1
        idx = 0
        while True:
            i = self.value(i, (*path, str(idx)))
            i = self.ws(i)
            idx += 1
            if self.text[i] == ",":
                i += 1
                continue
            return i + 1
