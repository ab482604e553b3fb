"""Build, check and locate workload lookup caches (static n-gram caches for `ngram-cache`).

A cache is built with the build's own `llama-lookup-create`, which tokenizes one text with a
model's tokenizer and counts, for every 2-gram, the tokens that followed it
(`common_ngram_cache_update` with LLAMA_NGRAM_STATIC = 2). llama-server's ngram-cache reads it
with `--lookup-cache-static` and drafts from it when the request's own context has no match
(`common_ngram_cache_draft`); the server never writes a cache (its save flags are hard-coded
off), so every cache it uses is built here, offline.

The file format is `common_ngram_cache_save`'s: records of an n-gram (LLAMA_NGRAM_MAX = 4 int32
token ids, unused ones -1), an int32 count of following tokens, then that many (token, count)
int32 pairs. `common_ngram_cache_load` GGML_ASSERT-aborts on a truncated or corrupt file, and
the server then aborts with "Couldn't read static lookup cache"; `read_cache_file` finds the
same faults first and says so in one line, before any server starts.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import duckdb
import numpy as np

from specreg.errors import LlamaError, UsageError, param
from specreg.home import logs_dir, specreg_home
from specreg.host.machine import Host
from specreg.llama.install import LlamaInstall
from specreg.llama.process import llama_message, run_tool
from specreg.llamacpp import Flag, Tool
from specreg.registry.lookup_caches import (
    SOURCE_FILE,
    SOURCE_RUN,
    CacheSource,
    LookupCache,
    get_cache,
    record_cache,
    run_texts,
    runs_without_text,
)
from specreg.registry.queries import ModelRecord
from specreg.registry.scan import model_record
from specreg.terms import TASKS, canonical_task

log = logging.getLogger(__name__)

LOOKUP_CREATE = Tool.LOOKUP_CREATE
NGRAM_MAX = 4  # LLAMA_NGRAM_MAX (common/ngram-cache.h): ids per n-gram key
NGRAM_STATIC = 2  # LLAMA_NGRAM_STATIC: llama-lookup-create keys on 2-grams
TOKEN_NULL = -1  # LLAMA_TOKEN_NULL: an unused id of a key
_HEAD = NGRAM_MAX + 1  # int32s before a record's (token, count) pairs
# The tokenizing model's context: tokenizing needs none, but a context is created anyway.
CREATE_CTX = 256
BUILD_TIMEOUT_S = 1800.0
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
# Between pieces of text in the corpus: a paragraph break, as between documents.
SEPARATOR = "\n\n"


class LookupCacheError(UsageError):
    """A lookup cache file llama.cpp cannot read, or a cache offered to the wrong model."""


@dataclass(frozen=True)
class CacheFileFacts:
    """What a cache file holds, read without llama.cpp."""

    n_bytes: int
    n_ngrams: int  # records (distinct keys)
    n_counted: int  # (key, next token) occurrences counted
    max_token: int  # the largest token id in it (-1 when empty)
    static: bool  # every key is a 2-gram (built by llama-lookup-create)

    @property
    def n_tokens(self) -> int | None:
        """Tokens of the text a static cache was built from: each one after the first two
        was counted once."""
        return self.n_counted + NGRAM_STATIC if self.static else None


def _rebuild(path: Path) -> str:
    return f"rebuild it (`specreg lookup-cache build`) or remove {path.name}"


def read_cache_file(path: Path, n_vocab: int | None = None) -> CacheFileFacts:
    """Check `path` the way llama.cpp will read it; a `LookupCacheError` (one line) for a file
    it cannot read or would abort on, or ids beyond `n_vocab` (another tokenizer's cache)."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise LookupCacheError(
            f"lookup cache {path} cannot be read ({err.strerror}); llama-server would abort "
            f"on it: {_rebuild(path)}"
        ) from err
    if not raw:
        raise LookupCacheError(
            f"lookup cache {path} is empty: it holds no n-grams to draft from; {_rebuild(path)}"
        )
    if len(raw) % 4:
        raise LookupCacheError(
            f"lookup cache {path} is truncated ({len(raw)} bytes is not a whole number of "
            f"4-byte ids); llama-server would abort on it: {_rebuild(path)}"
        )
    ids = np.frombuffer(raw, dtype="<i4")
    n, i, n_ngrams, counted, top, static = len(ids), 0, 0, 0, -1, True
    while i < n:
        at = i * 4
        if i + _HEAD > n:
            raise LookupCacheError(
                f"lookup cache {path} is truncated at byte {at} (an n-gram record needs "
                f"{_HEAD * 4} bytes, {len(raw) - at} are left); llama-server would abort on "
                f"it: {_rebuild(path)}"
            )
        key = ids[i : i + NGRAM_MAX]
        n_next = int(ids[i + NGRAM_MAX])
        if n_next <= 0 or key[0] < 0 or (key < TOKEN_NULL).any():
            raise LookupCacheError(
                f"lookup cache {path} is corrupt at byte {at} (not an n-gram record: key "
                f"{key.tolist()}, {n_next} next tokens); {_rebuild(path)}"
            )
        end = i + _HEAD + 2 * n_next
        if end > n:
            raise LookupCacheError(
                f"lookup cache {path} is truncated at byte {at} (its last record lists "
                f"{n_next} tokens, the file ends {end * 4 - len(raw)} bytes early); "
                f"llama-server would abort on it: {_rebuild(path)}"
            )
        pairs = ids[i + _HEAD : end].reshape(-1, 2)
        if (pairs[:, 1] <= 0).any() or (pairs[:, 0] < 0).any():
            raise LookupCacheError(
                f"lookup cache {path} is corrupt at byte {at} (a token id below 0 or a count "
                f"of 0); {_rebuild(path)}"
            )
        used = key[key != TOKEN_NULL]
        static = static and len(used) == NGRAM_STATIC and bool((key[NGRAM_STATIC:] == -1).all())
        top = max(top, int(pairs[:, 0].max()), int(used.max()))
        counted += int(pairs[:, 1].sum())
        n_ngrams += 1
        i = end
    if n_vocab is not None and top >= n_vocab:
        raise LookupCacheError(
            f"lookup cache {path} holds token id {top}, beyond the {n_vocab} tokens of the "
            "model's vocabulary: it was built with another tokenizer; build one with this "
            "model (`specreg lookup-cache build NAME --model MODEL`)"
        )
    return CacheFileFacts(len(raw), n_ngrams, counted, top, static)


