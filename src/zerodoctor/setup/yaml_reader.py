"""YAML with positions, read with PyYAML's SafeLoader: the same YAML 1.1 rules the frameworks use
(LLaMA-Factory, accelerate and HF scripts load their YAML with PyYAML), so `1e-5` stays a string here exactly
as it does for them, and `yes`/`on` are booleans."""

from __future__ import annotations

from typing import Any

import yaml

from zerodoctor.errors import InputError
from zerodoctor.setup.document import KeyPath, Position


def parse_yaml(path: str, text: str) -> tuple[Any, dict[KeyPath, Position], list[tuple[KeyPath, Position]]]:
    if not text.strip():
        raise InputError(path, "the file is empty", hint="expected a YAML mapping of settings")
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        raise InputError(
            path,
            f"invalid YAML: {exc.problem or exc.context}",
            line=mark.line + 1 if mark else None,
            column=mark.column + 1 if mark else None,
            hint="fix the syntax (indentation, a missing ':' or an unclosed quote)",
        ) from None
    except yaml.YAMLError as exc:
        raise InputError(path, f"invalid YAML: {exc}") from None
    finally:
        loader.dispose()
    positions: dict[KeyPath, Position] = {}
    duplicates: list[tuple[KeyPath, Position]] = []
    if node is not None:
        _walk(node, (), positions, duplicates)
    return data, positions, duplicates


def _walk(
    node: yaml.Node,
    path: KeyPath,
    positions: dict[KeyPath, Position],
    duplicates: list[tuple[KeyPath, Position]],
) -> None:
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = str(key_node.value)
            kp = (*path, key)
            pos = Position(key_node.start_mark.line + 1, key_node.start_mark.column + 1)
            if kp in positions:
                duplicates.append((kp, pos))
            positions[kp] = pos  # PyYAML keeps the last duplicate, so point at it
            _walk(value_node, kp, positions, duplicates)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            item_path = (*path, str(i))
            positions[item_path] = Position(item.start_mark.line + 1, item.start_mark.column + 1)
            _walk(item, item_path, positions, duplicates)
