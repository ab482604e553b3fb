"""Measure one configuration: start llama-server, send the workload, collect timings, stop.

Speculation is configured per server process, so every configuration gets its own server.
A warm-up request is sent first and not counted. Samples disturbed by other processes'
CPU use are measured again (up to `contention_retries` times) instead of being trusted.
"""

from __future__ import annotations

import functools
import logging
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from specreg.home import specreg_home
from specreg.runner.config import Config, server_command
from specreg.runner.host import Host
from specreg.runner.llama import LlamaInstall
from specreg.runner.server import (
    REQUEST_TIMEOUT_S,
    STARTUP_TIMEOUT_S,
    Completion,
    LlamaServer,
    ServerFailed,
    TokenProbs,
)
from specreg.runner.workload import Prompt, Workload

log = logging.getLogger(__name__)

N_PROBS = 5
WARMUP_TOKENS = 8
# The engine every plain run and every server-supported method uses; `legacy` adds the others.
ENGINE_SERVER = "server"


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
    def stable(self) -> bool:
        """All repeats produced the same output (greedy decoding should): tokens, or text."""
        return len({(s.tokens, s.content) for s in self.samples}) <= 1


@dataclass(frozen=True)
class Measurement:
    """The outcome of one configuration on one workload; `failure` set when it failed."""

    config: Config
    target: Path
    draft: Path | None
    install: LlamaInstall
    host: Host
    workload: Workload
    n_predict: int
    repeats: int
    argv: tuple[str, ...]
    started_at: datetime
    seconds: float
    log_path: Path
    prompts: tuple[PromptResult, ...] = ()
    speculative_active: bool | None = None
    failure: ServerFailed | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)
    engine: str = ENGINE_SERVER  # or the legacy binary that ran it (runner/legacy.py)

    @property
    def ok(self) -> bool:
        return self.failure is None

    def _repeat_tps(self) -> list[float]:
        """Aggregate throughput of each repeat: all prompts' tokens over their decode time."""
        out = []
        for r in range(self.repeats):
            n = sum(p.samples[r].predicted_n for p in self.prompts if len(p.samples) > r)
            ms = sum(p.samples[r].predicted_ms for p in self.prompts if len(p.samples) > r)
            if ms > 0:
                out.append(n / (ms / 1000))
        return out

    @property
    def tokens_per_s(self) -> float | None:
        values = self._repeat_tps()
        return statistics.median(values) if values else None

    @property
    def tokens_per_s_range(self) -> tuple[float, float] | None:
        values = self._repeat_tps()
        return (min(values), max(values)) if values else None

    @property
    def draft_n(self) -> int:
        return sum(p.draft_n for p in self.prompts)

    @property
    def draft_n_accepted(self) -> int:
        return sum(p.draft_n_accepted for p in self.prompts)

    @property
    def acceptance(self) -> float | None:
        return self.draft_n_accepted / self.draft_n if self.draft_n else None


def logs_dir() -> Path:
    return specreg_home() / "logs"


@dataclass(frozen=True)
class RunStart:
    """What every engine knows when a measurement starts; `finish` makes the Measurement."""

    config: Config
    target: Path
    draft: Path | None
    install: LlamaInstall
    host: Host
    workload: Workload
    n_predict: int
    repeats: int
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
    ) -> Measurement:
        return Measurement(
            config=self.config,
            target=self.target,
            draft=self.draft,
            install=self.install,
            host=self.host,
            workload=self.workload,
            n_predict=self.n_predict,
            repeats=self.repeats,
            argv=argv,
            started_at=self.started_at,
            seconds=time.monotonic() - self.t0,
            log_path=self.log_path,
            prompts=prompts,
            speculative_active=speculative_active,
            failure=failure,
            engine=self.engine,
        )


def _contended(c: Completion, host: Host) -> bool:
    if c.foreign_cpu_s is None:
        return False
    # More than a tenth of a core-second per second of wall time went to someone else.
    return c.foreign_cpu_s > 0.05 + 0.1 * c.wall_s * max(1, host.logical_cpus - 1)


def least_contended(
    take: Callable[[], Completion], host: Host, retries: int
) -> tuple[Completion, int]:
    """One sample, taken again (up to `retries` times) while other processes took the CPU:
    the least disturbed sample, and how many times it was taken again."""
    best: Completion | None = None
    again = 0
    for attempt in range(retries + 1):
        got = take()
        if best is None or (got.foreign_cpu_s or 0) < (best.foreign_cpu_s or 0):
            best = got
        if not _contended(got, host):
            break
        if attempt < retries:
            again += 1
    assert best is not None
    return best, again


def _body(prompt: Any, config: Config, n_predict: int, n_probs: int = 0) -> dict[str, Any]:
    body: dict[str, Any] = {
        "prompt": prompt,
        "n_predict": n_predict,
        "return_tokens": True,
        # Every repeat must decode the prompt again, or later repeats time a cache hit.
        "cache_prompt": False,
        **config.request_fields(),
    }
    if n_probs:
        body["n_probs"] = n_probs
    return body


