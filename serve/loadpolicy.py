"""Load is the policy's context, not its noise.

A request's decode speed depends on how many requests decode beside it on the same cores: with
slots, a backend batches them into one pass per step, and every request gets a share of it.
Speculation pays where a step is memory-bound (a pass over K + 1 tokens costs about one step),
and stops paying once batching has made the step compute-bound: on the reference host's
notes, MTP measured +27 % for one stream and -46 % at four. So the choice depends on the load.

`LoadPolicy` keeps one `TaskPolicy` per load level (1, 2, 4, ... 64 requests on the cores). The
level of one request is its priors' and its evidence's: a request that decoded beside three
others is evidence for level 4, in full, and for no other level. Level 1 is the policy of a
quiet server (the recommender's prediction as the prior, the other tasks' evidence, K moving
outward, caches grown from traffic: specreg.serve.policy). A higher level starts from level 1's
posterior moved by the load's cost (`LoadModel`), widened by LOAD_SIGMA, and its own evidence
does the rest; its priors follow level 1 as level 1 learns.

The load's cost, per request, of a pass over n tokens at load L: each request's round is a pass
over L (K + 1) tokens where alone it was one over K + 1 (K = 0 for plain decoding), so a
configuration's per-request speed falls by cost(L (K + 1)) / cost(K + 1), where cost(n) is the
host's pass cost over n tokens in single-token steps: `specreg calibrate`'s measured curve
for the target when there is one, else the soft roofline the recommender uses. Where
`specreg capacity` has measured the per-request speeds at each concurrency, those are used.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from statistics import NormalDist
from typing import Any

from specreg.serve.policy import (
    DOMINATED,
    KIND_DRAFT,
    KIND_NGRAM,
    KIND_PLAIN,
    KIND_STACK,
    Arm,
    Candidate,
    Decision,
    Replay,
    TaskPolicy,
)

LEVELS: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
# How far a level's prior may sit from what the load model says, beyond level 1's own
# uncertainty (log units): the model is a roofline, not a measurement.
LOAD_SIGMA = 0.25
# An n-gram lookup drafts only where the text repeats: its pass is over fewer tokens than its K
# on average. This share of K stands for its usual draft in the load's cost.
NGRAM_DRAFT_SHARE = 0.25

# cost(n): a pass over n tokens in single-token steps (1 at n = 1).
PassCost = Callable[[float], float]


def level_of(load: int) -> int:
    """The load level a number of requests on the cores falls in (1, 2, 3-4, 5-8, ... 33+).
    Levels a factor of two apart: a level mixing loads further apart would hold a
    configuration's evidence at one load against another's at a heavier one."""
    for level in LEVELS:
        if load <= level:
            return level
    return LEVELS[-1]


def roofline_cost(compute_share: float) -> PassCost:
    """The soft roofline (recommender.costmodel.pass_ratio) as a function of n."""
    from specreg.recommender.costmodel import pass_ratio

    return lambda n: float(pass_ratio(n, compute_share))  # type: ignore[arg-type]


@dataclass(frozen=True)
class LoadModel:
    """A configuration's per-request speed at load L relative to alone (log units).

    `cost`: the pass cost curve; `measured`: per-request speed ratios measured by
    `specreg capacity`, keyed by (candidate key, level) or (candidate kind, level), which win
    where present (a key before a kind)."""

    cost: PassCost
    measured: Mapping[tuple[str, int], float] = field(default_factory=dict)
    source: str = "roofline"  # calibrated | roofline | capacity

    def drafted(self, c: Candidate) -> float:
        """Tokens a request's round drafts on average, for the cost of its pass."""
        k = float(c.k or 0)
        if c.kind == KIND_NGRAM:
            return k * NGRAM_DRAFT_SHARE
        return k if c.kind in (KIND_DRAFT, KIND_STACK) else 0.0

    def factor(self, c: Candidate, level: int) -> float:
        """log(per-request speed at `level` / speed alone)."""
        if level <= 1:
            return 0.0
        got = self.measured.get((c.key, level), self.measured.get((c.kind, level)))
        if got is not None and got > 0:
            return math.log(got)
        n = 1.0 + self.drafted(c)
        return math.log(self.cost(n)) - math.log(self.cost(level * n))


