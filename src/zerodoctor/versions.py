"""Version ranges with `packaging`, in the advisory-database style (`introduced` / `fixed` / `last_affected`)."""

from __future__ import annotations

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version


def parse_version(text: str | None) -> Version | None:
    """A `Version`, or None for text that is not a PEP 440 version (a git URL, "unknown", ...)."""
    if not text:
        return None
    try:
        return Version(str(text).strip())
    except (InvalidVersion, ValueError, TypeError):
        return None


def in_range(
    version: Version, introduced: str = "0", fixed: str | None = None, last_affected: str | None = None
) -> bool:
    """True if `introduced <= version < fixed` (or `<= last_affected`). Local labels (`+cpu`) are ignored and a
    dev/pre-release of X counts as X's line (0.14.3.dev0 is before 0.14.3, so still affected by a bug fixed in it)."""
    v = Version(version.base_version) if version.local else version
    if introduced not in ("0", "") and v < Version(introduced):
        return False
    if fixed is not None and v >= Version(fixed):
        return False
    return not (last_affected is not None and v > Version(last_affected))


def describe_range(introduced: str = "0", fixed: str | None = None, last_affected: str | None = None) -> str:
    """Human text: ">=0.14.1, <0.14.3"."""
    parts = []
    if introduced not in ("0", ""):
        parts.append(f">={introduced}")
    if fixed:
        parts.append(f"<{fixed}")
    if last_affected:
        parts.append(f"<={last_affected}")
    return ", ".join(parts) or "all versions"


def normalize_package(name: str) -> str:
    """PEP 503 name: `Flash_Attn` -> `flash-attn`."""
    return canonicalize_name(name)
