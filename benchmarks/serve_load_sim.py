"""Serving under load on paper: the reference host (EPYC 9655, NPS4) as the policy's world.

The environment is what the host's owner measured (../shared/notes/peers.md, "Serving under
load on a big CPU host"), as `specreg capacity` would store it:
  - one full instance (96 cores, memory interleaved over the four nodes) with slots: 38.7 /
    19.9 / 13.1 / 8.1 / 4.6 t/s per stream at 1 / 4 / 8 / 16 / 32 streams (Qwen3.6-35B-A3B
    Q8_0), interpolated in log-log between them;
  - four node replicas (24 cores each, memory bound to the node), one slot each: 40.9 t/s
    aggregate when all four decode (10.2 each), batching within a replica as the full
    instance does;
  - speculation: each shipped sweep's best single-stream speedup (recommender/data/
    epyc_sweeps.csv, the 46 series of 30-480B targets), and its published loss under
    concurrency: MTP measured +27 % for one stream and -46 % at four, so a gain shrinks by
    (0.54 / 1.27) per factor of four in the streams decoding on the same memory.
  - a second model where replicas win under load (gemma-4-26B-A4B, August): single stream 33.2
    t/s on the full instance, 14.1 on a node replica; 32 streams 45.6 t/s aggregate on the full
    instance, 79.8 on four node replicas of 8 slots (power laws between those points).
A load pattern (single requests, then bursts of 2, 4, 8, 16 and 32 at once, repeated) goes
through serve's own load-aware policy (specreg.serve.loadpolicy over specreg.serve.policy; a
burst's first request takes the cores on the policy's choice and the rest join it, as serve's
scheduler has them), whose candidates are the four (layout, configuration) pairs; its load
model is the capacity curve above, its priors the single-stream figures. Each request's decode
speed is the environment's, with log-normal scatter (sigma 0.1). The score is the time to serve
the pattern.

Printed for a few of the sweeps' speedups (lowest, quartiles, highest): the layout and
configuration chosen at each load (the policy's best posterior after the run), the time
against the best fixed (layout, configuration) and against the per-load oracle. No model runs.

    python3 benchmarks/serve_load_sim.py [--rounds 30] [--seed 0]
"""

from __future__ import annotations

import argparse
import csv
import math
import statistics
from importlib.resources import files

import numpy as np

from specreg.serve.loadpolicy import LEVELS, LoadModel, LoadPolicy, level_of
from specreg.serve.policy import KIND_DRAFT, KIND_PLAIN, Candidate, TaskPolicy

# per model: the full instance's per-stream t/s at each number of streams, and one node
# replica's at the streams it holds
ENVIRONMENTS: dict[str, tuple[dict[int, float], dict[int, float]]] = {
    "Qwen3.6-35B-A3B Q8_0": (
        {1: 38.7, 4: 19.9, 8: 13.1, 16: 8.1, 32: 4.6},
        {1: 40.9 / 4, 4: 40.9 / 4 * 19.9 / 38.7, 8: 40.9 / 4 * 13.1 / 38.7},
    ),
    "gemma-4-26B-A4B": ({1: 33.2, 32: 45.6 / 32}, {1: 14.1, 8: 79.8 / 32}),
}
ENV = ENVIRONMENTS["Qwen3.6-35B-A3B Q8_0"]
REPLICAS = 4
MTP_ONE, MTP_FOUR = 1.27, 0.54  # speculation's gain at one and four streams (GPU report)
NOISE = 0.1
TOKENS = 256  # per request
PATTERN = (1, 1, 1, 2, 4, 8, 16, 32, 1, 1, 4, 16)  # requests decoding at once, per burst


def per_stream(curve: dict[int, float], streams: float) -> float:
    """Per-stream speed at `streams`, log-log between measured points (and past the last
    two along their slope)."""
    xs = sorted(curve)
    if len(xs) == 1:
        return curve[xs[0]]
    s = max(streams, xs[0])
    pairs = list(zip(xs, xs[1:], strict=False))
    lo, hi = next(((a, b) for a, b in pairs if a <= s <= b), pairs[-1])
    t = math.log(s / lo) / math.log(hi / lo)
    return math.exp((1 - t) * math.log(curve[lo]) + t * math.log(curve[hi]))


def spec_gain(g1: float, streams: float) -> float:
    """A single-stream gain `g1`, shrunk under `streams` decoding on the same memory."""
    return g1 * (MTP_FOUR / MTP_ONE) ** (math.log(max(streams, 1.0)) / math.log(4.0))


def speed(layout: str, speculative: bool, load: int, g1: float) -> float:
    """Per-request decode t/s of a request at `load` requests decoding at once."""
    full, node = ENV
    if layout == "full":
        base = per_stream(full, load)
    else:  # requests spread over the replicas; each replica batches its share
        base = per_stream(node, math.ceil(load / REPLICAS))
    return base * (spec_gain(g1, load) if speculative else 1.0)


CANDIDATES = (("full", False), ("full", True), ("nodes", False), ("nodes", True))


