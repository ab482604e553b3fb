"""The speed model's prediction for every candidate, moved by what was measured, with the
arithmetic that makes each figure.

The stages, in order; each one that moves a candidate's speed-up is kept in its ledger, so the
why lines print the product that makes the figure (`results.Arithmetic`):

1. the cost model's round at the acceptance each candidate is scored with: measured agreement
   (`specreg agree`) and, at temperature 0, n-gram lookup and draft stacks replayed on the
   target's text for pairs this host has not run (recommender/acceptance.py); this host's runs
   re-shape their K curve to the acceptance they measured;
2. the learned correction (what the formulas miss for targets like it);
3. plain decoding as this host measured it;
4. this host's runs of each K curve move it (`_local_level`);
5. the K curve of a pair nobody measured bends half way to the shape the shipped sweeps share
   (`kshape`);
6. runs of its kind elsewhere move it (recommender/evidence.py);
7. this host's runs of exactly the candidate, then runs of exactly it on the same host and
   task from any source, bound it (`_bound_by_twins`);
8. no speed-up beyond the tokens a verification yields (it costs at least a step).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import duckdb
import numpy as np

from specreg.recommender.acceptance import (
    ACC_AGREEMENT,
    ACC_PREDICTED,
    ACC_REPLAYED,
    Adjusted,
    MeasuredAgreement,
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
    Replayed,
    Rounds,
    acceptance,
    drafted_acceptance,
    logit,
    predict_tps,
    rounds,
)
from specreg.recommender.evidence import (
    Identity,
    Near,
    PlainRuns,
    evidence_correction,
    twins,
)
from specreg.recommender.features import ConfigFacts, column, feature_matrix
from specreg.recommender.kshape import KShape, shape_factors
from specreg.recommender.lookup_replay import N_MAX_DEFAULT, N_MIN_DEFAULT, StackSteps
from specreg.recommender.predictor import SpeedPredictor
from specreg.recommender.prior import Observation
from specreg.recommender.stacks import DRAFT_STACK
from specreg.registry.noise import FALLBACK_NOISE, NoiseFigure
from specreg.terms import Method

# What moved a speed-up, as the why lines name each factor.
F_LEARNED = "learned correction (what the formulas miss for targets like this)"
F_SHAPE = "K curve bent half way to the shape of the shipped sweeps"
F_KIND = "runs of pairs of this kind elsewhere"
F_LOCAL_CURVE = "this host's runs of this K curve"
F_LOCAL_ALL = "this host's speculative runs (none of this curve)"
F_EXACT = "this host's runs of exactly this configuration"
F_TWINS = "runs of exactly this configuration on this host and task"
F_BOUND = "the bound of speculation: at most the tokens a verification yields"
# A factor this close to 1 moves nothing worth printing.
NEGLIGIBLE = 0.002


@dataclass(frozen=True)
class Scores:
    """The speed model's view of every candidate (arrays in candidate order), moved by what was
    measured, with each candidate's arithmetic (`rounds` and `ledger`)."""

    X: np.ndarray
    mid: np.ndarray  # tokens/s, final
    sigma: np.ndarray  # log sigma of `mid`
    acceptance: np.ndarray  # per token, as scored
    z: float  # the band's half-width in sigmas
    plain_tps: float
    plain_measured: bool
    adjusted: Adjusted
    runs_by_config: dict[tuple[object, ...], list[float]]  # this host's tokens/s per config
    shift: np.ndarray  # the factor runs of each candidate's kind moved it by
    near: list[Near | None]
    rounds: Rounds  # the cost model's round of each candidate, at the acceptance scored
    ledger: tuple[tuple[tuple[str, float], ...], ...]  # what moved each speed-up beyond it
    twins: tuple[tuple[Observation, ...], ...]  # runs of exactly each candidate, this host
    plain_runs: PlainRuns  # every target's plain runs per host: which baselines to distrust
    identities: tuple[Identity, ...]  # whose runs are each candidate's, as the stages read them
    stacks: tuple[StackSteps | None, ...] = ()  # draft stacks replayed on the target's text

    def speedup(self, i: int) -> float:
        return float(self.mid[i]) / self.plain_tps

    def twin_figures(self, i: int) -> list[float]:
        """The runs of exactly candidate `i` on this host and task as its figure reads: t/s
        for plain decoding, else speed-ups (`twin_speedup`)."""
        if i == 0:
            return [o.tps for o in self.twins[0]]
        return [twin_speedup(o, self.plain_runs, self.plain_tps) for o in self.twins[i]]