def caches_dir() -> Path:
    """Where built caches live: state the user made, under SPECREG_HOME."""
    return specreg_home() / "lookup-caches"


def tokenizer_family(model: ModelRecord) -> str:
    """The label of a model's tokenizer family: its (pre-)tokenizer and fingerprint prefix."""
    name = model.tok_pre or model.tok_model or "?"
    return f"{name}:{(model.tok_fingerprint or '?')[:8]}"


def usable_cache(
    con: duckdb.DuckDBPyConnection, name: str, target: ModelRecord
) -> tuple[LookupCache, CacheFileFacts]:
    """The registry's cache `name` checked for `target`: same tokenizer family, the file as
    built and readable by llama.cpp. Raises `LookupCacheError` (one line) otherwise."""
    cache = get_cache(con, name)
    if not cache.fits(target.tok_fingerprint):
        raise LookupCacheError(
            f"lookup cache {name} was built for tokenizer family {cache.tok_family} and "
            f"{target.display_name} has {tokenizer_family(target)}: token ids differ between "
            "families; build a cache with this model (`specreg lookup-cache build NAME --model "
            f"{target.model_id[:12]} ...`)"
        )
    path = Path(cache.path)
    facts = read_cache_file(path, target.n_tokens)
    if facts.n_bytes != cache.n_bytes:
        raise LookupCacheError(
            f"lookup cache {name} ({path}) has {facts.n_bytes} bytes, {cache.n_bytes} when it "
            f"was built: it changed on disk; {_rebuild(path)}"
        )
    return cache, facts


@dataclass(frozen=True)
class BuildRequest:
    """What `specreg lookup-cache build` was asked for."""

    name: str
    task: str
    model_path: Path  # its tokenizer tokenizes the text (scanned first when new)
    files: tuple[Path, ...] = ()
    from_runs: bool = False
    run_ids: tuple[int, ...] = ()  # only these runs (implies from_runs)
    threads: int | None = None


@dataclass(frozen=True)
class _Piece:
    source: CacheSource
    text: str


def _file_pieces(files: Sequence[Path]) -> list[_Piece]:
    out = []
    for f in files:
        try:
            data = Path(f).read_bytes()
        except OSError as err:
            raise UsageError(f"cannot read {f}: {err.strerror}") from err
        # llama.cpp tokenizes bytes; undecodable bytes become U+FFFD here, as they would there
        text = data.decode("utf-8", errors="replace")
        if not text.strip():
            raise UsageError(f"{f} is empty: give files with text of your workload")
        out.append(_Piece(CacheSource(SOURCE_FILE, os.fspath(f), _sha(text), len(text)), text))
    return out


