"""The runs store: every measured configuration, failed ones included.

The runner hands over plain records; this module owns the SQL. A measurement is recorded as
`running` before llama.cpp starts (`start_run`) and completed in one transaction when it ends
(`finish_run`), so a run whose process was killed stays visible: the next writable open marks
it `interrupted` (`mark_interrupted`), and reads already show it so.

Every run says what its figures stand for (`regime`, the `protocol` that took its samples) and
whether they can be trusted: a run measured by replaying prompts to a method that keeps state
across requests is kept, with the reason, but is no evidence of what a user gets
(`first_use_evidence`), so training, recommend and propose leave it out.
"""

from __future__ import annotations

import json
import os
import socket
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace
from datetime import datetime
from pathlib import Path
from typing import Any

import duckdb

from specreg.errors import UsageError
from specreg.jsonout import FieldsDocument
from specreg.llamacpp import keeps_state
from specreg.registry.sql import Rows, transaction
from specreg.terms import REGIME_WARM

RUNS = "runs"
RUN_PROMPTS = "run_prompts"

STATUS_OK = "ok"
STATUS_FAILED = "failed"
STATUS_RUNNING = "running"  # recorded before llama.cpp started; finish_run completes it
STATUS_INTERRUPTED = "interrupted"  # its process died before finishing (SIGKILL, power)
FAILED_STATUSES = (STATUS_FAILED, STATUS_INTERRUPTED)


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
    # per timed sample, in the order taken (repeat by repeat)
    samples_draft_n: tuple[int, ...] = ()
    samples_draft_n_accepted: tuple[int, ...] = ()
    samples_session: tuple[int, ...] = ()  # which engine state (server process) answered
    samples_position: tuple[int, ...] = ()  # requests that state had answered before
    # What a lookup cache can be built from (`specreg lookup-cache build --from-runs`).
    prompt_text: str | None = None
    output_text: str | None = None  # of the first sample
    type_figures: dict[str, Any] | None = None  # a stack's figures per type, over the samples


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
    # What the figures stand for: first-encounter | warm | replay (specreg.terms.REGIMES).
    regime: str | None = None
    protocol: dict[str, Any] | None = None  # how the samples were taken (runner/protocol.py)
    # Per repeat over all prompts: n_samples, predicted_n, draft_n, draft_n_accepted,
    # tokens_per_s, acceptance. A warm run has one repeat and `phase_figures` (first, later).
    repeat_figures: tuple[dict[str, Any], ...] = ()
    phase_figures: dict[str, Any] | None = None
    trusted: bool = True  # False: kept, shown with `trust_reason`, never used as evidence
    trust_reason: str | None = None
    owner: str | None = None  # host:pid of the process measuring it (while `running`)
    lookup_cache: str | None = None  # the `specreg lookup-cache` ngram-cache read, by name
    lookup_cache_sha256: str | None = None  # ... and the content it had
    # A stack's figures per type (runner/spec_stats.py): drafts and tokens drafted/accepted.
    type_figures: dict[str, Any] | None = None
    # The run's identity in every registry (run_id is local): minted when first recorded,
    # kept when a run is copied to another registry (Ray results, `runs import`).
    run_uuid: str | None = None
    run_id: int | None = None
    prompts: tuple[PromptRecord, ...] = field(default=())

    @property
    def first_use_evidence(self) -> bool:
        """Whether the figures stand for what a user gets on first use: a finished, trusted
        run, and not a warm server's figure for a method that learns from earlier requests."""
        if self.status != STATUS_OK or not self.trusted:
            return False
        return not (self.regime == REGIME_WARM and keeps_state(self.spec_type or ""))

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
class RunList(FieldsDocument):
    """`specreg runs`: recorded runs, newest first."""

    JSON_KIND = "runs"
    JSON_VERSION = "1"

    runs: tuple[RunRecord, ...]


@dataclass(frozen=True)
class VerifiedRun(FieldsDocument):
    """`specreg verify`: the plain baseline and the judged configuration's run."""

    JSON_KIND = "verify"
    JSON_VERSION = "1"

    baseline: RunRecord
    run: RunRecord


