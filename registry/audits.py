"""The audit tables (migration 3): saved audits, their vocabulary classes and verdicts, and the
ordered pairs those verdicts do not settle (the compatibility graph's edges).

The auditor decides; this module only stores and reads its rows (`auditor/store.py` turns an
`AuditResult` into them). Rows are plain frozen dataclasses, so the registry needs nothing
from the parts to its right.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from specreg.registry.sql import transaction
from specreg.registry.tables import insert_rows

if TYPE_CHECKING:
    import duckdb


@dataclass(frozen=True)
class AuditRun:
    """One `audit_runs` row (the id and time are given when it is saved)."""

    rules_label: str
    llama_build: int
    n_models: int
    n_pairs: int
    counts: dict[str, int]
    refusals: dict[str, int]
    vocab_comparisons: int
    seconds: float


@dataclass(frozen=True)
class AuditClass:
    class_id: int
    model_id: str
    family: str | None  # tokenizer family label


@dataclass(frozen=True)
class AuditClassVerdict:
    """The vocabulary check between two classes of models (the auditor's ClassVerdict)."""

    target_class: int
    draft_class: int
    accepts: bool
    failed: tuple[str, ...]
    n_pairs: int


@dataclass(frozen=True)
class StoredEdge:
    """One `audit_pairs` row: an ordered pair's verdict."""

    target_id: str
    draft_id: str
    verdict: str
    llama_accepts: bool | None
    findings: tuple[str, ...]


def save_audit(
    con: duckdb.DuckDBPyConnection,
    run: AuditRun,
    classes: Sequence[AuditClass],
    class_verdicts: Sequence[AuditClassVerdict],
    pairs: Sequence[StoredEdge],
) -> int:
    """Write one audit in one transaction; returns its id."""
    with transaction(con):
        row = con.execute("SELECT coalesce(max(audit_id), 0) + 1 FROM audit_runs").fetchone()
        audit_id = int(row[0]) if row else 1
        con.execute(
            "INSERT INTO audit_runs (audit_id, created_at, rules_label, llama_build, n_models,"
            " n_pairs, counts, refusals, vocab_comparisons, seconds)"
            " VALUES (?, current_timestamp, ?, ?, ?, ?, ?, ?, ?, ?)",
            [
                audit_id,
                run.rules_label,
                run.llama_build,
                run.n_models,
                run.n_pairs,
                json.dumps(run.counts),
                json.dumps(run.refusals),
                run.vocab_comparisons,
                run.seconds,
            ],
        )
        for table, rows in (
            ("audit_classes", classes),
            ("audit_class_verdicts", class_verdicts),
            ("audit_pairs", pairs),
        ):
            insert_rows(
                con,
                table,
                [{"audit_id": audit_id, **_row(r)} for r in rows],
            )
    return audit_id


def _row(r: AuditClass | AuditClassVerdict | StoredEdge) -> dict[str, object]:
    row = dataclasses.asdict(r)
    for name in ("failed", "findings"):
        if name in row:
            row[name] = list(row[name])
    return row


def latest_audit_id(con: duckdb.DuckDBPyConnection, *, current: bool = False) -> int | None:
    """The newest saved audit; with `current`, only if no scan finished after it."""
    row = con.execute("SELECT max(audit_id) FROM audit_runs").fetchone()
    if row is None or row[0] is None:
        return None
    audit_id = int(row[0])
    if current:
        stale = con.execute(
            "SELECT count(*) FROM scans WHERE finished_at > "
            "(SELECT created_at FROM audit_runs WHERE audit_id = ?)",
            [audit_id],
        ).fetchone()
        if stale and stale[0]:
            return None
    return audit_id


def stored_edges(con: duckdb.DuckDBPyConnection, audit_id: int) -> list[StoredEdge]:
    rows = con.execute(
        "SELECT target_id, draft_id, verdict, llama_accepts, findings FROM audit_pairs"
        " WHERE audit_id = ? ORDER BY target_id, draft_id",
        [audit_id],
    ).fetchall()
    return [
        StoredEdge(target_id, draft_id, verdict, accepts, tuple(findings or ()))
        for target_id, draft_id, verdict, accepts, findings in rows
    ]


def stored_families(con: duckdb.DuckDBPyConnection, audit_id: int) -> dict[str, str]:
    """model id -> tokenizer family label, as the audit saw them."""
    rows = con.execute(
        "SELECT model_id, family FROM audit_classes WHERE audit_id = ?", [audit_id]
    ).fetchall()
    return {model_id: family for model_id, family in rows}
