"""Gather the report's data model from every part of specreg, once, before any rendering.

Each part is read in one function here, through that part's public API. A part that has
nothing to say yet (no runs recorded, no audit possible) yields an empty section and a
`PartStatus` note saying so; nothing is invented to fill the gap.
"""

from __future__ import annotations

import logging
import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import duckdb
from gguf.constants import Keys

from specreg.errors import UsageError
from specreg.registry import queries
from specreg.registry.queries import ModelRecord, file_errors, list_models
from specreg.reports.data import (
    VERDICT_CODES,
    Matrix,
    ModelView,
    PairView,
    PartStatus,
    ProblemView,
    RecView,
    Roofline,
    RunView,
    TokFamily,
)
from specreg.terms import TASKS

if TYPE_CHECKING:
    from specreg.registry.run_store import RunRecord

log = logging.getLogger(__name__)

NOT_RECOMMENDED = (
    "left out of this report (--no-recommend): `specreg report` without it adds the "
    "recommender's answer, or ask `specreg recommend TARGET --task TASK`"
)
_UNSAFE_FILE_CHARS = re.compile(r"[^A-Za-z0-9_.-]+")


def page_name(model_id: str) -> str:
    """A file name for a model's page: ids are hashes, but never trust them with a path."""
    return "target-" + (_UNSAFE_FILE_CHARS.sub("_", model_id)[:64] or "unknown") + ".html"


# --- registry -------------------------------------------------------------------------------


@dataclass(frozen=True)
class RegistryPart:
    models: tuple[ModelView, ...]
    families: tuple[TokFamily, ...]
    scans: tuple[queries.ScanRecord, ...]
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


def scan_history(con: duckdb.DuckDBPyConnection, limit: int = 20) -> tuple[queries.ScanRecord, ...]:
    return tuple(queries.scan_history(con, limit))


def chat_templates(con: duckdb.DuckDBPyConnection) -> dict[str, str]:
    """Each model's chat template text (shown on its page; hostile like every GGUF string)."""
    values = queries.kv_values(con, Keys.Tokenizer.CHAT_TEMPLATE)
    return {model_id: text for model_id, text in values.items() if isinstance(text, str)}


# --- auditor --------------------------------------------------------------------------------


@dataclass(frozen=True)
class AuditPart:
    pairs: tuple[PairView, ...]  # pairs whose vocabularies agree (the rest is refused)
    matrix: Matrix | None
    graph: Any  # networkx.Graph of compatible pairs, or None
    status: PartStatus
    # ordered pairs per verdict, every model with every other both ways: `specreg audit`'s count
    counts: Mapping[str, int] = field(default_factory=dict)


def gather_audit(
    con: duckdb.DuckDBPyConnection, models: Sequence[ModelView], rules: Any = None
) -> AuditPart:
    """Audit every ordered pair once; explain each verdict with its first failing check."""
    try:
        from specreg.auditor import audit_all
        from specreg.auditor.graph import graph_from_audit
    except ImportError as err:
        log.info("auditor unavailable: %s", err)
        return AuditPart((), None, None, PartStatus("auditor", False, "the auditor is missing"))
    records = [m.record for m in models]
    result = audit_all(con, rules, records)
    # The graph from this audit: build_graph(con) would audit the registry a second time.
    graph = graph_from_audit(records, result)
    explain = Explainer(con, records, result, rules)
    pairs = tuple(explain.pair(p) for p in result.pairs)
    matrix = build_matrix(models, pairs, explain)
    note = "" if len(models) > 1 else "fewer than two models: no pairs to audit"
    status = PartStatus("auditor", True, note, detail=f"llama.cpp rules: {result.rules_label}")
    return AuditPart(pairs, matrix, graph, status, dict(result.counts))


