"""Which library raises a message: read from the libraries' own source, not written by hand.

A pasted `AssertionError: ...` or `RuntimeError: ...` whose frames were cut still names where it was raised when the
message is one a library raises itself. The generator (`python -m zerodoctor.diagnose.library_messages --build`) reads
the installed sources of deepspeed, transformers, accelerate, peft and trl with `ast` (never importing or running
them) and records every `assert cond, <msg>` and `raise <Name>Error(<msg>)` whose message has a static part: the
exception type, package, file:line, function and the message's static fragments (an f-string field, a `.format` /
`%` placeholder or a concatenated value is a hole matched by a lazy wildcard). A message whose static part is too
short or says nothing of its own ("X is not supported") is dropped, so no prose matches by accident; a message two
packages share is dropped too (it names no owner).

`owner_of(exc_type, message)` looks a message up: the fragments are indexed by their rarest word, so a lookup reads
only the few patterns that share a word with the message; the longest static match wins; the data file is read on
the first lookup only (a diagnose run with no exception line never loads it).
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PACKAGES = ("deepspeed", "transformers", "accelerate", "peft", "trl")
# torch's own messages, which the libraries copy or re-raise (`Error(s) in loading state_dict for X:` is torch's
# Module.load_state_dict and transformers' loading report alike): a message torch raises too names no owner. The
# parts of torch that training libraries wrap are read (its top-level modules and these packages), not all of torch.
SHADOW = {"torch": ("nn", "optim", "utils", "cuda", "amp", "distributed", "autograd")}
DATA_FILE = Path(__file__).resolve().parent / "library_messages.json"
_FORMAT = 1

# A message is kept only with this much static text of its own (fewer words or characters match prose)
MIN_WORDS = 4
MIN_CHARS = 20
MIN_OWN_WORDS = 2
# Words that say nothing of their own: a message made only of them ("X is not supported yet") is dropped
_GENERIC_WORDS = """a an and are as at be been but by can cannot could currently did does expected for found from got has have
    if in invalid is it its must no none not of on one only or please provided should so supported that the this
    to type unknown unsupported use used was were when which will with yet you your implemented valid value values
    given argument arguments error passed set same than then there these those"""
_GENERIC = frozenset(_GENERIC_WORDS.split())
# Exception types whose library messages copy Python's own (`'X' object has no attribute 'y'`): no owner in them
_PYTHON_TYPES = frozenset({"AttributeError", "KeyError", "IndexError", "ImportError", "ModuleNotFoundError"})
_WORD = re.compile(r"[A-Za-z]{2,}")
_TOKEN = re.compile(r"\w+")
_SPACE = re.compile(r"\s+")
# placeholders of str.format (`{}`, `{0}`, `{name!r:>10}`) and of %-formatting (`%s`, `%(name)d`, `%.2f`)
_BRACE_FIELD = re.compile(r"\{[^{}]*\}")
_PERCENT_FIELD = re.compile(r"%(?:\([^)]*\))?[-#0 +]*(?:\*|\d+)?(?:\.(?:\*|\d+))?[hlL]?[diouxXeEfFgGcrsa%]")
_HOLE = "\x00"


@dataclass(frozen=True)
class MessageOwner:
    """Where a message is raised: the package, the file inside its package dir, the line and function, the
    package's version the index was read from, and how many other places in that package raise the same message."""

    package: str
    file: str
    line: int
    function: str
    version: str
    other_sites: int = 0

    def location(self) -> str:
        return f"{self.file}:{self.line}"


# --- reading the sources (the generator) -------------------------------------------------------------------------