_JSON_RUN = {"config", "host", "protocol", "repeat_figures", "phase_figures", "type_figures"}
_JSON_PROMPT = {"divergence", "type_figures"}
_PROMPT_ARRAYS = (
    "samples_tps",
    "foreign_cpu_s",
    "samples_draft_n",
    "samples_draft_n_accepted",
    "samples_session",
    "samples_position",
)
_RUNS = Rows(RUNS, RunRecord, instant="started_at", arrays=["argv"], skip=["prompts"])
_PROMPTS = Rows(RUN_PROMPTS, PromptRecord, arrays=_PROMPT_ARRAYS)


def new_run_uuid() -> str:
    return str(uuid.uuid4())


def owner() -> str:
    """Who is measuring: this host and process."""
    return f"{socket.gethostname()}:{os.getpid()}"


def owner_gone(recorded: str | None) -> bool:
    """Whether the process that recorded a `running` run has ended. A measuring process holds
    the registry only for its writes, so other processes see its runs while it measures: one of
    this host is gone when its pid is; one of another host (a registry on a shared folder) is
    taken as gone, as before, since its process cannot be asked."""
    if recorded == owner():
        return False
    host, _, pid = (recorded or "").rpartition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return True
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False  # alive, another user's
    return _zombie(int(pid))


