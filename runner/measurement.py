"""What one measurement produced, whichever engine took it: per prompt its timed samples, the
reference it was compared with and the probe where it departed, and the run as a whole.

Every engine (llama-server in `measure`, the legacy binaries in `legacy`) returns these.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from specreg.home import logs_dir
from specreg.host.machine import Host
from specreg.llama import spec_stats
from specreg.llama.config import Config
from specreg.llama.install import LlamaInstall
from specreg.llama.process import ServerFailed
from specreg.llama.server import (
    Completion,
    TokenProbs,
)
from specreg.runner.protocol import (
    REGIME_WARM,
    Figures,
    PromptSamples,
    Protocol,
    SamplingInterrupted,
    phase_figures,
    repeat_figures,
    replay_flags,
)
from specreg.runner.protocol import WARMUP_TOKENS as WARMUP_TOKENS
from specreg.runner.workload import Prompt, Workload
from specreg.terms import ENGINE_SERVER as ENGINE_SERVER


@dataclass(frozen=True)
class Probe:
    """The config server's view of one position: top candidates and the text on both sides."""

    position: int
    probs: TokenProbs | None
    reference_text: str  # the reference (baseline) continuation from `position`
    config_text: str  # this run's continuation from `position`


@dataclass(frozen=True)
class PromptResult:
    prompt: Prompt
    samples: tuple[Completion, ...]  # timed, warm-up excluded
    reference: Completion | None = None  # untimed, with top probabilities (n_probs)
    probe: Probe | None = None
    contended: int = 0  # samples that were measured again because of foreign CPU load
    sessions: tuple[int, ...] = ()  # per sample: which engine state (server) answered
    positions: tuple[int, ...] = ()  # per sample: timed requests that state had answered before

    @property
    def tokens(self) -> tuple[int, ...]:
        return self.samples[0].tokens if self.samples else ()

    @property
    def tps(self) -> tuple[float, ...]:
        return tuple(s.tokens_per_s for s in self.samples)

    @property
    def tps_median(self) -> float:
        return statistics.median(self.tps) if self.samples else 0.0

    @property
    def draft_n(self) -> int:
        return sum(s.draft_n for s in self.samples)

    @property
    def draft_n_accepted(self) -> int:
        return sum(s.draft_n_accepted for s in self.samples)

    @property
    def type_figures(self) -> dict[str, spec_stats.TypeFigures]:
        """A stack's figures per type over this prompt's samples (empty for one type)."""
        return spec_stats.total(dict(s.type_figures) for s in self.samples)

    @property
    def stable(self) -> bool:
        """All repeats produced the same output (greedy decoding should): tokens, or text."""
        return len({(s.tokens, s.content) for s in self.samples}) <= 1


@dataclass(frozen=True)
class MeasuredOn:
    """What a measurement is of: the configuration and its files, the llama.cpp and the host
    it runs on, the workload, and the tokens and repeats asked for. Known before it starts
    (RunStart), kept in what it produced (Measurement)."""

    config: Config
    target: Path
    draft: Path | None
    install: LlamaInstall
    host: Host
    workload: Workload
    n_predict: int
    repeats: int


