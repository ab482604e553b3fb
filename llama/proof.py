"""Prove that a llama.cpp build runs on this host, in seconds, before anything relies on it.

Each binary specreg uses runs the proof model (samples/probe_model.py) the way specreg calls
it: a few tokens through llama-server with two slots, a llama-bench test of a batch and of
generation, one llama-perplexity chunk and a short llama-completion. A binary killed by a
signal died of the build (a CPU instruction this host cannot run); one that exits with an
error code failed for another reason, which the probe reports as llama.cpp said it.
"""

from __future__ import annotations

import logging
import signal
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specreg.llama.process import ServerFailed, exit_how, killed_by, llama_message, run_tool
from specreg.llama.server import LlamaServer
from specreg.llamacpp import BenchFlag, Flag, PerplexityFlag, ServerFlag, Tool

log = logging.getLogger(__name__)

# The binaries proved after a build, in the order they run; the cheap gate first, built
# before the rest (it needs only ggml and libllama), so a build that dies is known minutes
# sooner.
GATE_BINARY = Tool.SIMPLE
PROOF_BINARIES: tuple[str, ...] = (Tool.SERVER, Tool.BENCH, Tool.PERPLEXITY, Tool.COMPLETION)
PROBE_TIMEOUT_S = 120.0
PROBE_TOKENS = 4
# A prompt of a few dozen tokens: prompt processing takes ggml's batched (AMX) kernels.
PROBE_PROMPT = (
    "The harbour town kept its boats in good repair through the long winter, and every "
    "spring the nets were mended, the hulls were painted and the fishermen went out again "
    "before the sun rose over the grey water of the bay."
)


@dataclass(frozen=True)
class Probe:
    """One binary run on the proof model."""

    binary: str
    returncode: int | None  # None: it did not start, or was still running when time was up
    seconds: float
    message: str  # llama.cpp's most telling line when it failed, else ""
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    @property
    def signal(self) -> str | None:
        """The name of the signal that killed it (SIGILL, SIGSEGV...), if one did."""
        sig = killed_by(self.returncode)
        return sig.name if sig is not None else None

    @property
    def died(self) -> bool:
        """Killed by a crash signal: the build, not the input."""
        sig = killed_by(self.returncode)
        return sig is not None and sig not in (signal.SIGKILL, signal.SIGTERM, signal.SIGINT)

    @property
    def outcome(self) -> str:
        if self.ok:
            return "ran"
        if self.timed_out:
            return f"did not finish within {PROBE_TIMEOUT_S:.0f} s"
        if self.returncode is None:
            return "could not start"
        return exit_how(self.returncode)

    def to_json(self) -> dict[str, Any]:
        return {
            "binary": self.binary,
            "ok": self.ok,
            "returncode": self.returncode,
            "signal": self.signal,
            "seconds": round(self.seconds, 2),
            "message": self.message,
            "timed_out": self.timed_out,
        }


@dataclass(frozen=True)
class Proof:
    """What the probes of one build showed."""

    probes: tuple[Probe, ...]

    @property
    def ok(self) -> bool:
        return all(p.ok for p in self.probes)

    @property
    def died(self) -> tuple[Probe, ...]:
        return tuple(p for p in self.probes if p.died)

    @property
    def failed(self) -> tuple[Probe, ...]:
        return tuple(p for p in self.probes if not p.ok)

    @property
    def summary(self) -> str:
        """One line: which binaries failed and how, or that all ran."""
        if self.ok:
            return f"{len(self.probes)} binaries ran the proof model"
        first = self.failed[0]
        others = [p.binary for p in self.failed[1:]]
        more = f" (also {', '.join(others)})" if others else ""
        said = f": {first.message}" if first.message else ""
        return f"{first.binary} {first.outcome}{said}{more}"

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "probes": [p.to_json() for p in self.probes]}


def _text(tokens_at_least: int) -> str:
    words = PROBE_PROMPT.split()
    return " ".join(words[i % len(words)] for i in range(tokens_at_least))