def first_divergence(a: tuple[int, ...], b: tuple[int, ...]) -> int | None:
    """Index of the first differing token; the shorter length if one is a prefix; None if equal."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _probe(
    server: LlamaServer, config: Config, prompt: Prompt, ref: tuple[int, ...], own: tuple[int, ...]
) -> Probe | None:
    pos = first_divergence(ref, own)
    if pos is None:
        return None
    # Re-decode the common prefix as prompt and ask for the next token's top candidates.
    reply = server.complete(_body([prompt.text, *own[:pos]], config, 1, N_PROBS))

    def text(tokens: tuple[int, ...]) -> str:
        if not tokens:
            return ""
        got = server.request("POST", "/detokenize", {"tokens": list(tokens)})
        return str(got.get("content", "")) if isinstance(got, dict) else ""

    return Probe(
        position=pos,
        probs=reply.probs[0] if reply.probs else None,
        reference_text=text(ref[pos : pos + 16]),
        config_text=text(own[pos : pos + 16]),
    )


def measure(
    install: LlamaInstall,
    host: Host,
    config: Config,
    target: Path,
    draft: Path | None,
    workload: Workload,
    *,
    n_predict: int = 64,
    repeats: int = 3,
    warmup: bool = True,
    with_probs: bool = False,
    reference_tokens: Mapping[str, tuple[int, ...]] | None = None,
    contention_retries: int = 2,
    startup_timeout: float = STARTUP_TIMEOUT_S,
    request_timeout: float = REQUEST_TIMEOUT_S,
    engine: str = ENGINE_SERVER,
    eog_texts: tuple[str, ...] = (),
) -> Measurement:
    """Run `config` on `workload`. Never raises for llama.cpp failures: they are returned.

    `with_probs` adds one untimed request per prompt asking for the top probabilities at
    every position; `reference_tokens` makes the server probe the first position where its
    output departs from the reference. `engine` names a legacy binary (`llama-speculative`,
    `llama-lookup`) to run instead of llama-server; those print text only, so they take
    neither, and `eog_texts` (the target's end-of-generation pieces) is cut from their text.
    """
    if engine != ENGINE_SERVER:
        from specreg.runner import legacy  # legacy imports this module

        # `auto` or `legacy` are resolved as `runs.plan` does; a binary name is taken as is.
        tool = (
            engine
            if engine in legacy.LEGACY_TOOLS
            else legacy.choose_engine(install, config, engine)
        )
        if tool != ENGINE_SERVER:
            return legacy.measure_legacy(
                install,
                host,
                config,
                target,
                draft,
                workload,
                tool=tool,
                n_predict=n_predict,
                repeats=repeats,
                warmup=warmup,
                contention_retries=contention_retries,
                timeout=startup_timeout + request_timeout,
                eog_texts=eog_texts,
            )
    start = RunStart.now(
        "llama-server", config=config, target=target, draft=draft, install=install, host=host,
        workload=workload, n_predict=n_predict, repeats=repeats, engine=ENGINE_SERVER,
    )  # fmt: skip
    log_path = start.log_path
    command = server_command(config, target, draft, install.dialect, host, server=install.server)
    # --host/--port are chosen by LlamaServer; drop the placeholders from the rendered command.
    i = command.index("--host")
    command = command[:i] + command[i + 4 :]
    server = LlamaServer(
        command,
        env=host.env(),
        log_path=log_path,
        startup_timeout=startup_timeout,
        request_timeout=request_timeout,
    )
    speculative_active: bool | None = None
    results: list[PromptResult] = []
    try:
        with server:
            if config.speculative:
                speculative_active = server.speculative_slots()
                message = server.spec_init_error()
                if message or speculative_active is False:
                    raise ServerFailed(
                        "spec-init",
                        f"llama-server started without speculation ({config.spec_type})",
                        message or "no slot has a speculative context (/slots)",
                        log_path,
                    )
            if warmup:
                server.complete(_body(workload.prompts[0].text, config, WARMUP_TOKENS))
            samples: dict[str, list[Completion]] = {p.prompt_id: [] for p in workload.prompts}
            contended: dict[str, int] = {p.prompt_id: 0 for p in workload.prompts}
            for _ in range(repeats):
                for prompt in workload.prompts:
                    take = functools.partial(server.complete, _body(prompt.text, config, n_predict))
                    best, again = least_contended(take, host, contention_retries)
                    contended[prompt.prompt_id] += again
                    samples[prompt.prompt_id].append(best)
            for prompt in workload.prompts:
                reference = None
                if with_probs:
                    reference = server.complete(_body(prompt.text, config, n_predict, N_PROBS))
                probe = None
                own = samples[prompt.prompt_id][0].tokens
                if reference_tokens is not None and prompt.prompt_id in reference_tokens:
                    probe = _probe(server, config, prompt, reference_tokens[prompt.prompt_id], own)
                results.append(
                    PromptResult(
                        prompt=prompt,
                        samples=tuple(samples[prompt.prompt_id]),
                        reference=reference,
                        probe=probe,
                        contended=contended[prompt.prompt_id],
                    )
                )
    except ServerFailed as err:
        return start.finish(
            tuple(server.argv or command), tuple(results), speculative_active, failure=err
        )
    return start.finish(tuple(server.argv), tuple(results), speculative_active)
