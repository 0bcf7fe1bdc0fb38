"""`lint --fix`: apply the rules' patches to a corrected copy of each file (or in place, after a backup).

Only the keys a fix names change; every other key, the key order, number spellings such as `5e8` (JSON)
and comments (YAML, through ruamel.yaml's round-trip mode) are kept. A fix is applied only when its rule
marks it safe, or with `--unsafe-fixes`. Python (XTuner) configs are never rewritten.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zerodoctor.errors import InputError
from zerodoctor.findings import Finding, Severity
from zerodoctor.lint.rules import RULES
from zerodoctor.safeio import read_text, replace_with_backup, write_free
from zerodoctor.setup.deepspeed_config import ACCELERATE_TO_DS, spelled
from zerodoctor.setup.document import ConfigDocument
from zerodoctor.setup.model import TrainingSetup

_REMOVE = object()


@dataclass(frozen=True)
class Change:
    file: str
    key: str
    old: Any
    new: Any  # None: the key is removed
    rule: str
    removed: bool = False
    renamed_from: str | None = None  # a rename done in place: the key as it was written

    def describe(self) -> str:
        if self.renamed_from is not None:
            return f"{self.file}: {self.rule}: renamed {self.renamed_from} to {self.key} (value {json.dumps(self.new, default=str)})"
        if self.removed:
            return f"{self.file}: {self.rule}: removed {self.key} (was {json.dumps(self.old, default=str)})"
        return f"{self.file}: {self.rule}: {self.key}: {json.dumps(self.old, default=str)} -> {json.dumps(self.new, default=str)}"


@dataclass(frozen=True)
class Skipped:
    rule: str
    reason: str


def _target_doc(
    setup: TrainingSetup, target: str | None, key: str
) -> tuple[ConfigDocument | None, str | None]:
    if target == "deepspeed":
        if setup.ds_doc is not None:
            return setup.ds_doc, spelled(setup.ds_doc.data, key)
        if setup.ds_from_accelerate_plugin and setup.accelerate_doc is not None:
            for acc, ds in ACCELERATE_TO_DS.items():
                if ds == key:
                    return setup.accelerate_doc, f"deepspeed_config.{acc}"
        return None, None
    if target in ("hf", "llamafactory"):
        return setup.args_doc, key
    if target == "accelerate":
        return setup.accelerate_doc, key
    return None, None


def _why_not(f: Finding, is_rule: bool, safety: str | None, has_patch: bool) -> str:
    """Why a finding's fix is not applied automatically, in one line that names the fix."""
    at = f.evidence[0].location() if f.evidence and f.evidence[0].file else ""
    what = f"{f.fixes[0].text.rstrip('.')}" + (f" ({at})" if at else "")
    if f.data.get("why_no_autofix"):
        return f"not applied automatically: {what}: {f.data['why_no_autofix']}"
    if not is_rule:
        return f"not applied automatically: {what}: apply it by hand"
    if safety is None:
        return f"not applied automatically: {what}: the rule has no automatic fix; apply it by hand"
    return f"not applied automatically: {what}: a choice only you can make"


def plan_fixes(
    setup: TrainingSetup, findings: list[Finding], *, unsafe: bool = False
) -> tuple[list[Change], list[Skipped]]:
    changes: list[Change] = []
    skipped: list[Skipped] = []
    taken: dict[tuple[str, str], Any] = {}
    for f in findings:
        module = RULES.get(f.id)
        safety = module.RULE.fix_safety if module else None
        patch_fix = next((fx for fx in f.fixes if fx.patch), None)
        if patch_fix is None or safety is None:
            if f.fixes and f.severity >= Severity.WARNING:
                skipped.append(Skipped(f.id, _why_not(f, module is not None, safety, patch_fix is not None)))
            continue
        if safety == "unsafe" and not unsafe:
            skipped.append(
                Skipped(
                    f.id,
                    f"not applied automatically: {patch_fix.text.rstrip('.')}: it changes training behaviour; "
                    "pass --unsafe-fixes to apply it",
                )
            )
            continue
        for key, value in (patch_fix.patch or {}).items():
            doc, file_key = _target_doc(setup, patch_fix.target, key)
            if doc is None or file_key is None:
                skipped.append(Skipped(f.id, f"no file to change for {key}"))
                continue
            if doc.kind == "xtuner":
                skipped.append(Skipped(f.id, f"{doc.display} is a Python config; edit {file_key} by hand"))
                continue
            if doc.duplicates:
                (dup_key, dup_pos), *_ = doc.duplicates
                skipped.append(
                    Skipped(
                        f.id,
                        f"{doc.display}:{dup_pos.line}: {'.'.join(dup_key)} is written twice; a rewrite would "
                        "keep only one of them, so remove the one you do not mean and run --fix again",
                    )
                )
                continue
            slot = (str(doc.path), file_key)
            if slot in taken:
                if taken[slot] != value:
                    skipped.append(Skipped(f.id, f"{file_key} is already changed by another fix"))
                continue
            taken[slot] = value
            old = doc.get(tuple(file_key.split(".")))
            if old == value and value is not None:
                continue
            if value is None and not doc.has(tuple(file_key.split("."))):
                continue
            changes.append(Change(doc.display, file_key, old, value, f.id, removed=value is None))
    return _collapse_renames(changes), skipped


