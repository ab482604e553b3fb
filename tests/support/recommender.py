"""Fixtures for the recommender tests: one fitted prior model per session, the demo registry."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest

from specreg.recommender.predictor import SpeedPredictor
from specreg.recommender.train import default_estimator, fit
from specreg.registry.db import opened
from specreg.registry.queries import ModelRecord, list_models


@pytest.fixture(scope="session")
def prior_model() -> SpeedPredictor:
    """The speed model fitted on the shipped prior alone (small ensemble, for speed)."""
    est = default_estimator()
    est.set_params(n_members=2)
    return fit(estimator=est).predictor()


@pytest.fixture
def demo_con(scanned_db: Path) -> Iterator[duckdb.DuckDBPyConnection]:
    with opened(scanned_db) as con:
        yield con


def demo_model(con: duckdb.DuckDBPyConnection, basename: str, size_label: str) -> ModelRecord:
    found = [
        m
        for m in list_models(con)
        if m.basename == basename and m.size_label == size_label and not m.draft_kind
    ]
    assert found, f"the demo tree has no {basename} {size_label}"
    return found[0]
