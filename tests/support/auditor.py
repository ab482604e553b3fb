"""Helpers for the auditor's tests: read a pair's verdict the way the tests assert on it."""

from __future__ import annotations

from specreg.auditor import PairVerdict


def vocab_sizes(pv: PairVerdict) -> tuple[int, int, int]:
    """(target tokens, draft tokens, difference) of the pair's vocab_size check."""
    size = pv.check("vocab_size").values
    return size["target_n_tokens"], size["draft_n_tokens"], size["difference"]
