"""The learned speed model: a scikit-learn estimator over `features.FEATURES`.

Two layers, so the learned part only has to learn what the formulas cannot:

1. the cost model of `costmodel` (memory-bound steps, verify cost, Leviathan's expected tokens
   per step) with its ~30 constants fitted by robust least squares on log tokens/s, acceptance
   being a logistic function of task, draft family and relative size, temperature;
2. a small gradient-boosted model of the remaining log-ratio (measured / cost model).

What it learns is plain numbers: `predictor()` hands them over as a `SpeedPredictor`, which
predicts with numpy alone (what `recommend` loads; this module imports SciPy and scikit-learn).

Uncertainty comes from an ensemble refitted on bootstrap resamples of the target models (the
spread between members: how much the answer depends on which targets were seen) plus the
observed scatter of single measurements around the fit.

Estimator contract: `__init__` stores parameters only, learned state ends in `_`, `fit` returns
self, all randomness comes from `random_state`, so `clone` and grouped cross-validation work.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np
from scipy.optimize import least_squares
from sklearn.base import BaseEstimator, RegressorMixin
from sklearn.ensemble import GradientBoostingRegressor
from sklearn.utils.validation import check_is_fitted

from specreg.recommender.costmodel import (
    REFERENCE_COMPUTE_SHARE,
    CostParams,
    drafted_acceptance,
    logit,
    predict_tps,
    vector_length,
)
from specreg.recommender.features import FEATURES, column
from specreg.recommender.kshape import KShape, sweep_shape
from specreg.recommender.predictor import (
    Member,
    ResidualTrees,
    SpeedPredictor,
    point,
    residual_matrix,
)

_BOUNDS: dict[str, tuple[float, float]] = {
    "target_eff": (0.01, 2.0),
    "target_tau": (0.0, 0.5),
    # Pinned: a draft streams its weights as the target does on the same host (the same
    # kernels); fitted freely the sweeps priced a drafted token of a 1B draft at ~80 % of an 8B
    # step (a fifth of its parameters, a third of its bytes: issue 40). What a small model pays
    # beyond its bytes (sampling, kernel launches) is its fixed seconds per token.
    "draft_eff": (1.0, 1.0 + 1e-6),
    "draft_tau": (0.0, 0.05),
    # Pinned, not fitted: the sweeps cannot tell a verify pass that turns compute-bound at K of
    # 10 from draft costs that grow with K (the fit has a minimum at each); llama.cpp on the
    # reference host stays memory-bound to K of 16-32 (the shared llama.cpp notes, section 6).
    # Leave-family-out regret 7.9 % pinned, 8.2-9.6 % fitted (benchmarks/recommender_cv.py).
    "verify_slope": (REFERENCE_COMPUTE_SHARE, REFERENCE_COMPUTE_SHARE + 1e-6),
    "verify_size_exp": (0.0, 1.0),
    "expert_share": (0.05, 0.95),
    "moe_eff": (0.1, 1.0),
    # signs physics insists on: a larger draft agrees more, a hotter sampler less
    "acc_size": (0.0, 3.0),
    "acc_temp": (-5.0, 0.0),
}
# Where acceptance coefficients are pulled when the data say little (a weak prior).
_PRIOR = CostParams()


def _bounds_vectors() -> tuple[np.ndarray, np.ndarray]:
    lo: list[float] = []
    hi: list[float] = []
    for f in fields(CostParams):
        n = vector_length(f.name)
        b = _BOUNDS.get(f.name, (-8.0, 8.0))
        lo += [b[0]] * n
        hi += [b[1]] * n
    return np.asarray(lo), np.asarray(hi)


def _ridge_mask() -> np.ndarray:
    mask: list[float] = []
    for f in fields(CostParams):
        n = vector_length(f.name)
        mask += [0.0 if f.name in _BOUNDS and not f.name.startswith("acc_") else 1.0] * n
    return np.asarray(mask)


def _sparsity(sid: np.ndarray, has_acc: np.ndarray, n_p: int, n_s: int) -> np.ndarray:
    """Which residual depends on which parameter: a sweep's effects touch only its rows."""
    n_y = len(sid)
    n_acc = int(has_acc.sum())
    rows = n_y + n_acc + n_p + (2 * n_s if n_s else 0)
    jac = np.zeros((rows, n_p + 2 * n_s), dtype=bool)
    jac[: n_y + n_acc, :n_p] = True
    jac[n_y + n_acc : n_y + n_acc + n_p, :n_p] = np.eye(n_p, dtype=bool)
    if n_s:
        for i in np.flatnonzero(sid >= 0):
            jac[i, n_p + sid[i]] = True
            jac[i, n_p + n_s + sid[i]] = True
        acc_rows = np.flatnonzero(has_acc)
        for j, i in enumerate(acc_rows):
            if sid[i] >= 0:
                jac[n_y + j, n_p + n_s + sid[i]] = True
        base = n_y + n_acc + n_p
        jac[base:, n_p:] = np.eye(2 * n_s, dtype=bool)
    return jac