def twin_speedup(o: Observation, plain_runs: PlainRuns, plain_tps: float) -> float:
    """A run's speed-up as a candidate's is compared with it: over the median plain run where
    its baseline is distrusted, over this host's plain decoding where it has none."""
    sp = plain_runs.speedup(o)
    return sp if math.isfinite(sp) and sp > 0 else o.tps / plain_tps


class _Ledger:
    """Each candidate's factors, appended as the stages move its speed-up."""

    def __init__(self, n: int) -> None:
        self.rows: list[list[tuple[str, float]]] = [[] for _ in range(n)]

    def moved(self, what: str, before: np.ndarray, after: np.ndarray, start: int = 1) -> None:
        for i in range(start, len(self.rows)):
            f = float(after[i]) / max(float(before[i]), 1e-300)
            if abs(math.log(max(f, 1e-300))) > NEGLIGIBLE:
                self.rows[i].append((what, f))

    def frozen(self) -> tuple[tuple[tuple[str, float], ...], ...]:
        return tuple(tuple(r) for r in self.rows)


def score(
    con: duckdb.DuckDBPyConnection,
    g: Grounds,
    cands: Sequence[Candidate],
    model: SpeedPredictor,
    ask: Ask,
    observations: Sequence[Observation],
) -> Scores:
    """Predict every candidate, then move the predictions by what was measured (the module's
    stages, in order)."""
    X = feature_matrix([c for c, _ in cands])
    mid = model.predict(X)
    agreements = load_agreement(con, g.target.model_id, ask.task, ask.temperature)
    adjusted, stacks = _measured_acceptance(
        g, cands, X, model, ask, mid, model.predict_acceptance(X), agreements
    )
    # a host with measurements of its own for the target is known by them: runs of another
    # machine of its size are not its own
    by_facts = not (agreements or g.local or g.cal.target is not None)
    return score_configs(
        [c for c, _ in cands],
        [replace(g.identity(d), by_facts=by_facts) for _, d in cands],
        model, observations, local=g.local, noise=g.noise, adjusted=adjusted, stacks=stacks,
    )  # fmt: skip