class Explainer:
    """Turns the auditor's compact verdicts into reasons with their numbers.

    `audit_all` settles most pairs per vocabulary class and keeps only check names; the
    messages (with both sides' values) come from the auditor's own `judge`, run once per
    refused class pair and once per accepted pair that is not plainly compatible.
    """

    def __init__(self, con: duckdb.DuckDBPyConnection, models: Sequence[ModelRecord],
                 result: Any, rules: Any = None) -> None:  # fmt: skip
        from specreg.auditor.pairs import VocabCache
        from specreg.auditor.rules import PINNED_RULES

        self.by_id = {m.model_id: m for m in models}
        self.rules = rules or PINNED_RULES
        self.vocabs = VocabCache(con)
        self.class_of = {mid: cid for cid, mids in result.classes for mid in mids}
        self.reps = {cid: self.by_id[mids[0]] for cid, mids in result.classes if mids}
        self.refused = {
            (cv.target_class, cv.draft_class): cv for cv in result.class_verdicts if not cv.accepts
        }
        self._class_reason: dict[tuple[int, int], str] = {}
        self._outcomes: dict[tuple[int, int], Any] = {}

    def class_key(self, model_id: str) -> str:
        """Cells of two models with the same key get the same class-level refusal."""
        cid = self.class_of.get(model_id)
        return f"c{cid}" if cid is not None else f"m{model_id}"

    def refusal(self, target_id: str, draft_id: str) -> str | None:
        """The reason a class-level refusal covers this pair, or None if it does not."""
        key = (self.class_of.get(target_id, -1), self.class_of.get(draft_id, -1))
        cv = self.refused.get(key)
        if cv is None:
            return None
        if key not in self._class_reason:
            from specreg.auditor.checks import vocab_checks
            from specreg.auditor.pairs import judge

            t, d = self.reps[key[0]], self.reps[key[1]]
            # Token texts are loaded only when they are the reason (they say which id first
            # differs); the other vocabulary rules read the records' scalars.
            texts = cv.failed[0] == "token_text"
            vt = self.vocabs.get(t.vocab_sha) if texts else None
            vd = self.vocabs.get(d.vocab_sha) if texts else None
            outcome = vocab_checks(t, d, vt, vd, self.rules)
            pv = judge(t, d, self.rules, self.vocabs, outcome)
            first = next((c for c in pv.failed if c.name == cv.failed[0]), None)
            self._class_reason[key] = (first.message if first else "") or cv.failed[0]
        return self._class_reason[key]

    def pair(self, p: Any) -> PairView:
        from specreg.auditor.checks import vocab_checks
        from specreg.auditor.pairs import judge

        t, d = self.by_id[p.target_id], self.by_id[p.draft_id]
        outcome = None
        if not d.draft_kind:
            key = (self.class_of[t.model_id], self.class_of[d.model_id])
            if key not in self._outcomes:
                vt, vd = self.reps[key[0]], self.reps[key[1]]
                self._outcomes[key] = vocab_checks(
                    vt, vd, self.vocabs.get(vt.vocab_sha), self.vocabs.get(vd.vocab_sha),
                    self.rules,
                )  # fmt: skip
            outcome = self._outcomes[key]
        pv = judge(t, d, self.rules, self.vocabs, outcome)
        return pair_view(pv)


def pair_view(p: Any) -> PairView:
    """A PairView of the auditor's full PairVerdict."""
    verdict = getattr(p.verdict, "value", p.verdict)
    reasons = tuple(p.reasons) or tuple(p.warnings)
    return PairView(
        target_id=p.target.model_id,
        draft_id=p.draft.model_id,
        code=VERDICT_CODES.get(str(verdict), 0),
        reason=reasons[0] if reasons else "",
        remedies=tuple(p.remedies),
        spec_type=p.spec_type,
        flags=tuple(p.flags),
    )


