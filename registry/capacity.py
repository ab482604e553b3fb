"""What a host serves under load, per model and configuration: the capacity curve.

`specreg capacity` measures, for each layout of the host's cores (one full instance, or
disjoint splits each running an instance), each configuration (plain decoding and the best
speculative one), each context (a short and a long prompt) and each concurrency (closed-loop
clients), the aggregate decode throughput and each request's own decode speed and latency.
`serve` reads it (how a configuration's per-request speed falls with load, and when a split
beats the full instance), `recommend` prints it, and the report plots it.

The runner hands over typed records; this module owns the SQL (migration 12).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import duckdb

from specreg.jsonout import FieldsDocument
from specreg.registry.sql import transaction

CAPACITY = "capacity_points"

LAYOUT_FULL = "full"
CONTEXT_SHORT = "short"
CONTEXT_LONG = "long"


def m012_capacity(con: duckdb.DuckDBPyConnection) -> None:
    con.execute(
        f"""
        CREATE TABLE {CAPACITY} (
            host_fingerprint  VARCHAR NOT NULL,
            model_id          VARCHAR NOT NULL,
            measured_at       TIMESTAMPTZ NOT NULL,
            config_label      VARCHAR NOT NULL,   -- plain, ngram-mod k=16, draft-simple k=4 ...
            spec_type         VARCHAR NOT NULL,
            k                 INTEGER,
            draft_id          VARCHAR,
            layout            VARCHAR NOT NULL,   -- full | half | node | nodes (a split's kind)
            instances         INTEGER NOT NULL,   -- llama-servers decoding at once
            threads           INTEGER NOT NULL,   -- per instance (its physical cores)
            slots             INTEGER NOT NULL,   -- per instance (-np)
            context           VARCHAR NOT NULL,   -- short | long
            prompt_tokens     DOUBLE,             -- mean prompt length of its requests
            concurrency       INTEGER NOT NULL,   -- closed-loop clients
            requests          INTEGER NOT NULL,
            tokens            BIGINT NOT NULL,    -- generated, all requests
            wall_s            DOUBLE NOT NULL,
            aggregate_tps     DOUBLE NOT NULL,    -- tokens / wall
            per_request_tps   DOUBLE NOT NULL,    -- mean of each request's decode t/s
            latency_p50_s     DOUBLE,
            latency_p95_s     DOUBLE,
            ttft_p50_s        DOUBLE,             -- prompt processing (time to first token)
            ttft_p95_s        DOUBLE,
            foreign_cpu_s     DOUBLE              -- CPU seconds other processes used meanwhile
        )
        """
    )


@dataclass(frozen=True)
class CapacityPoint:
    """One configuration, layout, context and concurrency, as measured."""

    config_label: str
    spec_type: str
    k: int | None
    draft_id: str | None
    layout: str
    instances: int
    threads: int
    slots: int
    context: str
    prompt_tokens: float | None
    concurrency: int
    requests: int
    tokens: int
    wall_s: float
    aggregate_tps: float
    per_request_tps: float
    latency_p50_s: float | None = None
    latency_p95_s: float | None = None
    ttft_p50_s: float | None = None
    ttft_p95_s: float | None = None
    foreign_cpu_s: float | None = None

    @property
    def speculative(self) -> bool:
        return self.spec_type not in ("", "none")


@dataclass(frozen=True)
class CapacityCurve(FieldsDocument):
    """Every point of one measurement of a model on a host (`specreg capacity --json`)."""

    JSON_KIND = "capacity"
    JSON_VERSION = "1"

    host_fingerprint: str
    model_id: str
    measured_at: datetime
    points: tuple[CapacityPoint, ...]

    def point(
        self, config_label: str, layout: str, context: str, concurrency: int
    ) -> CapacityPoint | None:
        for p in self.points:
            if (p.config_label, p.layout, p.context, p.concurrency) == (
                config_label, layout, context, concurrency,
            ):  # fmt: skip
                return p
        return None

    def per_request_ratio(
        self, speculative: bool, concurrency: int, *, context: str = CONTEXT_SHORT
    ) -> float | None:
        """A configuration's per-request speed at `concurrency` over its speed alone, on the
        full instance (plain decoding, or the speculative configuration measured)."""
        pts = [p for p in self.points if p.speculative == speculative
               and p.layout == LAYOUT_FULL and p.context == context]  # fmt: skip
        alone = next((p for p in pts if p.concurrency == 1), None)
        at = next((p for p in pts if p.concurrency == concurrency), None)
        if alone is None or at is None or alone.per_request_tps <= 0:
            return None
        return at.per_request_tps / alone.per_request_tps

    def best_layout(self, concurrency: int, *, context: str = CONTEXT_SHORT) -> str | None:
        """The layout with the highest aggregate at `concurrency` (any configuration)."""
        pts = [p for p in self.points if p.concurrency == concurrency and p.context == context]
        return max(pts, key=lambda p: p.aggregate_tps).layout if pts else None


_FIELDS = tuple(CapacityPoint.__dataclass_fields__)


def record_capacity(con: duckdb.DuckDBPyConnection, curve: CapacityCurve) -> None:
    """Store a measurement (its points replace nothing: the newest measurement wins)."""
    cols = ("host_fingerprint", "model_id", "measured_at", *_FIELDS)
    marks = ", ".join("?" for _ in cols)
    with transaction(con):
        for p in curve.points:
            values = [curve.host_fingerprint, curve.model_id, curve.measured_at]
            values += [getattr(p, f) for f in _FIELDS]
            con.execute(f"INSERT INTO {CAPACITY} ({', '.join(cols)}) VALUES ({marks})", values)


def latest_capacity(
    con: duckdb.DuckDBPyConnection, host_fingerprint: str, model_id: str
) -> CapacityCurve | None:
    """The newest measurement of a model on a host, or None."""
    row = con.execute(
        f"SELECT max(measured_at) FROM {CAPACITY} WHERE host_fingerprint = ? AND model_id = ?",
        [host_fingerprint, model_id],
    ).fetchone()
    if row is None or row[0] is None:
        return None
    when = row[0]
    rows = con.execute(
        f"SELECT {', '.join(_FIELDS)} FROM {CAPACITY} WHERE host_fingerprint = ? "
        "AND model_id = ? AND measured_at = ? ORDER BY config_label, layout, context, "
        "concurrency",
        [host_fingerprint, model_id, when],
    ).fetchall()
    points = tuple(CapacityPoint(*r) for r in rows)
    return CapacityCurve(host_fingerprint, model_id, when, points)