def score_configs(
    configs: Sequence[ConfigFacts],
    identities: Sequence[Identity],
    model: SpeedPredictor,
    observations: Sequence[Observation],
    *,
    local: Sequence[Observation] = (),
    noise: NoiseFigure = FALLBACK_NOISE,
    adjusted: Adjusted | None = None,
    stacks: Sequence[StackSteps | None] = (),
) -> Scores:
    """The stages for candidates `configs` (plain decoding first; `identities` say whose runs
    are whose), from the model's predictions and the acceptance measured for them (`adjusted`;
    none: the model's own): what `recommend` does, and what a benchmark without a registry
    asks (benchmarks/k_choice.py)."""
    X = feature_matrix(configs)
    _, mid, hi = model.predict_interval(X)
    sigma = model.predict_log_sigma(X)
    if adjusted is None:
        adjusted = Adjusted(mid, model.predict_acceptance(X), (ACC_PREDICTED,) * len(configs),
                            (None,) * len(configs))  # fmt: skip
    z = math.log(hi[0] / mid[0]) / sigma[0] if sigma[0] > 0 else 1.2816
    plain_model = float(mid[0])
    by_key: dict[tuple[object, ...], list[float]] = {}
    for o in local:
        by_key.setdefault(config_key(o.config), []).append(o.tps)
    # plain decoding as runs of it on this host measured it (this host's, or the same facts')
    plain_runs = PlainRuns(observations, noise.spread)
    found = tuple(
        tuple(twins(c, observations, who, plain_runs))
        for c, who in zip(configs, identities, strict=True)
    )
    measured_plain = [o.tps for o in found[0]]
    plain_tps = plain_model
    if measured_plain:
        plain_tps = within(
            posterior(plain_model, float(sigma[0]), measured_plain, noise.sigma)[0],
            measured_plain,
            noise.spread,
        )
    # 1. the cost model's round at the acceptance each candidate is scored with
    curve_shift = _curve_shifts(configs, local, X, model.params)
    acc_shift = _acceptance_shift_of(X, model.params, adjusted, curve_shift)
    rnd = _rounds(X, model.params, acc_shift, adjusted, stacks)
    mid = adjusted.mid * _reshape(X, model.params, curve_shift)
    # 2-3. the learned correction: what stands between the model's figures and the round's
    # arithmetic; plain decoding as measured carries every candidate with it (their speed-ups
    # are the model's)
    ledger = _Ledger(len(configs))
    mid = mid * plain_tps / plain_model
    ledger.moved(F_LEARNED, rnd.speedup * plain_tps, mid)
    # 4. this host's runs of each K curve
    mid, sigma = _local_level(configs, local, mid, sigma, ledger)
    # 5. an unmeasured pair's curve bends towards the sweeps' shape
    before = mid
    mid = mid * _shape_pull(configs, X, mid, model.k_shape, adjusted)
    ledger.moved(_shape_label(model.k_shape), before, mid)
    # 6. runs of its kind elsewhere
    mine = {id(o) for o in local}
    ran_here = {k_curve(o.config) for o in local if o.config.method is not Method.NONE}
    shift, near = evidence_correction(
        configs, [o for o in observations if id(o) not in mine], model,
        # a replayed candidate's error elsewhere is the workload's, which the replay measured
        skip=[
            i == 0 or k_curve(c) in ran_here or adjusted.sources[i] == ACC_REPLAYED
            for i, c in enumerate(configs)
        ],
    )  # fmt: skip
    before = mid
    mid = mid * shift
    kinds = [n.n_kind if n is not None else 0 for n in near]
    for i in range(1, len(configs)):
        f = float(shift[i])
        if abs(math.log(f)) > NEGLIGIBLE:
            ledger.rows[i].append((f"{kinds[i]} {F_KIND}", f))
    # half of the move is doubt: the model and the runs disagree
    sigma = np.sqrt(sigma**2 + (0.5 * np.log(shift)) ** 2)
    # 7. runs of exactly it on this host and task, from any source (this host's own included)
    before = mid
    mid, sigma = _bound_by_twins(mid, sigma, plain_tps, found, plain_runs, noise)
    ledger.moved(F_TWINS, before, mid)
    # 8. the bound of speculation
    before = mid
    cap = rnd.bound * plain_tps
    speculating = np.array([c.method is not Method.NONE for c in configs])
    mid = np.where(speculating, np.minimum(mid, cap), mid)
    ledger.moved(F_BOUND, before, mid)
    mid[0] = plain_tps
    return Scores(
        X=X,
        mid=mid,
        sigma=sigma,
        acceptance=np.where(speculating, _shown_acceptance(rnd, adjusted), 0.0),
        z=z,
        plain_tps=plain_tps,
        plain_measured=bool(by_key.get(config_key(configs[0]))),
        adjusted=adjusted,
        runs_by_config=by_key,
        shift=shift,
        near=near,
        rounds=rnd,
        ledger=ledger.frozen(),
        twins=found,
        plain_runs=plain_runs,
        identities=tuple(identities),
        stacks=tuple(stacks),
    )


def _measured_acceptance(
    g: Grounds,
    cands: Sequence[Candidate],
    X: np.ndarray,
    model: SpeedPredictor,
    ask: Ask,
    mid: np.ndarray,
    acc: np.ndarray,
    agreements: dict[str, MeasuredAgreement],
) -> tuple[Adjusted, tuple[StackSteps | None, ...]]:
    """The predicted speeds and acceptances (`mid`, `acc`) moved by `specreg agree`'s
    agreement for pairs without runs of their curve here and, at temperature 0, by ngram-mod
    and draft stacks replayed on the target's text."""
    run_curves = {k_curve(o.config) for o in g.local if o.acceptance is not None}
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


def _acceptance_shift_of(
    X: np.ndarray, params: CostParams, adjusted: Adjusted, curve_shift: np.ndarray
) -> np.ndarray:
    """The acceptance-logit shift each candidate is scored at: measured agreement's (the
    acceptance `apply_agreement` set), else its K curve's runs' (`_curve_shifts`), else 0."""
    own = logit(adjusted.acceptance, eps=1e-4) - logit(acceptance(X, params), eps=1e-4)
    agreed = np.array([s == ACC_AGREEMENT for s in adjusted.sources])
    return np.where(agreed, own, curve_shift)


