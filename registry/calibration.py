"""This host's physics in the registry: llama-bench cost curves per model, and memory bandwidth.

`specreg calibrate` times one forward pass over a batch of 1, 2, 4, ... 32 tokens and plain
generation for a model on a host; verifying K drafted tokens is one pass over K + 1 tokens, so
this curve is the verify cost the recommender needs before any speculative run. Rows are keyed by
the runner's host fingerprint, the registry model id and the thread count; the newest wins.
`specreg doctor` stores the memory bandwidth it measured, keyed by host fingerprint.

The runner hands over typed records; this module owns the SQL (migration 9).
"""

from __future__ import annotations

import bisect
import statistics
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import duckdb

from specreg.registry.sql import Rows, transaction, where_equal

CALIBRATIONS = "calibrations"
CALIBRATION_POINTS = "calibration_points"
HOST_BANDWIDTH = "host_bandwidth"

KIND_BATCH = "batch"  # one forward pass over n_tokens tokens (llama-bench pp<n>)
KIND_GEN = "gen"  # n_tokens tokens generated one at a time (llama-bench tg<n>)


def m009_calibration(con: duckdb.DuckDBPyConnection) -> None:
    """Calibration curves (one row per model, host and thread count measured; one point per
    batch size or generation test) and measured memory bandwidth per host."""
    con.execute("CREATE SEQUENCE calibrations_seq START 1")
    con.execute(
        f"""
        CREATE TABLE {CALIBRATIONS} (
            calibration_id    BIGINT PRIMARY KEY DEFAULT nextval('calibrations_seq'),
            host_fingerprint  VARCHAR NOT NULL,
            model_id          VARCHAR NOT NULL,
            model_path        VARCHAR NOT NULL,
            model_bytes       BIGINT,
            role              VARCHAR NOT NULL,   -- target | draft (as calibrated)
            threads           INTEGER NOT NULL,
            measured_at       TIMESTAMPTZ NOT NULL,
            seconds           DOUBLE,             -- wall time of the whole calibration
            repetitions       INTEGER NOT NULL,   -- llama-bench -r
            llama_version     VARCHAR,
            llama_bin_dir     VARCHAR,
            argv              VARCHAR[],
            load_foreign_cpu  DOUBLE              -- CPU seconds other processes used meanwhile
        )
        """
    )
    con.execute(
        f"""
        CREATE TABLE {CALIBRATION_POINTS} (
            calibration_id  BIGINT NOT NULL,
            kind            VARCHAR NOT NULL,    -- batch | gen
            n_tokens        INTEGER NOT NULL,
            seconds         DOUBLE NOT NULL,     -- median seconds for the whole test
            seconds_lo      DOUBLE,              -- fastest and slowest repetition
            seconds_hi      DOUBLE,
            samples         DOUBLE[] NOT NULL,
            wall_s          DOUBLE,              -- the test's wall time, warm-up included
            foreign_cpu_s   DOUBLE,              -- CPU seconds other processes used during it
            reruns          INTEGER NOT NULL,    -- times measured again because of that load
            contended       BOOLEAN NOT NULL,    -- still disturbed after the last rerun
            PRIMARY KEY (calibration_id, kind, n_tokens)
        )
        """
    )
    con.execute(
        f"""
        CREATE TABLE {HOST_BANDWIDTH} (
            host_fingerprint  VARCHAR NOT NULL,
            measured_at       TIMESTAMPTZ NOT NULL,
            read_gbs          DOUBLE NOT NULL,     -- what decoding needs: streaming reads
            copy_gbs          DOUBLE,              -- read + write traffic of a copy
            method            VARCHAR NOT NULL,
            threads           INTEGER NOT NULL,
            buffer_mib        BIGINT NOT NULL,
            peak_gbs          DOUBLE,              -- the DIMMs' theoretical peak, when known
            peak_source       VARCHAR,             -- dmidecode | user
            foreign_share     DOUBLE               -- share of the CPUs other processes used
        )
        """
    )


