"""The adaptive policy: which candidate configuration serves the next request of a task.

One `TaskPolicy` per (target, task) holds a few candidates (plain decoding, the best draft at
its K and the neighbouring K, the stack, n-gram types, ngram-cache with a workload cache) and
chooses among them by Thompson sampling over each candidate's per-request decode throughput
(generated tokens over generation seconds, as llama-server reports them; prompt processing is
not part of it).

The model, per candidate: log tokens/s of a request ~ Normal(mu, sigma^2), and
mu ~ Normal(m0, s0^2) a priori, where m0 and s0 come from the recommender's prediction and its
band. Throughput is multiplicative (a draft that is 1.5x faster is 1.5x faster on a slow prompt
and on a fast one), so log space is where the noise is closest to symmetric and constant. The
posterior is conjugate: precision adds, and a request's weight scales its precision, so a request
that decoded while another request decoded on the same cores counts less (CONCURRENT_WEIGHT per
extra concurrent decode; zero weight never moves the posterior).

- Choosing: draw one mu per active candidate from its posterior, serve the argmax. The reason is
  "exploit" when the argmax is also the candidate with the best posterior mean, else "explore".
  Once the best has EDGE_WEIGHT requests of evidence, a candidate never tried whose 90 % band
  still reaches above the best's speed is tried once first. An n-gram lookup is tried once on
  each task's first requests, whatever its prior: where the text does not repeat it decodes as
  plain does, and where it does, its gain is what a prediction cannot see.
- Retiring: a candidate with evidence of its own whose chance of beating the current best
  (posterior means compared with both uncertainties) is below RETIRE_P stops costing requests.
- Other tasks' evidence: a configuration's error against its prediction is mostly the
  configuration's, not the task's (a draft that costs more on these cores than the cost model
  thinks costs more on every task). Its requests on the other tasks of the same target
  (`peers`) move its prior here by that error, each task's worth at most TASK_SIGMA of
  task-to-task scatter, and narrow the prior to match: a draft that lost badly on code is not
  tried again on prose on a prediction the host has already overturned.
- K moving outward: when the best candidate of a draft family (same draft and type, several K)
  has settled evidence and sits at the edge of the family's K values, the next K outward from
  the family's ladder (the build's limits) joins, with the recommender's prediction for it where
  one exists, else its neighbour's posterior widened by NEW_K_SIGMA.

Everything here is pure and deterministic under `seed`: the same evidence in the same order gives
the same choices. No I/O, no clock.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from statistics import NormalDist
from typing import Any

import numpy as np

from specreg.jsonout import document, fields_of
from specreg.recommender.lookup_replay import NO_STEPS, LookupSteps
from specreg.registry.noise import FALLBACK_NOISE, NoiseFigure

# Per-request scatter of log tokens/s around a configuration's mean, as a multiple of the
# host's scatter of one measurement (registry/noise.py: the noise floor `specreg calibrate`
# measures from llama-bench's quiet repeats, a fallback where never measured): a request is a
# short measurement over another prompt each time. At the fallback floor (10 %) this is 0.19,
# about what the reference host's K sweeps scatter between neighbouring K (benchmarks/
# serve_adaptive_sim.py prints its own estimate).
REQUEST_SCATTER = 2.0


def request_sigma(noise: NoiseFigure) -> float:
    """The prior per-request scatter of a host whose noise figure is `noise`."""
    return REQUEST_SCATTER * noise.sigma


NOISE_SIGMA = request_sigma(FALLBACK_NOISE)
# sigma is learnt from the requests (pooled within candidates) with NOISE_SIGMA as a prior worth
# NOISE_PRIOR_DOF requests: a quiet host's 3 % scatter must not take 30 requests per decision.
NOISE_PRIOR_DOF = 4.0
MIN_NOISE_SIGMA = 0.02
# A prediction without a band of its own: a factor of e^0.5 either way is one sigma.
DEFAULT_PRIOR_SIGMA = 0.5
# The prior never claims to know a speed better than this (log units): traffic must be able to
# overturn any prediction within a handful of requests.
MIN_PRIOR_SIGMA = 0.15
# Each further request decoding on the same cores multiplies a request's weight by this.
CONCURRENT_WEIGHT = 0.25
RETIRE_P = 0.02  # retire when P(mu_candidate > mu_best) falls below this
MIN_RETIRE_WEIGHT = 3.0  # ... and the candidate has at least this much evidence of its own
EDGE_WEIGHT = 3.0  # evidence the best of a family needs before K moves outward from it
NEW_K_SIGMA = 0.35  # prior sigma of a candidate that joins from a neighbour's posterior
# A speculative candidate whose accepted draft tokens make less than IDLE_SHARE of what it
# generated, over at least IDLE_RETIRE_REQUESTS requests, decodes as plain decoding does plus
# the cost of drafting (it cannot gain more than that share): with plain among the candidates it
# retires, rather than splitting requests with plain for ever on noise.
# A candidate whose drafts come from a pool of what its server read (ngram-mod) is judged so
# only on requests it served warm (the caller says which: specreg.serve.pooled).
IDLE_RETIRE_REQUESTS = 3
IDLE_SHARE = 0.02
BAND = 0.9  # the band shown with each posterior
SHIFT_SHRINK = 1.0  # requests' worth of "the predictions are right" in the shared shift
# How far one configuration's speed relative to its prediction differs between two tasks of one
# target (log units), beyond the per-request scatter: acceptance differs per task, costs do not.
# Evidence from the other tasks never pins a candidate's prior closer than this.
TASK_SIGMA = 0.25
# ... for a match-only n-gram lookup, whose gain is the task's repetition alone: on SmolLM2 its
# error against the prediction was +0.43 to +1.27 (log) across code, prose, json and summarize,
# a scatter of 0.39 (benchmarks/serve_adaptive.py, 2026-11-25).
TASK_SIGMA_LOOKUP = 0.5
# How far a drafter's error against its prediction at one K sits from its error at another
# (log units), beyond the per-request scatter: the drafter's cost on these cores is the same at
# every K, and the cost model's K curve is what may differ. On this 2-core host the Qwen2.5-Coder
# pair's draft loses at every K (0.1-0.75x plain at K 2-16, docs/measurements/real-pair.md)
# where an uncalibrated prior puts it at 0.7-0.8x: without this each K paid for its own try.
K_SIGMA = 0.25

EXPLORE = "explore"
EXPLOIT = "exploit"
ONLY = "only"  # one candidate left: nothing to choose

DOMINATED = "dominated by"  # how the reason of a candidate retired on evidence begins

STATUS_ACTIVE = "active"
STATUS_RETIRED = "retired"

ORIGIN_RECOMMEND = "recommend"
ORIGIN_K_OUTWARD = "k-outward"
ORIGIN_TRAFFIC_CACHE = "traffic-cache"
ORIGIN_PIN = "pinned"
JOINED = (ORIGIN_K_OUTWARD, ORIGIN_TRAFFIC_CACHE)  # candidates added while serving

KIND_PLAIN = "plain"
KIND_DRAFT = "draft"  # a draft model or MTP heads: a family per drafter, K ladder
KIND_STACK = "stack"
KIND_NGRAM = "ngram"  # one per n-gram type (the family names the type)
KIND_CACHE = "ngram-cache"  # ngram-cache reading a workload cache
KIND_EXPERTS = "experts"  # fewer MoE experts (changes the output: only under the speed policy)
# n-gram types that draft only where the last tokens matched earlier text (llama-server's
# --spec-type): without a match they decode as plain does
MATCH_ONLY_TYPES = ("ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod")
KINDS = (KIND_PLAIN, KIND_DRAFT, KIND_STACK, KIND_NGRAM, KIND_CACHE, KIND_EXPERTS)


@dataclass(frozen=True)
class Candidate:
    """A configuration the policy may send a task's requests to.

    key: unique within a task (the backend's configuration, e.g. "draft-simple@abc:K=8");
    family: candidates that differ only in K share one (None: no K ladder);
    prior_*: the recommender's predicted tokens/s and its band (lo <= tps <= hi).
    `payload` carries what the caller needs to run it (never looked at here).
    """

    key: str
    label: str
    prior_tps: float
    prior_lo: float
    prior_hi: float
    prior_band: float = 0.8
    k: int | None = None
    family: str | None = None
    kind: str = "plain"  # one of KINDS: how pick_candidates treats it
    origin: str = ORIGIN_RECOMMEND
    shared_shift: bool = True  # False: the prior already holds this host's evidence
    payload: Any = field(default=None, compare=False, repr=False)
    # ngram-mod: target steps one drafting verification costs at its K (the recommender's
    # arithmetic), which turns a replay of served text into a speed (`replayed_prior`)
    lookup_verify: float | None = None
    replay: Replay | None = None  # ngram-mod replayed on requests others served

    @property
    def prior_mu(self) -> float:
        return math.log(max(self.prior_tps, 1e-6))

    @property
    def prior_sigma(self) -> float:
        if not (0 < self.prior_lo < self.prior_tps < self.prior_hi):
            return DEFAULT_PRIOR_SIGMA
        z = NormalDist().inv_cdf(0.5 + self.prior_band / 2)
        sigma = math.log(self.prior_hi / self.prior_lo) / (2 * z)
        return max(sigma, MIN_PRIOR_SIGMA)


@dataclass(frozen=True)
class Replay:
    """What an ngram-mod lookup would have drafted, on first encounter, on the requests of a
    task that other candidates served (recommender.lookup_replay, on their token ids)."""

    steps: LookupSteps = NO_STEPS
    generated: int = 0  # the answers' tokens
    requests: int = 0

    def __add__(self, other: Replay) -> Replay:
        return Replay(
            self.steps + other.steps,
            self.generated + other.generated,
            self.requests + other.requests,
        )

    def speedup(self, verify: float) -> float:
        """Tokens a round over target steps a round (the cost model's n-gram round,
        recommender.costmodel.rounds): drafting rounds yield their accepted tokens and the
        target's own and cost `verify` steps, the others one token for one step."""
        q, e = self.steps.draft_rate, self.steps.tokens_per_drafting_step
        return ((1.0 - q) + q * e) / ((1.0 - q) + q * verify)

    def to_json(self) -> dict[str, Any]:
        s = self.steps
        return {"requests": self.requests, "generated": self.generated, "steps": s.steps,
                "drafting": s.drafting, "drafted": s.drafted, "accepted": s.accepted}  # fmt: skip

    @classmethod
    def from_json(cls, doc: Any) -> Replay | None:
        """A replay as `to_json` wrote it (a served run's); None for anything else."""
        names = ("steps", "drafting", "drafted", "accepted", "generated", "requests")
        if not isinstance(doc, dict) or not all(isinstance(doc.get(n), int) for n in names):
            return None
        steps = LookupSteps(doc["steps"], doc["drafting"], doc["drafted"], doc["accepted"])
        return cls(steps, doc["generated"], doc["requests"])


def replayed_prior(base: Candidate, plain: Candidate, replay: Replay) -> Candidate:
    """`base` (an ngram-mod candidate as the recommender predicted it) with the prior that the
    replay gives: plain decoding's prediction times the replayed round's speed-up, in the
    recommender's band (as `recommend` does with text `specreg agree` kept:
    recommender.acceptance.apply_lookup)."""
    assert base.lookup_verify is not None
    tps = plain.prior_tps * replay.speedup(base.lookup_verify)
    scale = tps / base.prior_tps
    return replace(
        base,
        prior_tps=tps,
        prior_lo=base.prior_lo * scale,
        prior_hi=base.prior_hi * scale,
        replay=replay,
    )


def request_weight(concurrency: int) -> float:
    """How much a request counts: 1 alone on the cores, less for each other decode."""
    return CONCURRENT_WEIGHT ** max(concurrency - 1, 0)


@dataclass
class Arm:
    """A candidate and what the policy has learnt of it.

    `shift` moves the prior by what the other candidates of the task found: the recommender's
    errors on one host are shared (a wrong bandwidth figure makes every prediction wrong by
    about the same factor), so when plain decoding measures 1.6x its prediction, an untried
    candidate's prediction is most likely 1.6x too low as well (see TaskPolicy._shift).
    """

    candidate: Candidate
    requests: int = 0  # requests served (any weight, failures included)
    weight: float = 0.0  # evidence: sum of request weights
    sum_log: float = 0.0  # sum of weight x log tokens/s
    shift: float = 0.0  # added to the prior mean (log units)
    sum_log2: float = 0.0  # sum of weight x (log tokens/s)^2
    noise: float = NOISE_SIGMA  # the policy's current per-request scatter
    status: str = STATUS_ACTIVE
    why: str = ""
    drafted: int = 0  # draft tokens its requests proposed (requests that reported them)
    accepted: int = 0  # ... and the target accepted
    generated: int = 0  # ... and the tokens those requests generated
    figured: int = 0  # requests that reported drafted, accepted and generated
    peer_shift: float = 0.0  # added to the prior mean by the other tasks' evidence (log units)
    peer_sigma: float | None = None  # the prior's sigma once the other tasks have evidence
    peer_weight: float = 0.0  # the other tasks' evidence behind peer_shift
    idle: bool = False  # retired by the idle rule (a replay of served text may reinstate it)
    predicted: Candidate | None = None  # the candidate before any replay moved its prior

    @classmethod
    def of(cls, candidate: Candidate) -> Arm:
        return cls(candidate, predicted=candidate)

    @property
    def prior_sigma(self) -> float:
        return self.peer_sigma if self.peer_sigma is not None else self.candidate.prior_sigma

    @property
    def prec(self) -> float:
        """Posterior precision of mu."""
        return 1.0 / self.prior_sigma**2 + self.weight / self.noise**2

    @property
    def mean(self) -> float:
        """Posterior mean of mu (log tokens/s)."""
        p0 = 1.0 / self.prior_sigma**2
        m0 = self.candidate.prior_mu + self.shift + self.peer_shift
        return (p0 * m0 + self.sum_log / self.noise**2) / self.prec

    @property
    def own_error(self) -> float | None:
        """What its own measurements say of its prediction beyond what the task's other
        candidates say of theirs (log units): the configuration's share of the error."""
        r = self.residual
        return None if r is None else r - self.shift

    @property
    def residual(self) -> float | None:
        """How far its own measurements sit from its prediction (log units)."""
        if self.weight <= 0:
            return None
        return self.sum_log / self.weight - self.candidate.prior_mu

    @property
    def sigma(self) -> float:
        return 1.0 / math.sqrt(self.prec)

    @property
    def active(self) -> bool:
        return self.status == STATUS_ACTIVE

    @property
    def judged_out(self) -> bool:
        """Retired on evidence (idle, or dominated), not for a crash or a cache superseded:
        a replay of served text may bring it back (`TaskPolicy.reconsider`)."""
        return not self.active and (self.idle or self.why.startswith(DOMINATED))

    def band(self, band: float = BAND) -> tuple[float, float, float]:
        """(low, point, high) tokens/s of the posterior mean's band."""
        z = NormalDist().inv_cdf(0.5 + band / 2)
        return (
            math.exp(self.mean - z * self.sigma),
            math.exp(self.mean),
            math.exp(self.mean + z * self.sigma),
        )

    def observe(
        self,
        tps: float,
        weight: float,
        drafted: int | None = None,
        accepted: int | None = None,
        generated: int | None = None,
        cold: bool = False,
    ) -> None:
        self.requests += 1
        if drafted is not None and accepted is not None and generated and tps > 0 and not cold:
            self.figured += 1
            self.drafted += drafted
            self.accepted += accepted
            self.generated += generated
        if weight <= 0 or not tps > 0:
            return
        self.weight += weight
        self.sum_log += weight * math.log(tps)
        self.sum_log2 += weight * math.log(tps) ** 2

    def to_json(self) -> dict[str, Any]:
        lo, mid, hi = self.band()
        c = self.candidate
        return {
            "key": c.key,
            "label": c.label,
            "k": c.k,
            "family": c.family,
            "origin": c.origin,
            "prior_tps": c.prior_tps,
            "prior_lo": c.prior_lo,
            "prior_hi": c.prior_hi,
            "posterior_tps": mid,
            "posterior_lo": lo,
            "posterior_hi": hi,
            "prior_shift": math.exp(self.shift),
            "peer_shift": math.exp(self.peer_shift),
            "noise": self.noise,
            "band": BAND,
            "requests": self.requests,
            "evidence": round(self.weight, 4),
            "drafted": self.drafted,
            "accepted": self.accepted,
            "generated": self.generated,
            "status": self.status,
            "why": self.why,
            "replay": c.replay.to_json() if c.replay is not None else None,
        }


@dataclass(frozen=True)
class Decision:
    """Where a request goes and why."""

    key: str
    reason: str  # explore | exploit | only
    sampled_tps: float
    best_key: str  # the candidate with the best posterior mean at the time

    def to_json(self) -> dict[str, Any]:
        return fields_of(self)


def _match_only(c: Candidate) -> bool:
    """An n-gram lookup that drafts only where the last tokens matched earlier text."""
    return c.kind == KIND_NGRAM and (c.family or "").split("|")[0] in MATCH_ONLY_TYPES


def _rng(seed: int, name: str) -> np.random.Generator:
    # crc32, not hash(): Python salts str hashes per process, and a seed must mean one stream.
    return np.random.default_rng([seed, zlib.crc32(name.encode())])


# What a new K comes from: (family, k, its neighbour) -> a candidate, or None (cannot run it).
# Without one, a new K takes its neighbour's posterior, widened, as its prior.
KSource = Callable[[str, int, Candidate], Candidate | None]


class TaskPolicy:
    """Thompson sampling over one task's candidates; see the module docstring."""

    def __init__(
        self,
        name: str,
        candidates: Iterable[Candidate],
        *,
        seed: int = 0,
        k_ladder: Sequence[int] = (),
        k_source: KSource | None = None,
        noise_prior: float = NOISE_SIGMA,
    ):
        """`noise_prior`: the per-request scatter before requests show their own
        (`request_sigma` of the host's noise figure)."""
        self.name = name
        self.seed = seed
        self.rng = _rng(seed, name)
        self.noise_prior = noise_prior
        self.arms: dict[str, Arm] = {}
        for c in candidates:
            if c.key not in self.arms:
                self.arms[c.key] = Arm.of(c)
                self.arms[c.key].noise = noise_prior
        if not self.arms:
            raise ValueError(f"{name}: a policy needs at least one candidate")
        self.k_ladder = tuple(sorted(set(k_ladder)))
        self.k_source = k_source
        self.events: list[str] = []  # what changed and why, oldest first
        # the policies of the same target's other tasks (set by whoever holds them all)
        self.peers: Sequence[TaskPolicy] = ()

    # -- reading ------------------------------------------------------------------------------

    @property
    def active(self) -> list[Arm]:
        return [a for a in self.arms.values() if a.active]

    def best(self) -> Arm:
        """The active candidate with the best posterior mean (ties: the first added)."""
        return max(self.active, key=lambda a: a.mean)

    def __getitem__(self, key: str) -> Arm:
        return self.arms[key]

    # -- choosing -----------------------------------------------------------------------------

    def choose(self) -> Decision:
        self._from_peers()  # the other tasks may have learnt something since the last request
        active = self.active
        best = self.best()
        if len(active) == 1:
            return Decision(best.candidate.key, ONLY, math.exp(best.mean), best.candidate.key)
        top = math.exp(best.mean)
        # A candidate that joined while serving (a K outward, a cache grown from traffic) joined
        # to be measured: it gets the next request. Once the best has evidence, so does any
        # candidate never tried whose band still reaches above the best's speed: Thompson
        # alone, with a prior that says "slower", can leave a good one untried for a long time.
        # An n-gram lookup is tried on a task's first requests whatever its prior says: see
        # `_lookup_unjudged`.
        hopeful = [a for a in active if a.requests == 0
                   and ((a.candidate.origin in JOINED or best.weight >= EDGE_WEIGHT)
                        and a.band()[2] > top or self._lookup_unjudged(a))]  # fmt: skip
        if hopeful:
            pick = max(hopeful, key=lambda a: a.mean)
            return Decision(pick.candidate.key, EXPLORE, pick.band()[2], best.candidate.key)
        draws = self.rng.normal([a.mean for a in active], [a.sigma for a in active])
        pick = active[int(np.argmax(draws))]
        reason = EXPLOIT if pick is best else EXPLORE
        sampled = float(math.exp(draws.max()))
        return Decision(pick.candidate.key, reason, sampled, best.candidate.key)

    def _lookup_unjudged(self, arm: Arm) -> bool:
        """An n-gram lookup not yet tried on this task, with plain decoding on offer.

        A lookup drafts only where the text repeats itself, and ngram-mod stops drafting after
        refused drafts: where it finds nothing it decodes as plain does (measured on this
        2-core host: 0.90-1.0x plain on the tasks where it drafted nothing), so a try costs
        little. What it gains is the task's repetition (summarising or editing a supplied text
        copies whole spans of it), which a prediction without the target's own text cannot
        see: on SmolLM2 it put ngram-mod at 0.4x plain on summarize, where it decoded 1.2x
        plain. One request tells: either it drafts, and its speed speaks for it, or it does
        not, and the idle rule retires it. Only llama-server's match-only types qualify: a
        lookup that drafts from a cache on every step (ngram-cache, llama-lookup) can cost
        far more than plain (the reference host's Qwen2.5-Coder-32B: 2.1 t/s against 3.4)."""
        c = arm.candidate
        arms = self.arms.values()
        return (
            _match_only(c)
            and c.origin not in JOINED
            and any(a.active and a.candidate.kind == KIND_PLAIN for a in arms)
            # one try per type: its K values differ in how far it drafts, not in whether the
            # text repeats
            and not any(a.requests and a.candidate.family == c.family for a in arms)
        )

    # -- learning -----------------------------------------------------------------------------

    def observe(
        self,
        key: str,
        tps: float | None,
        *,
        concurrency: int = 1,
        drafted: int | None = None,
        accepted: int | None = None,
        generated: int | None = None,
        cold: bool = False,
    ) -> None:
        """One served request's decode throughput (None: no figure, e.g. a failure) and, when
        the server reported them, the draft tokens it proposed, those the target accepted and
        the tokens it generated. `cold`: its drafts came from a pool of earlier texts that
        held too few yet; they do not count towards the idle rule (its speed still does)."""
        arm = self.arms.get(key)
        if arm is None:
            return
        weight = request_weight(concurrency) if tps else 0.0
        arm.observe(tps or 0.0, weight, drafted, accepted, generated, cold=cold)
        self._shift()
        self._from_peers()
        self._retire()
        self._retire_idle(arm)
        self._move_k()

    def observe_replay(self, key: str, replay: Replay) -> None:
        """What ngram-mod candidate `key` would have drafted on a request another candidate
        served: its prior becomes plain decoding's times the speed-up of what it would have
        drafted on the task's requests so far (`replayed_prior`), and the idle rule counts
        those drafts too. A lookup drafts only where the text repeats, which a prediction
        cannot see and which one try on a request that happens not to repeat misjudges: on
        SmolLM2 a copy-editing request drafts whole spans, a summary in two sentences
        nothing, and both are `summarize`. A replay costs no request."""
        arm = self.arms.get(key)
        plain = next((a for a in self.arms.values() if a.candidate.kind == KIND_PLAIN), None)
        base = arm.predicted if arm is not None else None
        if arm is None or base is None or base.lookup_verify is None or plain is None:
            return
        total = replay + arm.candidate.replay if arm.candidate.replay is not None else replay
        arm.candidate = replayed_prior(base, plain.candidate, total)
        self._shift()
        self._from_peers()
        self.reconsider(key)

    def reconsider(self, key: str) -> None:
        """A lookup retired on evidence (idle, or dominated) comes back once its replay
        (`observe_replay`) says otherwise: its drafts are not idle, and its chance of being
        the fastest is no longer under the limit that retired it. One try that landed on a
        request whose text repeats nothing retires a lookup before any replay can speak."""
        arm = self.arms.get(key)
        if arm is None or not arm.judged_out or arm.candidate.replay is None or self._idle(arm):
            return
        p, limit = self._odds(arm, self.best())
        if p < limit:
            return
        arm.status, arm.idle = STATUS_ACTIVE, False
        replay = arm.candidate.replay
        arm.why = (
            f"reinstated: on {replay.requests} request(s) others served it would have drafted "
            f"{replay.steps.accepted} accepted token(s) of {replay.generated}"
        )
        self.events.append(f"{arm.candidate.label} {arm.why}")

    def retire(self, key: str, why: str, *, idle: bool = False) -> None:
        """Take a candidate out for good (a backend that cannot start, a crash); `idle`: the
        idle rule's verdict, which a replay may overturn (`reconsider`)."""
        arm = self.arms.get(key)
        if arm is None or not arm.active:
            return
        if len(self.active) == 1:
            arm.why = f"{why} (kept: the last candidate)"
            return
        arm.status, arm.why, arm.idle = STATUS_RETIRED, why, idle
        self.events.append(f"retired {arm.candidate.label}: {why}")

    def add(self, candidate: Candidate, why: str) -> bool:
        """A new candidate joins (a K outward, a cache grown from traffic)."""
        if candidate.key in self.arms:
            return False
        self.arms[candidate.key] = Arm.of(candidate)
        self.events.append(f"added {candidate.label}: {why}")
        self._shift()
        return True

    def add_near(self, near_key: str, candidate: Candidate, why: str) -> bool:
        """`candidate` joins with `near`'s posterior, widened to NEW_K_SIGMA, as its prior
        (its own prediction is ignored): what the policy has learnt is the best guess for a
        configuration close to one it has measured."""
        near = self.arms[near_key]
        z = NormalDist().inv_cdf(0.5 + candidate.prior_band / 2)
        mid = near.mean
        made = replace(
            candidate,
            prior_tps=math.exp(mid),
            prior_lo=math.exp(mid - z * NEW_K_SIGMA),
            prior_hi=math.exp(mid + z * NEW_K_SIGMA),
            shared_shift=False,
        )
        return self.add(made, why)

    def _shift(self) -> None:
        """The scatter of one request, learnt; then each candidate's prior moves by what the
        host's error looks like from the task's other candidates (their measurements over
        their predictions), shrunk towards no shift by SHIFT_SHRINK requests' worth: one
        request moves it half-way at most.

        Plain decoding, once measured, is that error alone: its prediction holds the host's
        speed and nothing else, where a speculative candidate's also holds its acceptance,
        which is its own (ngram-mod finding repeats in code does not make a draft faster
        there). Before plain has evidence, the evidence-weighted mean of the other candidates
        whose priors are predictions stands in for it; a candidate that joined from a measured
        neighbour's posterior says nothing of the predictions and is left out."""
        arms = list(self.arms.values())
        # the scatter: pooled within-candidate variance, the host's noise prior as a prior
        ss = sum(max(a.sum_log2 - a.sum_log**2 / a.weight, 0.0) for a in arms if a.weight > 0)
        dof = sum(max(a.weight - 1.0, 0.0) for a in arms)
        var = (NOISE_PRIOR_DOF * self.noise_prior**2 + ss) / (NOISE_PRIOR_DOF + dof)
        noise = max(math.sqrt(var), MIN_NOISE_SIGMA)
        for a in arms:
            a.noise = noise
        predicted = [a for a in arms if a.candidate.shared_shift and a.weight > 0]
        anchors = [a for a in predicted if a.candidate.kind == KIND_PLAIN]
        for a in arms:
            # plain, when measured, is moved by nothing but plain (never by drafts)
            pool = [b for b in (anchors or predicted) if b is not a]
            w = sum(b.weight for b in pool)
            r = sum(b.weight * (b.residual or 0.0) for b in pool)
            a.shift = r / (w + SHIFT_SHRINK) if w > 0 and a.candidate.shared_shift else 0.0

    def _from_peers(self) -> None:
        """Each candidate's prior, moved and narrowed by its own error on the other tasks and,
        for a drafter, by its error at the other K.

        Normal model: a configuration's log speed on task t is its prediction plus the task's
        shared shift plus b (its own error, common to the tasks) plus e_t ~ N(0, TASK_SIGMA^2).
        A peer task's measurements estimate b by their `own_error`, with variance TASK_SIGMA^2
        plus the per-request scatter over their evidence. A drafter's other K estimate it too,
        with K_SIGMA^2 more: what the cost model gets wrong about a drafter on these cores
        (its pass, its acceptance) is the drafter's at every K. The prior of b is what is left
        of the recommender's band after the task-to-task part; its posterior, plus e_t, is the
        prior here, which its own requests then update as any prior. A related arm's own_error
        reads only that arm's measurements, so nothing goes round in circles. Without related
        evidence the prior is the recommender's, unchanged."""
        for arm in self.arms.values():
            arm.peer_shift, arm.peer_sigma, arm.peer_weight = 0.0, None, 0.0
            if not arm.candidate.shared_shift:
                continue  # a prior made from a measured neighbour holds what is known already
            ts = TASK_SIGMA_LOOKUP if _match_only(arm.candidate) else TASK_SIGMA
            seen = [(e, a.noise**2 / a.weight + apart, a.weight)
                    for a, apart in self._related(arm, ts)
                    if (e := a.own_error) is not None]  # fmt: skip
            if not seen:
                continue
            s0 = arm.candidate.prior_sigma
            var_b = max(s0**2 - ts**2, MIN_PRIOR_SIGMA**2)
            prec = 1.0 / var_b + sum(1.0 / v for _, v, _ in seen)
            arm.peer_shift = sum(e / v for e, v, _ in seen) / prec
            arm.peer_sigma = min(math.sqrt(1.0 / prec + ts**2), s0)
            arm.peer_weight = sum(w for _, _, w in seen)

    def _related(self, arm: Arm, ts: float) -> Iterator[tuple[Arm, float]]:
        """The measured arms whose own error speaks for `arm`'s, each with how far theirs may
        sit from its (a log variance): the same configuration on the target's other tasks
        (ts^2), and a drafter at another K on this task (K_SIGMA^2) or on another (both)."""
        c = arm.candidate
        drafter = c.family if c.kind == KIND_DRAFT else None
        for policy in {id(p): p for p in (self, *self.peers)}.values():
            elsewhere = ts**2 if policy is not self else 0.0
            for other in policy.arms.values():
                o = other.candidate
                if other is arm or not o.shared_shift or other.weight <= 0:
                    continue
                if o.key == c.key:
                    yield other, elsewhere
                elif drafter is not None and o.kind == KIND_DRAFT and o.family == drafter:
                    yield other, K_SIGMA**2 + elsewhere

    def _retire(self) -> None:
        best = self.best()
        for arm in self.active:
            if arm is best or arm.weight + arm.peer_weight <= 0:
                continue  # only evidence, its own or the other tasks', retires a candidate
            if self._lookup_unjudged(arm):
                continue  # the other tasks' repetition says nothing of this one's
            p, limit = self._odds(arm, best)
            if p < limit and len(self.active) > 1:
                lo, mid, hi = best.band()
                arm.status = STATUS_RETIRED
                arm.why = (
                    f"{DOMINATED} {best.candidate.label} ({mid:.1f} t/s [{lo:.1f}-{hi:.1f}]): "
                    f"P(faster) = {p:.3f} after {arm.requests} request(s)"
                    + (f" and {arm.peer_weight:g} on other tasks or K" if arm.peer_weight else "")
                )
                self.events.append(f"retired {arm.candidate.label}: {arm.why}")

    @staticmethod
    def _odds(arm: Arm, best: Arm) -> tuple[float, float]:
        """(P(`arm` is faster than `best`), the P under which that retires it): with little
        evidence, only an overwhelming verdict does."""
        z = (arm.mean - best.mean) / math.hypot(arm.sigma, best.sigma)
        evidence = arm.weight + arm.peer_weight
        limit = RETIRE_P if evidence >= MIN_RETIRE_WEIGHT else RETIRE_P / 20
        return NormalDist().cdf(z), limit

    def _idle(self, arm: Arm) -> bool:
        """Whether the target hardly ever keeps `arm`'s drafts (see IDLE_SHARE): on its own
        requests and, for a lookup, on the requests others served that it was replayed on."""
        replay = arm.candidate.replay
        accepted = arm.accepted + (replay.steps.accepted if replay is not None else 0)
        generated = arm.generated + (replay.generated if replay is not None else 0)
        return arm.figured >= IDLE_RETIRE_REQUESTS and accepted < IDLE_SHARE * generated

    def _retire_idle(self, arm: Arm) -> None:
        """A speculative candidate whose drafts the target hardly ever keeps is plain decoding
        with extra work; with plain itself on offer it retires (see IDLE_SHARE)."""
        if not arm.active or arm.candidate.kind == KIND_PLAIN or not self._idle(arm):
            return
        if not any(a.active and a.candidate.kind == KIND_PLAIN for a in self.arms.values()):
            return
        replay = arm.candidate.replay
        self.retire(
            arm.candidate.key,
            f"{arm.accepted} accepted draft token(s) of {arm.generated} generated in "
            f"{arm.figured} request(s)"
            + (
                f" and {replay.steps.accepted} of {replay.generated} replayed on "
                f"{replay.requests} others served"
                if replay is not None
                else ""
            )
            + f" (under {IDLE_SHARE:.0%}): it decodes as plain decoding does, with the cost of "
            "drafting on top",
            idle=True,
        )

    def _move_k(self) -> None:
        if not self.k_ladder:
            return
        families: dict[str, list[Arm]] = {}
        for arm in self.arms.values():
            c = arm.candidate
            if c.family is not None and c.k is not None and c.origin != ORIGIN_PIN:
                families.setdefault(c.family, []).append(arm)  # pins stay pins
        for family, arms in families.items():
            live = [a for a in arms if a.active]
            if not live:
                continue
            top = max(live, key=lambda a: a.mean)
            if top.weight < EDGE_WEIGHT or top is not self.best():
                continue
            ks = sorted(a.candidate.k for a in arms if a.candidate.k is not None)
            k = top.candidate.k
            assert k is not None
            step = None
            if k == ks[-1]:
                step = next((x for x in self.k_ladder if x > k), None)
            if step is None and k == ks[0]:
                step = next((x for x in reversed(self.k_ladder) if x < k), None)
            if step is None:
                continue
            self._add_k(family, step, top)

    def _add_k(self, family: str, k: int, near: Arm) -> None:
        base = near.candidate
        why = f"{base.label} is the best of its K range and sits at its edge"
        if self.k_source is None:
            made = replace(base, key=f"{family}:K={k}", label=_with_k(base.label, base.k, k))
            made = replace(made, origin=ORIGIN_K_OUTWARD, family=family, k=k)
            self.add_near(base.key, made, why)
            return
        given = self.k_source(family, k, base)
        if given is not None:  # None: the caller cannot run that K
            self.add(replace(given, origin=ORIGIN_K_OUTWARD, family=family, k=k), why)

    # -- showing ------------------------------------------------------------------------------

    def why(self) -> str:
        best = self.best()
        lo, mid, hi = best.band()
        if len(self.active) == 1:
            return f"{best.candidate.label}: the only candidate left ({mid:.1f} t/s)"
        second = max((a for a in self.active if a is not best), key=lambda a: a.mean)
        z = (best.mean - second.mean) / math.hypot(best.sigma, second.sigma)
        return (
            f"{best.candidate.label}: best posterior {mid:.1f} t/s [{lo:.1f}-{hi:.1f}] after "
            f"{best.requests} request(s); P(better than {second.candidate.label}) = "
            f"{NormalDist().cdf(z):.2f}"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "choice": self.best().candidate.key,
            "why": self.why(),
            "candidates": [a.to_json() for a in self.arms.values()],
            "events": list(self.events),
            "noise_prior": self.noise_prior,
        }


def pick_candidates(
    offers: Sequence[Candidate], *, drafters: int = 3, per_ngram: int = 1
) -> list[Candidate]:
    """The few of a ranked list of offers worth serving: plain decoding always, the best
    `drafters` drafters each at its K and the
    neighbouring K of its family, the best stack, the best of each n-gram type, the best
    ngram-cache with a workload cache, the two best expert budgets. Best prior first.

    Three drafters, because predictions rank drafts of one size poorly: on the reference
    host's sweeps (benchmarks/serve_adaptive_sim.py) DeepSeek-R1-Distill-32B's fastest drafter
    is the third the prior ranks; with two, adaptive serving reached 0.84x that target's best
    fixed configuration, with three 0.95x (over all targets 0.951x -> 0.962x, and 0.892x ->
    0.903x the per-request oracle).
    """
    chosen: list[Candidate] = []

    plain = [o for o in offers if o.kind == KIND_PLAIN]
    if plain:
        chosen.append(max(plain, key=lambda o: o.prior_tps))
    drafts = sorted((o for o in offers if o.kind == KIND_DRAFT), key=lambda o: -o.prior_tps)
    tops = list({o.family: o for o in reversed(drafts)}.values())  # best offer per drafter
    for top in sorted(tops, key=lambda o: -o.prior_tps)[:drafters]:
        family = [o for o in drafts if o.family == top.family]
        ks = sorted({o.k for o in family if o.k is not None})
        near: set[int] = set()
        if top.k is not None and top.k in ks:
            i = ks.index(top.k)
            near = set(ks[max(i - 1, 0) : i + 2])
        chosen += [o for o in family if o is top or (o.k in near and o.k != top.k)]
    for kind, n in ((KIND_STACK, 1), (KIND_CACHE, 1), (KIND_EXPERTS, 2)):
        pool = sorted((o for o in offers if o.kind == kind), key=lambda o: -o.prior_tps)
        chosen += pool[:n]
    ngram_types = dict.fromkeys(o.family for o in offers if o.kind == KIND_NGRAM)
    for family_name in ngram_types:
        pool = sorted(
            (o for o in offers if o.kind == KIND_NGRAM and o.family == family_name),
            key=lambda o: -o.prior_tps,
        )
        chosen.extend(pool[:per_ngram])
    out = list({c.key: c for c in reversed(chosen)}.values())  # first of each key
    return sorted(out, key=lambda c: -c.prior_tps)


def _with_k(text: str, old: int | None, new: int) -> str:
    if old is not None and f"K={old}" in text:
        return text.replace(f"K={old}", f"K={new}")
    return f"{text} K={new}"


@dataclass(frozen=True)
class PolicyStatus:
    """Every task policy of a server, for `serve --dry-run` and the status endpoint."""

    JSON_KIND = "serve-policy"
    # 2: the host's figures the predictions used, each with its source; 3: each task's layout
    # (at level 1 and at each level it met) and `layouts`, the split replicas (serve.layouts)
    JSON_VERSION = "3"

    policy: str
    seed: int
    tasks: tuple[dict[str, Any], ...]
    replayed: int = 0  # stored requests read back at start-up
    extra: dict[str, Any] = field(default_factory=dict)  # e.g. the memory budget, backends
    # which host figures the predictions and the policy used, and where each came from
    figures: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return document(
            self.JSON_KIND,
            self.JSON_VERSION,
            {
                "policy": self.policy,
                "seed": self.seed,
                "replayed": self.replayed,
                "tasks": list(self.tasks),
                "figures": list(self.figures),
                **self.extra,
            },
        )