def _tool(bin_dir: Path, name: str, args: list[str], env: dict[str, str], log_path: Path) -> Probe:
    start = time.monotonic()
    try:
        out = run_tool(
            [str(bin_dir / name), *args], env=env, log_path=log_path, timeout=PROBE_TIMEOUT_S
        )
    except ServerFailed as err:
        timed_out = err.kind == "timeout"
        return Probe(name, None, time.monotonic() - start, err.llama_message, timed_out)
    message = "" if out.returncode == 0 else llama_message(out.log_text)
    return Probe(name, out.returncode, out.wall_s, message)


def _server(bin_dir: Path, model: Path, threads: int, env: dict[str, str], log_path: Path) -> Probe:
    # Two slots: the pinned build's AMX path died at warm-up with SIGILL with two, SIGSEGV
    # with one; a prompt of a few dozen tokens runs the batched kernels too.
    command = [str(bin_dir / Tool.SERVER), Flag.MODEL, str(model), Flag.THREADS, str(threads)]
    command += [ServerFlag.PARALLEL, "2", Flag.CTX, "1024"]
    server = LlamaServer(
        command, env=env, log_path=log_path, startup_timeout=PROBE_TIMEOUT_S, append_log=True
    )
    start = time.monotonic()
    try:
        with server:
            server.request_timeout = PROBE_TIMEOUT_S
            body = {"prompt": PROBE_PROMPT, "n_predict": PROBE_TOKENS, "cache_prompt": False}
            server.complete(body)
    except ServerFailed as err:
        seconds = time.monotonic() - start
        timed_out = err.kind == "timeout"
        return Probe(Tool.SERVER, err.returncode, seconds, err.llama_message, timed_out)
    return Probe(Tool.SERVER, 0, time.monotonic() - start, "")


def _probes(
    bin_dir: Path, model: Path, threads: int, env: dict[str, str], log_path: Path, text: Path
) -> dict[str, Callable[[], Probe]]:
    t, m, n = str(threads), [Flag.MODEL, str(model)], [Flag.N_PREDICT, str(PROBE_TOKENS)]
    args = {
        GATE_BINARY: [*m, *n, PROBE_PROMPT],
        Tool.BENCH: [*m, Flag.THREADS, t, BenchFlag.REPETITIONS, "1", BenchFlag.N_PROMPT, "32",
                     BenchFlag.N_GEN, str(PROBE_TOKENS), BenchFlag.OUTPUT, "jsonl"],
        Tool.PERPLEXITY: [*m, Flag.PROMPT_FILE, str(text), Flag.CTX, "128",
                          PerplexityFlag.CHUNKS, "1", Flag.THREADS, t],
        Tool.COMPLETION: [*m, Flag.PROMPT, PROBE_PROMPT, *n, Flag.THREADS, t,
                          Flag.NO_CONVERSATION, Flag.TEMP, "0", Flag.CTX, "512"],
    }  # fmt: skip

    def tool(name: str) -> Callable[[], Probe]:
        return lambda: _tool(bin_dir, name, args[name], env, log_path)

    return {
        GATE_BINARY: tool(GATE_BINARY),
        Tool.SERVER: lambda: _server(bin_dir, model, threads, env, log_path),
        Tool.BENCH: tool(Tool.BENCH),
        Tool.PERPLEXITY: tool(Tool.PERPLEXITY),
        Tool.COMPLETION: tool(Tool.COMPLETION),
    }


def prove(
    bin_dir: Path,
    model: Path,
    *,
    binaries: Sequence[str] = PROOF_BINARIES,
    threads: int,
    env: dict[str, str],
    log_path: Path,
) -> Proof:
    """Run the proof model through `binaries` of the build in `bin_dir`; stops at the first
    that dies by a signal (the rest would die the same way)."""
    with tempfile.TemporaryDirectory(prefix="specreg-proof-") as tmp:
        text = Path(tmp) / "text.txt"
        text.write_text(_text(400))
        runners = _probes(bin_dir, model, threads, env, log_path, text)
        probes: list[Probe] = []
        for name in binaries:
            probe = runners[name]()
            log.info("proof: %s %s in %.1f s", name, probe.outcome, probe.seconds)
            probes.append(probe)
            if probe.died:
                break
    return Proof(tuple(probes))
