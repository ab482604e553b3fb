"""Audits in the registry: the auditor's tables (migration 3) and their reads and writes."""

from __future__ import annotations

import json
from dataclasses import dataclass

import duckdb

from specreg.auditor.audit import AuditResult
from specreg.registry.db import transaction
from specreg.registry.tables import insert_rows


@dataclass(frozen=True)
class StoredEdge:
    target_id: str
    draft_id: str
    verdict: str
    llama_accepts: bool | None
    findings: tuple[str, ...]


def save_audit(
    con: duckdb.DuckDBPyConnection, result: AuditResult, families: dict[str, str]
) -> int:
    """Write one audit in one transaction; returns its id. `families`: model id -> family."""
    with transaction(con):
        row = con.execute("SELECT coalesce(max(audit_id), 0) + 1 FROM audit_runs").fetchone()
        audit_id = int(row[0]) if row else 1
        con.execute(
            "INSERT INTO audit_runs VALUES (?, current_timestamp, ?, ?, ?, ?, ?, ?, ?, ?)",
            [
                audit_id,
                result.rules_label,
                result.llama_build,
                result.n_models,
                result.n_pairs,
                json.dumps(result.counts),
                json.dumps(result.refusals),
                result.vocab_comparisons,
                result.seconds,
            ],
        )
        insert_rows(
            con,
            "audit_classes",
            [
                {
                    "audit_id": audit_id,
                    "class_id": cid,
                    "model_id": mid,
                    "family": families.get(mid),
                }
                for cid, mids in result.classes
                for mid in mids
            ],
        )
        insert_rows(
            con,
            "audit_class_verdicts",
            [
                {
                    "audit_id": audit_id,
                    "target_class": cv.target_class,
                    "draft_class": cv.draft_class,
                    "accepts": cv.accepts,
                    "failed": list(cv.failed),
                    "n_pairs": cv.n_pairs,
                }
                for cv in result.class_verdicts
            ],
        )
        insert_rows(
            con,
            "audit_pairs",
            [
                {
                    "audit_id": audit_id,
                    "target_id": p.target_id,
                    "draft_id": p.draft_id,
                    "verdict": p.verdict.value,
                    "llama_accepts": p.llama_accepts,
                    "findings": list(p.findings),
                }
                for p in result.pairs
            ],
        )
    return audit_id


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
    return [StoredEdge(t, d, v, a, tuple(f or ())) for t, d, v, a, f in rows]


def stored_families(con: duckdb.DuckDBPyConnection, audit_id: int) -> dict[str, str]:
    rows = con.execute(
        "SELECT model_id, family FROM audit_classes WHERE audit_id = ?", [audit_id]
    ).fetchall()
    return {m: f for m, f in rows}
