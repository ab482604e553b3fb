"""The speed model's prediction for every candidate, moved by what was measured.

Four corrections, in order: measured draft agreement (`specreg agree`) and, at temperature 0,
n-gram lookup and draft stacks replayed on the target's text set the acceptance of pairs this
host has not run (recommender/acceptance.py); this host's runs re-shape and move their K curve
(`_local_correction`); the measured runs nearest to the other candidates move them by what the
model got wrong about their kind (recommender/evidence.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import duckdb
import numpy as np

from specreg.recommender.acceptance import (
    ACC_REPLAYED,
    Adjusted,
    apply_agreement,
    apply_lookup,
    apply_stack,
    load_agreement,
    measured_texts,
)
from specreg.recommender.candidates import (
    Ask,
    Candidate,
    Grounds,
    config_key,
    is_ngram_mod,
    k_curve,
)
from specreg.recommender.costmodel import (
    CostParams,
    drafted_acceptance,
    logit,
    per_token_acceptance,
    predict_tps,
)
from specreg.recommender.evidence import Near, evidence_correction
from specreg.recommender.features import column, feature_matrix
from specreg.recommender.lookup_replay import N_MAX_DEFAULT, N_MIN_DEFAULT, StackSteps
from specreg.recommender.predictor import SpeedPredictor
from specreg.recommender.prior import Observation
from specreg.recommender.stacks import DRAFT_STACK
from specreg.terms import Method

# Scatter of one recorded local run (log tokens/s), for weighing it against the prediction.
LOCAL_RUN_SIGMA = 0.08


@dataclass(frozen=True)
class Scores:
    """The speed model's view of every candidate (arrays in candidate order), moved by measured
    agreement and this host's runs."""

    X: np.ndarray
    mid: np.ndarray
    sigma: np.ndarray
    acceptance: np.ndarray
    z: float  # the band's half-width in sigmas
    plain_tps: float
    plain_measured: bool
    adjusted: Adjusted
    runs_by_config: dict[tuple[object, ...], list[float]]  # this host's tokens/s per config
    accepted_by_curve: dict[tuple[object, ...], list[float]]  # per-token acceptance per K curve
    shift: np.ndarray  # the factor evidence moved each prediction by (`evidence_correction`)
    near: list[Near | None]  # each candidate's nearest measured run, as the model sees it
    stacks: tuple[StackSteps | None, ...] = ()  # draft stacks replayed on the target's text


def score(
    con: duckdb.DuckDBPyConnection,
    g: Grounds,
    cands: Sequence[Candidate],
    model: SpeedPredictor,
    ask: Ask,
    observations: Sequence[Observation],
) -> Scores:
    """Predict every candidate, then move the predictions by what was measured: the target's
    plain runs, `specreg agree`'s acceptance, this host's runs of each K curve and, for curves
    without them, the measured runs nearest to each candidate."""
    X = feature_matrix([c for c, _ in cands])
    _, mid, hi = model.predict_interval(X)
    sigma = model.predict_log_sigma(X)
    plain_tps = float(mid[0])
    by_key: dict[tuple[object, ...], list[float]] = {}
    for o in g.local:
        by_key.setdefault(config_key(o.config), []).append(o.tps)
    measured_plain = by_key.get(config_key(g.base), [])
    if measured_plain:
        plain_tps = posterior(plain_tps, float(sigma[0]), measured_plain)[0]
    adjusted, stacks = _measured_acceptance(
        con, g, cands, X, model, ask, mid, model.predict_acceptance(X)
    )
    mid, sigma = _local_correction(cands, g.local, X, model, adjusted.mid, sigma)
    mine = {id(o) for o in g.local}
    ran_here = {k_curve(o.config) for o in g.local if o.config.method is not Method.NONE}
    shift, near = evidence_correction(
        [c for c, _ in cands], [o for o in observations if id(o) not in mine], model,
        # a replayed candidate's error elsewhere is the workload's, which the replay measured
        skip=[
            i == 0 or k_curve(c) in ran_here or adjusted.sources[i] == ACC_REPLAYED
            for i, (c, _) in enumerate(cands)
        ],
    )  # fmt: skip
    mid = mid * shift
    # half of the move is doubt: the model and the runs disagree
    sigma = np.sqrt(sigma**2 + (0.5 * np.log(shift)) ** 2)
    return Scores(
        X=X,
        mid=mid,
        sigma=sigma,
        acceptance=adjusted.acceptance,
        z=math.log(hi[0] / mid[0]) / sigma[0] if sigma[0] > 0 else 1.2816,
        plain_tps=plain_tps,
        plain_measured=bool(measured_plain),
        adjusted=adjusted,
        runs_by_config=by_key,
        accepted_by_curve=_accepted_by_curve(g.local),
        stacks=stacks,
        shift=shift,
        near=near,
    )


