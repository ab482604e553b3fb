"""The measurement protocol, written once for every engine: what a timed sample may have seen.

llama-server keeps some speculative state from one request to the next
(`specreg.llamacpp.CROSS_REQUEST_STATE`: ngram-mod's n-gram pool, ngram-cache's per-slot cache).
A sample timed on a server that has already answered its own prompt measures that memory, not
the method: on SmolLM2, ngram-mod drafts nothing for a code prompt on first encounter and
accepts 53 of 53 drafted tokens when the prompt comes again. So every engine (llama-server in
`measure`, the legacy tools in `legacy`) takes its samples through `collect`, which decides:

- First encounter (the default regime of `specreg run` and `verify`): a method that keeps state
  gets a fresh engine state, i.e. a new llama-server, for every timed sample and for every
  contention retry; a method that keeps none shares one server for the whole measurement.
  Why a fresh server rather than distinct prompts per repeat: a repeat must time the same prompt
  or its spread is not noise, and distinct prompts of one task would carry the earlier prompts'
  n-grams into the later ones (that is the warm regime, measured on purpose below). The price
  is one model load per sample (about 0.3 s for the 100 MB test models). It stays affordable for
  large models only because llama-server mmaps the GGUF and a restart finds its pages in the
  page cache: on the reference host a 400 GB model restarts in seconds for that reason alone,
  so when memory is too tight to keep the pages cached, measure fewer repeats, not replays.
- Warm (`warm_first=N`): distinct prompts of one task, each sent once, in order, to one server;
  the prompts after the first N are reported apart from the first ones. Never a replay: a
  workload that repeats a prompt is refused, and a sample disturbed by other processes is kept
  and counted (taking it again would replay it).
- Warm-up: every engine state answers a few tokens of a text outside the workload before its
  first timed sample (loads pages, spins up threads; never the workload's own n-grams).
- The legacy tools start one process per generation, so every sample is fresh by construction.

Load (issue 28): the caller holds the host's measurement lock and found the host quiet
(`specreg.host.load.guarded`); a sample that other processes disturbed anyway is taken again
after the host is quiet again (saying why), and `load_verdict` decides whether what was kept
can be trusted: a run measured under load, with samples others took CPU from, or whose repeats
spread beyond this host's quiet noise floor is `disturbed`, kept with the reason, never evidence.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any

from specreg.errors import UsageError, param
from specreg.host import progress
from specreg.host.load import DEFAULT_NOISE_FLOOR, LoadPolicy, current_policy, wait_quiet
from specreg.host.machine import Host
from specreg.llama.server import Completion
from specreg.llamacpp import CROSS_REQUEST_STATE, REQUEST_STATE, keeps_state
from specreg.runner.settings import Settings
from specreg.runner.workload import Prompt, Workload
from specreg.terms import REGIME_FIRST, REGIME_WARM

log = logging.getLogger(__name__)

PROTOCOL_VERSION = 2  # 1: the replaying protocol before issue 18 (never written by this code)
# How engine state is shared between timed samples.
ISOLATION_FRESH = "fresh-server-per-sample"  # the method keeps state across requests
ISOLATION_SHARED = "one-server"  # the method keeps none: one server serves every sample
ISOLATION_PROCESS = "process-per-sample"  # legacy tools: each generation is its own process
ISOLATION_SEQUENCE = "one-server-in-order"  # warm regime: distinct prompts, each once

WARMUP_TOKENS = 8
# Warm-up texts: none is a prompt of specreg's prompt sets; the first one that no workload
# prompt contains (and that contains none) is used.
WARMUP_TEXTS = (
    "Warm-up request. List the colours of a rainbow, one word each:",
    "Warm-up request. Name the planets of the solar system in order:",
)

# A later repeat that accepts this many more tokens than the first, for the same prompt, is
# measuring memory of the earlier answer (deterministic methods repeat their figures exactly).
REPLAY_MIN_TOKENS = 4
REPLAY_SHARE = 0.2  # ... and at least this share of the tokens it generated


def warmup_text(workload: Workload) -> str:
    """A warm-up text outside `workload`: no prompt contains it, it contains no prompt."""
    for text in WARMUP_TEXTS:
        if not any(text in p.text or p.text in text for p in workload.prompts):
            return text
    raise UsageError(
        "every warm-up text of specreg is part of the workload's prompts: remove the prompt "
        "that contains 'Warm-up request.'"
    )


@dataclass(frozen=True)
class Protocol:
    """How a measurement took its samples; recorded with every run."""

    regime: str  # first-encounter | warm
    isolation: str  # ISOLATION_*
    repeats: int
    contention_retries: int  # 0 in the warm regime: a retry would be a replay
    warmup_tokens: int  # 0: no warm-up
    warmup_sha256: str | None  # of the warm-up text (outside the workload)
    keeps_state: bool  # the method keeps state across requests in this build
    state_source: str  # where the build says so (common/speculative.cpp)
    warm_first: int | None = None  # warm regime: prompts reported as the first ones
    warmup_text: str | None = None  # the text itself (only its sha256 is recorded)
    # sha256 of the prompts whose text or output built state the run starts from (a lookup
    # cache, say): the workload is held out from them, or it would measure a replay
    built_from: tuple[str, ...] = ()
    # The load the measurement started under and the limits it was judged by (host/load.py),
    # set when the samples have been taken.
    load: dict[str, Any] | None = None
    version: int = PROTOCOL_VERSION

    @property
    def name(self) -> str:
        return f"{self.regime}/{self.isolation}/v{self.version}"

    def to_json(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "name": self.name,
            "regime": self.regime,
            "isolation": self.isolation,
            "repeats": self.repeats,
            "contention_retries": self.contention_retries,
            "warmup_tokens": self.warmup_tokens,
            "warmup_sha256": self.warmup_sha256,
            "keeps_state": self.keeps_state,
            "state_source": self.state_source,
            "warm_first": self.warm_first,
            "built_from_prompts": len(self.built_from),
            "built_from_sha256": (
                hashlib.sha256("".join(self.built_from).encode()).hexdigest()
                if self.built_from
                else None
            ),
            **({"load": self.load} if self.load is not None else {}),
        }


def state_source(spec_type: str) -> str:
    """The build's word on `spec_type`'s state, for the record."""
    unknown = "not described for this build: treated as keeping state"
    types = [t for t in spec_type.split(",") if t] or ["none"]
    return "; ".join(
        f"{t}: {CROSS_REQUEST_STATE.get(t) or REQUEST_STATE.get(t) or unknown}" for t in types
    )


def plan_protocol(
    spec_type: str,
    workload: Workload,
    settings: Settings,
    *,
    process_per_sample: bool = False,
    built_from: Iterable[str] = (),
) -> Protocol:
    """The protocol for `spec_type` on `workload` with an engine (llama-server, or a legacy
    tool: `process_per_sample`): the settings' repeats, retries, warm-up and regime.
    `built_from` names (sha256) the prompts whose text or output built state the engine starts
    with, such as a lookup cache: the workload may not hold one."""
    repeats, contention_retries = settings.repeats, settings.retries
    warm_first = settings.warm_first
    stateful = keeps_state(spec_type)
    text = warmup_text(workload) if settings.warmup else None
    if warm_first is not None:
        if process_per_sample:
            raise UsageError(
                "the warm regime needs one long-lived llama-server; the legacy tools start a "
                f"process per prompt: use {param('engine')} server"
            )
        regime, isolation, repeats, contention_retries = REGIME_WARM, ISOLATION_SEQUENCE, 1, 0
    elif process_per_sample:
        regime, isolation = REGIME_FIRST, ISOLATION_PROCESS
    else:
        regime, isolation = REGIME_FIRST, ISOLATION_FRESH if stateful else ISOLATION_SHARED
    return Protocol(
        regime=regime,
        isolation=isolation,
        repeats=repeats,
        contention_retries=contention_retries,
        warmup_tokens=WARMUP_TOKENS if text else 0,
        warmup_sha256=hashlib.sha256(text.encode()).hexdigest() if text else None,
        keeps_state=stateful,
        state_source=state_source(spec_type),
        warm_first=warm_first,
        warmup_text=text,
        built_from=tuple(sorted(set(built_from))),
    )


def check_held_out(workload: Workload, built_from: Iterable[str]) -> None:
    """Refuse to evaluate on a prompt that built the state the engine starts from: a lookup
    cache built from a prompt's own output drafts that output back (a replay)."""
    built = set(built_from)
    again = [p.prompt_id for p in workload.prompts if p.sha256 in built]
    if again:
        raise UsageError(
            f"{', '.join(again)} built the state this run starts from (a lookup cache, say): "
            "evaluate on prompts held out from what built it"
        )