def _template(node: ast.expr | None) -> str | None:
    """The message with its holes as _HOLE, or None when no part of it is a literal string."""
    if node is None:
        return None
    if isinstance(node, ast.Constant):
        return node.value if isinstance(node.value, str) else None
    if isinstance(node, ast.JoinedStr):
        out = []
        for v in node.values:
            if isinstance(v, ast.Constant) and isinstance(v.value, str):
                out.append(v.value)
            else:
                out.append(_HOLE)
        return "".join(out)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _template(node.left), _template(node.right)
        if left is None and right is None:
            return None
        return (left if left is not None else _HOLE) + (right if right is not None else _HOLE)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod):
        fmt = _template(node.left)
        return (
            None if fmt is None else _PERCENT_FIELD.sub(lambda m: "%" if m.group(0) == "%%" else _HOLE, fmt)
        )
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "format"
        and isinstance(node.func.value, (ast.Constant, ast.JoinedStr, ast.BinOp))
    ):
        fmt = _template(node.func.value)
        if fmt is None:
            return None
        fmt = fmt.replace("{{", "\x01").replace("}}", "\x02")
        return _BRACE_FIELD.sub(_HOLE, fmt).replace("\x01", "{").replace("\x02", "}")
    return None


def _exc_name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _fragments(template: str) -> tuple[list[str], bool, bool]:
    """The static fragments in order, whitespace collapsed; a fragment with under 3 characters of text joins the
    holes around it (`, ` between two fields says nothing and breaks on a wrapped paste). With them: whether a
    hole comes before the first and after the last."""
    segments = template.split(_HOLE)
    kept = [
        (i, text)
        for i, part in enumerate(segments)
        if len((text := _SPACE.sub(" ", part).strip()).replace(" ", "")) >= 3
    ]
    if not kept:
        return [], True, True
    return [t for _, t in kept], kept[0][0] > 0, kept[-1][0] < len(segments) - 1


def _kept(parts: Sequence[str]) -> str | None:
    """None when the static text is specific enough to name its owner, else why it is dropped."""
    text = " ".join(parts)
    words = [w.lower() for w in _WORD.findall(text)]
    if len(words) < MIN_WORDS or len(text.replace(" ", "")) < MIN_CHARS:
        return "short"
    if sum(1 for w in set(words) if w not in _GENERIC and len(w) >= 3) < MIN_OWN_WORDS:
        return "generic"
    return None


@dataclass(frozen=True)
class _Site:
    package: str
    file: str
    line: int
    function: str
    exc: str
    parts: tuple[str, ...]
    holes: tuple[bool, bool]


class _Visitor(ast.NodeVisitor):
    def __init__(self, package: str, file: str) -> None:
        self.package, self.file = package, file
        self.func: list[str] = []
        self.sites: list[tuple[_Site | None, str]] = []

    def _def(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.func.append(node.name)
        self.generic_visit(node)
        self.func.pop()

    visit_FunctionDef = _def
    visit_AsyncFunctionDef = _def

    def _add(self, exc: str, lineno: int, msg: ast.expr | None) -> None:
        template = _template(msg)
        if template is None:
            self.sites.append((None, "no static message"))
            return
        frags, lead, trail = _fragments(template)
        parts = tuple(frags)
        why = _kept(parts)
        func = self.func[-1] if self.func else "<module>"
        site = _Site(self.package, self.file, lineno, func, exc, parts, (lead, trail))
        self.sites.append((site, why or ""))

    def visit_Assert(self, node: ast.Assert) -> None:
        if node.msg is not None:
            self._add("AssertionError", node.lineno, node.msg)
        self.generic_visit(node)

    def visit_Raise(self, node: ast.Raise) -> None:
        exc = node.exc
        if isinstance(exc, ast.Call):
            name = _exc_name(exc.func)
            if name in _PYTHON_TYPES:
                self.sites.append((None, "python type"))
            elif name is not None and name.endswith("Error") and exc.args:
                self._add(name, node.lineno, exc.args[0])
        self.generic_visit(node)


def _package_dir(package: str) -> tuple[Path, str] | None:
    """(the installed package's directory, its version), found without importing it."""
    import importlib.metadata
    import importlib.util

    try:
        version = importlib.metadata.version(package)
        spec = importlib.util.find_spec(package)
    except (importlib.metadata.PackageNotFoundError, ValueError, ImportError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))), version


