"""Catalog entries added for published setups: counts equal the published totals; aliases resolve."""

from __future__ import annotations

import pytest

from zerodoctor.models import resolve_model


@pytest.mark.parametrize(
    ("name", "total"),
    [
        ("llama-2-7b", 6_738_415_616),
        ("meta-llama/Llama-2-13b-hf", 13_015_864_320),
        ("lmsys/vicuna-13b-v1.5", 13_015_864_320),
        ("meta-llama/Llama-2-70b-hf", 68_976_648_192),
    ],
)
def test_published_totals(name, total):
    assert resolve_model(name).params.total == total


def test_deepseek_coder_33b_is_the_published_33_3b():
    assert resolve_model("deepseek-ai/deepseek-coder-33b-instruct").params.total == pytest.approx(
        33.3e9, rel=0.005
    )
