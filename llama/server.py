"""llama-server as a managed child process: start, wait for health, request, stop.

The server runs in its own process group, and every exit path (error, timeout, Ctrl-C)
kills the whole group, so no llama.cpp process outlives the run. Failures become
`ServerFailed` carrying llama.cpp's own message from the log and a hint for what to do.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from specreg.host.cpu import CpuWatch
from specreg.llama.process import (
    LOCALHOST,
    SPEC_INIT_FAILED,
    ServerFailed,
    classify_exit,
    exit_how,
    free_port,
    llama_message,
    spawn,
)
from specreg.llama.spec_stats import TypeFigures
from specreg.llamacpp import ServerFlag
from specreg.terms import STARTUP_TIMEOUT_S as STARTUP_TIMEOUT_S

log = logging.getLogger(__name__)

REQUEST_TIMEOUT_S = 600.0
STOP_GRACE_S = 5.0
PORT_ATTEMPTS = 3


@dataclass(frozen=True)
class TokenProbs:
    """Top candidates at one position: (token id, probability) best first."""

    token: int
    top: tuple[tuple[int, str, float], ...]  # (id, text, probability)

    def prob(self, token: int) -> float | None:
        for tid, _, p in self.top:
            if tid == token:
                return p
        return None


@dataclass(frozen=True)
class Completion:
    tokens: tuple[int, ...]
    content: str
    predicted_n: int
    predicted_ms: float
    prompt_n: int
    prompt_ms: float
    draft_n: int  # absent in `timings` means nothing was drafted
    draft_n_accepted: int
    stop_type: str
    spec_types: str
    wall_s: float
    foreign_cpu_s: float | None
    probs: tuple[TokenProbs, ...] = ()
    # A stack's figures per type, from llama.cpp's statistics lines (runner/spec_stats.py).
    type_figures: tuple[tuple[str, TypeFigures], ...] = ()

    @property
    def tokens_per_s(self) -> float:
        return self.predicted_n / (self.predicted_ms / 1000) if self.predicted_ms > 0 else 0.0


def parse_probs(items: list[dict[str, Any]]) -> tuple[TokenProbs, ...]:
    out = []
    for item in items:
        top = []
        for cand in item.get("top_logprobs") or item.get("top_probs") or []:
            p = cand["prob"] if "prob" in cand else _exp(cand.get("logprob"))
            top.append((int(cand["id"]), str(cand.get("token", "")), float(p)))
        out.append(TokenProbs(token=int(item["id"]), top=tuple(top)))
    return tuple(out)


def _exp(logprob: float | None) -> float:
    import math

    return math.exp(logprob) if logprob is not None else 0.0


def parse_completion(body: dict[str, Any], wall_s: float, foreign: float | None) -> Completion:
    timings = body.get("timings")
    if not isinstance(timings, dict) or "predicted_n" not in timings:
        raise ServerFailed("request", "llama-server answered without timings", "", None)
    settings = body.get("generation_settings") or {}
    return Completion(
        tokens=tuple(int(t) for t in body.get("tokens") or ()),
        content=str(body.get("content", "")),
        predicted_n=int(timings["predicted_n"]),
        predicted_ms=float(timings["predicted_ms"]),
        prompt_n=int(timings.get("prompt_n", 0)),
        prompt_ms=float(timings.get("prompt_ms", 0.0)),
        draft_n=int(timings.get("draft_n", 0)),
        draft_n_accepted=int(timings.get("draft_n_accepted", 0)),
        stop_type=str(body.get("stop_type", "")),
        spec_types=str(settings.get("speculative.types", "")),
        wall_s=wall_s,
        foreign_cpu_s=foreign,
        probs=parse_probs(body.get("completion_probabilities") or []),
    )


class LlamaServer:
    """One llama-server process on 127.0.0.1 and a free port."""

    def __init__(
        self,
        command: list[str],
        *,
        env: dict[str, str],
        log_path: Path,
        startup_timeout: float = STARTUP_TIMEOUT_S,
        request_timeout: float = REQUEST_TIMEOUT_S,
        append_log: bool = False,
        pin: Callable[[], object] | None = None,
    ):
        # `command` is the full argv without --host/--port, which are chosen here.
        self.command = command
        self.append_log = append_log
        self.pin = pin  # runs in the child before exec: its cores and memory policy
        self.env = env
        self.log_path = log_path
        self.startup_timeout = startup_timeout
        self.request_timeout = request_timeout
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0
        self.argv: list[str] = []
        self._log_offset = 0

    # -- lifecycle ---------------------------------------------------------------------

    def __enter__(self) -> LlamaServer:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        # Several servers of one measurement (fresh state per sample) share its log: each
        # appends, and reads (messages, errors) only what it wrote itself.
        with self.log_path.open("ab" if self.append_log else "wb") as log_file:
            self._log_offset = log_file.tell()
        last: ServerFailed | None = None
        for _ in range(PORT_ATTEMPTS):
            self.port = free_port()
            address = [ServerFlag.HOST, LOCALHOST, ServerFlag.PORT, str(self.port)]
            self.argv = [*self.command, *address]
            try:
                self._spawn_and_wait()
                return
            except ServerFailed as err:
                self.stop()
                if err.kind != "port":
                    raise
                last = err
        assert last is not None
        raise ServerFailed(
            "port",
            f"llama-server could not bind {LOCALHOST} in {PORT_ATTEMPTS} attempts",
            last.llama_message,
            self.log_path,
        )

    def _spawn_and_wait(self) -> None:
        with self.log_path.open("ab") as out:
            out.write(f"$ {' '.join(self.argv)}\n".encode())
            out.flush()
            self.proc = spawn(
                self.argv, env=self.env, stdout=out, stderr=subprocess.STDOUT, log_path=None,
                pin=self.pin,
            )  # fmt: skip
        deadline = time.monotonic() + self.startup_timeout
        while True:
            rc = self.proc.poll()
            if rc is not None:
                raise self._exited(rc, "while loading")
            try:
                status, _ = self._http("GET", "/health", None, timeout=2.0)
                if status == 200:
                    return
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass
            if time.monotonic() > deadline:
                raise ServerFailed(
                    "timeout",
                    f"llama-server was not ready within {self.startup_timeout:.0f} s",
                    llama_message(self.log_text()),
                    self.log_path,
                )
            time.sleep(0.1)

    def _exited(self, rc: int, when: str) -> ServerFailed:
        text = self.log_text()
        kind = classify_exit(text, rc)
        how = exit_how(rc)
        return ServerFailed(
            kind, f"llama-server {how} {when}", llama_message(text), self.log_path, rc
        )

    def stop(self) -> None:
        proc = self.proc
        if proc is None:
            return
        pgid = proc.pid
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGTERM)
        try:
            proc.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)
            proc.wait()
        # Children that ignored SIGTERM (or outlived the leader) go too.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
        self.proc = None

    def log_text(self) -> str:
        """This server's part of the log."""
        try:
            with self.log_path.open("rb") as fh:
                fh.seek(self._log_offset)
                return fh.read().decode(errors="replace")
        except OSError:
            return ""

    # -- requests ----------------------------------------------------------------------

    def _http(
        self, method: str, path: str, body: dict[str, Any] | None, timeout: float
    ) -> tuple[int, Any]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(
            f"http://{LOCALHOST}:{self.port}{path}",
            data=data,
            method=method,
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                raw = resp.read()
                status = resp.status
        except urllib.error.HTTPError as err:
            raw = err.read()
            status = err.code
        ctype_json = raw[:1] in (b"{", b"[")
        return status, (json.loads(raw) if ctype_json else raw.decode(errors="replace"))

    def _timed_out(self, path: str) -> ServerFailed:
        return ServerFailed(
            "timeout",
            f"llama-server did not answer {path} within {self.request_timeout:.0f} s",
            llama_message(self.log_text()),
            self.log_path,
        )

    def request(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        try:
            status, payload = self._http(method, path, body, timeout=self.request_timeout)
        except TimeoutError as err:
            raise self._timed_out(path) from err
        except (urllib.error.URLError, ConnectionError, OSError) as err:
            rc = None
            if self.proc is not None:
                # The socket closes a moment before the crashed process is reapable.
                with contextlib.suppress(subprocess.TimeoutExpired):
                    rc = self.proc.wait(timeout=2.0)
            if rc is not None:
                raise self._exited(rc, f"during {path}") from err
            if isinstance(getattr(err, "reason", None), (TimeoutError, socket.timeout)):
                raise self._timed_out(path) from err
            raise ServerFailed(
                "crash", f"lost the connection to llama-server during {path}", str(err), None
            ) from err
        if status != 200:
            message = (
                payload.get("error", {}).get("message", "") if isinstance(payload, dict) else ""
            )
            raise ServerFailed(
                "request",
                f"llama-server answered {path} with HTTP {status}",
                message or str(payload)[:200],
                self.log_path,
            )
        return payload

    def complete(self, body: dict[str, Any]) -> Completion:
        assert self.proc is not None
        start = time.monotonic()
        with CpuWatch(self.proc.pid) as watch:
            payload = self.request("POST", "/completion", body)
        wall = time.monotonic() - start
        if not isinstance(payload, dict):
            raise ServerFailed(
                "request", "llama-server answered /completion with no JSON", "", None
            )
        return parse_completion(payload, wall, watch.foreign_s)

    def speculative_slots(self) -> bool | None:
        """Whether the slots have a speculative context; None when /slots is unavailable."""
        try:
            slots = self.request("GET", "/slots")
        except ServerFailed as err:
            if err.kind == "request":
                return None
            raise
        if not isinstance(slots, list) or not slots:
            return None
        return any(bool(slot.get("speculative")) for slot in slots)

    def spec_init_error(self) -> str:
        """llama.cpp's message when speculation failed to initialise (the server still runs)."""
        text = self.log_text()
        if not SPEC_INIT_FAILED.search(text):
            return ""
        return llama_message(text, SPEC_INIT_FAILED)
