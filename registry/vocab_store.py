"""Vocabularies stored once per distinct token list, loaded back for exact diffs."""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from functools import lru_cache

import duckdb
import numpy as np

from specreg.errors import RegistryError
from specreg.registry.gguf_header import StringArray, parse_string_array


@dataclass(frozen=True)
class Vocab:
    vocab_sha: str
    tokens: StringArray
    token_types: np.ndarray | None

    def __len__(self) -> int:
        return len(self.tokens)


def load_vocab(con: duckdb.DuckDBPyConnection, vocab_sha: str) -> Vocab:
    row = con.execute(
        "SELECT n_tokens, tokens_z, token_types FROM vocabs WHERE vocab_sha = ?", [vocab_sha]
    ).fetchone()
    if row is None:
        raise RegistryError(f"vocabulary {vocab_sha} is not in the registry: rescan its model")
    n_tokens, tokens_z, types = row
    return _decode(vocab_sha, n_tokens, bytes(tokens_z), bytes(types) if types else None)


@lru_cache(maxsize=64)
def _decode(vocab_sha: str, n_tokens: int, tokens_z: bytes, types: bytes | None) -> Vocab:
    tokens = parse_string_array(zlib.decompress(tokens_z), n_tokens)
    token_types = np.frombuffer(types, dtype="<i4") if types else None
    return Vocab(vocab_sha, tokens, token_types)
