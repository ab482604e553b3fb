"""Runs carried between registries in one parquet file: `specreg runs export|import`.

Hosts that measured without Ray keep their runs in their own registries; merging them is an
export on each host and an import where the answers are wanted. A run is identified by its
`run_uuid` (migration 10), never by `run_id`, which is each registry's own sequence number: an
import adds the runs the registry does not hold yet and skips the others, so importing a file
twice, or two files that overlap, records every run once.

The file is one row per run with every column of `runs` (and the run's `run_id` in its
source registry, for reference), the run's prompts as a list of structs with every column of
`run_prompts`, and the baseline's `run_uuid` (its `run_id` means nothing elsewhere). DuckDB
writes and reads it natively. Columns one side has and the other lacks (registries of different
specreg versions) are left out: the import takes the columns both have.

Only finished runs travel: a run still `running` could finish later, and its finished form
would then be skipped as already imported. Each run keeps the host fingerprint it was measured
with; an export adds the exporting host's measured bandwidth to its own runs' host facts so the
importing registry's recommender can place them (`recommender/local.py`).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb

from specreg.errors import UsageError
from specreg.registry.run_store import RUN_PROMPTS, RUNS, STATUS_RUNNING
from specreg.registry.sql import transaction

EXPORT_FORMAT = "1"
FORMAT_KEY = "specreg_runs_format"
_EXTRA = ("source_run_id", "baseline_run_uuid", "prompts")  # file columns that are not `runs`'
_NOT_COPIED = ("run_id", "baseline_run_id")  # local ids: assigned anew, or mapped by uuid


@dataclass(frozen=True)
class RunsExport:
    """`specreg runs export FILE`: what went into the file."""

    JSON_KIND = "runs-export"
    JSON_VERSION = "1"

    path: str
    n_runs: int
    n_prompts: int
    n_running: int  # left out: still being measured
    hosts: tuple[tuple[str, int], ...]  # (host fingerprint, runs), most runs first
    n_bytes: int

    def to_json(self) -> dict[str, Any]:
        from specreg.jsonout import document

        payload = {
            "path": self.path,
            "format": EXPORT_FORMAT,
            "n_runs": self.n_runs,
            "n_prompts": self.n_prompts,
            "n_running": self.n_running,
            "hosts": [{"fingerprint": h, "runs": n} for h, n in self.hosts],
            "n_bytes": self.n_bytes,
        }
        return document(self.JSON_KIND, self.JSON_VERSION, payload)


@dataclass(frozen=True)
class RunsImport:
    """`specreg runs import FILE`: which runs were new here and which were already held."""

    JSON_KIND = "runs-import"
    JSON_VERSION = "1"

    path: str
    n_in_file: int
    run_ids: tuple[int, ...]  # the new runs' ids in this registry
    n_known: int  # runs this registry already held (by run_uuid)
    n_prompts: int
    hosts: tuple[tuple[str, int], ...]  # (host fingerprint, new runs), most runs first
    unknown_models: tuple[str, ...]  # model ids the new runs name that this registry lacks

    @property
    def n_new(self) -> int:
        return len(self.run_ids)

    def to_json(self) -> dict[str, Any]:
        from specreg.jsonout import document

        payload = {
            "path": self.path,
            "n_in_file": self.n_in_file,
            "n_new": self.n_new,
            "n_known": self.n_known,
            "n_prompts": self.n_prompts,
            "run_ids": list(self.run_ids),
            "hosts": [{"fingerprint": h, "runs": n} for h, n in self.hosts],
            "unknown_models": list(self.unknown_models),
        }
        return document(self.JSON_KIND, self.JSON_VERSION, payload)


def _columns(con: duckdb.DuckDBPyConnection, table: str) -> list[str]:
    rows = con.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_name = ? "
        "ORDER BY ordinal_position",
        [table],
    ).fetchall()
    return [r[0] for r in rows]


def _sql_string(text: str) -> str:
    """A SQL string literal (COPY takes no parameter for its file name)."""
    return "'" + text.replace("'", "''") + "'"


def _hosts(con: duckdb.DuckDBPyConnection, table: str) -> tuple[tuple[str, int], ...]:
    """Runs per host fingerprint in `table`, most first."""
    rows = con.execute(f"SELECT host_fingerprint FROM {table}").fetchall()
    counts = Counter(r[0] or "-" for r in rows)
    return tuple(counts.most_common())


def export_runs(
    con: duckdb.DuckDBPyConnection,
    path: Path,
    *,
    host_fingerprint: str | None = None,
    host_facts: dict[str, Any] | None = None,
) -> RunsExport:
    """Write every finished run of the registry, with its prompts, to the parquet file `path`
    (replaced if it exists). `host_facts` (bandwidth and how it was measured) is added to the
    host facts of runs measured on `host_fingerprint` (this host) that do not carry them."""
    if path.is_dir():
        raise UsageError(f"{path} is a folder: give the file to write, such as runs.parquet")
    if not path.parent.is_dir():
        raise UsageError(f"no folder {path.parent}: create it first")
    patch = json.dumps(host_facts or {})
    try:
        con.execute(
            f"""
            CREATE OR REPLACE TEMP TABLE specreg_export AS
            SELECT r.* EXCLUDE (run_id) REPLACE (
                       CASE WHEN r.host_fingerprint = $1 AND r.host IS NOT NULL
                                 AND json_extract(r.host, '$.bandwidth_gbs') IS NULL
                            THEN json_merge_patch(r.host, $2::JSON) ELSE r.host END AS host),
                   r.run_id AS source_run_id,
                   b.run_uuid AS baseline_run_uuid,
                   (SELECT list(p ORDER BY p.prompt_id) FROM {RUN_PROMPTS} p
                     WHERE p.run_id = r.run_id) AS prompts
            FROM {RUNS} r LEFT JOIN {RUNS} b ON b.run_id = r.baseline_run_id
            WHERE r.status <> $3
            ORDER BY r.run_id
            """,
            [host_fingerprint or "", patch, STATUS_RUNNING],
        )
        con.execute(
            f"COPY specreg_export TO {_sql_string(str(path))} "
            f"(FORMAT parquet, KV_METADATA {{{FORMAT_KEY}: {_sql_string(EXPORT_FORMAT)}}})"
        )
        row = con.execute(
            "SELECT count(*), coalesce(sum(len(prompts)), 0) FROM specreg_export"
        ).fetchone()
        hosts = _hosts(con, "specreg_export")
    except duckdb.IOException as err:
        raise UsageError(f"cannot write {path}: {str(err).splitlines()[0]}") from err
    finally:
        con.execute("DROP TABLE IF EXISTS specreg_export")
    running = con.execute(f"SELECT count(*) FROM {RUNS} WHERE status = ?", [STATUS_RUNNING])
    n_running = (running.fetchone() or (0,))[0]
    assert row is not None
    return RunsExport(
        path=str(path),
        n_runs=int(row[0]),
        n_prompts=int(row[1]),
        n_running=int(n_running),
        hosts=hosts,
        n_bytes=path.stat().st_size,
    )


def _read(con: duckdb.DuckDBPyConnection, path: Path) -> list[str]:
    """The file's columns, after checking that it is a specreg runs export this code reads."""
    if not path.is_file():
        raise UsageError(f"no file {path}: give a file written by `specreg runs export`")
    try:
        meta = con.execute(
            "SELECT value FROM parquet_kv_metadata(?) WHERE key = ?", [str(path), FORMAT_KEY]
        ).fetchall()
        described = con.execute("DESCRIBE SELECT * FROM read_parquet(?)", [str(path)]).fetchall()
    except duckdb.Error as err:
        raise UsageError(
            f"{path} is not a parquet file ({str(err).splitlines()[0]}): give a file written "
            "by `specreg runs export`"
        ) from err
    columns = [r[0] for r in described]
    if not meta or "run_uuid" not in columns or "prompts" not in columns:
        raise UsageError(
            f"{path} is not a specreg runs export: write one with `specreg runs export`"
        )
    version = bytes(meta[0][0]).decode(errors="replace")
    if version != EXPORT_FORMAT:
        raise UsageError(
            f"{path} is a runs export of format {version}, and this specreg reads format "
            f"{EXPORT_FORMAT}: import it with the specreg that wrote it, or upgrade"
        )
    return columns


