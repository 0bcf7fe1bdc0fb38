"""The one input and output layer every reader and writer goes through.

Whatever a user hands zerodoctor ends in data or in one `InputError` line (file:line:col, what is wrong,
what to do); never a traceback, a hang, a blown memory or a harmed file:

- `read_bytes` / `read_text`: bounded reads. Regular files up to a size cap; a FIFO or process
  substitution is streamed up to the same cap (a FIFO nobody writes to reads as empty instead of blocking);
  "-" reads stdin; directories, character and block devices (`/dev/zero`) and sockets are refused; a path
  longer than the file system allows is an error naming it. Text must be UTF-8 (a BOM is dropped); the error
  names the byte offset and line of the first bad byte.
- `load_json` / `compose_yaml`: depth and node limits (YAML aliases counted as expanded, so a "billion
  laughs" bomb stops at the limit in milliseconds; a recursive alias is an error), libyaml's C parser where
  PyYAML has it, and numbers checked where they are read: NaN, infinities, integers over Python's
  4,300-digit conversion limit and magnitudes over `MAX_MAGNITUDE` are errors naming file:line and key.
- `count_arg` / `gib_arg`: argparse types for counts and sizes that refuse inf, NaN and absurd values.
- `output_path`, `write_new`, `replace_with_backup`, `check_replaceable` + `replace_file`: a path ending in
  "/" or naming a directory is a directory; a new file is created exclusively (never over an existing one); an
  in-place rewrite keeps a backup and replaces the file atomically; a file zerodoctor wrote earlier (its own
  mark at the start) is replaced atomically, anything else (a user's file, a link) is refused.
"""

from __future__ import annotations

import argparse
import errno
import gc
import json
import math
import os
import re
import stat
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from zerodoctor.errors import InputError

KeyPath = tuple[str, ...]

MAX_CONFIG_BYTES = 2 * 2**20
"""Config files (DeepSpeed/HF/LLaMA-Factory/accelerate/XTuner, model config.json, env snapshots). Real ones are
a few KB; the largest bundled model config.json is under 10 KB."""
MAX_DEPTH = 64
"""Nesting of JSON/YAML/Python values. Real configs nest 4 or 5 deep."""
MAX_NODES = 200_000
"""Values in one YAML document, aliases counted as expanded (a YAML alias bomb grows 9x per level)."""
MAX_MAGNITUDE = 2**100
"""Largest number accepted in a config (about 1.3e30). It admits transformers' "no limit" sentinel
`int(1e30)` (VERY_LARGE_INTEGER, written into configs as 1000000000000000019884624838656) and refuses what
no count or size can be: arithmetic on it later must not overflow a float."""
MAX_INT_DIGITS = 4300
"""Python's default `sys.get_int_max_str_digits()`: a longer decimal integer cannot even be converted."""
MAX_COUNT = 2**53
"""Largest count an option accepts (exact as a float, far above any real GPU, node or sample count)."""
MAX_GIB = 2.0**20
"""Largest memory size an option accepts, in GiB (1 PiB)."""
STDIN = "-"


# ---- paths and bounded reads -------------------------------------------------------------------------


def shown(path: str | Path, limit: int = 120) -> str:
    """A path short enough for a one-line message (an overlong one keeps its start and its end)."""
    s = str(path)
    return s if len(s) <= limit else f"{s[: limit // 2]}...{s[-(limit // 2 - 3) :]}"


def _os_error(path: str | Path, err: OSError, what: str) -> InputError:
    p = shown(path)
    if err.errno == errno.ENOENT:
        return InputError(p, "no such file", hint="check the path")
    if err.errno == errno.ENAMETOOLONG:
        return InputError(
            p,
            f"the path ({len(str(path))} characters) is longer than the file system allows",
            hint="use a shorter path",
        )
    if err.errno == errno.ELOOP:
        return InputError(p, "a symbolic link that points to itself (a loop)", hint="fix the link")
    if err.errno == errno.EISDIR:
        return InputError(p, f"is a directory, not {what}")
    if err.errno in (errno.EACCES, errno.EPERM):
        return InputError(p, "permission denied", hint="check the file's permissions")
    if err.errno == errno.ENOTDIR:
        return InputError(p, "a part of the path is a file, not a directory", hint="check the path")
    return InputError(p, f"cannot read: {err.strerror or err}")


