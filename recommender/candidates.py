"""What `recommend` scores: the question asked, what it stands on (the target, this host's runs
of it, its compatible drafts, the calibration, the usable lookup caches), and every
configuration worth predicting, plain decoding first."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass

import duckdb
import numpy as np

from specreg.errors import UsageError
from specreg.host.facts import HostFacts
from specreg.recommender.calibrated import Calibration, load_calibration
from specreg.recommender.evidence import Identity, identity_keys
from specreg.recommender.features import ConfigFacts
from specreg.recommender.local import NGRAM_MATCH_DEFAULT, draft_fields, target_fields
from specreg.recommender.prior import Observation
from specreg.recommender.stacks import stack_candidates
from specreg.registry.lookup_caches import LookupCache, list_caches
from specreg.registry.noise import FALLBACK_NOISE, NoiseFigure, noise_figure
from specreg.registry.queries import ModelRecord, get_model, resolve_model
from specreg.stacks import Stack, parse_stack
from specreg.terms import (
    DEFAULT_TYPE_OF,
    POLICIES,
    POLICY_SPEED,
    TASK_CHOICES,
    TASKS,
    Method,
    canonical_task,
)

K_GRID = (2, 3, 4, 6, 8, 12, 16, 24, 32)
NGRAM_K_GRID = (8, 16, 32)
MTP_K_GRID = (1, 2, 3)
MAX_DRAFTS = 6
MAX_DRAFT_SHARE = 1.0  # of the target's file size

Candidate = tuple[ConfigFacts, ModelRecord | None]  # a configuration and its draft model


@dataclass(frozen=True)
class Ask:
    """What the user asks for: the task, the policy, their sampling temperature, the KLD budget
    of behaviour-changing options, and the speculative type or stack they insist on."""

    task: str
    policy: str
    temperature: float = 0.0
    max_kld: float | None = None
    requested: Stack | None = None


def checked_ask(
    task: str, policy: str, temperature: float, max_kld: float | None, spec_type: str | None
) -> Ask:
    """The question in canonical terms, after checking the type, the policy and the task are
    ones specreg knows."""
    requested = parse_stack(spec_type) if spec_type else None
    if policy not in POLICIES:
        raise UsageError(f"unknown policy {policy!r}: use {' or '.join(POLICIES)}")
    task = canonical_task(task)
    if task not in TASKS:
        raise UsageError(f"unknown task {task!r}: use one of {', '.join(TASK_CHOICES)}")
    return Ask(task, policy, temperature, max_kld, requested)


@dataclass(frozen=True)
class Grounds:
    """What one recommendation stands on."""

    target: ModelRecord
    local: tuple[Observation, ...]  # this host's runs of the target
    drafts: tuple[tuple[ModelRecord, str], ...]  # compatible drafts and tokenizer relation
    cal: Calibration  # this host's llama-bench curves: verify cost per K, step ratios
    base: ConfigFacts  # plain decoding of the target on this host
    caches: tuple[LookupCache, ...]  # the workload caches ngram-cache may read
    host: HostFacts
    heads: tuple[tuple[ModelRecord, str], ...] = ()  # compatible draft heads, their spec type
    noise: NoiseFigure = FALLBACK_NOISE  # the noise of one measurement on this host

    def cache(self, name: str) -> LookupCache | None:
        """The usable cache called `name` (None for "", a candidate without one)."""
        return next((c for c in self.caches if name and c.name == name), None)

    def identity(self, draft: ModelRecord | None) -> Identity:
        """Who a candidate with `draft` is, as evidence tells runs of it from others."""
        t = self.target
        d = (
            identity_keys(draft.model_id, draft.display_name, draft.path)
            if draft is not None
            else frozenset()
        )
        return Identity(
            identity_keys(t.model_id, t.display_name, t.path), d, self.host,
            (t.quant or "").upper(), ((draft.quant or "") if draft is not None else "").upper(),
            by_facts=self.cal.target is None,
        )  # fmt: skip


def grounds(
    con: duckdb.DuckDBPyConnection,
    target_ref: str,
    host: HostFacts,
    ask: Ask,
    observations: Sequence[Observation],
) -> Grounds:
    """The target `target_ref` and what the registry holds for it on `host`."""
    target = load_target(con, target_ref)
    local = tuple(
        o
        for o in observations
        if o.source == "local" and o.group == target.model_id and o.host == host.fingerprint
    )
    drafts, heads = drafts_and_heads(con, target)
    cal = load_calibration(
        con, host.fingerprint, target.model_id, [d.model_id for d, _ in drafts],
        threads=host.physical_cores,
    )  # fmt: skip
    return Grounds(
        target=target,
        local=local,
        drafts=tuple(drafts),
        cal=cal,
        base=base_config(target, host, ask, local, cal),
        caches=tuple(usable_caches(con, target, ask.task)),
        heads=tuple(heads),
        host=host,
        noise=noise_figure(con, host.fingerprint),
    )


def load_target(con: duckdb.DuckDBPyConnection, target_ref: str) -> ModelRecord:
    """The target model; refused when the auditor refuses it as a target whatever the draft
    (a draft head, a vision projector) or the registry lacks what the speed model reads."""
    from specreg.auditor import target_refusal

    target = resolve_model(con, target_ref)
    if (refusal := target_refusal(target)) is not None:
        raise UsageError(
            f"{target.display_name} is not a target: {refusal.message} ({refusal.name}); "
            "recommend for the model it drafts for"
        )
    if not target.n_params or not target.n_bytes:
        raise UsageError(
            f"{target.display_name} has no parameter count or size in the registry: rescan it"
        )
    return target


def usable_drafts(
    con: duckdb.DuckDBPyConnection, target: ModelRecord
) -> list[tuple[ModelRecord, str]]:
    """Compatible drafts (best first) with their tokenizer relation, via the auditor."""
    return drafts_and_heads(con, target)[0]


def drafts_and_heads(
    con: duckdb.DuckDBPyConnection, target: ModelRecord
) -> tuple[list[tuple[ModelRecord, str]], list[tuple[ModelRecord, str]]]:
    """Compatible plain drafts (best first) with their tokenizer relation, and the compatible
    draft heads (EAGLE-3, DFlash) with their --spec-type, via the auditor. A head is not scored:
    the speed model has no runs of one (`head_advice` says so)."""
    from specreg.auditor import compatible_drafts

    out, heads = [], []
    for pv in compatible_drafts(con, target):
        if pv.spec_type != DEFAULT_TYPE_OF[Method.DRAFT]:
            head = get_model(con, pv.draft.model_id)
            if head is not None and head.draft_kind and pv.spec_type:
                heads.append((head, pv.spec_type))
            continue
        d = get_model(con, pv.draft.model_id)
        if d is None or d.draft_kind or (d.n_bytes or 0) > MAX_DRAFT_SHARE * (target.n_bytes or 0):
            continue  # a draft bigger than the target cannot pay for itself
        relation = "identical" if d.tok_fingerprint == target.tok_fingerprint else "padding-only"
        if any(c.name == "pre_tokenizer" and not c.passed for c in pv.checks):
            relation = "pre-tokenizer-differs"
        out.append((d, relation))
    return out[:MAX_DRAFTS], heads


def head_advice(g: Grounds, requested: Stack | None, task: str) -> list[str]:
    """What recommend says of draft heads, which it does not score: each compatible head, the
    type it runs as and how to measure it; for a requested head type (`--spec-type
    draft-eagle3`), why nothing of that type is listed (a plain draft never runs as one)."""
    from specreg.auditor import head_kind

    target = g.target.display_name
    wanted = head_kind(requested.model_drafter) if requested is not None else None
    out = []
    for head, spec_type in g.heads:
        if wanted is not None and head.draft_kind != wanted:
            continue
        # ids, a type and a task: nothing to quote
        run = (
            f"specreg run {g.target.model_id[:10]} --draft {head.model_id[:10]} "
            f"--spec-type {spec_type} --task {task}"
        )
        prefix = f"no candidate for --spec-type {spec_type}: " if wanted else ""
        out.append(
            f"{prefix}{head.display_name} ({head.model_id[:10]}) is a draft head for {target} "
            f"(--spec-type {spec_type}), not ranked: the speed model has no runs of "
            f"{head.draft_kind} heads to predict one from; measure it: {run}"
        )
    if wanted is not None and not out:
        out.append(
            f"no candidate for --spec-type {requested.spelled if requested else ''}: it needs a "
            f"draft head ({wanted}) trained for {target}, and the registry holds none; a plain "
            "draft model runs as draft-simple"
        )
    return out


def _head_type_mismatch(c: ConfigFacts, draft: ModelRecord | None) -> bool:
    """A candidate whose stack drafts with a head type (draft-eagle3) but holds a plain draft."""
    from specreg.auditor import head_kind

    if not c.stack:
        return False
    kind = head_kind(parse_stack(c.stack).model_drafter)
    return kind is not None and (draft is None or draft.draft_kind != kind)


def base_config(
    target: ModelRecord,
    host: HostFacts,
    ask: Ask,
    local: Sequence[Observation],
    cal: Calibration,
) -> ConfigFacts:
    """Plain decoding of the target on this host: the configuration every candidate varies."""
    tf = target_fields(target)
    plain_runs = [
        o.tps for o in local if o.config.method is Method.NONE and o.config.experts_ratio >= 1
    ]
    base = ConfigFacts(
        bandwidth_gbs=host.bandwidth_gbs,
        physical_cores=host.physical_cores,
        **tf,
        method=Method.NONE,
        k=0,
        experts=tf["default_experts"],
        temperature=ask.temperature,
        task=ask.task,
        baseline_tps=float(np.median(plain_runs)) if plain_runs else math.nan,
    )
    return base.with_(**cal.target_fields())


def usable_caches(
    con: duckdb.DuckDBPyConnection, target: ModelRecord, task: str
) -> list[LookupCache]:
    """Workload caches of the target's tokenizer family for `task` whose file is as built (the
    run checks every record before llama-server reads it)."""
    if not target.tok_fingerprint:
        return []
    out = []
    for cache in list_caches(con, tok_fingerprint=target.tok_fingerprint, task=task):
        try:
            if os.stat(cache.path).st_size == cache.n_bytes:
                out.append(cache)
        except OSError:
            continue
    return out


def gather_candidates(g: Grounds, ask: Ask) -> tuple[list[Candidate], list[int]]:
    """Every configuration to score, plain decoding first, and the reduced expert counts tried.

    Drafts over K_GRID, n-gram lookup, the target's MTP heads, stacks and workload caches;
    under the speed policy also each of them with fewer MoE experts and, when the user samples,
    at temperature 0.
    """
    cands = _lossless_candidates(g, ask.requested)
    reduced: list[int] = []
    base = g.base
    if ask.policy == POLICY_SPEED and g.target.is_moe and base.default_experts > 1:
        de = base.default_experts
        reduced = sorted({max(1, de // 2), max(1, (3 * de) // 4)} - {de})
        full = list(cands)
        for e in reduced:
            cands.extend((c.with_(experts=e), d) for c, d in full)
    if ask.policy == POLICY_SPEED and ask.temperature > 0:
        # greedy sampling raises acceptance, at the price of deterministic output
        cands.extend(
            (c.with_(temperature=0.0), d) for c, d in list(cands) if c.method is not Method.NONE
        )
    return cands, reduced


def _lossless_candidates(g: Grounds, requested: Stack | None) -> list[Candidate]:
    """Plain decoding, each draft over K_GRID, n-gram lookup, MTP heads, stacks and caches."""
    base, cal = g.base, g.cal
    cands: list[Candidate] = [(base, None)]
    for draft, relation in g.drafts:
        drafted = draft_fields(draft, g.target, relation)
        for k in K_GRID:
            calibrated = {**cal.target_fields(k), **cal.draft_fields(draft.model_id, k)}
            c = base.with_(method=Method.DRAFT, k=k, **drafted, **calibrated)
            cands.append((c, draft))
    for k in NGRAM_K_GRID:
        c = base.with_(method=Method.NGRAM, k=k, ngram_n=NGRAM_MATCH_DEFAULT)
        cands.append((c.with_(**cal.target_fields(k)), None))
    if (g.target.nextn_predict_layers or 0) > 0:
        for k in MTP_K_GRID:
            cands.append((base.with_(method=Method.MTP, k=k, **cal.target_fields(k)), None))
    stacked = stack_candidates(
        list(cands), list(g.caches), base, cal.target_fields,
        ngram_n=NGRAM_MATCH_DEFAULT, ngram_ks=NGRAM_K_GRID, requested=requested,
    )  # fmt: skip
    # a head type never runs a plain draft model (llama.cpp: "draft model is not eagle3")
    return cands + [(c, d) for c, d in stacked if not _head_type_mismatch(c, d)]


def config_key(c: ConfigFacts) -> tuple[object, ...]:
    """What tells one candidate from another: runs with this key ran exactly it."""
    return (
        c.method, c.k, c.experts, round(c.draft_gb, 3), round(c.temperature, 3), c.stack,
        c.lookup_cache,
    )  # fmt: skip


def k_curve(c: ConfigFacts) -> tuple[object, ...]:
    """The options that differ only in K: one method (or stack, or cache), draft and expert
    count."""
    return (c.method, round(c.draft_gb, 3), c.experts, c.stack, c.lookup_cache)


def is_ngram_mod(c: ConfigFacts) -> bool:
    """An ngram-mod candidate of its own: not a stack, no workload cache."""
    return c.method is Method.NGRAM and not c.stack and not c.lookup_cache and c.k > 0
