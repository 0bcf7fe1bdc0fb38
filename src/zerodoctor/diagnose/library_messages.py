"""Which library raises a message, and in which of its versions: read from the libraries' own source, not by hand.

A pasted `AssertionError: ...` or `RuntimeError: ...` whose frames were cut still names where it was raised when the
message is one a library raises itself. The generator (`python -m zerodoctor.diagnose.library_messages --build
[--archives DIR]`) reads the installed sources of deepspeed, transformers, accelerate, peft, trl, llamafactory and
bitsandbytes, and the published wheels / sdists of their other releases in DIR (downloaded with `pip download
--no-deps`, read member by member with zipfile / tarfile), with `ast`, never importing or running them. It records
every `assert cond, <msg>` and `raise <Name>Error(<msg>)` whose message has a static part: the exception type,
package, file:line, function and the message's static fragments (an f-string field, a `.format` / `%` placeholder or a
concatenated value is a hole matched by a lazy wildcard). One message raised in several releases is one row, placed at
the newest release read that raises it, with the releases that raise it. A message whose static part is too short or
says nothing of its own ("X is not supported") is dropped, so no prose matches by accident; a message two packages
raise (in any of their releases, or torch itself) is dropped too: it names no owner.

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
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PACKAGES = (
    "deepspeed",
    "transformers",
    "accelerate",
    "peft",
    "trl",
    "llamafactory",
    "bitsandbytes",
    "xtuner",
    "openrlhf",
    "swift",
    "verl",
)
# (import name -> distribution name, where they differ)
_DIST = {"swift": "ms-swift"}
# an sdist's top-level folders that the package's build copies into it (DeepSpeed's setup.py: op_builder/ and
# accelerator/ become deepspeed/ops/op_builder/ and deepspeed/accelerator/ in the installed package)
_COPIED = {"deepspeed": {"op_builder": "ops/op_builder/", "accelerator": "accelerator/"}}
# folders whose files no run imports (a package's own tests and examples)
_SKIP_DIRS = frozenset({"tests", "test", "examples", "docs", "benchmarks"})
MAX_MEMBER_BYTES = 2_000_000
_WHEEL_DATA = re.compile(r"^[^/]+\.data/(?:purelib|platlib)/")
# torch's own messages, which the libraries copy or re-raise (`Error(s) in loading state_dict for X:` is torch's
# Module.load_state_dict and transformers' loading report alike): a message torch raises too names no owner. The
# parts of torch that training libraries wrap are read (its top-level modules and these packages), not all of torch.
SHADOW = {"torch": ("nn", "optim", "utils", "cuda", "amp", "distributed", "autograd")}
DATA_FILE = Path(__file__).resolve().parent / "library_messages.json"
_FORMAT = 3

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
    """Where a message is raised: the package, the file inside its package dir, the line and function at `version`
    (the newest release read that raises it), how many other places in that release raise the same message, and
    the releases read that raise it (`versions`: "deepspeed 0.9.5-0.14.4", "deepspeed 0.8.3, 0.10.3-0.19.8")."""

    package: str
    file: str
    line: int
    function: str
    version: str
    other_sites: int = 0
    versions: str = ""

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
        version = importlib.metadata.version(_DIST.get(package, package))
        spec = importlib.util.find_spec(package)
    except (importlib.metadata.PackageNotFoundError, ValueError, ImportError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))), version


def _skipped(rel: str) -> bool:
    """A file the index does not read: not Python, or under a tests/examples/docs folder."""
    return not rel.endswith(".py") or any(part in _SKIP_DIRS for part in rel.split("/")[:-1])


def _installed_files(root: Path, under: Sequence[str] | None = None) -> Iterator[tuple[str, bytes]]:
    """(path inside the package, bytes) of the installed package's Python files, in path order."""
    paths = (
        sorted(root.rglob("*.py"))
        if under is None
        else sorted([*root.glob("*.py"), *(p for d in under for p in (root / d).rglob("*.py"))])
    )
    for path in paths:
        rel = path.relative_to(root).as_posix()
        if not _skipped(rel) and path.is_file() and path.stat().st_size <= MAX_MEMBER_BYTES:
            yield rel, path.read_bytes()


