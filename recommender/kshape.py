"""How speed moves with K: the bound no pair can break, and the shape the measured sweeps share.

From K1 to K2 drafted tokens a pair's speed can rise at most (K2 + 1) / (K1 + 1): a
verification yields at most one more token per drafted position, and a longer draft never
makes a round cheaper. A sweep that rises faster measured its K values under different
conditions (prompts, load, a warm cache), and no model of a pair can reproduce it
(`bound_breaks`). Such sweeps are left out of what is learned and scored from sweeps.

A sweep is read between its measured K linearly, with plain decoding (its baseline) at K = 0
where known (`interpolated`): a K between two measured ones is scored by what the two measured,
not by the nearer one.

The sweeps that keep the bound share a shape over K (`sweep_shape`: each normalised to its own
best, averaged where it was measured). A pair nobody has measured has the model's curve over K,
pulled half way (in log) to that shared shape (`shape_factors`): the model knows the pair's
sizes, the sweeps know how real curves bend (the model's acceptance for an unseen pair is a
guess, and the sweeps' spread of acceptance flattens their average around its peak).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

# Where the shared shape is kept: every K the recommender or a sweep uses.
K_POINTS: tuple[int, ...] = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48)
# How far (in log) an unmeasured pair's K curve moves towards the sweeps' shared shape.
SHAPE_PULL = 0.5
# A series needs this many K values to say anything about a shape.
MIN_SERIES_POINTS = 3


def bound_breaks(k_tps: Mapping[int, float]) -> list[tuple[int, int]]:
    """The pairs of K (K1 < K2) between which a sweep rose faster than (K2 + 1) / (K1 + 1)."""
    ks = sorted(k for k, v in k_tps.items() if v > 0)
    return [
        (a, b)
        for i, a in enumerate(ks)
        for b in ks[i + 1 :]
        if k_tps[b] / k_tps[a] > (b + 1) / (a + 1) + 1e-12
    ]


def interpolated(k_tps: Mapping[int, float], k: float, baseline: float = math.nan) -> float:
    """A sweep's speed at K: linear between the measured K on either side of it, plain decoding
    (`baseline`, where known) at K = 0; the largest measured K's speed beyond it."""
    ks = sorted(k_tps)
    xs = [float(x) for x in ks]
    ys = [float(k_tps[x]) for x in ks]
    if math.isfinite(baseline) and baseline > 0 and ks[0] > 0:
        xs, ys = [0.0, *xs], [baseline, *ys]
    return float(np.interp(k, xs, ys))


@dataclass(frozen=True)
class KShape:
    """The measured sweeps' shared shape over K: the mean share of each sweep's best speed
    reached at each K (of the sweeps measured there), and how many sweeps it averages."""

    points: tuple[tuple[int, float], ...]
    n_series: int

    def at(self, k: np.ndarray | float) -> np.ndarray:
        """The shape at K (linear between its points, its ends beyond them)."""
        xs = np.array([x for x, _ in self.points], dtype=float)
        ys = np.array([y for _, y in self.points], dtype=float)
        return np.interp(np.asarray(k, dtype=float), xs, ys)

    @property
    def best_k(self) -> int:
        return max(self.points, key=lambda p: p[1])[0]

    def to_json(self) -> dict[str, Any]:
        return {"points": [list(p) for p in self.points], "n_series": self.n_series}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> KShape:
        points = tuple((int(k), float(v)) for k, v in doc["points"])
        if len(points) < 2 or any(v <= 0 for _, v in points):
            raise ValueError("K shape: needs two or more positive points")
        return cls(points, int(doc["n_series"]))


def sweep_shape(
    series: Iterable[tuple[Mapping[int, float], float]], points: Sequence[int] = K_POINTS
) -> KShape | None:
    """The shared shape of `series` ((speed by K, baseline) each): the ones with
    MIN_SERIES_POINTS K values that keep the bound, each normalised to its own best and read
    at every point from K = 1 to its largest measured K. None without any such series."""
    sums = np.zeros(len(points))
    counts = np.zeros(len(points))
    n = 0
    for k_tps, baseline in series:
        usable = {k: v for k, v in k_tps.items() if v > 0}
        if len(usable) < MIN_SERIES_POINTS or bound_breaks(usable):
            continue
        n += 1
        best = max(usable.values())
        for i, k in enumerate(points):
            if k <= max(usable):
                sums[i] += interpolated(usable, k, baseline) / best
                counts[i] += 1
    if not n:
        return None
    kept = counts > 0
    return KShape(
        tuple((int(k), float(s / c)) for k, s, c in zip(
            np.array(points)[kept], sums[kept], counts[kept], strict=True
        )),
        n,
    )  # fmt: skip


def shape_factors(shape: KShape, ks: Sequence[float], tps: Sequence[float]) -> np.ndarray:
    """The factor that pulls one pair's predicted curve (`tps` at each of `ks`) SHAPE_PULL of
    the way (in log) to the sweeps' shape, each curve measured against its own best over
    these K: the model's level at its best K stays, its shape bends towards the sweeps'."""
    model = np.log(np.maximum(np.asarray(tps, dtype=float), 1e-12))
    shared = np.log(np.maximum(shape.at(np.asarray(ks, dtype=float)), 1e-12))
    return np.exp(SHAPE_PULL * ((shared - shared.max()) - (model - model.max())))
