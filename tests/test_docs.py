"""docs/ is the product's own documentation: generated pages are in sync, and nothing cites the team's notes."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from zerodoctor.report.reference_docs import PAGES, main

ROOT = Path(__file__).resolve().parents[1]
NOTES = re.compile(r"(?<![-\w])(memory\.md|failures\.md)|seed case|seed article|\.\./shared|knowledge/")


@pytest.mark.parametrize("name", sorted(PAGES))
def test_generated_page_is_current(name):
    page = ROOT / "docs" / name
    assert page.exists() and page.read_text() == PAGES[name](), (
        f"docs/{name} is stale: run `python -m zerodoctor.report.reference_docs`"
    )


def test_generator_writes_the_pages_into_a_given_folder_and_refuses_a_missing_one(tmp_path, capsys):
    assert main([str(tmp_path)]) == 0
    assert {p.name for p in tmp_path.iterdir()} == set(PAGES)
    assert (tmp_path / "rules.md").read_text() == PAGES["rules.md"]()
    with pytest.raises(SystemExit) as exc:
        main([str(tmp_path / "missing")])
    assert exc.value.code == 2
    assert "missing: not a directory" in capsys.readouterr().err


def test_user_facing_text_cites_docs_and_upstream_not_the_teams_notes():
    offenders = []
    for path in [*ROOT.glob("docs/*.md"), ROOT / "README.md", *ROOT.glob("src/zerodoctor/**/*.py"),
                 *ROOT.glob("src/zerodoctor/kb/entries/*.yaml")]:
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if NOTES.search(line):
                offenders.append(f"{path.relative_to(ROOT)}:{i}: {line.strip()[:100]}")
    assert not offenders, "\n".join(offenders)