def _archive_name(path: Path) -> tuple[str, str] | None:
    """(distribution name, version) from a wheel's or an sdist's file name (`deepspeed-0.9.5.tar.gz`,
    `trl-0.8.6-py3-none-any.whl`), None for any other file."""
    name = path.name
    if name.endswith(".whl"):
        bits = name[: -len(".whl")].split("-")
        return (_norm(bits[0]), bits[1]) if len(bits) >= 5 else None
    for ext in (".tar.gz", ".zip"):
        if name.endswith(ext):
            stem = name[: -len(ext)]
            dist, _, version = stem.rpartition("-")
            return (_norm(dist), version) if dist and version else None
    return None


def _norm(dist: str) -> str:
    return re.sub(r"[-_.]+", "-", dist).lower()


def _archive_files(path: Path, package: str) -> Iterator[tuple[str, bytes]]:
    """(path inside the package, bytes) of the package's Python files in a wheel or an sdist, read member by member
    (nothing is extracted, imported or run); an sdist's top-level folders that its build copies into the package
    (DeepSpeed's op_builder/ and accelerator/) are read at the place the build puts them."""
    import tarfile
    import zipfile

    roots = {f"{package}/": "", **{f"{k}/": v for k, v in _COPIED.get(package, {}).items()}}
    seen: set[str] = set()

    def place(member: str) -> str | None:
        for root, to in roots.items():
            if member.startswith(root):
                rel = to + member[len(root) :]
                return None if _skipped(rel) or rel in seen else rel
        return None

    if path.name.endswith((".whl", ".zip")):
        with zipfile.ZipFile(path) as zf:
            infos = sorted(zf.infolist(), key=lambda i: i.filename)
            for info in infos:
                # (an sdist zip has one top folder; a wheel none, or its files under `<name>.data/purelib/`)
                member = (
                    _WHEEL_DATA.sub("", info.filename)
                    if path.name.endswith(".whl")
                    else info.filename.partition("/")[2]
                )
                rel = place(member)
                if rel is not None and not info.is_dir() and info.file_size <= MAX_MEMBER_BYTES:
                    seen.add(rel)
                    yield rel, zf.read(info)
        return
    with tarfile.open(path, "r:gz") as tf:
        for ti in sorted(tf.getmembers(), key=lambda t: t.name):
            rel = place(ti.name.partition("/")[2])
            if rel is None or not ti.isreg() or ti.size > MAX_MEMBER_BYTES:
                continue
            fh = tf.extractfile(ti)
            if fh is not None:
                seen.add(rel)
                yield rel, fh.read()


def _parse_sites(
    package: str,
    files: Iterable[tuple[str, bytes]],
    cache: dict[tuple[str, str], list[tuple[_Site | None, str]]],
) -> tuple[list[tuple[_Site | None, str]], str]:
    """Every assert / raise with its verdict, and the sha256 of the files read (path and bytes, in path order). A file
    whose bytes another version already had is not parsed again."""
    import hashlib

    digest = hashlib.sha256()
    out: list[tuple[_Site | None, str]] = []
    for rel, raw in files:
        key = (rel, hashlib.sha256(raw).hexdigest())
        digest.update(f"{rel}\0{key[1]}\n".encode())
        got = cache.get(key)
        if got is None:
            name = f"{package}/{rel}"
            try:
                tree = ast.parse(raw.decode("utf-8", errors="replace"), filename=name)
            except (SyntaxError, ValueError):
                got = []
            else:
                v = _Visitor(package, name)
                v.visit(tree)
                got = v.sites
            cache[key] = got
        out.extend(got)
    return out, digest.hexdigest()


def _site_key(site: _Site) -> tuple[str, tuple[str, ...]]:
    return site.exc, tuple(p.lower() for p in site.parts)


def _part(package: str, version: str, sites: Sequence[tuple[_Site | None, str]]) -> dict[str, Any]:
    """One source's summary: what was kept and dropped, and the sha256 of its kept statements (what a rebuild of
    the same source must reproduce)."""
    import hashlib

    count: Counter[str] = Counter()
    kept = []
    for site, why in sites:
        if site is None or why:
            count[f"dropped_{why.replace(' ', '_')}"] += 1
        else:
            count["kept_sites"] += 1
            kept.append([site.exc, list(site.parts), site.file, site.line, site.function, list(site.holes)])
    text = json.dumps(sorted(kept), ensure_ascii=False, separators=(",", ":"))
    return {
        "name": package,
        "version": version,
        **dict(sorted(count.items())),
        "sites_sha256": hashlib.sha256(text.encode()).hexdigest(),
    }


