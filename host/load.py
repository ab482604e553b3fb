"""The load guard: measure on a quiet host, take turns with other specreg measurements, or
refuse with the reason.

On a 2-core host another process's burst slows llama.cpp 20-50x, and a steady load (two busy
loops) slows it 4x while leaving repeats that agree with each other: no spread check sees it.
So every measuring command (run, verify, tune, sweep, calibrate, agree, quality) goes through
the same steps before its timed samples:

1. `measurement_lock`: one specreg measurement per host at a time, through an fcntl lock on a
   file keyed by host name (`SPECREG_MEASURE_LOCK` relocates it). The holder writes its pid and
   command into the file, so the one that waits can say whom it waits for; the lock is held
   around the measurement only, never around registry writes.
2. `wait_quiet`: the CPU other processes use over a short window, from /proc (this process and
   its children excluded). Above `LoadPolicy.max_load` cores it names the top consumers (name,
   pid, % of a core, and whether a specreg measurement started them), waits up to
   `LoadPolicy.wait_s` seconds saying what it waits for, then refuses with `HostBusy` (exit 3)
   or, with `--allow-load`, measures anyway and the run is recorded as disturbed.

Thresholds come from a `LoadPolicy`: the CLI's options, else the environment
(`SPECREG_MAX_LOAD` cores, `SPECREG_LOAD_WAIT` s, `SPECREG_LOCK_WAIT` s, `SPECREG_MAX_SPREAD`,
`SPECREG_ALLOW_LOAD=1`), else defaults. A shared CI host that accepts its neighbours' load says
so there instead of pretending to be quiet.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import socket
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Any

from specreg.errors import HostBusy
from specreg.host import progress
from specreg.host.cpu import ProcStat, cpu_ticks_total, proc_stat, ticks_per_s

# the relative spread assumed until `specreg calibrate` measured one: the one noise figure of a
# host, as the recommender and serve's policy read it too (registry/noise.py)
from specreg.registry.noise import DEFAULT_NOISE_FLOOR as DEFAULT_NOISE_FLOOR

ENV_MAX_LOAD = "SPECREG_MAX_LOAD"
ENV_LOAD_WAIT = "SPECREG_LOAD_WAIT"
ENV_LOCK_WAIT = "SPECREG_LOCK_WAIT"
ENV_MAX_SPREAD = "SPECREG_MAX_SPREAD"
ENV_ALLOW_LOAD = "SPECREG_ALLOW_LOAD"
ENV_LOCK = "SPECREG_MEASURE_LOCK"

WINDOW_S = 0.5  # how long a load check watches /proc
DEFAULT_WAIT_S = 60.0  # how long to wait for a busy host to quiet down before refusing
DEFAULT_LOCK_WAIT_S = 1800.0  # how long to wait for another specreg measurement to finish
# Other processes may use this share of a core per core not measured with, at least this much
# (the contention threshold runner/protocol.py retries samples by).
LOAD_SHARE = 0.1
# A run's repeats may spread this many times the host's quiet noise floor, and at least
# MIN_SPREAD (short samples of a few tokens jitter more than llama-bench's long ones).
SPREAD_FACTOR = 4.0
MIN_SPREAD = 0.35
NOTE_EVERY_S = 10.0  # how often a wait says again what it waits for
# The holder writes its name just after it takes the lock: a wait this young says nothing
# until it can say whom it waits for.
HOLDER_GRACE_S = 1.0
TOP = 3  # consumers named in a message


def _env_float(name: str) -> float | None:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        from specreg.errors import UsageError

        raise UsageError(f"{name}={raw!r} is not a number") from None
    if value < 0:
        from specreg.errors import UsageError

        raise UsageError(f"{name}={raw!r} must not be negative")
    return value


@dataclass(frozen=True)
class LoadPolicy:
    """How much load a measurement accepts, and how long it waits for less."""

    max_load: float | None = None  # cores other processes may use; None: LOAD_SHARE rule
    wait_s: float = DEFAULT_WAIT_S
    lock_wait_s: float = DEFAULT_LOCK_WAIT_S
    allow_load: bool = False  # measure anyway when busy (the run is recorded disturbed)
    max_spread: float | None = None  # relative spread between repeats; None: from the floor
    noise_floor: float | None = None  # this host's quiet spread (`specreg calibrate`)
    window_s: float = WINDOW_S
    timed: bool = True  # False: untimed work (agreement's text) takes turns, ignores load

    @classmethod
    def from_env(cls) -> LoadPolicy:
        wait, lock_wait = _env_float(ENV_LOAD_WAIT), _env_float(ENV_LOCK_WAIT)
        return cls(
            max_load=_env_float(ENV_MAX_LOAD),
            wait_s=DEFAULT_WAIT_S if wait is None else wait,
            lock_wait_s=DEFAULT_LOCK_WAIT_S if lock_wait is None else lock_wait,
            allow_load=os.environ.get(ENV_ALLOW_LOAD, "") in ("1", "true", "yes"),
            max_spread=_env_float(ENV_MAX_SPREAD),
        )

    def with_(self, **changes: Any) -> LoadPolicy:
        return replace(self, **{k: v for k, v in changes.items() if v is not None})

    def cores_allowed(self, logical_cpus: int) -> float:
        if self.max_load is not None:
            return self.max_load
        return LOAD_SHARE * max(1, logical_cpus - 1)

    @property
    def spread_allowed(self) -> float:
        if self.max_spread is not None:
            return self.max_spread
        floor = DEFAULT_NOISE_FLOOR if self.noise_floor is None else self.noise_floor
        return max(MIN_SPREAD, SPREAD_FACTOR * floor)

    def to_json(self, logical_cpus: int) -> dict[str, Any]:
        return {
            "max_load_cores": round(self.cores_allowed(logical_cpus), 3),
            "allow_load": self.allow_load,
            "wait_s": self.wait_s,
            "noise_floor": self.noise_floor,
            "spread_allowed": round(self.spread_allowed, 4),
        }


_POLICY: ContextVar[LoadPolicy | None] = ContextVar("specreg_load_policy", default=None)


def current_policy() -> LoadPolicy:
    return _POLICY.get() or LoadPolicy.from_env()


def using(policy: LoadPolicy) -> contextlib.AbstractContextManager[LoadPolicy]:
    """Measure under `policy` in the block (the CLI's --allow-load, the stored noise floor)."""
    return progress.bound(_POLICY, policy)


# -- who uses the CPU --------------------------------------------------------------------------


def _processes() -> dict[int, ProcStat]:
    out = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return {}
    for entry in names:
        if entry.isdigit():
            p = proc_stat(int(entry))
            if p is not None:
                out[p.pid] = p
    return out


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            raw = fh.read()
    except OSError:
        return ""
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()


_SPECREG = re.compile(r"(^|[/\s])specreg(\s|$)|-m specreg\b")


def _ancestors(pid: int, procs: dict[int, ProcStat]) -> Iterator[int]:
    seen = set()
    while pid > 1 and pid not in seen:
        seen.add(pid)
        p = procs.get(pid)
        if p is None:
            return
        pid = p.ppid
        yield pid


@dataclass(frozen=True)
class Consumer:
    """A process that used CPU during a load check."""

    pid: int
    name: str
    cpu_percent: float  # of one core, as top shows it
    started_by: str | None = None  # "another specreg run (pid N)", "specreg (pid N)", None
    measuring: bool = False  # a child of a specreg measurement holding the lock

    def describe(self) -> str:
        by = f" started by {self.started_by}" if self.started_by else ""
        return f"{self.name} (pid {self.pid}, {self.cpu_percent:.0f} % CPU){by}"

    def to_json(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "name": self.name,
            "cpu_percent": round(self.cpu_percent, 1),
            "started_by": self.started_by,
            "specreg_measurement": self.measuring,
        }


@dataclass(frozen=True)
class LoadSample:
    """Other processes' CPU use over `window_s` seconds."""

    window_s: float
    foreign_cores: float  # cores' worth of CPU others used (this process tree excluded)
    logical_cpus: int
    consumers: tuple[Consumer, ...]  # the busiest first

    @property
    def measurement_cores(self) -> float:
        """The part of the load that other specreg measurements' processes made."""
        return sum(c.cpu_percent for c in self.consumers if c.measuring) / 100

    def describe(self, n: int = TOP) -> str:
        named = [c.describe() for c in self.consumers[:n] if c.cpu_percent >= 1]
        what = ", ".join(named) or "processes that ended before they could be named"
        return f"{what}; others used {self.foreign_cores:.1f} of {self.logical_cpus} cores"

    def to_json(self) -> dict[str, Any]:
        return {
            "window_s": round(self.window_s, 3),
            "foreign_cores": round(self.foreign_cores, 3),
            "logical_cpus": self.logical_cpus,
            "top": [c.to_json() for c in self.consumers[:TOP]],
        }


def sample_load(window_s: float = WINDOW_S, logical_cpus: int | None = None) -> LoadSample:
    """What other processes used over `window_s`: their share of the CPU in cores, and the
    busiest of them by name. This process and its descendants do not count."""
    cpus = logical_cpus or os.cpu_count() or 1
    hz = ticks_per_s()
    before, total0 = _processes(), cpu_ticks_total()
    t0 = time.monotonic()
    time.sleep(window_s)
    after, total1 = _processes(), cpu_ticks_total()
    wall = max(time.monotonic() - t0, 1e-3)
    me = os.getpid()
    mine = {me} | {pid for pid in after if me in _ancestors(pid, after)}
    deltas = {
        pid: p.ticks - before[pid].ticks
        for pid, p in after.items()
        if pid in before and p.ticks >= before[pid].ticks
    }
    own = sum(d for pid, d in deltas.items() if pid in mine)
    if total0 is None or total1 is None:
        foreign = sum(d for pid, d in deltas.items() if pid not in mine) / hz / wall
    else:
        foreign = max(0.0, (total1 - total0 - own) / hz / wall)
    holder = lock_holder()
    consumers: list[Consumer] = []
    for pid, d in sorted(deltas.items(), key=lambda kv: -kv[1]):
        if pid in mine or d <= 0:
            continue
        if len(consumers) >= 8:
            break
        consumers.append(_consumer(after[pid], d / hz / wall * 100, after, holder))
    return LoadSample(wall, foreign, cpus, tuple(consumers))


def _consumer(
    p: ProcStat, percent: float, procs: dict[int, ProcStat], holder: Holder | None
) -> Consumer:
    chain = [p.pid, *_ancestors(p.pid, procs)]
    if holder is not None and holder.pid in chain:
        who = "another specreg measurement" if holder.pid != p.pid else None
        return Consumer(p.pid, p.name, percent, who and f"{who} (pid {holder.pid})", True)
    for pid in chain:
        if pid > 1 and _SPECREG.search(_cmdline(pid)):
            return Consumer(
                p.pid, p.name, percent, f"specreg (pid {pid})" if pid != p.pid else None
            )
    return Consumer(p.pid, p.name, percent)


# -- waiting for a quiet host ------------------------------------------------------------------


@dataclass(frozen=True)
class LoadCheck:
    """The load a measurement started under: quiet, or busy and measured anyway."""

    sample: LoadSample
    busy: bool  # above the policy's limit when the measurement started (--allow-load)
    waited_s: float
    max_load_cores: float

    def to_json(self) -> dict[str, Any]:
        return {
            **self.sample.to_json(),
            "described": self.sample.describe(),
            "busy": self.busy,
            "waited_s": round(self.waited_s, 1),
            "max_load_cores": round(self.max_load_cores, 3),
        }


class BusyHost(HostBusy):
    """`HostBusy` with the load it saw (every consumer it noted, not only those named)."""

    def __init__(self, message: str, sample: LoadSample):
        super().__init__(message)
        self.sample = sample

    def __reduce__(self) -> tuple[type[BusyHost], tuple[str, LoadSample]]:
        # A Ray worker's error crosses to the driver pickled: rebuild it with both arguments.
        return type(self), (str(self), self.sample)


def busy_message(sample: LoadSample, limit: float, waited_s: float) -> str:
    waited = f" for {waited_s:.0f} s" if waited_s >= 1 else ""
    return (
        f"host busy{waited}: {sample.describe()} (at most {limit:.2f} allowed while measuring); "
        "wait, or pass --allow-load to measure anyway (recorded as disturbed)"
    )


def wait_quiet(
    logical_cpus: int,
    what: str,
    *,
    policy: LoadPolicy | None = None,
    ignore_measurements: bool = False,
) -> LoadCheck:
    """Wait (at most `policy.wait_s`) until other processes use at most `policy.max_load`
    cores, saying what it waits for; then `HostBusy`, or a busy `LoadCheck` under
    `allow_load`. `ignore_measurements`: load from other specreg measurements holding the
    lock does not count (the lock makes this one wait for them instead)."""
    policy = policy or current_policy()
    limit = policy.cores_allowed(logical_cpus)
    t0 = time.monotonic()
    last_note = -NOTE_EVERY_S
    while True:
        sample = sample_load(policy.window_s, logical_cpus)
        load = sample.foreign_cores - (sample.measurement_cores if ignore_measurements else 0.0)
        waited = time.monotonic() - t0
        if load <= limit:
            if waited >= 1:
                progress.note(f"host quiet after {waited:.0f} s: measuring {what}")
            return LoadCheck(sample, False, waited, limit)
        if waited >= policy.wait_s:
            if policy.allow_load:
                progress.note(
                    f"measuring {what} under load (--allow-load): {sample.describe()}; the run "
                    "is recorded as disturbed"
                )
                return LoadCheck(sample, True, waited, limit)
            raise BusyHost(busy_message(sample, limit, waited), sample)
        left = policy.wait_s - waited
        if waited - last_note >= NOTE_EVERY_S and left >= 1:
            progress.note(
                f"waiting up to {left:.0f} s for the host to quiet down before measuring {what}: "
                f"{sample.describe()}"
            )
            last_note = waited
        time.sleep(min(1.0, max(0.0, policy.wait_s - waited)))


# -- taking turns ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Holder:
    pid: int
    command: str
    what: str
    since: float


def lock_path() -> Path:
    env = os.environ.get(ENV_LOCK)
    if env:
        return Path(env)
    host = re.sub(r"[^A-Za-z0-9._-]", "_", socket.gethostname()) or "host"
    return Path(tempfile.gettempdir()) / f"specreg-measure-{host}.lock"


def lock_holder(path: Path | None = None) -> Holder | None:
    """Who holds the measurement lock, as it wrote itself into the file (None: nobody
    alive)."""
    path = path or lock_path()
    try:
        data = json.loads(path.read_text() or "{}")
        pid = int(data["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if pid == os.getpid() or not Path(f"/proc/{pid}").exists():
        return None
    return Holder(
        pid, str(data.get("command", "")), str(data.get("what", "")), float(data.get("since", 0))
    )


_HELD: dict[str, Any] = {"depth": 0, "file": None}


def _open_lock(path: Path) -> IO[str]:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    with contextlib.suppress(OSError):
        os.fchmod(fd, 0o666)  # other users' measurements take turns through it too
    return os.fdopen(fd, "r+")


@contextmanager
def measurement_lock(what: str, *, policy: LoadPolicy | None = None) -> Iterator[float]:
    """Hold the host's measurement lock for the block (re-entrant within a process); waits
    at most `policy.lock_wait_s`, saying for whom. Yields the seconds it waited."""
    if _HELD["depth"]:
        _HELD["depth"] += 1
        try:
            yield 0.0
        finally:
            _HELD["depth"] -= 1
        return
    policy = policy or current_policy()
    path = lock_path()
    fh = _open_lock(path)
    t0 = time.monotonic()
    last_note = -NOTE_EVERY_S
    try:
        while True:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                pass
            waited = time.monotonic() - t0
            holder = lock_holder(path)
            who = (
                f"specreg measurement (pid {holder.pid}: {holder.what or holder.command})"
                if holder
                else "another specreg measurement"
            )
            if waited >= policy.lock_wait_s:
                raise HostBusy(
                    f"host busy: {who} has held the measurement lock {path} for {waited:.0f} s; "
                    "wait for it to finish, or raise SPECREG_LOCK_WAIT"
                )
            if waited - last_note >= NOTE_EVERY_S and (holder or waited >= HOLDER_GRACE_S):
                progress.note(f"waiting for {who} to finish before measuring {what} (taking turns)")
                last_note = waited
            time.sleep(0.2)
        waited = time.monotonic() - t0
        if waited >= 0.5:
            progress.note(f"took the measurement lock after {waited:.0f} s: measuring {what}")
        fh.seek(0)
        fh.truncate()
        command = " ".join(["specreg", *sys.argv[1:]])[:200]
        fh.write(
            json.dumps({"pid": os.getpid(), "command": command, "what": what, "since": time.time()})
        )
        fh.flush()
        _HELD.update(depth=1, file=fh)
        try:
            yield waited
        finally:
            _HELD.update(depth=0, file=None)
            with contextlib.suppress(OSError):
                fh.seek(0)
                fh.truncate()
                fh.flush()
            fcntl.flock(fh, fcntl.LOCK_UN)
    finally:
        fh.close()


@contextmanager
def untimed() -> Iterator[LoadPolicy]:
    """Work in the block times nothing (a greedy text for agreement): it takes its turn on the
    host, but a busy host changes none of its results, so it neither waits nor refuses."""
    with using(replace(current_policy(), timed=False)) as policy:
        yield policy


@contextmanager
def guarded(logical_cpus: int, what: str) -> Iterator[LoadCheck]:
    """The guard every timed measurement runs under: the host's lock, then a quiet host (or
    `HostBusy`, or a busy check under --allow-load)."""
    policy = current_policy()
    with measurement_lock(what, policy=policy):
        if not policy.timed:
            quiet = LoadSample(0.0, 0.0, logical_cpus, ())
            yield LoadCheck(quiet, False, 0.0, policy.cores_allowed(logical_cpus))
            return
        # --allow-load waited its bounded time before the run was recorded (`preflight`)
        now = replace(policy, wait_s=0.0) if policy.allow_load else policy
        yield wait_quiet(logical_cpus, what, policy=now)


def preflight(logical_cpus: int, what: str) -> LoadCheck:
    """Before a run is recorded as started: refuse a host busy with other work at once (or
    after the bounded wait) rather than record an interrupted run. Other specreg
    measurements do not count here: the lock makes the measurement wait its turn."""
    return wait_quiet(logical_cpus, what, ignore_measurements=True)
