"""Gather the report's data model from every part of specreg, once, before any rendering.

Each part is read in one function here, through that part's public API. A part that has
nothing to say yet (no runs recorded, no audit possible) yields an empty section and a
`PartStatus` note saying so; nothing is invented to fill the gap.
"""

from __future__ import annotations

import logging
import re
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

import duckdb
from specreg.registry.queries import ModelRecord, file_errors, list_models
from specreg.reports.data import (
    VERDICT_CODES,
    CheckView,
    Matrix,
    ModelView,
    PairView,
    PartStatus,
    ProblemView,
    RecView,
    Roofline,
    RunView,
    ScanView,
    TokFamily,
)

if TYPE_CHECKING:
    from specreg.registry.runs import RunRecord

log = logging.getLogger(__name__)

NO_RECOMMENDER = "the recommender is not available"
TASKS = ("code", "prose", "summarize", "json", "math", "chat")
_UNSAFE_FILE_CHARS = re.compile(r"[^A-Za-z0-9_.-]+")


def page_name(model_id: str) -> str:
    """A file name for a model's page: ids are hashes, but never trust them with a path."""
    return "target-" + (_UNSAFE_FILE_CHARS.sub("_", model_id)[:64] or "unknown") + ".html"


# --- registry -------------------------------------------------------------------------------


@dataclass(frozen=True)
class RegistryPart:
    models: tuple[ModelView, ...]
    families: tuple[TokFamily, ...]
    scans: tuple[ScanView, ...]
    problems: tuple[ProblemView, ...]


def gather_registry(con: duckdb.DuckDBPyConnection) -> RegistryPart:
    records = list_models(con)
    families = tokenizer_families(records)
    family_of = {mid: f.index for f in families for mid in f.model_ids}
    models = tuple(
        ModelView(r, family_of[r.model_id or ""], page_name(r.model_id or "")) for r in records
    )
    problems = tuple(ProblemView(p.path, p.reason) for p in file_errors(con))
    return RegistryPart(models, families, scan_history(con), problems)


def tokenizer_families(records: Sequence[ModelRecord]) -> tuple[TokFamily, ...]:
    """Group models by tokenizer fingerprint; the largest family gets index 1."""
    groups: dict[str, list[ModelRecord]] = defaultdict(list)
    for r in records:
        groups[r.tok_fingerprint or "unknown"].append(r)
    ordered = sorted(groups.items(), key=lambda kv: (kv[0] == "unknown", -len(kv[1]), kv[0]))
    families = []
    for i, (key, members) in enumerate(ordered, start=1):
        head = members[0]
        families.append(
            TokFamily(
                key=key,
                index=i,
                tok_model=head.tok_model,
                tok_pre=head.tok_pre,
                n_tokens=head.n_tokens,
                model_ids=tuple(m.model_id or "" for m in members),
            )
        )
    return tuple(families)


def scan_history(con: duckdb.DuckDBPyConnection, limit: int = 20) -> tuple[ScanView, ...]:
    # The registry has no query function for the scans table yet; this is the one read of it.
    rows = con.execute(
        # epoch(): reading TIMESTAMPTZ values directly would need pytz in the environment.
        "SELECT scan_id, epoch(started_at), seconds, roots, host, n_files, n_new, n_changed,"
        " n_removed, n_errors FROM scans ORDER BY scan_id DESC LIMIT ?",
        [limit],
    ).fetchall()
    return tuple(
        ScanView(r[0], _utc(r[1]), r[2], tuple(r[3] or ()), r[4], r[5], r[6], r[7], r[8], r[9])
        for r in rows
    )


def _utc(epoch: float | None) -> datetime | None:
    return None if epoch is None else datetime.fromtimestamp(epoch, timezone.utc)


# --- auditor --------------------------------------------------------------------------------


def gather_audit(con: duckdb.DuckDBPyConnection) -> tuple[tuple[PairView, ...], Any, PartStatus]:
    """All audited pairs and the auditor's compatibility graph (None when unavailable)."""
    try:
        from specreg.auditor import audit_all, build_graph
    except ImportError as err:
        log.info("auditor unavailable: %s", err)
        return (), None, PartStatus("auditor", False, "the auditor is not available")
    result = audit_all(con)
    pairs = tuple(pair_view(p) for p in getattr(result, "pairs", result))
    graph = build_graph(con)
    note = "" if pairs else "fewer than two models with a tokenizer: no pairs to audit"
    return pairs, graph, PartStatus("auditor", True, note)


def pair_view(p: Any) -> PairView:
    verdict = getattr(p.verdict, "value", p.verdict)
    code = VERDICT_CODES.get(str(verdict), 0)
    checks = tuple(
        CheckView(c.name, bool(c.passed), str(getattr(c.severity, "value", c.severity)), c.message)
        for c in p.checks
    )
    reasons = tuple(p.reasons) or tuple(p.warnings)
    return PairView(
        target_id=p.target.model_id,
        draft_id=p.draft.model_id,
        code=code,
        reason=reasons[0] if reasons else "",
        checks=checks,
        remedies=tuple(p.remedies),
        spec_type=p.spec_type,
    )


