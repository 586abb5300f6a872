"""Every figure on the Results page says when it was measured: a paragraph, list item or table
that carries a measurement (a number with a unit) names a date (YYYY-MM-DD) itself or in its
section's opening paragraph, and no figure is left as "date not recorded" (issue #34: no figure
without its command and date)."""
from __future__ import annotations

import re
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results.md"
DATE = re.compile(r"20\d\d-\d\d-\d\d")
FIGURE = re.compile(r"\d+(\.\d+)? ?(ms|us|s|%|GB/s|MB|MiB|x)\b")


def _undated(text: str) -> list[str]:
    """The blocks of ``text`` (a Results page) with a figure and no date of their own or of
    their section's opening paragraph."""
    found = []
    for section in re.split(r"\n(?=#)", text):
        heading, _, body = section.partition("\n")
        blocks = [b for b in re.split(r"\n\s*\n|\n(?=- )", body) if b.strip()]
        opening_dated = bool(blocks) and bool(DATE.search(blocks[0]))
        for block in blocks:
            if FIGURE.search(block) and not DATE.search(block) and not opening_dated:
                found.append(f"{heading}: {' '.join(block.split())[:120]}")
    return found


def test_every_figure_on_the_results_page_has_a_date() -> None:
    assert _undated(RESULTS.read_text(encoding="utf-8")) == []


def test_no_figure_is_left_without_its_date() -> None:
    text = " ".join(RESULTS.read_text(encoding="utf-8").split())
    assert not re.search(r"(date|dates|commit)( and commit)? not recorded|undated", text, re.I)


def test_the_check_finds_an_undated_figure() -> None:
    page = ("## A\n\nMeasured 2026-12-04: 3 ms.\n\n- **B**: 4 ms, dated 2026-12-01.\n\n"
            "## C\n\nNo date here.\n\n- **D**: 12.5 ms a call.\n")
    assert _undated(page) == ["## C: - **D**: 12.5 ms a call."]
