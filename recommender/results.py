"""What `recommend` answers with: options with their prediction, band, evidence and why, and the
recommendation that ranks them (`to_json` is what `recommend --json` prints)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from specreg.host.facts import HostFacts
from specreg.recommender.acceptance import ACC_PREDICTED, MeasuredAgreement
from specreg.recommender.calibrated import PassFactor
from specreg.recommender.quality_cost import QualityCost
from specreg.recommender.roofline import Roofline
from specreg.registry.noise import FALLBACK_NOISE, NoiseFigure
from specreg.registry.queries import human_bytes
from specreg.terms import DEFAULT_TYPE_OF, Method


@dataclass(frozen=True)
class Knob:
    name: str
    value: str
    lossless: bool


@dataclass(frozen=True)
class Evidence:
    """A measured run an option cites: where it comes from, what it measured, and what it was
    (its target - the option's own, or the nearest other one at `distance` - draft, K, task,
    temperature, experts, host) with what it differs in from the option (`differs`, as
    `evidence.differences` names it)."""

    row_id: str
    source: str  # seed | sweep | local
    summary: str
    tps: float
    speedup: float | None
    target: str = ""
    same_target: bool = True
    distance: float | None = None  # in the evidence space, for a run of another target
    draft: str | None = None
    k: int | None = None
    task: str = ""
    temperature: float = 0.0
    experts: int | None = None  # None: the model's default
    same_host: bool = True
    baseline_tps: float | None = None
    baseline_distrusted: bool = False
    differs: tuple[str, ...] = ()


@dataclass(frozen=True)
class Arithmetic:
    """How an option's speed-up is made: the cost model's round (tokens a verification yields
    over the target steps it costs: the verify pass and the draft's share), then every factor
    that moved it (the learned correction, this host's runs, the sweeps' shape over K, runs of
    its kind, runs of exactly it, the bound of speculation), in order. The speed-up is their
    product: the why line prints it so (`line`)."""

    tokens: float
    steps: float
    verify: float
    draft: float
    drafting: float  # share of rounds that draft (an n-gram lookup's match rate; else 1)
    factors: tuple[tuple[str, float], ...]
    speedup: float

    @property
    def model(self) -> float:
        return self.tokens / self.steps if self.steps > 0 else math.nan

    @property
    def drafting_verify(self) -> float:
        """Target steps one drafting round's verification costs: a lookup's verify steps a
        round are (1 - q) + q x this (q its drafting share; the cost model's round at full
        experts)."""
        q = self.drafting
        return (self.verify - (1.0 - q)) / q if q > 0 else math.nan

    @property
    def line(self) -> str:
        unit = "a verification" if self.drafting >= 1.0 else "a round"
        head = (
            f"a lookup drafts in {self.drafting:.0%} of rounds: "
            if 0.0 < self.drafting < 1.0
            else ""
        )
        text = (
            f"speed-up: {head}{self.tokens:.2f} tokens / {self.steps:.2f} target steps {unit} "
            f"(verify {self.verify:.2f} + draft {self.draft:.2f}) = {self.model:.3f}x"
        )
        for what, f in self.factors:
            text += f"; x{f:.3f} {what}"
        return f"{text} -> {self.speedup:.2f}x"


@dataclass(frozen=True)
class Option:
    """One configuration with its prediction. Speeds are tokens/s, speedups vs plain decoding."""

    method: Method
    k: int | None
    experts: int | None  # None: the model's default
    temperature: float
    draft_id: str | None
    draft_name: str | None
    draft_path: str | None
    expert_key: str | None
    tps: float
    tps_lo: float
    tps_hi: float
    speedup: float
    speedup_lo: float
    speedup_hi: float
    acceptance: float | None  # per-token, predicted
    tokens_per_step: float | None
    knobs: tuple[Knob, ...]
    why: tuple[str, ...]
    evidence: tuple[Evidence, ...] = ()
    measured_tps: float | None = None  # this host's runs of exactly this configuration
    n_measured: int = 0
    acceptance_source: str = ACC_PREDICTED  # run measured | agreement measured | predicted
    agreement: MeasuredAgreement | None = None  # `specreg agree`, when it set the acceptance
    quality: QualityCost | None = None  # what a behaviour-changing option costs in output
    stack: str | None = None  # llama.cpp's --spec-type when not the method's default type
    lookup_cache: str | None = None  # the workload cache ngram-cache reads, by name ...
    lookup_cache_path: str | None = None  # ... and its file
    weights_bytes: int = 0  # the target's and the draft's files: what must fit in memory
    evidence_shift: float = 1.0  # the factor measured runs near it moved the model's prediction
    memory_short_bytes: int = 0  # how far they exceed the host's memory (0: fit, or unknown)
    arithmetic: Arithmetic | None = None  # how its speed-up is made (None: plain decoding)

    @property
    def spec_type(self) -> str:
        return self.stack or DEFAULT_TYPE_OF[self.method]

    @property
    def lossless(self) -> bool:
        return all(k.lossless for k in self.knobs)

    @property
    def label(self) -> str:
        parts = [self.spec_type if self.method is not Method.NONE else "plain"]
        if self.draft_name:
            parts.append(self.draft_name)
        if self.k is not None:
            parts.append(f"K={self.k}")
        if self.lookup_cache:
            parts.append(f"cache={self.lookup_cache}")
        if self.experts is not None:
            parts.append(f"experts={self.experts}")
        if any(k.name == "temperature" for k in self.knobs):
            parts.append(f"temp={self.temperature:g}")
        return " ".join(parts)

    @property
    def speedup_str(self) -> str:
        return f"{self.speedup:.2f}x [{self.speedup_lo:.2f}-{self.speedup_hi:.2f}]"

    @property
    def memory_note(self) -> str | None:
        """When its weights do not fit in the host's memory: what they need, how much more."""
        if not self.memory_short_bytes:
            return None
        what = "target and draft do" if self.draft_id else "the target does"
        return (
            f"{what} not fit in this host's memory ({human_bytes(self.weights_bytes)}, "
            f"{human_bytes(self.memory_short_bytes)} too many)"
        )


@dataclass(frozen=True)
class Recommendation:
    JSON_KIND = "recommendation"
    JSON_VERSION = "2"

    target_id: str
    target_name: str
    target_path: str
    task: str
    policy: str
    host: HostFacts
    roofline: Roofline
    options: tuple[Option, ...]  # allowed by the policy, best first; plain decoding included
    speculate: bool
    advice: tuple[str, ...]
    n_compatible_drafts: int
    n_considered: int
    considered_experts: tuple[int, ...] = field(default=())
    # the host's figures the options are read with, and where each comes from: the noise of
    # one measurement (the tolerance of evidence, a run's weight) and, where calibrated,
    # llama-server's pass factor
    noise: NoiseFigure = FALLBACK_NOISE
    pass_factor: PassFactor | None = None

    @property
    def figures_line(self) -> str:
        """Which host figures the options used, and where each came from."""
        parts = [self.noise.label]
        if self.pass_factor is not None:
            parts.append(self.pass_factor.label)
        return "figures: " + "; ".join(parts)

    @property
    def best(self) -> Option:
        return self.options[0]

    @property
    def memory_advice(self) -> str | None:
        """Whether the options fit in the host's memory (one of `advice`), None when they do."""
        return memory_advice(self.options)

    def to_json(
        self, commands: Sequence[str | None] = (), top: int | None = None
    ) -> dict[str, Any]:
        """The document `recommend --json` prints: the first `top` options (all by default),
        each with the command line at the same index of `commands` (None where not given)."""
        from specreg.jsonout import document, plain

        shown = self.options if top is None else self.options[:top]
        payload = plain(self)
        payload["options"] = [
            {
                **plain(o),
                "lossless": o.lossless,
                "command": commands[i] if i < len(commands) else None,
            }
            for i, o in enumerate(shown)
        ]
        payload["n_options"] = len(self.options)
        payload["roofline"]["fraction"] = self.roofline.fraction
        return document(self.JSON_KIND, self.JSON_VERSION, payload)


def memory_advice(options: Sequence[Option]) -> str | None:
    """Whether the proposed configurations fit in the host's memory, and by how much not."""
    short = [o for o in options if o.memory_short_bytes]
    if not short:
        return None
    mem = short[0].weights_bytes - short[0].memory_short_bytes  # the host's memory
    plain = min(options, key=lambda o: o.weights_bytes)
    if plain.memory_short_bytes:
        return (
            f"memory: the target alone ({human_bytes(plain.weights_bytes)}) is larger than "
            f"this host's {human_bytes(mem)} of memory, by "
            f"{human_bytes(plain.memory_short_bytes)}, and no option fits: its weights would be "
            "read from disk for every token, far slower than predicted here; use a smaller "
            "quant or a host with more memory"
        )
    worst = max(short, key=lambda o: o.memory_short_bytes)
    return (
        f"memory: {len(short)} options do not fit in this host's {human_bytes(mem)} of memory "
        f"(target plus draft up to {human_bytes(worst.weights_bytes)}, "
        f"{human_bytes(worst.memory_short_bytes)} too many) and are listed after those that fit"
    )
