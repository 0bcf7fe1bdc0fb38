"""`python -m zerodoctor` is the same as the `zerodoctor` command."""

from __future__ import annotations

from zerodoctor.cli.main import entry_point

if __name__ == "__main__":
    entry_point()
