"""XTuner / mmengine Python configs, read with `ast` and never executed.

Module-level assignments are evaluated as data: literals, `dict(...)` calls, lists, references to earlier
variables and simple arithmetic. Anything else (an imported class such as `TrainLoop`, a call we do not know)
becomes a `Symbol` carrying its source text, so a rule can still see `type=TrainLoop` without running code.
"""

from __future__ import annotations

import ast
import math
import operator
import re
from dataclasses import dataclass
from typing import Any

from zerodoctor.errors import InputError
from zerodoctor.safeio import MAX_DEPTH, MAX_INT_DIGITS, number_problem, shown
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
_NUMERIC_BUILTINS: dict[str, Any] = {"int": int, "float": float, "abs": abs, "round": round, "min": min, "max": max}
"""Builtins a config applies to numbers (`max_length = int(32768 / sequence_parallel_size)`): evaluated when every
argument is a number, so no call can take time or memory beyond its arguments' size."""
MAX_POW_BITS = 128
"""`a ** b` is computed only when the result has at most this many bits (beyond MAX_MAGNITUDE anyway): this is
what keeps `10**10**10` from running for hours."""
MAX_SEQUENCE = 1_000_000
"""Longest string or list an expression may build (`'a' * 10**10` would take the machine's memory)."""
MAX_SOURCE_SHOWN = 200


def parse_python_config(
    path: str, text: str
) -> tuple[dict[str, Any], dict[KeyPath, Position], dict[KeyPath, str]]:
    if not text.strip():
        raise InputError(path, "the file is empty", hint="expected an XTuner Python config")
    try:
        tree = ast.parse(text, filename=path)
    except SyntaxError as exc:
        msg = exc.msg
        if "integer string conversion" in msg:
            msg = f"an integer literal longer than {MAX_INT_DIGITS} digits"
        raise InputError(
            path,
            f"invalid Python: {msg}",
            line=exc.lineno,
            column=exc.offset,
            hint="the file is read with ast and never run; fix the syntax",
        ) from None
    except (RecursionError, MemoryError):
        raise InputError(
            path,
            "an expression nested too deeply for Python's parser",
            hint="a config needs no expression of thousands of terms; write its value",
        ) from None
    except ValueError as exc:  # e.g. a NUL byte in the source
        raise InputError(
            path, f"invalid Python: {exc}", hint="the file is read with ast and never run"
        ) from None
    ev = _Evaluator(path, text)
    for stmt in tree.body:
        ev.statement(stmt)
    return ev.env, ev.positions, ev.symbols


