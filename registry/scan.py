"""`specreg scan`: walk model folders, read GGUF headers, and bring the registry up to date.

Incremental: a file whose (size, mtime, inode) match the registry is not opened again. One bad
file never stops a scan: it is recorded with its reason and the scan goes on. All writes of a
scan happen in one transaction at the end, so a killed scan leaves the previous state intact.

A scan is a row of named steps, each costing what it must:
`discover` (walk, stat) -> `classify` (against the registry's rows) -> `read_headers` (only
new and changed files) -> `plan_models` (group split sets, build facts of changed models) ->
`to_write` -> `scan_store.write_scan` (one column-wise statement per table).

File names are bytes on Linux; one that is not valid UTF-8 is scanned like any other, stored
with its exact bytes and shown with `\\xNN` escapes (`specreg.registry.text`).
"""

from __future__ import annotations

import logging
import os
import stat
import threading
import time
from collections.abc import Callable, Collection, Iterable, Sequence
from concurrent.futures import Executor, Future, ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specreg.errors import GGUFError, ModelNotFound, UsageError
from specreg.registry import parts as P
from specreg.registry import scan_store as store
from specreg.registry.hub_cache import snapshot_name
from specreg.registry.queries import ModelRecord, resolve_model
from specreg.registry.sql import transaction
from specreg.registry.text import clean_reason, path_raw, path_text

if TYPE_CHECKING:
    import duckdb

    from specreg.registry.gguf_header import GGUFHeader

# The header parser and the facts built from headers (numpy, gguf) are imported by the steps
# that read files, so a scan that finds nothing new never loads them.

log = logging.getLogger(__name__)

ProgressFn = Callable[[int, int, str], None]
# Headers are parsed (and new vocabularies compressed) on this many threads.
SCAN_THREADS = min(2, os.cpu_count() or 1)

# What a ScanIssue's kind says.
UNREADABLE = "unreadable"  # the OS refused (permissions, I/O error)
FORMAT = "format"  # not a GGUF llama.cpp would load
BROKEN_LINK = "broken_link"
MISSING_PART = "missing_part"  # a split set lacks a part
CHANGED_DURING_SCAN = "changed_during_scan"
NOT_A_FILE = "not_a_file"  # a FIFO, socket, device or folder with a GGUF name: never opened
NAME_CLASH = "name_clash"  # a non-UTF-8 name whose escaped text is another file's name


@dataclass(frozen=True)
class ScanIssue:
    path: str  # text form: valid UTF-8, `\xNN` for bytes that are not
    kind: str
    reason: str  # one line, control characters escaped, capped


@dataclass(frozen=True)
class ScanResult:
    JSON_KIND = "scan"
    JSON_VERSION = "1"

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

    def to_json(self) -> dict[str, Any]:
        from specreg.jsonout import document, plain

        return document(self.JSON_KIND, self.JSON_VERSION, plain(self))


def issue(path: str, kind: str, reason: str) -> ScanIssue:
    return ScanIssue(path_text(path), kind, clean_reason(reason))


# --- discover ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Found:
    """What the walk found: real path -> the symlinks that led to it, and the problems."""

    files: dict[str, list[str]]
    issues: list[ScanIssue]


def _is_candidate(name: str, all_files: bool) -> bool:
    return all_files or name.lower().endswith(".gguf")


