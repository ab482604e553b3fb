"""Cross-validation of the speed model: held-out targets, K choice by throughput regret, speedup.

`grouped_cv` holds out one target model (`Observation.group`) at a time, so a fold never sees
any run of the model it is scored on - the situation of a user with a model nobody measured.
`leave_family_out` holds out a whole target family (a size class, or every MoE) at a time: the
situation of a user whose target is bigger or smaller than anything measured.

A K choice is scored by its throughput regret against the sweep's best measured K,
`1 - tps(picked) / tps(best)`, next to the regret of every constant K and of the user's rule of
thumb. (Whether the pick lands "within 10 % of the best" is below the data's noise floor: single
measurements per K scatter by more than that.)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from sklearn.base import clone

from specreg.recommender.features import COL, ConfigFacts, feature_matrix
from specreg.recommender.model import SpeculationRegressor
from specreg.recommender.prior import Observation, SweepSeries
from specreg.terms import Method

# Tolerance of the K criterion: the picked K may lose this much against the measured best.
K_LOSS_TOLERANCE = 0.10


@dataclass(frozen=True)
class TrainingSet:
    X: np.ndarray
    y: np.ndarray
    groups: np.ndarray
    acceptance: np.ndarray
    weight: np.ndarray
    series: np.ndarray
    observations: tuple[Observation, ...]


def training_set(observations: Sequence[Observation], *, local_weight: float = 4.0) -> TrainingSet:
    """Rows for `SpeculationRegressor.fit`; local runs count `local_weight` times a prior row."""
    obs = tuple(observations)
    X = feature_matrix(o.config for o in obs)
    # A plain run at full experts is its own baseline; hiding that from the model makes it learn
    # plain speed from bytes and bandwidth (the roofline efficiency), needed when a target has no
    # measured baseline on this host.
    plain = np.array(
        [o.config.method is Method.NONE and o.config.experts_ratio >= 1 for o in obs], dtype=bool
    )
    if len(obs):
        X[plain, COL["baseline_tps"]] = np.nan
    return TrainingSet(
        X=X,
        y=np.array([o.tps for o in obs], dtype=float),
        groups=np.array([o.group for o in obs]),
        acceptance=np.array(
            [o.acceptance if o.acceptance is not None else math.nan for o in obs], dtype=float
        ),
        weight=np.array([local_weight if o.source == "local" else 1.0 for o in obs]),
        series=np.array([o.series or "" for o in obs], dtype=object),
        observations=obs,
    )


# The K values every shipped sweep measures (the MoE sweeps only 8, 16 and 24).
CONSTANT_KS: tuple[int, ...] = (4, 8, 16, 24, 32, 48)


def fit_on(
    estimator: SpeculationRegressor, data: TrainingSet, rows: np.ndarray | None = None
) -> SpeculationRegressor:
    """A fresh clone of `estimator` fitted on `rows` of `data` (a boolean mask; all if None)."""
    keep = np.ones(len(data.y), dtype=bool) if rows is None else rows
    return clone(estimator).fit(
        data.X[keep],
        data.y[keep],
        sample_weight=data.weight[keep],
        groups=data.groups[keep],
        acceptance=data.acceptance[keep],
        series=data.series[keep],
    )


def rule_of_thumb_k(target_params_b: float) -> int:
    """The user's rule: K=16 for 70B-class targets, K=24 for 32B-class, K=8 for 7B-class."""
    if target_params_b >= 60:
        return 16
    return 24 if target_params_b >= 20 else 8


def target_family(c: ConfigFacts) -> str:
    """The family a target is held out with: every MoE together, dense ones by size class."""
    if c.target_is_moe:
        return "MoE"
    p = c.target_params_b
    if p < 10:
        return "7B-class"
    if p < 20:
        return "14B-class"
    return "32B-class" if p < 50 else "70B-class"