@dataclass(frozen=True)
class CostLoss:
    """How `fit_cost_params` weighs what it fits (`SpeculationRegressor`'s parameters of the
    same names): the soft-L1 scale, the ridge on acceptance coefficients, the weight of
    reported acceptance, the shrinkage of per-sweep random effects."""

    robust_scale: float
    ridge: float
    acceptance_weight: float
    series_ridge: float = 1.0


def fit_cost_params(
    X: np.ndarray,
    y: np.ndarray,
    weight: np.ndarray,
    acc: np.ndarray,
    *,
    start: CostParams,
    loss: CostLoss,
    series: np.ndarray | None = None,
) -> CostParams:
    """Robust least squares of log tokens/s (and reported acceptance) on the cost model.

    `series` (one label per row, "" for none) adds a random effect per measured sweep: a level
    offset (the sweeps' baselines come from a different prompt than their speed tests) and an
    acceptance offset (pairs differ in ways the facts do not show), both pulled to zero by
    `loss.series_ridge`. They let the shared constants be learned from the shape of each sweep
    over K; predictions for new configurations use the shared constants only.
    """
    lo, hi = _bounds_vectors()
    labels = np.asarray(series if series is not None else [""] * len(y), dtype=object)
    names = sorted({str(x) for x in labels if x})
    index = {n: i for i, n in enumerate(names)}
    sid = np.array([index.get(str(x), -1) for x in labels])
    has_s = sid >= 0
    n_s = len(names)
    n_p = len(lo)
    lo = np.concatenate([lo, np.full(2 * n_s, -4.0)])
    hi = np.concatenate([hi, np.full(2 * n_s, 4.0)])
    mask = _ridge_mask()
    prior = _PRIOR.to_vector()
    has_acc = np.isfinite(acc)
    k_acc = np.maximum(column(X, "k")[has_acc], 1.0)
    sw = np.sqrt(weight)
    sw_acc = np.sqrt(weight[has_acc]) * loss.acceptance_weight
    log_y = np.log(y)

    def residuals(vec: np.ndarray) -> np.ndarray:
        p = CostParams.from_vector(vec[:n_p])
        level = np.zeros(len(y))
        acc_shift = np.zeros(len(y))
        if n_s:
            level[has_s] = vec[n_p : n_p + n_s][sid[has_s]]
            acc_shift[has_s] = vec[n_p + n_s :][sid[has_s]]
        tps, a = predict_tps(X, p, acc_shift)
        r = sw * (np.log(np.maximum(tps, 1e-9)) + level - log_y)
        parts = [r]
        if has_acc.any():
            pred_acc = drafted_acceptance(a[has_acc], k_acc)
            parts.append(sw_acc * (logit(pred_acc) - logit(acc[has_acc])))
        parts.append(np.sqrt(loss.ridge) * mask * (vec[:n_p] - prior))
        if n_s:
            # levels move freely (protocol differences), acceptance shifts are shrunk
            parts.append(
                np.sqrt(loss.series_ridge)
                * np.concatenate([0.1 * vec[n_p : n_p + n_s], vec[n_p + n_s :]])
            )
        return np.concatenate(parts)

    x0 = np.concatenate(
        [np.clip(start.to_vector(), lo[:n_p] + 1e-9, hi[:n_p] - 1e-9), np.zeros(2 * n_s)]
    )
    sol = least_squares(
        residuals,
        x0,
        bounds=(lo, hi),
        loss="soft_l1",
        f_scale=loss.robust_scale,
        max_nfev=300,
        jac_sparsity=_sparsity(sid, has_acc, n_p, n_s),
    )
    return CostParams.from_vector(sol.x[:n_p])


