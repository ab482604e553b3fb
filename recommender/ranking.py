"""From scores to the options `recommend` lists: what the policy allows, each option's band,
acceptance, why lines and evidence, and the order (what fits in memory first, fastest first;
plain decoding first when nothing beats it by MIN_GAIN)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from specreg.recommender.acceptance import agreement_why, lookup_why, stack_line
from specreg.recommender.candidates import Ask, Candidate, Grounds, config_key, k_curve
from specreg.recommender.evidence import Cited, cite, evidence_lines, run_number
from specreg.recommender.features import ConfigFacts
from specreg.recommender.predictor import SpeedPredictor
from specreg.recommender.prior import Observation
from specreg.recommender.quality_cost import QualityCost, expert_cost
from specreg.recommender.results import Arithmetic, Knob, Option
from specreg.recommender.scoring import Scores
from specreg.recommender.stacks import shown
from specreg.registry.lookup_caches import LookupCache
from specreg.registry.quality_store import QualityRecord
from specreg.registry.queries import human_bytes
from specreg.stacks import Stack, parse_stack
from specreg.terms import DEFAULT_TYPE_OF, POLICY_SPEED, Method

# Speculation must beat plain decoding by this much (point estimate) to be worth its memory.
MIN_GAIN = 1.05

Listed = tuple[Option, ConfigFacts, bool]  # an option, its facts, whether this host ran its curve


@dataclass(frozen=True)
class Reading:
    """What every option of one recommendation is read against."""

    g: Grounds
    scores: Scores
    model: SpeedPredictor
    pool: Sequence[Observation]  # every run: the evidence options cite
    temperature: float  # the user's
    mem_bytes: int  # the host's memory (0: unknown)


@dataclass(frozen=True)
class Ranking:
    options: tuple[Option, ...]  # allowed by the policy, best first; plain decoding included
    speculate: bool  # a speculative (or fewer-experts) option beats plain decoding by MIN_GAIN
    over_budget: int  # behaviour-changing options the KLD budget left out


def rank(
    r: Reading, cands: Sequence[Candidate], ask: Ask, quality_rows: Sequence[QualityRecord]
) -> Ranking:
    """The options the policy allows, best first, and whether to speculate at all."""
    listed, over_budget = _listed(r, cands, ask, quality_rows)
    options = _ranked(listed, ask.requested)
    # options that fit in memory compete first: a prediction assumes the weights stay in memory
    fitting = [o for o in options if not o.memory_short_bytes] or options
    spec = [o for o in fitting if o.method is not Method.NONE or o.experts is not None]
    speculate = bool(spec) and spec[0].tps >= MIN_GAIN * r.scores.plain_tps
    if not speculate:
        options.sort(
            key=lambda o: (
                o.memory_short_bytes > 0,
                o.method is not Method.NONE or o.experts is not None,
                -o.tps,
            )
        )
    return Ranking(tuple(options), speculate, over_budget)


def _listed(
    r: Reading, cands: Sequence[Candidate], ask: Ask, quality_rows: Sequence[QualityRecord]
) -> tuple[list[Listed], int]:
    """The options the policy allows, in candidate order, and how many behaviour-changing
    options the KLD budget left out."""
    over_budget = 0
    out: list[Listed] = []
    for i, (c, _) in enumerate(cands):
        changes_output = c.behaviour_changing or c.temperature != ask.temperature
        if ask.policy != POLICY_SPEED and changes_output:
            continue
        cost = None
        if c.experts_ratio < 1:
            cost = expert_cost(c.experts, c.default_experts, ask.task, quality_rows)
            if ask.max_kld is not None and cost.mean_kld > ask.max_kld:
                over_budget += 1
                continue
        ran = [o for o in r.g.local if k_curve(o.config) == k_curve(c)] if c.stack else []
        out.append((_option(r, cands[i], i, cost, ran), c, bool(ran)))
    return out, over_budget


def _option(
    r: Reading, cand: Candidate, i: int, cost: QualityCost | None, ran: Sequence[Observation]
) -> Option:
    """Candidate `i` as an option: its band, its acceptance and round, its arithmetic, the runs
    it cites and the why lines that say what makes its figure and how it stands to them."""
    c, d = cand
    scores, target = r.scores, r.g.target
    meas = scores.runs_by_config.get(config_key(c), [])
    m, s = float(scores.mid[i]), float(scores.sigma[i])
    tps, tlo, thi = m, m * math.exp(-scores.z * s), m * math.exp(scores.z * s)
    plain_tps = scores.plain_tps
    speculating = c.method is not Method.NONE
    a = float(scores.acceptance[i]) if speculating else None
    weights = (target.n_bytes or 0) + ((d.n_bytes or 0) if d else 0)
    short = max(0, weights - r.mem_bytes) if r.mem_bytes > 0 else 0
    cache = r.g.cache(c.lookup_cache)
    arithmetic = _arithmetic(scores, i, tps / plain_tps) if i > 0 else None
    cited = cite(c, r.pool, scores.identities[i], scores.plain_runs, ran)
    why = _why_lines(r, cand, i, a, arithmetic, cost, ran, cited)
    if short:
        why = (*why, _memory_why(weights, r.mem_bytes, draft=d is not None))
    rnd = scores.rounds
    return Option(
        method=c.method,
        k=c.k if speculating else None,
        experts=c.experts if c.experts_ratio < 1 else None,
        temperature=c.temperature,
        draft_id=d.model_id if d else None,
        draft_name=d.display_name if d else None,
        draft_path=d.path if d else None,
        expert_key=target.expert_used_key if c.experts_ratio < 1 else None,
        tps=tps,
        tps_lo=tlo,
        tps_hi=thi,
        speedup=tps / plain_tps,
        speedup_lo=tlo / plain_tps,
        speedup_hi=thi / plain_tps,
        acceptance=a,
        tokens_per_step=float(rnd.per_verification[i]) if speculating else None,
        knobs=_knobs(c, d.display_name if d else None, r.temperature),
        why=why,
        evidence=tuple(ct.evidence for ct in cited),
        measured_tps=float(np.median(meas)) if meas else None,
        n_measured=len(meas),
        acceptance_source=scores.adjusted.sources[i],
        agreement=scores.adjusted.used[i],
        quality=cost,
        stack=c.stack or None,
        lookup_cache=c.lookup_cache or None,
        lookup_cache_path=cache.path if cache is not None else None,
        weights_bytes=weights,
        memory_short_bytes=short,
        evidence_shift=float(scores.shift[i]),
        arithmetic=arithmetic,
    )


def _arithmetic(scores: Scores, i: int, speedup: float) -> Arithmetic:
    rnd = scores.rounds
    return Arithmetic(
        tokens=float(rnd.tokens[i]),
        steps=float(rnd.steps[i]),
        verify=float(rnd.verify[i]),
        draft=float(rnd.draft[i]),
        drafting=float(rnd.drafting[i]) if rnd.drafting[i] > 0 else 1.0,
        factors=scores.ledger[i],
        speedup=speedup,
    )


def _why_lines(
    r: Reading,
    cand: Candidate,
    i: int,
    a: float | None,
    arithmetic: Arithmetic | None,
    cost: QualityCost | None,
    ran: Sequence[Observation],
    cited: Sequence[Cited],
) -> tuple[str, ...]:
    """Why candidate `i` (acceptance `a`) stands where it does: the model's round, what
    measured it (agreement, replays), the arithmetic that makes its figure, and every cited
    run its figure lies outside of, with what that run differs in."""
    c, _ = cand
    scores = r.scores
    why = _why(c, r, i, a or 0.0)
    if (used := scores.adjusted.used[i]) is not None:
        why = agreement_why(why, used, c.k)
    if scores.adjusted.lookups and (steps := scores.adjusted.lookups[i]) is not None:
        why = lookup_why(why, steps, c.task)
    if scores.stacks and (stacked := scores.stacks[i]) is not None:
        why = (*why, stack_line(stacked, c.task))
    if cost is not None:
        why = (*why, f"quality cost: {cost.label}")
    if c.stack:
        why = (_stack_why(c, r.g.cache(c.lookup_cache), ran), *why)
    if arithmetic is not None:
        why = (*why, arithmetic.line)
    plain = i == 0
    figure = scores.plain_tps if plain else float(scores.mid[i]) / scores.plain_tps
    lines = evidence_lines(
        cited, figure, r.g.noise.spread, plain=plain, twin_figures=scores.twin_figures(i)
    )
    return (*why, *lines)


def _why(c: ConfigFacts, r: Reading, i: int, a: float) -> tuple[str, ...]:
    rnd = r.scores.rounds
    out = []
    if c.method is Method.NONE and c.experts_ratio >= 1:
        return (_plain_why(r),)
    if c.experts_ratio < 1:
        out.append(
            f"{c.experts} of {c.default_experts} experts: a step costs "
            f"~{float(rnd.step_share[i]):.0%} of a full one, and the output changes "
            "(behaviour-changing)"
        )
    if c.method is Method.NONE:
        return tuple(out)
    e = float(rnd.per_verification[i])
    calibrated = math.isfinite(c.verify_ratio)
    verify = float(rnd.verify_ratio[i])
    if c.method is Method.DRAFT:
        rel = "same architecture family" if c.same_arch_family else "other architecture"
        out.append(
            f"acceptance ~{a:.0%} per token ({c.task}, {rel}, draft "
            f"{c.draft_params_b / max(c.target_active_b, 1e-9):.1%} of the target's active "
            f"parameters) -> {e:.1f} tokens per verification at K={c.k}"
        )
        out.append(
            f"a draft step costs ~{float(rnd.draft_ratio[i]):.0%} of a target step; verifying "
            f"K={c.k} costs {verify:.2f}x a single step "
            f"({'calibrated on this host' if calibrated else _modelled_verify()})"
        )
    elif c.method is Method.NGRAM:
        q = float(rnd.drafting[i])
        out.append(
            f"n-gram lookup reuses text already in the context: no draft model; it finds a "
            f"match in ~{q:.0%} of the steps for {c.task}, then acceptance ~{a:.0%} -> "
            f"{e:.1f} tokens per verification of {verify:.2f}x a step"
        )
    else:
        out.append(
            f"the target's own MTP heads: acceptance ~{a:.0%} -> {e:.1f} tokens per verification"
            " (no measured runs in the prior: low confidence)"
        )
    return tuple(out)


def _modelled_verify() -> str:
    return "the reference host's measured curve, scaled to this host: run specreg calibrate"


def _plain_why(r: Reading) -> str:
    """Where plain decoding's figure comes from: runs of it on this host, this host's
    calibration (llama-bench's step times llama-server's pass factor, measured or the fallback
    constant), or its bytes at the host's bandwidth."""
    scores, base = r.scores, r.g.base
    text = (
        "plain decoding: the reference every speedup is measured against, "
        f"{scores.plain_tps:.1f} t/s"
    )
    if scores.twins[0]:
        n = len(scores.twins[0])
        return f"{text}: {n} runs of it on this host (its spread, the model's figure weighed in)"
    if math.isfinite(base.baseline_tps):
        return f"{text}: this host's runs of it"
    cal = r.g.cal
    if cal.target is not None and math.isfinite(base.target_step_s):
        pf = cal.pass_factor_figure
        return (
            f"{text}: llama-bench's step {base.target_step_s * 1e3:.1f} ms (specreg calibrate) "
            f"x {pf.label} = {base.target_step_s * pf.value * 1e3:.1f} ms a token"
        )
    return (
        f"{text}: modelled from {base.target_read_gb:.2f} GB read per token at "
        f"{base.bandwidth_gbs:.0f} GB/s (no runs or calibration of it on this host)"
    )