@dataclass(frozen=True)
class SweepScore:
    """One measured K sweep, the K the model picked for it and the rule of thumb's K."""

    series: str
    family: str
    target_params_b: float
    k_tps: tuple[tuple[int, float], ...]  # measured tokens/s by K, K ascending
    picked_k: int

    @property
    def best_tps(self) -> float:
        return max(t for _, t in self.k_tps)

    @property
    def best_k(self) -> int:
        return max(self.k_tps, key=lambda kt: kt[1])[0]

    @property
    def rule_k(self) -> int:
        return rule_of_thumb_k(self.target_params_b)

    def tps(self, k: int) -> float:
        """Measured tokens/s at K, or at the nearest measured K (the smaller on a tie)."""
        return min(self.k_tps, key=lambda kt: (abs(kt[0] - k), kt[0]))[1]

    def regret(self, k: int) -> float:
        return 1.0 - self.tps(k) / self.best_tps

    @property
    def model_regret(self) -> float:
        return self.regret(self.picked_k)

    @property
    def rule_regret(self) -> float:
        return self.regret(self.rule_k)


@dataclass(frozen=True)
class RegretReport:
    """Throughput regret of the model's K picks, of the rule of thumb and of each constant K."""

    scores: tuple[SweepScore, ...]

    @property
    def mean_regret(self) -> float:
        return float(np.mean([s.model_regret for s in self.scores])) if self.scores else math.nan

    @property
    def rule_mean_regret(self) -> float:
        return float(np.mean([s.rule_regret for s in self.scores])) if self.scores else math.nan

    @property
    def constant_regret(self) -> dict[int, float]:
        return {
            k: float(np.mean([s.regret(k) for s in self.scores])) if self.scores else math.nan
            for k in CONSTANT_KS
        }

    @property
    def best_constant(self) -> tuple[int, float]:
        """The constant K with the lowest mean regret on these very sweeps (chosen in-sample)."""
        regrets = self.constant_regret
        k = min(regrets, key=lambda k: regrets[k])
        return k, regrets[k]

    def by_family(self) -> dict[str, RegretReport]:
        fams: dict[str, list[SweepScore]] = {}
        for s in self.scores:
            fams.setdefault(s.family, []).append(s)
        return {f: RegretReport(tuple(v)) for f, v in sorted(fams.items())}


def score_sweep(
    predict: Callable[[np.ndarray], np.ndarray],
    X: np.ndarray,
    ks: Sequence[int],
    measured: dict[int, float],
    *,
    series: str,
    family: str,
    target_params_b: float,
) -> SweepScore:
    """The model's K for one sweep: the measured K its predictions rank first."""
    pred = predict(X)
    picked = int(ks[int(np.argmax(pred))])
    return SweepScore(
        series=series,
        family=family,
        target_params_b=target_params_b,
        k_tps=tuple(sorted(measured.items())),
        picked_k=picked,
    )


def leave_family_out(
    estimator: SpeculationRegressor, data: TrainingSet, sweeps: Sequence[SweepSeries]
) -> RegretReport:
    """Hold out every target of one family at a time; score the K picks on its sweeps."""
    obs = data.observations
    family_of = {o.group: target_family(o.config) for o in obs}
    row_family = np.array([family_of[g] for g in data.groups])
    sweep_by_name = {s.series: s for s in sweeps}
    scores: list[SweepScore] = []
    for family in sorted(set(row_family)):
        test = row_family == family
        names = sorted({str(data.series[i]) for i in np.flatnonzero(test) if data.series[i]})
        names = [n for n in names if n in sweep_by_name]
        if not names:
            continue
        model = fit_on(estimator, data, ~test)
        for name in names:
            rows = np.flatnonzero(data.series == name)
            scores.append(
                score_sweep(
                    model.predict,
                    data.X[rows],
                    [obs[i].config.k for i in rows],
                    sweep_by_name[name].k_tps,
                    series=name,
                    family=family,
                    target_params_b=obs[rows[0]].config.target_params_b,
                )
            )
    return RegretReport(tuple(scores))