class _Evaluator:
    def __init__(self, path: str, text: str) -> None:
        self.path = path
        self.text = text
        self.data = text.encode("utf-8")
        self.line_starts = [0] + [m.end() for m in re.finditer(b"\n", self.data)]
        self.depth = 0
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
        elif isinstance(stmt, ast.AugAssign) and isinstance(stmt.target, ast.Name):
            # `accumulative_counts *= sequence_parallel_size` (XTuner's own templates): the same evaluation
            # and limits as `name = name * value`; the key's position moves to this line, where its value is set.
            current = ast.copy_location(ast.Name(id=stmt.target.id, ctx=ast.Load()), stmt.target)
            targets, value = [stmt.target], ast.copy_location(ast.BinOp(current, stmt.op, stmt.value), stmt)
        if value is None:
            return
        for target in targets:
            if isinstance(target, ast.Name):
                path = (target.id,)
                self.positions[path] = Position(target.lineno, target.col_offset + 1)
                self.env[target.id] = self.expr(value, path)

    def fail(self, node: ast.expr, path: KeyPath, message: str, hint: str) -> InputError:
        return InputError(
            self.path,
            f"{'.'.join(path)}: {message}",
            line=node.lineno,
            column=node.col_offset + 1,
            hint=hint,
        )

    def checked(self, node: ast.expr, path: KeyPath, value: Any) -> Any:
        """Refuse a computed or written value no config can mean (NaN, infinity, 10**40, a 1e6-item list)."""
        problem = number_problem(value)
        if problem:
            raise self.fail(node, path, f"the value {problem}", "write a finite number of realistic size")
        if isinstance(value, str | list | tuple | bytes) and len(value) > MAX_SEQUENCE:
            raise self.fail(
                node,
                path,
                f"the expression builds a value of {len(value):,} items",
                "write the value itself; no config needs one this large",
            )
        return value

    def expr(self, node: ast.expr, path: KeyPath) -> Any:
        self.depth += 1
        try:
            if self.depth > MAX_DEPTH:
                raise self.fail(
                    node,
                    path,
                    f"an expression nested more than {MAX_DEPTH} levels deep",
                    "write the value instead of a long expression",
                )
            return self._expr(node, path)
        finally:
            self.depth -= 1

    def _expr(self, node: ast.expr, path: KeyPath) -> Any:
        if isinstance(node, ast.Constant):
            return self.checked(node, path, node.value)
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
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in _NUMERIC_BUILTINS
            and node.func.id not in self.env  # a config that rebinds `int` means its own
            and not node.keywords
            and node.args
        ):
            args = [self.expr(a, path) for a in node.args]
            if all(isinstance(a, int | float) and not isinstance(a, bool) for a in args):
                try:
                    return self.checked(node, path, _NUMERIC_BUILTINS[node.func.id](*args))
                except (TypeError, ValueError, OverflowError):  # int(nan), round(1, 2, 3): keep it symbolic
                    pass
            return self._symbol(node, path)
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            left, right = self.expr(node.left, path), self.expr(node.right, path)
            if (
                not isinstance(left, Symbol)
                and not isinstance(right, Symbol)
                and self._safe(node, path, left, right)
            ):
                try:
                    return self.checked(node, path, _BINOPS[type(node.op)](left, right))
                except (OverflowError, MemoryError):
                    raise self.fail(
                        node, path, "the expression's value is too large", "write a value of realistic size"
                    ) from None
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
            return self.checked(node, path, "".join(parts))
        return self._symbol(node, path)

    def _safe(self, node: ast.BinOp, path: KeyPath, left: Any, right: Any) -> bool:
        """False when computing the operation could take unbounded time or memory (then it stays symbolic,
        or is refused when the size is certain to be absurd)."""
        op = type(node.op)
        if op is ast.Mod and isinstance(left, str | bytes):
            return False  # '%*d' % (10**9, 1) formats a gigabyte; a config never needs it evaluated
        if op is ast.Pow and isinstance(left, int | float) and isinstance(right, int | float):
            if right <= 0 or abs(left) <= 1:
                return True
            bits = right * math.log2(abs(left))
            if bits > MAX_POW_BITS:
                raise self.fail(
                    node,
                    path,
                    f"{shown(self._source(node), 60)} is about 2**{bits:.3g}, larger than any count or size",
                    "write a value of realistic size",
                )
            return True
        if op is ast.Mult:
            for seq, n in ((left, right), (right, left)):
                if (
                    isinstance(seq, str | list | tuple | bytes)
                    and isinstance(n, int)
                    and len(seq) * n > MAX_SEQUENCE
                ):
                    raise self.fail(
                        node,
                        path,
                        f"the expression builds a value of {len(seq) * n:,} items",
                        "write the value itself; no config needs one this large",
                    )
        return True

    def _source(self, node: ast.expr) -> str:
        """The node's source text: a slice of the file (ast offsets are UTF-8 byte offsets), at most
        MAX_SOURCE_SHOWN characters; O(length) per call, unlike ast.get_source_segment (O(file))."""
        end_line, end_col = node.end_lineno, node.end_col_offset
        if end_line is None or end_col is None:
            return type(node).__name__
        start = self.line_starts[node.lineno - 1] + node.col_offset
        end = self.line_starts[end_line - 1] + end_col
        if end - start > MAX_SOURCE_SHOWN:
            head = self.data[start : start + MAX_SOURCE_SHOWN - 3].decode("utf-8", "ignore")
            return head + "..."
        return self.data[start:end].decode("utf-8", "replace")

    def _symbol(self, node: ast.expr, path: KeyPath) -> Symbol:
        source = self._source(node)
        self.symbols[path] = source
        return Symbol(source)