class Sampler(ABC):
    """One engine state that generates: a llama-server process, or a legacy tool."""

    @abstractmethod
    def generate(self, text: str, n_predict: int) -> Completion: ...


class Engine(ABC):
    """Where samples come from: `session()` opens one engine state (a llama-server process,
    started, checked and ready; for the legacy tools, a handle whose every call is a process)."""

    process_per_sample = False

    @abstractmethod
    def session(self) -> AbstractContextManager[Sampler]: ...


@dataclass(frozen=True)
class Sample:
    completion: Completion
    session: int  # which engine state answered (0, 1, ... in order of start)
    position: int  # timed requests that state had answered before this one


@dataclass(frozen=True)
class PromptSamples:
    prompt: Prompt
    samples: tuple[Sample, ...]
    contended: int  # samples taken again (first encounter) or kept though disturbed (warm)


def contended(c: Completion, host: Host) -> bool:
    if c.foreign_cpu_s is None:
        return False
    # More than a tenth of a core-second per second of wall time went to someone else.
    return c.foreign_cpu_s > 0.05 + 0.1 * c.wall_s * max(1, host.logical_cpus - 1)


def least_contended(
    take: Callable[[], Sample],
    host: Host,
    retries: int,
    before_retry: Callable[[Completion], None] | None = None,
) -> tuple[Sample, int]:
    """One sample, taken again (up to `retries` times) while other processes took the CPU:
    the least disturbed sample, and how many times it was taken again. `before_retry` runs
    before each retry with the disturbed sample (say why, wait for a quiet host)."""
    best: Sample | None = None
    again = 0
    for attempt in range(retries + 1):
        got = take()
        if best is None or (got.completion.foreign_cpu_s or 0) < (
            best.completion.foreign_cpu_s or 0
        ):
            best = got
        if not contended(got.completion, host):
            break
        if attempt < retries:
            again += 1
            if before_retry is not None:
                before_retry(got.completion)
    assert best is not None
    return best, again