def _knobs(c: ConfigFacts, draft_name: str | None, user_temp: float) -> tuple[Knob, ...]:
    knobs = []
    if c.method is Method.DRAFT:
        knobs.append(Knob("draft", draft_name or "?", True))
    if c.method is Method.NGRAM:
        knobs.append(Knob("ngram", DEFAULT_TYPE_OF[Method.NGRAM], True))
    if c.method is Method.MTP:
        knobs.append(Knob("mtp", DEFAULT_TYPE_OF[Method.MTP], True))
    if c.method is not Method.NONE:
        knobs.append(Knob("K", str(c.k), True))
    if c.experts_ratio < 1:
        knobs.append(Knob("experts", f"{c.experts}/{c.default_experts}", False))
    if c.temperature != user_temp:
        knobs.append(Knob("temperature", f"{c.temperature:g} (was {user_temp:g})", False))
    return tuple(knobs)


def _memory_why(weights: int, mem_bytes: int, *, draft: bool) -> str:
    what = "the target's and the draft's weights" if draft else "the target's weights"
    return (
        f"{what} ({human_bytes(weights)}) do not fit in this host's {human_bytes(mem_bytes)} "
        f"of memory, by {human_bytes(weights - mem_bytes)}: what does not fit is read from "
        "disk again for every token, far below this prediction"
    )


