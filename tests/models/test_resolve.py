"""Resolution from where users keep models: the local Hugging Face cache by hub id, and close matches that
stay within the architecture the name denotes."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from zerodoctor.errors import PlanError
from zerodoctor.models import resolve_model
from zerodoctor.models.spec import catalog, close_matches, family_from_name

QWEN3_TINY = {"model_type": "qwen3", "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "vocab_size": 128}  # fmt: skip


def _cache(root: Path, hub_id: str, config: dict, *, with_ref: bool = True) -> Path:
    repo = root / f"models--{hub_id.replace('/', '--')}"
    snap = repo / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text(json.dumps(config))
    if with_ref:
        (repo / "refs").mkdir()
        (repo / "refs" / "main").write_text("abc123\n")
    return snap / "config.json"


@pytest.mark.parametrize("env", ["HF_HUB_CACHE", "HF_HOME"])
def test_hub_id_resolves_from_the_local_cache(tmp_path, monkeypatch, env):
    root = tmp_path / "hub"
    if env == "HF_HOME":
        monkeypatch.setenv("HF_HOME", str(tmp_path))
    else:
        monkeypatch.setenv("HF_HUB_CACHE", str(root))
    _cache(root, "acme/tiny-qwen3", QWEN3_TINY)
    spec = resolve_model("acme/tiny-qwen3")
    assert spec.model_type == "qwen3" and spec.name == "acme/tiny-qwen3"
    assert spec.source.name == "config.json" and "snapshots" in str(spec.source)


def test_cached_copy_wins_over_the_catalog_and_newest_snapshot_without_ref(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    _cache(tmp_path, "Qwen/Qwen3-8B", QWEN3_TINY, with_ref=False)
    spec = resolve_model("Qwen/Qwen3-8B")
    assert spec.catalog_slug is None and spec.params.total < 10**6
    # Without the cache the catalog answers.
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty"))
    assert resolve_model("Qwen/Qwen3-8B").catalog_slug == "qwen3-8b"


@pytest.mark.parametrize(
    ("name", "family"),
    [
        ("deepseek-ai/DeepSeek-R1-Distill-Llama-70B", "llama"),
        ("deepseek-ai/DeepSeek-R1-Distill-Qwen-7B", "qwen2"),
        ("deepseek-ai/DeepSeek-V2-Lite-Chat", "deepseek_v2"),
        ("Qwen/Qwen3-30B-A3B", "qwen3_moe"),
        ("lmsys/vicuna-13b-v1.5", "llama"),
        ("google/gemma-2-9b-it", "gemma2"),
        ("something-else", None),
    ],
)
def test_family_from_name(name, family):
    assert family_from_name(name) == family


def test_close_matches_never_offer_another_architecture():
    types = {e.slug: e.model_type for e in catalog()}
    by_hub = {h: e.model_type for e in catalog() for h in e.hub_ids}
    for name, family in (
        ("acme/DeepSeek-R1-Distill-Llama-65B-custom", "llama"),
        ("my-org/qwen2.5-13b-finetune", "qwen2"),
        ("someone/Mixtral-8x3B", "mixtral"),
    ):
        matches = close_matches(name)
        assert matches, name
        assert {types.get(m) or by_hub[m] for m in matches} == {family}, (name, matches)


def test_unknown_model_error_names_the_architecture_of_its_suggestions():
    with pytest.raises(PlanError, match=r"same architecture \(llama\)") as err:
        resolve_model("acme/DeepSeek-R1-Distill-Llama-65B-custom")
    assert "deepseek_v2" not in str(err.value).lower()


@pytest.mark.parametrize("name", ["d" * 5000, "org/" + "n" * 5000])
def test_a_name_longer_than_the_file_system_allows_is_an_unknown_model(name):
    with pytest.raises(PlanError, match="unknown model") as err:
        resolve_model(name)
    assert len(str(err.value)) < 2000


def test_the_docs_state_the_catalogs_real_size():
    """docs/models.md names the catalog's size; it must follow the catalog as entries are added."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "models.md").read_text(encoding="utf-8")
    stated = re.search(r"The bundled catalog: (\d+) configurations under [^,]+, (\d+) hub ids", text)
    assert stated, "docs/models.md no longer states the catalog's size"
    entries = catalog()
    assert (int(stated[1]), int(stated[2])) == (len(entries), sum(len(e.hub_ids) for e in entries))
