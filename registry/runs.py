"""The runs store: every measured configuration, failed ones included.

The runner hands over plain records; this module owns the SQL. Records are written in one
transaction, so a killed process leaves either the whole run or nothing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from datetime import datetime, timezone
from typing import Any

import duckdb

from specreg.errors import UsageError
from specreg.registry.db import transaction

RUNS = "runs"
RUN_PROMPTS = "run_prompts"


@dataclass(frozen=True)
class PromptRecord:
    prompt_id: str
    prompt_sha256: str
    n_samples: int
    prompt_n: int | None = None
    predicted_n: int | None = None
    tokens_per_s: float | None = None
    tokens_per_s_lo: float | None = None
    tokens_per_s_hi: float | None = None
    samples_tps: tuple[float, ...] = ()
    foreign_cpu_s: tuple[float, ...] = ()
    draft_n: int | None = None
    draft_n_accepted: int | None = None
    output_sha256: str | None = None
    stop_type: str | None = None
    verdict: str | None = None
    divergence: dict[str, Any] | None = None


@dataclass(frozen=True)
class RunRecord:
    """One row of `runs` plus its prompts. `run_id` is None until recorded."""

    JSON_KIND = "run"
    JSON_VERSION = "1"

    kind: str
    status: str
    started_at: datetime
    config: dict[str, Any]
    config_label: str
    spec_type: str
    seconds: float | None = None
    error_kind: str | None = None
    error: str | None = None
    llama_message: str | None = None
    target_model_id: str | None = None
    draft_model_id: str | None = None
    target_path: str | None = None
    draft_path: str | None = None
    k: int | None = None
    p_min: float | None = None
    draft_threads: int | None = None
    experts: int | None = None
    temperature: float | None = None
    seed: int | None = None
    behaviour_changing: bool | None = None
    llama_version: str | None = None
    llama_dialect: str | None = None
    llama_bin_dir: str | None = None
    argv: tuple[str, ...] = ()
    host_fingerprint: str | None = None
    host: dict[str, Any] | None = None
    threads: int | None = None
    task: str | None = None
    prompt_set: str | None = None
    n_predict: int | None = None
    repeats: int | None = None
    speculative_active: bool | None = None
    tokens_per_s: float | None = None
    tokens_per_s_lo: float | None = None
    tokens_per_s_hi: float | None = None
    draft_n: int | None = None
    draft_n_accepted: int | None = None
    acceptance: float | None = None
    baseline_run_id: int | None = None
    speedup: float | None = None
    speedup_lo: float | None = None
    speedup_hi: float | None = None
    verdict: str | None = None
    verdict_reason: str | None = None
    log_path: str | None = None
    run_id: int | None = None
    prompts: tuple[PromptRecord, ...] = field(default=())

    @property
    def tokens_per_s_str(self) -> str:
        if self.tokens_per_s is None:
            return "-"
        return f"{self.tokens_per_s:.1f}"

    @property
    def speedup_str(self) -> str:
        if self.speedup is None:
            return "-"
        if self.speedup_lo is not None and self.speedup_hi is not None:
            return f"{self.speedup:.2f}x [{self.speedup_lo:.2f}-{self.speedup_hi:.2f}]"
        return f"{self.speedup:.2f}x"

    @property
    def acceptance_str(self) -> str:
        return "-" if self.acceptance is None else f"{self.acceptance:.0%}"

    def to_json(self) -> dict[str, Any]:
        from specreg.jsonout import document

        return document(self.JSON_KIND, self.JSON_VERSION, {"run": self})


@dataclass(frozen=True)
class RunList:
    """`specreg runs`: recorded runs, newest first."""

    JSON_KIND = "runs"
    JSON_VERSION = "1"

    runs: tuple[RunRecord, ...]

    def to_json(self) -> dict[str, Any]:
        from specreg.jsonout import document

        return document(self.JSON_KIND, self.JSON_VERSION, {"runs": self.runs})


@dataclass(frozen=True)
class VerifiedRun:
    """`specreg verify`: the plain baseline and the judged configuration's run."""

    JSON_KIND = "verify"
    JSON_VERSION = "1"

    baseline: RunRecord
    run: RunRecord

    def to_json(self) -> dict[str, Any]:
        from specreg.jsonout import document

        payload = {"baseline": self.baseline, "run": self.run}
        return document(self.JSON_KIND, self.JSON_VERSION, payload)


