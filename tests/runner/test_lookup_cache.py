"""Lookup cache files read as llama.cpp reads them (common_ngram_cache_load): a good file's
facts, and one line for every fault on which llama-server would abort, before it starts.
Files are written here in llama.cpp's format (common_ngram_cache_save)."""

from __future__ import annotations

from pathlib import Path

import pytest

from specreg.runner.lookup_cache import LookupCacheError, read_cache_file

from support.lookup_cache import write_cache

GOOD = [([1, 2], [(3, 2), (7, 1)]), ([2, 3], [(4, 1)]), ([3, 4], [(5, 1)])]


def test_a_static_cache_tells_its_n_grams_and_the_tokens_it_was_built_from(tmp_path: Path) -> None:
    facts = read_cache_file(write_cache(tmp_path / "c.lcs", GOOD), n_vocab=100)
    assert facts.n_ngrams == 3
    assert facts.n_counted == 5
    assert facts.n_tokens == 7  # every token after the first two was counted once
    assert facts.max_token == 7 and facts.static
    assert facts.n_bytes == (3 * 5 + 4 * 2) * 4


def test_a_dynamic_cache_with_longer_keys_is_readable_but_not_static(tmp_path: Path) -> None:
    facts = read_cache_file(write_cache(tmp_path / "d.lcs", [([1, 2, 3], [(4, 1)])]))
    assert not facts.static and facts.n_tokens is None


@pytest.mark.parametrize(
    ("cut", "message"),
    [
        (
            4,
            "is truncated at byte 64 (its last record lists 1 tokens, the file ends 4 bytes "
            "early); llama-server would abort on it",
        ),
        (
            12,
            "is truncated at byte 64 (an n-gram record needs 20 bytes, 16 are left); "
            "llama-server would abort on it",
        ),
        (
            2,
            "is truncated (90 bytes is not a whole number of 4-byte ids); llama-server would "
            "abort on it",
        ),
    ],
)
def test_a_truncated_file_gets_one_line(tmp_path: Path, cut: int, message: str) -> None:
    path = write_cache(tmp_path / "t.lcs", GOOD)
    path.write_bytes(path.read_bytes()[:-cut])
    with pytest.raises(LookupCacheError) as err:
        read_cache_file(path)
    line = str(err.value)
    assert line == (
        f"lookup cache {path} {message}: rebuild it (`specreg lookup-cache build`) or remove t.lcs"
    )


def test_corrupt_records_and_empty_or_missing_files(tmp_path: Path) -> None:
    zero = write_cache(tmp_path / "z.lcs", [([1, 2], [(3, 0)])])
    with pytest.raises(LookupCacheError, match=r"is corrupt at byte 0 \(a token id below 0"):
        read_cache_file(zero)
    bad_key = write_cache(tmp_path / "k.lcs", [([-7, 2], [(3, 1)])])
    with pytest.raises(LookupCacheError, match=r"is corrupt at byte 0 \(not an n-gram record"):
        read_cache_file(bad_key)
    empty = tmp_path / "e.lcs"
    empty.write_bytes(b"")
    with pytest.raises(LookupCacheError, match="is empty: it holds no n-grams to draft from"):
        read_cache_file(empty)
    with pytest.raises(LookupCacheError, match=r"cannot be read \(No such file or directory\)"):
        read_cache_file(tmp_path / "missing.lcs")


def test_ids_beyond_the_vocabulary_are_another_tokenizers_cache(tmp_path: Path) -> None:
    path = write_cache(tmp_path / "v.lcs", [([1, 2], [(60000, 2)])])
    with pytest.raises(LookupCacheError) as err:
        read_cache_file(path, n_vocab=49152)
    assert "holds token id 60000, beyond the 49152 tokens of the model's vocabulary" in str(
        err.value
    )
