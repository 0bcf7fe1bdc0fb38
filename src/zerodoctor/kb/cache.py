"""A small on-disk cache for derived data that is slow to rebuild at every start (the knowledge base parsed
from YAML, the compiled multi-pattern database of the log scanner).

The sources stay the truth (the KB is kept as YAML, one file per entry): a cache file is named by a SHA-256 of
everything it derives from (file names and bytes, the zerodoctor and library versions), so an edited entry
gives a new key and the cache is rebuilt; stale files are simply never read again. Each file carries the
SHA-256 of its payload, so a truncated or damaged file is ignored, never trusted. Writes go to a temporary
file renamed into place (no reader sees half a file). Anything that goes wrong (no home directory, a read-only
file system, a full disk) means "no cache": the caller rebuilds in memory and goes on.

Location: $ZERODOCTOR_CACHE_DIR, else $XDG_CACHE_HOME/zerodoctor, else ~/.cache/zerodoctor (only when the home
directory exists: a missing $HOME is never created).
ZERODOCTOR_CACHE_DIR=off turns the cache off.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from pathlib import Path

_DIGEST = 32


def cache_dir() -> Path | None:
    """The cache directory, or None when caching is off."""
    env = os.environ.get("ZERODOCTOR_CACHE_DIR")
    if env is not None:
        return None if env.strip().lower() in ("", "off", "0", "none") else Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg:
        return Path(xdg) / "zerodoctor"
    home = os.environ.get("HOME")
    # a HOME that does not exist (HOME=/nonexistent for service accounts and some CI users) means no cache:
    # writing one would create that directory
    return Path(home) / ".cache" / "zerodoctor" if home and os.path.isdir(home) else None


def key_of(parts: Iterable[bytes]) -> str:
    """A cache key: SHA-256 over length-prefixed parts (so ("ab", "c") and ("a", "bc") differ)."""
    h = hashlib.sha256()
    for part in parts:
        h.update(len(part).to_bytes(8, "little"))
        h.update(part)
    return h.hexdigest()[:32]


def read(name: str, key: str) -> bytes | None:
    """The payload stored under (name, key), or None (absent, unreadable, damaged, caching off)."""
    d = cache_dir()
    if d is None:
        return None
    try:
        data = (d / f"{name}-{key}.bin").read_bytes()
    except OSError:
        return None
    payload = data[_DIGEST:]
    if len(data) < _DIGEST or hashlib.sha256(payload).digest() != data[:_DIGEST]:
        return None
    return payload


def write(name: str, key: str, payload: bytes) -> None:
    """Store `payload` under (name, key); silently does nothing when the cache cannot be written."""
    d = cache_dir()
    if d is None:
        return
    import tempfile  # only to write: a start that finds its cache files does not load it

    try:
        d.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=d, prefix=f".{name}-", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(hashlib.sha256(payload).digest() + payload)
            os.replace(tmp, d / f"{name}-{key}.bin")
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError:
        return
