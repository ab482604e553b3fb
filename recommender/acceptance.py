"""Measured draft agreement in place of the prior's acceptance guess.

`specreg agree` records, per draft and task, how often the draft's top token equals the
target's on the target's own text: the per-token acceptance of greedy draft-simple (at a
temperature, the target's probability of the draft's top token). For a pair with no runs on
this host, the recommender uses that number instead of the acceptance its prior predicts
from sizes and families, which is the largest guess in every prediction it makes.

The build's drafting rules turn per-token acceptance into accepted tokens per verification
(pinned llama.cpp 11434, common/speculative.cpp, draft-simple): the draft proposes its top
token up to K times, stopping early at a token it is less sure of than `p_min` (default 0);
a draft shorter than `n_min` (default 0) is dropped; the target accepts the longest prefix it
agrees with. With per-position independence, drafting past position i needs i confident
tokens (share s each) and accepting it needs i confident agreeing ones (s * a_c each).

Agreement is not independent from one token to the next: a draft that has the target's
boilerplate right gets the next token right too, and one that has lost the thread stays lost.
Where `agree` kept the draft's guess at every answer token (its traces), drafting is replayed
on them instead: at temperature 0 the tokens each verification accepts are a function of
those guesses alone, at any K, `p_min` and `n_min`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import duckdb
import numpy as np

from specreg.drafttrace import DraftTrace
from specreg.recommender.costmodel import (
    CostParams,
    Replayed,
    acceptance,
    logit,
    predict_tps,
)
from specreg.recommender.lookup_replay import (
    NO_STACK,
    NO_STEPS,
    LookupSteps,
    StackSteps,
    ngram_mod_replay,
    stack_replay,
)
from specreg.registry.quality_store import PURPOSE_AGREEMENT, QualityRecord, latest_measurements

# The pinned build's draft-simple defaults (common/common.h, common_params_speculative_draft).
P_MIN_DEFAULT = 0.0
N_MIN_DEFAULT = 0


@dataclass(frozen=True)
class DraftRules:
    """How a per-token acceptance becomes accepted tokens: draft-simple's `p_min` and `n_min`,
    the draft's confidence profile (min p -> (share of positions, agreement there)) and its
    greedy guesses to replay (`traces`), where measured."""

    p_min: float = P_MIN_DEFAULT
    n_min: int = N_MIN_DEFAULT
    confidence: dict[float, tuple[float, float]] | None = None
    traces: Sequence[DraftTrace] = ()


NO_RULES = DraftRules()  # the build's defaults, nothing measured: the geometric prefix

# Where a candidate's per-token acceptance comes from, best first.
ACC_RUN = "run measured"  # this host's speculative runs of the pair
ACC_AGREEMENT = "agreement measured"  # `specreg agree`, no speculative run
ACC_REPLAYED = "replayed on the target's text"  # ngram-mod on `agree`'s text (lookup_replay)
ACC_PREDICTED = "predicted"  # the prior, from sizes, families and task
ACCEPTANCE_SOURCES = (ACC_RUN, ACC_AGREEMENT, ACC_REPLAYED, ACC_PREDICTED)


@dataclass(frozen=True)
class MeasuredAgreement:
    """One draft's measured agreement with the target, for one task and temperature."""

    draft_id: str
    task: str  # the task asked about
    tasks: tuple[str, ...]  # the tasks whose measurements it is made of
    acceptance: float  # per token, at `temperature` (same top when greedy)
    same_top: float
    temperature: float
    greedy_only: bool  # a temperature above 0 was asked, but only greedy agreement exists
    n_tokens: int
    confidence: dict[float, tuple[float, float]] | None
    measurement_ids: tuple[int, ...]
    traces: tuple[DraftTrace, ...] = ()  # greedy only: the draft's guess at every answer token
    # the task's own target text as token ids, (prompt, answer) per prompt, where kept
    texts: tuple[tuple[tuple[int, ...], tuple[int, ...]], ...] = ()

    @property
    def rules(self) -> DraftRules:
        """The build's default rules with this measurement's confidence and traces."""
        return DraftRules(confidence=self.confidence, traces=self.traces)

    @property
    def summary(self) -> str:
        where = (
            self.task
            if self.tasks == (self.task,)
            else f"{'/'.join(self.tasks)} (no {self.task} measurement)"
        )
        kind = (
            f"the target's probability of the draft's top token at temperature "
            f"{self.temperature:g}"
            if self.temperature > 0 and not self.greedy_only
            else "same top token" + (" (greedy: no agreement at this temperature)"
                                     if self.greedy_only else "")
        )  # fmt: skip
        return (
            f"{self.acceptance:.0%} per token measured by `specreg agree` ({kind}, on the "
            f"target's own {where} text, {self.n_tokens} tokens)"
        )


