"""Resident memory of a process, from /proc/PID/smaps_rollup.

RSS counts every page a process maps, shared or not; PSS divides each shared page among the
processes mapping it. Backends of one target `mmap` the same GGUF, so their weights sit in the
page cache once: the sum of their PSS is what they cost together, the sum of their RSS counts
the weights once per backend.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

KIB = 1024


@dataclass(frozen=True)
class Resident:
    """Bytes resident for one process (`*_file` are mapped files, e.g. the GGUF weights)."""

    pid: int
    rss: int
    pss: int
    pss_file: int | None
    pss_anon: int | None
    shared: int  # Shared_Clean + Shared_Dirty
    private: int  # Private_Clean + Private_Dirty


def resident(pid: int, proc: Path = Path("/proc")) -> Resident | None:
    """The process's resident memory; None when it is gone or the kernel lacks smaps_rollup."""
    try:
        text = (proc / str(pid) / "smaps_rollup").read_text()
    except OSError:
        return None
    values: dict[str, int] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if len(parts) == 2 and parts[1] == "kB" and parts[0].isdigit():
            values[key.strip()] = int(parts[0]) * KIB
    if "Rss" not in values or "Pss" not in values:
        return None
    return Resident(
        pid=pid,
        rss=values["Rss"],
        pss=values["Pss"],
        pss_file=values.get("Pss_File"),
        pss_anon=values.get("Pss_Anon"),
        shared=values.get("Shared_Clean", 0) + values.get("Shared_Dirty", 0),
        private=values.get("Private_Clean", 0) + values.get("Private_Dirty", 0),
    )


# What a backend holds beyond its mapped files before it has run (KV cache, compute buffers):
# assumed until one of the target's backends has been measured.
ANON_ESTIMATE = 256 * 2**20
BUDGET_SHARE = 0.9  # of the memory available at start-up, by default


def meminfo(proc: Path = Path("/proc")) -> dict[str, int]:
    """/proc/meminfo in bytes (empty where there is none)."""
    try:
        text = (proc / "meminfo").read_text()
    except OSError:
        return {}
    out: dict[str, int] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            out[key.strip()] = int(parts[0]) * (KIB if parts[1:] == ["kB"] else 1)
    return out


def default_budget(proc: Path = Path("/proc")) -> int | None:
    """The memory backends may hold together: a share of what is available now."""
    info = meminfo(proc)
    available = info.get("MemAvailable")
    return int(available * BUDGET_SHARE) if available else None


def file_bytes(*paths: str | None) -> int:
    """Apparent sizes of the model files a backend maps (split GGUFs: the first part only)."""
    total = 0
    for p in paths:
        if p:
            with contextlib.suppress(OSError):
                total += Path(p).stat().st_size
    return total


def budget_str(n: int | None) -> str:
    """In GB, the unit of every size specreg prints (specreg.units)."""
    from specreg.registry.queries import human_bytes

    return "none" if n is None else human_bytes(n)
