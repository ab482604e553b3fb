"""The host a run happens on, or a prediction is for: its fingerprint and the process settings
llama.cpp needs there. This module is the one reader of /proc/cpuinfo and /proc/meminfo.

Facts can be stated instead of detected, in one syntax: a JSON object of `Host` fields, plus
optionally `bandwidth_gbs` (the host's memory bandwidth in GB/s), e.g. `{"physical_cores": 96,
"bandwidth_gbs": 460}`. `SPECREG_HOST_FACTS` states them for this machine (several worker
processes standing in for hosts on one machine, as in a lab or the Ray tests; a container that
hides the real CPU). `--host-facts FILE` on the commands that predict reads the same object from
a file, or a `specreg doctor --json` document written on that host, to ask about another host.
Fields left out are this machine's. The fingerprint follows the stated facts.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import re
import shutil
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from specreg.errors import UsageError

ENV_HOST_FACTS = "SPECREG_HOST_FACTS"
# The one stated fact that is no `Host` field: the host's memory bandwidth (GB/s, 1e9 bytes/s).
BANDWIDTH_FACT = "bandwidth_gbs"
# Where a stated bandwidth came from: said by the user, or measured by doctor on that host
# (a `specreg doctor --json` document given as --host-facts).
STATED = "stated"
STATED_BY_DOCTOR = "measured by doctor"


@dataclass(frozen=True)
class Host:
    hostname: str
    cpu_model: str
    physical_cores: int
    logical_cpus: int
    mem_bytes: int
    numa_nodes: int
    numactl: str | None  # path of numactl when installed
    system: str

    @property
    def threads(self) -> int:
        """llama.cpp threads: one per physical core (SMT siblings only add contention)."""
        return max(1, self.physical_cores)

    @property
    def interleave(self) -> bool:
        return self.numactl is not None and self.numa_nodes > 1

    @property
    def fingerprint(self) -> str:
        # What makes measurements comparable: not the hostname, which changes with containers.
        key = {
            "cpu_model": self.cpu_model,
            "physical_cores": self.physical_cores,
            "logical_cpus": self.logical_cpus,
            "mem_gib": round(self.mem_bytes / 2**30),
            "numa_nodes": self.numa_nodes,
        }
        return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]

    @property
    def mem_str(self) -> str:
        """In GB (10^9 bytes), as every size specreg prints (specreg.units)."""
        from specreg.registry.queries import human_bytes

        return human_bytes(self.mem_bytes)

    def launch_prefix(self) -> list[str]:
        """Spread memory over NUMA nodes, as the reference host needs; nothing on one node."""
        return [str(self.numactl), "--interleave=all"] if self.interleave else []

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        env = dict(os.environ if base is None else base)
        # llama.cpp runs its own thread pool; OpenMP threads on top of it oversubscribe.
        env["OMP_NUM_THREADS"] = "1"
        return env

    def to_json(self) -> dict[str, object]:
        return {**asdict(self), "fingerprint": self.fingerprint, "threads": self.threads}


@dataclass(frozen=True)
class CpuInfo:
    """What /proc/cpuinfo says: the CPU model, physical cores, logical CPUs and CPU flags."""

    model: str
    physical_cores: int
    logical_cpus: int
    flags: frozenset[str] = frozenset()


def parse_cpuinfo(text: str) -> CpuInfo:
    """Physical cores are distinct (physical id, core id) pairs; without them, logical CPUs."""
    model = "unknown"
    cores: set[tuple[str, str]] = set()
    flags: frozenset[str] | None = None
    logical = 0
    phys = core = ""
    for line in text.splitlines() + [""]:
        if not line.strip():
            if phys or core:
                cores.add((phys, core))
            phys = core = ""
            continue
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if key == "processor":
            logical += 1
        elif key == "model name" and model == "unknown":
            model = value
        elif key == "physical id":
            phys = value
        elif key == "core id":
            core = value
        elif key in ("flags", "Features") and flags is None:  # x86, arm
            flags = frozenset(value.split())
    logical = logical or (os.cpu_count() or 1)
    return CpuInfo(model, len(cores) or logical, logical, flags or frozenset())


def read_cpuinfo(proc: Path = Path("/proc")) -> CpuInfo:
    try:
        text = (proc / "cpuinfo").read_text(errors="replace")
    except OSError:
        n = os.cpu_count() or 1
        return CpuInfo(platform.processor() or "unknown", n, n)
    return parse_cpuinfo(text)


def read_meminfo(proc: Path = Path("/proc")) -> dict[str, int]:
    """/proc/meminfo in bytes (MemTotal, MemAvailable, ...); empty when unreadable."""
    try:
        text = (proc / "meminfo").read_text(errors="replace")
    except OSError:
        return {}
    out: dict[str, int] = {}
    for line in text.splitlines():
        m = re.match(r"(\w+):\s+(\d+) kB", line)
        if m:
            out[m.group(1)] = int(m.group(2)) * 1024
    return out


def _numa_nodes(sys_root: Path) -> int:
    nodes = list((sys_root / "devices/system/node").glob("node[0-9]*"))
    return max(1, len(nodes))


@dataclass(frozen=True)
class StatedFacts:
    """Facts stated about a host rather than detected: some `Host` fields, perhaps its bandwidth.

    origin: where they were stated (`SPECREG_HOST_FACTS` or a file), for messages and notes.
    """

    host: Mapping[str, str | int | None] = field(default_factory=dict)
    bandwidth_gbs: float | None = None
    bandwidth_source: str = STATED
    origin: str = ENV_HOST_FACTS

    def apply(self, host: Host) -> Host:
        return replace(host, **self.host) if self.host else host  # type: ignore[arg-type]


def _positive(value: object) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value > 0
    )


def check_facts(facts: object, origin: str) -> StatedFacts:
    """A JSON value as stated host facts, checked field by field (`origin` names it)."""
    kinds = {f.name: f.type for f in fields(Host)}  # "int", "str" or "str | None"
    if not isinstance(facts, dict):
        raise UsageError(f'{origin} must be a JSON object such as {{"hostname": "a"}}')
    stated: dict[str, Any] = {}
    bandwidth = None
    for name, value in facts.items():
        if name == BANDWIDTH_FACT:
            if not _positive(value):
                raise UsageError(f"{origin}: {BANDWIDTH_FACT} must be a positive number (GB/s)")
            bandwidth = float(value)
            continue
        kind = kinds.get(name)
        if kind is None:
            raise UsageError(
                f"{origin} names {name!r}, which is no host fact: use "
                f"{', '.join([*kinds, BANDWIDTH_FACT])}"
            )
        if kind == "int":
            ok = isinstance(value, int) and _positive(value)
        else:
            ok = isinstance(value, str) or (value is None and "None" in str(kind))
        if not ok:
            want = "a positive integer" if kind == "int" else "a string"
            raise UsageError(f"{origin}: {name} must be {want}")
        stated[name] = value
    return StatedFacts(stated, bandwidth, origin=origin)


def stated_facts(text: str | None, origin: str = ENV_HOST_FACTS) -> StatedFacts:
    """The facts a `SPECREG_HOST_FACTS` value (or a file in its syntax) states."""
    if not text or not text.strip():
        return StatedFacts(origin=origin)
    return check_facts(_json(text, origin), origin)


# What a `specreg doctor --json` document's host carries besides its fields (derived values).
_DERIVED = ("fingerprint", "threads")


def read_host_facts(path: Path) -> StatedFacts:
    """Another host's facts from a file: the `SPECREG_HOST_FACTS` JSON object, or the document
    `specreg doctor --json` wrote on that host (its host, and the bandwidth doctor measured)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise UsageError(f"cannot read host facts from {path}: {err}") from err
    doc = _json(text, str(path))
    if not (isinstance(doc, dict) and doc.get("kind") == "doctor"):
        return check_facts(doc, str(path))
    host = doc.get("host")
    facts = {k: v for k, v in host.items() if k not in _DERIVED} if isinstance(host, dict) else {}
    stated = replace(check_facts(facts, f"{path} (its host)"), origin=str(path))
    measured = doc.get("bandwidth")
    read = measured.get("read_gbs") if isinstance(measured, dict) else None
    if read is None:  # doctor ran with --no-bandwidth
        return stated
    if not _positive(read):
        raise UsageError(f"{path}: bandwidth.read_gbs must be a positive number (GB/s)")
    return replace(stated, bandwidth_gbs=float(read), bandwidth_source=STATED_BY_DOCTOR)


def _json(text: str, origin: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as err:
        raise UsageError(f"{origin} is not JSON ({err}): give an object of host facts") from err


def env_facts() -> StatedFacts:
    """What `SPECREG_HOST_FACTS` states about this machine (nothing when unset)."""
    return stated_facts(os.environ.get(ENV_HOST_FACTS))


def detect_host(
    proc: Path = Path("/proc"), sys_root: Path = Path("/sys"), stated: StatedFacts | None = None
) -> Host:
    """This machine's facts, with those `SPECREG_HOST_FACTS` states in their place (and then
    those `stated` states: a host described in a file)."""
    cpu = read_cpuinfo(proc)
    host = Host(
        hostname=platform.node(),
        cpu_model=cpu.model,
        physical_cores=cpu.physical_cores,
        logical_cpus=cpu.logical_cpus,
        mem_bytes=read_meminfo(proc).get("MemTotal", 0),
        numa_nodes=_numa_nodes(sys_root),
        numactl=shutil.which("numactl"),
        system=f"{platform.system()} {platform.release()}",
    )
    host = env_facts().apply(host)
    return stated.apply(host) if stated is not None else host