_JSON_RUN = {"config", "host"}
_RUN_COLUMNS = [f.name for f in fields(RunRecord) if f.name not in ("run_id", "prompts")]
# TIMESTAMPTZ values come back as pytz-aware datetimes, and pytz is not a dependency:
# read the instant as epoch seconds instead.
_RUN_SELECT = ", ".join(
    "epoch(started_at)" if c == "started_at" else c for c in ["run_id", *_RUN_COLUMNS]
)
_PROMPT_COLUMNS = [f.name for f in fields(PromptRecord)]


def record_run(con: duckdb.DuckDBPyConnection, run: RunRecord) -> int:
    """Store a run and its prompts; return the new run_id."""
    values = []
    for name in _RUN_COLUMNS:
        value = getattr(run, name)
        if name in _JSON_RUN and value is not None:
            value = json.dumps(value, default=str)
        elif name == "argv":
            value = list(value)
        values.append(value)
    placeholders = ", ".join("?" for _ in _RUN_COLUMNS)
    with transaction(con):
        row = con.execute(
            f"INSERT INTO {RUNS} ({', '.join(_RUN_COLUMNS)}) VALUES ({placeholders}) "
            "RETURNING run_id",
            values,
        ).fetchone()
        assert row is not None
        run_id = int(row[0])
        for prompt in run.prompts:
            pvalues: list[Any] = [run_id]
            for name in _PROMPT_COLUMNS:
                value = getattr(prompt, name)
                if name == "divergence" and value is not None:
                    value = json.dumps(value, default=str)
                elif name in ("samples_tps", "foreign_cpu_s"):
                    value = list(value)
                pvalues.append(value)
            con.execute(
                f"INSERT INTO {RUN_PROMPTS} (run_id, {', '.join(_PROMPT_COLUMNS)}) "
                f"VALUES ({', '.join('?' for _ in pvalues)})",
                pvalues,
            )
    return run_id


def _run_from_row(row: tuple[Any, ...], prompts: tuple[PromptRecord, ...] = ()) -> RunRecord:
    data = dict(zip(["run_id", *_RUN_COLUMNS], row, strict=True))
    for name in _JSON_RUN:
        if isinstance(data[name], str):
            data[name] = json.loads(data[name])
    data["argv"] = tuple(data["argv"] or ())
    data["started_at"] = datetime.fromtimestamp(data["started_at"], timezone.utc)
    return RunRecord(**data, prompts=prompts)


def _prompt_from_row(row: tuple[Any, ...]) -> PromptRecord:
    data = dict(zip(_PROMPT_COLUMNS, row, strict=True))
    if isinstance(data["divergence"], str):
        data["divergence"] = json.loads(data["divergence"])
    data["samples_tps"] = tuple(data["samples_tps"] or ())
    data["foreign_cpu_s"] = tuple(data["foreign_cpu_s"] or ())
    return PromptRecord(**data)


def _prompts(con: duckdb.DuckDBPyConnection, run_id: int) -> tuple[PromptRecord, ...]:
    rows = con.execute(
        f"SELECT {', '.join(_PROMPT_COLUMNS)} FROM {RUN_PROMPTS} WHERE run_id = ? "
        "ORDER BY prompt_id",
        [run_id],
    ).fetchall()
    return tuple(_prompt_from_row(r) for r in rows)


def list_runs(
    con: duckdb.DuckDBPyConnection,
    *,
    status: str | None = None,
    model_id: str | None = None,
    limit: int | None = None,
    with_prompts: bool = False,
) -> list[RunRecord]:
    """Runs, newest first, optionally only failed/ok ones or those involving one model."""
    where, params = [], []
    if status is not None:
        where.append("status = ?")
        params.append(status)
    if model_id is not None:
        where.append("(target_model_id = ? OR draft_model_id = ?)")
        params += [model_id, model_id]
    sql = f"SELECT {_RUN_SELECT} FROM {RUNS}"
    if where:
        sql += " WHERE " + " AND ".join(where)
    sql += " ORDER BY run_id DESC"
    if limit is not None:
        sql += f" LIMIT {int(limit)}"
    rows = con.execute(sql, params).fetchall()
    return [_run_from_row(r, _prompts(con, r[0]) if with_prompts else ()) for r in rows]


def get_run(con: duckdb.DuckDBPyConnection, run_id: int) -> RunRecord:
    row = con.execute(f"SELECT {_RUN_SELECT} FROM {RUNS} WHERE run_id = ?", [run_id]).fetchone()
    if row is None:
        raise UsageError(f"no run {run_id}: see `specreg runs` for the ids")
    return _run_from_row(row, _prompts(con, run_id))
