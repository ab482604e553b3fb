"""Backends: llama-server processes that specreg starts, watches and restarts.

Each backend is the runner's `LlamaServer` (its own process group, SIGKILLed by Linux when
specreg dies, a free port on 127.0.0.1, health polled until ready, llama.cpp's own message on
failure). Starting and stopping happen on one dedicated thread that lives as long as the
pool: PR_SET_PDEATHSIG fires when the *thread* that forked the child exits, so a child
started from a short-lived worker thread would be killed when that thread ended.

Why supervised processes rather than llama.cpp's router mode (`--models-preset`, one preset
per configuration): the router picks a backend by the request's `model` field only, so
specreg would still have to sit in front to classify the task and record the run - a second
proxy hop on every request. The router spawns and unloads its children itself (cold starts
land inside served requests), keeps their logs in its own, and its children are outside the
process group and death signal specreg guarantees for every llama.cpp process it runs. Owning
the processes gives one hop, a crash report that names the backend with llama.cpp's last
line, and the same cleanup guarantee as `specreg run`.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes  # noqa: F401 - imported before any fork: the child's death-signal hook uses it
import logging
import os
import signal
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from specreg.host.placement import PlacementCheck, check_placement, pinning
from specreg.isa import SIGILL_REMEDY
from specreg.llama.process import ServerFailed, exit_how, killed_by, llama_message
from specreg.llama.server import STARTUP_TIMEOUT_S, LlamaServer
from specreg.serve.cores import CoreScheduler
from specreg.serve.memory import ANON_ESTIMATE, Resident, budget_str, file_bytes, resident
from specreg.serve.pooled import pooled
from specreg.serve.routes import BackendSpec, RouteTable

log = logging.getLogger(__name__)

SUPERVISE_INTERVAL_S = 0.25
# A crashed backend is started again this many times in a row before it is given up.
MAX_RESTARTS = 5
RESTART_BACKOFF_S = (0.5, 1.0, 2.0, 4.0, 8.0)
# After a broken connection, how long to wait for the process to be reapable: ggml's crash
# handler prints a backtrace (through gdb when installed) before the process is gone.
EXIT_WAIT_S = 10.0
# Requests that may wait for cores at once, beyond every backend's slots (serve --queue).
DEFAULT_MAX_QUEUE = 64


class BackendUnavailable(Exception):
    """The backend is not serving; the message names it and says why."""


@dataclass(frozen=True)
class BackendStatus:
    name: str
    ready: bool
    pid: int | None
    port: int | None
    starts: int
    speculative: bool | None  # /slots[].speculative after start
    last_exit: str
    failure: str
    memory: Resident | None
    placement: dict[str, object] | None = None  # its cores, and what the kernel says of them


class Backend:
    def __init__(
        self,
        spec: BackendSpec,
        *,
        env: dict[str, str],
        logs: Path,
        executor: ThreadPoolExecutor,
        startup_timeout: float = STARTUP_TIMEOUT_S,
    ):
        self.spec = spec
        self.name = spec.name
        self.env = env
        self.logs = logs
        self.executor = executor
        self.startup_timeout = startup_timeout
        self.server: LlamaServer | None = None
        self.url = ""
        self.ready = asyncio.Event()
        self.starts = 0
        self.speculative: bool | None = None
        # drafts from an n-gram pool of everything the process read (serve.pooled)
        self.pooled = pooled(spec.config.spec_type)
        self.spec_warning = ""
        self.last_exit = ""  # how the last process ended, with llama.cpp's message
        self.failure = ""  # set when the backend was given up
        self.stopping = False
        self.restarting = False
        self.answered = 0  # requests sent to the current process (a run's position in it)
        self.last_used = 0  # the pool's request counter when a request last chose it
        self.inflight = 0  # requests on their way through it now
        # requests sent to it that have not ended: waiting for it to start or for its cores,
        # or decoding (serve.layouts places a request on the replica with the fewest)
        self.assigned = 0
        self.starting: asyncio.Task[None] | None = None  # a lazy start under way
        self.last_pss: int | None = None  # bytes it held when last measured
        self.placement_check: PlacementCheck | None = None  # its cores and pages, read back

    # -- process --------------------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        proc = self.server.proc if self.server is not None else None
        return proc.pid if proc is not None else None

    @property
    def log_path(self) -> Path | None:
        return self.server.log_path if self.server is not None else None

    def exit_code(self) -> int | None:
        proc = self.server.proc if self.server is not None else None
        return proc.poll() if proc is not None else None

    def _start_blocking(self, server: LlamaServer) -> tuple[bool | None, str]:
        server.start()
        place = self.spec.placement
        if place is not None and server.proc is not None:
            # what the kernel says of its cores and its model's pages: a mismatch is reported
            models = [Path(p) for p in (self.spec.target.path, self.spec.draft_path) if p]
            self.placement_check = check_placement(server.proc.pid, place, models=models)
            if self.placement_check.problem:
                log.warning("%s: %s", self.name, self.placement_check.problem)
        if not self.spec.config.speculative:
            return None, ""
        return server.speculative_slots(), server.spec_init_error()

    async def start(self) -> None:
        """Start a new process; `ServerFailed` (llama.cpp's message) when it cannot serve."""
        self.ready.clear()
        self.starts += 1
        place = self.spec.placement
        # Without numactl in front, the child pins itself (cores, and on a multi-node host
        # its memory policy) before exec: every thread it starts inherits the placement.
        pin = pinning(place).apply if place is not None and not self.spec.prefix else None
        server = LlamaServer(
            list(self.spec.argv),
            env=self.env,
            log_path=self.logs / f"serve-{self.name}-{self.starts}.log",
            startup_timeout=self.startup_timeout,
            pin=pin,
        )
        started = self.executor.submit(self._start_blocking, server)
        try:
            spec_on, spec_err = await asyncio.wrap_future(started)
        except BaseException:
            # Cancelled (SIGTERM while loading) or failed: kill the process from here, so the
            # loading thread's health wait ends now rather than when the model has loaded.
            while not started.done():
                server.stop()
                await asyncio.sleep(0.05)
            server.stop()
            raise
        self.server = server
        self.answered = 0
        self.url = f"http://127.0.0.1:{server.port}"
        self.speculative = spec_on
        if spec_err or spec_on is False:
            self.spec_warning = (
                f"{self.name} serves without speculation: {spec_err or 'no speculative slot'}"
            )
            log.warning(self.spec_warning)
        self.ready.set()

    async def stop(self) -> None:
        self.stopping = True
        self.ready.clear()
        if self.server is not None:
            await asyncio.get_running_loop().run_in_executor(self.executor, self.server.stop)

    async def evict(self) -> None:
        """Stop the process to free its memory; the next request that needs it starts it."""
        self.measure()
        await self.stop()
        self.server = None
        self.stopping = False

    @property
    def running(self) -> bool:
        return self.server is not None and self.exit_code() is None

    def measure(self) -> int | None:
        """The bytes the process holds now (PSS: shared pages split among their users)."""
        pid = self.pid
        got = resident(pid) if pid is not None and self.exit_code() is None else None
        if got is not None:
            self.last_pss = got.pss
        return got.pss if got is not None else None

    def describe_exit(self, rc: int, server: LlamaServer | None = None) -> str:
        """How `server` (the current process unless given) ended, with llama.cpp's message."""
        server = server or self.server
        text = server.log_text() if server is not None else ""
        how = exit_how(rc)
        message = llama_message(text) or "(nothing logged)"
        where = f"; log: {server.log_path}" if server is not None else ""
        remedy = f"; {SIGILL_REMEDY}" if killed_by(rc) == signal.SIGILL else ""
        return f"llama-server {how}; llama.cpp's last message: {message}{where}{remedy}"

    async def crash_report(
        self, server: LlamaServer | None, wait: float = EXIT_WAIT_S
    ) -> str | None:
        """How `server` (the process a request was sent to) ended, if it did within `wait`
        seconds (a broken connection comes a moment before the process can be reaped); None
        while it is still running. Not the backend's current process: the supervisor may
        already have started a new one in its place."""
        proc = server.proc if server is not None else None
        if proc is None:
            return None
        deadline = time.monotonic() + wait
        while proc.poll() is None and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        rc = proc.poll()
        return None if rc is None else self.describe_exit(rc, server)

    async def wait_ready(self, timeout: float) -> None:
        if self.failure:
            raise BackendUnavailable(f"backend {self.name} is down: {self.failure}")
        if self.ready.is_set():
            return
        try:
            await asyncio.wait_for(self.ready.wait(), timeout)
        except asyncio.TimeoutError as err:
            why = f" (last exit: {self.last_exit})" if self.last_exit else ""
            raise BackendUnavailable(
                f"backend {self.name} was not ready within {timeout:.0f} s{why}"
            ) from err

    def status(self, *, memory: bool = True) -> BackendStatus:
        """How the backend is; `memory` reads /proc (about a millisecond per process)."""
        pid = self.pid
        return BackendStatus(
            name=self.name,
            ready=self.ready.is_set(),
            pid=pid,
            port=self.server.port if self.server is not None else None,
            starts=self.starts,
            speculative=self.speculative,
            last_exit=self.last_exit,
            failure=self.failure,
            memory=resident(pid)
            if memory and pid is not None and self.exit_code() is None
            else None,
            placement=self._placement_json(),
        )

    def _placement_json(self) -> dict[str, object] | None:
        place = self.spec.placement
        if place is None:
            return None
        check = self.placement_check
        return {
            **place.to_json(),
            "checked": check.to_json() if check is not None else None,
            "ok": check.ok if check is not None else None,
        }


class BackendPool:
    """Every backend of a route table; restarts the ones that exit."""

    def __init__(
        self,
        table: RouteTable,
        *,
        env: dict[str, str],
        logs: Path,
        startup_timeout: float = STARTUP_TIMEOUT_S,
        on_restart: Callable[[Backend, str], None] | None = None,
        memory_budget: int | None = None,
        lazy: bool = False,
        max_queue: int = DEFAULT_MAX_QUEUE,
    ):
        # Requests decode on a backend's cores only when no backend on overlapping cores does.
        self.scheduler = CoreScheduler(max_queue=max_queue)
        # One long-lived thread starts and stops every process (see the module docstring).
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="specreg-backends")
        logs.mkdir(parents=True, exist_ok=True)
        self.env, self.logs, self.startup_timeout = env, logs, startup_timeout
        self.backends: dict[str, Backend] = {}
        for spec in table.backends:
            self.add(spec)
        self.on_restart = on_restart
        self.memory_budget = memory_budget
        self.lazy = lazy  # start a backend when a request first needs it
        # Asked before a crashed backend is restarted: True means "do not, it is retired".
        self.on_crash: Callable[[Backend, str], bool] | None = None
        self.clock = 0  # counts requests: "least recently used" without reading a clock
        self.evictions: list[str] = []  # what was stopped to make room, and why
        self._start_lock: asyncio.Lock | None = None
        self._supervisor: asyncio.Task[None] | None = None
        self._restarts: set[asyncio.Task[None]] = set()

    def __getitem__(self, name: str) -> Backend:
        return self.backends[name]

    def add(self, spec: BackendSpec) -> Backend:
        """A backend the pool knows from now on (not started: a request starts it)."""
        if spec.name not in self.backends:
            self.backends[spec.name] = Backend(
                spec, env=self.env, logs=self.logs, executor=self.executor,
                startup_timeout=self.startup_timeout,
            )  # fmt: skip
            cpus = spec.cpus or tuple(sorted(os.sched_getaffinity(0)))
            self.scheduler.register(spec.name, cpus, spec.slots)
        return self.backends[spec.name]

    async def drop(self, name: str, why: str) -> None:
        """Stop a backend for good (a candidate superseded or retired): it serves no more."""
        backend = self.backends[name]
        backend.failure = why
        if backend.server is not None:
            await backend.evict()

    async def start(self, names: Iterable[str] | None = None) -> None:
        """Start the backends named (default: every one), one after the other: they share the
        cores while loading. The others start when a request first needs them (`ensure`)."""
        chosen = list(self.backends) if names is None else list(dict.fromkeys(names))
        try:
            for name in chosen:
                backend = self.backends[name]
                await self._make_room(backend)
                await backend.start()
        except BaseException:
            await self.stop()
            raise
        self._supervisor = asyncio.create_task(self._supervise(), name="specreg-supervisor")

    async def prestart(self, names: Iterable[str]) -> list[str]:
        """Start the backends named that fit the memory budget beside those running, without
        stopping any, so that a candidate's first request does not wait for it to load; the
        others (and any that fails here) start when a request first needs them. Which
        started."""
        started = []
        for name in dict.fromkeys(names):
            backend = self.backends[name]
            if backend.running or backend.failure:
                continue
            budget = self.memory_budget
            if budget is not None and self.used() + self.estimate(backend) > budget:
                continue
            try:
                await backend.start()
            except ServerFailed as err:
                log.warning("%s did not start ahead of its first request: %s", name, err)
                continue
            started.append(name)
        return started

    def start_ahead(self, name: str) -> None:
        """Start a backend that joined while serving (a traffic cache's), in the background,
        when it fits the memory budget beside those running: its first request then does not
        wait for it to load (a Qwen2.5-Coder-1.5B backend takes seconds). It starts as a
        request would start it (`ensure`): a request that needs it meanwhile waits for this
        start, and one that fails marks the backend down."""
        backend = self.backends[name]
        if not self.lazy or backend.running or backend.failure or backend.starting is not None:
            return
        budget = self.memory_budget
        if budget is not None and self.used() + self.estimate(backend) > budget:
            return
        backend.starting = asyncio.create_task(self._lazy_start(backend))
        backend.starting.add_done_callback(_failure_told)

    def touch(self, backend: Backend) -> None:
        self.clock += 1
        backend.last_used = self.clock

    async def ensure(self, backend: Backend, timeout: float) -> None:
        """`backend` ready to serve: started now if it is not running (within the memory
        budget, stopping the least recently used idle backends to make room).
        `BackendUnavailable` says why it cannot serve."""
        self.touch(backend)
        if backend.failure:
            raise BackendUnavailable(f"backend {backend.name} is down: {backend.failure}")
        if backend.ready.is_set():
            return
        idle = backend.server is None and backend.starting is None and not backend.restarting
        if self.lazy and idle:
            backend.starting = asyncio.create_task(self._lazy_start(backend))
        task = backend.starting
        if task is None:
            await backend.wait_ready(timeout)
            return
        try:
            await asyncio.wait_for(asyncio.shield(task), timeout)
        except asyncio.TimeoutError as err:
            raise BackendUnavailable(
                f"backend {backend.name} was not ready within {timeout:.0f} s"
            ) from err

    async def _lazy_start(self, backend: Backend) -> None:
        if self._start_lock is None:
            self._start_lock = asyncio.Lock()
        try:
            async with self._start_lock:  # one start at a time: memory is counted right
                await self._make_room(backend)
                await backend.start()
        except ServerFailed as err:
            backend.failure = f"failed to start: {err}"
            raise BackendUnavailable(f"backend {backend.name} {backend.failure}") from err
        finally:
            backend.starting = None

    def estimate(self, backend: Backend) -> int:
        """What `backend` will hold once running: its own last measurement, else a running
        sibling's (same target: the same weights, shared in the page cache), else its model
        files, the KV cache its context takes, and ANON_ESTIMATE."""
        if backend.last_pss:
            return backend.last_pss
        spec = backend.spec
        siblings = [
            b.measure() or 0
            for b in self.backends.values()
            if b is not backend and b.running and b.spec.target == spec.target
            and b.spec.draft_path == spec.draft_path
        ]  # fmt: skip
        if any(siblings):
            return max(siblings)
        return file_bytes(spec.target.path, spec.draft_path) + spec.kv_bytes + ANON_ESTIMATE

    def used(self, *, but: Backend | None = None) -> int:
        return sum(b.measure() or 0 for b in self.backends.values() if b.running and b is not but)

    async def _make_room(self, backend: Backend) -> None:
        budget = self.memory_budget
        if budget is None:
            return
        need = self.estimate(backend)
        while True:
            used = self.used(but=backend)
            if used + need <= budget:
                return
            idle = [
                b for b in self.backends.values()
                if b.running and b is not backend and b.inflight == 0 and b.starting is None
            ]  # fmt: skip
            if not idle:
                raise BackendUnavailable(
                    f"backend {backend.name} needs about {budget_str(need)}: the memory budget "
                    f"({budget_str(budget)}; serve --memory-budget) holds {budget_str(used)} in "
                    "backends that are busy or none to stop"
                )
            victim = min(idle, key=lambda b: b.last_used)
            self.evictions.append(
                f"stopped {victim.name} (least recently used) to start {backend.name}: "
                f"{budget_str(used)} held + {budget_str(need)} needed > {budget_str(budget)}"
            )
            log.info(self.evictions[-1])
            await victim.evict()

    async def stop(self) -> None:
        if self._supervisor is not None:
            self._supervisor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._supervisor
        for task in list(self._restarts):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for backend in self.backends.values():
            with contextlib.suppress(Exception):
                await backend.stop()
        self.executor.shutdown(wait=True)

    def restart_soon(self, backend: Backend) -> None:
        """Restart `backend` in the background unless that is already under way."""
        if backend.restarting or backend.stopping or backend.failure:
            return
        rc = backend.exit_code()
        if killed_by(rc) == signal.SIGILL:
            # The build cannot run here: a restart would die the same way.
            backend.failure = backend.last_exit = backend.describe_exit(rc or 0)
            backend.ready.clear()
            return
        if self.on_crash is not None:
            how = backend.describe_exit(rc) if rc is not None else "the connection broke"
            if self.on_crash(backend, f"crashed: {how}"):
                backend.failure = f"retired after a crash: {how}"
                backend.last_exit = how
                backend.ready.clear()
                return
        backend.restarting = True
        backend.ready.clear()
        task = asyncio.create_task(self._restart(backend), name=f"restart-{backend.name}")
        self._restarts.add(task)
        task.add_done_callback(self._restarts.discard)

    async def _restart(self, backend: Backend) -> None:
        try:
            rc = backend.exit_code()
            if rc is not None:
                backend.last_exit = backend.describe_exit(rc)
            log.warning("backend %s stopped (%s): restarting", backend.name, backend.last_exit)
            if backend.server is not None:
                await asyncio.get_running_loop().run_in_executor(
                    backend.executor, backend.server.stop
                )
            for attempt, pause in enumerate(RESTART_BACKOFF_S[:MAX_RESTARTS], 1):
                try:
                    await backend.start()
                    if self.on_restart is not None:
                        self.on_restart(backend, backend.last_exit)
                    return
                except ServerFailed as err:
                    backend.last_exit = str(err)
                    log.warning("restart %d of %s failed: %s", attempt, backend.name, err)
                    await asyncio.sleep(pause)
            backend.failure = f"gave up after {MAX_RESTARTS} restarts; {backend.last_exit}"
        finally:
            backend.restarting = False

    async def _supervise(self) -> None:
        while True:
            await asyncio.sleep(SUPERVISE_INTERVAL_S)
            for backend in self.backends.values():
                if backend.ready.is_set() and backend.exit_code() is not None:
                    self.restart_soon(backend)

    def status(self, *, memory: bool = True) -> list[BackendStatus]:
        return [b.status(memory=memory) for b in self.backends.values()]


def _failure_told(task: asyncio.Task[None]) -> None:
    """A background start's failure is the backend's (`Backend.failure`); logged here, not
    raised to no one."""
    if not task.cancelled() and (err := task.exception()) is not None:
        log.warning("%s", err)
