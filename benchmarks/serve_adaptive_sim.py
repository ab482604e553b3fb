"""Adaptive serving on paper: the reference host's 30-480B K sweeps as the policy's world.

Each configuration the shipped sweeps (recommender/data/epyc_sweeps.csv, via the prior loader:
copied rows dropped, roles mapped to tasks) measured for a target and task is an arm whose
per-request decode throughput is log-normal around the measured figure. Its scatter is the
sweeps' own: the spread of log t/s between neighbouring K of one series (second differences,
printed), split into a per-prompt factor every configuration shares and a per-configuration part.
A seeded mixed stream of the target's tasks goes through serve's own policy code
(specreg.serve.policy: the same candidate picking, priors from the shipped recommender's
prediction and band, Thompson sampling, retirement, K moving outward through the measured K),
with a share of requests decoding next to another one (slower, and weighted down).

Printed per target: the room (per-request oracle over the best fixed configuration in
hindsight), then stream throughput of adaptive, the best fixed configuration (one per task,
chosen in hindsight), today's static route (the recommender's top prediction per task) and the
oracle, and the cumulative regret against the oracle. No model runs; nothing is measured here.

    python3 benchmarks/serve_adaptive_sim.py [--requests 400] [--seeds 5]
"""

from __future__ import annotations

import argparse
import math
from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from specreg.recommender.features import feature_matrix
from specreg.recommender.prior import Observation, load_prior
from specreg.recommender.train import cached_fit
from specreg.serve.policy import (
    KIND_DRAFT,
    KIND_EXPERTS,
    KIND_NGRAM,
    KIND_PLAIN,
    Candidate,
    TaskPolicy,
    pick_candidates,
)
from specreg.terms import Method

MIN_PARAMS_B = 30.0
PROMPT_SHARE = 0.5  # of the per-request log variance, the part every configuration shares
CONCURRENT_SHARE = 0.15  # requests that decode next to another one
PEERS = True  # --no-peers: each task's policy learns alone (as before cross-task evidence)
CONCURRENT_SLOWDOWN = 0.6  # ... and run this much as fast


@dataclass(frozen=True)
class Arm:
    candidate: Candidate
    tps: float  # the sweep's measured figure: the arm's true mean
    spread: float | None  # scatter of log t/s between its copies, where measured twice


def _kind(o: Observation) -> tuple[str, str | None, int | None]:
    c = o.config
    reduced = c.default_experts and c.experts < c.default_experts
    if c.method is Method.DRAFT:
        # the series without its role: one drafter at one expert budget
        return KIND_DRAFT, "|".join((o.series or "draft").split("|")[1:]), c.k
    if c.method is Method.NGRAM:
        return KIND_NGRAM, "lookup" + (f"-e{c.experts}" if reduced else ""), None
    return (KIND_EXPERTS if reduced else KIND_PLAIN), None, None


def world(min_params_b: float = MIN_PARAMS_B) -> dict[str, dict[str, list[Arm]]]:
    """target -> task -> arms (measured configurations with the recommender's prior)."""
    model = cached_fit()
    obs = [
        o
        for o in load_prior().observations
        if o.source == "sweep" and o.config.target_params_b >= min_params_b
    ]
    lo, mid, hi = model.predict_interval(feature_matrix([o.config for o in obs]))
    # One configuration measured under several roles (a copy with other figures): one arm, its
    # mean the geometric mean of the figures and their scatter its own spread.
    merged: dict[tuple[str, str, str], list[int]] = defaultdict(list)
    for i, o in enumerate(obs):
        merged[(o.group, o.config.task, o.note)].append(i)
    out: dict[str, dict[str, list[Arm]]] = defaultdict(lambda: defaultdict(list))
    for (group, task, note), idx in merged.items():
        o = obs[idx[0]]
        kind, family, k = _kind(o)
        logs = np.log([obs[i].tps for i in idx])
        cand = Candidate(
            key=note,
            label=note,
            prior_tps=float(np.exp(np.mean(np.log(mid[idx])))),
            prior_lo=float(np.exp(np.mean(np.log(lo[idx])))),
            prior_hi=float(np.exp(np.mean(np.log(hi[idx])))),
            prior_band=model.band,
            k=k,
            family=family,
            kind=kind,
        )
        spread = float(np.std(logs, ddof=1)) if len(idx) > 1 else None
        out[group][task].append(Arm(cand, float(np.exp(np.mean(logs))), spread))
    return {
        g: {t: arms for t, arms in tasks.items() if len(arms) >= 3}
        for g, tasks in out.items()
        if any(len(a) >= 3 for a in tasks.values())
    }


def sweep_sigma() -> float:
    """Scatter of one measurement: log t/s second differences along K within each series."""
    series: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for o in load_prior().observations:
        if o.source == "sweep" and o.series and o.config.k:
            series[o.series].append((o.config.k, math.log(o.tps)))
    diffs = []
    for points in series.values():
        ys = [y for _, y in sorted(points)]
        diffs += [ys[i - 1] - 2 * ys[i] + ys[i + 1] for i in range(1, len(ys) - 1)]
    # var(x[i-1] - 2 x[i] + x[i+1]) = 6 sigma^2 for independent scatter on a smooth curve
    return float(np.sqrt(np.mean(np.square(diffs)) / 6)) if diffs else 0.2


