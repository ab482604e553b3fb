"""This host's quiet noise floor: how far repeats of one measurement spread when nothing else
runs (issue 28).

`specreg calibrate` measures it from llama-bench's repetitions of plain generation, taken only
when other processes left the CPU alone; a run whose repeats spread far beyond it was
disturbed (`specreg.host.load`). Stored per host fingerprint, newest wins.

It is the one figure for the noise of a measurement on a host (issue 40): the load guard, the
recommender's weight of a run against its model and its tolerance of evidence, and serve's
prior scatter of a request all read it (`noise_figure`), with DEFAULT_NOISE_FLOOR only for a
host `calibrate` never measured.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from specreg.registry.sql import Rows, transaction

if TYPE_CHECKING:  # read by the load guard and serve's policy: no database at import
    import duckdb

NOISE_FLOORS = "noise_floors"
# The relative spread (max / min - 1) of repeats of one measurement assumed for a host whose
# noise floor `specreg calibrate` has not measured: llama-bench's five repeats of plain
# generation on a quiet host spread by a few per cent, a loaded or small one's by about this.
DEFAULT_NOISE_FLOOR = 0.1
NOISE_MEASURED = "measured"
NOISE_FALLBACK = "fallback"


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


_FLOORS = Rows(NOISE_FLOORS, NoiseFloor, instant="measured_at")


def record_noise_floor(con: duckdb.DuckDBPyConnection, floor: NoiseFloor) -> None:
    with transaction(con):
        _FLOORS.insert(con, _FLOORS.values(floor))


def latest_noise_floor(con: duckdb.DuckDBPyConnection, host_fingerprint: str) -> NoiseFloor | None:
    """This host's newest noise floor, None when never measured (or an older registry)."""
    import duckdb

    try:
        row = con.execute(
            f"SELECT {_FLOORS.select} FROM {NOISE_FLOORS} WHERE host_fingerprint = ? "
            "ORDER BY measured_at DESC LIMIT 1",
            [host_fingerprint],
        ).fetchone()
    except duckdb.CatalogException:
        return None
    return _FLOORS.read(row) if row is not None else None


@dataclass(frozen=True)
class NoiseFigure:
    """The noise of one measurement on a host, as every part reads it: the relative spread of
    quiet repeats (`spread`, max / min - 1), where it comes from (`source`: NOISE_MEASURED by
    `specreg calibrate`, else NOISE_FALLBACK, the constant DEFAULT_NOISE_FLOOR) and, when
    measured, the measurement."""

    spread: float
    source: str
    floor: NoiseFloor | None = None

    @property
    def sigma(self) -> float:
        """The scatter of one run in log space: a run is off by up to its spread."""
        return math.log1p(max(self.spread, 1e-3))

    @property
    def label(self) -> str:
        if self.floor is not None:
            return (
                f"noise floor {self.spread:.1%} (measured by specreg calibrate on "
                f"{self.floor.measured_at:%Y-%m-%d}, {self.floor.n_samples} repeats)"
            )
        return f"noise floor {self.spread:.0%} (fallback constant: run specreg calibrate)"

    def to_json(self) -> dict[str, Any]:
        return {
            "spread": round(self.spread, 5),
            "source": self.source,
            "sigma": round(self.sigma, 5),
            "floor": self.floor.to_json() if self.floor is not None else None,
        }


FALLBACK_NOISE = NoiseFigure(DEFAULT_NOISE_FLOOR, NOISE_FALLBACK)


def noise_figure(
    con: duckdb.DuckDBPyConnection | None, host_fingerprint: str | None
) -> NoiseFigure:
    """The host's measured noise floor, else the fallback (no registry, no fingerprint, or never
    measured)."""
    if con is None or not host_fingerprint:
        return FALLBACK_NOISE
    floor = latest_noise_floor(con, host_fingerprint)
    if floor is None or not math.isfinite(floor.spread) or floor.spread < 0:
        return FALLBACK_NOISE
    return NoiseFigure(floor.spread, NOISE_MEASURED, floor)
