"""Audits in the registry: an `AuditResult` as the registry's audit rows, and back.

The statements live in `specreg.registry.audits`; this module only translates.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from specreg.auditor.audit import AuditResult, PairSummary
from specreg.registry.audits import (
    AuditClass,
    AuditRun,
    StoredEdge,
    latest_audit_id,
    stored_edges,
    stored_families,
)
from specreg.registry.audits import save_audit as _save

if TYPE_CHECKING:
    import duckdb


def save_audit(
    con: duckdb.DuckDBPyConnection, result: AuditResult, families: dict[str, str]
) -> int:
    """Write one audit in one transaction; returns its id. `families`: model id -> family."""
    run = AuditRun(
        rules_label=result.rules_label,
        llama_build=result.llama_build,
        n_models=result.n_models,
        n_pairs=result.n_pairs,
        counts=result.counts,
        refusals=result.refusals,
        vocab_comparisons=result.vocab_comparisons,
        seconds=result.seconds,
    )
    classes = [
        AuditClass(class_id, model_id, families.get(model_id))
        for class_id, model_ids in result.classes
        for model_id in model_ids
    ]
    return _save(con, run, classes, result.class_verdicts, [edge(p) for p in result.pairs])


def edge(p: PairSummary) -> StoredEdge:
    """The stored form of one of the auditor's pair verdicts."""
    return StoredEdge(p.target_id, p.draft_id, p.verdict.value, p.llama_accepts, p.findings)


__all__ = ["StoredEdge", "edge", "latest_audit_id", "save_audit", "stored_edges", "stored_families"]
