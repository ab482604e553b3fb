"""Grouped cross-validation of the recommender's speed model on the shipped prior data.

Every target model is held out in turn (all its runs, every quant); the model fitted on the rest
picks K for each of the held-out target's K sweeps (epyc_sweeps_bestk.csv) and predicts the
speedup of each of its speculative runs. Printed next to the reports' rule of thumb (K=24 for
32B-class targets, K=8 for 7B-class ones) in the same run, and next to an in-sample ceiling: the
best any curve of the cost model's shape does when its acceptance is fitted on the held-out
sweep itself (what single, noisy measurements per K allow at all).

Run: python benchmarks/recommender_cv.py [--members N] [--json]
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass

import numpy as np

from specreg.recommender.costmodel import predict_tps
from specreg.recommender.evaluate import K_LOSS_TOLERANCE, CVReport, grouped_cv, training_set
from specreg.recommender.features import FEATURES
from specreg.recommender.model import SpeculationRegressor
from specreg.recommender.prior import load_prior, load_sweep_series


@dataclass(frozen=True)
class SweepFit:
    """One measured K sweep and the cost-model curve fitted to it in-sample."""

    ks: np.ndarray
    measured: np.ndarray
    fitted: np.ndarray


def shape_fits(model: SpeculationRegressor) -> list[SweepFit]:
    """Fit every sweep in-sample: the shared constants, plus its own acceptance and level."""
    data = training_set(load_prior().observations)
    sweeps = {s.series: s for s in load_sweep_series()}
    k_col = data.X[:, FEATURES.index("k")]
    out = []
    for name, sweep in sweeps.items():
        rows = np.flatnonzero(data.series == name)
        X = data.X[rows]
        ks = k_col[rows].astype(int)
        y = np.array([sweep.k_tps[k] for k in ks])
        best: tuple[float, np.ndarray] | None = None
        for shift in np.linspace(-6, 6, 121):
            tps, _ = predict_tps(X, model.params_, shift)
            level = np.mean(np.log(y) - np.log(tps))
            err = float(np.sum((np.log(y) - np.log(tps) - level) ** 2))
            if best is None or err < best[0]:
                best = (err, tps * np.exp(level))
        assert best is not None
        out.append(SweepFit(ks=ks, measured=y, fitted=best[1]))
    return out


def within_tolerance(measured: np.ndarray, pick: int) -> bool:
    return bool(measured[pick] >= (1 - K_LOSS_TOLERANCE) * measured.max())


def noise_sd(fits: list[SweepFit]) -> float:
    """Scatter of single measurements around their sweep's curve (log, two fitted dof each)."""
    resid = np.concatenate([np.log(f.measured / f.fitted) for f in fits])
    dof = sum(len(f.ks) - 2 for f in fits)
    return float(np.sqrt(np.sum(resid**2) / dof))


def perfect_model_ceiling(fits: list[SweepFit], sd: float, trials: int = 400) -> float:
    """How often a model that knows every true curve passes the K criterion.

    The fitted curves stand in for the truth; each trial draws single measurements around them
    with the data's own scatter, and the true best K is scored against the measured best, as
    the cross-validation scores the model's pick.
    """
    rng = np.random.default_rng(0)
    hits = [
        within_tolerance(
            f.fitted * np.exp(rng.normal(0.0, sd, len(f.ks))), int(np.argmax(f.fitted))
        )
        for _ in range(trials)
        for f in fits
    ]
    return float(np.mean(hits))


def perfect_model_mape(sd: float) -> float:
    """Speedup MAPE of exact predictions scored against measurements with log scatter sd."""
    eps = np.random.default_rng(0).normal(0.0, sd, 200_000)
    return float(np.mean(np.abs(np.exp(-eps) - 1.0)))


def best_constant_k(fits: list[SweepFit]) -> tuple[int, float]:
    """The one K that passes the criterion on most sweeps, chosen in-sample (a bound on rules)."""
    shares = {
        k: float(
            np.mean([k in f.ks and within_tolerance(f.measured, list(f.ks).index(k)) for f in fits])
        )
        for k in sorted({int(k) for f in fits for k in f.ks})
    }
    k = max(shares, key=lambda k: shares[k])
    return k, shares[k]


