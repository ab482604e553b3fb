"""What goes with what: llama.cpp's draft/target rules, explained verdicts, the compatibility graph.

The functions other parts call:

- `check_pair(con, target, draft, rules=None) -> PairVerdict`
- `compatible_drafts(con, target, rules=None, include_rejected=False) -> list[PairVerdict]`
- `audit_all(con, rules=None) -> AuditResult` (every ordered pair, bucketed by vocabulary)
- `build_graph(con, rules=None) -> networkx.Graph`
- `rules_for_build(build) -> RuleSet` (None: the pinned llama.cpp build)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import duckdb

from specreg.auditor.audit import AuditResult, ClassVerdict, PairSummary, audit_all
from specreg.auditor.pairs import check_pair, compatible_drafts
from specreg.auditor.rules import PINNED_RULES, RULESETS, RuleSet, rules_for_build
from specreg.auditor.store import latest_audit_id, save_audit, stored_edges
from specreg.auditor.verdict import Check, PairVerdict, Severity, Verdict
from specreg.registry.queries import list_models

if TYPE_CHECKING:
    import networkx as nx

# The graph functions import networkx (0.07 s) when called: checking a pair needs no graph.


def build_graph(con: duckdb.DuckDBPyConnection, rules: RuleSet | None = None) -> nx.Graph:
    """Audit the registry now and return its compatibility graph."""
    from specreg.auditor.graph import graph_from_audit

    models = list_models(con)
    return graph_from_audit(models, audit_all(con, rules, models))


def audit_and_save(
    con: duckdb.DuckDBPyConnection, rules: RuleSet | None = None
) -> tuple[AuditResult, int]:
    """Audit every pair and persist the verdicts (the graph's edges) in the registry."""
    from specreg.auditor.graph import tokenizer_families

    models = list_models(con)
    result = audit_all(con, rules, models)
    return result, save_audit(con, result, tokenizer_families(models))


def stored_graph(con: duckdb.DuckDBPyConnection, audit_id: int | None = None) -> nx.Graph | None:
    """The graph of a persisted audit; by default the latest one, if no scan came after it."""
    from specreg.auditor.graph import graph_from_edges, tokenizer_families

    audit_id = audit_id or latest_audit_id(con, current=True)
    if audit_id is None:
        return None
    models = list_models(con)
    return graph_from_edges(models, stored_edges(con, audit_id), tokenizer_families(models))


__all__ = [
    "PINNED_RULES",
    "RULESETS",
    "AuditResult",
    "Check",
    "ClassVerdict",
    "PairSummary",
    "PairVerdict",
    "RuleSet",
    "Severity",
    "Verdict",
    "audit_all",
    "audit_and_save",
    "build_graph",
    "check_pair",
    "compatible_drafts",
    "rules_for_build",
    "stored_graph",
]
