"""Token-list comparisons as llama.cpp makes them, on raw serialized bytes.

`common_speculative_are_compatible` compares `llama_vocab_get_text(i)` with `strcmp` for every id
from 5 up to the smaller vocabulary. Two quirks of the loader (src/llama-vocab.cpp) decide what
that text is: an empty token becomes `[EMPTY_<id>]`, and `strcmp` stops at the first NUL byte.
Raw equal regions prove equal texts; where the raw bytes differ, the texts are normalised the way
llama.cpp sees them before a difference is reported, so a difference llama.cpp cannot see is
never reported.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

import numpy as np
from gguf.constants import TokenType

from specreg.registry.gguf_header import StringArray

_CHUNK = 1 << 16

# Texts that conversion scripts and model authors use for filler ids beyond the real vocabulary.
_PADDING_TEXT = re.compile(
    rb"^(?:\[PAD\d*\]|<pad\d*>|<\|?pad(?:_token)?_?\d*\|?>|<unused\d+>|\[unused\d+\]"
    rb"|<\|?reserved_special_token_\d+\|?>|<\|?reserved_\d+\|?>|<extra_id_\d+>|<\|extra_\d+\|>"
    rb"|<\|dummy_\d+\|>|<\|?unused_?\d+\|?>|<\|?PAD_TOKEN\|?>|<\|?endoftext\d+\|?>)$",
    re.IGNORECASE,
)
_PADDING_TYPES = (int(TokenType.UNUSED),)


# hybriddna vocabularies: the loader strips this marker from the k-mers after "<oov>".
DNA_KMER_MARKER = b"\xee\x80\x80"


def dna_strip_start(tokens: StringArray) -> int | None:
    """The first id whose text the hybriddna loader strips the k-mer marker from."""
    for i in range(len(tokens)):
        if tokens.item_bytes(i) == b"<oov>":
            return i + 1
    return None


def llama_text(tokens: StringArray, i: int, strip_from: int | None = None) -> bytes:
    """Token i's text as `strcmp` in common_speculative_are_compatible sees it."""
    raw = tokens.item_bytes(i)
    if not raw:
        return b"[EMPTY_%d]" % i
    if (strip_from is not None and i >= strip_from and len(raw) > len(DNA_KMER_MARKER)
            and raw.endswith(DNA_KMER_MARKER)):  # fmt: skip
        raw = raw[: -len(DNA_KMER_MARKER)]
    nul = raw.find(b"\0")
    return raw if nul < 0 else raw[:nul]


def _first_raw_difference(a: bytes, b: bytes) -> int:
    """Index of the first differing byte of two equally long-or-not byte strings, or -1."""
    n = min(len(a), len(b))
    pos = 0
    while pos < n:
        end = min(pos + _CHUNK, n)
        if a[pos:end] != b[pos:end]:
            x = np.frombuffer(a, dtype=np.uint8, count=end - pos, offset=pos)
            y = np.frombuffer(b, dtype=np.uint8, count=end - pos, offset=pos)
            return pos + int(np.flatnonzero(x != y)[0])
        pos = end
    return -1 if len(a) == len(b) else n


def first_text_difference(
    tgt: StringArray,
    dft: StringArray,
    start: int = 5,
    strip_tgt: int | None = None,
    strip_dft: int | None = None,
    *,
    by_token: bool = False,
) -> int | None:
    """The first id in [start, min(n_tgt, n_dft)) whose llama.cpp texts differ, or None.

    `strip_*`: where the hybriddna loader starts rewriting texts (see `dna_strip_start`).
    `by_token`: token by token, as the C++ loop does (`naive_first_text_difference`), instead
    of comparing whole regions of the texts' bytes first.
    """
    stop = min(len(tgt), len(dft))
    # With different strips equal bytes no longer mean equal texts: only the token loop is exact.
    if by_token or strip_tgt != strip_dft:
        differ = (i for i in range(start, stop) if _texts_differ(tgt, dft, i, strip_tgt, strip_dft))
        return next(differ, None)
    i = start
    while i < stop:
        ra = tgt.region(i, stop)
        rb = dft.region(i, stop)
        if ra == rb:
            return None
        p = _first_raw_difference(ra, rb)
        # Both regions start with element i and agree byte for byte before p, so the elements
        # before the one holding p are identical and sit at the same offsets in both.
        rel = tgt.offsets[i : stop + 1] - tgt.offsets[i]
        j = i + int(np.searchsorted(rel, p, side="right")) - 1
        j = min(max(j, i), stop - 1)
        if _texts_differ(tgt, dft, j, strip_tgt, strip_dft):
            return j
        i = j + 1
    return None


def _texts_differ(
    tgt: StringArray, dft: StringArray, i: int, strip_tgt: int | None, strip_dft: int | None
) -> bool:
    return llama_text(tgt, i, strip_tgt) != llama_text(dft, i, strip_dft)


# Token by token, as the C++ loop does; the benchmark's and the tests' reference.
naive_first_text_difference = functools.partial(first_text_difference, by_token=True)


def is_padding(text: bytes, token_type: int | None) -> bool:
    if token_type is not None and token_type in _PADDING_TYPES:
        return True
    return bool(_PADDING_TEXT.match(text))


@dataclass(frozen=True)
class ExtraTokens:
    """The ids one vocabulary has beyond the other's size."""

    side: str  # "target" | "draft" | "none"
    first_id: int
    stop_id: int
    n_padding: int
    real_examples: tuple[tuple[int, str], ...]
    """Up to five non-padding extra ids with their texts."""

    @property
    def count(self) -> int:
        return self.stop_id - self.first_id

    @property
    def only_padding(self) -> bool:
        return self.n_padding == self.count


def extra_tokens(
    tokens: StringArray, token_types: np.ndarray | None, first_id: int, side: str
) -> ExtraTokens:
    """Classify ids [first_id, len(tokens)) as padding or real tokens."""
    stop = len(tokens)
    n_padding = 0
    examples: list[tuple[int, str]] = []
    for i in range(first_id, stop):
        t = int(token_types[i]) if token_types is not None and i < len(token_types) else None
        raw = tokens.item_bytes(i)
        if is_padding(raw, t):
            n_padding += 1
        elif len(examples) < 5:
            examples.append((i, raw.decode("utf-8", errors="replace")))
    return ExtraTokens(side, first_id, stop, n_padding, tuple(examples))