def _retry_after_load(host: Host, what: str) -> Callable[[Completion], None]:
    """Before a sample is taken again: say why, and wait for the host to be quiet again
    (bounded; under --allow-load it is measured again at once)."""

    def before_retry(c: Completion) -> None:
        progress.note(
            f"{what}: sample taken again: other processes used {c.foreign_cpu_s or 0:.2f} "
            f"CPU-seconds during its {c.wall_s:.2f} s"
        )
        policy = current_policy()
        if not policy.allow_load:
            wait_quiet(host.logical_cpus, what, policy=policy)

    return before_retry


class _State:
    """An open engine state and how many timed requests it has answered."""

    def __init__(self, sampler: Sampler, session: int):
        self.sampler = sampler
        self.session = session
        self.served = 0

    def take(self, text: str, n_predict: int) -> Sample:
        got = self.sampler.generate(text, n_predict)
        sample = Sample(got, self.session, self.served)
        self.served += 1
        return sample


@contextmanager
def _state(
    engine: Engine, sessions: Iterator[int], warmup: str | None, warmup_tokens: int
) -> Iterator[_State]:
    """A new engine state, warmed up on the text outside the workload."""
    with engine.session() as sampler:
        if warmup is not None and warmup_tokens:
            sampler.generate(warmup, warmup_tokens)
        yield _State(sampler, next(sessions))


