"""Measure one configuration: llama-server(s) under the measurement protocol, the workload,
timings collected, servers stopped.

Speculation is configured per server process, so every configuration gets its own server; a
method that keeps state across requests gets a new one for every timed sample (see
`runner/protocol.py`, which every engine's samples go through). Each server answers a warm-up
text outside the workload first. Samples disturbed by other processes' CPU use are measured
again (up to `Settings.retries` times, each on fresh state) instead of being trusted.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from specreg.host.load import guarded
from specreg.host.machine import Host
from specreg.llama import spec_stats
from specreg.llama.config import Config, server_command
from specreg.llama.install import LlamaInstall
from specreg.llama.process import ServerFailed
from specreg.llama.server import Completion, LlamaServer
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
    Protocol,
    Sampler,
    SamplingInterrupted,
    load_verdict,
    plan_protocol,
)
from specreg.runner.protocol import collect as collect_samples
from specreg.runner.settings import DEFAULTS, Settings
from specreg.runner.workload import Prompt, Workload
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


@dataclass(frozen=True)
class Probes:
    """Untimed requests after a measurement's timed samples, for `verify`: the top
    probabilities at every position (`probs`, asked of the baseline), and the probe of the first
    position where the output departs from `reference_tokens` (the baseline's, by prompt id)."""

    probs: bool = False
    reference_tokens: Mapping[str, tuple[int, ...]] | None = None

    @property
    def wanted(self) -> bool:
        return self.probs or self.reference_tokens is not None


NO_PROBES = Probes()


def measure(
    install: LlamaInstall,
    host: Host,
    config: Config,
    target: Path,
    draft: Path | None,
    workload: Workload,
    settings: Settings = DEFAULTS,
    *,
    probes: Probes = NO_PROBES,
    eog_texts: tuple[str, ...] = (),
) -> Measurement:
    """Run `config` on `workload` under the measurement protocol (`runner/protocol.py`) and the
    load guard (`specreg.host.load.guarded`): it waits its turn behind other specreg
    measurements on this host and for a quiet host, or raises `HostBusy`; the load it started
    under is kept in the protocol (`Protocol.load`), for `load_verdict` to judge with its
    samples. Never raises for llama.cpp failures: they are returned. Ctrl-C raises
    `MeasurementInterrupted` with the samples taken before it.

    `settings.engine` may name a legacy binary (`llama-speculative`, `llama-lookup`) to run
    instead of llama-server (`auto` and `legacy` are resolved as `runs.plan` does); those print
    text only, so they take no `probes`, and `eog_texts` (the target's end-of-generation
    pieces) is cut from their text. `settings.warm_first=N` measures the warm regime: the
    workload's distinct prompts once each, in order, on one server, the prompts after the
    first N reported apart.
    """
    what = f"{config.label} on {Path(target).name}"
    with guarded(host.logical_cpus, what) as check:
        tool = _tool(install, config, settings.engine)
        on_tool = tool != ENGINE_SERVER  # a legacy binary: a process per generation
        protocol = plan_protocol(config.spec_type, workload, settings, process_per_sample=on_tool)
        start = RunStart.now(
            tool if on_tool else Tool.SERVER, config=config, target=target, draft=draft,
            install=install, host=host, workload=workload, n_predict=settings.n_predict,
            repeats=protocol.repeats, engine=tool,
        )  # fmt: skip
        if on_tool:
            m = legacy.measure_legacy(start, protocol, settings, eog_texts=eog_texts)
        else:
            m = _on_server(start, protocol, settings, probes, what)
    if m.protocol is None:
        return m
    return replace(m, protocol=replace(m.protocol, load=check.to_json()))


def _tool(install: LlamaInstall, config: Config, engine: str) -> str:
    """llama-server, or the legacy binary `engine` names or resolves to."""
    if engine == ENGINE_SERVER or engine in legacy.LEGACY_TOOLS:
        return engine
    return legacy.choose_engine(install, config, engine)


def load_verdict_of(m: Measurement) -> LoadVerdict:
    """Whether `m`'s samples were disturbed by other processes (host/load.py's policy of the
    current context: thresholds, this host's quiet noise floor, --allow-load)."""
    return load_verdict(
        [(p.prompt.prompt_id, p.samples) for p in m.prompts],
        logical_cpus=m.host.logical_cpus,
        warm=m.warm,
        before=m.protocol.load if m.protocol else None,
    )


def _server_command(start: RunStart) -> list[str]:
    """llama-server's command for the run, without --host/--port: `LlamaServer` chooses them."""
    install = start.install
    return server_command(
        start.config, start.target, start.draft, install.dialect, start.host,
        server=install.server, port=None,
    )  # fmt: skip


def _extras(
    config: Config, n_predict: int, probes: Probes
) -> tuple[dict[str, tuple[Completion | None, Probe | None]], Callable[..., None]]:
    """Where the untimed extras of each prompt go, and the `finish` step that asks for them
    (reference probabilities, the probe of the first divergence)."""
    extras: dict[str, tuple[Completion | None, Probe | None]] = {}

    def finish(sampler: Sampler, got: tuple[PromptSamples, ...]) -> None:
        assert isinstance(sampler, ServerSampler)
        refs = probes.reference_tokens
        for item in got:
            prompt = item.prompt
            reference = None
            if probes.probs:
                reference = sampler.server.complete(_body(prompt.text, config, n_predict, N_PROBS))
            probe = None
            own = item.samples[0].completion.tokens if item.samples else ()
            if refs is not None and prompt.prompt_id in refs:
                probe = _probe(sampler.server, config, prompt, refs[prompt.prompt_id], own)
            extras[prompt.prompt_id] = (reference, probe)

    return extras, finish


def _on_server(
    start: RunStart, protocol: Protocol, settings: Settings, probes: Probes, label: str
) -> Measurement:
    """The samples of `start`'s configuration on llama-server, one process per engine state."""
    command = _server_command(start)
    config = start.config
    server_engine = ServerEngine(
        command,
        config,
        start.host,
        log_path=start.log_path,
        startup_timeout=settings.startup_timeout,
        request_timeout=settings.request_timeout,
    )
    extras, finish = _extras(config, settings.n_predict, probes)
    try:
        got = collect_samples(
            server_engine, start.workload, protocol, start.host, n_predict=settings.n_predict,
            finish=finish if probes.wanted else None, label=label,
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
