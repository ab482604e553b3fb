"""Read access to the registry: models by path, name or id; listings with filters."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, fields
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from specreg.errors import AmbiguousModel, ModelNotFound
from specreg.jsonout import FieldsDocument
from specreg.registry.hub_cache import repo_id, snapshot_name
from specreg.registry.text import fs_path, path_text
from specreg.text import clip

if TYPE_CHECKING:
    import duckdb


@dataclass(frozen=True)
class ModelRecord:
    """One row of the `models` table. Sizes are raw ints; strings for people are properties."""

    model_id: str
    status: str
    path: str
    paths: tuple[str, ...]
    parts_missing: tuple[str, ...]
    n_bytes: int | None
    mtime_ns: int | None
    gguf_version: int | None
    architecture: str | None
    name: str | None
    basename: str | None
    size_label: str | None
    finetune: str | None
    organization: str | None
    file_type: int | None
    quant: str | None
    n_params: int | None
    n_params_active: int | None
    bits_per_weight: float | None
    n_tensors: int | None
    tensor_types: str | None
    block_count: int | None
    context_length: int | None
    embedding_length: int | None
    expert_count: int | None
    expert_used_count: int | None
    expert_used_key: str | None
    is_moe: bool | None
    is_recurrent: bool | None
    is_hybrid: bool | None
    ssm_keys: tuple[str, ...]
    sliding_window: int | None
    uses_mla: bool | None
    nextn_predict_layers: int | None
    has_mtp_tensors: bool | None
    draft_kind: str | None
    draft_binding: str | None
    is_mmproj: bool | None
    tok_model: str | None
    tok_pre: str | None
    vocab_type: str | None
    n_tokens: int | None
    tok_fingerprint: str | None
    vocab_sha: str | None
    bos_id: int | None
    eos_id: int | None
    eot_id: int | None
    pad_id: int | None
    bos_text: str | None
    eos_text: str | None
    eot_text: str | None
    pad_text: str | None
    add_bos_stored: bool | None
    add_eos_stored: bool | None
    add_bos: bool | None
    add_eos: bool | None
    vocab_error: str | None
    chat_template_sha256: str | None
    first_scan: int | None
    last_scan: int | None

    @property
    def display_name(self) -> str:
        return self.name or os.path.basename(self.path)

    @property
    def size_str(self) -> str:
        return human_bytes(self.n_bytes)

    @property
    def choice_label(self) -> str:
        """The model where a user chooses one: the id prefix tables show, quant and file name."""
        return f"{self.model_id[:10]} {self.quant or '?'} {os.path.basename(self.path)}"

    @property
    def params_str(self) -> str:
        return human_count(self.n_params)


# Largest model we list as a draft by default: drafts worth running are small next to targets.
DRAFT_MAX_PARAMS = 4_000_000_000

_COLUMNS = [f.name for f in fields(ModelRecord)]
_SELECT = f"SELECT {', '.join(_COLUMNS)} FROM models"


def _record(row: tuple[Any, ...]) -> ModelRecord:
    values = dict(zip(_COLUMNS, row, strict=True))
    for name in ("paths", "parts_missing", "ssm_keys"):
        values[name] = tuple(values[name] or ())
    return ModelRecord(**values)


def human_bytes(n: int | None) -> str:
    if n is None:
        return "?"
    size = float(n)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if size < 1000 or unit == "TB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{n} B"  # pragma: no cover


def human_count(n: int | None) -> str:
    if n is None:
        return "?"
    for div, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= div:
            return f"{n / div:.1f}{suffix}"
    return str(n)


def list_models(
    con: duckdb.DuckDBPyConnection,
    *,
    architecture: str | None = None,
    tokenizer: str | None = None,
    min_params: int | None = None,
    max_params: int | None = None,
    include_gone: bool = False,
    name: str | None = None,
    role: str | None = None,
) -> list[ModelRecord]:
    """Models matching every given filter. `role`: "draft" (small enough to draft, at most
    DRAFT_MAX_PARAMS, or a dedicated draft head) or "target" (everything larger)."""
    where: list[str] = []
    args: list[Any] = []
    if not include_gone:
        where.append("status != 'gone'")
    if architecture:
        where.append("architecture = ?")
        args.append(architecture)
    if tokenizer:
        # a tokenizer model (gpt2, llama), a pre-tokenizer (qwen2), or a fingerprint prefix
        where.append("(tok_model = ? OR tok_pre = ? OR starts_with(tok_fingerprint, ?))")
        args += [tokenizer, tokenizer, tokenizer]
    if min_params is not None:
        where.append("n_params >= ?")
        args.append(min_params)
    if max_params is not None:
        where.append("n_params <= ?")
        args.append(max_params)
    if name:
        where.append("(contains(lower(name), lower(?)) OR contains(lower(path), lower(?)))")
        args += [name, name]
    if role == "draft":
        where.append("(n_params <= ? OR draft_kind IS NOT NULL) AND NOT coalesce(is_mmproj, false)")
        args.append(DRAFT_MAX_PARAMS)
    elif role == "target":
        where.append("n_params > ? AND draft_kind IS NULL AND NOT coalesce(is_mmproj, false)")
        args.append(DRAFT_MAX_PARAMS)
    sql = _SELECT + (" WHERE " + " AND ".join(where) if where else "")
    sql += " ORDER BY n_params NULLS LAST, path"
    return [_record(r) for r in con.execute(sql, args).fetchall()]


def get_model(con: duckdb.DuckDBPyConnection, model_id: str) -> ModelRecord | None:
    row = con.execute(_SELECT + " WHERE model_id = ?", [model_id]).fetchone()
    return _record(row) if row else None


def model_id_at_path(
    con: duckdb.DuckDBPyConnection, path: str | os.PathLike[str], *, ok_only: bool = False
) -> str | None:
    """The model whose file (any part, or a symlink to it) is at `path`, if scanned."""
    p = os.fspath(path)
    row = con.execute(
        "SELECT model_id FROM files WHERE (path = ? OR list_contains(links, ?))"
        " AND model_id IS NOT NULL AND (status = 'ok' OR NOT ?)"
        " ORDER BY status = 'ok' DESC LIMIT 1",
        [path_text(os.path.realpath(p)), path_text(os.path.abspath(p)), ok_only],
    ).fetchone()
    return str(row[0]) if row else None


# What a forgiving name ignores: case, and every character but letters, digits and dots
# (spaces, hyphens, underscores, slashes; `2.5` and `25` stay different).
_NAME_NOISE = re.compile(r"[^\w.]+|_+")
_SPLIT_SUFFIX = re.compile(r"-\d{5}-of-\d{5}$")
# Names compared for the nearest ones are cut to this many characters (a name may be huge).
_SUGGEST_CHARS = 120


def name_key(text: str) -> str:
    """A name as `resolve_model` compares it forgivingly: case, spaces, hyphens, underscores
    and other punctuation but the dot ignored (`Qwen2.5-Coder_32B` is `qwen2.5coder32b`)."""
    return _NAME_NOISE.sub("", text.casefold())


def _file_names(path: str) -> list[str]:
    """What a file is called by people: its file name, its stem, the stem of its split set,
    and for a Hugging Face cache file its repository (`ORG/NAME`)."""
    base = os.path.basename(path)
    stem = base[:-5] if base.lower().endswith(".gguf") else base
    names = [base, stem, _SPLIT_SUFFIX.sub("", stem)]
    repo = repo_id(path)
    return names + [repo] if repo else names


def model_names(con: duckdb.DuckDBPyConnection) -> dict[str, list[tuple[str, str]]]:
    """Every name a model answers to forgivingly, by `name_key`: key -> [(model id, the name
    as shown)]. A model answers to its `general.name`; its basename, alone and with its size label
    (`Qwen2.5-Coder 32B`); its name with its quant (the alias `specreg init` writes); and the
    file name and stem of each of its files and the links to them (serve's model ids are
    stems made safe, which the key reads alike, with the id's first 8 characters after a stem
    two targets share)."""
    found: dict[str, list[tuple[str, str]]] = {}

    def add(model_id: str, shown: str | None) -> None:
        key = name_key(shown or "")
        if key and (model_id, shown) not in found.setdefault(key, []):
            found[key].append((model_id, shown or ""))

    rows = con.execute("SELECT model_id, name, basename, size_label, quant, paths FROM models")
    for model_id, name, basename, size_label, quant, paths in rows.fetchall():
        add(model_id, name)
        add(model_id, basename)
        if basename and size_label:
            add(model_id, f"{basename} {size_label}")
        if name and quant:
            add(model_id, f"{name} {quant}")
        for path in paths or ():
            for shown in _file_names(path):
                add(model_id, shown)
        if paths:  # serve's id when two targets share a stem: the stem and the id's start
            add(model_id, f"{_file_names(paths[0])[1]}-{model_id[:8]}")
    files = con.execute("SELECT model_id, path, links FROM files WHERE model_id IS NOT NULL")
    for model_id, path, links in files.fetchall():
        for p in (path, *(links or ())):
            for shown in _file_names(p):
                add(model_id, shown)
    return found


def _nearest(ref: str, names: dict[str, list[tuple[str, str]]], n: int = 3) -> list[str]:
    """The names closest to `ref` (difflib's ratio over the forgiving keys), one per model."""
    import difflib

    cut = {key[:_SUGGEST_CHARS]: key for key in names}
    close = difflib.get_close_matches(name_key(ref)[:_SUGGEST_CHARS], list(cut), n=3 * n)
    out: list[str] = []
    seen: set[str] = set()
    for short in close:
        model_id, shown = names[cut[short]][0]
        if model_id not in seen:
            seen.add(model_id)
            out.append(f"{clip(shown, 60)} ({model_id[:10]})")
    return out[:n]


def _choose(ref: str, rows: list[tuple[Any, ...]]) -> ModelRecord:
    present = [r for r in rows if _record(r).status != "gone"] or rows
    if len(present) > 1:
        # two quants of one model share a name: each is shown by id, quant and file
        ids = "; ".join(_record(r).choice_label for r in present[:5])
        more = f"; and {len(present) - 5} more" if len(present) > 5 else ""
        raise AmbiguousModel(
            f"'{ref}' matches {len(present)} models ({ids}{more}): give an id or path"
        )
    return _record(present[0])


def resolve_model(con: duckdb.DuckDBPyConnection, ref: str | os.PathLike[str]) -> ModelRecord:
    """A model by file path (any part or symlink), id or id prefix, or name.

    A name is first matched exactly (`general.name`, `general.basename`), then forgivingly
    (`name_key`: case, spaces, hyphens and underscores ignored) against every name
    `model_names` lists: the name, basename and size label, name and quant, each file's name
    and stem. A name several models answer to is an error naming them; one no model answers
    to is an error naming the nearest."""
    ref_s = os.fspath(ref)
    if os.path.exists(ref_s):
        model_id = model_id_at_path(con, ref_s)
        found = get_model(con, model_id) if model_id else None
        if found:
            return found
        shown = path_text(ref_s)
        raise ModelNotFound(f"{shown} is not in the registry: run `specreg scan {shown}` first")
    rows = con.execute(
        _SELECT + " WHERE starts_with(model_id, ?) OR name = ? OR basename = ?"
        " ORDER BY status = 'gone', model_id",
        [ref_s, ref_s, ref_s],
    ).fetchall()
    if rows:
        return _choose(ref_s, rows)
    names = model_names(con)
    ids = sorted({model_id for model_id, _ in names.get(name_key(ref_s), [])})
    if ids:
        rows = con.execute(
            _SELECT + " WHERE list_contains(?, model_id) ORDER BY status = 'gone', model_id",
            [ids],
        ).fetchall()
        return _choose(ref_s, rows)
    nearest = _nearest(ref_s, names)
    hint = f" (nearest: {', '.join(nearest)})" if nearest else ""
    raise ModelNotFound(
        f"no model matches '{ref_s}': give a path, an id from `specreg models`, or a name{hint}"
    )


def model_fs_paths(con: duckdb.DuckDBPyConnection, model_id: str) -> tuple[str, ...]:
    """The model's present files as the OS names them, in split order: exact even for names
    that are not UTF-8 (`ModelRecord.paths` holds those escaped, for display). A Hugging Face
    cache blob is given by its snapshot link, the name llama.cpp's split loader and people read.
    """
    rows = con.execute(
        "SELECT path, path_raw, links FROM files WHERE model_id = ? AND status = 'ok'"
        " ORDER BY split_no, path",
        [model_id],
    ).fetchall()
    out = []
    for text, raw, links in rows:
        named = snapshot_name(text, links or ()) if raw is None else None
        out.append(named or fs_path(text, bytes(raw) if raw is not None else None))
    return tuple(out)


def model_kv(con: duckdb.DuckDBPyConnection, model_id: str) -> list[tuple[str, str, Any]]:
    rows = con.execute(
        "SELECT key, type, value FROM model_kv WHERE model_id = ? ORDER BY key", [model_id]
    ).fetchall()
    return [(k, t, json.loads(v) if v is not None else None) for k, t, v in rows]


def model_files(con: duckdb.DuckDBPyConnection, model_id: str) -> list[dict[str, Any]]:
    cur = con.execute(
        "SELECT path, links, size, mtime_ns, status, split_no, split_count FROM files"
        " WHERE model_id = ? ORDER BY split_no, path",
        [model_id],
    )
    names = [d[0] for d in cur.description]
    return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]


