"""The tests' shared fixtures live in the support package (tests/support), registered here as
plugins: a test module asks for a fixture by name and never imports another test module.

Every test that needs the llama.cpp build or the real models (through a fixture of
support.llama) is marked `llama`, every one that drives Chromium `browser`, so
`python3 -m pytest -m "not llama and not browser"` (`scripts/test --fast`) is the subset that
needs neither."""

from __future__ import annotations

import pytest

pytest_plugins = [
    "support.fixtures",
    "support.llama",
    "support.browser",
    "support.declare",
    "support.quality",
    "support.recommender",
    "support.reports",
    "support.topology",
]


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    from support.llama import LLAMA_FIXTURES  # a plugin by now, its asserts rewritten

    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        if used & LLAMA_FIXTURES:
            item.add_marker(pytest.mark.llama)
        if "browser" in used:
            item.add_marker(pytest.mark.browser)
