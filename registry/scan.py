"""`specreg scan`: walk model folders, read GGUF headers, and bring the registry up to date.

Incremental: a file whose (size, mtime, inode) match the registry is not opened again. One bad
file never stops a scan: it is recorded with its reason and the scan goes on. All writes of a
scan happen in one transaction at the end, so a killed scan leaves the previous state intact.
"""

from __future__ import annotations

import logging
import os
import socket
import stat
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import duckdb

from specreg.errors import UsageError
from specreg.registry import facts as F
from specreg.registry.db import transaction
from specreg.registry.gguf_header import GGUFError, GGUFHeader, has_gguf_magic, read_header
from specreg.registry.tables import insert_rows

log = logging.getLogger(__name__)

ProgressFn = Callable[[int, int, str], None]


@dataclass(frozen=True)
class ScanIssue:
    path: str
    kind: str  # unreadable | format | broken_link | missing_part | changed_during_scan
    reason: str


@dataclass(frozen=True)
class ScanResult:
    scan_id: int
    roots: tuple[str, ...]
    n_files: int
    new: tuple[str, ...]
    changed: tuple[str, ...]
    n_unchanged: int
    removed: tuple[str, ...]
    errors: tuple[ScanIssue, ...]
    n_models: int
    models_new: tuple[str, ...]
    models_updated: tuple[str, ...]
    models_gone: tuple[str, ...]
    seconds: float
    duplicates: tuple[tuple[str, str], ...] = field(default=())

    @property
    def ok(self) -> bool:
        return not self.errors


@dataclass
class _File:
    path: str  # real path
    links: list[str]
    size: int = 0
    mtime_ns: int = 0
    inode: int = 0
    state: str = "new"  # new | changed | unchanged | error
    header: GGUFHeader | None = None
    part: F.PartInfo | None = None
    error: ScanIssue | None = None
    model_id: str | None = None


def _is_candidate(name: str, all_files: bool) -> bool:
    return all_files or name.lower().endswith(".gguf")


def discover(
    roots: Sequence[Path], *, all_files: bool = False
) -> tuple[dict[str, list[str]], list[ScanIssue]]:
    """Real path -> the symlinks that led to it, plus broken links found on the way."""
    found: dict[str, list[str]] = {}
    issues: list[ScanIssue] = []
    seen_dirs: set[tuple[int, int]] = set()

    def consider(path: str) -> None:
        try:
            is_link = os.path.islink(path)
            real = os.path.realpath(path)
            st = os.stat(real)
        except OSError as err:
            if os.path.islink(path):
                issues.append(
                    ScanIssue(
                        path, "broken_link", f"symlink target is missing: {os.readlink(path)}"
                    )
                )
            else:
                issues.append(ScanIssue(path, "unreadable", err.strerror or str(err)))
            return
        if not stat.S_ISREG(st.st_mode):
            return
        if all_files and not path.lower().endswith(".gguf") and not has_gguf_magic(real):
            return
        links = found.setdefault(real, [])
        if is_link and path not in links:
            links.append(path)

    for root in roots:
        root_s = str(root)
        if not os.path.lexists(root_s):
            raise UsageError(f"{root_s} does not exist: give a folder or .gguf file to scan")
        if os.path.isfile(root_s) or (os.path.islink(root_s) and not os.path.isdir(root_s)):
            consider(os.path.abspath(root_s))
            continue
        for dirpath, dirnames, filenames in os.walk(root_s, followlinks=True):
            try:
                st = os.stat(dirpath)
            except OSError:
                continue
            key = (st.st_dev, st.st_ino)
            if key in seen_dirs:  # a symlink loop, or a folder reached twice
                dirnames[:] = []
                continue
            seen_dirs.add(key)
            dirnames.sort()
            for name in sorted(filenames):
                if _is_candidate(name, all_files):
                    consider(os.path.join(os.path.abspath(dirpath), name))
    return found, issues


def _under(path: str, roots: Sequence[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip(os.sep) + os.sep) for r in roots)


