"""The README is a newcomer's first page: short, and an index of every docs page.

The rest of what llmso does lives in docs/; the README names each feature in one line
with its page, and lists every docs/*.md page (a page nobody links is a page nobody reads).
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
MAX_LINES = 250
_LINK = re.compile(r"\]\(([^)#]+)(?:#[^)]*)?\)")


def _section(heading: str) -> list[str]:
    """The README's lines under ``heading``, up to the next heading of that level."""
    lines = README.read_text().splitlines()
    assert heading in lines, f"the README has no {heading!r} section"
    start = lines.index(heading) + 1
    level = heading.split(" ", maxsplit=1)[0] + " "
    end = next((i for i in range(start, len(lines)) if lines[i].startswith(level)), len(lines))
    return lines[start:end]


def test_the_readme_is_at_most_250_lines() -> None:
    assert len(README.read_text().splitlines()) <= MAX_LINES


def test_every_docs_page_is_in_the_readme_docs_index() -> None:
    linked = {m for line in _section("## Docs") for m in _LINK.findall(line)}
    pages = {str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md")}
    assert len(pages) > 20  # the glob finds what it checks
    assert sorted(pages - linked) == []
    assert sorted(page for page in linked if not (ROOT / page).exists()) == []


def test_every_feature_line_links_its_page() -> None:
    features = [line for line in _section("## Features") if line.startswith("- ")]
    assert len(features) >= 15
    unlinked = [line for line in features if not _LINK.search(line)]
    assert unlinked == []
