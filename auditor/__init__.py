"""What goes with what: llama.cpp's draft/target rules, explained verdicts, the compatibility graph.

The functions other parts call:

- `check_pair(con, target, draft, rules=None) -> PairVerdict`
- `compatible_drafts(con, target, rules=None, include_rejected=False) -> list[PairVerdict]`
  (never a model as large as the target or larger: `not_a_draft(target, draft)` says why)
- `audit_all(con, rules=None) -> AuditResult` (every ordered pair, bucketed by vocabulary)
- `build_graph(con, rules=None) -> networkx.Graph`
- `rules_for_build(build) -> RuleSet` (None: the pinned llama.cpp build)
- `target_refusal(model) -> Check | None` (why no draft can make this model a target)
- `spec_type_refusal(spec_type, draft) -> str | None` (a head type with a plain model, or
  draft-simple with a head)
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import duckdb

from specreg.auditor.audit import AuditResult, ClassVerdict, PairSummary, audit_all
from specreg.auditor.checks import target_refusal
from specreg.auditor.pairs import (
    check_pair,
    compatible_drafts,
    draftless_modes,
    head_kind,
    not_a_draft,
    ref,
    spec_type_refusal,
)
from specreg.auditor.rules import (
    PINNED_RULES,
    RULESETS,
    RuleSet,
    rules_for_build,
    rules_for_version,
)
from specreg.auditor.store import latest_audit_id, save_audit, stored_edges
from specreg.auditor.verdict import (
    Check,
    DraftList,
    NotADraft,
    PairVerdict,
    Severity,
    Verdict,
)
from specreg.llamacpp import SpecFlag
from specreg.registry.quality_store import agreement_by_draft, agreement_json
from specreg.registry.queries import ModelRecord, list_models, resolve_model

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
    audit_id = save_audit(con, result, tokenizer_families(models))
    return dataclasses.replace(result, audit_id=audit_id), audit_id


def current_graph(con: duckdb.DuckDBPyConnection, rules: RuleSet | None = None) -> nx.Graph:
    """The graph of the latest saved audit, auditing and saving now if a scan came after it."""
    graph = stored_graph(con)
    if graph is None:
        audit_and_save(con, rules)
        graph = stored_graph(con)
    assert graph is not None
    return graph


def drafts_for(
    con: duckdb.DuckDBPyConnection,
    target: str | ModelRecord,
    rules: RuleSet | None = None,
    *,
    include_rejected: bool = False,
) -> DraftList:
    """`compatible_drafts` for `target` with the modes it can speculate in without a draft."""
    rules = rules or PINNED_RULES
    model = target if isinstance(target, ModelRecord) else resolve_model(con, target)
    found = compatible_drafts(
        con, model, rules, include_rejected=include_rejected, include_larger=True
    )
    by_id = {m.model_id: m for m in list_models(con)}
    drafts, not_drafts = [], []
    for pv in found:
        why = not_a_draft(model, by_id[pv.draft.model_id])
        if why is None:
            drafts.append(pv)
        else:
            not_drafts.append(NotADraft(pv, why))
    measured = agreement_by_draft(con, model.model_id)  # `specreg agree`
    return DraftList(
        target=ref(model),
        draftless=draftless_modes(model, rules),
        spec_type_flag=rules.spec_type_flag or SpecFlag.TYPE,
        drafts=tuple(drafts),
        agreement={d: agreement_json(records) for d, records in measured.items()},
        not_drafts=tuple(not_drafts),
    )


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
    "DraftList",
    "NotADraft",
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
    "current_graph",
    "drafts_for",
    "head_kind",
    "not_a_draft",
    "rules_for_build",
    "rules_for_version",
    "spec_type_refusal",
    "stored_graph",
    "target_refusal",
]