class SpeculationRegressor(RegressorMixin, BaseEstimator):
    """Predicts decode tokens/s of a configuration (rows of `features.FEATURES`).

    Parameters
    ----------
    n_members: ensemble members refitted on bootstrap resamples of the groups (target models),
        for the uncertainty band; 0 gives a band from measurement scatter alone.
    residual: learn the log-ratio the cost model leaves (gradient boosting), or not.
    residual_depth, residual_estimators, learning_rate: the residual model's size.
    robust_scale: log-space scale of the soft-L1 loss: figures further off count less.
    ridge: pull of acceptance coefficients towards their weak prior.
    acceptance_weight: weight of reported acceptance rates relative to speeds.
    series_ridge: shrinkage of the per-sweep random effects; 0 switches them off.
    band: central probability of `predict_interval`.
    random_state: seeds the bootstrap and the residual model.
    """

    def __init__(
        self,
        n_members: int = 5,
        residual: bool = True,
        residual_depth: int = 2,
        residual_estimators: int = 60,
        learning_rate: float = 0.05,
        robust_scale: float = 0.25,
        ridge: float = 0.05,
        acceptance_weight: float = 0.5,
        series_ridge: float = 1.0,
        band: float = 0.8,
        random_state: int | None = 0,
    ) -> None:
        self.n_members = n_members
        self.residual = residual
        self.residual_depth = residual_depth
        self.residual_estimators = residual_estimators
        self.learning_rate = learning_rate
        self.robust_scale = robust_scale
        self.ridge = ridge
        self.acceptance_weight = acceptance_weight
        self.series_ridge = series_ridge
        self.band = band
        self.random_state = random_state

    # -- fitting ---------------------------------------------------------------------------

    def _fit_one(
        self,
        X: np.ndarray,
        y: np.ndarray,
        w: np.ndarray,
        acc: np.ndarray,
        series: np.ndarray,
        start: CostParams,
        seed: int,
    ) -> Member:
        params = fit_cost_params(
            X,
            y,
            w,
            acc,
            start=start,
            loss=CostLoss(self.robust_scale, self.ridge, self.acceptance_weight, self.series_ridge),
            series=series if self.series_ridge > 0 else None,
        )
        if not self.residual or len(y) < 10:
            return params, None
        structural, _ = predict_tps(X, params)
        target = np.log(y) - np.log(np.maximum(structural, 1e-9))
        gbm = GradientBoostingRegressor(
            loss="huber",
            max_depth=self.residual_depth,
            n_estimators=self.residual_estimators,
            learning_rate=self.learning_rate,
            subsample=0.8,
            random_state=seed,
        )
        R = residual_matrix(X)
        gbm.fit(R, target, sample_weight=w)
        return params, residual_trees(gbm, R.shape[1])

    def fit(
        self,
        X: np.ndarray,
        y: np.ndarray,
        sample_weight: np.ndarray | None = None,
        groups: np.ndarray | None = None,
        acceptance: np.ndarray | None = None,
        series: np.ndarray | None = None,
    ) -> SpeculationRegressor:
        """Fit on rows X (FEATURES) and measured tokens/s y.

        groups: the target model of each row (bootstrap unit); acceptance: llama.cpp's reported
        accepted/drafted fraction where known (NaN elsewhere); series: the K sweep a row belongs
        to ("" for none), for the per-sweep random effects (see `fit_cost_params`).
        """
        X = np.asarray(X, dtype=float)
        y = np.asarray(y, dtype=float)
        if X.ndim != 2 or X.shape[1] != len(FEATURES):
            raise ValueError(f"X must have {len(FEATURES)} columns (features.FEATURES)")
        if len(y) != len(X) or not np.all(y > 0):
            raise ValueError("y must be positive tokens/s, one per row of X")
        w = np.ones(len(y)) if sample_weight is None else np.asarray(sample_weight, dtype=float)
        acc = np.full(len(y), np.nan) if acceptance is None else np.asarray(acceptance, float)
        g = np.arange(len(y)) if groups is None else np.asarray(groups)
        ser = np.full(len(y), "", dtype=object) if series is None else np.asarray(series, object)
        rng = np.random.default_rng(self.random_state)

        self.n_features_in_ = X.shape[1]
        self.params_, self.residual_ = self._fit_one(X, y, w, acc, ser, _PRIOR, 0)
        log_err = np.log(y) - np.log(point(X, self.params_, self.residual_))
        # robust scatter of single measurements around the fit (MAD -> sigma)
        med = np.median(log_err)
        self.noise_ = float(1.4826 * np.median(np.abs(log_err - med)))

        self.k_shape_ = _shape_of_sweeps(X, y, ser)

        self.members_: list[Member] = []
        unique = np.unique(g)
        for m in range(self.n_members):
            pick = rng.choice(unique, size=len(unique), replace=True)
            counts = {u: c for u, c in zip(*np.unique(pick, return_counts=True), strict=True)}
            wm = w * np.array([counts.get(gi, 0) for gi in g], dtype=float)
            keep = wm > 0
            self.members_.append(
                self._fit_one(X[keep], y[keep], wm[keep], acc[keep], ser[keep], self.params_, m + 1)
            )
        return self

    # -- prediction ------------------------------------------------------------------------

    def predictor(self) -> SpeedPredictor:
        """What the fit learned, as a numpy-only predictor (what recommend uses and keeps)."""
        check_is_fitted(self, "params_")
        return SpeedPredictor(
            params=self.params_,
            residual=self.residual_,
            members=tuple(self.members_),
            noise=self.noise_,
            band=self.band,
            k_shape=self.k_shape_,
        )

    def predict(self, X: np.ndarray) -> np.ndarray:
        """Predicted decode tokens/s."""
        return self.predictor().predict(X)

    def predict_structural(self, X: np.ndarray) -> np.ndarray:
        """The cost model's prediction alone, without the learned residual."""
        return self.predictor().predict_structural(X)

    def predict_acceptance(self, X: np.ndarray) -> np.ndarray:
        """Per-token acceptance probability (0 for plain decoding)."""
        return self.predictor().predict_acceptance(X)

    def predict_log_sigma(self, X: np.ndarray) -> np.ndarray:
        """Standard deviation of log tokens/s: ensemble spread and measurement scatter."""
        return self.predictor().predict_log_sigma(X)

    def predict_interval(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(low, point, high) tokens/s; the band holds `band` of the probability."""
        return self.predictor().predict_interval(X)


def _shape_of_sweeps(X: np.ndarray, y: np.ndarray, series: np.ndarray) -> KShape | None:
    """The shared shape over K of the draft sweeps among the rows (`kshape.sweep_shape`):
    each labelled series' speed by K, with its baseline (the rows' measured plain decoding)."""
    draft = column(X, "is_draft") > 0
    k = column(X, "k")
    base = column(X, "baseline_tps")
    found: dict[str, tuple[dict[int, float], float]] = {}
    for i in np.flatnonzero(draft & (series != "")):
        k_tps, _ = found.setdefault(str(series[i]), ({}, float(base[i])))
        k_tps[int(k[i])] = float(y[i])
    return sweep_shape(found.values())


def residual_trees(gbm: GradientBoostingRegressor, n_features: int) -> ResidualTrees:
    """A fitted one-output gradient-boosted regressor's trees as padded numpy arrays."""
    trees = [est.tree_ for est in gbm.estimators_[:, 0]]
    n_nodes = max(t.node_count for t in trees)
    shape = (len(trees), n_nodes)
    feature = np.zeros(shape, dtype=np.intp)
    threshold = np.zeros(shape)
    left = np.full(shape, -1, dtype=np.intp)
    right = np.full(shape, -1, dtype=np.intp)
    value = np.zeros(shape)
    for i, t in enumerate(trees):
        n = t.node_count
        split = t.children_left[:n] >= 0
        feature[i, :n] = np.where(split, t.feature[:n], 0)
        threshold[i, :n] = t.threshold[:n]
        left[i, :n] = t.children_left[:n]
        right[i, :n] = t.children_right[:n]
        value[i, :n] = t.value[:n, 0, 0]
    init = float(np.ravel(gbm.init_.predict(np.zeros((1, n_features))))[0])
    return ResidualTrees(
        init=init,
        rate=float(gbm.learning_rate),
        feature=feature,
        threshold=threshold,
        left=left,
        right=right,
        value=value,
        depth=max(int(t.max_depth) for t in trees),
    )