def _too_big(path: str | Path, size: int | None, limit: int, what: str) -> InputError:
    found = f" ({size / 2**20:.1f} MiB)" if size is not None else ""
    return InputError(
        shown(path),
        f"larger than the {limit / 2**20:g} MiB zerodoctor reads as {what}{found}",
        hint=f"check that this is {what}: no real one is this large",
    )


def check_readable(path: str | Path, *, what: str = "a config file") -> os.stat_result:
    """stat() the path (following links) and refuse anything that is not a regular file or a pipe."""
    try:
        st = os.stat(path)
    except OSError as err:
        raise _os_error(path, err, what) from None
    mode = st.st_mode
    if stat.S_ISDIR(mode):
        raise InputError(shown(path), f"is a directory, not {what}", hint="name the file inside it")
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        raise InputError(
            shown(path), f"is a device, not {what}", hint="pass the path of a regular file (or a pipe)"
        )
    if stat.S_ISSOCK(mode):
        raise InputError(
            shown(path), f"is a socket, not {what}", hint="pass the path of a regular file (or a pipe)"
        )
    return st


def _read_stream(fd: int, path: str | Path, limit: int, what: str) -> bytes:
    chunks: list[bytes] = []
    total = 0
    while True:
        try:
            chunk = os.read(fd, min(1 << 20, limit + 1 - total))
        except BlockingIOError:  # a writer is attached but has written nothing yet: wait for it
            import select

            select.select([fd], [], [])
            continue
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        total += len(chunk)
        if total > limit:
            raise _too_big(path, None, limit, what)


def read_bytes(path: str | Path, *, limit: int = MAX_CONFIG_BYTES, what: str = "a config file") -> bytes:
    """The bytes of a regular file, a pipe or stdin ("-"), at most `limit` of them; InputError otherwise.

    A FIFO is opened without blocking: with no writer it reads as empty (POSIX read() returns 0 when no
    process has the FIFO open for writing) instead of waiting forever.
    """
    if str(path) == STDIN:
        try:
            return _read_stream(sys.stdin.buffer.fileno(), "<stdin>", limit, what)
        except (OSError, ValueError, AttributeError) as err:  # stdin closed, or not a real file
            raise InputError("<stdin>", f"cannot read {what} from stdin: {err}") from None
    st = check_readable(path, what=what)
    if stat.S_ISREG(st.st_mode) and st.st_size > limit:
        raise _too_big(path, st.st_size, limit, what)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as err:
        raise _os_error(path, err, what) from None
    try:
        os.set_blocking(fd, stat.S_ISREG(st.st_mode))
        return _read_stream(fd, path, limit, what)
    except OSError as err:
        raise _os_error(path, err, what) from None
    finally:
        os.close(fd)


def decode_utf8(raw: bytes, path: str | Path) -> str:
    """UTF-8 text (a leading BOM dropped); the error names the offset and line of the first bad byte."""
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        start = exc.start + (3 if raw.startswith(b"\xef\xbb\xbf") else 0)
        line = raw[:start].count(b"\n") + 1
        raise InputError(
            shown(path),
            f"not valid UTF-8: byte 0x{raw[start]:02x} at offset {start}",
            line=line,
            hint="save the file as UTF-8",
        ) from None


