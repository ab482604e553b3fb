"""Fixtures shared by the real-llama.cpp quality and agreement tests: `measuring` (one thread,
two chunks, a logits cache of the test's own) and `con` (the test's registry)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest

from specreg.host.machine import detect_host
from specreg.llama.install import LlamaInstall
from specreg.llama.perplexity import LogitsCache
from specreg.quality.kld import Measuring
from specreg.registry.db import opened

CHUNKS = 2  # 2 x 63 = 126 scored tokens: enough for llama-perplexity's summary statistics


@pytest.fixture
def measuring(llama_install: LlamaInstall, tmp_path: Path) -> Measuring:
    """One thread, two chunks, a logits cache of the test's own."""
    return Measuring(
        llama_install, detect_host(), chunks=CHUNKS, threads=1,
        cache=LogitsCache(tmp_path / "logits"),
    )  # fmt: skip


@pytest.fixture
def con(specreg_home: Path) -> Iterator[duckdb.DuckDBPyConnection]:
    with opened(specreg_home / "registry.duckdb") as c:
        yield c