def _merge(
    rows: Sequence[QualityRecord], task: str, temperature: float, greedy: bool
) -> MeasuredAgreement:
    weights = np.array([max(r.n_tokens or 0, 1) for r in rows], dtype=float)

    def mean(values: Sequence[float | None]) -> float:
        v = np.array([math.nan if x is None else x for x in values], dtype=float)
        ok = np.isfinite(v)
        return float(np.average(v[ok], weights=weights[ok])) if ok.any() else math.nan

    use_accept = temperature > 0 and not greedy
    conf = rows[0].confidence if len(rows) == 1 else None
    # Traces replay greedy drafting; a temperature above 0 accepts by the target's
    # probabilities, which they do not hold.
    traces = () if use_accept else tuple(t for r in rows for t in record_traces(r))
    own = all(r.task == task for r in rows)  # another task's text says nothing of this one
    texts = tuple(x for r in rows for x in record_texts(r)) if own else ()
    return MeasuredAgreement(
        draft_id=str(rows[0].model_id),
        task=task,
        tasks=tuple(sorted({r.task or "?" for r in rows})),
        acceptance=mean([r.accept if use_accept else r.same_top for r in rows]),
        same_top=mean([r.same_top for r in rows]),
        temperature=temperature,
        greedy_only=greedy and temperature > 0,
        n_tokens=int(sum(r.n_tokens or 0 for r in rows)),
        confidence=conf,
        measurement_ids=tuple(int(r.measurement_id or 0) for r in rows),
        traces=traces,
        texts=texts,
    )


def record_texts(r: QualityRecord) -> tuple[tuple[tuple[int, ...], tuple[int, ...]], ...]:
    """The target's text as token ids, (prompt, answer) per prompt, that an agreement
    measurement on llama-server kept (none before it kept them)."""
    config = r.config or {}
    try:
        return tuple(
            (tuple(int(t) for t in p), tuple(int(t) for t in a))
            for p, a in zip(config.get("prompt_ids") or (), config.get("answer_ids") or (),
                            strict=True)
        )  # fmt: skip
    except (TypeError, ValueError):
        return ()


def measured_texts(
    agreements: dict[str, MeasuredAgreement],
) -> tuple[tuple[tuple[int, ...], tuple[int, ...]], ...]:
    """The target's own text for the task, from any draft's agreement that kept it."""
    return next((m.texts for m in agreements.values() if m.texts), ())


def record_traces(r: QualityRecord) -> tuple[DraftTrace, ...]:
    """The draft traces an agreement measurement kept (none before they were kept)."""
    try:
        return tuple(DraftTrace.from_json(t) for t in (r.config or {}).get("traces") or ())
    except (KeyError, TypeError, ValueError):
        return ()


def load_agreement(
    con: duckdb.DuckDBPyConnection, target_id: str, task: str, temperature: float = 0.0
) -> dict[str, MeasuredAgreement]:
    """Measured agreement per draft id: the task's own measurement if there is one, else the
    mean over the tasks measured; at `temperature` if measured there, else the greedy one."""
    rows = latest_measurements(con, PURPOSE_AGREEMENT, target_id)
    by_draft: dict[str, list[QualityRecord]] = {}
    for r in rows:
        if r.model_id and r.same_top is not None:
            by_draft.setdefault(r.model_id, []).append(r)
    out = {}
    for draft_id, found in by_draft.items():
        at_temp = [r for r in found if math.isclose(r.temperature or 0.0, temperature)]
        greedy = not at_temp
        pool = at_temp or [r for r in found if not r.temperature]
        if not pool:
            continue
        chosen = [r for r in pool if r.task == task] or pool
        out[draft_id] = _merge(chosen, task, temperature, greedy)
    return out


