"""Does `recommend`'s first choice of K beat a constant K on targets it has never seen?

Leave-one-family-out over the shipped reference-host K sweeps (recommender/data/
epyc_sweeps_bestk.csv): every target of one family (7B-, 14B-, 32B-class dense, every MoE) is
held out of the fit and of the evidence at once, and the K `recommend` picks for each of that
family's sweeps is scored against what the sweep measured. The pick goes through recommend's
own stages (`scoring.score_configs`: the model, the sweeps' shape over K, runs of its kind,
runs of exactly it, the bound of speculation) for the pair as recommend sees it on the stated
reference host (460 GB/s, 96 cores, no local runs): its K grid is 2-32.

Only sweeps that keep the bound of linear speculation are scored: from K1 to K2 a pair's
speed can rise at most (K2 + 1) / (K1 + 1), and a sweep that rises faster measured its K
values under different conditions (`kshape.bound_breaks`); the ones left out are printed with
the pair of K that breaks it. A pick is scored by interpolating between the measured K on
either side of it (plain decoding, the sweep's baseline, at K = 0; the largest measured K's
speed beyond it), as the share of the sweep's best throughput it loses; beside it the loss of
every constant K and of the users' rule of thumb (24 for 32B-class, 16 for 70B-class, else 8).
The best constant K is chosen on these very sweeps (in-sample: a bound on any fixed rule).

The held-out sweeps outside the shipped data (benchmarks/data/holdout_sweeps.csv, 14-72B) are
scored the same way with the model fitted on all of the shipped prior.

    python benchmarks/k_choice.py [--members N] [--verify reference|flat] [--no-shape] [--json]

`--verify flat` scores the verify model this change replaced (a soft roofline, flat to K of
16-32 on the reference host) in place of the reference host's measured curve; `--no-shape`
leaves out the pull towards the sweeps' shared shape over K.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from specreg.host.facts import REFERENCE_HOST
from specreg.recommender import costmodel
from specreg.recommender.candidates import K_GRID
from specreg.recommender.evaluate import (
    CONSTANT_KS,
    fit_on,
    rule_of_thumb_k,
    target_family,
    training_set,
)
from specreg.recommender.evidence import Identity
from specreg.recommender.features import ConfigFacts, column
from specreg.recommender.kshape import bound_breaks, interpolated
from specreg.recommender.model import SpeculationRegressor
from specreg.recommender.predictor import SpeedPredictor
from specreg.recommender.prior import Observation, load_prior, load_sweep_series
from specreg.recommender.scoring import score_configs
from specreg.terms import Method

HERE = Path(__file__).resolve().parent
# Constant K scored beside the picks: the shipped sweeps' K values and the grid's 12.
CONSTANTS = tuple(sorted({*CONSTANT_KS, 12}))


@dataclass(frozen=True)
class Pick:
    series: str
    family: str
    target_params_b: float
    k_tps: dict[int, float]
    baseline: float
    picked: int

    @property
    def best_k(self) -> int:
        return max(self.k_tps, key=self.k_tps.__getitem__)

    def loss(self, k: int) -> float:
        """Share of the sweep's best throughput lost at K (interpolated)."""
        return 1.0 - interpolated(self.k_tps, k, self.baseline) / max(self.k_tps.values())

    @property
    def rule_k(self) -> int:
        return rule_of_thumb_k(self.target_params_b)


def plain_of(c: ConfigFacts) -> ConfigFacts:
    """Plain decoding of a draft configuration's target."""
    return c.with_(
        method=Method.NONE, k=0, draft_params_b=0.0, draft_bpw=0.0, draft_gb=0.0,
        draft_arch_family="", tok_relation="unknown", experts=c.default_experts,
    )  # fmt: skip