class SamplingInterrupted(KeyboardInterrupt):
    """Ctrl-C while sampling, with the samples taken before it (so they can be recorded)."""

    def __init__(self, samples: tuple[PromptSamples, ...]):
        super().__init__()
        self.samples = samples


class _Collection:
    """The samples of one `collect` call as they are taken, and the engine states they come
    from: a step of the progress bar per kept sample."""

    def __init__(
        self, engine: Engine, workload: Workload, protocol: Protocol, host: Host, label: str
    ):
        self.engine = engine
        self.workload = workload
        self.protocol = protocol
        self.host = host
        self.sessions = itertools.count()
        self.samples: dict[str, list[Sample]] = {p.prompt_id: [] for p in workload.prompts}
        self.again: dict[str, int] = {p.prompt_id: 0 for p in workload.prompts}
        self.retry = _retry_after_load(host, label)

    def state(self) -> AbstractContextManager[_State]:
        """A new engine state, warmed up."""
        p = self.protocol
        return _state(self.engine, self.sessions, p.warmup_text, p.warmup_tokens)

    def kept(self, prompt: Prompt, sample: Sample, repeat: int, bar: progress.Task) -> None:
        self.samples[prompt.prompt_id].append(sample)
        tps = sample.completion.tokens_per_s
        bar.advance(detail=f"{prompt.prompt_id} #{repeat + 1}: {tps:.1f} tok/s")

    def least_contended(self, take: Callable[[], Sample], prompt: Prompt) -> Sample:
        """`take` again while other processes disturbed it; the retries are counted."""
        best, n = least_contended(take, self.host, self.protocol.contention_retries, self.retry)
        self.again[prompt.prompt_id] += n
        return best

    def done(self) -> tuple[PromptSamples, ...]:
        return tuple(
            PromptSamples(p, tuple(self.samples[p.prompt_id]), self.again[p.prompt_id])
            for p in self.workload.prompts
        )


Finish = Callable[[Sampler, tuple[PromptSamples, ...]], None]


def _warm(c: _Collection, n_predict: int, finish: Finish | None, bar: progress.Task) -> None:
    """The warm regime: distinct prompts once each, in order, on one engine state; a disturbed
    sample is kept and counted (taking it again would replay it)."""
    repeated = c.workload.repeated()
    if repeated:
        raise UsageError(
            f"{', '.join(repeated)} repeat(s) an earlier prompt: the warm regime sends "
            "distinct prompts, never replays"
        )
    with c.state() as state:
        for prompt in c.workload.prompts:
            got = state.take(prompt.text, n_predict)
            c.again[prompt.prompt_id] += contended(got.completion, c.host)
            c.kept(prompt, got, 0, bar)
        if finish is not None:
            finish(state.sampler, c.done())


def _fresh(c: _Collection, n_predict: int, finish: Finish | None, bar: progress.Task) -> None:
    """A method that keeps state: a new engine state for every sample and every retry."""
    for r in range(c.protocol.repeats):
        for prompt in c.workload.prompts:

            def fresh(text: str = prompt.text) -> Sample:
                with c.state() as state:
                    return state.take(text, n_predict)

            c.kept(prompt, c.least_contended(fresh, prompt), r, bar)
    if finish is not None:
        with c.state() as state:
            finish(state.sampler, c.done())


