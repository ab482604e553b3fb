"""The calibration store: typed rows in, the same typed rows out; the newest per model wins."""

from __future__ import annotations

import math
from datetime import datetime, timezone
from pathlib import Path

import pytest

from specreg.registry.calibration import (
    BandwidthRecord,
    PassFactorRecord,
    latest_bandwidth,
    latest_calibration,
    latest_pass_factor,
    list_calibrations,
    record_bandwidth,
    record_calibration,
    record_pass_factor,
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


def _pass_factor(factor: float, threads: int = 2, when: int = 0) -> PassFactorRecord:
    return PassFactorRecord(
        host_fingerprint="hostA", model_id="m1", threads=threads,
        measured_at=datetime(2026, 11, 27, 12, when, tzinfo=timezone.utc), factor=factor,
        server_seconds=0.031 * factor, bench_seconds=0.031, n_tokens=64,
        samples=(0.031 * factor, 0.0312 * factor), calibration_id=7, llama_version="11434",
        foreign_cpu_s=0.01,
    )  # fmt: skip


def test_pass_factor_round_trip_and_newest_wins(tmp_path: Path) -> None:
    """Migration 13: llama-server's pass factor per host, model and threads (issue 40)."""
    with opened(tmp_path / "r.duckdb") as con:
        record_pass_factor(con, _pass_factor(1.16, when=0))
        record_pass_factor(con, _pass_factor(0.97, when=5))
        record_pass_factor(con, _pass_factor(1.40, threads=1, when=1))
        got = latest_pass_factor(con, "hostA", "m1", threads=2)
        assert latest_pass_factor(con, "hostA", "m2") is None
        assert latest_pass_factor(con, "hostB", "m1") is None
        anyt = latest_pass_factor(con, "hostA", "m1")
    assert got == _pass_factor(0.97, when=5)
    assert anyt is not None and anyt.factor == pytest.approx(0.97)


def test_a_registry_before_migration_13_has_no_pass_factor(tmp_path: Path) -> None:
    with opened(tmp_path / "r.duckdb") as con:
        con.execute("DROP TABLE pass_factors")
        assert latest_pass_factor(con, "hostA", "m1") is None


def test_the_noise_figure_is_the_measured_floor_else_the_fallback(tmp_path: Path) -> None:
    from specreg.registry.noise import (
        DEFAULT_NOISE_FLOOR,
        NOISE_FALLBACK,
        NOISE_MEASURED,
        NoiseFloor,
        noise_figure,
        record_noise_floor,
    )

    with opened(tmp_path / "r.duckdb") as con:
        none = noise_figure(con, "hostA")
        assert (none.spread, none.source) == (DEFAULT_NOISE_FLOOR, NOISE_FALLBACK)
        assert noise_figure(None, "hostA") == none and noise_figure(con, None) == none
        floor = NoiseFloor("hostA", 0.034, 5, "calibrate", datetime.now(timezone.utc), "m1", 2)
        record_noise_floor(con, floor)
        got = noise_figure(con, "hostA")
        assert noise_figure(con, "hostB").source == NOISE_FALLBACK
    assert got.source == NOISE_MEASURED and got.spread == pytest.approx(0.034)
    assert got.sigma == pytest.approx(math.log1p(0.034))
    assert "measured by specreg calibrate on " in got.label and "5 repeats" in got.label
    assert "fallback constant" in none.label