def _rounds(
    X: np.ndarray,
    params: CostParams,
    acc_shift: np.ndarray,
    adjusted: Adjusted,
    stacks: Sequence[StackSteps | None],
) -> Rounds:
    """The cost model's round of every candidate with what measured it: the acceptance it is
    scored at, lookups and stacks replayed on the target's text."""
    n = len(X)
    q, e = np.full(n, np.nan), np.full(n, np.nan)
    for i, steps in enumerate(adjusted.lookups or ()):
        if steps is not None and steps.steps:
            q[i], e[i] = steps.draft_rate, steps.tokens_per_drafting_step
    f, e2 = np.full(n, np.nan), np.full(n, np.nan)
    for i, stacked in enumerate(stacks):
        if stacked is not None:
            f[i], e2[i] = stacked.lookup_share, stacked.tokens_per_step
    return rounds(X, params, acc_shift, Replayed(lookup=(q, e), stack=(f, e2)))


def _shown_acceptance(rnd: Rounds, adjusted: Adjusted) -> np.ndarray:
    """Per-token acceptance as each candidate is scored: the round's, except where a lookup was
    replayed (its accepted / drafted)."""
    replayed = np.array(
        [bool(adjusted.lookups) and adjusted.lookups[i] is not None
         for i in range(len(rnd.tokens))]
    )  # fmt: skip
    return np.where(replayed, adjusted.acceptance, rnd.acceptance)


def _acceptance_shift(X: np.ndarray, params: CostParams, measured: np.ndarray) -> float:
    """The acceptance-logit shift that makes the cost model report the measured acceptances.

    `X` holds the measured runs' rows; `measured` is llama.cpp's accepted/drafted for each.
    """
    target = logit(measured, eps=0.01)
    k = column(X, "k")

    def error(s: float) -> float:
        a = predict_tps(X, params, s)[1]
        return float(np.sum((logit(drafted_acceptance(a, k)) - target) ** 2))

    shifts = np.linspace(-6.0, 6.0, 241)
    i = int(np.argmin([error(s) for s in shifts]))
    # refined between the grid's neighbours (golden section): one run is met exactly
    lo, hi = shifts[max(i - 1, 0)], shifts[min(i + 1, len(shifts) - 1)]
    ratio = (math.sqrt(5.0) - 1.0) / 2.0
    for _ in range(80):
        a, b = hi - ratio * (hi - lo), lo + ratio * (hi - lo)
        lo, hi = (lo, b) if error(a) < error(b) else (a, hi)
    return float((lo + hi) / 2.0)


def _curves(configs: Sequence[ConfigFacts]) -> dict[tuple[object, ...], list[int]]:
    out: dict[tuple[object, ...], list[int]] = {}
    for i, c in enumerate(configs):
        if c.method is not Method.NONE:
            out.setdefault(k_curve(c), []).append(i)
    return out


def _runs_on_curves(
    configs: Sequence[ConfigFacts], local: Sequence[Observation]
) -> dict[tuple[object, ...], list[tuple[int, Observation]]]:
    """This host's speculative runs of a candidate, by K curve, with the candidate's index."""
    index = {config_key(c): i for i, c in enumerate(configs)}
    runs: dict[tuple[object, ...], list[tuple[int, Observation]]] = {}
    for o in local:
        at = index.get(config_key(o.config))
        if at is not None and o.config.method is not Method.NONE:
            runs.setdefault(k_curve(o.config), []).append((at, o))
    return runs


def _curve_shifts(
    configs: Sequence[ConfigFacts],
    local: Sequence[Observation],
    X: np.ndarray,
    params: CostParams,
) -> np.ndarray:
    """The acceptance-logit shift each K curve with this host's runs is re-shaped to: the one
    whose acceptance the cost model reports as the runs' accepted / drafted (acceptance decides
    where the curve peaks: a draft that is always right keeps paying off at long K)."""
    out = np.zeros(len(configs))
    curves = _curves(configs)
    for curve, measured in _runs_on_curves(configs, local).items():
        with_acc = [(i, o.acceptance) for i, o in measured if o.acceptance is not None]
        if with_acc:
            rows = np.array([i for i, _ in with_acc])
            shift = _acceptance_shift(X[rows], params, np.array([a for _, a in with_acc]))
            out[np.array(curves[curve])] = shift
    return out


def _reshape(X: np.ndarray, params: CostParams, curve_shift: np.ndarray) -> np.ndarray:
    """The factor each candidate's speed moves by at its curve's shift (1 where none)."""
    moved = np.flatnonzero(curve_shift != 0)
    out = np.ones(len(X))
    if len(moved):
        before = predict_tps(X[moved], params)[0]
        after = predict_tps(X[moved], params, curve_shift[moved])[0]
        out[moved] = after / np.maximum(before, 1e-12)
    return out