def _stack_why(c: ConfigFacts, cache: LookupCache | None, ran: Sequence[Observation]) -> str:
    """What a stack or cache option is, and what its prediction rests on."""
    runs = ", ".join(o.row_id for o in sorted(ran, key=run_number))
    basis = (
        f"moved by this host's runs of it ({runs})"
        if ran
        else "no runs of it here: scored as its method alone"
    )
    if c.lookup_cache and cache is not None:
        return (
            f"ngram-cache reads the workload cache {cache.name} ({cache.tokens_str} tokens of "
            f"{cache.task}, {cache.sources_str}; tokenizer family {cache.tok_family}) and drafts "
            f"up to {c.k} tokens (hard-coded in llama-server); {basis}"
        )
    stack = parse_stack(c.stack)
    if stack.stacked:
        return (
            f"{stack.spelled}: llama.cpp asks {', then '.join(stack.types)} for a draft each "
            f"step; scored as {stack.types[-1]}, {basis}"
        )
    return f"{stack.spelled}: scored as {c.method.value} lookup, {basis}"


def _ranked(listed: Sequence[Listed], requested: Stack | None) -> list[Option]:
    """The options recommend lists (recommender/stacks.py decides for stacks and caches; only
    the requested type and plain decoding when the user asked for one), fastest first."""
    keep = shown([(c, o.draft_id, o.tps, ran) for o, c, ran in listed], requested)
    options = [o for (o, _, _), k in zip(listed, keep, strict=True) if k]
    if requested is not None:
        options = [
            o for o in options if o.spec_type == requested.spelled or o.method is Method.NONE
        ]
    # what does not fit in memory is read from disk for every token: listed after what fits
    options.sort(key=lambda o: (o.memory_short_bytes > 0, -o.tps))
    return options
