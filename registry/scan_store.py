"""What a scan reads from and writes to the registry: the files, models, vocabs and scans
tables, as typed rows. Every statement a scan runs is here; `scan.py` decides, this writes.

Writes are column-wise (`tables.insert_rows`): one statement per table, whatever the number
of files. Vocabularies are the exception: a few rows of megabytes each, which DuckDB takes
fastest one row at a time (a list of big BLOBs is converted value by value).
"""

from __future__ import annotations

import dataclasses
import socket
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from specreg.registry.parts import PartInfo, VocabBlob
from specreg.registry.tables import insert_rows
from specreg.registry.text import fs_path

if TYPE_CHECKING:
    import duckdb

    from specreg.registry.queries import ModelRecord


@dataclass(frozen=True)
class KnownFile:
    """A `files` row as the previous scans left it."""

    path: str  # as the OS names it (lone surrogates for bytes that are not UTF-8)
    text: str  # the stored key: valid UTF-8, `\xNN` for odd bytes
    links: tuple[str, ...]
    size: int | None
    mtime_ns: int | None
    inode: int | None
    status: str  # ok | error | gone
    error: str | None
    model_id: str | None
    part: PartInfo | None
    first_scan: int | None

    @property
    def present(self) -> bool:
        return self.status != "gone"

    def same_stat(self, size: int, mtime_ns: int, inode: int) -> bool:
        return (self.size, self.mtime_ns, self.inode) == (size, mtime_ns, inode)


@dataclass(frozen=True)
class StoredModel:
    model_id: str
    paths: tuple[str, ...]
    status: str
    first_scan: int | None


@dataclass(frozen=True)
class FileRow:
    """One `files` row to write."""

    path: str  # text form
    path_raw: bytes | None
    links: list[str]
    size: int
    mtime_ns: int
    inode: int
    status: str
    error: str | None
    model_id: str | None
    split_no: int | None
    split_count: int | None
    header_sha256: str | None
    n_params: int | None
    n_tensors: int | None
    first_scan: int
    last_scan: int
    gone_scan: int | None = None


@dataclass(frozen=True)
class IssueRow:
    path: str  # text form
    kind: str
    reason: str


@dataclass(frozen=True)
class ScanRow:
    scan_id: int
    started_at: datetime
    finished_at: datetime
    roots: list[str]
    n_files: int
    n_new: int
    n_changed: int
    n_unchanged: int
    n_removed: int
    n_errors: int
    seconds: float


@dataclass(frozen=True)
class PackedVocab:
    """One `vocabs` row: a vocabulary the registry lacks, compressed."""

    vocab_sha: str
    n_tokens: int
    tokens_z: bytes
    token_types: bytes | None
    codec: str


def pack_vocab(blob: VocabBlob) -> PackedVocab:
    from specreg.registry.vocab_store import compress_tokens

    codec, packed = compress_tokens(blob.tokens_raw)
    return PackedVocab(blob.vocab_sha, blob.n_tokens, packed, blob.token_types, codec)


@dataclass(frozen=True)
class ScanWrite:
    """Everything one scan changes, written in one transaction."""

    scan_id: int
    touched: list[str]  # text keys of unchanged files: only last_scan moves
    rewrite: list[FileRow]  # new, changed and failed files: the row is replaced
    removed: list[str]  # text keys of files no longer on disk
    models: list[ModelRecord]  # new or rebuilt models
    kv: list[tuple[str, str, str, str]]  # (model_id, key, type, JSON value)
    vocabs: list[Future[PackedVocab]]  # vocabularies the registry lacks, being compressed
    seen_models: list[str]  # every model id a file of this scan belongs to
    issues: list[IssueRow]


def known_files(con: duckdb.DuckDBPyConnection) -> dict[str, KnownFile]:
    """Every file row, keyed by the path as the OS names it."""
    cur = con.execute(
        "SELECT path, path_raw, links, size, mtime_ns, inode, status, error, model_id,"
        " split_no, split_count, header_sha256, n_params, n_tensors, first_scan FROM files"
    )
    out: dict[str, KnownFile] = {}
    for (
        text, raw, links, size, mtime_ns, inode, status, error, model_id,
        split_no, split_count, header_sha256, n_params, n_tensors, first_scan,
    ) in cur.fetchall():  # fmt: skip
        part = (
            PartInfo(split_no, split_count, header_sha256, n_params, n_tensors)
            if header_sha256 is not None
            else None
        )
        path = fs_path(text, bytes(raw) if raw is not None else None)
        out[path] = KnownFile(
            path, text, tuple(links or ()), size, mtime_ns, inode, status, error, model_id,
            part, first_scan,
        )  # fmt: skip
    return out