@dataclass(frozen=True)
class FileProblem:
    path: str
    reason: str


def file_errors(con: duckdb.DuckDBPyConnection) -> list[FileProblem]:
    """Files currently in error, and the latest scan's other problems."""
    rows = con.execute(
        "SELECT path, error FROM files WHERE status = 'error' UNION ALL "
        "SELECT path, reason FROM scan_errors WHERE scan_id = (SELECT max(scan_id) FROM scans)"
        " AND kind IN ('broken_link', 'missing_part') ORDER BY 1"
    ).fetchall()
    return [FileProblem(p, r) for p, r in rows]


@dataclass(frozen=True)
class ScanRecord:
    """One row of the `scans` table."""

    scan_id: int
    started_at: datetime | None
    seconds: float | None
    roots: tuple[str, ...]
    host: str | None
    n_files: int | None
    n_new: int | None
    n_changed: int | None
    n_unchanged: int | None
    n_removed: int | None
    n_errors: int | None


def scan_history(con: duckdb.DuckDBPyConnection, limit: int = 20) -> list[ScanRecord]:
    """The latest scans, newest first."""
    rows = con.execute(
        # epoch(): reading TIMESTAMPTZ values directly would need pytz in the environment.
        "SELECT scan_id, epoch(started_at), seconds, roots, host, n_files, n_new, n_changed,"
        " n_unchanged, n_removed, n_errors FROM scans ORDER BY scan_id DESC LIMIT ?",
        [limit],
    ).fetchall()
    return [
        ScanRecord(
            scan_id=scan_id,
            started_at=None if epoch is None else datetime.fromtimestamp(epoch, timezone.utc),
            seconds=seconds,
            roots=tuple(roots or ()),
            host=host,
            n_files=n_files,
            n_new=n_new,
            n_changed=n_changed,
            n_unchanged=n_unchanged,
            n_removed=n_removed,
            n_errors=n_errors,
        )
        for (
            scan_id,
            epoch,
            seconds,
            roots,
            host,
            n_files,
            n_new,
            n_changed,
            n_unchanged,
            n_removed,
            n_errors,
        ) in rows  # fmt: skip
    ]


