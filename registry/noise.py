"""This host's quiet noise floor: how far repeats of one measurement spread when nothing else
runs (issue 28).

`specreg calibrate` measures it from llama-bench's repetitions of plain generation, taken only
when other processes left the CPU alone; a run whose repeats spread far beyond it was
disturbed (`specreg.host.load`). Stored per host fingerprint, newest wins.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import duckdb

from specreg.registry.sql import transaction

NOISE_FLOORS = "noise_floors"


def m011_noise_floors(con: duckdb.DuckDBPyConnection) -> None:
    con.execute(
        f"""
        CREATE TABLE {NOISE_FLOORS} (
            host_fingerprint  VARCHAR NOT NULL,
            measured_at       TIMESTAMPTZ NOT NULL,
            spread            DOUBLE NOT NULL,    -- max/min - 1 of the quiet repetitions
            n_samples         INTEGER NOT NULL,
            source            VARCHAR NOT NULL,   -- what measured it (calibrate)
            model_id          VARCHAR,
            threads           INTEGER,
            foreign_cpu_s     DOUBLE              -- CPU seconds other processes used meanwhile
        )
        """
    )


@dataclass(frozen=True)
class NoiseFloor:
    host_fingerprint: str
    spread: float  # max/min - 1 of quiet repeats of one measurement
    n_samples: int
    source: str
    measured_at: datetime
    model_id: str | None = None
    threads: int | None = None
    foreign_cpu_s: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "host_fingerprint": self.host_fingerprint,
            "spread": round(self.spread, 5),
            "n_samples": self.n_samples,
            "source": self.source,
            "measured_at": self.measured_at.isoformat(),
            "model_id": self.model_id,
            "threads": self.threads,
            "foreign_cpu_s": self.foreign_cpu_s,
        }


_COLUMNS = (
    "host_fingerprint", "measured_at", "spread", "n_samples", "source", "model_id", "threads",
    "foreign_cpu_s",
)  # fmt: skip


def record_noise_floor(con: duckdb.DuckDBPyConnection, floor: NoiseFloor) -> None:
    with transaction(con):
        con.execute(
            f"INSERT INTO {NOISE_FLOORS} ({', '.join(_COLUMNS)}) "
            f"VALUES ({', '.join('?' for _ in _COLUMNS)})",
            [getattr(floor, c) for c in _COLUMNS],
        )


def latest_noise_floor(con: duckdb.DuckDBPyConnection, host_fingerprint: str) -> NoiseFloor | None:
    """This host's newest noise floor, None when never measured (or an older registry)."""
    try:
        row = con.execute(
            f"SELECT host_fingerprint, epoch(measured_at), spread, n_samples, source, model_id, "
            f"threads, foreign_cpu_s FROM {NOISE_FLOORS} WHERE host_fingerprint = ? "
            "ORDER BY measured_at DESC LIMIT 1",
            [host_fingerprint],
        ).fetchone()
    except duckdb.CatalogException:
        return None
    if row is None:
        return None
    fp, at, spread, n, source, model_id, threads, foreign = row
    when = datetime.fromtimestamp(at, timezone.utc)
    return NoiseFloor(fp, spread, n, source, when, model_id, threads, foreign)