def _shared(c: _Collection, n_predict: int, finish: Finish | None, bar: progress.Task) -> None:
    """One engine state for every sample, or a legacy tool: a process per generation."""
    per_call = c.protocol.isolation == ISOLATION_PROCESS
    with c.state() as state:

        def take(text: str) -> Sample:
            got = state.take(text, n_predict)
            # each generation of a legacy tool is its own process: a state of its own
            return Sample(got.completion, next(c.sessions), 0) if per_call else got

        for r in range(c.protocol.repeats):
            for prompt in c.workload.prompts:
                best = c.least_contended(functools.partial(take, prompt.text), prompt)
                c.kept(prompt, best, r, bar)
        if finish is not None:
            finish(state.sampler, c.done())


def collect(
    engine: Engine,
    workload: Workload,
    protocol: Protocol,
    host: Host,
    *,
    n_predict: int,
    finish: Finish | None = None,
    label: str = "samples",
) -> tuple[PromptSamples, ...]:
    """Every timed sample of `workload` under `protocol`. `finish` runs once after them, on a
    state that may have seen the workload, for untimed extras (reference probabilities, the
    probe of a divergence). Raises the engine's failure (`ServerFailed`) as it comes, and
    Ctrl-C as `SamplingInterrupted` with the samples taken so far. Progress (`label`, a step
    per kept sample) and the reason for every retry go to `specreg.host.progress`."""
    check_held_out(workload, protocol.built_from)
    c = _Collection(engine, workload, protocol, host, label)
    warm = protocol.regime == REGIME_WARM
    total = len(workload.prompts) * (1 if warm else protocol.repeats)
    how = _warm if warm else _fresh if protocol.isolation == ISOLATION_FRESH else _shared
    try:
        with progress.task(f"measuring {label}", total) as bar:
            how(c, n_predict, finish, bar)
            return c.done()
    except KeyboardInterrupt as err:
        raise SamplingInterrupted(c.done()) from err


# -- what the samples say ---------------------------------------------------------------------


@dataclass(frozen=True)
class Figures:
    """Drafted, accepted and speed over a set of samples (a repeat, a phase of a warm run)."""

    n_samples: int
    predicted_n: int
    predicted_ms: float
    draft_n: int
    draft_n_accepted: int

    @property
    def tokens_per_s(self) -> float | None:
        return self.predicted_n / (self.predicted_ms / 1000) if self.predicted_ms > 0 else None

    @property
    def acceptance(self) -> float | None:
        return self.draft_n_accepted / self.draft_n if self.draft_n else None

    @classmethod
    def of(cls, completions: Sequence[Completion]) -> Figures:
        return cls(
            n_samples=len(completions),
            predicted_n=sum(c.predicted_n for c in completions),
            predicted_ms=sum(c.predicted_ms for c in completions),
            draft_n=sum(c.draft_n for c in completions),
            draft_n_accepted=sum(c.draft_n_accepted for c in completions),
        )

    def to_json(self) -> dict[str, Any]:
        tps, acc = self.tokens_per_s, self.acceptance
        return {
            "n_samples": self.n_samples,
            "predicted_n": self.predicted_n,
            "draft_n": self.draft_n,
            "draft_n_accepted": self.draft_n_accepted,
            "tokens_per_s": None if tps is None else round(tps, 3),
            "acceptance": None if acc is None else round(acc, 4),
        }


def repeat_figures(per_prompt: Sequence[Sequence[Completion]], repeats: int) -> list[Figures]:
    """One `Figures` per repeat, over all prompts' samples of that repeat."""
    out = []
    for r in range(repeats):
        got = [samples[r] for samples in per_prompt if len(samples) > r]
        if got:
            out.append(Figures.of(got))
    return out


def phase_figures(ordered: Sequence[Completion], first: int) -> dict[str, Figures]:
    """A warm run's figures: its first `first` prompts, and the later ones."""
    return {"first": Figures.of(ordered[:first]), "later": Figures.of(ordered[first:])}