def simulate(
    tasks: dict[str, list[Arm]], n: int, seed: int, sigma: float
) -> dict[str, np.ndarray | list[str]]:
    rng = np.random.default_rng(seed)
    names = sorted(tasks)
    policies: dict[str, TaskPolicy] = {}
    by_key: dict[str, dict[str, Arm]] = {}
    for task in names:
        arms = tasks[task]
        by_key[task] = {a.candidate.key: a for a in arms}
        offers = [a.candidate for a in arms]
        ladders = sorted({a.candidate.k for a in arms if a.candidate.k is not None})

        def k_source(family: str, k: int, near: Candidate, _offers=offers) -> Candidate | None:
            return next((o for o in _offers if o.family == family and o.k == k), None)

        policies[task] = TaskPolicy(
            f"sim/{task}",
            pick_candidates(offers),
            seed=seed,
            k_ladder=ladders,
            k_source=k_source,
        )
    if PEERS:  # as serve's Router: the tasks of one target share a configuration's error
        for p in policies.values():
            p.peers = list(policies.values())
    shared = sigma * math.sqrt(PROMPT_SHARE)
    own = sigma * math.sqrt(1 - PROMPT_SHARE)
    stream = rng.choice(names, size=n)
    chosen = np.empty(n)
    oracle = np.empty(n)
    static = np.empty(n)
    every: dict[str, list[np.ndarray]] = {t: [] for t in names}
    for i, task in enumerate(stream):
        arms = tasks[task]
        means = np.log([a.tps for a in arms])
        spread = np.array([own if a.spread is None else max(a.spread, own) for a in arms])
        draw = np.exp(means + rng.normal(0, shared) + rng.normal(0, 1, size=len(arms)) * spread)
        busy = rng.random() < CONCURRENT_SHARE
        every[task].append(draw)
        oracle[i] = draw.max()
        static[i] = draw[int(np.argmax([a.candidate.prior_tps for a in arms]))]
        decision = policies[task].choose()
        j = next(x for x, a in enumerate(arms) if a.candidate.key == decision.key)
        chosen[i] = draw[j]
        seen = draw[j] * (CONCURRENT_SLOWDOWN if busy else 1.0)
        policies[task].observe(decision.key, seen, concurrency=2 if busy else 1)
    # best fixed configuration per task, in hindsight (its rewards on the same requests)
    fixed = np.empty(n)
    for task in names:
        rows = np.array(every[task])
        best = int(np.argmax(1.0 / np.mean(1.0 / rows, axis=0)))  # stream throughput per arm
        fixed[stream == task] = rows[:, best]
    return {
        "adaptive": chosen,
        "oracle": oracle,
        "fixed": fixed,
        "static": static,
        "stream": list(stream),
        "policies": [policies[t].to_json() for t in names],  # type: ignore[dict-item]
    }


def throughput(tps: np.ndarray) -> float:
    """A stream's tokens/s when every request generates the same number of tokens."""
    return float(len(tps) / np.sum(1.0 / tps))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--min-params", type=float, default=MIN_PARAMS_B)
    ap.add_argument("--no-peers", action="store_true", help="no evidence across a target's tasks")
    args = ap.parse_args()
    global PEERS
    PEERS = not args.no_peers
    sigma = sweep_sigma()
    print(
        f"per-request scatter of log t/s: {sigma:.3f} (from the sweeps' K curves; "
        f"{PROMPT_SHARE:.0%} shared by every configuration of a request); "
        f"{CONCURRENT_SHARE:.0%} of requests decode next to another (x{CONCURRENT_SLOWDOWN})"
    )
    print(f"{args.requests} requests per stream, seeds 0-{args.seeds - 1}; t/s = stream throughput")
    head = (
        f"{'target':34} {'tasks':18} {'arms':>4} {'room':>5} {'adaptive':>8} {'fixed':>7} "
        f"{'static':>7} {'oracle':>7} {'ad/fix':>6} {'ad/orc':>6} {'regret@50':>9} "
        f"{'@200':>6} {'@end':>6}"
    )
    print(head)
    totals: dict[str, list[float]] = defaultdict(list)
    for target, tasks in sorted(world(args.min_params).items()):
        res = [simulate(tasks, args.requests, s, sigma) for s in range(args.seeds)]
        ad = np.mean([throughput(r["adaptive"]) for r in res])  # type: ignore[arg-type]
        fx = np.mean([throughput(r["fixed"]) for r in res])  # type: ignore[arg-type]
        st = np.mean([throughput(r["static"]) for r in res])  # type: ignore[arg-type]
        orc = np.mean([throughput(r["oracle"]) for r in res])  # type: ignore[arg-type]
        # regret in seconds per 100 generated tokens, summed over the stream so far
        regret = np.mean(
            [np.cumsum(100 / r["adaptive"] - 100 / r["oracle"]) for r in res],  # type: ignore[operator]
            axis=0,
        )
        n_arms = sum(len(a) for a in tasks.values())
        print(
            f"{target[:34]:34} {','.join(sorted(tasks))[:18]:18} {n_arms:4d} {orc / fx:5.2f} "
            f"{ad:8.2f} {fx:7.2f} {st:7.2f} {orc:7.2f} {ad / fx:6.2f} {ad / orc:6.2f} "
            f"{regret[min(50, len(regret)) - 1]:9.0f} {regret[min(200, len(regret)) - 1]:6.0f} "
            f"{regret[-1]:6.0f}"
        )
        for key, value in (("ad/fix", ad / fx), ("ad/orc", ad / orc), ("st/fix", st / fx)):
            totals[key].append(float(value))
    print(
        "geometric means over targets: adaptive/best-fixed "
        f"{math.exp(np.mean(np.log(totals['ad/fix']))):.3f}, adaptive/oracle "
        f"{math.exp(np.mean(np.log(totals['ad/orc']))):.3f}, static/best-fixed "
        f"{math.exp(np.mean(np.log(totals['st/fix']))):.3f}"
    )
    print(
        "regret: cumulative seconds lost per 100 tokens per request against the per-request "
        "oracle (its noise maximum: no policy reaches it)"
    )


if __name__ == "__main__":
    main()