def _local_level(
    configs: Sequence[ConfigFacts],
    local: Sequence[Observation],
    mid: np.ndarray,
    sigma: np.ndarray,
    ledger: _Ledger,
) -> tuple[np.ndarray, np.ndarray]:
    """Move predictions by what this host's runs showed for the same K curve: the runs' mean
    log ratio (measured / predicted) moves the whole curve, shrunk towards zero while runs are
    few. Options of unmeasured curves move by the mean over all speculative runs, shrunk
    harder. So a few runs re-anchor the K curve of a pair without refitting the prior."""
    runs = _runs_on_curves(configs, local)
    if not runs:
        return mid, sigma
    mid, sigma = mid.copy(), sigma.copy()
    every: list[float] = []
    level: dict[tuple[object, ...], list[float]] = {}
    for curve, measured in runs.items():
        for i, o in measured:
            r = math.log(o.tps) - math.log(float(mid[i]))
            level.setdefault(curve, []).append(r)
            every.append(r)
    g = float(np.mean(every)) * len(every) / (len(every) + 2.0)
    for curve, members in _curves(configs).items():
        rs = level.get(curve)
        for i in members:
            if rs:
                n = len(rs)
                f = math.exp(float(np.mean(rs)) * n / (n + 0.5))
                sigma[i] /= math.sqrt(1.0 + n)
                what = f"{F_LOCAL_CURVE} ({n})"
            else:
                f, what = math.exp(g), f"{F_LOCAL_ALL} ({len(every)})"
            mid[i] *= f
            if abs(math.log(f)) > NEGLIGIBLE:
                ledger.rows[i].append((what, f))
    return mid, sigma


def _shape_label(shape: KShape | None) -> str:
    n = shape.n_series if shape is not None else 0
    return f"{F_SHAPE} ({n} series on the reference host)"


def _shape_pull(
    configs: Sequence[ConfigFacts],
    X: np.ndarray,
    mid: np.ndarray,
    shape: KShape | None,
    adjusted: Adjusted,
) -> np.ndarray:
    """The factor that bends each unmeasured pair's K curve towards the shipped sweeps' shape:
    draft-simple curves whose acceptance is predicted and whose costs are modelled (no
    calibration here), with no run of theirs on this host (`kshape.shape_factors`)."""
    out = np.ones(len(configs))
    if shape is None:
        return out
    modelled = ~np.isfinite(column(X, "target_step_s"))
    for members in _curves(configs).values():
        c = configs[members[0]]
        eligible = (
            c.method is Method.DRAFT
            and not c.stack
            and all(modelled[i] and adjusted.sources[i] == ACC_PREDICTED for i in members)
        )
        if eligible and len(members) > 1:
            ks = [configs[i].k for i in members]
            out[np.array(members)] = shape_factors(shape, ks, mid[np.array(members)])
    return out


def within(figure: float, measured: Sequence[float], spread: float) -> float:
    """`figure` kept within the spread of `measured` (the noise figure either side)."""
    return min(max(figure, min(measured) / (1.0 + spread)), max(measured) * (1.0 + spread))


def _bound_by_twins(
    mid: np.ndarray,
    sigma: np.ndarray,
    plain_tps: float,
    found: Sequence[Sequence[Observation]],
    plain_runs: PlainRuns,
    noise: NoiseFigure,
) -> tuple[np.ndarray, np.ndarray]:
    """Each candidate (but plain decoding) moved to the runs of exactly it on this host and
    task (`found`), as speed-ups (over the median plain run where a run's baseline is
    distrusted; over this host's plain decoding where a run has none), combined with the
    prediction as measurements of `noise` and kept within their spread."""
    mid, sigma = mid.copy(), sigma.copy()
    for i in range(1, len(mid)):
        if not found[i]:
            continue
        speedups = [twin_speedup(o, plain_runs, plain_tps) for o in found[i]]
        m, s = posterior(float(mid[i]) / plain_tps, float(sigma[i]), speedups, noise.sigma)
        mid[i] = within(m, speedups, noise.spread) * plain_tps
        sigma[i] = s
    return mid, sigma


def posterior(
    mid: float, sigma: float, measured: Sequence[float], run_sigma: float
) -> tuple[float, float]:
    """Log-normal prediction combined with n measurements of scatter `run_sigma` (precision-
    weighted)."""
    if not measured:
        return mid, sigma
    prec = 1 / sigma**2 + len(measured) / run_sigma**2
    mean = (math.log(mid) / sigma**2 + sum(math.log(m) for m in measured) / run_sigma**2) / prec
    return math.exp(mean), math.sqrt(1 / prec)