def _zombie(pid: int) -> bool:
    """An ended child its parent has not reaped yet still answers signal 0."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[:1] == ["Z"]


def _with_json(values: dict[str, Any], names: set[str]) -> dict[str, Any]:
    """`values` with the columns `names` as JSON text (None stays NULL)."""
    return {
        c: json.dumps(v, default=str) if c in names and v is not None else v
        for c, v in values.items()
    }


def _from_json(data: dict[str, Any], names: set[str]) -> dict[str, Any]:
    for name in names:
        if isinstance(data[name], str):
            data[name] = json.loads(data[name])
    return data


def _run_values(run: RunRecord) -> dict[str, Any]:
    return _with_json(_RUNS.values(run), _JSON_RUN)


def _insert_prompts(con: duckdb.DuckDBPyConnection, run_id: int, run: RunRecord) -> None:
    for prompt in run.prompts:
        values = _with_json(_PROMPTS.values(prompt), _JSON_PROMPT)
        _PROMPTS.insert(con, {"run_id": run_id, **values})


def _insert_run(con: duckdb.DuckDBPyConnection, run: RunRecord) -> int:
    if run.run_uuid is None:
        run = replace(run, run_uuid=new_run_uuid())
    return int(_RUNS.insert(con, _run_values(run), returning="run_id"))


def record_run(con: duckdb.DuckDBPyConnection, run: RunRecord) -> int:
    """Store a finished run and its prompts in one transaction; return the new run_id."""
    with transaction(con):
        run_id = _insert_run(con, run)
        _insert_prompts(con, run_id, run)
    return run_id


def record_runs(con: duckdb.DuckDBPyConnection, runs: Sequence[RunRecord]) -> list[int]:
    """Store finished runs in one transaction (all or none); return their new run_ids.

    One commit for a batch instead of one per run: serve writes production traffic this way.
    """
    ids = []
    with transaction(con):
        for run in runs:
            run_id = _insert_run(con, run)
            _insert_prompts(con, run_id, run)
            ids.append(run_id)
    return ids


def start_run(con: duckdb.DuckDBPyConnection, run: RunRecord) -> int:
    """Record a run as `running` before its measurement starts (committed at once, so a
    killed process leaves it behind); `finish_run` completes it. Returns its run_id."""
    mark_interrupted(con)
    started = RunRecord(
        **{
            **{f.name: getattr(run, f.name) for f in fields(RunRecord)},
            "status": STATUS_RUNNING,
            "owner": owner(),
            "run_id": None,
            "prompts": (),
        }
    )
    with transaction(con):
        return _insert_run(con, started)


def finish_run(con: duckdb.DuckDBPyConnection, run_id: int, run: RunRecord) -> None:
    """Replace the `running` record `run_id` with the finished run and its prompts (its
    start time and run_uuid stay as recorded)."""
    kept = ("started_at", "run_uuid", "run_id")
    values = {c: v for c, v in _run_values(run).items() if c not in kept}
    sets = ", ".join(f"{c} = ?" for c in values)
    with transaction(con):
        con.execute(f"UPDATE {RUNS} SET {sets} WHERE run_id = ?", [*values.values(), run_id])
        con.execute(f"DELETE FROM {RUN_PROMPTS} WHERE run_id = ?", [run_id])
        _insert_prompts(con, run_id, run)


INTERRUPTED_ERROR = (
    "the process measuring this run ended before it finished (killed, or the machine stopped); "
    "run it again"
)


def mark_interrupted(con: duckdb.DuckDBPyConnection) -> int:
    """Runs left `running` by a process that is gone become `interrupted`; how many.

    A measuring process holds the registry only for its writes, so a `running` run is
    abandoned only when its process has ended (`owner_gone`).
    """
    with transaction(con):
        running = con.execute(
            f"SELECT run_id, owner FROM {RUNS} WHERE status = ?", [STATUS_RUNNING]
        ).fetchall()
        gone = [run_id for run_id, recorded in running if owner_gone(recorded)]
        for run_id in gone:
            con.execute(
                f"UPDATE {RUNS} SET status = ?, error_kind = ?, error = ? WHERE run_id = ?",
                [STATUS_INTERRUPTED, STATUS_INTERRUPTED, INTERRUPTED_ERROR, run_id],
            )
    return len(gone)


def _run_from_row(row: tuple[Any, ...], con: duckdb.DuckDBPyConnection | None = None) -> RunRecord:
    """The run of a row read with `_RUNS.select`; with `con`, its prompts too."""
    data = _from_json(_RUNS.decode(row), _JSON_RUN)
    data["repeat_figures"] = tuple(data["repeat_figures"] or ())
    data["trusted"] = data["trusted"] is not False
    if data["status"] == STATUS_RUNNING and owner_gone(data["owner"]):
        data.update(
            status=STATUS_INTERRUPTED, error_kind=STATUS_INTERRUPTED, error=INTERRUPTED_ERROR
        )
    prompts = _prompts(con, data["run_id"]) if con is not None else ()
    return RunRecord(**data, prompts=prompts)


def _prompts(con: duckdb.DuckDBPyConnection, run_id: int) -> tuple[PromptRecord, ...]:
    rows = con.execute(
        f"SELECT {_PROMPTS.select} FROM {RUN_PROMPTS} WHERE run_id = ? ORDER BY prompt_id",
        [run_id],
    ).fetchall()
    return tuple(PromptRecord(**_from_json(_PROMPTS.decode(r), _JSON_PROMPT)) for r in rows)


def list_runs(
    con: duckdb.DuckDBPyConnection,
    *,
    status: str | None = None,
    model_id: str | None = None,
    limit: int | None = None,
    with_prompts: bool = False,
) -> list[RunRecord]:
    """Runs, newest first, optionally only failed/ok ones or those involving one model.
    `failed` includes interrupted runs (and those still recorded as running by a process
    that is gone)."""
    where: list[str] = []
    params: list[Any] = []
    if status == STATUS_FAILED:
        where.append("status IN (?, ?, ?)")
        params += [STATUS_FAILED, STATUS_INTERRUPTED, STATUS_RUNNING]
    elif status is not None:
        where.append("status = ?")
        params.append(status)
    if model_id is not None:
        where.append("(target_model_id = ? OR draft_model_id = ?)")
        params += [model_id, model_id]
    sql = f"SELECT {_RUNS.select} FROM {RUNS}"
    if where:
        sql += " WHERE " + " AND ".join(where)
    sql += " ORDER BY run_id DESC"
    if limit is not None:
        sql += f" LIMIT {int(limit)}"
    rows = con.execute(sql, params).fetchall()
    runs = [_run_from_row(r, con if with_prompts else None) for r in rows]
    if status == STATUS_FAILED:
        runs = [r for r in runs if r.status in FAILED_STATUSES]
    return runs


def get_run(con: duckdb.DuckDBPyConnection, run_id: int) -> RunRecord:
    sql = f"SELECT {_RUNS.select} FROM {RUNS} WHERE run_id = ?"
    row = con.execute(sql, [run_id]).fetchone()
    if row is None:
        raise UsageError(f"no run {run_id}: see `specreg runs` for the ids")
    return _run_from_row(row, con)


def interrupt_run(con: duckdb.DuckDBPyConnection, run_id: int, why: str) -> None:
    """Mark this process's `running` run `run_id` interrupted (Ctrl-C, an unexpected error)."""
    with transaction(con):
        con.execute(
            f"UPDATE {RUNS} SET status = ?, error_kind = ?, error = ? WHERE run_id = ? "
            "AND status = ?",
            [STATUS_INTERRUPTED, STATUS_INTERRUPTED, why, run_id, STATUS_RUNNING],
        )
