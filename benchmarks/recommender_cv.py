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

import numpy as np
from specreg.recommender.costmodel import predict_tps
from specreg.recommender.evaluate import K_LOSS_TOLERANCE, CVReport, grouped_cv, training_set
from specreg.recommender.model import SpeculationRegressor
from specreg.recommender.prior import load_prior, load_sweep_series


def shape_ceiling(model: SpeculationRegressor) -> float:
    """Share of sweeps where the cost-model curve, fitted to that sweep itself, picks a good K."""
    data = training_set(load_prior().observations)
    sweeps = {s.series: s for s in load_sweep_series()}
    good = []
    for name, sweep in sweeps.items():
        rows = np.flatnonzero(data.series == name)
        X, y = data.X[rows], data.y[rows]
        best = None
        for shift in np.linspace(-6, 6, 121):
            tps, _ = predict_tps(X, model.params_, shift)
            level = np.median(np.log(y) - np.log(tps))
            err = np.abs(np.log(y) - np.log(tps) - level).sum()
            if best is None or err < best[0]:
                best = (err, tps)
        assert best is not None
        k = int(X[int(np.argmax(best[1])), 12])
        good.append(sweep.k_tps[k] >= (1 - K_LOSS_TOLERANCE) * max(sweep.k_tps.values()))
    return float(np.mean(good))


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
    ceiling = shape_ceiling(full)
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
        f"scatter (log tokens/s): sweep levels around the fit sd {between:.2f}, points around "
        f"their sweep's level sd {within:.2f}"
    )
    print(f"({seconds:.0f} s)")


if __name__ == "__main__":
    main()