def key(layout: str, speculative: bool) -> str:
    return f"{layout}/{'spec' if speculative else 'plain'}"


def capacity_model(g1: float) -> LoadModel:
    """What `specreg capacity` would have stored: each candidate's per-request speed at each
    level over its speed alone."""
    measured = {
        (key(lay, sp), level): speed(lay, sp, level, g1) / speed(lay, sp, 1, g1)
        for lay, sp in CANDIDATES
        for level in LEVELS
    }
    return LoadModel(lambda n: n, measured=measured, source="capacity")


def simulate(g1: float, rounds: int, seed: int) -> tuple[float, dict[str, float], float, dict]:
    rng = np.random.default_rng(seed)
    cands = [
        Candidate(key(lay, sp), key(lay, sp), speed(lay, sp, 1, g1) * 1.0,
                  speed(lay, sp, 1, g1) * 0.7, speed(lay, sp, 1, g1) * 1.4,
                  kind=KIND_DRAFT if sp else KIND_PLAIN, k=8 if sp else None)
        for lay, sp in CANDIDATES
    ]  # fmt: skip
    policy = LoadPolicy(TaskPolicy("sim", cands, seed=seed), capacity_model(g1))
    # the same scatter for every contender (common random numbers): a burst's time is its
    # slowest request's, so scatter alone would otherwise favour whoever drew less of it
    bursts = [(load, rng.normal(0, NOISE, load)) for _ in range(rounds) for load in PATTERN]

    def burst_time(name: str, load: int, noise: np.ndarray) -> float:
        lay, sp = name.split("/")
        return float(max(TOKENS / (speed(lay, sp == "spec", load, g1) * math.exp(e))
                         for e in noise))  # fmt: skip

    adaptive = 0.0
    for load, noise in bursts:
        # a burst of `load` requests at once: the first takes the cores on the policy's
        # choice, the others join it (serve's scheduler never runs two layouts or two
        # configurations on the same cores at once); each is evidence at that load
        d = policy.choose(load)
        lay, sp = d.key.split("/")
        for e in noise:
            tps = speed(lay, sp == "spec", load, g1) * math.exp(e)
            policy.observe(d.key, tps, concurrency=load)
        adaptive += burst_time(d.key, load, noise)
    names = [key(lay, sp) for lay, sp in CANDIDATES]
    fixed = {name: sum(burst_time(name, load, noise) for load, noise in bursts) for name in names}
    oracle = sum(min(burst_time(n, load, noise) for n in names) for load, noise in bursts)
    chosen = {level: policy.best_key(level) for level in sorted({level_of(x) for x in PATTERN})}
    return adaptive, fixed, oracle, chosen


def shipped_gains() -> list[float]:
    path = files("specreg.recommender") / "data" / "epyc_sweeps_bestk.csv"
    rows = list(csv.DictReader(path.read_text().splitlines()))
    return sorted(float(r["speedup_vs_baseline"]) for r in rows if r["speedup_vs_baseline"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    gains = shipped_gains()
    picks = [gains[0], *(statistics.quantiles(gains, n=4)), gains[-1]]
    print(f"{len(gains)} sweeps; single-stream speedups {gains[0]:.2f}-{gains[-1]:.2f}x; "
          f"load pattern {PATTERN} x {args.rounds}")  # fmt: skip
    for name, env in ENVIRONMENTS.items():
        print(f"\n== {name}")
        globals()["ENV"] = env
        report(picks, args)


def report(picks: list[float], args: argparse.Namespace) -> None:
    print("capacity (t/s per request | aggregate) at 1 / 4 / 16 / 32 streams, no speculation:")
    for lay in ("full", "nodes"):
        row = [f"{speed(lay, False, n, 1.0):5.1f} | {n * speed(lay, False, n, 1.0):6.1f}"
               for n in (1, 4, 16, 32)]  # fmt: skip
        print(f"  {lay:5}: " + "   ".join(row))
    ratios = []
    for g1 in picks:
        adaptive, fixed, oracle, chosen = simulate(g1, args.rounds, args.seed)
        best_name = min(fixed, key=fixed.__getitem__)
        gain = fixed[best_name] / adaptive
        ratios.append(gain)
        print(f"\nspeculation {g1:.2f}x alone: chosen per load "
              + ", ".join(f"{lv}: {name}" for lv, name in chosen.items()))  # fmt: skip
        print(f"  time: adaptive {adaptive:,.0f} s, best fixed ({best_name}) "
              f"{fixed[best_name]:,.0f} s, oracle {oracle:,.0f} s; adaptive is "
              f"{gain:.2f}x the best fixed, {oracle / adaptive:.2f}x the oracle "
              f"(the oracle's room: {fixed[best_name] / oracle:.2f}x)")  # fmt: skip
    print(f"\nover the sweeps picked: adaptive {min(ratios):.2f}-{max(ratios):.2f}x the best "
          "fixed layout and configuration")  # fmt: skip


if __name__ == "__main__":
    main()