def _collapse_renames(changes: list[Change]) -> list[Change]:
    """A removed key and an added key with its value, from one fix in one block, are one rename."""
    pairs = _renames(changes)
    first = {id(r): (r, a) for r, a in pairs}
    dropped = {id(a) for _, a in pairs}
    out = []
    for c in changes:
        if id(c) in first:
            r, a = first[id(c)]
            out.append(Change(a.file, a.key, r.old, a.new, a.rule, renamed_from=r.key))
        elif id(c) not in dropped:
            out.append(c)
    return out


# ---- JSON that keeps number spellings ------------------------------------------------------------------


class _Num(str):
    """A JSON number kept as the user wrote it (5e8 stays 5e8)."""


def _dump_json(value: Any, indent: int, level: int = 0) -> str:
    pad, inner = " " * (indent * level), " " * (indent * (level + 1))
    if isinstance(value, dict):
        if not value:
            return "{}"
        items = [
            f"{inner}{json.dumps(k, ensure_ascii=False)}: {_dump_json(v, indent, level + 1)}"
            for k, v in value.items()
        ]
        return "{\n" + ",\n".join(items) + f"\n{pad}}}"
    if isinstance(value, list):
        if not value:
            return "[]"
        if all(not isinstance(v, dict | list) for v in value):
            return "[" + ", ".join(_dump_json(v, indent, level + 1) for v in value) + "]"
        return "[\n" + ",\n".join(inner + _dump_json(v, indent, level + 1) for v in value) + f"\n{pad}]"
    if isinstance(value, _Num):
        return str(value)
    return json.dumps(value, ensure_ascii=False)


def _set(node: dict[str, Any], keys: list[str], value: Any, make: Any = dict) -> None:
    for k in keys[:-1]:
        if not isinstance(node.get(k), dict):
            node[k] = make()
        node = node[k]
    if value is _REMOVE:
        node.pop(keys[-1], None)
    else:
        node[keys[-1]] = value


def _parent(key: str) -> str:
    return key.rsplit(".", 1)[0] if "." in key else ""


def _renames(changes: list[Change]) -> list[tuple[Change, Change]]:
    """(removed, added) pairs that one fix makes in the same block with the same value: a rename, which is
    done in place so the key keeps its position (and its value's spelling)."""
    out = []
    removed = [c for c in changes if c.removed]
    for a in changes:
        if a.removed:
            continue
        r = next(
            (r for r in removed if r.rule == a.rule and _parent(r.key) == _parent(a.key) and r.old == a.new),
            None,
        )
        if r is not None:
            out.append((r, a))
            removed.remove(r)
    return out


def _apply(data: dict[str, Any], changes: list[Change], make: Any = dict) -> None:
    for c in changes:
        if c.renamed_from is None:
            _set(data, c.key.split("."), _REMOVE if c.removed else c.new, make=make)
            continue
        node: Any = data
        keys = c.renamed_from.split(".")
        for k in keys[:-1]:
            node = node[k]
        new_key = c.key.split(".")[-1]
        if hasattr(node, "insert"):  # ruamel's CommentedMap: insert at the old key's position
            pos = list(node).index(keys[-1])
            value = node.pop(keys[-1])
            node.insert(pos, new_key, value)
        else:  # a plain dict: rebuild it in order, keeping the value as written (5e8 stays 5e8)
            items = list(node.items())
            node.clear()
            node.update((new_key if k == keys[-1] else k, v) for k, v in items)