def _sites(
    package: str, root: Path, under: Sequence[str] | None = None
) -> Iterator[tuple[_Site | None, str]]:
    paths = (
        sorted(root.rglob("*.py"))
        if under is None
        else sorted([*root.glob("*.py"), *(p for d in under for p in (root / d).rglob("*.py"))])
    )
    for path in paths:
        rel = f"{package}/{path.relative_to(root).as_posix()}"
        try:
            tree = ast.parse(path.read_text(encoding="utf-8", errors="replace"), filename=rel)
        except (SyntaxError, ValueError):
            continue
        v = _Visitor(package, rel)
        v.visit(tree)
        yield from v.sites


def build(packages: Iterable[str] = PACKAGES) -> dict[str, Any]:
    """The index's data from the installed packages (deterministic: sorted, no hash-order dependence)."""
    versions: dict[str, str | None] = {}
    stats: dict[str, dict[str, int]] = {}
    groups: dict[tuple[str, tuple[str, ...]], list[_Site]] = {}
    for pkg in packages:
        found = _package_dir(pkg)
        versions[pkg] = found[1] if found else None
        count: Counter[str] = Counter()
        if found is not None:
            for site, why in _sites(pkg, found[0]):
                if site is None or why:
                    count[f"dropped_{why.replace(' ', '_')}"] += 1
                    continue
                count["kept_sites"] += 1
                groups.setdefault((site.exc, tuple(p.lower() for p in site.parts)), []).append(site)
        stats[pkg] = dict(sorted(count.items()))
    shadowed: set[tuple[str, ...]] = set()
    for name, under in sorted(SHADOW.items()):
        found = _package_dir(name)
        versions[name] = found[1] if found else None
        if found is not None:
            shadowed.update(
                tuple(p.lower() for p in s.parts) for s, why in _sites(name, found[0], under) if s
            )
    rows: list[tuple[list[Any], tuple[bool, bool]]] = []
    for (exc, parts), sites in sorted(groups.items()):
        owners = sorted({s.package for s in sites})
        if parts in shadowed:
            for s in sites:
                stats[s.package]["dropped_shared_torch"] = stats[s.package].get("dropped_shared_torch", 0) + 1
            continue
        if len(owners) > 1:  # a message two libraries raise names no owner
            for s in sites:
                stats[s.package]["dropped_shared"] = stats[s.package].get("dropped_shared", 0) + 1
            continue
        first = min(sites, key=lambda s: (s.file, s.line))
        row = [exc, list(first.parts), first.package, first.file, first.line, first.function, len(sites) - 1]
        rows.append((row, first.holes))
    rows.sort(key=lambda r: (r[0][2], r[0][3], r[0][4], r[0][0], r[0][1]))
    # each message is indexed under its rarest word that a message surely holds whole (not touching a hole)
    words = [_inner_tokens(r[1], *holes) for r, holes in rows]
    df: Counter[str] = Counter(w for ws in words for w in set(ws))
    keyed = []
    for (row, _), ws in zip(rows, words, strict=True):
        pkg = str(row[2])
        if not ws:
            stats[pkg]["dropped_no_word"] = stats[pkg].get("dropped_no_word", 0) + 1
            continue
        keyed.append([min(ws, key=lambda w: (df[w], -len(w), w)), *row])
        stats[pkg]["messages"] = stats[pkg].get("messages", 0) + 1
    return {
        "format": _FORMAT,
        "versions": versions,
        "stats": {k: dict(sorted(v.items())) for k, v in stats.items()},
        # [index word, exception, static fragments, package, file, line, function, other sites in the package with it]
        "messages": keyed,
    }


def dumps(data: dict[str, Any]) -> str:
    """The data file's text: one message per line, so a new release's changes read as a small diff."""
    head = {k: v for k, v in data.items() if k != "messages"}
    lines = [json.dumps(r, ensure_ascii=False, separators=(",", ":")) for r in data["messages"]]
    body = json.dumps(head, ensure_ascii=False, sort_keys=True, separators=(",", ":"))[:-1]
    return body + ',"messages":[\n' + ",\n".join(lines) + "\n]}\n"


# --- looking a message up ---------------------------------------------------------------------------------------


def _squash(text: str) -> str:
    """What is compared: lower case, no whitespace (a terminal wrap may add a blank or cut inside a word)."""
    return _SPACE.sub("", text).lower()


