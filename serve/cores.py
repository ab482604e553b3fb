"""Cores as a resource `serve` schedules: requests never fight for them.

Every backend runs on a core set (its placement) with a number of slots. A request decodes on
one backend: it may start when that backend has a free slot and no OTHER backend whose core set
overlaps it is decoding; otherwise it waits. Two llama-servers decoding on the same cores at
once spin twice the threads the cores have (measured on this 2-core host: 85 t/s fell to 6.4
t/s, 19x below a lone llama-server), so this is never allowed, by construction: a grant checks
it, and nothing decodes without a grant.

A request may name several backends it would accept (its first choice, then lossless
alternatives of its target): it gets the first that can start now, or waits for any of them.
Waiting is first come, first served: once a request waits for a core set, later requests do
not start on those cores ahead of it (a busy backend stops taking newcomers until the cores
have drained), so a configuration on shared cores is never starved. The queue is bounded:
past it `QueueFull` (serve answers 503 with Retry-After).

Pure asyncio, no I/O: the grants are recorded (`history`) so a test, the status and the
benchmarks can check that no two overlapping backends ever decoded at once.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

# How many grant intervals the scheduler keeps for its record (oldest dropped first).
HISTORY = 4096


class QueueFull(Exception):
    """Every slot of every acceptable backend is busy and the queue is at its bound."""

    def __init__(self, waiting: int, bound: int, retry_after: float):
        self.waiting = waiting
        self.bound = bound
        self.retry_after = retry_after
        super().__init__(
            f"the server is at capacity: {waiting} request(s) wait for cores (serve "
            f"--queue {bound}); retry in about {retry_after:.0f} s"
        )


@dataclass
class _Backend:
    name: str
    cpus: frozenset[int]
    slots: int
    active: int = 0
    granted: int = 0


@dataclass(frozen=True)
class Grant:
    """One request's time on a backend's cores."""

    backend: str
    queued_s: float  # how long it waited for the cores
    load: int  # requests decoding on these cores once it started (itself included)
    ticket: int


@dataclass
class _Waiter:
    ticket: int
    names: tuple[str, ...]
    since: float
    future: asyncio.Future[Grant] = field(repr=False)


@dataclass(frozen=True)
class Interval:
    """A grant as it happened: backend, start and end (time.monotonic())."""

    backend: str
    start: float
    end: float


class CoreScheduler:
    """See the module docstring. `clock` is injectable for tests."""

    def __init__(self, *, max_queue: int = 64, clock: Callable[[], float] = time.monotonic):
        self.max_queue = max_queue
        self.clock = clock
        self._backends: dict[str, _Backend] = {}
        self._queue: deque[_Waiter] = deque()
        self._tickets = itertools.count(1)
        self._open: dict[int, tuple[str, float]] = {}  # ticket -> (backend, start)
        self.history: deque[Interval] = deque(maxlen=HISTORY)
        self.rejected = 0  # requests refused with QueueFull
        self._seconds = 0.0  # decode seconds of finished grants (for Retry-After)
        self._finished = 0

    # -- the backends ---------------------------------------------------------------------

    def register(self, name: str, cpus: Iterable[int], slots: int) -> None:
        """A backend on `cpus` serving up to `slots` requests at once."""
        if slots < 1:
            raise ValueError(f"{name}: a backend needs at least one slot")
        got = self._backends.get(name)
        if got is not None:
            got.cpus, got.slots = frozenset(cpus), slots
        else:
            self._backends[name] = _Backend(name, frozenset(cpus), slots)

    def overlapping(self, name: str) -> list[str]:
        """The other backends whose cores overlap `name`'s."""
        me = self._backends[name]
        return [b.name for b in self._backends.values() if b is not me and b.cpus & me.cpus]

    def share_cores(self, a: str, b: str) -> bool:
        """Whether backends `a` and `b` run on overlapping cores (a backend shares its own)."""
        return bool(self._backends[a].cpus & self._backends[b].cpus)

    def active(self, name: str) -> int:
        return self._backends[name].active

    def load(self, name: str) -> int:
        """Requests decoding now on `name`'s cores (its own and overlapping backends')."""
        me = self._backends[name]
        return sum(b.active for b in self._backends.values() if b.cpus & me.cpus)

    @property
    def waiting(self) -> int:
        return len(self._queue)

    def can_start(self, name: str) -> bool:
        b = self._backends[name]
        if b.active >= b.slots:
            return False
        return all(o.active == 0 for o in self._backends.values() if o is not b and o.cpus & b.cpus)

    # -- granting -------------------------------------------------------------------------

    async def acquire(self, names: Sequence[str]) -> Grant:
        """Cores for one request on the first of `names` that can start; waits (in order of
        arrival) until one can. `QueueFull` past the bound. Cancelling the wait (a client that
        went away) leaves the queue."""
        if not names:
            raise ValueError("a request needs at least one backend")
        unknown = [n for n in names if n not in self._backends]
        if unknown:
            raise KeyError(f"backend(s) not registered with the scheduler: {unknown}")
        ticket = next(self._tickets)
        now = self.clock()
        if not self._queue:
            for name in names:
                if self.can_start(name):
                    return self._grant(ticket, name, now)
        if len(self._queue) >= self.max_queue:
            self.rejected += 1
            raise QueueFull(len(self._queue), self.max_queue, self.retry_after())
        loop = asyncio.get_running_loop()
        waiter = _Waiter(ticket, tuple(names), now, loop.create_future())
        self._queue.append(waiter)
        self._dispatch()
        try:
            return await waiter.future
        except asyncio.CancelledError:
            if waiter in self._queue:
                self._queue.remove(waiter)
                self._dispatch()
            elif waiter.future.done() and not waiter.future.cancelled():
                self.release(waiter.future.result())  # granted as it was cancelled
            raise

    def release(self, grant: Grant) -> None:
        """The request on `grant` is done (answered, failed or its client gone)."""
        opened = self._open.pop(grant.ticket, None)
        if opened is None:
            return  # released twice: the first counted
        name, start = opened
        b = self._backends[name]
        b.active -= 1
        end = self.clock()
        self.history.append(Interval(name, start, end))
        self._seconds += end - start
        self._finished += 1
        self._dispatch()

    def _grant(self, ticket: int, name: str, since: float) -> Grant:
        b = self._backends[name]
        b.active += 1
        b.granted += 1
        now = self.clock()
        self._open[ticket] = (name, now)
        return Grant(name, now - since, self.load(name), ticket)

    def _dispatch(self) -> None:
        """Start every waiter that can start, in order of arrival; a waiter that cannot holds
        its first choice's cores against the waiters behind it. One exception makes batches:
        a backend started in this pass takes every waiter for it that its slots hold (they
        all waited; they decode together in one pass per step), cores held or not."""
        held: set[int] = set()
        started: set[str] = set()
        for waiter in list(self._queue):
            if waiter.future.done():
                self._queue.remove(waiter)
                continue
            for name in waiter.names:
                if not self.can_start(name):
                    continue
                if self._backends[name].cpus & held and name not in started:
                    continue
                self._queue.remove(waiter)
                waiter.future.set_result(self._grant(waiter.ticket, name, waiter.since))
                started.add(name)
                break
            else:
                held |= self._backends[waiter.names[0]].cpus

    # -- reading --------------------------------------------------------------------------

    def retry_after(self) -> float:
        """A client's fair wait before trying again: the queue ahead of it at the mean decode
        time of the requests so far, spread over the slots; at least a second."""
        mean = self._seconds / self._finished if self._finished else 10.0
        slots = max(1, sum(b.slots for b in self._backends.values()))
        return max(1.0, mean * (len(self._queue) + 1) / slots)

    def overlaps_seen(self) -> list[tuple[Interval, Interval]]:
        """Pairs of recorded grants on different, overlapping backends that overlapped in time
        (never, by construction: the regression tests read it)."""
        out = []
        done = sorted(self.history, key=lambda i: i.start)
        for i, a in enumerate(done):
            for b in done[i + 1 :]:
                if b.start >= a.end:
                    break
                if a.backend != b.backend and self._backends[a.backend].cpus & (
                    self._backends[b.backend].cpus
                ):
                    out.append((a, b))
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "waiting": len(self._queue),
            "max_queue": self.max_queue,
            "rejected": self.rejected,
            "backends": [
                {
                    "name": b.name,
                    "cpus": sorted(b.cpus),
                    "slots": b.slots,
                    "active": b.active,
                    "granted": b.granted,
                }  # fmt: skip
                for b in self._backends.values()
            ],
        }
