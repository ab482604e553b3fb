"""What the tests share, in one package (tests/conftest.py registers its fixture modules as
plugins; pyproject.toml puts tests/ on pytest's path, so `import support` works as is).

Fixture plugins (never imported by a test module; their fixtures are simply there):
    fixtures     every test's own SPECREG_HOME, llama.cpp's vocab GGUFs, tiny GGUFs, the demo tree
    llama        the pinned llama.cpp build and the real small models (marks a test `llama`)
    browser      Debian's headless Chromium (marks a test `browser`)
    declare      an imported site: collection, orchestrator registry, specreg.yaml
    quality      a measuring setup for llama-perplexity and a registry connection
    recommender  the fitted prior model and the demo registry
    reports      a small scanned collection and its built site

Helpers a test module imports (`from support.cli import specreg`):
    cli, tty, serve, ray_lab, measurements, calibration, load, lookup_cache, fake_server,
    mutations, auditor_harness, schemas.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TESTS = REPO / "tests"
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def require(condition: bool, what: str) -> None:
    """Skip locally when a real part is missing; in CI a missing real part is a failure."""
    if condition:
        return
    if IN_CI:
        pytest.fail(f"{what} is missing in CI: scripts/test must install it")
    pytest.skip(f"{what} not available")
