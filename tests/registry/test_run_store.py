"""record_runs writes a batch of runs in one transaction: all of them, or none."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import duckdb
import pytest

from specreg.registry.db import opened
from specreg.registry.run_store import RunRecord, list_runs, record_runs


def _run(label: str, **changes: object) -> RunRecord:
    fields: dict[str, object] = dict(
        kind="serve",
        status="ok",
        started_at=datetime.now(timezone.utc),
        config={},
        config_label=label,
        spec_type="none",
    )
    fields.update(changes)
    return RunRecord(**fields)  # type: ignore[arg-type]


def test_a_batch_lands_whole_with_ids_in_order(tmp_path: Path) -> None:
    with opened(tmp_path / "r.duckdb") as con:
        ids = record_runs(con, [_run("a"), _run("b"), _run("c")])
        stored = {r.run_id: r.config_label for r in list_runs(con)}
    assert ids == sorted(ids) and len(set(ids)) == 3
    assert [stored[i] for i in ids] == ["a", "b", "c"]


def test_a_bad_run_leaves_none_of_its_batch(tmp_path: Path) -> None:
    with opened(tmp_path / "r.duckdb") as con:
        record_runs(con, [_run("before")])
        with pytest.raises(duckdb.Error):
            record_runs(con, [_run("a"), _run("bad", status=None), _run("c")])
        assert [r.config_label for r in list_runs(con)] == ["before"]