def _measured_acceptance(
    con: duckdb.DuckDBPyConnection,
    g: Grounds,
    cands: Sequence[Candidate],
    X: np.ndarray,
    model: SpeedPredictor,
    ask: Ask,
    mid: np.ndarray,
    acc: np.ndarray,
) -> tuple[Adjusted, tuple[StackSteps | None, ...]]:
    """The predicted speeds and acceptances (`mid`, `acc`) moved by `specreg agree`'s
    agreement for pairs without runs of their curve here and, at temperature 0, by ngram-mod
    and draft stacks replayed on the target's text."""
    run_curves = {k_curve(o.config) for o in g.local if o.acceptance is not None}
    agreements = load_agreement(con, g.target.model_id, ask.task, ask.temperature)
    adjusted = apply_agreement(
        [
            (d.model_id if d is not None and c.method is Method.DRAFT else None, c.k,
             k_curve(c) in run_curves)
            for c, d in cands
        ],
        X, model.params, mid, acc, agreements,
    )  # fmt: skip
    if ask.temperature != 0:  # the replay is greedy: the target's text is its greedy answers
        return adjusted, ()
    adjusted = apply_lookup(
        [(c.k, max(1, c.k // 4)) if is_ngram_mod(c) else None for c, _ in cands],
        X, model.params, adjusted, measured_texts(agreements),
    )  # fmt: skip
    # a stack's K is its draft model's; its ngram-mod drafts with the build's defaults
    return apply_stack(
        [(d.model_id, c.k, N_MAX_DEFAULT, N_MIN_DEFAULT)
         if c.stack == DRAFT_STACK and c.method is Method.DRAFT and d is not None else None
         for c, d in cands],
        X, model.params, adjusted, agreements,
    )  # fmt: skip


def _acceptance_shift(X: np.ndarray, params: CostParams, measured: np.ndarray) -> float:
    """The acceptance-logit shift that makes the cost model report the measured acceptances.

    `X` holds the measured runs' rows; `measured` is llama.cpp's accepted/drafted for each.
    """
    target = logit(measured, eps=0.01)
    k = column(X, "k")
    shifts = np.linspace(-6.0, 6.0, 241)
    errors = [
        float(np.sum((logit(drafted_acceptance(predict_tps(X, params, s)[1], k)) - target) ** 2))
        for s in shifts
    ]
    return float(shifts[int(np.argmin(errors))])


def _local_correction(
    cands: Sequence[Candidate],
    local: Sequence[Observation],
    X: np.ndarray,
    model: SpeedPredictor,
    mid: np.ndarray,
    sigma: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Move predictions by what this host's runs showed for the same K curve.

    A K curve is one method + draft + expert count over all K. Its measured acceptance
    re-shapes the curve (acceptance decides where the curve peaks: a draft that is always
    right keeps paying off at long K); then its runs' mean log ratio (measured / predicted)
    moves the whole curve, shrunk towards zero while runs are few. Options of unmeasured
    curves move by the mean over all speculative runs, shrunk harder. So a few runs
    re-anchor the K curve of a pair without refitting the prior.
    """
    index = {config_key(c): i for i, (c, _) in enumerate(cands)}
    curves: dict[tuple[object, ...], list[int]] = {}
    for i, (c, _) in enumerate(cands):
        if c.method is not Method.NONE:
            curves.setdefault(k_curve(c), []).append(i)
    runs: dict[tuple[object, ...], list[tuple[int, Observation]]] = {}
    for o in local:
        at = index.get(config_key(o.config))
        if at is not None and o.config.method is not Method.NONE:
            runs.setdefault(k_curve(o.config), []).append((at, o))
    if not runs:
        return mid, sigma
    mid, sigma = mid.copy(), sigma.copy()
    _reshape_curves(runs, curves, X, model.params, mid)
    every: list[float] = []
    level: dict[tuple[object, ...], list[float]] = {}
    for curve, measured in runs.items():
        for i, o in measured:
            r = math.log(o.tps) - math.log(float(mid[i]))
            level.setdefault(curve, []).append(r)
            every.append(r)
    g = float(np.mean(every)) * len(every) / (len(every) + 2.0)
    for curve, members in curves.items():
        rs = level.get(curve)
        for i in members:
            if rs:
                n = len(rs)
                mid[i] *= math.exp(float(np.mean(rs)) * n / (n + 0.5))
                sigma[i] /= math.sqrt(1.0 + n)
            else:
                mid[i] *= math.exp(g)
    return mid, sigma


def _reshape_curves(
    runs: dict[tuple[object, ...], list[tuple[int, Observation]]],
    curves: dict[tuple[object, ...], list[int]],
    X: np.ndarray,
    params: CostParams,
    mid: np.ndarray,
) -> None:
    """Re-shape (in `mid`) each K curve whose runs measured acceptance to that acceptance."""
    for curve, measured in runs.items():
        with_acc = [(i, o.acceptance) for i, o in measured if o.acceptance is not None]
        if not with_acc:
            continue
        rows = np.array([i for i, _ in with_acc])
        shift = _acceptance_shift(X[rows], params, np.array([a for _, a in with_acc]))
        on_curve = np.array(curves[curve])
        before = predict_tps(X[on_curve], params)[0]
        after = predict_tps(X[on_curve], params, shift)[0]
        mid[on_curve] *= after / np.maximum(before, 1e-12)


def posterior(mid: float, sigma: float, measured: list[float]) -> tuple[float, float]:
    """Log-normal prediction combined with n local measurements (precision-weighted)."""
    if not measured:
        return mid, sigma
    prec = 1 / sigma**2 + len(measured) / LOCAL_RUN_SIGMA**2
    mean = (
        math.log(mid) / sigma**2 + sum(math.log(m) for m in measured) / LOCAL_RUN_SIGMA**2
    ) / prec
    return math.exp(mean), math.sqrt(1 / prec)


def _accepted_by_curve(local: Sequence[Observation]) -> dict[tuple[object, ...], list[float]]:
    """Per-token acceptance of each K curve (pair, method, stack, task...), from its runs'
    accepted / drafted at the K they ran: one figure for every K of the curve."""
    drafting = [o for o in local if o.acceptance is not None and o.config.k > 0]
    per_token = per_token_acceptance(
        np.array([o.acceptance for o in drafting], dtype=float),
        np.array([o.config.k for o in drafting], dtype=float),
    )
    out: dict[tuple[object, ...], list[float]] = {}
    for o, a_run in zip(drafting, per_token, strict=True):
        out.setdefault(k_curve(o.config), []).append(float(a_run))
    return out