def _not_a_file(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a folder with a GGUF file's name (its files are scanned on their own)"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe), not a file: not opened"
    if stat.S_ISSOCK(mode):
        return "a socket, not a file: not opened"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device, not a file: not opened"
    return "not a regular file: not opened"


def discover(
    roots: Sequence[Path], *, all_files: bool = False, by_magic: Collection[Path] = ()
) -> Found:
    """Walk the roots. Only regular files are ever opened; anything else that carries a GGUF
    name (a FIFO, a folder, a device) is reported, never read. Files without a .gguf name are
    checked by magic under every root with `all_files`, else under the roots `by_magic` (a
    store such as Ollama's, whose blobs have no name)."""
    found: dict[str, list[str]] = {}
    issues: list[ScanIssue] = []
    seen_dirs: set[tuple[int, int]] = set()

    def consider(path: str, *, named: bool = False, all_files: bool = all_files) -> None:
        try:
            is_link = os.path.islink(path)
            real = os.path.realpath(path)
            st = os.stat(real)
        except OSError as err:
            if os.path.islink(path):
                target = os.readlink(path)
                issues.append(issue(path, BROKEN_LINK, f"symlink target is missing: {target}"))
            else:
                issues.append(issue(path, UNREADABLE, err.strerror or str(err)))
            return
        if not stat.S_ISREG(st.st_mode):
            if named or _is_candidate(os.path.basename(path), False):
                issues.append(issue(path, NOT_A_FILE, _not_a_file(st.st_mode)))
            return
        if all_files and not path.lower().endswith(".gguf"):
            from specreg.registry.gguf_header import has_gguf_magic

            if not has_gguf_magic(real):
                return
        links = found.setdefault(real, [])
        if is_link and path not in links:
            links.append(path)

    def walk_error(err: OSError) -> None:
        issues.append(issue(err.filename or "?", UNREADABLE, err.strerror or str(err)))

    for root in roots:
        magic = all_files or root in by_magic
        root_s = str(root)
        if not os.path.lexists(root_s):
            raise UsageError(f"{root_s} does not exist: give a folder or .gguf file to scan")
        if not os.path.isdir(root_s):
            consider(os.path.abspath(root_s), named=True)
            continue
        for dirpath, dirnames, filenames in os.walk(root_s, followlinks=True, onerror=walk_error):
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
            here = os.path.abspath(dirpath)
            for name in dirnames:
                if name.lower().endswith(".gguf"):
                    issues.append(
                        issue(os.path.join(here, name), NOT_A_FILE, _not_a_file(stat.S_IFDIR))
                    )
            for name in sorted(filenames):
                if _is_candidate(name, magic):
                    consider(os.path.join(here, name), all_files=magic)
    return Found(found, issues)


# --- vocabularies ---------------------------------------------------------------------------------


class VocabJobs:
    """Vocabularies this scan adds to the registry, each compressed once, on whichever
    thread meets it first; the ones the registry holds already are never compressed."""

    def __init__(self, stored: set[str], pool: Executor | None = None) -> None:
        self.stored = stored
        self.pool = pool
        self.jobs: dict[str, Future[store.PackedVocab]] = {}
        self._lock = threading.Lock()

    def _claim(self, blob: P.VocabBlob) -> Future[store.PackedVocab] | None:
        with self._lock:
            if blob.vocab_sha in self.stored or blob.vocab_sha in self.jobs:
                return None
            job: Future[store.PackedVocab] = Future()
            self.jobs[blob.vocab_sha] = job
            return job

    def pack_here(self, blob: P.VocabBlob) -> None:
        """Compress on this thread (a worker that just read the file)."""
        job = self._claim(blob)
        if job is not None:
            _fill(job, blob)

    def pack_later(self, blob: P.VocabBlob) -> None:
        """Compress on the pool while the caller goes on."""
        job = self._claim(blob)
        if job is not None and self.pool is not None:
            self.pool.submit(_fill, job, blob)
        elif job is not None:
            _fill(job, blob)


def _fill(job: Future[store.PackedVocab], blob: P.VocabBlob) -> None:
    try:
        job.set_result(store.pack_vocab(blob))
    except BaseException as err:  # the writer waiting on `job` sees it instead of hanging
        job.set_exception(err)
        raise


# --- classify and read ----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Prepared:
    """A whole-file model's row data, built on the worker that read it."""

    facts: dict[str, Any]
    kv: list[tuple[str, str, str]]
    vocab_sha: str | None


@dataclass
class _File:
    """One real file's progress through this scan."""

    path: str  # as the OS names it
    links: list[str]
    known: store.KnownFile | None = None
    size: int = 0
    mtime_ns: int = 0
    inode: int = 0
    state: str = "new"  # new | changed | unchanged | error
    header: GGUFHeader | None = None
    part: P.PartInfo | None = None
    error: ScanIssue | None = None
    model_id: str | None = None
    # A file that is a whole model is finished where its header was read (most files are):
    # facts, key/values and vocabulary are taken and the parsed header dropped at once, so
    # the next file reuses its memory instead of faulting in fresh pages.
    prepared: _Prepared | None = None
    # What the file is known by where that is not its real path: a Hugging Face cache blob's
    # snapshot link (`models--ORG--NAME/snapshots/REV/FILE.gguf`), never its hash.
    name: str | None = None

    @property
    def text(self) -> str:
        return path_text(self.path)

    @property
    def named(self) -> str:
        """The path the file is known by, as the OS names it (for the split sets' names too)."""
        return self.name or self.path

    @property
    def shown(self) -> str:
        """`named` as text: how the file's model and the scan's lists show it."""
        return path_text(self.named)


def _clashes(found: Found) -> tuple[dict[str, list[str]], list[ScanIssue]]:
    """Keep one file per stored name. Only a name that is not UTF-8 can escape to the name of
    another file (`a\xff` is both the escape of byte 0xff and a valid name): the valid name
    keeps it, the odd one is reported."""
    by_text: dict[str, list[str]] = {}
    for real in found.files:
        by_text.setdefault(path_text(real), []).append(real)
    kept = dict(found.files)
    issues = []
    for text, reals in by_text.items():
        if len(reals) > 1:
            keep = text if text in reals else min(reals)
            for odd in reals:
                if odd != keep:
                    del kept[odd]
                    issues.append(issue(odd, NAME_CLASH, f"its escaped name is also {text}"))
    return kept, issues


def classify(
    found: Found, known: dict[str, store.KnownFile]
) -> tuple[dict[str, _File], list[ScanIssue]]:
    """Stat every found file and compare with its row: new, changed or unchanged."""
    kept, issues = _clashes(found)
    files: dict[str, _File] = {}
    for real, links in kept.items():
        f = files[real] = _File(real, [path_text(link) for link in links], known.get(real))
        f.name = snapshot_name(real, links, look=True)
        if f.name is not None and path_text(f.name) not in f.links:
            f.links.append(path_text(f.name))  # found by looking: recorded with the file
        try:
            st = os.stat(real)
        except OSError as err:
            f.state, f.error = "error", issue(real, UNREADABLE, err.strerror or str(err))
            continue
        f.size, f.mtime_ns, f.inode = st.st_size, st.st_mtime_ns, st.st_ino
        row = f.known
        if row is not None and row.present and row.same_stat(f.size, f.mtime_ns, f.inode):
            f.state = "unchanged"
            f.model_id = row.model_id
            if row.status == "error":
                f.error = issue(real, FORMAT, row.error or "unreadable")
            else:
                f.part = row.part
        else:
            f.state = "new" if row is None or not row.present else "changed"
    return files, issues


def _read(f: _File) -> None:
    """Parse the header, or record why not; detects a file changing while we read it."""
    from specreg.registry import facts as F
    from specreg.registry import gguf_header

    try:
        header = gguf_header.read_header(f.path)
        st = os.stat(f.path)
    except GGUFError as err:
        f.state, f.error = "error", issue(f.path, FORMAT, str(err))
        return
    except OSError as err:
        f.state, f.error = "error", issue(f.path, UNREADABLE, err.strerror or str(err))
        return
    if (st.st_size, st.st_mtime_ns) != (f.size, f.mtime_ns):
        f.state = "error"
        f.error = issue(
            f.path, CHANGED_DURING_SCAN, "file changed while being read (still being written?)"
        )
        return
    f.header = header
    f.part = F.part_info(header, Path(f.named))


def read_headers(
    files: Iterable[_File],
    vocabs: VocabJobs,
    pool: Executor | None = None,
    progress: ProgressFn | None = None,
) -> None:
    """Parse new and changed files, largest first, on `pool`'s threads; a file that is a whole
    model gets its facts built and its new vocabulary compressed there too. Reading, hashing,
    numpy and zstd release the GIL, so a second core shortens the scan."""
    to_read = sorted(
        (f for f in files if f.state in ("new", "changed")), key=lambda f: (-f.size, f.path)
    )
    if progress:
        progress(0, len(to_read), "")
    futures: list[Future[_File]] = []
    if pool is None or len(to_read) < 2:
        done: Iterable[_File] = (_read_it(f, vocabs) for f in to_read)
    else:
        futures = [pool.submit(_read_it, f, vocabs) for f in to_read]
        done = (future.result() for future in as_completed(futures))
    try:
        for i, f in enumerate(done, start=1):
            if progress:
                progress(i, len(to_read), f.text)
    except BaseException:  # Ctrl-C or a bug: do not read the files still queued
        for future in futures:
            future.cancel()
        raise


def _read_it(f: _File, vocabs: VocabJobs) -> _File:
    from specreg.registry import facts as F

    _read(f)
    if f.header is not None and f.part is not None and f.part.split_count == 1:
        blob = F.vocab_blob(f.header)
        if blob is not None:
            vocabs.pack_here(blob)
        f.prepared = _Prepared(
            F.model_facts([(Path(f.named), f.header)], expected_parts=1, missing=[]),
            F.kv_rows(f.header),
            blob.vocab_sha if blob is not None else None,
        )
        f.header = None
    return f


# --- models -----------------------------------------------------------------------------------


@dataclass
class _ModelPlan:
    """What `plan_models` found: rows to write, and what to tell the user."""

    vocabs: VocabJobs
    records: list[ModelRecord] = field(default_factory=list)
    kv: list[tuple[str, str, str, str]] = field(default_factory=list)
    new: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    duplicates: list[tuple[str, str]] = field(default_factory=list)
    issues: list[ScanIssue] = field(default_factory=list)


def _group_key(f: _File) -> tuple[str, ...]:
    """Parts of a split set share their folder and name prefix (a hub cache's blobs, their
    snapshot's); any other file is a group of its own, keyed by the name it is shown by."""
    name = os.path.basename(f.named)
    m = P.SPLIT_NAME.match(name)
    if m and f.part is not None and f.part.split_count > 1:
        return (os.path.dirname(f.named), m["prefix"], m["count"])
    return (f.named,)


def group_models(files: Iterable[_File]) -> dict[tuple[str, ...], list[_File]]:
    """Split sets grouped by name, every other readable file on its own."""
    groups: dict[tuple[str, ...], list[_File]] = {}
    for f in files:
        if f.part is not None:
            groups.setdefault(_group_key(f), []).append(f)
    for members in groups.values():
        members.sort(key=lambda m: (m.part.split_no if m.part else 0, m.path))
    return groups


def _missing_parts(key: tuple[str, ...], members: list[_File], expected: int) -> list[str]:
    if len(key) != 3:
        return []
    have = {m.part.split_no for m in members if m.part}
    prefix = os.path.join(key[0], key[1])
    return [
        f"{prefix}-{n + 1:05d}-of-{expected:05d}.gguf" for n in range(expected) if n not in have
    ]


def plan_models(
    groups: dict[tuple[str, ...], list[_File]],
    stored: dict[str, store.StoredModel],
    vocabs: VocabJobs,
    scan_id: int,
) -> _ModelPlan:
    """Which models are new, rebuilt or unchanged; the facts of those that need writing."""
    plan = _ModelPlan(vocabs)
    seen: dict[str, str] = {}
    for key, members in sorted(groups.items()):
        first = members[0]
        assert first.part is not None  # grouped files all have one
        expected = first.part.split_count if len(key) == 3 else 1
        missing = _missing_parts(key, members, expected)
        plan.issues += [
            issue(p, MISSING_PART, f"split part missing from a {expected}-part set")
            for p in missing
        ]
        model_id = P.model_id_for(first.part.header_sha256)
        if model_id in seen:
            plan.duplicates.append((first.shown, seen[model_id]))
        else:
            seen[model_id] = first.shown
            old = stored.get(model_id)
            status = "incomplete" if missing else "present"
            dirty = any(m.state in ("new", "changed") for m in members)
            same = old is not None and old.paths == tuple(m.shown for m in members)
            if not dirty and same and old is not None and old.status == status:
                pass  # unchanged: its facts stay
            else:
                record = _build_model(
                    members, model_id, status, expected, missing, old, scan_id, plan
                )
                if record is None:
                    continue  # a part failed to read now; its error is recorded
                plan.records.append(record)
                (plan.new if old is None else plan.updated).append(model_id)
        for m in members:
            m.model_id = model_id
    return plan


def _build_model(
    members: list[_File],
    model_id: str,
    status: str,
    expected: int,
    missing: list[str],
    old: store.StoredModel | None,
    scan_id: int,
    plan: _ModelPlan,
) -> ModelRecord | None:
    """A model's row from its parts' headers (reading parts skipped as unchanged)."""
    prepared = members[0].prepared if len(members) == 1 and expected == 1 else None
    if prepared is None:
        prepared = _prepare_parts(members, expected, missing, plan.vocabs)
    if prepared is None:
        return None  # a part failed to read now; its error is recorded
    plan.kv += [(model_id, k, t, v) for k, t, v in prepared.kv]
    facts = dict(prepared.facts)
    for name in ("paths", "parts_missing", "ssm_keys"):
        facts[name] = tuple(facts[name] or ())
    return ModelRecord(
        **facts,
        model_id=model_id,
        status=status,
        n_bytes=sum(m.size for m in members),
        mtime_ns=max(m.mtime_ns for m in members),
        vocab_sha=prepared.vocab_sha,
        first_scan=old.first_scan if old is not None and old.first_scan else scan_id,
        last_scan=scan_id,
    )


def _prepare_parts(
    members: list[_File], expected: int, missing: list[str], vocabs: VocabJobs
) -> _Prepared | None:
    """A split set's (or an unchanged file's) row data from all its parts' headers."""
    from specreg.registry import facts as F

    for m in members:
        if m.header is None:
            _read(m)
    parts = [(Path(m.named), m.header) for m in members if m.header is not None]
    if len(parts) != len(members):
        return None
    first = parts[0][1]
    blob = F.vocab_blob(first)
    if blob is not None:
        vocabs.pack_later(blob)
    facts = F.model_facts(parts, expected_parts=expected, missing=missing)
    return _Prepared(facts, F.kv_rows(first), blob.vocab_sha if blob is not None else None)


# --- write ------------------------------------------------------------------------------------


def _under(path: str, roots: Sequence[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip(os.sep) + os.sep) for r in roots)


def removed_files(
    known: dict[str, store.KnownFile], files: dict[str, _File], roots: Sequence[Path]
) -> list[store.KnownFile]:
    """Rows of files under the scanned roots (or linked from there) that are gone now."""
    scope = [os.path.realpath(r) for r in roots] + [str(r) for r in roots]
    scope_text = [path_text(s) for s in scope]
    return sorted(
        (
            row
            for path, row in known.items()
            if row.present
            and path not in files
            and (_under(path, scope) or any(_under(link, scope_text) for link in row.links))
        ),
        key=lambda row: row.text,
    )


def _file_row(f: _File, scan_id: int) -> store.FileRow:
    part, old = f.part, f.known
    return store.FileRow(
        path=f.text,
        path_raw=path_raw(f.path),
        links=f.links,
        size=f.size,
        mtime_ns=f.mtime_ns,
        inode=f.inode,
        status="error" if f.error else "ok",
        error=f.error.reason if f.error else None,
        model_id=None if f.error else f.model_id,
        split_no=part.split_no if part else None,
        split_count=part.split_count if part else None,
        header_sha256=part.header_sha256 if part else None,
        n_params=part.n_params if part else None,
        n_tensors=part.n_tensors if part else None,
        first_scan=old.first_scan if old and old.present and old.first_scan else scan_id,
        last_scan=scan_id,
    )


def to_write(
    scan_id: int,
    files: dict[str, _File],
    removed: list[store.KnownFile],
    plan: _ModelPlan,
    issues: list[ScanIssue],
) -> store.ScanWrite:
    touched, rewrite = [], []
    for f in files.values():
        if f.state == "unchanged" and f.known is not None and f.model_id == f.known.model_id:
            touched.append(f.text)
        else:
            rewrite.append(_file_row(f, scan_id))
    rewritten = {r.path for r in rewrite}
    return store.ScanWrite(
        scan_id=scan_id,
        touched=touched,
        rewrite=rewrite,
        removed=[r.text for r in removed if r.text not in rewritten],
        models=plan.records,
        kv=plan.kv,
        vocabs=list(plan.vocabs.jobs.values()),  # maybe still compressing: written last
        seen_models=sorted({f.model_id for f in files.values() if f.model_id}),
        issues=[store.IssueRow(i.path, i.kind, i.reason) for i in issues],
    )


def scan_paths(
    con: duckdb.DuckDBPyConnection,
    roots: Iterable[str | os.PathLike[str]],
    *,
    all_files: bool = False,
    progress: ProgressFn | None = None,
    by_magic: Collection[str | os.PathLike[str]] = (),
) -> ScanResult:
    """Bring the registry up to date with the GGUF files under `roots` (files without a .gguf
    name too under every root with `all_files`, or under the roots `by_magic`)."""
    t0 = time.perf_counter()
    started = datetime.now(timezone.utc)
    root_paths = [Path(os.path.abspath(r)) for r in roots]
    if not root_paths:
        raise UsageError("nothing to scan: give at least one folder or .gguf file")
    magic = {Path(os.path.abspath(r)) for r in by_magic}
    found = discover(root_paths, all_files=all_files, by_magic=magic)
    known = store.known_files(con)
    scan_id = store.next_scan_id(con)
    files, clashes = classify(found, known)
    with ThreadPoolExecutor(SCAN_THREADS, thread_name_prefix="specreg-scan") as pool:
        vocabs = VocabJobs(store.vocab_shas(con), pool)
        read_headers(files.values(), vocabs, pool, progress)
        plan = plan_models(group_models(files.values()), store.stored_models(con), vocabs, scan_id)
        errors = [f.error for f in files.values() if f.error is not None]
        issues = sorted([*found.issues, *clashes, *plan.issues, *errors], key=lambda i: i.path)
        write = to_write(scan_id, files, removed_files(known, files, root_paths), plan, issues)
        with transaction(con):
            gone, n_models = store.write_scan(con, write)
            seconds = time.perf_counter() - t0
            row = _scan_row(write, files, [path_text(str(r)) for r in root_paths], started, seconds)
            store.record_scan(con, row)
    return ScanResult(
        scan_id=scan_id,
        roots=tuple(row.roots),
        n_files=row.n_files,
        new=tuple(sorted(f.shown for f in files.values() if f.state == "new")),
        changed=tuple(sorted(f.shown for f in files.values() if f.state == "changed")),
        n_unchanged=row.n_unchanged,
        removed=tuple(write.removed),
        errors=tuple(issues),
        n_models=n_models,
        models_new=tuple(plan.new),
        models_updated=tuple(plan.updated),
        models_gone=tuple(gone),
        seconds=seconds,
        duplicates=tuple(plan.duplicates),
    )


def _scan_row(
    write: store.ScanWrite,
    files: dict[str, _File],
    roots: list[str],
    started: datetime,
    seconds: float,
) -> store.ScanRow:
    def count(state: str) -> int:
        return sum(f.state == state for f in files.values())

    return store.ScanRow(
        scan_id=write.scan_id,
        started_at=started,
        finished_at=datetime.now(timezone.utc),
        roots=roots,
        n_files=len(files),
        n_new=count("new"),
        n_changed=count("changed"),
        n_unchanged=count("unchanged"),
        n_removed=len(write.removed),
        n_errors=len(write.issues),
        seconds=seconds,
    )


def model_record(con: duckdb.DuckDBPyConnection, path: Path) -> ModelRecord:
    """The registry's record for a model file, scanning the file first if it is new."""
    if not Path(path).is_file():
        raise UsageError(f"no model file at {path}: give the path of a .gguf file")
    try:
        return resolve_model(con, path)
    except ModelNotFound:
        scan_paths(con, [path])
        return resolve_model(con, path)