@dataclass(frozen=True)
class CalibrationPoint:
    """One llama-bench test: `seconds` for the whole test (a batch pass, or n generated tokens)."""

    kind: str
    n_tokens: int
    seconds: float
    seconds_lo: float
    seconds_hi: float
    samples: tuple[float, ...]
    wall_s: float | None = None
    foreign_cpu_s: float | None = None
    reruns: int = 0
    contended: bool = False

    @property
    def per_token(self) -> float:
        return self.seconds / self.n_tokens

    @property
    def tokens_per_s(self) -> float:
        return self.n_tokens / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class CalibrationRecord:
    """A model's cost curve on one host at one thread count. `calibration_id` is None until
    recorded."""

    host_fingerprint: str
    model_id: str
    model_path: str
    role: str
    threads: int
    measured_at: datetime
    repetitions: int
    points: tuple[CalibrationPoint, ...]
    model_bytes: int | None = None
    seconds: float | None = None
    llama_version: str | None = None
    llama_bin_dir: str | None = None
    argv: tuple[str, ...] = ()
    load_foreign_cpu: float | None = None
    calibration_id: int | None = None

    @property
    def batch(self) -> tuple[CalibrationPoint, ...]:
        return tuple(sorted((p for p in self.points if p.kind == KIND_BATCH), key=_n))

    @property
    def gen(self) -> CalibrationPoint | None:
        gens = [p for p in self.points if p.kind == KIND_GEN]
        return max(gens, key=_n) if gens else None

    @property
    def gen_seconds(self) -> float | None:
        """Seconds per token of plain generation."""
        g = self.gen
        return g.per_token if g is not None else None

    @property
    def contended(self) -> bool:
        return any(p.contended for p in self.points)

    def batch_seconds(self, n_tokens: float) -> float:
        """Seconds for one pass over `n_tokens` tokens: measured, linearly interpolated between
        measured sizes, extended past the largest along the last two points' slope."""
        pts = self.batch
        if not pts:
            raise ValueError(f"calibration of {self.model_id} has no batch points")
        xs = [p.n_tokens for p in pts]
        ys = [p.seconds for p in pts]
        if len(pts) == 1:
            return ys[0] * n_tokens / xs[0]
        i = bisect.bisect_left(xs, n_tokens)
        lo, hi = (0, 1) if i == 0 else (len(xs) - 2, len(xs) - 1) if i >= len(xs) else (i - 1, i)
        slope = (ys[hi] - ys[lo]) / (xs[hi] - xs[lo])
        return max(ys[0] * 0.5, ys[lo] + slope * (n_tokens - xs[lo]))

    def verify_ratio(self, k: float) -> float:
        """Cost of verifying K drafted tokens (one pass over K + 1) in single decode steps."""
        step = self.batch_seconds(1)
        return self.batch_seconds(k + 1) / step if step > 0 else float("nan")


def _n(p: CalibrationPoint) -> int:
    return p.n_tokens


def point(
    kind: str,
    n_tokens: int,
    samples: tuple[float, ...],
    *,
    wall_s: float | None = None,
    foreign_cpu_s: float | None = None,
    reruns: int = 0,
    contended: bool = False,
) -> CalibrationPoint:
    """A point from its repetitions' seconds: the median, with the fastest and slowest."""
    if not samples:
        raise ValueError("a calibration point needs at least one sample")
    return CalibrationPoint(
        kind=kind,
        n_tokens=n_tokens,
        seconds=statistics.median(samples),
        seconds_lo=min(samples),
        seconds_hi=max(samples),
        samples=tuple(samples),
        wall_s=wall_s,
        foreign_cpu_s=foreign_cpu_s,
        reruns=reruns,
        contended=contended,
    )


_CALIBRATIONS = Rows(
    CALIBRATIONS, CalibrationRecord, instant="measured_at", arrays=["argv"], skip=["points"]
)
_POINTS = Rows(CALIBRATION_POINTS, CalibrationPoint, arrays=["samples"])


def record_calibration(con: duckdb.DuckDBPyConnection, rec: CalibrationRecord) -> int:
    """Store a calibration and its points in one transaction; return its id."""
    with transaction(con):
        values = _CALIBRATIONS.values(rec)
        cal_id = int(_CALIBRATIONS.insert(con, values, returning="calibration_id"))
        for p in rec.points:
            _POINTS.insert(con, {"calibration_id": cal_id, **_POINTS.values(p)})
    return cal_id


def _points(con: duckdb.DuckDBPyConnection, cal_id: int) -> tuple[CalibrationPoint, ...]:
    rows = con.execute(
        f"SELECT {_POINTS.select} FROM {CALIBRATION_POINTS} "
        "WHERE calibration_id = ? ORDER BY kind, n_tokens",
        [cal_id],
    ).fetchall()
    return tuple(_POINTS.read(r) for r in rows)


def _record(con: duckdb.DuckDBPyConnection, row: tuple[Any, ...]) -> CalibrationRecord:
    data = _CALIBRATIONS.decode(row)
    return CalibrationRecord(**data, points=_points(con, data["calibration_id"]))


def list_calibrations(
    con: duckdb.DuckDBPyConnection,
    *,
    host_fingerprint: str | None = None,
    model_id: str | None = None,
    threads: int | None = None,
    latest_only: bool = True,
) -> list[CalibrationRecord]:
    """Calibrations, newest first; with `latest_only`, the newest per (host, model, threads)."""
    where, params = where_equal(
        host_fingerprint=host_fingerprint, model_id=model_id, threads=threads
    )
    sql = f"SELECT {_CALIBRATIONS.select} FROM {CALIBRATIONS}{where}"
    if latest_only:
        sql += (
            " QUALIFY row_number() OVER (PARTITION BY host_fingerprint, model_id, threads"
            " ORDER BY calibration_id DESC) = 1"
        )
    sql += " ORDER BY calibration_id DESC"
    return [_record(con, r) for r in con.execute(sql, params).fetchall()]