def _confident(
    p_min: float, a: float, confidence: dict[float, tuple[float, float]] | None
) -> tuple[float, float]:
    """(share of positions the draft drafts at `p_min`, acceptance among them)."""
    if p_min <= 0 or not confidence:
        return 1.0, a
    grid = sorted(p for p in confidence if p <= p_min + 1e-9)
    share, agree = confidence[grid[-1]] if grid else (1.0, a)
    if not math.isfinite(share):
        return 1.0, a
    return share, agree if math.isfinite(agree) else 0.0


def replay(
    traces: Sequence[DraftTrace],
    k: int,
    *,
    p_min: float = P_MIN_DEFAULT,
    n_min: int = N_MIN_DEFAULT,
) -> tuple[float, float]:
    """(accepted, drafted) tokens per verification of greedy draft-simple at draft length `k`,
    replayed over the draft's guesses at each token of an answer, by the build's rules
    (tools/server/server-context.cpp and common/speculative.cpp): the first token comes from
    the prompt's pass and is never drafted; a verification at token i drafts up to `k` tokens,
    no further than the answer's last token but one (`n_remaining - 1`), stopping before a
    guess the draft is less sure of than `p_min`; a draft shorter than `n_min` is dropped; the
    leading guesses that agree are accepted, and the next verification starts after the
    target's own token. (nan, nan) for no verification."""
    accepted = drafted = steps = 0
    for t in traces:
        n, j = t.answer_len, 1
        while j < n:
            length, ok = t.draft_at(j, k, n - 1 - j, p_min, n_min)
            accepted, drafted, steps = accepted + ok, drafted + length, steps + 1
            j += ok + 1
    if not steps:
        return math.nan, math.nan
    return accepted / steps, drafted / steps


def accepted_per_step(a: float, k: int, rules: DraftRules = NO_RULES) -> tuple[float, float]:
    """(expected accepted, expected drafted) tokens per verification at draft length `k` for
    per-token acceptance `a`, under draft-simple's `p_min` and `n_min`: replayed on `traces`
    where there are any, else with per-position independence."""
    p_min, n_min = rules.p_min, rules.n_min
    if rules.traces:
        got = replay(rules.traces, k, p_min=p_min, n_min=n_min)
        if math.isfinite(got[0]):
            return got
    s, a_c = _confident(p_min, a, rules.confidence)
    accepted = drafted = 0.0
    for i in range(1, k + 1):
        if n_min > k:
            break  # every draft is shorter than n_min: nothing is ever drafted
        drafted += s ** max(i, n_min)
        accepted += (s * a_c) ** i * s ** max(0, n_min - i)
    return accepted, drafted


def effective_acceptance(a: float, k: int, rules: DraftRules = NO_RULES) -> float:
    """The per-token acceptance whose K-token geometric prefix (the cost model's formula)
    accepts as many tokens per verification as the build's rules do (replayed on `traces`
    where there are any); `a` itself with neither traces nor rules."""
    target, _ = accepted_per_step(a, k, rules)
    if rules.p_min <= 0 and rules.n_min <= 0 and not rules.traces:
        return a
    if target <= 0 or target >= k:
        return 0.0 if target <= 0 else 1.0
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if sum(mid**i for i in range(1, k + 1)) < target:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def drafted_acceptance_at(a: float, k: int, rules: DraftRules = NO_RULES) -> float:
    """What llama.cpp reports as acceptance (accepted / drafted) for per-token acceptance `a`."""
    accepted, drafted = accepted_per_step(a, k, rules)
    return accepted / drafted if drafted > 0 else math.nan


def speed_ratio(X: np.ndarray, params: CostParams, a: np.ndarray) -> np.ndarray:
    """How much the cost model's speed for rows `X` changes when their per-token acceptance
    is `a` instead of the one it predicts (the logit shift that lands exactly on `a`)."""
    shift = logit(a, eps=1e-4) - logit(acceptance(X, params), eps=1e-4)
    before = predict_tps(X, params)[0]
    after = predict_tps(X, params, shift)[0]
    return after / np.maximum(before, 1e-12)


