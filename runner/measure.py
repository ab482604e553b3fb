"""Measure one configuration: llama-server(s) under the measurement protocol, the workload,
timings collected, servers stopped.

Speculation is configured per server process, so every configuration gets its own server; a
method that keeps state across requests gets a new one for every timed sample (see
`runner/protocol.py`, which every engine's samples go through). Each server answers a warm-up
text outside the workload first. Samples disturbed by other processes' CPU use are measured
again (up to `contention_retries` times, each on fresh state) instead of being trusted.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from specreg.host.load import guarded
from specreg.host.machine import Host
from specreg.llama import spec_stats
from specreg.llama.config import Config, server_command
from specreg.llama.install import LlamaInstall
from specreg.llama.process import ServerFailed
from specreg.llama.server import (
    REQUEST_TIMEOUT_S,
    STARTUP_TIMEOUT_S,
    Completion,
    LlamaServer,
)
from specreg.llamacpp import Tool
from specreg.runner import legacy
from specreg.runner.measurement import (
    Measurement,
    Probe,
    RunStart,
    first_divergence,
    interrupted,
    prompt_result,
)
from specreg.runner.protocol import WARMUP_TOKENS as WARMUP_TOKENS
from specreg.runner.protocol import (
    Engine,
    LoadVerdict,
    PromptSamples,
    Sampler,
    SamplingInterrupted,
    load_verdict,
    plan_protocol,
)
from specreg.runner.protocol import collect as collect_samples
from specreg.runner.workload import Prompt, Workload
from specreg.terms import DEFAULT_N_PREDICT, DEFAULT_REPEATS
from specreg.terms import ENGINE_SERVER as ENGINE_SERVER

log = logging.getLogger(__name__)

N_PROBS = 5
# How long a request's per-type statistics may take to reach the log after its response.
TYPE_STATS_WAIT_S = 2.0


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


class ServerSampler(Sampler):
    """One started llama-server answering /completion for one configuration."""

    def __init__(self, server: LlamaServer, config: Config):
        self.server = server
        self.config = config

    def generate(self, text: str, n_predict: int) -> Completion:
        if not self.config.stack.stacked:
            return self.server.complete(_body(text, self.config, n_predict))
        before = spec_stats.finished(self.server.log_text())
        got = self.server.complete(_body(text, self.config, n_predict))
        return replace(got, type_figures=tuple(self._type_figures(before).items()))

    def _type_figures(self, index: int) -> dict[str, spec_stats.TypeFigures]:
        """This request's per-type lines: logged before the response was sent, written to the
        log file by llama.cpp's logging thread a moment later."""
        deadline = time.monotonic() + TYPE_STATS_WAIT_S
        while True:
            text = self.server.log_text()
            if spec_stats.finished(text) > index or time.monotonic() > deadline:
                return spec_stats.request_figures(text, index)
            time.sleep(0.02)


class ServerEngine(Engine):
    """llama-server for one configuration: every `session()` starts a process, checks that it
    speculates when it should, and stops it afterwards."""

    def __init__(
        self,
        command: list[str],
        config: Config,
        host: Host,
        *,
        log_path: Path,
        startup_timeout: float,
        request_timeout: float,
    ):
        self.command = command
        self.config = config
        self.host = host
        self.log_path = log_path
        self.startup_timeout = startup_timeout
        self.request_timeout = request_timeout
        self.argv: tuple[str, ...] = ()  # the first server's, with its --host/--port
        self.speculative_active: bool | None = None
        self.starts = 0

    @contextmanager
    def session(self) -> Iterator[ServerSampler]:
        server = LlamaServer(
            self.command,
            env=self.host.env(),
            log_path=self.log_path,
            startup_timeout=self.startup_timeout,
            request_timeout=self.request_timeout,
            append_log=self.starts > 0,
        )
        self.starts += 1
        try:
            with server:
                self.argv = self.argv or tuple(server.argv)
                if self.config.speculative:
                    active = server.speculative_slots()
                    self.speculative_active = active
                    message = server.spec_init_error()
                    if message or active is False:
                        raise ServerFailed(
                            "spec-init",
                            f"llama-server started without speculation ({self.config.spec_type})",
                            message or "no slot has a speculative context (/slots)",
                            self.log_path,
                        )
                yield ServerSampler(server, self.config)
        finally:
            self.argv = self.argv or tuple(server.argv)


def measure(
    install: LlamaInstall,
    host: Host,
    config: Config,
    target: Path,
    draft: Path | None,
    workload: Workload,
    *,
    n_predict: int = DEFAULT_N_PREDICT,
    repeats: int = DEFAULT_REPEATS,
    warmup: bool = True,
    with_probs: bool = False,
    reference_tokens: Mapping[str, tuple[int, ...]] | None = None,
    contention_retries: int = 2,
    startup_timeout: float = STARTUP_TIMEOUT_S,
    request_timeout: float = REQUEST_TIMEOUT_S,
    engine: str = ENGINE_SERVER,
    eog_texts: tuple[str, ...] = (),
    warm_first: int | None = None,
    built_from: tuple[str, ...] = (),
) -> Measurement:
    """`_measure` (below) under the load guard (`specreg.host.load.guarded`): it waits its
    turn behind other specreg measurements on this host and for a quiet host, or raises
    `HostBusy`; the load it started under is kept in the protocol (`Protocol.load`), for
    `load_verdict` to judge with its samples."""
    what = f"{config.label} on {Path(target).name}"
    with guarded(host.logical_cpus, what) as check:
        m = _measure(
            install, host, config, target, draft, workload, n_predict=n_predict,
            repeats=repeats, warmup=warmup, with_probs=with_probs,
            reference_tokens=reference_tokens, contention_retries=contention_retries,
            startup_timeout=startup_timeout, request_timeout=request_timeout, engine=engine,
            eog_texts=eog_texts, warm_first=warm_first, built_from=built_from, label=what,
        )  # fmt: skip
    if m.protocol is None:
        return m
    return replace(m, protocol=replace(m.protocol, load=check.to_json()))