def _run_pieces(
    con: duckdb.DuckDBPyConnection, req: BuildRequest, model: ModelRecord
) -> list[_Piece]:
    if req.run_ids:
        bad = runs_without_text(con, req.run_ids)
        if bad:
            run_id, why = bad[0]
            raise UsageError(f"run {run_id} cannot give text to {req.name}: {why}")
    texts = run_texts(
        con,
        tok_fingerprint=model.tok_fingerprint or "",
        task=None if req.run_ids else req.task,
        run_ids=req.run_ids,
    )
    if req.run_ids:
        found = {t.run_id for t in texts}
        missing = [r for r in req.run_ids if r not in found]
        if missing:
            raise UsageError(
                f"run {missing[0]} measured a model of another tokenizer family than "
                f"{model.display_name}: a cache is only built from one family's runs"
            )
    out = []
    for t in texts:
        # A run's prompt and its output read as one text: the output continues the prompt.
        text = (t.prompt_text or "") + t.output_text
        source = CacheSource(
            SOURCE_RUN, f"run:{t.run_id}", _sha(text), len(text), t.prompt_id, t.prompt_sha256
        )
        out.append(_Piece(source, text))
    return out


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def check_name(name: str) -> str:
    if not _NAME.fullmatch(name):
        raise UsageError(
            f"lookup cache name {name!r}: use 1-64 letters, digits, '_', '.' or '-', starting "
            "with a letter or digit"
        )
    return name


def build_cache(
    con: duckdb.DuckDBPyConnection, install: LlamaInstall, host: Host, req: BuildRequest
) -> LookupCache:
    """Build the cache `req` asks for with the build's llama-lookup-create, check the file,
    keep it under `caches_dir()` and record it (a rebuild of the same name replaces it)."""
    check_name(req.name)
    task = canonical_task(req.task)
    if task not in TASKS:
        raise UsageError(f"unknown task {req.task!r}: use one of {', '.join(TASKS)}")
    model = model_record(con, req.model_path)
    if not model.tok_fingerprint:
        raise UsageError(
            f"{model.display_name} has no vocabulary in the registry, so the cache could "
            "not be tied to a tokenizer family: rescan it with `specreg scan`"
        )
    binary = install.binary(LOOKUP_CREATE)
    pieces = _file_pieces(req.files)
    if req.from_runs or req.run_ids:
        pieces += _run_pieces(con, req, model)
    if not pieces:
        where = "--from-runs found no recorded outputs" if req.from_runs else "no FILES given"
        raise UsageError(
            f"nothing to build {req.name} from ({where}): give files of your workload, or "
            f"record runs of {param('task')} {task} on a model of this tokenizer family "
            f"({tokenizer_family(model)}) and pass {param('from_runs')}"
        )
    corpus = SEPARATOR.join(p.text for p in pieces)
    started = datetime.now(timezone.utc)
    t0 = time.monotonic()
    out_dir = caches_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    final = out_dir / f"{req.name}.lcs"
    stamp = started.strftime("%Y%m%dT%H%M%S%f")
    log_path = logs_dir() / f"{LOOKUP_CREATE}-{stamp}.log"
    with tempfile.TemporaryDirectory(prefix="specreg-lookup-", dir=out_dir) as tmp:
        corpus_file = Path(tmp) / "corpus.txt"
        corpus_file.write_text(corpus, encoding="utf-8", errors="surrogatepass")
        built = Path(tmp) / "cache.lcs"
        argv = [
            *host.launch_prefix(), str(binary), Flag.MODEL, str(req.model_path),
            Flag.PROMPT_FILE, str(corpus_file), Flag.LOOKUP_CACHE_STATIC_SHORT, str(built),
            Flag.CTX, str(CREATE_CTX), Flag.THREADS, str(req.threads or host.threads),
        ]  # fmt: skip
        result = run_tool(argv, env=host.env(), log_path=log_path, timeout=BUILD_TIMEOUT_S)
        if result.returncode != 0 or not built.is_file():
            raise LlamaError(
                f"{LOOKUP_CREATE} failed (exit code {result.returncode}): "
                f"{llama_message(result.log_text) or 'no message'}; see {log_path}"
            )
        facts = read_cache_file(built, model.n_tokens)
        os.replace(built, final)  # the temporary folder is inside out_dir: one file system
    shown = [a if a not in (str(corpus_file), str(built)) else "CORPUS.txt" for a in argv]
    shown[shown.index(Flag.LOOKUP_CACHE_STATIC_SHORT) + 1] = str(final)
    data = final.read_bytes()
    cache = LookupCache(
        name=req.name,
        path=os.fspath(final),
        n_bytes=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
        task=task,
        tok_fingerprint=model.tok_fingerprint,
        tok_family=tokenizer_family(model),
        n_vocab=model.n_tokens,
        model_id=model.model_id,
        model_path=os.fspath(req.model_path),
        n_tokens=facts.n_tokens,
        n_ngrams=facts.n_ngrams,
        n_chars=len(corpus),
        sources=tuple(p.source for p in pieces),
        prompt_sha256s=tuple(
            dict.fromkeys(p.source.prompt_sha256 for p in pieces if p.source.prompt_sha256)
        ),
        llama_version=install.version,
        llama_bin_dir=os.fspath(install.bin_dir),
        argv=tuple(shown),
        built_at=started,
        seconds=time.monotonic() - t0,
    )
    record_cache(con, cache)
    log.info("lookup cache %s: %d n-grams, %s tokens", req.name, facts.n_ngrams, facts.n_tokens)
    return cache