@dataclass(frozen=True)
class Adjusted:
    """Predictions after measured agreement replaced the prior's acceptance guess."""

    mid: np.ndarray
    acceptance: np.ndarray  # per token, as shown
    sources: tuple[str, ...]  # ACC_* per candidate
    used: tuple[MeasuredAgreement | None, ...]
    lookups: tuple[LookupSteps | None, ...] = ()  # ngram-mod replayed on the target's text


def apply_agreement(
    candidates: Sequence[tuple[str | None, int, bool]],
    X: np.ndarray,
    params: CostParams,
    mid: np.ndarray,
    acc: np.ndarray,
    agreements: dict[str, MeasuredAgreement],
) -> Adjusted:
    """Candidates are (draft id or None, K, whether this host has runs of its K curve).

    A draft candidate without runs whose pair has measured agreement gets that acceptance
    (through the build's drafting rules at its K) and its speed moves by what the cost model
    says that acceptance is worth; candidates with runs keep theirs (the runs re-shape them).
    """
    mid, acc = mid.copy(), acc.copy()
    sources: list[str] = []
    used: list[MeasuredAgreement | None] = []
    rows, a_eff = [], []
    for i, (draft_id, k, has_runs) in enumerate(candidates):
        m = agreements.get(draft_id) if draft_id is not None else None
        if draft_id is None:
            sources.append(ACC_RUN if has_runs else ACC_PREDICTED)
            used.append(None)
        elif has_runs:
            sources.append(ACC_RUN)
            used.append(None)
        elif m is None or not math.isfinite(m.acceptance):
            sources.append(ACC_PREDICTED)
            used.append(None)
        else:
            sources.append(ACC_AGREEMENT)
            used.append(m)
            rows.append(i)
            a_eff.append(effective_acceptance(m.acceptance, k, m.rules))
            # replayed: the per-token acceptance whose geometric prefix accepts what the
            # replay does at this K (how the runs' accepted/drafted read per token)
            acc[i] = a_eff[-1] if m.traces else m.acceptance
    if rows:
        idx = np.array(rows)
        mid[idx] *= speed_ratio(X[idx], params, np.array(a_eff))
    return Adjusted(mid, acc, tuple(sources), tuple(used))


def apply_lookup(
    ngram_mod: Sequence[tuple[int, int] | None],
    X: np.ndarray,
    params: CostParams,
    adjusted: Adjusted,
    texts: Sequence[tuple[Sequence[int], Sequence[int]]],
) -> Adjusted:
    """ngram-mod candidates ((n_max, n_min) where a candidate is one, else None; candidate 0
    is plain decoding) replayed on the target's own text (`load_texts`): how often they draft
    and how much of it is accepted on first encounter replace the prior's guesses, and each
    speed is plain decoding's times the speed-up the cost model gives that. Candidates with
    runs on this host keep theirs."""
    if not texts:
        return adjusted
    mid, acc = adjusted.mid.copy(), adjusted.acceptance.copy()
    sources = list(adjusted.sources)
    lookups: list[LookupSteps | None] = list(adjusted.lookups or [None] * len(ngram_mod))
    q = np.full(len(X), np.nan)
    e = np.full(len(X), np.nan)
    for i, knobs in enumerate(ngram_mod):
        if knobs is None or sources[i] == ACC_RUN:
            continue
        n_max, n_min = knobs
        steps = sum((ngram_mod_replay(p, a, n_max=n_max, n_min=n_min) for p, a in texts), NO_STEPS)
        if not steps.steps:
            continue
        lookups[i], q[i], e[i] = steps, steps.draft_rate, steps.tokens_per_drafting_step
        sources[i] = ACC_REPLAYED
        if steps.drafted:
            acc[i] = steps.accepted / steps.drafted
    rows = np.nonzero(np.isfinite(q))[0]
    if len(rows):
        # plain decoding's prediction (row 0: this host's calibration or runs) times the
        # speed-up the cost model gives the replayed drafting
        plain = predict_tps(X[:1], params)[0]
        after = predict_tps(X[rows], params, replayed=Replayed(lookup=(q[rows], e[rows])))[0]
        mid[rows] = mid[0] * after / np.maximum(plain, 1e-12)
    return replace(
        adjusted, mid=mid, acceptance=acc, sources=tuple(sources), lookups=tuple(lookups)
    )