def load_verdict_of(m: Measurement) -> LoadVerdict:
    """Whether `m`'s samples were disturbed by other processes (host/load.py's policy of the
    current context: thresholds, this host's quiet noise floor, --allow-load)."""
    return load_verdict(
        [(p.prompt.prompt_id, p.samples) for p in m.prompts],
        logical_cpus=m.host.logical_cpus,
        warm=m.warm,
        before=m.protocol.load if m.protocol else None,
    )


def _measure(
    install: LlamaInstall,
    host: Host,
    config: Config,
    target: Path,
    draft: Path | None,
    workload: Workload,
    *,
    n_predict: int = DEFAULT_N_PREDICT,
    repeats: int = DEFAULT_REPEATS,
    warmup: bool = True,
    with_probs: bool = False,
    reference_tokens: Mapping[str, tuple[int, ...]] | None = None,
    contention_retries: int = 2,
    startup_timeout: float = STARTUP_TIMEOUT_S,
    request_timeout: float = REQUEST_TIMEOUT_S,
    engine: str = ENGINE_SERVER,
    eog_texts: tuple[str, ...] = (),
    warm_first: int | None = None,
    built_from: tuple[str, ...] = (),
    label: str = "samples",
) -> Measurement:
    """Run `config` on `workload` under the measurement protocol (`runner/protocol.py`). Never
    raises for llama.cpp failures: they are returned. Ctrl-C raises `MeasurementInterrupted`
    with the samples taken before it.

    `with_probs` adds one untimed request per prompt asking for the top probabilities at
    every position; `reference_tokens` makes the server probe the first position where its
    output departs from the reference. `engine` names a legacy binary (`llama-speculative`,
    `llama-lookup`) to run instead of llama-server; those print text only, so they take
    neither, and `eog_texts` (the target's end-of-generation pieces) is cut from their text.
    `warm_first=N` measures the warm regime: the workload's distinct prompts once each, in
    order, on one server, the prompts after the first N reported apart. `built_from` names
    (sha256) the prompts whose text or output built state the run starts from, such as a
    lookup cache: the workload must be held out from them (a `UsageError` otherwise).
    """
    if engine != ENGINE_SERVER:
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
                warm_first=warm_first,
                built_from=built_from,
            )
    protocol = plan_protocol(
        config.spec_type, workload, repeats=repeats, contention_retries=contention_retries,
        warmup=warmup, warm_first=warm_first, built_from=built_from,
    )  # fmt: skip
    start = RunStart.now(
        Tool.SERVER, config=config, target=target, draft=draft, install=install, host=host,
        workload=workload, n_predict=n_predict, repeats=protocol.repeats, engine=ENGINE_SERVER,
    )  # fmt: skip
    # No --host/--port: LlamaServer chooses them.
    command = server_command(
        config, target, draft, install.dialect, host, server=install.server, port=None
    )
    server_engine = ServerEngine(
        command,
        config,
        host,
        log_path=start.log_path,
        startup_timeout=startup_timeout,
        request_timeout=request_timeout,
    )
    extras: dict[str, tuple[Completion | None, Probe | None]] = {}

    def finish(sampler: Sampler, got: tuple[PromptSamples, ...]) -> None:
        """Untimed: reference probabilities and the probe of the first divergence."""
        assert isinstance(sampler, ServerSampler)
        for item in got:
            prompt = item.prompt
            reference = None
            if with_probs:
                reference = sampler.server.complete(_body(prompt.text, config, n_predict, N_PROBS))
            probe = None
            own = item.samples[0].completion.tokens if item.samples else ()
            if reference_tokens is not None and prompt.prompt_id in reference_tokens:
                ref = reference_tokens[prompt.prompt_id]
                probe = _probe(sampler.server, config, prompt, ref, own)
            extras[prompt.prompt_id] = (reference, probe)

    needs_finish = with_probs or reference_tokens is not None
    try:
        got = collect_samples(
            server_engine, workload, protocol, host,
            n_predict=n_predict, finish=finish if needs_finish else None, label=label,
        )  # fmt: skip
    except ServerFailed as err:
        argv = server_engine.argv or tuple(command)
        return start.finish(
            argv, (), server_engine.speculative_active, failure=err, protocol=protocol
        )
    except SamplingInterrupted as stop:
        argv = server_engine.argv or tuple(command)
        raise interrupted(start, argv, stop, server_engine.speculative_active, protocol) from stop
    results = tuple(prompt_result(g, *extras.get(g.prompt.prompt_id, (None, None))) for g in got)
    return start.finish(
        server_engine.argv, results, server_engine.speculative_active, protocol=protocol
    )
