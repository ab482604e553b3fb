"""Debian's headless Chromium driven by playwright, for the report's browser tests: the
`browser` fixture (tests/conftest.py marks every test using it `browser`), a page that records
what went wrong on it, and where screenshots go."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from support import require

CHROMIUM = Path(os.environ.get("SPECREG_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip
# Where screenshots go: SPECREG_SCREENSHOTS, else the test's temporary folder.
SHOTS_ENV = "SPECREG_SCREENSHOTS"


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    require(CHROMIUM.exists(), f"Debian's chromium ({CHROMIUM}; apt-get install chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        require(False, "the playwright package (pip install playwright; never `playwright "
                "install`: the browser is Debian's)")  # fmt: skip
        raise
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


class Watched:
    """A page that records console errors, uncaught exceptions and dialogs."""

    def __init__(self, browser: Any) -> None:
        self.page = browser.new_page(viewport={"width": 1400, "height": 900})
        self.problems: list[str] = []
        self.page.on(
            "console",
            lambda m: (
                self.problems.append(f"console {m.type}: {m.text}")
                if m.type in ("error", "warning")
                else None
            ),
        )
        self.page.on("pageerror", lambda e: self.problems.append(f"page error: {e}"))
        # Offline: the site may only ever read its own files.
        self.page.on(
            "request",
            lambda r: None if r.url.startswith("file://") else self.problems.append(r.url),
        )
        self.page.on("dialog", lambda d: (self.problems.append(f"dialog: {d.message}"),
                                          d.dismiss()))  # fmt: skip

    def open(self, path: Path) -> Any:
        self.page.goto(path.as_uri())
        self.page.wait_for_load_state("load")
        return self.page

    def assert_clean(self) -> None:
        pwned = self.page.evaluate("() => window.__pwned")
        assert pwned is None, f"a hostile string executed (window.__pwned = {pwned})"
        assert not self.problems, self.problems


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    folder = Path(os.environ.get(SHOTS_ENV) or tmp_path / "screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder
