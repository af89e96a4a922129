"""The documentation's shape: the benchmarks' results page stays a results page, and every
relative link between the Markdown files leads to a file that exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
    *sorted((ROOT / "benchmarks").glob("*.md")),
]
_LINK = re.compile(r"\]\((?P<target>[^)#\s]+)(?:#[^)]*)?\)")


def test_the_benchmarks_readme_is_a_results_page() -> None:
    """Today's table, how to reproduce each row and one line per miss; the mechanisms'
    explanations live in docs/limits.md and docs/benchmarks-method.md."""
    text = (ROOT / "benchmarks" / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 300
    assert "## Current results" in text
    assert "## How to reproduce each row" in text


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_relative_links_lead_to_files(page: Path) -> None:
    targets = [m["target"] for m in _LINK.finditer(page.read_text(encoding="utf-8"))]
    local = [t for t in targets if not re.match(r"[a-z][a-z0-9+.-]*:", t)]
    missing = [t for t in local if not (page.parent / t).exists()]
    assert not missing, f"{page.relative_to(ROOT)} links to missing files: {missing}"