class LoadPolicy:
    """One (target, task)'s choices at each load level; see the module docstring."""

    def __init__(self, base: TaskPolicy, model: LoadModel):
        self.base = base
        self.model = model
        self.levels: dict[int, TaskPolicy] = {1: base}

    @property
    def name(self) -> str:
        return self.base.name

    # -- the levels -----------------------------------------------------------------------

    def at(self, level: int) -> TaskPolicy:
        """The policy of `level`, its priors brought up to date with level 1's posteriors."""
        if level <= 1:
            return self.base
        policy = self.levels.get(level)
        fresh = {key: self._prior(arm, level) for key, arm in self.base.arms.items()
                 if self._carried(arm)}  # fmt: skip
        if policy is None:
            policy = TaskPolicy(f"{self.base.name}@{level}", fresh.values(), seed=self.base.seed)
            self.levels[level] = policy
        for key, candidate in fresh.items():
            arm = policy.arms.get(key)
            if arm is None:
                policy.arms[key] = Arm.of(candidate)
            else:
                arm.candidate = candidate
                policy.reconsider(key)  # level 1's replay may speak for it here too
        for key, arm in self.base.arms.items():
            if not self._carried(arm) and key in policy.arms:
                policy.retire(key, arm.why, idle=arm.idle)
        return policy

    @staticmethod
    def _carried(arm: Arm) -> bool:
        """Level 1's candidates that exist at every level: all but those retired for what is
        not a matter of speed (a crash, a cache superseded). One dominated alone may win
        under load (plain decoding, most often), so that retirement stays at level 1."""
        return arm.active or arm.why.startswith(DOMINATED)

    def _prior(self, arm: Arm, level: int) -> Candidate:
        c = arm.candidate
        mid = arm.mean + self.model.factor(c, level)
        sigma = math.hypot(arm.sigma, LOAD_SIGMA)
        z = NormalDist().inv_cdf(0.5 + c.prior_band / 2)
        return replace(
            c,
            prior_tps=math.exp(mid),
            prior_lo=math.exp(mid - z * sigma),
            prior_hi=math.exp(mid + z * sigma),
            shared_shift=False,  # level 1's posterior holds the host's error already
        )

    # -- choosing and learning ------------------------------------------------------------

    def choose(self, load: int = 1) -> Decision:
        return self.at(level_of(load)).choose()

    def best_key(self, load: int = 1) -> str:
        return self.at(level_of(load)).best().candidate.key

    def observe(self, key: str, tps: float | None, *, concurrency: int = 1, **figures: Any) -> None:
        """A request's speed, evidence for its own load level (in full: the level is its
        context, not a discount)."""
        self.at(level_of(concurrency)).observe(key, tps, concurrency=1, **figures)

    def observe_replay(self, key: str, replay: Replay) -> None:
        """A lookup replayed on a request another candidate served: level 1's prior, which
        every level's follows."""
        self.base.observe_replay(key, replay)

    def retire(self, key: str, why: str) -> None:
        for policy in self.levels.values():
            policy.retire(key, why)

    def to_json(self) -> dict[str, Any]:
        doc = self.base.to_json()
        doc["load_model"] = self.model.source
        doc["levels"] = [
            {
                "level": level,
                "choice": p.best().candidate.key,
                "why": p.why(),
                "candidates": [a.to_json() for a in p.arms.values()],
            }  # fmt: skip
            for level, p in sorted(self.levels.items())
            if level > 1
        ]
        return doc


def load_model_for(
    con: Any, host_fingerprint: str, bandwidth_gbs: float, physical_cores: int, model: Any
) -> LoadModel:
    """The load model of a target on this host: the per-request speeds `specreg capacity`
    measured here at each concurrency, and for the rest its calibrated pass costs when
    `specreg calibrate` measured them here, else the recommender's roofline for the host's
    bandwidth and cores and the model's size. `model` is its ModelRecord."""
    from specreg.registry.calibration import latest_calibration

    found = latest_calibration(con, host_fingerprint, model.model_id)
    model_of = _roofline_of(bandwidth_gbs, physical_cores, model)
    if found is not None and found.batch:
        one = found.batch_seconds(1)
        if one > 0:
            model_of = LoadModel(
                lambda n: max(found.batch_seconds(n) / one, 1.0), source="calibrated"
            )
    measured = measured_ratios(con, host_fingerprint, model.model_id)
    if measured:
        return replace(model_of, measured=measured, source=f"capacity + {model_of.source}")
    return model_of


def measured_ratios(con: Any, host_fingerprint: str, model_id: str) -> dict[tuple[str, int], float]:
    """Per-request speed at each concurrency over its speed alone, by candidate kind, from
    the newest `specreg capacity` of the model on this host (the full instance, short context);
    empty when it was never measured."""
    from specreg.registry.capacity import latest_capacity
    from specreg.terms import DRAFT_MODEL_TYPES, NGRAM_TYPES

    curve = latest_capacity(con, host_fingerprint, model_id)
    if curve is None:
        return {}
    out: dict[tuple[str, int], float] = {}
    for p in curve.points:
        first = p.spec_type.split(",")[0]
        kind = KIND_PLAIN if not p.speculative else (
            KIND_DRAFT if first in DRAFT_MODEL_TYPES else
            KIND_NGRAM if first in NGRAM_TYPES else KIND_STACK
        )  # fmt: skip
        ratio = curve.per_request_ratio(p.speculative, p.concurrency)
        if ratio is not None and p.concurrency > 1 and p.concurrency in LEVELS:
            out[(kind, p.concurrency)] = ratio
    return out


def _roofline_of(bandwidth_gbs: float, physical_cores: int, model: Any) -> LoadModel:
    """The recommender's roofline for the host's bandwidth and cores and the model's size and
    bits per weight."""
    import numpy as np

    from specreg.recommender.costmodel import CostParams, compute_share
    from specreg.recommender.features import FEATURES

    params = model.n_params_active or model.n_params or 0
    params_b = max(params / 1e9, 0.01)
    bpw = 8.0 * (model.n_bytes or 0) / params if params else 4.85
    row = np.zeros((1, len(FEATURES)))
    row[0, FEATURES.index("bandwidth_gbs")] = bandwidth_gbs
    row[0, FEATURES.index("physical_cores")] = physical_cores
    share = float(compute_share(row, CostParams(), np.array([bpw]), np.array([params_b]))[0])
    return LoadModel(roofline_cost(share), source="roofline")
