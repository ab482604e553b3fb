"""The calibration store: typed rows in, the same typed rows out; the newest per model wins."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import pytest

from specreg.registry.calibration import (
    BandwidthRecord,
    latest_bandwidth,
    latest_calibration,
    list_calibrations,
    record_bandwidth,
    record_calibration,
)
from specreg.registry.db import opened

from support.calibration import calibration_record


def test_round_trip_keeps_every_field(tmp_path: Path) -> None:
    rec = calibration_record()
    with opened(tmp_path / "r.duckdb") as con:
        cal_id = record_calibration(con, rec)
        got = latest_calibration(con, "hostA", "m1")
    assert got is not None
    assert got.calibration_id == cal_id
    assert got.measured_at == rec.measured_at
    assert got.argv == rec.argv
    assert sorted(got.points, key=lambda p: (p.kind, p.n_tokens)) == sorted(
        rec.points, key=lambda p: (p.kind, p.n_tokens)
    )
    assert got.gen_seconds == pytest.approx(0.67 / 64)
    assert [p.n_tokens for p in got.batch] == [1, 2, 4, 8, 16, 32]


def test_newest_wins_per_model_and_threads(tmp_path: Path) -> None:
    with opened(tmp_path / "r.duckdb") as con:
        record_calibration(con, calibration_record(scale=1.0))
        newer = record_calibration(con, calibration_record(scale=2.0))
        other_threads = record_calibration(con, calibration_record(scale=3.0, threads=1))
        record_calibration(con, calibration_record("m2"))
        got = latest_calibration(con, "hostA", "m1", threads=2)
        anyt = latest_calibration(con, "hostA", "m1")
        assert latest_calibration(con, "hostB", "m1") is None
        assert len(list_calibrations(con, host_fingerprint="hostA")) == 3
        assert len(list_calibrations(con, latest_only=False)) == 4
    assert got is not None and got.calibration_id == newer
    assert anyt is not None and anyt.calibration_id == other_threads


def test_batch_seconds_interpolates_and_extends() -> None:
    rec = calibration_record()
    assert rec.batch_seconds(4) == pytest.approx(0.044)
    assert rec.batch_seconds(3) == pytest.approx((0.022 + 0.044) / 2)
    # past the largest size: the last segment's slope
    assert rec.batch_seconds(48) == pytest.approx(0.352 + 16 * 0.011)
    assert rec.verify_ratio(3) == pytest.approx(4.0)


def test_bandwidth_round_trip(tmp_path: Path) -> None:
    rec = BandwidthRecord(
        host_fingerprint="hostA",
        measured_at=datetime(2026, 1, 2, tzinfo=timezone.utc),
        read_gbs=48.5,
        method="c-kernel",
        threads=2,
        buffer_mib=512,
        peak_gbs=537.6,
        peak_source="user",
        foreign_share=0.01,
    )
    with opened(tmp_path / "r.duckdb") as con:
        assert latest_bandwidth(con, "hostA") is None
        record_bandwidth(con, rec)
        assert latest_bandwidth(con, "hostA") == rec
