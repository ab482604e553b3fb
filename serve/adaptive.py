"""The running server's choices: one policy per (target, task), fed by served requests.

Under `--policy fixed` every request of a task goes to its route (today's behaviour). Under
`--policy adaptive` each (target, task) has a `TaskPolicy` (specreg.serve.policy) over the
candidates the plan gave it; a candidate is the name of the backend that runs it. The evidence
is the registry's served runs: at start-up `replay` feeds every recorded request of this
target and task back in order, so a restarted server continues where it stopped.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from specreg.registry.run_store import RunRecord
from specreg.serve.loadpolicy import LoadModel, LoadPolicy, level_of, roofline_cost
from specreg.serve.policy import (
    DOMINATED,
    KIND_PLAIN,
    ORIGIN_TRAFFIC_CACHE,
    REQUEST_SCATTER,
    Candidate,
    PolicyStatus,
    Replay,
    TaskPolicy,
    request_sigma,
)
from specreg.serve.routes import POLICY_ADAPTIVE, POLICY_FIXED, CandidateRoute, RouteTable
from specreg.terms import TASKS

REASON_FIXED = "fixed"  # the fixed policy's only reason
REASON_RETRY = "retry"  # the second attempt of a request, on the current best
REASON_JOINED = "joined"  # it joined another lossless backend of its target: cores were busy
SERVE_KEY = "serve"  # a served run's config[SERVE_KEY]: policy, candidate, reason, concurrency
# A request may join another lossless candidate whose cores serve it sooner only when that one's
# posterior speed at the load is at least this share of the chosen one's: joining a draft that
# decodes at half speed to start sooner costs more than the wait (serve_load.py's varying load
# on the Qwen pair, 2026-11-27: a burst joined the draft one request was exploring).
JOIN_SHARE = 0.8

Lookups = dict[str, tuple[int, int]]  # ngram-mod candidates to replay on: key -> (n_max, n_min)


@dataclass(frozen=True)
class Pick:
    """Where one request goes: the backend, and why the policy sent it there."""

    backend: str
    reason: str  # explore | exploit | only | fixed | retry
    best: str  # the backend with the best posterior when it was chosen


def _candidate(c: CandidateRoute) -> Candidate:
    return Candidate(
        key=c.backend,
        label=c.label,
        prior_tps=c.prior_tps,
        prior_lo=c.prior_lo,
        prior_hi=c.prior_hi,
        prior_band=c.prior_band,
        k=c.k,
        family=c.family,
        kind=c.kind,
        origin=c.origin,
        lookup_verify=c.lookup_verify,
    )


class Router:
    """Every (target, task)'s policy; the fixed policy is a table lookup."""

    def __init__(
        self,
        table: RouteTable,
        *,
        seed: int = 0,
        load_models: dict[str, LoadModel] | None = None,
    ):
        """`load_models`: per target name, how its configurations' speeds fall with load
        (default: a linear pass cost, as on a compute-bound host)."""
        self.table = table
        self.seed = seed
        self.adaptive = table.policy == POLICY_ADAPTIVE
        self.policies: dict[tuple[str, str], TaskPolicy] = {}  # level 1: a quiet server
        self.loads: dict[tuple[str, str], LoadPolicy] = {}  # every level
        self.replayed = 0
        if not self.adaptive:
            return
        for target in table.targets:
            for task in TASKS:
                cands = table.candidates_of(target.name, task)
                active = [_candidate(c) for c in cands if not c.reserve]
                if not active:
                    continue
                reserve = [_candidate(c) for c in cands if c.reserve]
                ladder = sorted({c.k for c in cands if c.k is not None and c.family is not None})

                def k_source(
                    family: str, k: int, near: Candidate, _reserve: list[Candidate] = reserve
                ) -> Candidate | None:
                    return next((r for r in _reserve if r.family == family and r.k == k), None)

                self.policies[(target.name, task)] = TaskPolicy(
                    f"{target.name}/{task}",
                    active,
                    seed=seed,
                    k_ladder=ladder,
                    k_source=k_source,
                    noise_prior=request_sigma(table.noise),
                )

        # a configuration's error against its prediction is shared by the tasks of a target
        for target in table.targets:
            same = [p for (t, _), p in self.policies.items() if t == target.name]
            for p in same:
                p.peers = same
        models = load_models or {}
        for (target_name, task), p in self.policies.items():
            model = models.get(target_name) or LoadModel(roofline_cost(1.0), source="default")
            self.loads[(target_name, task)] = LoadPolicy(p, model)

    @property
    def name(self) -> str:
        return POLICY_ADAPTIVE if self.adaptive else POLICY_FIXED

    def policy(self, target: str, task: str) -> TaskPolicy | None:
        return self.policies.get((target, task))

    def choose(self, target: str, task: str, *, load: int = 1) -> Pick:
        """Where a request goes; `load` is the requests decoding or waiting on the target's
        cores when it arrives, itself included."""
        loads = self.loads.get((target, task))
        if loads is None:
            route = self.table.route(target, task)
            return Pick(route.backend, REASON_FIXED, route.backend)
        d = loads.choose(load)
        return Pick(d.key, d.reason, d.best_key)

    def ranked(self, target: str, task: str, *, load: int = 1) -> list[str]:
        """(target, task)'s backends, best first at `load`: the active candidates by
        posterior (adaptive) or its route (fixed)."""
        loads = self.loads.get((target, task))
        if loads is None:
            return [self.table.route(target, task).backend]
        policy = loads.at(level_of(load))
        return [a.candidate.key for a in sorted(policy.active, key=lambda a: -a.mean)]

    def joinable(self, target: str, task: str, chosen: str, *, load: int = 1) -> list[str] | None:
        """The candidates a request chosen for `chosen` may join instead, best first: those
        the policy still holds at `load`, or retired only as idle (a lookup that finds nothing
        to draft on this task decodes as plain does: no gain, no loss), whose posterior speed
        is at least JOIN_SHARE of `chosen`'s. None: no policy for (target, task) (fixed: any
        lossless backend)."""
        loads = self.loads.get((target, task))
        if loads is None:
            return None
        policy = loads.at(level_of(load))
        mine = policy.arms.get(chosen)
        floor = mine.mean + math.log(JOIN_SHARE) if mine is not None else -math.inf
        held = [a for a in policy.arms.values() if a.active or a.idle]
        ranked = sorted(held, key=lambda a: -a.mean)
        return [a.candidate.key for a in ranked if a.candidate.key != chosen and a.mean >= floor]

    def best(self, target: str, task: str) -> str:
        policy = self.policy(target, task)
        if policy is None:
            return self.table.route(target, task).backend
        return policy.best().candidate.key

    def observe(
        self,
        target: str,
        task: str,
        backend: str,
        tps: float | None,
        concurrency: int,
        *,
        drafted: int | None = None,
        accepted: int | None = None,
        generated: int | None = None,
        cold: bool = False,
    ) -> None:
        loads = self.loads.get((target, task))
        if loads is not None:
            loads.observe(
                backend, tps, concurrency=concurrency, drafted=drafted, accepted=accepted,
                generated=generated, cold=cold,
            )  # fmt: skip

    def lookups_to_replay(self, target: str, task: str, served_by: str) -> Lookups:
        """(target, task)'s ngram-mod candidates that a request `served_by` served speaks
        for, each with its (n_max, n_min): the active ones and those retired on evidence (a
        replay may reinstate them: `TaskPolicy.reconsider`), `served_by` itself excepted
        (its own requests are measured)."""
        policy = self.policy(target, task)
        if policy is None:
            return {}
        out = {}
        for key, arm in policy.arms.items():
            if key == served_by or arm.candidate.lookup_verify is None:
                continue
            bounds = self.table.backend(key).config.ngram_mod_bounds()
            if bounds is not None and (arm.active or arm.judged_out):
                out[key] = bounds
        return out

    def observe_replay(self, target: str, task: str, key: str, replay: Replay) -> None:
        loads = self.loads.get((target, task))
        if loads is not None:
            loads.observe_replay(key, replay)

    def offer_cache(self, route: CandidateRoute, why: str) -> list[str]:
        """A cache grown from (target, task)'s traffic joins its policy, its prior the older
        cache's posterior where that has evidence, else plain decoding's (ngram-cache drafts
        from the cache and decodes plainly where it finds nothing); older caches of the task
        retire. Returns the backends no policy keeps any more (stop them)."""
        policy = self.policy(route.target, route.task)
        if policy is None or len(policy.arms) < 2:
            return []  # no policy, or a pin of one configuration: it stays a pin
        older = [a for a in policy.arms.values() if a.candidate.origin == ORIGIN_TRAFFIC_CACHE
                 and a.candidate.key != route.backend]  # fmt: skip
        near = next((a for a in reversed(older) if a.weight > 0), None)
        if near is None:
            near = next((a for a in policy.active if a.candidate.kind == KIND_PLAIN), None)
        near = near or policy.best()
        joined = _candidate(route)
        if not policy.add_near(near.candidate.key, joined, why):
            return []
        gone = []
        for arm in older:
            policy.retire(arm.candidate.key, f"superseded by {joined.label}")
            if not any(arm.candidate.key in p.arms and p[arm.candidate.key].active
                       for p in self.policies.values()):  # fmt: skip
                gone.append(arm.candidate.key)
        return gone

    def takes_cache(self, target: str, task: str) -> bool:
        """Whether a cache grown from (target, task)'s traffic could join its candidates:
        it chooses among several (a pin of one configuration stays a pin)."""
        policy = self.policy(target, task)
        return policy is not None and len(policy.arms) >= 2

    def cache_lost(self, target: str, task: str) -> bool:
        """Whether (target, task)'s newest cache grown from traffic lost to another candidate
        on evidence: retired as dominated (not superseded by a newer one), or measured and not
        the task's best (one bad try seldom retires it, and a newer cache built from `every`
        more requests would cost another try: SmolLM2's summarize paid three such)."""
        policy = self.policy(target, task)
        if policy is None:
            return False
        caches = [a for a in policy.arms.values() if a.candidate.origin == ORIGIN_TRAFFIC_CACHE]
        if not caches:
            return False
        newest = caches[-1]
        if not newest.active:
            return newest.why.startswith(DOMINATED)
        return newest.weight > 0 and policy.best() is not newest

    def retire(self, backend: str, why: str) -> bool:
        """Retire `backend` in every policy offering it; True when none keeps it (it was
        nobody's last candidate), so it need not run again."""
        kept = False
        for key, policy in self.policies.items():
            if backend in policy.arms:
                self.loads[key].retire(backend, why)
                kept = kept or policy[backend].active
        return self.adaptive and not kept and not self._routed_fixed(backend)

    def _routed_fixed(self, backend: str) -> bool:
        return any(
            r.backend == backend
            for r in self.table.routes
            if (r.target, r.task) not in self.policies
        )

    def replay(self, runs: Iterable[RunRecord]) -> int:
        """Feed recorded served requests (any order: sorted oldest first here) back in."""
        if not self.adaptive:
            return 0
        by_id = {t.model_id: t.name for t in self.table.targets}
        ordered = sorted(runs, key=lambda r: (r.started_at, r.run_id or 0))
        n = 0
        for run in ordered:
            target = by_id.get(run.target_model_id or "")
            backend = run.config.get("backend")
            if run.kind != "serve" or target is None or run.task is None or backend is None:
                continue
            policy = self.policy(target, run.task)
            loads = self.loads.get((target, run.task))
            if policy is None or loads is None or backend not in policy.arms:
                continue
            info = run.config.get(SERVE_KEY) or {}
            retired = info.get("retired") if isinstance(info, dict) else None
            if retired:
                loads.retire(backend, str(retired))
                continue
            if run.status != "ok" or not run.tokens_per_s:
                continue
            concurrency = int(info.get("concurrency", 1)) if isinstance(info, dict) else 1
            loads.observe(
                backend,
                run.tokens_per_s,
                concurrency=concurrency,
                drafted=run.draft_n,
                accepted=run.draft_n_accepted,
                generated=run.prompts[0].predicted_n if run.prompts else None,
                cold=isinstance(info, dict) and info.get("warm") is False,
            )
            replays = info.get("replays") if isinstance(info, dict) else None
            for key, doc in (replays or {}).items() if isinstance(replays, dict) else ():
                replay = Replay.from_json(doc)
                if replay is not None and key in policy.arms:
                    loads.observe_replay(key, replay)
            n += 1
        self.replayed += n
        return n

    def status(self) -> PolicyStatus:
        tasks: list[dict[str, Any]] = []
        for target in self.table.targets:
            for task in TASKS:
                loads = self.loads.get((target.name, task))
                if loads is not None:
                    doc = loads.to_json()
                else:
                    route = self.table.route(target.name, task)
                    doc = {"name": f"{target.name}/{task}", "choice": route.backend,
                           "why": route.reason, "candidates": [], "events": []}  # fmt: skip
                tasks.append({"target": target.name, "task": task, **doc})
        figures = (
            f"noise prior of a request {request_sigma(self.table.noise):.3f} (log): "
            f"{REQUEST_SCATTER:g} x the {self.table.noise.label}",
            *self.table.figures,
        )
        return PolicyStatus(
            self.name, self.seed, tuple(tasks), replayed=self.replayed, figures=figures
        )


def finite(value: Any) -> float | None:
    """A number fit for evidence (llama-server reports 0 or inf for empty generations)."""
    if isinstance(value, (int, float)) and math.isfinite(value) and value > 0:
        return float(value)
    return None