def build_matrix(
    models: Sequence[ModelView], pairs: Iterable[PairView], explain: Explainer
) -> Matrix | None:
    """Targets (largest first) by drafts (smallest first): every present model on both axes,
    except that draft heads (EAGLE-3, DFlash) are never targets."""
    if len(models) < 2:
        return None
    by_pair = {(p.target_id, p.draft_id): p for p in pairs}
    targets = sorted(
        (m for m in models if not m.record.draft_kind),
        key=lambda m: (-m.n_params, m.name, m.model_id),
    )
    drafts = sorted(models, key=lambda m: (m.n_params, m.name, m.model_id))
    reasons: dict[str, int] = {}

    def reason_index(reason: str) -> int:
        return reasons.setdefault(reason, len(reasons)) if reason else -1

    # Most cells are settled by a refused vocabulary class pair: one reason per class pair.
    by_class: dict[tuple[str, str], tuple[str, int]] = {}
    codes, index = [], []
    draft_keys = [(d.model_id, explain.class_key(d.model_id)) for d in drafts]
    for t in targets:
        tid, tkey = t.model_id, explain.class_key(t.model_id)
        row_codes, row_index = [], []
        for did, dkey in draft_keys:
            p = by_pair.get((tid, did))
            if p is not None:
                cell = (str(p.code), reason_index(p.reason))
            elif tid == did:
                cell = ("0", -1)
            else:
                key = (tkey, dkey)
                cell = by_class.get(key)  # type: ignore[assignment]
                if cell is None:
                    refused = explain.refusal(tid, did)
                    cell = ("4", reason_index(refused)) if refused is not None else ("0", -1)
                    by_class[key] = cell
            row_codes.append(cell[0])
            row_index.append(cell[1])
        codes.append("".join(row_codes))
        index.append(tuple(row_index))
    return Matrix(
        tuple(m.model_id for m in targets),
        tuple(m.model_id for m in drafts),
        tuple(codes),
        tuple(reasons),
        tuple(index),
    )


# --- runner (recorded runs) -----------------------------------------------------------------


def gather_runs(con: duckdb.DuckDBPyConnection) -> tuple[tuple[RunView, ...], PartStatus]:
    try:
        from specreg.registry.run_store import list_runs
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
        experts=r.experts,
    )


# --- recommender ----------------------------------------------------------------------------

# (con, target, task) -> (the recommender's Recommendation, the best option's exact command).
# The caller binds the trained model, this host's facts and the user's llama.cpp build.
Advise = Callable[[duckdb.DuckDBPyConnection, ModelRecord, str], tuple[Any, str]]


def gather_recommendations(
    con: duckdb.DuckDBPyConnection,
    target: ModelView,
    runs: Sequence[RunView],
    advise: Advise | None,
    tasks: Sequence[str] = TASKS,
) -> tuple[tuple[RecView, ...], Roofline | None, str]:
    """The recommendation per task for one target, next to what was measured."""
    baseline = _measured_baseline(runs)
    roofline = Roofline(None, None, baseline) if baseline is not None else None
    if advise is None:
        return (), roofline, NOT_RECOMMENDED
    recs: list[RecView] = []
    for task in tasks:
        try:
            rec, command = advise(con, target.record, task)
        except UsageError as err:  # e.g. a vocab-only file: nothing to predict from
            return (), roofline, f"no recommendation: {err}"
        recs.append(rec_view(task, rec, command))
        roof = rec.roofline
        roofline = Roofline(
            roof.bound_tps,
            roof.bandwidth_gbs,
            baseline,
            predicted_baseline_tps=None if roof.baseline_measured else roof.baseline_tps,
            bandwidth_source=roof.bandwidth_source,
        )
    return tuple(recs), roofline, ""


def rec_view(task: str, rec: Any, command: str) -> RecView:
    best = rec.best
    return RecView(
        task=task,
        label=best.label if rec.speculate else "plain decoding: do not speculate",
        predicted_tps=best.tps,
        predicted_low=best.tps_lo,
        predicted_high=best.tps_hi,
        speedup=best.speedup,
        speedup_low=best.speedup_lo,
        speedup_high=best.speedup_hi,
        command=command,
        lossless=best.lossless,
        why=tuple(best.why),
        advice=tuple(rec.advice),
        measured_tps=best.measured_tps,
    )


def _measured_baseline(runs: Sequence[RunView]) -> float | None:
    values = sorted(r.tokens_per_s for r in runs if r.ok and r.is_baseline and r.tokens_per_s)
    return values[len(values) // 2] if values else None