def recommend_k(
    model: SpeedPredictor, base: ConfigFacts, who: Identity, pool: list[Observation]
) -> int:
    """The K recommend picks for the pair of `base` on the stated reference host with no runs
    here: its best draft option over K_GRID after every stage."""
    asked = base.with_(baseline_tps=float("nan"), bandwidth_gbs=REFERENCE_HOST.bandwidth_gbs,
                       physical_cores=REFERENCE_HOST.physical_cores)  # fmt: skip
    configs = [plain_of(asked), *(asked.with_(k=k) for k in K_GRID)]
    scores = score_configs(configs, [who] * len(configs), model, pool)
    return K_GRID[int(np.argmax(scores.mid[1:]))]


def identity(o: Observation) -> Identity:
    return Identity(
        frozenset({o.group}), frozenset({o.draft_key}), REFERENCE_HOST, o.quant, o.draft_quant
    )


def leave_family_out(
    est: SpeculationRegressor, shape: bool
) -> tuple[list[Pick], list[tuple[str, list[tuple[int, int]]]]]:
    """Every family held out of the fit and the evidence; the picks for its sweeps that keep
    the bound, and the sweeps left out with the pairs of K that break it."""
    obs = load_prior().observations
    data = training_set(obs)
    sweeps = {s.series: s for s in load_sweep_series()}
    first: dict[str, Observation] = {}
    for o in obs:
        if o.series and o.config.method is Method.DRAFT:
            first.setdefault(o.series, o)
    family_of = {o.group: target_family(o.config) for o in obs}
    row_family = np.array([family_of[g] for g in data.groups])
    left_out = [(n, bound_breaks(s.k_tps)) for n, s in sorted(sweeps.items())
                if bound_breaks(s.k_tps)]  # fmt: skip
    broken = {n for n, _ in left_out}
    picks: list[Pick] = []
    for family in sorted(set(row_family)):
        held = row_family == family
        names = sorted(n for n in sweeps if n in first and family_of[first[n].group] == family)
        names = [n for n in names if n not in broken]
        if not names:
            continue
        model = fit_on(est, data, ~held).predictor()
        if not shape:
            model = dataclasses.replace(model, k_shape=None)
        pool = [o for o in obs if family_of[o.group] != family]
        for name in names:
            o = first[name]
            picks.append(
                Pick(name, family, o.config.target_params_b, sweeps[name].k_tps,
                     o.config.baseline_tps, recommend_k(model, o.config, identity(o), pool))
            )  # fmt: skip
    return picks, left_out


def holdout(
    est: SpeculationRegressor, shape: bool
) -> tuple[list[Pick], list[tuple[str, list[tuple[int, int]]]]]:
    """The held-out sweeps outside the shipped data, with the model fitted on all of it."""
    spec = importlib.util.spec_from_file_location("recommender_cv", HERE / "recommender_cv.py")
    assert spec is not None and spec.loader is not None
    cv = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = cv
    spec.loader.exec_module(cv)
    obs = list(load_prior().observations)
    model = fit_on(est, training_set(obs)).predictor()
    if not shape:
        model = dataclasses.replace(model, k_shape=None)
    picks, left_out = [], []
    for base, k_tps, name in cv.holdout_sweeps():
        if breaks := bound_breaks(k_tps):
            left_out.append((name, breaks))
            continue
        who = Identity(frozenset({name}), frozenset({name + "|draft"}), REFERENCE_HOST)
        picks.append(Pick(name, target_family(base), base.target_params_b, k_tps,
                          base.baseline_tps, recommend_k(model, base, who, obs)))  # fmt: skip
    return picks, left_out


def summary(picks: list[Pick]) -> dict[str, Any]:
    constants = {k: float(np.mean([p.loss(k) for p in picks])) for k in CONSTANTS}
    best = min(constants, key=constants.__getitem__)
    return {
        "series": len(picks),
        "recommend_loss": float(np.mean([p.loss(p.picked) for p in picks])),
        "rule_of_thumb_loss": float(np.mean([p.loss(p.rule_k) for p in picks])),
        "constant_k_loss": {str(k): v for k, v in constants.items()},
        "best_constant_k": best,
        "best_constant_k_loss": constants[best],
    }