def import_runs(con: duckdb.DuckDBPyConnection, path: Path) -> RunsImport:
    """Add the runs of an export that this registry does not hold (by `run_uuid`), with their
    prompts, in one transaction; baselines are linked by their uuid."""
    in_file = _read(con, path)
    run_cols = [c for c in _columns(con, RUNS) if c in in_file and c not in _NOT_COPIED]
    prompt_cols = [c for c in _columns(con, RUN_PROMPTS) if c != "run_id"]
    struct = con.execute(
        "SELECT prompts FROM read_parquet(?) WHERE prompts IS NOT NULL AND len(prompts) > 0 "
        "LIMIT 1",
        [str(path)],
    ).fetchone()
    if struct is not None:
        fields = set(struct[0][0])
        prompt_cols = [c for c in prompt_cols if c in fields]
    with transaction(con):
        con.execute(
            """
            CREATE OR REPLACE TEMP TABLE specreg_incoming AS
            SELECT * FROM read_parquet($1)
            WHERE run_uuid IS NOT NULL AND status <> $2
            QUALIFY row_number() OVER (PARTITION BY run_uuid ORDER BY source_run_id) = 1
            """,
            [str(path), STATUS_RUNNING],
        )
        total = con.execute("SELECT count(*) FROM read_parquet(?)", [str(path)]).fetchone()
        con.execute(
            f"""
            CREATE OR REPLACE TEMP TABLE specreg_new AS
            SELECT i.* FROM specreg_incoming i
            WHERE NOT EXISTS (SELECT 1 FROM {RUNS} r WHERE r.run_uuid = i.run_uuid)
            """
        )
        names = ", ".join(run_cols)
        added = con.execute(
            f"INSERT INTO {RUNS} ({names}) SELECT {names} FROM specreg_new "
            "ORDER BY started_at, source_run_id RETURNING run_id"
        ).fetchall()
        n_prompts = 0
        if prompt_cols:
            picked = ", ".join(f"u.p.{c}" for c in prompt_cols)
            got = con.execute(
                f"""
                INSERT INTO {RUN_PROMPTS} (run_id, {", ".join(prompt_cols)})
                SELECT r.run_id, {picked}
                FROM (SELECT run_uuid, unnest(prompts) AS p FROM specreg_new) u
                JOIN {RUNS} r ON r.run_uuid = u.run_uuid
                RETURNING run_id
                """
            ).fetchall()
            n_prompts = len(got)
        con.execute(
            f"""
            UPDATE {RUNS} SET baseline_run_id = b.run_id
            FROM specreg_new n, {RUNS} b
            WHERE {RUNS}.run_uuid = n.run_uuid AND b.run_uuid = n.baseline_run_uuid
            """
        )
        hosts = _hosts(con, "specreg_new")
        unknown = con.execute(
            """
            SELECT DISTINCT m FROM (
                SELECT target_model_id AS m FROM specreg_new
                UNION ALL SELECT draft_model_id FROM specreg_new
            ) WHERE m IS NOT NULL AND m NOT IN (SELECT model_id FROM models) ORDER BY m
            """
        ).fetchall()
        n_incoming = (con.execute("SELECT count(*) FROM specreg_incoming").fetchone() or (0,))[0]
        con.execute("DROP TABLE specreg_new")
        con.execute("DROP TABLE specreg_incoming")
    run_ids = tuple(sorted(int(r[0]) for r in added))
    return RunsImport(
        path=str(path),
        n_in_file=int((total or (0,))[0]),
        run_ids=run_ids,
        n_known=int(n_incoming) - len(run_ids),
        n_prompts=n_prompts,
        hosts=hosts,
        unknown_models=tuple(r[0] for r in unknown),
    )
