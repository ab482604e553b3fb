"""Does the recommender's K choice transfer to targets it has not seen?

Two tests, both scored by throughput regret against each sweep's best measured K
(`1 - tps(picked K) / tps(best K)`), printed beside the regret of every constant K and of the
user's rule of thumb (K=24 for 32B-class targets, K=16 for 70B-class, K=8 for 7B-class):

1. leave-family-out on the shipped prior: every target of one family (7B-, 14B-, 32B-class
   dense, every MoE) is held out of the fit at once, and the model fitted on the rest picks K
   for each of that family's K sweeps (epyc_sweeps_bestk.csv);
2. held-out sweeps outside the shipped data (benchmarks/data/holdout_sweeps.csv: 70-72B, 32B at
   F16/Q8_0, Qwen3-32B, Gemma-3-27B, 14B), with the model fitted on all of the prior.

The best constant K is chosen in-sample on each table's own sweeps (a bound on any fixed rule).
`--grouped` adds the leave-one-target-out speedup error of every speculative run.

Run: python benchmarks/recommender_cv.py [--members N] [--grouped] [--json]
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np

from specreg.recommender.evaluate import (
    CONSTANT_KS,
    RegretReport,
    SweepScore,
    fit_on,
    grouped_cv,
    leave_family_out,
    score_sweep,
    target_family,
    training_set,
)
from specreg.recommender.features import (
    REFERENCE_BANDWIDTH_GBS,
    REFERENCE_CORES,
    ConfigFacts,
    feature_matrix,
)
from specreg.recommender.model import SpeculationRegressor
from specreg.recommender.prior import load_prior, load_sweep_series
from specreg.recommender.quant import bits_per_weight
from specreg.terms import Method, arch_family

HOLDOUT = Path(__file__).resolve().parent / "data" / "holdout_sweeps.csv"


def holdout_sweeps() -> list[tuple[ConfigFacts, dict[int, float], str]]:
    """(configuration at K=0, measured tokens/s by K, series) for each held-out sweep."""
    out = []
    with HOLDOUT.open() as fh:
        for r in csv.DictReader(fh):
            params = float(r["target_params_b"])
            bpw = bits_per_weight(r["target_quant"]) or 16.0
            draft_params = float(r["draft_params_b"])
            draft_gb = float(r["draft_size_gb"])
            same = r["draft_arch"] == r["target_arch"]
            c = ConfigFacts(
                bandwidth_gbs=REFERENCE_BANDWIDTH_GBS,
                physical_cores=REFERENCE_CORES,
                target_params_b=params,
                target_active_b=params,
                target_bpw=bpw,
                target_gb=params * bpw / 8,
                target_arch_family=arch_family(r["target_arch"]),
                target_is_moe=False,
                target_is_hybrid=False,
                default_experts=0,
                method=Method.DRAFT,
                k=0,
                experts=0,
                temperature=0.0,
                task=r["task"],
                draft_params_b=draft_params,
                draft_bpw=draft_gb * 8 / draft_params,
                draft_gb=draft_gb,
                draft_arch_family=arch_family(r["draft_arch"]),
                tok_relation="identical" if same else "unknown",
                baseline_tps=float(r["baseline_tps"]) if r["baseline_tps"] else math.nan,
            )
            k_tps = {}
            for part in r["k_tps"].split(";"):
                k, _, v = part.partition("=")
                k_tps[int(k.lstrip("k"))] = float(v)
            out.append((c, k_tps, r["series"]))
    return out


def holdout_report(model: SpeculationRegressor) -> RegretReport:
    scores: list[SweepScore] = []
    for base, k_tps, name in holdout_sweeps():
        ks = sorted(k_tps)
        X = feature_matrix(base.with_(k=k) for k in ks)
        scores.append(
            score_sweep(
                model.predict,
                X,
                ks,
                k_tps,
                series=name,
                family=target_family(base),
                target_params_b=base.target_params_b,
            )
        )
    return RegretReport(tuple(scores))


def table(title: str, report: RegretReport) -> list[str]:
    lines = [title, f"{'series':52s} {'best':>6s} {'model':>12s} {'rule':>12s}"]
    for s in report.scores:
        lines.append(
            f"{s.series[:52]:52s} K={s.best_k:<3d} K={s.picked_k:<3d}{-s.model_regret:+6.0%} "
            f"K={s.rule_k:<3d}{-s.rule_regret:+6.0%}"
        )
    k, best = report.best_constant
    consts = "  ".join(f"K={k}: {v:.1%}" for k, v in report.constant_regret.items())
    lines += [
        f"mean regret: model {report.mean_regret:.1%} | rule of thumb "
        f"{report.rule_mean_regret:.1%} | best constant K={k} {best:.1%}",
        f"  every constant K: {consts}",
    ]
    fams = report.by_family()
    if len(fams) > 1:
        for fam, rep in fams.items():
            fk, fv = rep.best_constant
            lines.append(
                f"  {fam:10s} {len(rep.scores):2d} sweeps: model {rep.mean_regret:.1%}, rule "
                f"{rep.rule_mean_regret:.1%}, best constant K={fk} {fv:.1%}"
            )
    return lines


def as_json(report: RegretReport) -> dict[str, Any]:
    k, best = report.best_constant
    return {
        "sweeps": len(report.scores),
        "model_mean_regret": report.mean_regret,
        "rule_of_thumb_mean_regret": report.rule_mean_regret,
        "constant_k_mean_regret": {str(k): v for k, v in report.constant_regret.items()},
        "best_constant_k": k,
        "best_constant_k_mean_regret": best,
        "picks": [
            {"series": s.series, "family": s.family, "best_k": s.best_k, "picked_k": s.picked_k,
             "regret": s.model_regret, "rule_k": s.rule_k, "rule_regret": s.rule_regret}
            for s in report.scores
        ],
    }  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--members", type=int, default=2, help="ensemble members per fit")
    ap.add_argument("--grouped", action="store_true", help="also leave-one-target-out MAPE")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    data = training_set(load_prior().observations)
    est = SpeculationRegressor(n_members=args.members, random_state=0)
    t0 = time.perf_counter()
    lfo = leave_family_out(est, data, load_sweep_series())
    full = fit_on(est, data)
    held = holdout_report(full)
    out: dict[str, Any] = {
        "leave_family_out": as_json(lfo),
        "holdout_sweeps": as_json(held),
        "constant_ks": list(CONSTANT_KS),
    }
    if args.grouped:
        report = grouped_cv(est, data, load_sweep_series())
        out["grouped"] = {
            "speedup_mape_draft_runs": report.speedup_mape_draft,
            "speedup_mape_all_speculative_runs": report.speedup_mape,
            "band80_coverage": report.coverage,
        }
    out["seconds"] = time.perf_counter() - t0
    if args.json:
        print(json.dumps(out, indent=1))
        return
    lines = table("leave-family-out on the shipped prior (a family never seen in the fit):", lfo)
    lines.append("")
    lines += table("held-out sweeps outside the shipped data (fit on all of it):", held)
    if args.grouped:
        g = out["grouped"]
        lines += [
            "",
            f"leave-one-target-out speedup MAPE: {g['speedup_mape_draft_runs']:.0%} on draft "
            f"runs, {g['speedup_mape_all_speculative_runs']:.0%} on all speculative runs; 80% "
            f"band coverage {g['band80_coverage']:.0%}",
        ]
    for name, rep in (("leave-family-out", lfo), ("held-out sweeps", held)):
        k, best = rep.best_constant
        beats = rep.mean_regret < min(rep.rule_mean_regret, best)
        lines.append(
            f"{name}: model regret {rep.mean_regret:.1%} "
            f"{'<' if beats else '>='} min(rule of thumb {rep.rule_mean_regret:.1%}, best "
            f"constant K={k} {best:.1%})"
        )
    lines.append(f"({out['seconds']:.0f} s)")
    print("\n".join(lines))
    if not np.isfinite(lfo.mean_regret):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