def apply_stack(
    stacks: Sequence[tuple[str, int, int, int] | None],
    X: np.ndarray,
    params: CostParams,
    adjusted: Adjusted,
    agreements: dict[str, MeasuredAgreement],
) -> tuple[Adjusted, tuple[StackSteps | None, ...]]:
    """ngram-mod stacked in front of a draft model ((draft id, K, n-gram n_max, n_min) where a
    candidate is such a stack, else None), replayed on the target's text and that draft's
    guesses, both kept by its agreement (`lookup_replay.stack_replay`): where the lookup
    drafts, the draft model drafts nothing. Each speed moves by what the cost model says the
    replayed steps are worth against the draft alone at the same acceptance. Candidates with
    runs keep theirs."""
    out: list[StackSteps | None] = [None] * len(stacks)
    mid = adjusted.mid.copy()
    f = np.full(len(X), np.nan)
    e = np.full(len(X), np.nan)
    for i, knobs in enumerate(stacks):
        m = agreements.get(knobs[0]) if knobs is not None else None
        if knobs is None or m is None or adjusted.sources[i] == ACC_RUN:
            continue
        texts = m.texts
        if not texts or [t.answer_len for t in m.traces] != [len(a) for _, a in texts]:
            continue  # no text kept, or traces of another one
        _, k, n_max, n_min = knobs
        steps = sum(
            (
                stack_replay(p, a, t, n_max=n_max, n_min=n_min, k=k)
                for (p, a), t in zip(texts, m.traces, strict=True)
            ),
            NO_STACK,
        )
        if steps.lookup.steps:
            out[i], f[i], e[i] = steps, steps.lookup_share, steps.tokens_per_step
    rows = np.nonzero(np.isfinite(f))[0]
    if len(rows):
        a = adjusted.acceptance[rows]
        shift = logit(a, eps=1e-4) - logit(acceptance(X[rows], params), eps=1e-4)
        before = predict_tps(X[rows], params, shift)[0]
        after = predict_tps(X[rows], params, shift, Replayed(stack=(f[rows], e[rows])))[0]
        mid[rows] *= after / np.maximum(before, 1e-12)
    return replace(adjusted, mid=mid), tuple(out)


def stack_line(steps: StackSteps, tasks: str) -> str:
    """What the replay of a stack found, for its why."""
    lookup, model = steps.lookup, steps.model
    return (
        f"stack replayed on the target's own {tasks} text and the draft's guesses: the lookup "
        f"drafts in {lookup.drafting} of {lookup.steps} steps ({lookup.accepted} of "
        f"{lookup.drafted} accepted), the draft model in {model.drafting} ({model.accepted} of "
        f"{model.drafted}) -> {steps.tokens_per_step:.1f} tokens a step"
    )


def lookup_why(why: Sequence[str], steps: LookupSteps, tasks: str) -> tuple[str, ...]:
    """The prior's n-gram line replaced by the replay's."""
    line = (
        f"n-gram lookup replayed on the target's own {tasks} text (`specreg agree`): it drafts "
        f"in {steps.drafting} of {steps.steps} steps"
        + (
            f", {steps.accepted} of {steps.drafted} drafted tokens accepted -> "
            f"{steps.tokens_per_drafting_step:.1f} tokens per drafting verification"
            if steps.drafting
            else " (nothing in that text repeats 24 tokens of its context): as plain decoding"
        )
    )
    return tuple(line if w.startswith("n-gram lookup") else w for w in why)


def agreement_why(why: Sequence[str], m: MeasuredAgreement, k: int) -> tuple[str, ...]:
    """The prior's acceptance line replaced by the measured one."""
    accepted, _ = accepted_per_step(m.acceptance, k, m.rules)
    how = " (replayed on the draft's guesses)" if m.traces else ""
    line = f"acceptance {m.summary} -> {1 + accepted:.1f} tokens per verification at K={k}{how}"
    return tuple(line if w.startswith("acceptance ~") else w for w in why)