def table(title: str, picks: list[Pick], left_out: list[tuple[str, list[tuple[int, int]]]]) -> str:
    s = summary(picks)
    lines = [f"## {title}", "",
             "| series | family | recommend's K | best measured K | loss | rule's K | its loss |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for p in picks:
        lines.append(
            f"| {p.series} | {p.family} | {p.picked} | {p.best_k} | {p.loss(p.picked):.3f} | "
            f"{p.rule_k} | {p.loss(p.rule_k):.3f} |"
        )
    consts = ", ".join(f"K={k} {v:.3f}" for k, v in s["constant_k_loss"].items())
    beats = s["recommend_loss"] < s["best_constant_k_loss"]
    lines += [
        "",
        f"mean throughput loss over {s['series']} series: recommend {s['recommend_loss']:.3f}; "
        f"best constant K={s['best_constant_k']} {s['best_constant_k_loss']:.3f}; rule of thumb "
        f"{s['rule_of_thumb_loss']:.3f} (goal: recommend below the best constant K: "
        f"{'met' if beats else 'MISSED'})",
        f"every constant K: {consts}",
    ]
    fams = sorted({p.family for p in picks})
    for fam in fams if len(fams) > 1 else ():
        f = summary([p for p in picks if p.family == fam])
        lines.append(
            f"  {fam}: {f['series']} series, recommend {f['recommend_loss']:.3f}, best constant "
            f"K={f['best_constant_k']} {f['best_constant_k_loss']:.3f}, rule "
            f"{f['rule_of_thumb_loss']:.3f}"
        )
    lines.append(f"left out ({len(left_out)}: they break the bound of linear speculation):")
    for name, breaks in left_out:
        pairs = ", ".join(f"K={a} -> K={b}" for a, b in breaks)
        lines.append(f"  {name}: {pairs} rises faster than (K2 + 1) / (K1 + 1)")
    return "\n".join(lines)


def flat_verify_ratio(X: np.ndarray, p: costmodel.CostParams) -> np.ndarray:
    """The verify model this change replaced: the soft roofline (flat to K of 16-32 on the
    reference host) where calibrate measured nothing."""
    measured = column(X, "verify_ratio")
    share = costmodel.compute_share(X, p, column(X, "target_bpw"), column(X, "target_active_b"))
    k = column(X, "k")
    modelled = costmodel.pass_ratio(k + 1.0, share)
    rows = k * np.nan_to_num(column(X, "output_share"))
    return np.where(np.isfinite(measured) & (measured > 0), measured, modelled) + rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--members", type=int, default=0, help="ensemble members per fit")
    ap.add_argument("--verify", choices=("reference", "flat"), default="reference")
    ap.add_argument("--no-shape", action="store_true")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.verify == "flat":
        costmodel.verify_ratio = flat_verify_ratio  # type: ignore[assignment]
    est = SpeculationRegressor(n_members=args.members, random_state=0)
    t0 = time.perf_counter()
    lfo, lfo_out = leave_family_out(est, not args.no_shape)
    held, held_out = holdout(est, not args.no_shape)
    if args.json:
        print(json.dumps({
            "leave_family_out": {**summary(lfo), "left_out": lfo_out, "picks": [
                {"series": p.series, "family": p.family, "picked_k": p.picked,
                 "best_k": p.best_k, "loss": p.loss(p.picked)} for p in lfo]},
            "holdout": {**summary(held), "left_out": held_out},
            "verify": args.verify, "shape": not args.no_shape,
        }, indent=1))  # fmt: skip
        return
    print(f"verify model: {args.verify}; sweeps' shape over K: {not args.no_shape}\n")
    print(table("leave-one-family-out, shipped reference-host sweeps", lfo, lfo_out))
    print()
    print(table("held-out sweeps outside the shipped data (fit on all of it)", held, held_out))
    print(f"\n({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