def read_text(path: str | Path, *, limit: int = MAX_CONFIG_BYTES, what: str = "a config file") -> str:
    """`read_bytes` + `decode_utf8`, refusing binary data (a NUL byte in the first 8 KiB). UTF-16 text with its
    byte-order mark (what Windows PowerShell 5.1's `>` and Notepad's "Unicode" write) is decoded."""
    raw = read_bytes(path, limit=limit, what=what)
    if raw[:2] in (b"\xff\xfe", b"\xfe\xff"):
        try:
            return raw.decode("utf-16")
        except UnicodeDecodeError as exc:
            raise InputError(
                shown(path),
                f"not valid UTF-16: bad code unit at offset {exc.start}",
                line=raw.decode("utf-16", "replace").count("\n", 0, exc.start // 2) + 1,
                hint="save the file as UTF-8",
            ) from None
    if b"\x00" in raw[:8192]:
        raise InputError(
            shown(path),
            f"is a binary file, not {what} (NUL bytes in its first 8 KiB)",
            hint="give the text file; if it is text saved as UTF-16 without a byte-order mark, convert it: "
            "iconv -f UTF-16LE -t UTF-8 FILE > FILE.new",
        )
    return decode_utf8(raw, path)


# ---- numbers -------------------------------------------------------------------------------------------


def number_problem(value: Any) -> str | None:
    """Why a number read from a config cannot be used, or None. Bools and non-numbers are fine here."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, float):
        if math.isnan(value):
            return "is NaN (not a number)"
        if math.isinf(value):
            return "is infinite (a number too large for a float, such as 1e999, reads as infinity)"
    if abs(value) > MAX_MAGNITUDE:
        digits = len(str(abs(int(value)))) if isinstance(value, float) or value.bit_length() < 14000 else 0
        size = f"a {digits}-digit number" if digits else "a number of thousands of digits"
        return f"is {size}, larger than any count or size a training run can use"
    return None


def count_arg(text: str) -> int:
    """argparse type: a whole number from 1 to MAX_COUNT (refuses inf, NaN, 1e999 and 5,000-digit input)."""
    s = text.strip()
    if len(s.lstrip("+-").lstrip("0")) > 20:
        raise argparse.ArgumentTypeError(f"expected a whole number up to {MAX_COUNT}, got {shown(s, 40)!r}")
    try:
        value = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {shown(text, 40)!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a number above 0, got {value}")
    if value > MAX_COUNT:
        raise argparse.ArgumentTypeError(f"expected a whole number up to {MAX_COUNT}, got {shown(s, 40)}")
    return value


MAX_SECONDS = 1e7  # about 116 days; also the most a timer takes (faulthandler overflows near 1e12 s)


def positive_arg(text: str) -> float:
    """argparse type: a number above 0 and at most MAX_SECONDS (a number of seconds, a factor)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {shown(text, 40)!r}") from None
    if not math.isfinite(value) or value <= 0 or value > MAX_SECONDS:
        raise argparse.ArgumentTypeError(
            f"expected a number above 0 and up to {MAX_SECONDS:,.0f}, got {shown(text, 40)!r}"
        )
    return value


def gib_arg(text: str) -> float:
    """argparse type: a memory size in GiB, finite, above 0 and at most MAX_GIB."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a size in GiB, got {shown(text, 40)!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite size in GiB, got {shown(text, 40)!r}")
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a size above 0 GiB, got {value:g}")
    if value > MAX_GIB:
        raise argparse.ArgumentTypeError(f"expected a size up to {MAX_GIB:g} GiB, got {value:g}")
    return value


# ---- JSON ----------------------------------------------------------------------------------------------


class _Bad:
    """Placeholder for a number the JSON hooks refused; found afterwards to name its key."""

    __slots__ = ("problem", "token")

    def __init__(self, token: str, problem: str) -> None:
        self.token = token
        self.problem = problem


def _walk(data: Any) -> Iterator[tuple[KeyPath, Any, int]]:
    """Every (key path, value, depth) of nested dicts and lists, iteratively (no recursion limit)."""
    stack: list[tuple[KeyPath, Any, int]] = [((), data, 0)]
    while stack:
        path, value, depth = stack.pop()
        yield path, value, depth
        if isinstance(value, dict):
            stack.extend(((*path, str(k)), v, depth + 1) for k, v in reversed(list(value.items())))
        elif isinstance(value, list):
            stack.extend(((*path, str(i)), v, depth + 1) for i, v in reversed(list(enumerate(value))))


def _too_deep(path: str | Path, line: int | None = None) -> InputError:
    return InputError(
        shown(path),
        f"values nested more than {MAX_DEPTH} levels deep",
        line=line,
        hint="no training config nests this deep; check that the file is the config you meant",
    )


def load_json(
    text: str,
    path: str | Path,
    *,
    locate: Callable[[KeyPath], tuple[int, int] | None] | None = None,
) -> Any:
    """`json.loads` with the limits of this module. `locate(key_path)` -> (line, column) names where a
    refused number is; without it the error gives the line of the number's first spelling in the text."""
    bad: list[_Bad] = []

    def on_int(s: str) -> Any:
        if len(s) > MAX_INT_DIGITS:
            out = _Bad(s, f"is a {len(s.lstrip('-'))}-digit integer (Python reads at most {MAX_INT_DIGITS})")
            bad.append(out)
            return out
        return _checked(s, int(s))

    def on_float(s: str) -> Any:
        return _checked(s, float(s))

    def on_constant(s: str) -> Any:
        return _checked(s, float(s))

    def _checked(s: str, value: int | float) -> Any:
        problem = number_problem(value)
        if problem:
            out = _Bad(s, problem)
            bad.append(out)
            return out
        return value

    try:
        data = json.loads(text, parse_int=on_int, parse_float=on_float, parse_constant=on_constant)
    except json.JSONDecodeError as exc:
        raise InputError(
            shown(path),
            f"invalid JSON: {exc.msg}",
            line=exc.lineno,
            column=exc.colno,
            hint="fix the syntax (JSON allows no comments and no trailing commas)",
        ) from None
    except RecursionError:
        raise _too_deep(path) from None
    first_bad: tuple[KeyPath, _Bad] | None = None
    for key, value, depth in _walk(data):
        if depth > MAX_DEPTH:
            raise _too_deep(path)  # before locating anything: a locator may recurse
        if first_bad is None and isinstance(value, _Bad):
            first_bad = (key, value)
    if first_bad is not None:
        key, found = first_bad
        raise _number_error(path, text, key, found.token, found.problem, locate)
    return data


def _number_error(
    path: str | Path,
    text: str,
    key: KeyPath,
    token: str,
    problem: str,
    locate: Callable[[KeyPath], tuple[int, int] | None] | None,
) -> InputError:
    where = locate(key) if locate else None
    if where is None:
        at = text.find(token)
        where = (text.count("\n", 0, at) + 1, at - text.rfind("\n", 0, at)) if at >= 0 else None
    name = ".".join(key) or "the value"
    return InputError(
        shown(path),
        f"{name}: {shown(token, 40)} {problem}",
        line=where[0] if where else None,
        column=where[1] if where else None,
        hint="write a finite number of realistic size",
    )


# ---- YAML ----------------------------------------------------------------------------------------------


def yaml_loader_class() -> Any:
    """libyaml's C loader when PyYAML was built with it (10-20x faster), else the pure-Python one."""
    import yaml

    return yaml.CSafeLoader if getattr(yaml, "__with_libyaml__", False) else yaml.SafeLoader


def _yaml_error(path: str | Path, text: str, exc: Exception) -> InputError:
    import yaml

    if isinstance(exc, yaml.reader.ReaderError):
        pos = max(0, min(exc.position, len(text)))
        line = text.count("\n", 0, pos) + 1
        col = pos - text.rfind("\n", 0, pos)
        char = exc.character if isinstance(exc.character, int) else ord(str(exc.character)[:1] or "\0")
        return InputError(
            shown(path),
            f"invalid YAML: character 0x{char:02x}: {exc.reason}",
            line=line,
            column=col,
            hint="remove the control character (YAML allows tab, newline and printable text)",
        )
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        what = (exc.problem or exc.context or "syntax error").splitlines()[0]
        if "nesting depth" in what:
            # PyYAML >= 6.0.4 stops deep nesting in its scanner, before this module's own depth limit is reached
            return _too_deep(path, mark.line + 1 if mark else None)
        return InputError(
            shown(path),
            f"invalid YAML: {what}",
            line=mark.line + 1 if mark else None,
            column=mark.column + 1 if mark else None,
            hint="fix the syntax (indentation, a missing ':' or an unclosed quote)",
        )
    first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return InputError(shown(path), f"invalid YAML: {first}")


def compose_yaml(text: str, path: str | Path) -> tuple[Any, Any]:
    """(loader, root node or None) for a single YAML document, composed iteratively from the parser's
    events so that nesting, expanded size and recursive aliases are checked before anything is built.
    The caller constructs with `loader.construct_document(node)` and must `loader.dispose()`."""
    import yaml

    loader = yaml_loader_class()(text)
    enabled = gc.isenabled()
    gc.disable()  # composing creates many small objects; collections during it cost more than it does
    try:
        root = _compose(loader, path)
    except yaml.YAMLError as exc:
        loader.dispose()
        raise _yaml_error(path, text, exc) from None
    except InputError:
        loader.dispose()
        raise
    finally:
        if enabled:
            gc.enable()
    return loader, root


def _compose(loader: Any, path: str | Path) -> Any:
    import yaml

    def error(message: str, mark: Any, hint: str) -> InputError:
        return InputError(
            shown(path),
            message,
            line=mark.line + 1 if mark else None,
            column=mark.column + 1 if mark else None,
            hint=hint,
        )

    loader.get_event()  # StreamStart
    if loader.check_event(yaml.StreamEndEvent):
        loader.get_event()
        return None
    loader.get_event()  # DocumentStart
    anchors: dict[str, tuple[Any, int]] = {}  # name -> (node, expanded size)
    open_anchors: set[str] = set()
    # each frame: [node, children, anchor, expanded size so far]
    stack: list[list[Any]] = []
    root: Any = None
    expanded = 0

    def attach(node: Any, size: int) -> None:
        nonlocal root
        if stack:
            stack[-1][1].append(node)
            stack[-1][3] += size
        else:
            root = node

    while root is None:
        event = loader.get_event()
        if isinstance(event, yaml.AliasEvent):
            name = event.anchor
            if name in open_anchors:
                raise error(
                    f"recursive alias *{name}: the value contains itself",
                    event.start_mark,
                    "a config value cannot contain itself; copy the values instead",
                )
            if name not in anchors:
                raise error(
                    f"invalid YAML: alias *{name} names no anchor defined before it",
                    event.start_mark,
                    f"define &{name} before using *{name}",
                )
            node, size = anchors[name]
            expanded += size
            if expanded > MAX_NODES:
                raise error(
                    f"aliases expand to more than {MAX_NODES:,} values (an alias bomb?)",
                    event.start_mark,
                    "no training config is this large; check the file",
                )
            attach(node, size)
        elif isinstance(event, yaml.ScalarEvent):
            tag = event.tag
            if tag is None or tag == "!":
                tag = loader.resolve(yaml.ScalarNode, event.value, event.implicit)
            node = yaml.ScalarNode(tag, event.value, event.start_mark, event.end_mark, style=event.style)
            expanded += 1
            if expanded > MAX_NODES:
                raise error(
                    f"more than {MAX_NODES:,} values", event.start_mark, "no training config is this large"
                )
            if event.anchor is not None:
                anchors[event.anchor] = (node, 1)
            attach(node, 1)
        elif isinstance(event, yaml.SequenceStartEvent | yaml.MappingStartEvent):
            is_seq = isinstance(event, yaml.SequenceStartEvent)
            cls = yaml.SequenceNode if is_seq else yaml.MappingNode
            tag = event.tag
            if tag is None or tag == "!":
                tag = loader.resolve(cls, None, event.implicit)
            node = cls(tag, [], event.start_mark, None, flow_style=event.flow_style)
            expanded += 1
            if len(stack) >= MAX_DEPTH:
                raise error(
                    f"values nested more than {MAX_DEPTH} levels deep",
                    event.start_mark,
                    "no training config nests this deep; check that the file is the config you meant",
                )
            if event.anchor is not None:
                open_anchors.add(event.anchor)
            stack.append([node, [], event.anchor, 1])
        elif isinstance(event, yaml.SequenceEndEvent | yaml.MappingEndEvent):
            node, children, anchor, size = stack.pop()
            node.end_mark = event.end_mark
            if isinstance(node, yaml.MappingNode):
                node.value = list(zip(children[0::2], children[1::2], strict=True))
            else:
                node.value = children
            if anchor is not None:
                open_anchors.discard(anchor)
                anchors[anchor] = (node, size)
            attach(node, size)
        else:  # pragma: no cover - the parser yields nothing else inside a document
            raise error(
                f"invalid YAML: unexpected {type(event).__name__}", event.start_mark, "fix the syntax"
            )
    loader.get_event()  # DocumentEnd
    if not loader.check_event(yaml.StreamEndEvent):
        event = loader.get_event()
        raise error(
            "invalid YAML: more than one document (a '---' separator)",
            event.start_mark,
            "keep one document per config file",
        )
    return root


_INT_TAG = "tag:yaml.org,2002:int"
_FLOAT_TAG = "tag:yaml.org,2002:float"


def check_yaml_scalar(loader: Any, node: Any, key: KeyPath, path: str | Path) -> None:
    """Refuse an int or float scalar that `number_problem` refuses (or that Python cannot convert)."""
    problem: str | None
    if node.tag == _INT_TAG:
        digits = re.sub(r"[^0-9]", "", node.value)
        if not node.value.lstrip("+-").startswith("0") and len(digits) > MAX_INT_DIGITS:
            problem = f"is a {len(digits)}-digit integer (Python reads at most {MAX_INT_DIGITS})"
        else:
            problem = _try_number(loader.construct_yaml_int, node)
    elif node.tag == _FLOAT_TAG:
        problem = _try_number(loader.construct_yaml_float, node)
    else:
        return
    if problem:
        raise InputError(
            shown(path),
            f"{'.'.join(key) or 'the value'}: {shown(node.value, 40)} {problem}",
            line=node.start_mark.line + 1,
            column=node.start_mark.column + 1,
            hint="write a finite number of realistic size",
        )


def _try_number(construct: Callable[[Any], Any], node: Any) -> str | None:
    try:
        return number_problem(construct(node))
    except ValueError as err:  # e.g. Python's digit limit on an unusual spelling
        return f"cannot be read as a number ({str(err).split(';')[0]})"


# ---- writing -------------------------------------------------------------------------------------------


def output_path(path: str | Path, default_name: str) -> Path:
    """Where to write: a path ending in "/" or naming an existing directory means `default_name` inside
    it (the directory is created when the path ends in "/" and only its last part is missing)."""
    s = str(path)
    p = Path(s)
    try:
        if s.endswith(("/", os.sep)):
            if not p.exists():
                if not p.parent.is_dir():
                    raise InputError(
                        shown(p.parent), "no such directory", hint="create it or choose another path"
                    )
                p.mkdir()
            return p / default_name
        if p.is_dir():
            return p / default_name
    except OSError as err:
        raise _os_error(s, err, "a directory") from None
    return p


def write_new(path: Path, text: str) -> Path:
    """Create `path` with `text`; refuses to replace anything that exists (InputError)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
    except FileExistsError:
        raise InputError(
            shown(path),
            "already exists; not overwriting it",
            hint="choose a new file name or move the file away",
        ) from None
    except OSError as err:
        if err.errno == errno.ENOENT:
            raise InputError(
                shown(path.parent), "no such directory", hint="create it or choose another path"
            ) from None
        raise _write_error(path, err) from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
    except OSError as err:
        path.unlink(missing_ok=True)  # no half-written file left behind
        raise _write_error(path, err) from None
    return path


def write_free(path: Path, text: str, *, tries: int = 999) -> Path:
    """Write to `path`, or to NAME.2.EXT, NAME.3.EXT... when it exists: never over an existing file."""
    for i in range(1, tries + 1):
        candidate = path if i == 1 else path.with_name(f"{path.stem}.{i}{path.suffix}")
        try:
            return write_new(candidate, text)
        except InputError as err:
            if "already exists" not in str(err):
                raise
    raise InputError(shown(path), "too many earlier copies next to this file", hint="remove old copies")


OWNED_HEAD_BYTES = 4096
"""How much of an existing file `check_replaceable`'s `owned` test reads (zerodoctor's marks are at the start)."""


def check_replaceable(path: Path, owned: Callable[[bytes], bool], *, hint: str) -> None:
    """Refuse (InputError) to write `path` unless it does not exist or is a regular file (not a symbolic link)
    whose first OWNED_HEAD_BYTES `owned` accepts: a file zerodoctor wrote there before. A link, a directory,
    a device or a file of the user's is never written over or through."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as err:
        raise _os_error(path, err, "a file") from None
    if stat.S_ISLNK(st.st_mode):
        raise InputError(shown(path), "is a symbolic link; not writing through it", hint=hint)
    if not stat.S_ISREG(st.st_mode):
        raise InputError(shown(path), "exists and is not a regular file; not writing over it", hint=hint)
    try:
        with open(path, "rb") as fh:
            head = fh.read(OWNED_HEAD_BYTES)
    except OSError as err:
        raise _os_error(path, err, "a file") from None
    if not owned(head):
        raise InputError(
            shown(path), "already exists and was not written by zerodoctor; not overwriting it", hint=hint
        )


