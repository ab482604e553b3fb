"""Each candidate measured once before `serve` listens, so users' requests do not pay for it.

The adaptive policy's priors are the recommender's predictions. On a host `specreg calibrate`
never measured they can be far off: on this 2-core host they put the Qwen2.5-Coder pair's
draft at 0.7-0.8x plain decoding, where it decodes at 0.1-0.75x (docs/measurements/
real-pair.md), and with one client the policy tried each K on a user's request at half speed.
A probe costs seconds of start-up instead: each candidate the pool started ahead of requests
decodes the same shipped prompt of one task (PROBE_TOKENS tokens, temperature 0), one
candidate at a time on otherwise idle cores, and the policy takes its decode speed, drafts and
acceptance as a request at load 1 on that task. The target's other tasks hear of it as they
hear of any request (their peers, `TaskPolicy._from_peers`).

Not probed: candidates that draft from what their server has read (n-gram lookups and caches,
stacks holding one: a probe would leave text no user sent in their state, which outlives a
request), and candidates that have evidence already (a restarted server replays its served
runs). A probe is not a served request: it is not recorded as a run.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from specreg.runner.workload import task_prompts
from specreg.serve.adaptive import Router, finite
from specreg.serve.backends import Backend
from specreg.serve.policy import KIND_DRAFT, KIND_PLAIN, TaskPolicy

log = logging.getLogger(__name__)

PROBE_TOKENS = 48
# The task probes run on, where a target serves it: code's prompts repeat least of the shipped
# tasks' and drafts' acceptance on it sits mid-range; the others hear through their peers.
PROBE_TASK = "code"
PROBE_TIMEOUT_S = 300.0
PROBED_KINDS = (KIND_PLAIN, KIND_DRAFT)  # no state that outlives a request


@dataclass(frozen=True)
class Probed:
    """One candidate's probe: llama-server's timings of its answer, or why there are none."""

    backend: str
    timings: Mapping[str, Any] = field(default_factory=dict)
    error: str = ""

    @property
    def tps(self) -> float | None:
        return finite(self.timings.get("predicted_per_second"))

    def drafts(self) -> tuple[int, int, int | None]:
        """Draft tokens proposed, accepted, and tokens generated, as served requests count
        them: timings without draft figures drafted nothing."""
        t = self.timings
        generated = int(t.get("predicted_n", 0) or 0) or None
        return int(t.get("draft_n", 0) or 0), int(t.get("draft_n_accepted", 0) or 0), generated

    def line(self) -> str:
        if self.tps is None:
            return f"{self.backend}: not probed ({self.error})"
        drafted, accepted, _ = self.drafts()
        kept = f", {accepted}/{drafted} drafts kept" if drafted else ""
        return f"{self.backend}: {self.tps:.1f} t/s{kept}"


def probe_plan(router: Router, running: Mapping[str, Backend]) -> list[tuple[str, str, str]]:
    """(target, task, backend) for every candidate to probe, plain decoding first in each
    target (it anchors the host's error for the rest)."""
    plan: list[tuple[str, str, str]] = []
    targets = dict.fromkeys(t for t, _ in router.policies)
    for target in targets:
        tasks = [task for t, task in router.policies if t == target]
        task = PROBE_TASK if PROBE_TASK in tasks else tasks[0]
        policy = router.policies[(target, task)]
        arms = [a for a in policy.arms.values() if _probed(policy, a.candidate.key, running)]
        arms.sort(key=lambda a: a.candidate.kind != KIND_PLAIN)
        plan += [(target, task, a.candidate.key) for a in arms]
    return plan


def _probed(policy: TaskPolicy, key: str, running: Mapping[str, Backend]) -> bool:
    arm = policy.arms[key]
    backend = running.get(key)
    return (
        arm.active
        and arm.requests == 0
        and arm.candidate.kind in PROBED_KINDS
        and backend is not None
        and backend.ready.is_set()
    )


async def probe_candidates(router: Router, backends: Mapping[str, Backend]) -> list[Probed]:
    """Probe what `probe_plan` names, one at a time, and tell the policy each result."""
    plan = probe_plan(router, backends)
    if not plan:
        return []
    prompts = {task: task_prompts(task)[0].text for _, task, _ in plan}
    out = []
    timeout = aiohttp.ClientTimeout(total=PROBE_TIMEOUT_S)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        for target, task, name in plan:
            got = await _probe(session, backends[name], prompts[task])
            if got.tps is not None:
                drafted, accepted, generated = got.drafts()
                router.observe(
                    target, task, name, got.tps, 1, drafted=drafted, accepted=accepted,
                    generated=generated,
                )  # fmt: skip
            else:
                log.warning("probe of %s failed: %s", name, got.error)
            out.append(got)
    return out


async def _probe(session: aiohttp.ClientSession, backend: Backend, prompt: str) -> Probed:
    body = {
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": PROBE_TOKENS,
        "temperature": 0,
    }
    try:
        async with session.post(backend.url + "/v1/chat/completions", json=body) as resp:
            answer = await resp.json(content_type=None)
            if resp.status != 200:
                return Probed(backend.name, error=f"HTTP {resp.status}")
    except (aiohttp.ClientError, TimeoutError, ValueError) as err:
        return Probed(backend.name, error=str(err) or type(err).__name__)
    timings = answer.get("timings") if isinstance(answer, dict) else None
    if not isinstance(timings, dict) or finite(timings.get("predicted_per_second")) is None:
        return Probed(backend.name, error="no timings in the answer")
    return Probed(backend.name, timings)
