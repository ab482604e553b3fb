"""The one place `specreg.declare` touches the other parts: registry, auditor, runner.

Each dependency sits behind one small function here, so the rest of the package reasons about
plain frozen dataclasses and a change of name elsewhere is a change in one line here.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb

from specreg.terms import SPEC_FILE_DIALECTS


@dataclass(frozen=True)
class DiskModel:
    """What the registry knows about one model (a subset of the `models` columns)."""

    model_id: str
    status: str  # present | incomplete | gone
    path: str
    paths: tuple[str, ...]
    parts_missing: tuple[str, ...]
    name: str | None
    architecture: str | None
    quant: str | None
    n_params: int | None
    expert_count: int | None
    expert_used_count: int | None
    expert_used_key: str | None


@dataclass(frozen=True)
class PairCheck:
    compatible: bool
    verdict: str
    reasons: tuple[str, ...]


@dataclass(frozen=True)
class MeasuredRun:
    """One recorded run, reduced to what reconciling a pinned configuration needs."""

    run_id: str
    target_id: str
    draft_id: str | None
    spec_types: tuple[str, ...]
    draft_max: int | None
    experts: int | None
    task: str | None
    tokens_per_s: float | None
    acceptance: float | None  # fraction
    ok: bool  # verified / not failed
    lossless: bool  # no behaviour-changing knob (all experts, same temperature)
    host: str | None
    date: str | None
    protocol: str | None


_MODEL_FIELDS = [f.name for f in dataclasses.fields(DiskModel)]


def _to_disk_model(rec: Any) -> DiskModel:
    get = rec.get if isinstance(rec, dict) else lambda k, d=None: getattr(rec, k, d)
    vals: dict[str, Any] = {k: get(k, None) for k in _MODEL_FIELDS}
    vals["paths"] = tuple(vals["paths"] or (vals["path"],))
    vals["parts_missing"] = tuple(vals["parts_missing"] or ())
    return DiskModel(**vals)


def scan(con: duckdb.DuckDBPyConnection, paths: Sequence[Path], *, all_files: bool = False) -> Any:
    from specreg.registry.scan import scan_paths

    return scan_paths(con, [str(p) for p in paths], all_files=all_files)


def list_models(con: duckdb.DuckDBPyConnection) -> list[DiskModel]:
    """Every model the registry knows, gone ones included (a declared model may be gone)."""
    from specreg.registry.queries import list_models as _list

    return [_to_disk_model(r) for r in _list(con, include_gone=True)]


@dataclass(frozen=True)
class BestDraft:
    """The draft `specreg drafts` ranks first for a target, and how it speculates."""

    target_id: str
    draft_id: str
    spec_type: str  # draft-simple, draft-eagle3, ...
    verdict: str  # the auditor's: compatible | warnings


def best_drafts(con: duckdb.DuckDBPyConnection) -> list[BestDraft]:
    """Each model on disk that has a compatible draft, with the one the auditor ranks first."""
    from specreg.auditor import drafts_for
    from specreg.registry.queries import list_models as _list

    out = []
    for model in _list(con):
        pv = next((p for p in drafts_for(con, model).drafts if p.spec_type), None)
        if pv is not None and pv.spec_type is not None:
            verdict = str(getattr(pv.verdict, "value", pv.verdict))
            out.append(BestDraft(model.model_id, pv.draft.model_id, pv.spec_type, verdict))
    return out


def scanned_roots(con: duckdb.DuckDBPyConnection) -> list[str]:
    """The folders and files the registry's scans read, first scanned first, that still exist."""
    from specreg.registry.queries import scan_history

    seen: dict[str, None] = {}
    for record in reversed(scan_history(con, limit=10_000)):
        for root in record.roots:
            seen.setdefault(root, None)
    return [r for r in seen if os.path.exists(r)]


def model_by_id(con: duckdb.DuckDBPyConnection, model_id: str) -> DiskModel | None:
    from specreg.registry.queries import get_model

    rec = get_model(con, model_id)
    return _to_disk_model(rec) if rec is not None else None


def model_at_path(con: duckdb.DuckDBPyConnection, path: Path) -> DiskModel | None:
    """The model whose file (any part, or a symlink to it) is at `path`, if scanned."""
    from specreg.registry.queries import model_id_at_path

    real = os.path.realpath(path)
    cands = {str(path), real}
    for m in list_models(con):
        if m.status != "gone" and cands & set(m.paths):
            return m
    model_id = model_id_at_path(con, path, ok_only=True)
    return model_by_id(con, model_id) if model_id else None


def check_pair(con: duckdb.DuckDBPyConnection, target_id: str, draft_id: str) -> PairCheck:
    from specreg.auditor.pairs import check_pair as _check

    v = _check(con, target_id, draft_id)
    verdict = getattr(v.verdict, "value", v.verdict)
    return PairCheck(bool(v.compatible), str(verdict), tuple(str(r) for r in v.reasons))


def protocol_of(
    prompt_set: str | None,
    task: str | None,
    n_predict: int | None,
    repeats: int | None,
    threads: int | None,
) -> str:
    """What makes two speeds comparable besides the host: prompts, length, repeats, threads."""
    return f"{prompt_set or task or '?'}/n{n_predict or '?'}/x{repeats or '?'}/t{threads or '?'}"


def measured_runs(
    con: duckdb.DuckDBPyConnection, target_id: str | None = None
) -> list[MeasuredRun]:
    """Recorded runs of the runner (all, or those of one target), reduced for reconciling."""
    from specreg.registry.run_store import list_runs

    out = []
    for r in list_runs(con, model_id=target_id):
        if not r.target_model_id or (target_id is not None and r.target_model_id != target_id):
            continue
        types = tuple(t for t in (r.spec_type or "none").split(",") if t)
        out.append(
            MeasuredRun(
                run_id=str(r.run_id),
                target_id=r.target_model_id,
                draft_id=r.draft_model_id,
                spec_types=types,
                draft_max=r.k
                if r.draft_model_id or (r.spec_type or "").startswith("ngram-mod")
                else None,
                experts=r.experts,
                task=r.task,
                tokens_per_s=r.tokens_per_s,
                acceptance=r.acceptance,
                # a replayed or warm-server figure of a stateful method is no evidence
                ok=r.first_use_evidence and r.verdict != "fail",
                lossless=not r.behaviour_changing and r.experts is None,
                host=r.host_fingerprint,
                date=r.started_at.isoformat() if r.started_at else None,
                protocol=protocol_of(r.prompt_set, r.task, r.n_predict, r.repeats, r.threads),
            )
        )
    return out


DIALECT_NAMES = SPEC_FILE_DIALECTS


def detect_dialect(bin_dir: Path | None) -> str | None:
    """`current` or `legacy` for the llama-server in `bin_dir`, or None if it cannot be told."""
    if bin_dir is None:
        return None
    from specreg.errors import LlamaError
    from specreg.llama.install import probe_install

    try:
        inst = probe_install(bin_dir, "specreg.yaml llama.bin_dir")
    except LlamaError:
        return None
    return next(k for k, v in DIALECT_NAMES.items() if v == inst.dialect)
