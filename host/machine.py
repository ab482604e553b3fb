"""The host a run happens on: its fingerprint and the process settings llama.cpp needs there.

`SPECREG_HOST_FACTS` (a JSON object of `Host` fields, e.g. `{"hostname": "alpha", "cpu_model":
"lab host alpha"}`) states facts that detection would get wrong or cannot see: several worker
processes standing in for hosts on one machine (a lab, the Ray tests), or a container that hides
the real CPU. The fingerprint follows the stated facts.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import shutil
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

from specreg.errors import UsageError

ENV_HOST_FACTS = "SPECREG_HOST_FACTS"


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
        return f"{self.mem_bytes / 2**30:.1f} GiB"

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


def _cpuinfo(proc: Path) -> tuple[str, int, int]:
    try:
        text = (proc / "cpuinfo").read_text(errors="replace")
    except OSError:
        n = os.cpu_count() or 1
        return platform.processor() or "unknown", n, n
    model = "unknown"
    cores: set[tuple[str, str]] = set()
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
    logical = logical or (os.cpu_count() or 1)
    return model, len(cores) or logical, logical


def _mem_bytes(proc: Path) -> int:
    try:
        m = re.search(r"MemTotal:\s+(\d+) kB", (proc / "meminfo").read_text())
    except OSError:
        return 0
    return int(m.group(1)) * 1024 if m else 0


def _numa_nodes(sys_root: Path) -> int:
    nodes = list((sys_root / "devices/system/node").glob("node[0-9]*"))
    return max(1, len(nodes))


def stated_facts(text: str | None) -> dict[str, str | int | None]:
    """The `Host` fields a `SPECREG_HOST_FACTS` value states, checked field by field."""
    if not text:
        return {}
    kinds = {f.name: f.type for f in fields(Host)}  # "int", "str" or "str | None"
    try:
        facts = json.loads(text)
    except ValueError as err:
        raise UsageError(
            f"{ENV_HOST_FACTS} is not JSON ({err}): give an object of host facts"
        ) from err
    if not isinstance(facts, dict):
        raise UsageError(f'{ENV_HOST_FACTS} must be a JSON object such as {{"hostname": "a"}}')
    for name, value in facts.items():
        kind = kinds.get(name)
        if kind is None:
            raise UsageError(
                f"{ENV_HOST_FACTS} names {name!r}, which is no host fact: use {', '.join(kinds)}"
            )
        if kind == "int":
            ok = isinstance(value, int) and not isinstance(value, bool) and value > 0
        else:
            ok = isinstance(value, str) or (value is None and "None" in str(kind))
        if not ok:
            want = "a positive integer" if kind == "int" else "a string"
            raise UsageError(f"{ENV_HOST_FACTS}: {name} must be {want}")
    return facts


def detect_host(proc: Path = Path("/proc"), sys_root: Path = Path("/sys")) -> Host:
    """This machine's facts, with those `SPECREG_HOST_FACTS` states in their place."""
    model, physical, logical = _cpuinfo(proc)
    host = Host(
        hostname=platform.node(),
        cpu_model=model,
        physical_cores=physical,
        logical_cpus=logical,
        mem_bytes=_mem_bytes(proc),
        numa_nodes=_numa_nodes(sys_root),
        numactl=shutil.which("numactl"),
        system=f"{platform.system()} {platform.release()}",
    )
    stated = stated_facts(os.environ.get(ENV_HOST_FACTS))
    return replace(host, **stated) if stated else host  # type: ignore[arg-type]
