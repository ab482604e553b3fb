"""The quality store: every logit comparison llama-perplexity made, failed ones included.

Two purposes share one table because they are the same measurement: a model's next-token
distributions compared with a reference's over one text.

* `quality`: a lossy configuration (fewer MoE experts, a smaller quant) against its lossless
  reference, on a shipped or user text. What speed knobs cost in output.
* `agreement`: a draft against its target, on the target's own greedy text. Same-top is the
  per-token acceptance of greedy speculation, measured in seconds without a speculative run.

The runner hands over `QualityRecord`s; this module owns the SQL.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import duckdb

from specreg.registry.sql import Rows, transaction, where_equal

QUALITY_TABLE = "quality_measurements"
PURPOSE_QUALITY = "quality"
PURPOSE_AGREEMENT = "agreement"
PURPOSES = (PURPOSE_QUALITY, PURPOSE_AGREEMENT)
METHOD_KLD = "kl-divergence"  # llama-perplexity --kl-divergence against the saved base
METHOD_SAVED = "saved-logits"  # both models' saved logits compared in numpy (shared ids)
METHOD_DRAFTED = "drafted"  # the draft's greedy guesses on llama-server (quality/drafting.py)
TEXT_SHIPPED = "shipped"
TEXT_USER = "user"
TEXT_GENERATED = "generated"  # the target's own greedy continuation of the task prompts


@dataclass(frozen=True)
class QualityRecord:
    """One row of `quality_measurements`. Shares are 0..1; `measurement_id` is None until
    recorded."""

    purpose: str
    status: str
    started_at: datetime
    config: dict[str, Any]
    seconds: float | None = None
    error_kind: str | None = None
    error: str | None = None
    llama_message: str | None = None
    base_model_id: str | None = None
    base_path: str | None = None
    model_id: str | None = None
    model_path: str | None = None
    experts: int | None = None
    expert_key: str | None = None
    task: str | None = None
    text_name: str | None = None
    text_sha256: str | None = None
    text_source: str | None = None
    ctx: int | None = None
    n_chunks: int | None = None
    n_tokens: int | None = None
    method: str | None = None
    n_vocab_base: int | None = None
    n_vocab_model: int | None = None
    llama_version: str | None = None
    llama_build_id: str | None = None
    llama_bin_dir: str | None = None
    argv: tuple[str, ...] = ()
    host_fingerprint: str | None = None
    host: dict[str, Any] | None = None
    threads: int | None = None
    mean_kld: float | None = None
    mean_kld_unc: float | None = None
    kld_median: float | None = None
    kld_p90: float | None = None
    kld_p95: float | None = None
    kld_p99: float | None = None
    kld_p999: float | None = None
    kld_max: float | None = None
    same_top: float | None = None
    same_top_unc: float | None = None
    ppl: float | None = None
    ppl_unc: float | None = None
    ppl_base: float | None = None
    ppl_base_unc: float | None = None
    ln_ppl_ratio: float | None = None
    ln_ppl_ratio_unc: float | None = None
    rms_dp: float | None = None
    temperature: float | None = None
    accept: float | None = None
    # p_min -> (share of positions the draft is at least that sure of, same-top among them)
    confidence: dict[float, tuple[float, float]] | None = None
    log_path: str | None = None
    measurement_id: int | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"


_JSON = {"config", "host", "confidence"}
_ROWS = Rows(QUALITY_TABLE, QualityRecord, instant="started_at", arrays=["argv"])


def _finite(value: Any) -> Any:
    """NULL for NaN and infinities: the table holds measured numbers or nothing."""
    return None if isinstance(value, float) and not math.isfinite(value) else value


def _encode(name: str, value: Any) -> Any:
    if name in _JSON and value is not None:
        if name == "confidence":
            value = {f"{k:g}": [_finite(v) for v in pair] for k, pair in value.items()}
        return json.dumps(value, default=str, allow_nan=False)
    if name == "argv":
        return list(value)
    return _finite(value)


def record_quality(con: duckdb.DuckDBPyConnection, rec: QualityRecord) -> int:
    """Store one measurement; return its measurement_id."""
    values = {name: _encode(name, getattr(rec, name)) for name in _ROWS.columns}
    with transaction(con):
        return int(_ROWS.insert(con, values, returning="measurement_id"))


def _from_row(row: tuple[Any, ...]) -> QualityRecord:
    data = _ROWS.decode(row)
    for name in _JSON:
        if isinstance(data[name], str):
            data[name] = json.loads(data[name])
    if data["confidence"] is not None:
        data["confidence"] = {
            float(k): (
                math.nan if v[0] is None else float(v[0]),
                math.nan if v[1] is None else float(v[1]),
            )
            for k, v in data["confidence"].items()
        }
    return QualityRecord(**data)


def list_quality(
    con: duckdb.DuckDBPyConnection,
    *,
    purpose: str | None = None,
    base_model_id: str | None = None,
    model_id: str | None = None,
    task: str | None = None,
    status: str | None = None,
    limit: int | None = None,
) -> list[QualityRecord]:
    """Measurements, newest first, filtered by purpose, models, task and status."""
    where, params = where_equal(
        purpose=purpose, base_model_id=base_model_id, model_id=model_id, task=task, status=status
    )
    sql = f"SELECT {_ROWS.select} FROM {QUALITY_TABLE}{where} ORDER BY measurement_id DESC"
    if limit is not None:
        sql += f" LIMIT {int(limit)}"
    return [_from_row(r) for r in con.execute(sql, params).fetchall()]


def latest_measurements(
    con: duckdb.DuckDBPyConnection,
    purpose: str,
    base_model_id: str,
    *,
    host_fingerprint: str | None = None,
) -> list[QualityRecord]:
    """The newest successful measurement per (compared model, experts, task, temperature)
    with `base_model_id` as reference or target: what the recommender uses."""
    where = ["purpose = ?", "base_model_id = ?", "status = 'ok'"]
    params: list[Any] = [purpose, base_model_id]
    if host_fingerprint is not None:
        where.append("host_fingerprint = ?")
        params.append(host_fingerprint)
    rows = con.execute(
        f"SELECT {_ROWS.select} FROM {QUALITY_TABLE} WHERE {' AND '.join(where)} "
        "QUALIFY row_number() OVER (PARTITION BY model_id, coalesce(experts, -1), task, "
        "coalesce(temperature, 0) ORDER BY measurement_id DESC) = 1 "
        "ORDER BY model_id, task",
        params,
    ).fetchall()
    return [_from_row(r) for r in rows]


def agreement_by_draft(
    con: duckdb.DuckDBPyConnection, target_id: str
) -> dict[str, tuple[QualityRecord, ...]]:
    """The newest greedy agreement of each draft with `target_id`, one record per task."""
    out: dict[str, list[QualityRecord]] = {}
    for r in latest_measurements(con, PURPOSE_AGREEMENT, target_id):
        if r.model_id and not r.temperature and r.same_top is not None:
            out.setdefault(r.model_id, []).append(r)
    return {k: tuple(v) for k, v in out.items()}


def agreement_cell(by_task: dict[str, float | None]) -> str:
    """Same-top agreement for a table cell: "97% (code)", "70-82% (5 tasks)", or "-"."""
    tops = sorted(v for v in by_task.values() if v is not None)
    if not tops:
        return "-"
    if len(tops) == 1:
        return f"{tops[0]:.0%} ({next(iter(by_task))})"
    lo, hi = round(tops[0] * 100), round(tops[-1] * 100)
    span = f"{lo}%" if lo == hi else f"{lo}-{hi}%"
    return f"{span} ({len(tops)} tasks)"


def agreement_json(records: tuple[QualityRecord, ...] | None) -> dict[str, float | None]:
    """Same-top agreement per task, for `--json` ({} when never measured)."""
    return {str(r.task or r.text_name): r.same_top for r in records or ()}
