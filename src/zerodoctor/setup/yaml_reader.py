"""YAML with positions, read with PyYAML's safe loader (libyaml's C parser where available): the same YAML 1.1
rules the frameworks use (LLaMA-Factory, accelerate and HF scripts load their YAML with PyYAML), so `1e-5` stays
a string here exactly as it does for them, and `yes`/`on` are booleans.

The document is composed by `zerodoctor.safeio.compose_yaml` (depth, expanded-size and recursive-alias limits)
and every number is checked where it is written (NaN, infinities, absurd magnitudes)."""

from __future__ import annotations

from typing import Any

import yaml

from zerodoctor.errors import InputError
from zerodoctor.safeio import check_yaml_scalar, compose_yaml, shown
from zerodoctor.setup.document import KeyPath, Position


def parse_yaml(path: str, text: str) -> tuple[Any, dict[KeyPath, Position], list[tuple[KeyPath, Position]]]:
    if not text.strip():
        raise InputError(path, "the file is empty", hint="expected a YAML mapping of settings")
    loader, node = compose_yaml(text, path)
    positions: dict[KeyPath, Position] = {}
    duplicates: list[tuple[KeyPath, Position]] = []
    try:
        if node is None:
            return None, positions, duplicates
        _walk(loader, path, node, (), positions, duplicates)
        data = loader.construct_document(node)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        what = (getattr(exc, "problem", None) or str(exc) or "cannot be read").splitlines()[0]
        raise InputError(
            shown(path),
            f"invalid YAML: {what}",
            line=mark.line + 1 if mark else None,
            column=mark.column + 1 if mark else None,
            hint="fix the value (an unknown !tag or a malformed date, number or !!binary)",
        ) from None
    except (ValueError, TypeError, OverflowError) as exc:  # a constructor on an odd value (e.g. a date)
        raise InputError(shown(path), f"invalid YAML value: {str(exc).splitlines()[0][:200]}") from None
    finally:
        loader.dispose()
    return data, positions, duplicates


def _walk(
    loader: Any,
    path: str,
    node: yaml.Node,
    key: KeyPath,
    positions: dict[KeyPath, Position],
    duplicates: list[tuple[KeyPath, Position]],
) -> None:
    """Record key positions and check numbers; depth is bounded by compose_yaml (MAX_DEPTH)."""
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            k = key_node.value if isinstance(key_node, yaml.ScalarNode) else "?"
            kp = (*key, str(k))
            pos = Position(key_node.start_mark.line + 1, key_node.start_mark.column + 1)
            if kp in positions:
                duplicates.append((kp, pos))
            positions[kp] = pos  # PyYAML keeps the last duplicate, so point at it
            if isinstance(key_node, yaml.ScalarNode):
                check_yaml_scalar(loader, key_node, kp, path)
            _walk(loader, path, value_node, kp, positions, duplicates)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            item_path = (*key, str(i))
            positions[item_path] = Position(item.start_mark.line + 1, item.start_mark.column + 1)
            _walk(loader, path, item, item_path, positions, duplicates)
    elif isinstance(node, yaml.ScalarNode):
        check_yaml_scalar(loader, node, key, path)