def level_scatter(model: SpeculationRegressor) -> tuple[float, float]:
    """Spread of each sweep's level around the fit, and of its points around its own level.

    The first is what a held-out target's speedup cannot be better than without its own runs
    (baselines measured on other prompts than the speed tests); the second is single-run noise.
    """
    data = training_set(load_prior().observations)
    r = np.log(data.y) - np.log(model.predict_structural(data.X))
    names = sorted({s for s in data.series if s})
    levels = [float(np.median(r[data.series == s])) for s in names]
    within = [float(np.std(r[data.series == s] - lv)) for s, lv in zip(names, levels, strict=True)]
    return float(np.std(levels)), float(np.mean(within))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--members", type=int, default=3, help="ensemble members per fit")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    data = training_set(load_prior().observations)
    est = SpeculationRegressor(n_members=args.members, random_state=0)
    t0 = time.perf_counter()
    report: CVReport = grouped_cv(est, data, load_sweep_series())
    seconds = time.perf_counter() - t0
    full = SpeculationRegressor(n_members=0).fit(
        data.X, data.y, groups=data.groups, acceptance=data.acceptance, series=data.series
    )
    fits = shape_fits(full)
    ceiling = float(np.mean([within_tolerance(f.measured, int(np.argmax(f.fitted))) for f in fits]))
    sd = noise_sd(fits)
    perfect = perfect_model_ceiling(fits, sd)
    const_k, const_share = best_constant_k(fits)
    between, within = level_scatter(full)
    out = {
        "folds": report.n_folds,
        "sweeps": len(report.series),
        "k_within_10pct": report.k_within_tolerance,
        "rule_of_thumb_k_within_10pct": report.rule_within_tolerance,
        "median_k_loss": report.median_k_loss,
        "median_rule_loss": report.median_rule_loss,
        "speedup_mape_draft_runs": report.speedup_mape_draft,
        "speedup_mape_all_speculative_runs": report.speedup_mape,
        "speedup_median_ape_all": float(np.median(report.speedup_ape)),
        "band80_coverage": report.coverage,
        "in_sample_shape_ceiling": ceiling,
        "single_measurement_sd_log": sd,
        "perfect_model_k_within_10pct": perfect,
        "perfect_model_speedup_mape": perfect_model_mape(sd),
        # the measured sd includes any misfit of the curve shape: how the bound moves if less
        # of it were noise
        "perfect_model_k_within_10pct_at_sd": {
            f"{x:.2f}": perfect_model_ceiling(fits, x) for x in (0.05, 0.10, 0.15, 0.20)
        },
        "best_constant_k": const_k,
        "best_constant_k_within_10pct": const_share,
        "sweep_level_sd_log": between,
        "within_sweep_sd_log": within,
        "seconds": seconds,
    }
    if args.json:
        print(json.dumps(out, indent=1))
        return
    print(f"grouped CV by target: {report.n_folds} folds, {len(report.series)} K sweeps")
    print(f"{'series':58s} {'best':>8s} {'model':>12s} {'rule':>12s}")
    for s in report.series:
        print(
            f"{s.series[:58]:58s} K={s.best_k:<3d}  K={s.picked_k:<3d}{-s.loss:+6.0%}  "
            f"K={s.rule_k:<3d}{-s.rule_loss:+6.0%}"
        )
    print()
    print(
        f"picked K within 10% of the measured best: model {report.k_within_tolerance:.0%}, "
        f"rule of thumb {report.rule_within_tolerance:.0%} (target >= 80%)"
    )
    print(
        f"median throughput lost: model {report.median_k_loss:.1%}, "
        f"rule of thumb {report.median_rule_loss:.1%}"
    )
    print(
        f"speedup MAPE: {report.speedup_mape_draft:.0%} on draft runs (target <= 30%), "
        f"{report.speedup_mape:.0%} on all speculative runs "
        f"(median APE {np.median(report.speedup_ape):.0%})"
    )
    print(f"80% band coverage on held-out runs: {report.coverage:.0%}")
    print(f"in-sample ceiling of the cost-model shape (K within 10%): {ceiling:.0%}")
    print(
        f"best single K for every sweep, chosen in-sample: K={const_k}, "
        f"{const_share:.0%} within 10%"
    )
    print(
        f"a perfect model (knows every true curve) scored against single measurements with the "
        f"data's scatter (sd {sd:.2f} log): K within 10% {perfect:.0%}, speedup MAPE "
        f"{out['perfect_model_speedup_mape']:.0%}"
    )
    at_sd = ", ".join(
        f"sd {x}: {v:.0%}" for x, v in out["perfect_model_k_within_10pct_at_sd"].items()
    )
    print(f"  the same if less of that scatter were noise: {at_sd}")
    print(
        f"scatter (log tokens/s): sweep levels around the fit sd {between:.2f}, points around "
        f"their sweep's level sd {within:.2f}"
    )
    print(f"({seconds:.0f} s)")


if __name__ == "__main__":
    main()
