"""CPU time on this host: all of it, one process's, and what others used during a sample.

On a small host another process's burst slows llama.cpp many times over; these counters
let a measurement see that and take the sample again.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


def cpu_ticks_total() -> int | None:
    try:
        with open("/proc/stat") as fh:
            fields = fh.readline().split()[1:]
    except OSError:
        return None
    values = [int(v) for v in fields]
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    return sum(values[:8]) - idle


def ticks_per_s() -> int:
    """Clock ticks per second, the unit of the CPU times in /proc."""
    return os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True)
class ProcStat:
    """One process as its /proc/PID/stat shows it."""

    pid: int
    ppid: int
    name: str
    ticks: int  # CPU time it used, user and system, in clock ticks


def proc_stat(pid: int) -> ProcStat | None:
    """`pid`'s /proc/PID/stat, or None where the process is gone or the file unreadable."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            stat = fh.read()
    except OSError:
        return None
    # the name, in parentheses, may hold spaces and parentheses itself: split after the last
    head, _, rest = stat.rpartition(")")
    fields = rest.split()
    if len(fields) < 13:
        return None
    name = head.partition("(")[2]
    return ProcStat(pid, int(fields[1]), name, int(fields[11]) + int(fields[12]))  # utime, stime


class CpuWatch:
    """CPU time spent by processes other than the server and us during a request.

    On a small host another process's burst slows llama.cpp many times over; such samples
    are measured again instead of being recorded as data.
    """

    def __init__(self, *pids: int):
        self.pids = pids  # the servers measured (their own CPU is not foreign)
        self.hz = ticks_per_s()

    def _servers(self) -> int | None:
        stats = [proc_stat(pid) for pid in self.pids]
        return None if None in stats else sum(s.ticks for s in stats if s is not None)

    def __enter__(self) -> CpuWatch:
        self.total0 = cpu_ticks_total()
        self.server0 = self._servers()
        self.self0 = sum(os.times()[:2])
        self.foreign_s: float | None = None
        return self

    def __exit__(self, *exc: object) -> None:
        total1, server1 = cpu_ticks_total(), self._servers()
        if None in (self.total0, self.server0, total1, server1):
            return
        own = sum(os.times()[:2]) - self.self0
        busy = (total1 - self.total0) / self.hz  # type: ignore[operator]
        server = (server1 - self.server0) / self.hz  # type: ignore[operator]
        self.foreign_s = max(0.0, busy - server - own)