def kv_values(con: duckdb.DuckDBPyConnection, key: str) -> dict[str, Any]:
    """One GGUF key's value for every model that has it (model id -> decoded JSON value):
    one query for all models, where `model_kv` per model costs ~2 ms each."""
    rows = con.execute("SELECT model_id, value FROM model_kv WHERE key = ?", [key]).fetchall()
    return {m: json.loads(v) for m, v in rows if v is not None}


# --- results the CLI shows: each owns its `--json` document ---------------------------------


@dataclass(frozen=True)
class ModelList(FieldsDocument):
    """`specreg models`: the models that match a listing's filters."""

    JSON_KIND = "models"
    JSON_VERSION = "1"

    models: tuple[ModelRecord, ...]


@dataclass(frozen=True)
class ModelKey:
    """One GGUF key/value of a model, its value decoded from the stored JSON."""

    key: str
    type: str
    value: Any


@dataclass(frozen=True)
class ModelDetails(FieldsDocument):
    """`specreg show`: a model's row, its files and every GGUF key/value."""

    JSON_KIND = "model"
    JSON_VERSION = "1"

    model: ModelRecord
    files: tuple[dict[str, Any], ...]
    kv: tuple[ModelKey, ...]


def model_details(con: duckdb.DuckDBPyConnection, ref: str | os.PathLike[str]) -> ModelDetails:
    """Everything the registry knows about the model `ref` names (see `resolve_model`)."""
    record = resolve_model(con, ref)
    kv = tuple(ModelKey(k, t, v) for k, t, v in model_kv(con, record.model_id))
    return ModelDetails(record, tuple(model_files(con, record.model_id)), kv)