@dataclass(frozen=True)
class SeriesResult:
    series: str
    group: str
    best_k: int
    best_tps: float
    picked_k: int
    picked_tps: float
    rule_k: int
    rule_tps: float

    @property
    def loss(self) -> float:
        return 1.0 - self.picked_tps / self.best_tps

    @property
    def rule_loss(self) -> float:
        return 1.0 - self.rule_tps / self.best_tps


@dataclass(frozen=True)
class CVReport:
    series: tuple[SeriesResult, ...]
    speedup_ape: tuple[float, ...]  # per held-out speculative row
    speedup_ape_draft: tuple[float, ...]
    coverage: float  # share of held-out rows inside the predicted band
    n_folds: int

    @property
    def k_within_tolerance(self) -> float:
        return float(np.mean([s.loss <= K_LOSS_TOLERANCE + 1e-12 for s in self.series]))

    @property
    def rule_within_tolerance(self) -> float:
        return float(np.mean([s.rule_loss <= K_LOSS_TOLERANCE + 1e-12 for s in self.series]))

    @property
    def speedup_mape(self) -> float:
        return float(np.mean(self.speedup_ape))

    @property
    def speedup_mape_draft(self) -> float:
        return float(np.mean(self.speedup_ape_draft))


def grouped_cv(
    estimator: SpeculationRegressor,
    data: TrainingSet,
    sweeps: Sequence[SweepSeries],
) -> CVReport:
    """Leave one target model out; score K choice on the sweeps and speedup on every row."""
    obs = data.observations
    by_series: dict[str, list[int]] = {}
    for i, o in enumerate(obs):
        if o.series:
            by_series.setdefault(o.series, []).append(i)
    sweep_by_name = {s.series: s for s in sweeps}
    series_results: list[SeriesResult] = []
    ape: list[float] = []
    ape_draft: list[float] = []
    inside: list[bool] = []
    folds = 0
    for group in np.unique(data.groups):
        test = data.groups == group
        spec = test & np.array([o.config.method is not Method.NONE for o in obs])
        has_series = any(obs[i].group == group for idx in by_series.values() for i in idx)
        if not spec.any() and not has_series:
            continue
        folds += 1
        model = fit_on(estimator, data, ~test)
        idx = np.flatnonzero(spec)
        if len(idx):
            lo, mid, hi = model.predict_interval(data.X[idx])
            for j, i in enumerate(idx.tolist()):
                o = obs[i]
                meas = o.speedup
                pred = mid[j] / o.config.baseline_tps
                ape.append(abs(pred - meas) / meas)
                if o.config.method is Method.DRAFT:
                    ape_draft.append(abs(pred - meas) / meas)
                inside.append(bool(lo[j] <= o.tps <= hi[j]))
        for name, rows in by_series.items():
            if obs[rows[0]].group != group or name not in sweep_by_name:
                continue
            sweep = sweep_by_name[name]
            pred = model.predict(data.X[rows])
            ks = [obs[i].config.k for i in rows]
            picked = ks[int(np.argmax(pred))]
            rule = rule_of_thumb_k(obs[rows[0]].config.target_params_b)
            # the rule's K may not be in the sweep (K=24 always is; K=8 always is)
            rule_tps = sweep.k_tps.get(rule, max(sweep.k_tps.values()))
            best_k = max(sweep.k_tps, key=lambda k: sweep.k_tps[k])
            series_results.append(
                SeriesResult(
                    series=name,
                    group=group,
                    best_k=best_k,
                    best_tps=sweep.k_tps[best_k],
                    picked_k=picked,
                    picked_tps=sweep.k_tps[picked],
                    rule_k=rule,
                    rule_tps=rule_tps,
                )
            )
    return CVReport(
        series=tuple(series_results),
        speedup_ape=tuple(ape),
        speedup_ape_draft=tuple(ape_draft),
        coverage=float(np.mean(inside)) if inside else math.nan,
        n_folds=folds,
    )