def _read(f: _File) -> None:
    """Parse the header, or record why not; detects a file changing while we read it."""
    try:
        header = read_header(f.path)
        st = os.stat(f.path)
    except GGUFError as err:
        f.state, f.error = "error", ScanIssue(f.path, "format", str(err))
        return
    except OSError as err:
        f.state, f.error = "error", ScanIssue(f.path, "unreadable", err.strerror or str(err))
        return
    if (st.st_size, st.st_mtime_ns) != (f.size, f.mtime_ns):
        f.state = "error"
        f.error = ScanIssue(
            f.path, "changed_during_scan", "file changed while being read (still being written?)"
        )
        return
    f.header = header
    f.part = F.part_info(header, Path(f.path))


def _group_key(f: _File) -> tuple[str, ...]:
    name = os.path.basename(f.path)
    m = F.SPLIT_NAME.match(name)
    assert f.part is not None
    if m and f.part.split_count > 1:
        return (os.path.dirname(f.path), m["prefix"], m["count"])
    return (f.path,)


def scan_paths(
    con: duckdb.DuckDBPyConnection,
    roots: Iterable[str | os.PathLike[str]],
    *,
    all_files: bool = False,
    progress: ProgressFn | None = None,
) -> ScanResult:
    t0 = time.perf_counter()
    started = datetime.now(timezone.utc)
    root_paths = [Path(os.path.abspath(r)) for r in roots]
    if not root_paths:
        raise UsageError("nothing to scan: give at least one folder or .gguf file")
    found, issues = discover(root_paths, all_files=all_files)
    scope = [os.path.realpath(r) for r in root_paths] + [str(r) for r in root_paths]

    known = {
        row[0]: row
        for row in con.execute(
            "SELECT path, links, size, mtime_ns, inode, status, model_id, split_no, split_count,"
            " header_sha256, n_params, n_tensors, error, first_scan FROM files"
        ).fetchall()
    }
    scan_id = (con.execute("SELECT coalesce(max(scan_id), 0) FROM scans").fetchone() or [0])[0] + 1

    files: dict[str, _File] = {}
    for real, links in found.items():
        f = _File(real, links)
        try:
            st = os.stat(real)
        except OSError as err:
            f.state, f.error = "error", ScanIssue(real, "unreadable", err.strerror or str(err))
            files[real] = f
            continue
        f.size, f.mtime_ns, f.inode = st.st_size, st.st_mtime_ns, st.st_ino
        row = known.get(real)
        if (
            row is not None
            and row[5] != "gone"
            and (row[2], row[3], row[4])
            == (
                f.size,
                f.mtime_ns,
                f.inode,
            )
        ):
            f.state = "unchanged"
            f.model_id = row[6]
            if row[5] == "error":
                f.error = ScanIssue(real, "format", row[12] or "unreadable")
            else:
                f.part = F.PartInfo(row[7], row[8], row[9], row[10], row[11])
        else:
            f.state = "new" if row is None or row[5] == "gone" else "changed"
        files[real] = f

    to_read = [f for f in files.values() if f.state in ("new", "changed")]
    for i, f in enumerate(to_read):
        if progress:
            progress(i, len(to_read), f.path)
        _read(f)
    if progress:
        progress(len(to_read), len(to_read), "")

    # Group into models: split sets by name, everything else alone.
    groups: dict[tuple[str, ...], list[_File]] = {}
    for f in files.values():
        if f.part is not None:
            groups.setdefault(_group_key(f), []).append(f)

    model_rows = {
        r[0]: r for r in con.execute("SELECT model_id, paths, status FROM models").fetchall()
    }
    new_models: list[dict[str, Any]] = []
    kv_rows: list[tuple[str, str, str, str]] = []
    vocab_blobs: dict[str, F.VocabBlob] = {}
    models_new: list[str] = []
    models_updated: list[str] = []
    duplicates: list[tuple[str, str]] = []
    seen_models: dict[str, str] = {}

    for key, members in sorted(groups.items()):
        members.sort(key=lambda m: (m.part.split_no if m.part else 0, m.path))
        first = members[0]
        assert first.part is not None
        expected = first.part.split_count if len(key) == 3 else 1
        missing: list[str] = []
        if len(key) == 3:
            have = {m.part.split_no for m in members if m.part}
            prefix = os.path.join(key[0], key[1])
            missing = [
                f"{prefix}-{n + 1:05d}-of-{expected:05d}.gguf"
                for n in range(expected)
                if n not in have
            ]
            for path in missing:
                issues.append(
                    ScanIssue(
                        path, "missing_part", f"split part missing from a {expected}-part set"
                    )
                )
        model_id = F.model_id_for(first.part.header_sha256)
        if model_id in seen_models:
            duplicates.append((first.path, seen_models[model_id]))
            for m in members:
                m.model_id = model_id
            continue
        seen_models[model_id] = first.path
        paths = [m.path for m in members]
        stored = model_rows.get(model_id)
        status = "incomplete" if missing else "present"
        dirty = any(m.state in ("new", "changed") for m in members)
        if stored is not None and not dirty and list(stored[1]) == paths and stored[2] == status:
            for m in members:
                m.model_id = model_id
            continue
        # (Re)build the model's facts: read parts we skipped as unchanged.
        for m in members:
            if m.header is None:
                _read(m)
        if any(m.header is None for m in members):
            continue  # a part failed to read now; its error is recorded
        parts = [(Path(m.path), m.header) for m in members if m.header is not None]
        row = F.model_facts(parts, expected_parts=expected, missing=missing)
        row.update(
            model_id=model_id,
            status=status,
            n_bytes=sum(m.size for m in members),
            mtime_ns=max(m.mtime_ns for m in members),
            first_scan=scan_id,
            last_scan=scan_id,
        )
        new_models.append(row)
        (models_new if stored is None else models_updated).append(model_id)
        for k, t, v in F.kv_rows(parts[0][1]):
            kv_rows.append((model_id, k, t, v))
        blob = F.vocab_blob(parts[0][1])
        if blob is not None:
            row["vocab_sha"] = blob.vocab_sha
            vocab_blobs[blob.vocab_sha] = blob
        for m in members:
            m.model_id = model_id

    issues.extend(f.error for f in files.values() if f.error is not None)

    in_scope_known = [
        p
        for p, row in known.items()
        if row[5] != "gone"
        and (_under(p, scope) or any(_under(link, scope) for link in (row[1] or [])))
    ]
    removed = sorted(p for p in in_scope_known if p not in files)

    with transaction(con):
        _write(con, scan_id, files, known, removed, new_models, kv_rows, vocab_blobs)
        gone = [
            r[0]
            for r in con.execute(
                "UPDATE models SET status = 'gone' WHERE status != 'gone' AND model_id NOT IN "
                "(SELECT model_id FROM files WHERE status = 'ok' AND model_id IS NOT NULL) "
                "RETURNING model_id"
            ).fetchall()
        ]
        if issues:
            insert_rows(
                con,
                "scan_errors",
                [
                    {"scan_id": scan_id, "path": i.path, "kind": i.kind, "reason": i.reason}
                    for i in issues
                ],
            )
        n_models = (
            con.execute("SELECT count(*) FROM models WHERE status != 'gone'").fetchone() or [0]
        )[0]
        seconds = time.perf_counter() - t0
        insert_rows(
            con,
            "scans",
            [
                {
                    "scan_id": scan_id,
                    "started_at": started,
                    "finished_at": datetime.now(timezone.utc),
                    "roots": [str(r) for r in root_paths],
                    "host": socket.gethostname(),
                    "n_files": len(files),
                    "n_new": sum(f.state == "new" for f in files.values()),
                    "n_changed": sum(f.state == "changed" for f in files.values()),
                    "n_unchanged": sum(f.state == "unchanged" for f in files.values()),
                    "n_removed": len(removed),
                    "n_errors": len(issues),
                    "seconds": seconds,
                }
            ],
        )

    return ScanResult(
        scan_id=scan_id,
        roots=tuple(str(r) for r in root_paths),
        n_files=len(files),
        new=tuple(sorted(f.path for f in files.values() if f.state == "new")),
        changed=tuple(sorted(f.path for f in files.values() if f.state == "changed")),
        n_unchanged=sum(f.state == "unchanged" for f in files.values()),
        removed=tuple(removed),
        errors=tuple(sorted(issues, key=lambda i: i.path)),
        n_models=int(n_models),
        models_new=tuple(models_new),
        models_updated=tuple(models_updated),
        models_gone=tuple(gone),
        seconds=seconds,
        duplicates=tuple(duplicates),
    )