def _version_key(version: str) -> tuple[Any, ...]:
    from packaging.version import InvalidVersion, Version

    try:
        return (0, Version(version))
    except InvalidVersion:
        return (1, version)


def read_sources(
    packages: Iterable[str] = PACKAGES, archives: Path | None = None
) -> list[tuple[dict[str, Any], list[tuple[_Site | None, str]]]]:
    """The sources the index reads: each installed package, and each wheel / sdist of `packages` in `archives`
    (a version installed too is read from the installed copy). Each with its record (name, version, archive and its
    sha256, or the installed tree's sha256) and its statements."""
    import hashlib

    wanted = list(packages)
    cache: dict[tuple[str, str], list[tuple[_Site | None, str]]] = {}
    out: list[tuple[dict[str, Any], list[tuple[_Site | None, str]]]] = []
    have: set[tuple[str, str]] = set()
    for pkg in wanted:
        found = _package_dir(pkg)
        if found is None:
            continue
        sites, tree_sha = _parse_sites(pkg, _installed_files(found[0]), cache)
        out.append(({**_part(pkg, found[1], sites), "archive": None, "sha256": tree_sha}, sites))
        have.add((pkg, found[1]))
    by_dist = {_norm(_DIST.get(p, p)): p for p in wanted}
    for path in sorted(archives.iterdir()) if archives is not None else ():
        named = _archive_name(path)
        if named is None or named[0] not in by_dist or (by_dist[named[0]], named[1]) in have:
            continue
        pkg, version = by_dist[named[0]], named[1]
        sites, _ = _parse_sites(pkg, _archive_files(path, pkg), cache)
        sha = hashlib.sha256(path.read_bytes()).hexdigest()
        out.append(({**_part(pkg, version, sites), "archive": path.name, "sha256": sha}, sites))
        have.add((pkg, version))
    out.sort(key=lambda s: (s[0]["name"], _version_key(s[0]["version"])))
    return out


def build(
    packages: Iterable[str] = PACKAGES,
    archives: Path | None = None,
    shadow: Mapping[str, Sequence[str]] = SHADOW,
) -> dict[str, Any]:
    """The index's data from the installed packages and the archives (deterministic: sorted, no hash-order
    dependence). One message raised in several versions is one row: its file, line and function at the newest
    version read that raises it, and which versions raise it."""
    wanted = list(packages)
    sources = read_sources(wanted, archives)
    releases: dict[str, list[str]] = {}
    for record, _ in sources:
        releases.setdefault(record["name"], []).append(record["version"])
    # (package, exception, lowered fragments) -> {version's place in the package's releases: its sites}
    groups: dict[tuple[str, str, tuple[str, ...]], dict[int, list[_Site]]] = {}
    for record, sites in sources:
        at = releases[record["name"]].index(record["version"])
        for site, why in sites:
            if site is not None and not why:
                exc, parts = _site_key(site)
                groups.setdefault((site.package, exc, parts), {}).setdefault(at, []).append(site)
    installed: dict[str, str | None] = {}
    for pkg in wanted:
        found = _package_dir(pkg)
        installed[pkg] = found[1] if found else None
    shadowed: set[tuple[str, ...]] = set()
    for name, under in sorted(shadow.items()):
        found = _package_dir(name)
        installed[name] = found[1] if found else None
        if found is not None:
            sites, _ = _parse_sites(name, _installed_files(found[0], under), {})
            shadowed.update(_site_key(s)[1] for s, why in sites if s)
    owners: dict[tuple[str, tuple[str, ...]], set[str]] = {}
    for pkg, exc, parts in groups:
        owners.setdefault((exc, parts), set()).add(pkg)
    stats: dict[str, Counter[str]] = {pkg: Counter() for pkg in releases}
    rows: list[tuple[list[Any], tuple[bool, bool]]] = []
    for (pkg, exc, parts), by_version in sorted(groups.items()):
        if parts in shadowed:
            stats[pkg]["dropped_shared_torch"] += 1
            continue
        if len(owners[(exc, parts)]) > 1:  # a message two libraries raise (in any versions) names no owner
            stats[pkg]["dropped_shared"] += 1
            continue
        newest = max(by_version)
        first = min(by_version[newest], key=lambda s: (s.file, s.line))
        mask = sum(1 << i for i in by_version)
        row: list[Any] = [
            exc,
            list(first.parts),
            pkg,
            first.file,
            first.line,
            first.function,
            len(by_version[newest]) - 1,
            mask,
        ]
        rows.append((row, first.holes))
    rows.sort(key=lambda r: (r[0][2], r[0][3], r[0][4], r[0][0], r[0][1]))
    # each message is indexed under its rarest word that a message surely holds whole (not touching a hole)
    words = [_inner_tokens(r[1], *holes) for r, holes in rows]
    df: Counter[str] = Counter(w for ws in words for w in set(ws))
    keyed = []
    per_version: Counter[tuple[str, int]] = Counter()
    for (row, _), ws in zip(rows, words, strict=True):
        pkg = str(row[2])
        if not ws:
            stats[pkg]["dropped_no_word"] += 1
            continue
        keyed.append([min(ws, key=lambda w: (df[w], -len(w), w)), *row])
        stats[pkg]["messages"] += 1
        for i in range(len(releases[pkg])):
            if int(row[7]) >> i & 1:
                per_version[(pkg, i)] += 1
    records = []
    for record, _ in sources:
        at = releases[record["name"]].index(record["version"])
        records.append({**record, "messages": per_version[(record["name"], at)]})
    return {
        "format": _FORMAT,
        "installed": installed,
        "releases": releases,
        "sources": records,
        "stats": {k: dict(sorted(v.items())) for k, v in sorted(stats.items())},
        # [index word, exception, static fragments, package, file, line, function, other sites in the package with
        #  it at that version, the package's releases (bit i: releases[package][i]) that raise it]; file, line and
        #  function are the newest release's
        "messages": keyed,
    }