@dataclass(frozen=True)
class Measurement(MeasuredOn):
    """The outcome of one configuration on one workload; `failure` set when it failed."""

    argv: tuple[str, ...]
    started_at: datetime
    seconds: float
    log_path: Path
    prompts: tuple[PromptResult, ...] = ()
    speculative_active: bool | None = None
    failure: ServerFailed | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)
    engine: str = ENGINE_SERVER  # or the legacy binary that ran it (runner/legacy.py)
    protocol: Protocol | None = None  # how the samples were taken (None: built by hand)

    @property
    def ok(self) -> bool:
        return self.failure is None

    @property
    def warm(self) -> bool:
        return self.protocol is not None and self.protocol.regime == REGIME_WARM

    @property
    def repeat_figures(self) -> list[Figures]:
        """Drafted, accepted and speed of each repeat over all prompts."""
        return repeat_figures([p.samples for p in self.prompts], self.repeats)

    @property
    def phase_figures(self) -> dict[str, Figures] | None:
        """Warm regime: the first prompts' figures and the later ones' (None otherwise)."""
        if not self.warm or self.protocol is None or self.protocol.warm_first is None:
            return None
        ordered = [p.samples[0] for p in self.prompts if p.samples]
        return phase_figures(ordered, self.protocol.warm_first)

    @property
    def replay_flags(self) -> tuple[str, ...]:
        """Prompts whose later repeats accepted far more than their first (not trusted)."""
        return replay_flags([(p.prompt.prompt_id, p.samples) for p in self.prompts])

    def _headline(self) -> list[Completion]:
        """The samples the run's figures stand for: all, or a warm run's later prompts."""
        phases = self.phase_figures
        samples = [s for p in self.prompts for s in p.samples]
        if phases is not None and self.protocol is not None and self.protocol.warm_first:
            return samples[self.protocol.warm_first :]
        return samples

    def _repeat_tps(self) -> list[float]:
        if self.warm:
            return [s.tokens_per_s for s in self._headline() if s.predicted_ms > 0]
        return [f.tokens_per_s for f in self.repeat_figures if f.tokens_per_s is not None]

    @property
    def tokens_per_s(self) -> float | None:
        if self.warm:
            return Figures.of(self._headline()).tokens_per_s
        values = self._repeat_tps()
        return statistics.median(values) if values else None

    @property
    def tokens_per_s_range(self) -> tuple[float, float] | None:
        values = self._repeat_tps()
        return (min(values), max(values)) if values else None

    @property
    def draft_n(self) -> int:
        return sum(s.draft_n for s in self._headline())

    @property
    def draft_n_accepted(self) -> int:
        return sum(s.draft_n_accepted for s in self._headline())

    @property
    def acceptance(self) -> float | None:
        return self.draft_n_accepted / self.draft_n if self.draft_n else None

    @property
    def type_figures(self) -> dict[str, spec_stats.TypeFigures]:
        """A stack's figures per type over the samples the run's figures stand for."""
        return spec_stats.total(dict(s.type_figures) for s in self._headline())


@dataclass(frozen=True)
class RunStart(MeasuredOn):
    """What every engine knows when a measurement starts; `finish` makes the Measurement."""

    engine: str
    started_at: datetime
    t0: float  # time.monotonic() at the start
    log_path: Path  # logs_dir()/<binary>-<timestamp>.log

    @classmethod
    def now(cls, binary: str, **facts: Any) -> RunStart:
        started_at = datetime.now(timezone.utc)
        stamp = started_at.strftime("%Y%m%dT%H%M%S%f")
        return cls(
            **facts,
            started_at=started_at,
            t0=time.monotonic(),
            log_path=logs_dir() / f"{binary}-{stamp}.log",
        )

    def finish(
        self,
        argv: tuple[str, ...],
        prompts: tuple[PromptResult, ...],
        speculative_active: bool | None,
        failure: ServerFailed | None = None,
        protocol: Protocol | None = None,
    ) -> Measurement:
        measured_on = {f.name: getattr(self, f.name) for f in fields(MeasuredOn)}
        return Measurement(
            **measured_on,
            argv=argv,
            started_at=self.started_at,
            seconds=time.monotonic() - self.t0,
            log_path=self.log_path,
            prompts=prompts,
            speculative_active=speculative_active,
            failure=failure,
            engine=self.engine,
            protocol=protocol,
        )


class MeasurementInterrupted(KeyboardInterrupt):
    """Ctrl-C while measuring, with the measurement of the samples taken before it."""

    def __init__(self, measurement: Measurement):
        super().__init__()
        self.measurement = measurement


def interrupted(
    start: RunStart,
    argv: tuple[str, ...],
    stop: SamplingInterrupted,
    speculative_active: bool | None,
    protocol: Protocol,
) -> MeasurementInterrupted:
    """What an engine raises on Ctrl-C: the samples taken so far, as a measurement."""
    prompts = tuple(prompt_result(g) for g in stop.samples)
    return MeasurementInterrupted(
        start.finish(argv, prompts, speculative_active, protocol=protocol)
    )


def prompt_result(
    got: PromptSamples, reference: Completion | None = None, probe: Probe | None = None
) -> PromptResult:
    """The protocol's samples of one prompt as a `PromptResult`."""
    return PromptResult(
        prompt=got.prompt,
        samples=tuple(s.completion for s in got.samples),
        reference=reference,
        probe=probe,
        contended=got.contended,
        sessions=tuple(s.session for s in got.samples),
        positions=tuple(s.position for s in got.samples),
    )


def first_divergence(a: tuple[int, ...], b: tuple[int, ...]) -> int | None:
    """Index of the first differing token; the shorter length if one is a prefix; None if equal."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))