def latest_calibration(
    con: duckdb.DuckDBPyConnection,
    host_fingerprint: str,
    model_id: str,
    threads: int | None = None,
) -> CalibrationRecord | None:
    """The newest calibration of a model on a host (at `threads`, or at any thread count)."""
    found = list_calibrations(
        con, host_fingerprint=host_fingerprint, model_id=model_id, threads=threads
    )
    return found[0] if found else None


@dataclass(frozen=True)
class BandwidthRecord:
    """A memory bandwidth measurement of one host (GB/s = 1e9 bytes per second)."""

    host_fingerprint: str
    measured_at: datetime
    read_gbs: float
    method: str
    threads: int
    buffer_mib: int
    copy_gbs: float | None = None
    peak_gbs: float | None = None
    peak_source: str | None = None
    foreign_share: float | None = None


_BANDWIDTH = Rows(HOST_BANDWIDTH, BandwidthRecord, instant="measured_at")


def record_bandwidth(con: duckdb.DuckDBPyConnection, rec: BandwidthRecord) -> None:
    with transaction(con):
        _BANDWIDTH.insert(con, _BANDWIDTH.values(rec))


def latest_bandwidth(
    con: duckdb.DuckDBPyConnection, host_fingerprint: str
) -> BandwidthRecord | None:
    row = con.execute(
        f"SELECT {_BANDWIDTH.select} FROM {HOST_BANDWIDTH} WHERE host_fingerprint = ? "
        "ORDER BY measured_at DESC LIMIT 1",
        [host_fingerprint],
    ).fetchone()
    if row is None:
        return None
    return _BANDWIDTH.read(row)


# -- llama-server's pass factor (migration 13) --------------------------------------------------

PASS_FACTORS = "pass_factors"
# Where the pass factor a figure is read with comes from.
PASS_MEASURED = "measured"  # `specreg calibrate`, this host and model
PASS_FALLBACK = "fallback"  # the cost model's constant, for a host never calibrated


def m013_pass_factors(con: duckdb.DuckDBPyConnection) -> None:
    """llama-server's seconds per plainly decoded token over llama-bench's, per host, model and
    thread count (`specreg calibrate`, issue 40): what every llama-server pass costs beyond
    llama-bench's of the same size on that host."""
    con.execute(
        f"""
        CREATE TABLE {PASS_FACTORS} (
            host_fingerprint  VARCHAR NOT NULL,
            model_id          VARCHAR NOT NULL,
            threads           INTEGER NOT NULL,
            measured_at       TIMESTAMPTZ NOT NULL,
            factor            DOUBLE NOT NULL,     -- server_seconds / bench_seconds
            server_seconds    DOUBLE NOT NULL,     -- llama-server, per decoded token (median)
            bench_seconds     DOUBLE NOT NULL,     -- llama-bench, per generated token
            n_tokens          INTEGER NOT NULL,    -- tokens decoded per request
            samples           DOUBLE[] NOT NULL,   -- llama-server's seconds per token, per request
            calibration_id    BIGINT,              -- the calibration llama-bench's figure is from
            llama_version     VARCHAR,
            foreign_cpu_s     DOUBLE,              -- CPU seconds other processes used meanwhile
            contended         BOOLEAN NOT NULL     -- other processes took the CPU during it
        )
        """
    )


@dataclass(frozen=True)
class PassFactorRecord:
    """llama-server's plain decoding against llama-bench's generation, for one model on one host
    at one thread count: `factor` = server_seconds / bench_seconds per token."""

    host_fingerprint: str
    model_id: str
    threads: int
    measured_at: datetime
    factor: float
    server_seconds: float
    bench_seconds: float
    n_tokens: int
    samples: tuple[float, ...]
    calibration_id: int | None = None
    llama_version: str | None = None
    foreign_cpu_s: float | None = None
    contended: bool = False


_PASS_FACTORS = Rows(PASS_FACTORS, PassFactorRecord, instant="measured_at", arrays=["samples"])


def record_pass_factor(con: duckdb.DuckDBPyConnection, rec: PassFactorRecord) -> None:
    with transaction(con):
        _PASS_FACTORS.insert(con, _PASS_FACTORS.values(rec))


def latest_pass_factor(
    con: duckdb.DuckDBPyConnection,
    host_fingerprint: str,
    model_id: str,
    threads: int | None = None,
) -> PassFactorRecord | None:
    """The newest pass factor of a model on a host (at `threads`, or at any thread count); None
    when never measured (or a registry from before migration 13)."""
    where, params = where_equal(
        host_fingerprint=host_fingerprint, model_id=model_id, threads=threads
    )
    try:
        row = con.execute(
            f"SELECT {_PASS_FACTORS.select} FROM {PASS_FACTORS}{where} "
            "ORDER BY measured_at DESC LIMIT 1",
            params,
        ).fetchone()
    except duckdb.CatalogException:
        return None
    if row is None:
        return None
    return _PASS_FACTORS.read(row)
