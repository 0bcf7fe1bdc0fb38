"""The knowledge-base cache: the same entries as the YAML, rebuilt when an entry changes, damage ignored."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from zerodoctor.errors import KnowledgeBaseError
from zerodoctor.kb import cache, schema
from zerodoctor.kb.loader import ENTRIES_DIR, _load_all, _parse_all


@pytest.fixture
def entries_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("ZERODOCTOR_CACHE_DIR", str(tmp_path / "cache"))
    d = tmp_path / "entries"
    shutil.copytree(ENTRIES_DIR, d)
    _load_all.cache_clear()
    yield d
    _load_all.cache_clear()


def test_cached_entries_equal_the_yaml(entries_copy: Path, tmp_path: Path) -> None:
    first = _load_all(str(entries_copy))  # parses the YAML, writes the cache
    assert list((tmp_path / "cache").glob("kb-*.bin"))
    _load_all.cache_clear()
    second = _load_all(str(entries_copy))  # read back from the cache
    files = [(p, p.read_bytes()) for p in sorted(entries_copy.glob("*.yaml"))]
    assert first == second == _parse_all(files, "unused")


def test_cache_rebuilt_when_an_entry_changes(entries_copy: Path) -> None:
    before = _load_all(str(entries_copy))
    path = entries_copy / "host-oom-sigkill.yaml"
    path.write_text(path.read_text().replace('title: "', 'title: "EDITED ', 1))
    _load_all.cache_clear()
    after = _load_all(str(entries_copy))
    old = next(e for e in before if e.id == "host-oom-sigkill")
    new = next(e for e in after if e.id == "host-oom-sigkill")
    assert new.title == "EDITED " + old.title


def test_damaged_cache_file_is_ignored(entries_copy: Path, tmp_path: Path) -> None:
    expected = _load_all(str(entries_copy))
    for f in (tmp_path / "cache").glob("kb-*.bin"):
        f.write_bytes(f.read_bytes()[:100])
    _load_all.cache_clear()
    assert _load_all(str(entries_copy)) == expected


def test_cache_off_and_unwritable(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("ZERODOCTOR_CACHE_DIR", "off")
    assert cache.cache_dir() is None
    cache.write("x", "k", b"data")  # a no-op
    assert cache.read("x", "k") is None
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("ZERODOCTOR_CACHE_DIR", str(blocker / "sub"))
    cache.write("x", "k", b"data")  # cannot create the directory: silently no cache
    assert cache.read("x", "k") is None


def test_cached_entries_have_the_runtime_types(entries_copy: Path) -> None:
    _load_all(str(entries_copy))  # writes the cache
    _load_all.cache_clear()
    for e in _load_all(str(entries_copy)):  # read back without pydantic
        assert type(e) is schema.Entry and type(e.symptoms) is schema.Symptoms
        assert all(type(s) is schema.Signature for s in e.symptoms.signatures)
        assert all(type(f) is schema.KbFix for f in e.fixes)
        assert type(e.examples.match[0]) is schema.Example


def test_a_bad_entry_is_still_refused_when_a_cache_exists(entries_copy: Path) -> None:
    _load_all(str(entries_copy))  # the cache of the good entries
    path = entries_copy / "host-oom-sigkill.yaml"
    path.write_text(path.read_text().replace("severity: error", "severity: fatal", 1))
    _load_all.cache_clear()
    with pytest.raises(KnowledgeBaseError, match=r"host-oom-sigkill.yaml: severity: Input should be"):
        _load_all(str(entries_copy))
