"""XTuner / mmengine Python configs, read with `ast` and never executed.

Module-level assignments are evaluated as data: literals, `dict(...)` calls, lists, references to earlier
variables and simple arithmetic. Anything else (an imported class such as `TrainLoop`, a call we do not know)
becomes a `Symbol` carrying its source text, so a rule can still see `type=TrainLoop` without running code.
"""

from __future__ import annotations

import ast
import operator
from dataclasses import dataclass
from typing import Any

from zerodoctor.errors import InputError
from zerodoctor.setup.document import KeyPath, Position


@dataclass(frozen=True)
class Symbol:
    """An expression we did not evaluate: an imported name, an attribute, an unknown call."""

    source: str

    def __str__(self) -> str:
        return self.source

    @property
    def name(self) -> str:
        """The last dotted component without call arguments: `xtuner.engine.TrainLoop` -> `TrainLoop`."""
        return self.source.split("(")[0].split(".")[-1]


_BINOPS: dict[type[ast.operator], Any] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}


def parse_python_config(
    path: str, text: str
) -> tuple[dict[str, Any], dict[KeyPath, Position], dict[KeyPath, str]]:
    if not text.strip():
        raise InputError(path, "the file is empty", hint="expected an XTuner Python config")
    try:
        tree = ast.parse(text, filename=path)
    except SyntaxError as exc:
        raise InputError(
            path,
            f"invalid Python: {exc.msg}",
            line=exc.lineno,
            column=exc.offset,
            hint="the file is read with ast and never run; fix the syntax",
        ) from None
    ev = _Evaluator(text)
    for stmt in tree.body:
        ev.statement(stmt)
    return ev.env, ev.positions, ev.symbols


class _Evaluator:
    def __init__(self, text: str) -> None:
        self.text = text
        self.env: dict[str, Any] = {}
        self.positions: dict[KeyPath, Position] = {}
        self.symbols: dict[KeyPath, str] = {}

    def statement(self, stmt: ast.stmt) -> None:
        if isinstance(stmt, ast.Import | ast.ImportFrom):
            for alias in stmt.names:
                name = alias.asname or alias.name.split(".")[0]
                module = getattr(stmt, "module", None)
                self.env[name] = Symbol(f"{module}.{alias.name}" if module else alias.name)
            return
        targets: list[ast.expr] = []
        value: ast.expr | None = None
        if isinstance(stmt, ast.Assign):
            targets, value = stmt.targets, stmt.value
        elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
            targets, value = [stmt.target], stmt.value
        if value is None:
            return
        for target in targets:
            if isinstance(target, ast.Name):
                path = (target.id,)
                self.positions[path] = Position(target.lineno, target.col_offset + 1)
                self.env[target.id] = self.expr(value, path)

    def expr(self, node: ast.expr, path: KeyPath) -> Any:
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            if node.id in self.env:
                value = self.env[node.id]
                if isinstance(value, Symbol):
                    self.symbols[path] = value.source
                return value
            return self._symbol(node, path)
        if isinstance(node, ast.Dict):
            out: dict[str, Any] = {}
            for k, v in zip(node.keys, node.values, strict=True):
                if isinstance(k, ast.Constant) and isinstance(k.value, str):
                    kp = (*path, k.value)
                    self.positions[kp] = Position(k.lineno, k.col_offset + 1)
                    out[k.value] = self.expr(v, kp)
            return out
        if isinstance(node, ast.List | ast.Tuple | ast.Set):
            return [self.expr(e, (*path, str(i))) for i, e in enumerate(node.elts)]
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "dict":
            out = {}
            for kw in node.keywords:
                if kw.arg is None:  # dict(**other)
                    other = self.expr(kw.value, path)
                    if isinstance(other, dict):
                        out.update(other)
                    continue
                kp = (*path, kw.arg)
                self.positions[kp] = Position(kw.lineno, kw.col_offset + 1)
                out[kw.arg] = self.expr(kw.value, kp)
            return out
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            left, right = self.expr(node.left, path), self.expr(node.right, path)
            if not isinstance(left, Symbol) and not isinstance(right, Symbol):
                try:
                    return _BINOPS[type(node.op)](left, right)
                except Exception:  # noqa: BLE001 - e.g. division by zero in a config: keep it symbolic
                    pass
            return self._symbol(node, path)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
            v = self.expr(node.operand, path)
            if isinstance(v, int | float):
                return -v if isinstance(node.op, ast.USub) else v
        if isinstance(node, ast.JoinedStr):
            parts = []
            for part in node.values:
                if isinstance(part, ast.Constant):
                    parts.append(str(part.value))
                elif isinstance(part, ast.FormattedValue):
                    v = self.expr(part.value, path)
                    if isinstance(v, Symbol):
                        return self._symbol(node, path)
                    parts.append(str(v))
            return "".join(parts)
        return self._symbol(node, path)

    def _symbol(self, node: ast.expr, path: KeyPath) -> Symbol:
        source = ast.get_source_segment(self.text, node) or ast.dump(node)
        self.symbols[path] = source
        return Symbol(source)