def _write(
    con: duckdb.DuckDBPyConnection,
    scan_id: int,
    files: dict[str, _File],
    known: dict[str, tuple[Any, ...]],
    removed: list[str],
    new_models: list[dict[str, Any]],
    kv_rows: list[tuple[str, str, str, str]],
    vocab_blobs: dict[str, F.VocabBlob],
) -> None:
    unchanged = [
        p for p, f in files.items() if f.state == "unchanged" and f.model_id == known[p][6]
    ]
    if unchanged:
        con.execute(
            "UPDATE files SET last_scan = ? WHERE path IN (SELECT unnest(?))", [scan_id, unchanged]
        )
    rewrite = [f for p, f in files.items() if p not in unchanged]
    if rewrite:
        con.execute(
            "DELETE FROM files WHERE path IN (SELECT unnest(?))", [[f.path for f in rewrite]]
        )
        rows = []
        for f in rewrite:
            old = known.get(f.path)
            part = f.part
            rows.append(
                {
                    "path": f.path,
                    "links": f.links,
                    "size": f.size,
                    "mtime_ns": f.mtime_ns,
                    "inode": f.inode,
                    "status": "error" if f.error else "ok",
                    "error": f.error.reason if f.error else None,
                    "model_id": None if f.error else f.model_id,
                    "split_no": part.split_no if part else None,
                    "split_count": part.split_count if part else None,
                    "header_sha256": part.header_sha256 if part else None,
                    "n_params": part.n_params if part else None,
                    "n_tensors": part.n_tensors if part else None,
                    "first_scan": old[13] if old and old[5] != "gone" else scan_id,
                    "last_scan": scan_id,
                    "gone_scan": None,
                }
            )
        insert_rows(con, "files", rows)
    if removed:
        con.execute(
            "UPDATE files SET status = 'gone', gone_scan = ? WHERE path IN (SELECT unnest(?))",
            [scan_id, removed],
        )
    if new_models:
        ids = [m["model_id"] for m in new_models]
        firsts = dict(
            con.execute(
                "SELECT model_id, first_scan FROM models WHERE model_id IN (SELECT unnest(?))",
                [ids],
            ).fetchall()
        )
        for m in new_models:
            m["first_scan"] = firsts.get(m["model_id"], scan_id)
        con.execute("DELETE FROM models WHERE model_id IN (SELECT unnest(?))", [ids])
        con.execute("DELETE FROM model_kv WHERE model_id IN (SELECT unnest(?))", [ids])
        insert_rows(con, "models", new_models)
        insert_rows(
            con,
            "model_kv",
            [{"model_id": a, "key": b, "type": c, "value": d} for a, b, c, d in kv_rows],
        )
    # Models whose files were all seen unchanged keep their facts; mark them seen.
    if files:
        con.execute(
            "UPDATE models SET last_scan = ? WHERE model_id IN (SELECT unnest(?))",
            [scan_id, sorted({f.model_id for f in files.values() if f.model_id})],
        )
    if vocab_blobs:
        existing = {
            r[0]
            for r in con.execute(
                "SELECT vocab_sha FROM vocabs WHERE vocab_sha IN (SELECT unnest(?))",
                [list(vocab_blobs)],
            ).fetchall()
        }
        insert_rows(
            con,
            "vocabs",
            [
                {
                    "vocab_sha": b.vocab_sha,
                    "n_tokens": b.n_tokens,
                    "tokens_z": b.tokens_z,
                    "token_types": b.token_types,
                }
                for sha, b in vocab_blobs.items()
                if sha not in existing
            ],
        )