def encode_row(row: Sequence[Any]) -> str:
    """A message row as the data file holds it: one string, its fields and then its fragments tab-separated (fragments
    hold no tab: their whitespace is collapsed), so that loading the file builds one object per message, not a
    dozen; a row is split only when a lookup reads it."""
    word, exc, parts, pkg, file, line, func, others, mask = row
    return "\t".join([word, exc, pkg, file, str(line), func, str(others), str(mask), *parts])


def decode_row(text: str) -> list[Any]:
    """[index word, exception, fragments, package, file, line, function, other sites, releases mask] of a file row."""
    word, exc, pkg, file, line, func, others, mask, *parts = text.split("\t")
    return [word, exc, parts, pkg, file, int(line), func, int(others), int(mask)]


def dumps(data: dict[str, Any]) -> str:
    """The data file's text: one message or source per line, so a new release's changes read as a small diff."""
    head = {k: v for k, v in data.items() if k not in ("messages", "sources")}
    body = json.dumps(head, ensure_ascii=False, sort_keys=True, separators=(",", ":"))[:-1]
    sources = [
        json.dumps(r, ensure_ascii=False, sort_keys=True, separators=(",", ":")) for r in data["sources"]
    ]
    lines = [json.dumps(encode_row(r), ensure_ascii=False) for r in data["messages"]]
    return body + ',"sources":[\n' + ",\n".join(sources) + '\n],"messages":[\n' + ",\n".join(lines) + "\n]}\n"


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
        self.releases: dict[str, list[str]] = data["releases"]
        self.by_word: dict[str, list[str]] = {}
        for text in data["messages"]:
            self.by_word.setdefault(text[: text.index("\t")], []).append(text)
        self._rows: dict[str, tuple[list[Any], tuple[str, ...], int]] = {}

    def _row(self, text: str) -> tuple[list[Any], tuple[str, ...], int]:
        """The row, its fragments squashed, their length: split on the first lookup that reads it."""
        got = self._rows.get(text)
        if got is None:
            row = decode_row(text)
            parts = tuple(_squash(p) for p in row[2])
            got = self._rows[text] = (row, parts, sum(len(p) for p in parts))
        return got

    def lookup(self, exc_type: str | None, message: str) -> MessageOwner | None:
        exc = exc_type.rsplit(".", 1)[-1].strip() if exc_type else None
        flat = _squash(message)
        best: list[list[Any]] = []
        # (a whole match beats a cut one; then the longer static text held)
        best_score = (False, 0)
        for word in sorted(_tokens(message)):
            for text in self.by_word.get(word, ()):
                row, parts, total = self._row(text)
                if exc is not None and row[1] != exc:
                    continue
                if (True, total) < best_score:
                    continue
                held = _matched(parts, flat, total)
                score = (held == total, held)
                if held < 0 or score < best_score:
                    continue
                if score > best_score:
                    best, best_score = [], score
                best.append(row)
        if not best or len({r[3] for r in best}) > 1:
            return None  # (as long a match in two libraries: no owner)
        _, _, _, pkg, file, line, func, others, mask = min(best, key=lambda r: (r[4], r[5]))
        read = self.releases.get(pkg, [])
        bits = [i for i in range(len(read)) if mask >> i & 1]
        newest = read[bits[-1]] if bits else ""
        return MessageOwner(
            pkg, file, line, func, newest, others, f"{pkg} {version_ranges(read, bits)}".strip()
        )


