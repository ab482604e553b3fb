"""The host a run happens on: its fingerprint and the process settings llama.cpp needs there."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path


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


def detect_host(proc: Path = Path("/proc"), sys_root: Path = Path("/sys")) -> Host:
    model, physical, logical = _cpuinfo(proc)
    return Host(
        hostname=platform.node(),
        cpu_model=model,
        physical_cores=physical,
        logical_cpus=logical,
        mem_bytes=_mem_bytes(proc),
        numa_nodes=_numa_nodes(sys_root),
        numactl=shutil.which("numactl"),
        system=f"{platform.system()} {platform.release()}",
    )