def build_matrix(models: Sequence[ModelView], pairs: Iterable[PairView]) -> Matrix | None:
    """Targets (largest first) by drafts (smallest first), over the pairs the auditor judged."""
    by_pair: dict[tuple[str, str], PairView] = {}
    for p in pairs:
        by_pair[(p.target_id, p.draft_id)] = p
    if not by_pair:
        return None
    size = {m.model_id: m.n_params for m in models}
    name = {m.model_id: m.name for m in models}
    t_ids = {t for t, _ in by_pair}
    d_ids = {d for _, d in by_pair}
    targets = sorted(t_ids, key=lambda i: (-size.get(i, 0), name.get(i, ""), i))
    drafts = sorted(d_ids, key=lambda i: (size.get(i, 0), name.get(i, ""), i))
    reasons: dict[str, int] = {}
    codes, index = [], []
    for t in targets:
        row_codes, row_index = [], []
        for d in drafts:
            p = by_pair.get((t, d))
            if p is None:
                row_codes.append("0")
                row_index.append(-1)
                continue
            row_codes.append(str(p.code))
            row_index.append(reasons.setdefault(p.reason, len(reasons)) if p.reason else -1)
        codes.append("".join(row_codes))
        index.append(tuple(row_index))
    return Matrix(tuple(targets), tuple(drafts), tuple(codes), tuple(reasons), tuple(index))


# --- runner (recorded runs) -----------------------------------------------------------------


def gather_runs(con: duckdb.DuckDBPyConnection) -> tuple[tuple[RunView, ...], PartStatus]:
    try:
        from specreg.registry.runs import list_runs
    except ImportError:
        return (), PartStatus("runs", False, "no runs recorded yet (the runs store is missing)")
    records = list_runs(con)
    tps = {r.run_id: r.tokens_per_s for r in records}
    views = tuple(run_view(r, tps.get(r.baseline_run_id)) for r in records)
    return views, PartStatus("runs", True, "" if views else "no runs recorded yet")


def run_view(r: RunRecord, baseline_tps: float | None) -> RunView:
    detail = r.verdict_reason or r.error or r.llama_message or ""
    return RunView(
        run_id=int(r.run_id or 0),
        kind=r.kind,
        status=r.status,
        started_at=r.started_at,
        target_id=r.target_model_id,
        draft_id=r.draft_model_id,
        config=r.config_label,
        spec_type=r.spec_type,
        k=r.k,
        task=r.task,
        tokens_per_s=r.tokens_per_s,
        baseline_tokens_per_s=baseline_tps,
        speedup=r.speedup,
        acceptance=r.acceptance,
        verdict=r.verdict,
        detail=detail.splitlines()[0] if detail else "",
        host=r.host_fingerprint,
    )


def _attr(obj: Any, *names: str) -> Any:
    for n in names:
        if hasattr(obj, n):
            return getattr(obj, n)
    return None


# --- recommender ----------------------------------------------------------------------------


def gather_recommendations(
    con: duckdb.DuckDBPyConnection, target: ModelView, runs: Sequence[RunView]
) -> tuple[tuple[RecView, ...], Roofline | None, str]:
    """The recommendation per task for one target, with the measured run of each, if any."""
    try:
        from specreg import recommender
    except ImportError:
        return (), None, NO_RECOMMENDER
    recommend = getattr(recommender, "recommend", None)
    if recommend is None:
        return (), None, NO_RECOMMENDER
    baseline = _measured_baseline(runs)
    recs: list[RecView] = []
    roofline: Roofline | None = None
    for task in TASKS:
        rec = recommend(con, target.record, task=task)
        best = _attr(rec, "best") or (_attr(rec, "configs") or [None])[0]
        if roofline is None:
            roof = _attr(rec, "roofline")
            if roof is not None:
                roofline = Roofline(
                    _attr(roof, "bound_tps", "tokens_per_s"),
                    _attr(roof, "bandwidth_gbs", "bandwidth"),
                    baseline,
                )
        if best is None:
            continue
        recs.append(rec_view(task, best, runs))
    if roofline is None and baseline is not None:
        roofline = Roofline(None, None, baseline)
    return tuple(recs), roofline, "" if recs else "no recommendation for this target"


def rec_view(task: str, cfg: Any, runs: Sequence[RunView]) -> RecView:
    k = _attr(cfg, "k")
    draft = _attr(cfg, "draft_id")
    spec = _attr(cfg, "spec_type")
    measured = [
        r.tokens_per_s
        for r in runs
        if r.ok
        and r.task == task
        and r.k == k
        and r.draft_id == draft
        and r.spec_type == spec
        and r.tokens_per_s
    ]
    why = _attr(cfg, "why", "reasons") or ()
    return RecView(
        task=task,
        label=str(_attr(cfg, "label") or spec or "baseline"),
        predicted_tps=_attr(cfg, "predicted_tps", "tokens_per_s"),
        predicted_low=_attr(cfg, "tps_low", "predicted_low"),
        predicted_high=_attr(cfg, "tps_high", "predicted_high"),
        speedup=_attr(cfg, "speedup"),
        speedup_low=_attr(cfg, "speedup_low"),
        speedup_high=_attr(cfg, "speedup_high"),
        command=str(_attr(cfg, "command") or ""),
        lossless=bool(_attr(cfg, "lossless")),
        why=tuple(str(w) for w in why),
        measured_tps=sorted(measured)[len(measured) // 2] if measured else None,
    )


def _measured_baseline(runs: Sequence[RunView]) -> float | None:
    values = sorted(r.tokens_per_s for r in runs if r.ok and r.is_baseline and r.tokens_per_s)
    return values[len(values) // 2] if values else None