def version_ranges(releases: Sequence[str], at: Sequence[int]) -> str:
    """The releases at the places `at` (sorted) as runs of consecutive reads: "0.9.5-0.14.4, 0.16.9"."""
    runs: list[list[int]] = []
    for i in at:
        if runs and runs[-1][1] == i - 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ", ".join(releases[a] if a == b else f"{releases[a]}-{releases[b]}" for a, b in runs)


# A text that ends inside a message (a log line or an event clipped at a few hundred characters) still matches when
# it holds this much of the message's static text, in order, up to its last character
CUT_MIN_CHARS = 80
CUT_MIN_SHARE = 0.6


def _matched(parts: Sequence[str], flat: str, total: int) -> int:
    """How much of the fragments' static text `flat` holds in order: `total` when whole, the part up to `flat`'s end
    when `flat` is cut inside a fragment and holds enough of it (CUT_MIN_*), else -1."""
    pos = 0
    for k, p in enumerate(parts):
        i = flat.find(p, pos)
        if i >= 0:
            pos = i + len(p)
            continue
        held = sum(len(q) for q in parts[:k])
        # (the text's tail is the start of this fragment: the longest such tail)
        for j in range(max(pos, len(flat) - len(p) + 1), len(flat)):
            if p.startswith(flat[j:]):
                held += len(flat) - j
                break
        else:
            return -1
        return held if held >= CUT_MIN_CHARS and held >= CUT_MIN_SHARE * total else -1
    return total


_LOADED: list[_Index] = []


def _index() -> _Index:
    if not _LOADED:
        _LOADED.append(_Index(json.loads(DATA_FILE.read_text(encoding="utf-8"))))
    return _LOADED[0]


def owner_of(exc_type: str | None, message: str) -> MessageOwner | None:
    """Where `message` (an exception's text as printed, with or without `Type: `) is raised in one of the indexed
    packages, and in which of their releases, when exactly one place (or one package) raises it; `exc_type` (the last
    dotted name counts; None: any) must be the raised type. Deterministic: the longest static match, then the first
    file and line."""
    if not message or len(message) > 100_000:
        return None
    return _index().lookup(exc_type, message)


def indexed_versions() -> dict[str, tuple[str, ...]]:
    """The releases of each package the committed index was read from, oldest first."""
    return {pkg: tuple(v) for pkg, v in _index().releases.items()}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m zerodoctor.diagnose.library_messages", description=__doc__)
    ap.add_argument(
        "--build", action="store_true", help=f"read the installed sources and write {DATA_FILE.name}"
    )
    ap.add_argument(
        "--archives",
        type=Path,
        help="a folder of the packages' wheels / sdists (`pip download --no-deps`) to read beside the installed ones",
    )
    ap.add_argument(
        "--output", type=Path, default=DATA_FILE, help="where to write (default: the package's file)"
    )
    args = ap.parse_args(argv)
    if not args.build:
        ap.print_usage()
        return 2
    if args.archives is not None and not args.archives.is_dir():
        print(f"error: --archives {args.archives}: not a folder; pass the folder `pip download -d` wrote")
        return 2
    data = build(archives=args.archives)
    args.output.write_text(dumps(data), encoding="utf-8")
    for record in data["sources"]:
        print(record["name"], record["version"], record["archive"] or "(installed)", record["messages"])
    for pkg, stats in data["stats"].items():
        print(pkg, stats)
    for name in SHADOW:
        print(
            name,
            data["installed"][name] or "not installed",
            "(read for messages the libraries share with it)",
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
