"""Workload lookup caches in the registry: static n-gram caches built from the user's text.

`specreg lookup-cache build` tokenizes the user's corpora and the outputs of recorded runs with a
model's tokenizer (llama.cpp's `llama-lookup-create`) into a static n-gram cache that
`ngram-cache` reads with `--lookup-cache-static`. Token ids only mean something within one
tokenizer family, so each cache carries its family's fingerprint (`models.tok_fingerprint`: the
token texts from id 5 on) and is only ever offered to models of that family. It also records
which prompts its text came from, so a run on one of them is known to be a replay.

Migration 6 creates the table and gives runs what stacks and caches need: the cache a run used,
per-type figures of a stack, and each prompt's text and output (the text a cache is built from).
The runner and the CLI hand over typed records; this module owns the SQL.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import duckdb

from specreg.errors import UsageError
from specreg.jsonout import FieldsDocument, plain
from specreg.registry.queries import human_bytes, human_count
from specreg.registry.run_store import STATUS_OK
from specreg.registry.sql import Rows, transaction, where_equal

LOOKUP_CACHES = "lookup_caches"

SOURCE_FILE = "file"  # a corpus file the user gave
SOURCE_RUN = "run"  # the prompt and output of one prompt of a recorded run


def m006_stacks_and_lookup_caches(con: duckdb.DuckDBPyConnection) -> None:
    """Lookup caches (one row per name; a rebuild replaces it), and on runs: the cache used,
    its content hash, per-type figures of a stack; on run prompts: prompt and output text and
    per-type figures."""
    con.execute(
        f"""
        CREATE TABLE {LOOKUP_CACHES} (
            name             VARCHAR PRIMARY KEY,
            path             VARCHAR NOT NULL,
            n_bytes          BIGINT NOT NULL,
            sha256           VARCHAR NOT NULL,   -- of the cache file
            task             VARCHAR,            -- the workload it was built for
            tok_fingerprint  VARCHAR NOT NULL,   -- tokenizer family: models.tok_fingerprint
            tok_family       VARCHAR,            -- its label, e.g. smollm:1a2b3c4d
            n_vocab          BIGINT,             -- of the tokenizing model
            model_id         VARCHAR,            -- the model whose tokenizer built it
            model_path       VARCHAR,
            n_tokens         BIGINT,             -- tokens of the text it was built from
            n_ngrams         BIGINT,             -- distinct n-grams in the file
            n_chars          BIGINT,             -- characters of that text
            sources          JSON,               -- [{{kind, ref, prompt_id, sha256, n_chars}}]
            prompt_sha256s   VARCHAR[],          -- prompts whose text or output is in it
            llama_version    VARCHAR,
            llama_bin_dir    VARCHAR,
            argv             VARCHAR[],
            built_at         TIMESTAMPTZ NOT NULL,
            seconds          DOUBLE
        )
        """
    )
    con.execute("ALTER TABLE runs ADD COLUMN lookup_cache VARCHAR")
    con.execute("ALTER TABLE runs ADD COLUMN lookup_cache_sha256 VARCHAR")
    con.execute("ALTER TABLE runs ADD COLUMN type_figures JSON")
    con.execute("ALTER TABLE run_prompts ADD COLUMN prompt_text VARCHAR")
    con.execute("ALTER TABLE run_prompts ADD COLUMN output_text VARCHAR")
    con.execute("ALTER TABLE run_prompts ADD COLUMN type_figures JSON")


@dataclass(frozen=True)
class CacheSource:
    """One piece of text a cache was built from."""

    kind: str  # SOURCE_FILE | SOURCE_RUN
    ref: str  # the file's path, or "run:<id>"
    sha256: str  # of the text taken
    n_chars: int
    prompt_id: str | None = None  # SOURCE_RUN: which prompt of the run
    prompt_sha256: str | None = None  # SOURCE_RUN: that prompt's text


@dataclass(frozen=True)
class LookupCache:
    """A static n-gram cache file in the registry."""

    JSON_KIND = "lookup-cache"
    JSON_VERSION = "1"

    name: str
    path: str
    n_bytes: int
    sha256: str
    task: str | None
    tok_fingerprint: str
    tok_family: str | None
    n_vocab: int | None
    model_id: str | None
    model_path: str | None
    n_tokens: int | None
    n_ngrams: int | None
    n_chars: int | None
    sources: tuple[CacheSource, ...]
    prompt_sha256s: tuple[str, ...]
    llama_version: str | None
    llama_bin_dir: str | None
    argv: tuple[str, ...]
    built_at: datetime
    seconds: float | None = None

    @property
    def size_str(self) -> str:
        return human_bytes(self.n_bytes)

    @property
    def tokens_str(self) -> str:
        return human_count(self.n_tokens) if self.n_tokens is not None else "?"

    @property
    def sources_str(self) -> str:
        files = sum(1 for s in self.sources if s.kind == SOURCE_FILE)
        runs = sorted({s.ref for s in self.sources if s.kind == SOURCE_RUN})
        parts = []
        if files:
            parts.append(f"{files} file{'s' if files != 1 else ''}")
        if runs:
            parts.append(", ".join(runs))
        return "; ".join(parts) or "-"

    def fits(self, tok_fingerprint: str | None) -> bool:
        """Whether a model with this tokenizer fingerprint may use the cache."""
        return tok_fingerprint is not None and tok_fingerprint == self.tok_fingerprint

    def to_json(self) -> dict[str, Any]:
        from specreg.jsonout import document

        return document(self.JSON_KIND, self.JSON_VERSION, {"cache": self})


@dataclass(frozen=True)
class LookupCacheList(FieldsDocument):
    """`specreg lookup-cache list`."""

    JSON_KIND = "lookup-caches"
    JSON_VERSION = "1"

    caches: tuple[LookupCache, ...]


_CACHES = Rows(LOOKUP_CACHES, LookupCache, instant="built_at", arrays=["prompt_sha256s", "argv"])


def _from_row(row: tuple[Any, ...]) -> LookupCache:
    data = _CACHES.decode(row)
    sources = json.loads(data["sources"]) if isinstance(data["sources"], str) else []
    data["sources"] = tuple(CacheSource(**s) for s in sources or ())
    return LookupCache(**data)


def record_cache(con: duckdb.DuckDBPyConnection, cache: LookupCache) -> None:
    """Store `cache`; one of the same name is replaced (a rebuild)."""
    sources = json.dumps(plain(cache.sources))
    with transaction(con):
        con.execute(f"DELETE FROM {LOOKUP_CACHES} WHERE name = ?", [cache.name])
        _CACHES.insert(con, {**_CACHES.values(cache), "sources": sources})


def find_cache(con: duckdb.DuckDBPyConnection, name: str) -> LookupCache | None:
    sql = f"SELECT {_CACHES.select} FROM {LOOKUP_CACHES} WHERE name = ?"
    row = con.execute(sql, [name]).fetchone()
    return _from_row(row) if row is not None else None


def get_cache(con: duckdb.DuckDBPyConnection, name: str) -> LookupCache:
    """The cache called `name`; a UsageError says how to see the ones there are."""
    found = find_cache(con, name)
    if found is None:
        raise UsageError(
            f"no lookup cache {name!r} in the registry: see `specreg lookup-cache list`, or "
            "build it with `specreg lookup-cache build`"
        )
    return found


def list_caches(
    con: duckdb.DuckDBPyConnection,
    *,
    tok_fingerprint: str | None = None,
    task: str | None = None,
) -> list[LookupCache]:
    """Caches by name; only those of one tokenizer family and/or task when given."""
    where, params = where_equal(tok_fingerprint=tok_fingerprint, task=task)
    sql = f"SELECT {_CACHES.select} FROM {LOOKUP_CACHES}{where}"
    try:
        rows = con.execute(sql + " ORDER BY name", params).fetchall()
    except duckdb.CatalogException:  # a registry from before migration 6 (read-only open)
        return []
    return [_from_row(r) for r in rows]


@dataclass(frozen=True)
class RunText:
    """A recorded prompt and what the run generated for it: text a cache can be built from."""

    run_id: int
    task: str | None
    target_model_id: str | None
    prompt_id: str
    prompt_sha256: str
    prompt_text: str | None
    output_text: str


def run_texts(
    con: duckdb.DuckDBPyConnection,
    *,
    tok_fingerprint: str,
    task: str | None = None,
    run_ids: Sequence[int] = (),
) -> list[RunText]:
    """Prompts and outputs of finished, trusted runs whose target has the tokenizer family
    `tok_fingerprint`: of `task` (a run of several tasks counts for each), or the runs
    `run_ids` whatever their task. Outputs are recorded from migration 6 on."""
    where = [
        "r.status = 'ok'",
        "coalesce(r.trusted, true)",
        "p.output_text IS NOT NULL",
        "m.tok_fingerprint = ?",
    ]
    params: list[Any] = [tok_fingerprint]
    if run_ids:
        where.append(f"r.run_id IN ({', '.join('?' for _ in run_ids)})")
        params += [int(i) for i in run_ids]
    elif task is not None:
        where.append("list_contains(string_split(coalesce(r.task, ''), ','), ?)")
        params.append(task)
    rows = con.execute(
        "SELECT r.run_id, r.task, r.target_model_id, p.prompt_id, p.prompt_sha256, "
        "p.prompt_text, p.output_text FROM runs r "
        "JOIN run_prompts p ON p.run_id = r.run_id "
        "JOIN models m ON m.model_id = r.target_model_id "
        f"WHERE {' AND '.join(where)} ORDER BY r.run_id, p.prompt_id",
        params,
    ).fetchall()
    return [RunText(*row) for row in rows]


def runs_without_text(
    con: duckdb.DuckDBPyConnection, run_ids: Sequence[int]
) -> list[tuple[int, str]]:
    """Of `run_ids`: those that cannot give text, with why (unknown, failed, untrusted, or
    recorded before outputs were kept)."""
    out = []
    for run_id in run_ids:
        row = con.execute(
            "SELECT r.status, coalesce(r.trusted, true), "
            "count(p.output_text) FROM runs r LEFT JOIN run_prompts p ON p.run_id = r.run_id "
            "WHERE r.run_id = ? GROUP BY r.status, r.trusted",
            [int(run_id)],
        ).fetchone()
        if row is None:
            out.append((run_id, "no such run"))
        elif row[0] != STATUS_OK:
            out.append((run_id, f"it is {row[0]}"))
        elif not row[1]:
            out.append((run_id, "it is not trusted"))
        elif not row[2]:
            out.append((run_id, "it was recorded without its outputs (before specreg kept them)"))
    return out
