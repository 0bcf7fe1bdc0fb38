"""Model resolution reads the local Hugging Face cache: point it at an empty place unless a test sets one."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _empty_hf_cache(tmp_path_factory, monkeypatch):
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("HF_HOME", raising=False)
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