def _fix_json(doc: ConfigDocument, changes: list[Change]) -> str:
    try:
        data = json.loads(doc.text, parse_float=_Num, parse_int=_Num)
    except ValueError:  # a YAML flow mapping that starts with "{": rewrite it as YAML
        return _fix_yaml(doc, changes)
    if not isinstance(data, dict):
        raise InputError(doc.display, "cannot rewrite: not an object at the top level")
    _apply(data, changes)
    m = re.search(r"\n([ \t]+)\S", doc.text)
    indent = len(m.group(1).replace("\t", "    ")) if m else 2
    return _dump_json(data, indent) + "\n"


def json_with_changes(doc: ConfigDocument, changes: list[Change]) -> tuple[dict[str, Any], int] | None:
    """The JSON document as data with its number spellings kept (5e8 stays 5e8) and `changes` applied, and
    its indent; None when the file is not a JSON object (a YAML-written DeepSpeed config)."""
    try:
        data = json.loads(doc.text, parse_float=_Num, parse_int=_Num)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    _apply(data, [c for c in changes if c.file == doc.display])
    m = re.search(r"\n([ \t]+)\S", doc.text)
    return data, len(m.group(1).replace("\t", "    ")) if m else 2


def plain(value: Any) -> Any:
    """A value from `json_with_changes` with its kept number spellings turned back into numbers."""
    if isinstance(value, _Num):
        return json.loads(value)
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


def dump_json(data: Any, indent: int = 2) -> str:
    """JSON text that writes numbers kept by `json_with_changes` as the user spelled them."""
    return _dump_json(data, indent) + "\n"


def _fix_yaml(doc: ConfigDocument, changes: list[Change]) -> str:
    import io

    from ruamel.yaml import YAML
    from ruamel.yaml.comments import CommentedMap

    yaml = YAML()  # round-trip: comments, order and quoting are kept
    yaml.preserve_quotes = True
    yaml.width = 4096
    try:
        data = yaml.load(doc.text)
    except Exception as err:  # noqa: BLE001 - ruamel's errors have no common base worth naming
        first = (str(err).splitlines() or [type(err).__name__])[0][:200]
        raise InputError(
            doc.display, f"cannot rewrite this YAML: {first}", hint="apply the fixes shown by hand"
        ) from None
    if not isinstance(data, dict):
        raise InputError(doc.display, "cannot rewrite: not a mapping at the top level")
    _apply(data, changes, make=CommentedMap)
    buf = io.StringIO()
    yaml.dump(data, buf)
    return buf.getvalue()


def fixed_texts(setup: TrainingSetup, changes: list[Change]) -> list[tuple[ConfigDocument, str]]:
    """Each document of the setup that the changes touch, with its corrected text (JSON keeps its indent,
    YAML its comments, order and quoting); nothing is written."""
    by_file: dict[str, list[Change]] = {}
    for c in changes:
        by_file.setdefault(c.file, []).append(c)
    out: list[tuple[ConfigDocument, str]] = []
    for doc in setup.documents:
        todo = by_file.get(doc.display)
        if not todo:
            continue
        is_json = doc.path.suffix == ".json" or doc.text.lstrip().startswith("{")
        out.append((doc, _fix_json(doc, todo) if is_json else _fix_yaml(doc, todo)))
    return out


def write_fixes(
    setup: TrainingSetup, changes: list[Change], *, in_place: bool = False
) -> list[tuple[Path, Path | None]]:
    """Write each changed file; returns (written path, backup path or None). Never overwrites a user file
    without a backup, never overwrites an earlier copy (`zerodoctor.safeio`: exclusive creation, atomic
    replace after a backup)."""
    written: list[tuple[Path, Path | None]] = []
    for doc, text in fixed_texts(setup, changes):
        if in_place:
            if read_text(doc.path) != doc.text:
                raise InputError(
                    doc.display, "changed since it was read; not rewriting it", hint="run lint --fix again"
                )
            backup = replace_with_backup(doc.path, text)
            written.append((doc.path, backup))
        else:
            target = write_free(doc.path.with_name(f"{doc.path.stem}.fixed{doc.path.suffix}"), text)
            written.append((target, None))
    return written
