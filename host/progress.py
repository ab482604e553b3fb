"""Progress of long work, reported by the core and rendered by whoever listens.

Library code never prints: a measurement says what it measures and how far along it is
(`task`), and why it waits or takes a sample again (`note`), through the listener of the
current context. The CLI installs one that draws a progress bar on a terminal
(`specreg/cli/progress.py`); without one, notes go to the log and tasks go nowhere.
A context variable rather than a parameter threaded through every layer: run, verify, tune,
sweep, calibrate, agree and quality all reach the same few measuring functions.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from contextvars import ContextVar
from typing import Protocol, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")


class Task(Protocol):
    def advance(self, n: int = 1, *, detail: str | None = None) -> None: ...


class Listener(Protocol):
    """Renders progress: `start` opens a task (total None: unknown), `note` is one line."""

    def start(self, description: str, total: int | None) -> Task: ...

    def finish(self, task: Task) -> None: ...

    def note(self, message: str) -> None: ...


class _Quiet:
    def advance(self, n: int = 1, *, detail: str | None = None) -> None:
        pass


class _LogListener:
    def start(self, description: str, total: int | None) -> Task:
        log.debug("start: %s (%s steps)", description, total)
        return _Quiet()

    def finish(self, task: Task) -> None:
        pass

    def note(self, message: str) -> None:
        log.info("%s", message)


_LISTENER: ContextVar[Listener | None] = ContextVar("specreg_progress", default=None)


def listener() -> Listener:
    return _LISTENER.get() or _LogListener()


@contextmanager
def bound(var: ContextVar[T | None], value: T) -> Iterator[T]:
    """`var` is `value` in the block, and what it was before once the block ends (this
    module's listener, the load policy of `host.load`)."""
    token = var.set(value)
    try:
        yield value
    finally:
        var.reset(token)


def listening(to: Listener) -> AbstractContextManager[Listener]:
    """Report the progress of the block's work to `to`."""
    return bound(_LISTENER, to)


@contextmanager
def task(description: str, total: int | None = None) -> Iterator[Task]:
    """A piece of long work of `total` steps (None: unknown), for the block."""
    to = listener()
    handle = to.start(description, total)
    try:
        yield handle
    finally:
        to.finish(handle)


def note(message: str) -> None:
    """One line the user should see now: a wait, a retry and why, a refusal avoided."""
    listener().note(message)
