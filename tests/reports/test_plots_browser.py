"""Plots of one or two measurements read well in a real browser (issue 25, point 16): K is a
whole number on the axis around the point (not 7.95, 8.00, 8.05), speeds start at 0, and no
legend entry or label is cut off at the figure's edge. Debian's headless Chromium renders
the SVGs as the report inlines them; screenshots go to $SPECREG_SCREENSHOTS when set."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from specreg.reports import plots

from support.browser import SHOTS_ENV, Watched

pytestmark = pytest.mark.browser

LONG_DRAFT = "code · Qwen2.5 Coder 0.5B Instruct Q8_0 (a long draft name)"


@dataclass(frozen=True)
class FrontierPoint:
    label: str
    mean_kld: float
    tokens_per_s: float
    measured: bool
    on_frontier: bool


def _figures() -> dict[str, str]:
    cache = plots.PlotCache(None)
    one = [plots.SweepPoint(LONG_DRAFT, 8, 12.5, 0.7)]
    two = [*one, plots.SweepPoint("prose · draft", 16, 9.0, 0.5)]
    pair = [
        FrontierPoint("ngram-mod K=16 experts=6", 0.021, 14.0, True, True),
        FrontierPoint("draft-simple K=8 experts=4 (long)", 0.094, 19.5, False, True),
    ]
    return {
        "sweep-one": plots.sweep_svg(one, 6.0, 30.0, cache),
        "sweep-two": plots.sweep_svg(two, 6.0, None, cache),
        "frontier-two": plots.frontier_svg(pair, cache),
    }


def _xticks(svg: str) -> list[str]:
    """The x tick labels matplotlib wrote (as text: svg.fonttype none)."""
    return [
        m.group(1).strip()
        for m in re.finditer(r'<g id="xtick_\d+">.*?<text[^>]*>([^<]*)</text>', svg, flags=re.S)
    ]


def test_small_plots_keep_their_axes_and_legends(browser: Any, tmp_path: Path) -> None:
    figures = _figures()
    for name in ("sweep-one", "sweep-two"):
        ticks = _xticks(figures[name])
        assert ticks and all(t.isdigit() for t in ticks), (name, ticks)
    html = "".join(f'<div class="plot" id="{n}">{svg}</div>' for n, svg in figures.items())
    page_file = tmp_path / "plots.html"
    page_file.write_text(f"<!doctype html><html><body>{html}</body></html>", encoding="utf-8")
    w = Watched(browser)
    page = w.open(page_file)
    # every text of a figure (legend, labels, ticks) lies inside its SVG's box
    outside = page.evaluate(
        """() => [...document.querySelectorAll('div.plot')].flatMap(div => {
            const box = div.querySelector('svg').getBoundingClientRect();
            return [...div.querySelectorAll('text')]
              .map(t => [t.textContent, t.getBoundingClientRect()])
              .filter(([_, r]) => r.width > 0 && (r.left < box.left - 1 || r.right > box.right + 1
                        || r.top < box.top - 1 || r.bottom > box.bottom + 1))
              .map(([text, r]) => div.id + ': ' + text);
        })"""
    )
    assert outside == [], outside
    legend = page.evaluate(
        "() => [...document.querySelectorAll('#sweep-one text')].map(t => t.textContent)"
    )
    assert any(LONG_DRAFT[:40] in t for t in legend), legend  # the whole label, as cut to 40
    folder = Path(os.environ.get(SHOTS_ENV) or tmp_path / "screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    for name in figures:
        page.locator(f"#{name}").screenshot(path=str(folder / f"{name}.png"))
    w.assert_clean()