def _tokens(text: str) -> set[str]:
    return {t.lower() for t in _TOKEN.findall(text) if len(t) >= 4 and t[0].isalpha()}


def _inner_tokens(parts: Sequence[str], lead: bool, trail: bool) -> list[str]:
    """The fragments' words a message surely holds whole: not touching a hole (a field's value may be glued on)."""
    out: list[str] = []
    for i, part in enumerate(parts):
        toks = list(_TOKEN.finditer(part))
        for j, m in enumerate(toks):
            t = m.group(0)
            if len(t) < 4 or not t[0].isalpha():
                continue
            if j == 0 and m.start() == 0 and (i > 0 or lead):
                continue
            if j == len(toks) - 1 and m.end() == len(part) and (i < len(parts) - 1 or trail):
                continue
            out.append(t.lower())
    return out


class _Index:
    """The committed rows grouped by their index word; a row becomes an owner only when a lookup reads it."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.versions: dict[str, str | None] = data["versions"]
        self.by_word: dict[str, list[list[Any]]] = {}
        for row in data["messages"]:
            self.by_word.setdefault(row[0], []).append(row)
        self._squashed: dict[int, tuple[tuple[str, ...], int]] = {}

    def _parts(self, row: list[Any]) -> tuple[tuple[str, ...], int]:
        got = self._squashed.get(id(row))
        if got is None:
            parts = tuple(_squash(p) for p in row[2])
            got = self._squashed[id(row)] = (parts, sum(len(p) for p in parts))
        return got

    def lookup(self, exc_type: str | None, message: str) -> MessageOwner | None:
        exc = exc_type.rsplit(".", 1)[-1].strip() if exc_type else None
        flat = _squash(message)
        best: list[list[Any]] = []
        best_score = 0
        for word in sorted(_tokens(message)):
            for row in self.by_word.get(word, ()):
                if exc is not None and row[1] != exc:
                    continue
                parts, score = self._parts(row)
                if score < best_score or not _matches(parts, flat):
                    continue
                if score > best_score:
                    best, best_score = [], score
                best.append(row)
        if not best or len({r[3] for r in best}) > 1:
            return None  # (as long a match in two libraries: no owner)
        _, _, _, pkg, file, line, func, others = min(best, key=lambda r: (r[4], r[5]))
        return MessageOwner(pkg, file, line, func, self.versions.get(pkg) or "", others)


def _matches(parts: Sequence[str], flat: str) -> bool:
    pos = 0
    for p in parts:
        i = flat.find(p, pos)
        if i < 0:
            return False
        pos = i + len(p)
    return True


_LOADED: list[_Index] = []


def _index() -> _Index:
    if not _LOADED:
        _LOADED.append(_Index(json.loads(DATA_FILE.read_text(encoding="utf-8"))))
    return _LOADED[0]


def owner_of(exc_type: str | None, message: str) -> MessageOwner | None:
    """Where `message` (an exception's text as printed, with or without `Type: `) is raised in deepspeed,
    transformers, accelerate, peft or trl, when exactly one place (or one package) raises it; `exc_type` (the last
    dotted name counts; None: any) must be the raised type. Deterministic: the longest static match, then the first
    file and line."""
    if not message or len(message) > 100_000:
        return None
    return _index().lookup(exc_type, message)


def indexed_versions() -> dict[str, str | None]:
    """The package versions the committed index was read from (None: not installed when it was built)."""
    return dict(_index().versions)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m zerodoctor.diagnose.library_messages", description=__doc__)
    ap.add_argument(
        "--build", action="store_true", help=f"read the installed sources and write {DATA_FILE.name}"
    )
    ap.add_argument(
        "--output", type=Path, default=DATA_FILE, help="where to write (default: the package's file)"
    )
    args = ap.parse_args(argv)
    if not args.build:
        ap.print_usage()
        return 2
    data = build()
    args.output.write_text(dumps(data), encoding="utf-8")
    for pkg, stats in data["stats"].items():
        print(pkg, data["versions"][pkg] or "not installed", stats)
    for name in SHADOW:
        print(
            name, data["versions"][name] or "not installed", "(read for messages the libraries share with it)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