def replace_file(path: Path, data: bytes) -> Path:
    """Write `data` to a temporary file beside `path` and move it over `path` atomically: a reader never sees
    half a file, and a symbolic link at `path` would be replaced, not written through. Check first with
    `check_replaceable` or `write_new`: this replaces whatever is there."""
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as err:
        raise _write_error(path, err) from None
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except OSError as err:
        Path(tmp).unlink(missing_ok=True)
        raise _write_error(path, err) from None
    return path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _write_error(path: Path, err: OSError) -> InputError:
    if err.errno == errno.ENAMETOOLONG:
        return _os_error(path, err, "a file")
    return InputError(shown(path), f"cannot write: {err.strerror or err}")


def replace_with_backup(path: Path, text: str) -> Path:
    """Rewrite the user's file in place: first a backup (FILE.bak, or FILE.bak.2... never over an earlier
    one), then the new text written beside it and moved over the file atomically, keeping its mode. A
    symbolic link is followed, so the link stays a link. Returns the backup's path."""
    target = Path(os.path.realpath(path))
    try:
        original = target.read_bytes()
        mode = stat.S_IMODE(target.stat().st_mode)
    except OSError as err:
        raise _os_error(path, err, "a file") from None
    backup = _free_backup(target, original)
    try:
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    except OSError as err:
        raise _write_error(target, err) from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except OSError as err:
        Path(tmp).unlink(missing_ok=True)
        raise _write_error(target, err) from None
    return backup


def _free_backup(target: Path, original: bytes) -> Path:
    for i in range(1, 1000):
        candidate = target.with_name(target.name + (".bak" if i == 1 else f".bak.{i}"))
        try:
            fd = os.open(candidate, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            continue
        except OSError as err:
            raise _write_error(candidate, err) from None
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(original)
        except OSError as err:
            candidate.unlink(missing_ok=True)
            raise _write_error(candidate, err) from None
        return candidate
    raise InputError(
        shown(target), "too many earlier backups next to this file", hint="remove old .bak copies"
    )