def stored_models(con: duckdb.DuckDBPyConnection) -> dict[str, StoredModel]:
    rows = con.execute("SELECT model_id, paths, status, first_scan FROM models").fetchall()
    return {m: StoredModel(m, tuple(p or ()), s, f) for m, p, s, f in rows}


def next_scan_id(con: duckdb.DuckDBPyConnection) -> int:
    row = con.execute("SELECT coalesce(max(scan_id), 0) + 1 FROM scans").fetchone()
    return int(row[0]) if row else 1


def write_scan(con: duckdb.DuckDBPyConnection, w: ScanWrite) -> tuple[list[str], int]:
    """Apply one scan (the caller holds the transaction); returns the models that went away
    and how many models are present now."""
    if w.touched:
        con.execute(
            "UPDATE files SET last_scan = ? WHERE path IN (SELECT unnest(?))",
            [w.scan_id, w.touched],
        )
    if w.rewrite:
        con.execute(
            "DELETE FROM files WHERE path IN (SELECT unnest(?))", [[f.path for f in w.rewrite]]
        )
        insert_rows(con, "files", [dataclasses.asdict(f) for f in w.rewrite])
    if w.removed:
        con.execute(
            "UPDATE files SET status = 'gone', gone_scan = ? WHERE path IN (SELECT unnest(?))",
            [w.scan_id, w.removed],
        )
    if w.models:
        ids = [m.model_id for m in w.models]
        con.execute("DELETE FROM models WHERE model_id IN (SELECT unnest(?))", [ids])
        con.execute("DELETE FROM model_kv WHERE model_id IN (SELECT unnest(?))", [ids])
        insert_rows(con, "models", [_model_row(m) for m in w.models])
        insert_rows(
            con,
            "model_kv",
            [{"model_id": a, "key": b, "type": c, "value": d} for a, b, c, d in w.kv],
        )
    if w.seen_models:
        con.execute(
            "UPDATE models SET last_scan = ? WHERE model_id IN (SELECT unnest(?))",
            [w.scan_id, w.seen_models],
        )
    _write_vocabs(con, w.vocabs)
    gone = [
        r[0]
        for r in con.execute(
            "UPDATE models SET status = 'gone' WHERE status != 'gone' AND model_id NOT IN "
            "(SELECT model_id FROM files WHERE status = 'ok' AND model_id IS NOT NULL) "
            "RETURNING model_id"
        ).fetchall()
    ]
    if w.issues:
        insert_rows(
            con,
            "scan_errors",
            [{"scan_id": w.scan_id, **dataclasses.asdict(i)} for i in w.issues],
        )
    row = con.execute("SELECT count(*) FROM models WHERE status != 'gone'").fetchone()
    return gone, int(row[0]) if row else 0


def record_scan(con: duckdb.DuckDBPyConnection, scan: ScanRow) -> None:
    insert_rows(con, "scans", [{**dataclasses.asdict(scan), "host": socket.gethostname()}])


def _model_row(m: ModelRecord) -> dict[str, Any]:
    row = dataclasses.asdict(m)
    for name in ("paths", "parts_missing", "ssm_keys"):
        row[name] = list(row[name])
    return row


def vocab_shas(con: duckdb.DuckDBPyConnection) -> set[str]:
    """The vocabularies the registry holds (one row per distinct token list: few)."""
    return {r[0] for r in con.execute("SELECT vocab_sha FROM vocabs").fetchall()}


def _write_vocabs(con: duckdb.DuckDBPyConnection, jobs: Sequence[Future[PackedVocab]]) -> None:
    rows = [dataclasses.astuple(job.result()) for job in jobs]
    if rows:
        con.executemany(
            "INSERT INTO vocabs (vocab_sha, n_tokens, tokens_z, token_types, codec)"
            " VALUES (?, ?, ?, ?, ?)",
            rows,
        )
