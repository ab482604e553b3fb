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
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import duckdb
import numpy as np

from specreg.recommender.costmodel import CostParams, acceptance, logit, predict_tps
from specreg.registry.quality_store import PURPOSE_AGREEMENT, QualityRecord, latest_measurements

# The pinned build's draft-simple defaults (common/common.h, common_params_speculative_draft).
P_MIN_DEFAULT = 0.0
N_MIN_DEFAULT = 0

# Where a candidate's per-token acceptance comes from, best first.
ACC_RUN = "run measured"  # this host's speculative runs of the pair
ACC_AGREEMENT = "agreement measured"  # `specreg agree`, no speculative run
ACC_PREDICTED = "predicted"  # the prior, from sizes, families and task
ACCEPTANCE_SOURCES = (ACC_RUN, ACC_AGREEMENT, ACC_PREDICTED)


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
    )


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


def accepted_per_step(
    a: float,
    k: int,
    *,
    p_min: float = P_MIN_DEFAULT,
    n_min: int = N_MIN_DEFAULT,
    confidence: dict[float, tuple[float, float]] | None = None,
) -> tuple[float, float]:
    """(expected accepted, expected drafted) tokens per verification at draft length `k` for
    per-token acceptance `a`, under draft-simple's `p_min` and `n_min`."""
    s, a_c = _confident(p_min, a, confidence)
    accepted = drafted = 0.0
    for i in range(1, k + 1):
        if n_min > k:
            break  # every draft is shorter than n_min: nothing is ever drafted
        drafted += s ** max(i, n_min)
        accepted += (s * a_c) ** i * s ** max(0, n_min - i)
    return accepted, drafted


def effective_acceptance(
    a: float,
    k: int,
    *,
    p_min: float = P_MIN_DEFAULT,
    n_min: int = N_MIN_DEFAULT,
    confidence: dict[float, tuple[float, float]] | None = None,
) -> float:
    """The per-token acceptance whose K-token geometric prefix (the cost model's formula)
    accepts as many tokens per verification as the build's rules do; `a` itself by default."""
    target, _ = accepted_per_step(a, k, p_min=p_min, n_min=n_min, confidence=confidence)
    if p_min <= 0 and n_min <= 0:
        return a
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if sum(mid**i for i in range(1, k + 1)) < target:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def drafted_acceptance_at(a: float, k: int, **rules: object) -> float:
    """What llama.cpp reports as acceptance (accepted / drafted) for per-token acceptance `a`."""
    accepted, drafted = accepted_per_step(a, k, **rules)  # type: ignore[arg-type]
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
            a_eff.append(effective_acceptance(m.acceptance, k, confidence=m.confidence))
            acc[i] = m.acceptance
    if rows:
        idx = np.array(rows)
        mid[idx] *= speed_ratio(X[idx], params, np.array(a_eff))
    return Adjusted(mid, acc, tuple(sources), tuple(used))


def agreement_why(why: Sequence[str], m: MeasuredAgreement, k: int) -> tuple[str, ...]:
    """The prior's acceptance line replaced by the measured one."""
    accepted, _ = accepted_per_step(m.acceptance, k, confidence=m.confidence)
    line = f"acceptance {m.summary} -> {1 + accepted:.1f} tokens per verification at K={k}"
    return tuple(line if w.startswith("acceptance ~") else w for w in why)
