"""Stacks and workload lookup caches as recommend candidates of their own.

Two kinds of configuration go beyond one llama.cpp type per method:

- n-gram lookup stacked in front of a draft model (`ngram-mod,draft-simple`): llama.cpp asks
  ngram-mod first every step and the draft model when it has nothing (terms.SPEC_PRIORITY);
- ngram-cache reading a workload lookup cache (`--lookup-cache-static`) built by `specreg
  lookup-cache build` for the task in the target's tokenizer family (a cache is never offered to
  another family). It drafts with llama.cpp's prompt-lookup algorithm (`common_ngram_cache_draft`,
  what the prior's lookup rows ran, with and without fewer experts) and at most 8 tokens
  (llamacpp.NGRAM_CACHE_DRAFT_MAX).

The speed model scores each as its method (a draft model; n-gram lookup) at its K, so without
runs of its own a stack predicts what its method alone does, and a cache what the prior's lookup
rows say. Each is a K curve of its own in recommend's local correction (`ConfigFacts.stack` and
`.lookup_cache`), moved only by this host's runs of exactly that stack or cache: what it is worth
is learned from local runs. It is shown where it is predicted to beat the same configuration
without it (a draft stack: its draft at the same K and experts; a cache: every n-gram option at
the same experts), or when the user asks for that stack (`--spec-type`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from specreg.llamacpp import NGRAM_CACHE_DRAFT_MAX
from specreg.recommender.features import ConfigFacts
from specreg.registry.lookup_caches import LookupCache
from specreg.stacks import NGRAM_CACHE, Stack
from specreg.terms import DEFAULT_TYPE_OF, Method

# What recommend stacks in front of a draft model: the n-gram type it proposes anyway.
DRAFT_STACK = f"{DEFAULT_TYPE_OF[Method.NGRAM]},{DEFAULT_TYPE_OF[Method.DRAFT]}"

D = TypeVar("D")


def tag(stack: Stack) -> str:
    """`ConfigFacts.stack` of a stack: empty for its method's default single type."""
    return "" if stack.spelled == DEFAULT_TYPE_OF[stack.method] else stack.spelled


def stack_candidates(
    cands: Sequence[tuple[ConfigFacts, D]],
    caches: Sequence[LookupCache],
    base: ConfigFacts,
    calibrated: Callable[[int], dict[str, Any]],
    *,
    ngram_n: int,
    ngram_ks: Sequence[int],
    requested: Stack | None = None,
) -> list[tuple[ConfigFacts, D | None]]:
    """Candidates beyond `cands` (one default type per method): lookup stacked in front of every
    draft candidate and ngram-cache with each usable cache; or, when the user asks for a stack,
    that stack's candidates (its drafts and K, or n-gram K; every usable cache for ngram-cache).
    `calibrated(k)` gives this host's verify-cost fields for K."""
    if requested is None:
        out: list[tuple[ConfigFacts, D | None]] = [
            (c.with_(stack=DRAFT_STACK), d) for c, d in cands if c.method is Method.DRAFT
        ]
        out += [(_cached(base, cache.name, ngram_n, calibrated), None) for cache in caches]
        return out
    wanted = tag(requested)
    if not wanted or requested.method is Method.NONE:
        return []  # the method's default type: already a candidate
    if requested.method is not Method.NGRAM:
        return [(c.with_(stack=wanted), d) for c, d in cands if c.method is requested.method]
    if requested.primary == NGRAM_CACHE:
        names = [c.name for c in caches] if requested.uses_lookup_cache else []
        return [(_cached(base, n, ngram_n, calibrated, wanted), None) for n in names or [""]]
    return [
        (base.with_(method=Method.NGRAM, k=k, ngram_n=ngram_n, stack=wanted, **calibrated(k)), None)
        for k in ngram_ks
    ]


def _cached(
    base: ConfigFacts,
    cache: str,
    ngram_n: int,
    calibrated: Callable[[int], dict[str, Any]],
    stack: str = NGRAM_CACHE,
) -> ConfigFacts:
    k = NGRAM_CACHE_DRAFT_MAX
    return base.with_(
        method=Method.NGRAM, k=k, ngram_n=ngram_n, stack=stack, lookup_cache=cache, **calibrated(k)
    )


def counterpart(c: ConfigFacts, draft_id: str | None) -> tuple[object, ...]:
    """What an option is compared with to be shown: a draft stack with its draft at the same K
    and experts; an n-gram stack or cache with every n-gram option at the same experts."""
    if c.method is Method.DRAFT:
        return (c.method, draft_id, c.k, c.experts, round(c.temperature, 3))
    return (c.method, None, None, c.experts, round(c.temperature, 3))


def shown(
    rows: Sequence[tuple[ConfigFacts, str | None, float, bool]], requested: Stack | None = None
) -> list[bool]:
    """For each option (its facts, draft id, predicted t/s, whether this host has runs on its
    K curve): whether recommend lists it. An option of one default type always; a stack or
    cache when the user asked for that stack, or when runs of it here put its prediction above
    its counterparts without it (without runs it can only tie them, or differ by noise)."""
    best: dict[tuple[object, ...], float] = {}
    for c, draft_id, tps, _ in rows:
        if not c.stack:
            key = counterpart(c, draft_id)
            best[key] = max(best.get(key, 0.0), tps)
    want = tag(requested) if requested is not None else None
    out = []
    for c, draft_id, tps, measured in rows:
        if not c.stack:
            out.append(True)
        elif want is not None:
            out.append(c.stack == want)
        else:
            out.append(measured and tps > best.get(counterpart(c, draft_id), 0.0))
    return out