def replay_flags(per_prompt: Sequence[tuple[str, Sequence[Completion]]]) -> tuple[str, ...]:
    """Prompts whose later repeats accepted far more than their first: such figures measure a
    memory of the earlier answer, not the method."""
    flags = []
    for prompt_id, samples in per_prompt:
        if len(samples) < 2:
            continue
        first = samples[0].draft_n_accepted
        for r, s in enumerate(samples[1:], 2):
            jump = s.draft_n_accepted - first
            if jump >= max(REPLAY_MIN_TOKENS, REPLAY_SHARE * max(s.predicted_n, 1)):
                flags.append(
                    f"{prompt_id}: repeat {r} accepted {s.draft_n_accepted} tokens, repeat 1 "
                    f"{first}"
                )
                break
    return tuple(flags)


# -- whether the samples can be trusted (issue 28) ----------------------------------------------

DISTURBED = "disturbed"


@dataclass(frozen=True)
class LoadVerdict:
    """Whether a measurement's samples were disturbed by other processes, and the facts."""

    reason: str | None  # None: clean
    facts: dict[str, Any]

    @property
    def disturbed(self) -> bool:
        return self.reason is not None


def _spread(values: Sequence[float]) -> float | None:
    """max/min - 1 of the positive values (None for fewer than two)."""
    got = [v for v in values if v > 0]
    if len(got) < 2:
        return None
    return max(got) / min(got) - 1.0


def load_verdict(
    per_prompt: Sequence[tuple[str, Sequence[Completion]]],
    *,
    logical_cpus: int,
    warm: bool,
    before: dict[str, Any] | None = None,
    policy: LoadPolicy | None = None,
) -> LoadVerdict:
    """Disturbed when the measurement started under load (`before["busy"]`: --allow-load),
    when other processes took more than the allowed cores during a kept sample, or when a
    prompt's repeats spread beyond what this host shows when quiet (not in the warm regime,
    whose samples are distinct prompts). `before`: the load check it started with."""
    policy = policy or current_policy()
    limit = policy.cores_allowed(logical_cpus)
    reasons: list[str] = []
    if before and before.get("busy"):
        reasons.append(f"measured under load (--allow-load): {before.get('described') or '-'}")
    n_samples = 0
    loaded: list[float] = []
    for _, completions in per_prompt:
        for c in completions:
            n_samples += 1
            if c.foreign_cpu_s is not None and c.foreign_cpu_s > 0.05 + limit * c.wall_s:
                loaded.append(c.foreign_cpu_s / max(c.wall_s, 1e-3))
    if loaded:
        reasons.append(
            f"other processes used up to {max(loaded):.1f} cores during {len(loaded)} of "
            f"{n_samples} samples (at most {limit:.2f} allowed)"
        )
    allowed = policy.spread_allowed
    floor = policy.noise_floor
    widest: tuple[float, str, float, float] | None = None
    if not warm:
        for prompt_id, completions in per_prompt:
            tps = [c.tokens_per_s for c in completions if c.predicted_ms > 0]
            spread = _spread(tps)
            if spread is not None and (widest is None or spread > widest[0]):
                widest = (spread, prompt_id, min(tps), max(tps))
    if widest is not None and widest[0] > allowed:
        spread, prompt_id, lo, hi = widest
        measured = "quiet noise floor" if floor is not None else "assumed noise floor"
        reasons.append(
            f"the repeats of {prompt_id} spread {spread + 1:.1f}x ({lo:.1f}-{hi:.1f} tok/s), "
            f"beyond this host's {measured} of "
            f"{DEFAULT_NOISE_FLOOR if floor is None else floor:.0%} (at most {allowed:.0%} allowed)"
        )
    reason = "; ".join(reasons) or None
    facts = {
        **policy.to_json(logical_cpus),
        "before": before,
        "samples_loaded": len(loaded),
        "spread": None if widest is None else round(widest[0], 4),
        "disturbed": reason,
    }
    return LoadVerdict(reason, facts)
