"""Lookup cache files written byte for byte in llama.cpp's format (common_ngram_cache_save)."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from specreg.registry.lookup_caches import LookupCache


def write_cache(path: Path, records: list[tuple[list[int], list[tuple[int, int]]]]) -> Path:
    """`records`: (n-gram ids, [(next token, count)]) as llama.cpp saves them."""
    ids: list[int] = []
    for key, nexts in records:
        ids += [*key, *[-1] * (4 - len(key)), len(nexts)]
        for token, count in nexts:
            ids += [token, count]
    path.write_bytes(np.asarray(ids, dtype="<i4").tobytes())
    return path


def cache_record(name: str, path: Path, model: Any, task: str = "json") -> LookupCache:
    """A registry record for the cache file `path`, as if `model`'s tokenizer built it."""
    return LookupCache(
        name=name, path=str(path), n_bytes=path.stat().st_size, sha256="0" * 64, task=task,
        tok_fingerprint=model.tok_fingerprint or "", tok_family=f"test:{name}",
        n_vocab=model.n_tokens, model_id=model.model_id, model_path=str(model.path),
        n_tokens=5, n_ngrams=2, n_chars=10, sources=(), prompt_sha256s=(), llama_version=None,
        llama_bin_dir=None, argv=(), built_at=datetime.now(timezone.utc),
    )  # fmt: skip
