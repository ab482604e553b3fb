"""Served requests become runs in the registry, written from a thread in batches.

DuckDB lets one process hold a registry open for writing, so the recorder opens it only to
write a batch and closes it again: `specreg runs` (and the recommender) can read the registry
while `serve` runs. A batch that finds the registry busy waits for the next turn.
Other work that writes the registry (a cache built from traffic) is handed to the same thread
with `schedule`: it runs after the runs queued before it are written.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path

from specreg.errors import RegistryError
from specreg.registry.db import opened
from specreg.registry.run_store import RunRecord, record_runs

log = logging.getLogger(__name__)

# Opening the registry costs ~15 ms of CPU and each run ~4 ms (DuckDB): batch them.
FLUSH_INTERVAL_S = 2.0
MAX_PENDING = 20000
RECORDER_NICE = 10  # weight ~1/10 of a normal thread: a flood of runs still drains


class RunRecorder:
    """Queue runs with `put` (cheap, any thread); a daemon thread writes them."""

    def __init__(self, db_path: Path, *, interval: float = FLUSH_INTERVAL_S):
        self.db_path = db_path
        self.interval = interval
        self._pending: collections.deque[RunRecord] = collections.deque()
        self._jobs: collections.deque[Callable[[], None]] = collections.deque()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="specreg-runs", daemon=True)
        self.written = 0
        self.dropped = 0
        self.last_error = ""

    def start(self) -> RunRecorder:
        self._thread.start()
        return self

    def put(self, run: RunRecord) -> None:
        with self._lock:
            if len(self._pending) >= MAX_PENDING:
                self._pending.popleft()
                self.dropped += 1
            self._pending.append(run)

    def schedule(self, job: Callable[[], None]) -> None:
        """Run `job` on the recorder's thread once the runs queued now are written."""
        self._jobs.append(job)
        self._wake.set()

    @property
    def pending(self) -> int:
        return len(self._pending)

    def close(self, timeout: float = 30.0) -> None:
        """Write what is queued and stop the thread."""
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def flush(self) -> bool:
        """Write what is queued now, in the caller's thread; False when the registry was busy
        (the batch stays queued)."""
        with self._lock:
            batch = list(self._pending)
            self._pending.clear()
        if not batch:
            return True
        try:
            with opened(self.db_path) as con:
                record_runs(con, batch)  # one transaction: the batch lands whole or not at all
        except RegistryError as err:
            self.last_error = str(err)
            log.warning("runs not written yet (%s): retrying", err)
            with self._lock:
                self._pending.extendleft(reversed(batch))
            return False
        self.written += len(batch)
        return True

    def _loop(self) -> None:
        # Writing a run costs DuckDB a few ms of CPU: on a busy host that must come out of idle
        # time, not out of llama.cpp's share (Linux nice values are per thread).
        with contextlib.suppress(AttributeError, OSError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), RECORDER_NICE)
        while not self._stop.is_set():
            self._wake.wait(self.interval)
            self._wake.clear()
            jobs = len(self._jobs)  # those scheduled before this flush's runs were queued
            if self.flush():
                self._run_jobs(jobs)
        self.flush()

    def _run_jobs(self, n: int) -> None:
        for _ in range(n):
            job = self._jobs.popleft()
            try:
                job()
            except Exception:  # a job must not stop the runs being written
                log.exception("a registry job failed")
