"""Host facts the speed model needs: memory bandwidth and physical cores.

Bandwidth is either given by the user (`--bandwidth GB/s`, trusted as given) or estimated with a
quick multi-threaded numpy copy and cached per machine. The estimate is honest about what it is:
a copy through Python threads reaches a share of the DRAM peak (often half or less on many-
channel servers), so it is labelled an estimate and a lower bound.
"""

from __future__ import annotations

import json
import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from specreg.home import cache_dir

log = logging.getLogger(__name__)

# The reference host the shipped prior was measured on (recommender/data/PROVENANCE.md).
REFERENCE_BANDWIDTH_GBS = 460.0
REFERENCE_CORES = 96

SOURCE_USER = "user"
SOURCE_ESTIMATE = "estimate"
SOURCE_REFERENCE = "reference"
CACHE_FILE = "host_bandwidth.json"


@dataclass(frozen=True)
class HostFacts:
    bandwidth_gbs: float
    physical_cores: int
    source: str  # user | estimate | reference
    fingerprint: str | None = None  # the runner's host fingerprint, to find this host's runs
    note: str = ""

    @property
    def bandwidth_str(self) -> str:
        tag = {SOURCE_USER: "given", SOURCE_ESTIMATE: "estimated", SOURCE_REFERENCE: "reference"}
        return f"{self.bandwidth_gbs:.0f} GB/s ({tag.get(self.source, self.source)})"

    def to_json(self) -> dict[str, object]:
        return asdict(self)


REFERENCE_HOST = HostFacts(
    REFERENCE_BANDWIDTH_GBS,
    REFERENCE_CORES,
    SOURCE_REFERENCE,
    note="AMD EPYC 9655, 12 x DDR5-5600: the host the shipped prior was measured on",
)


def physical_cores(proc: Path = Path("/proc")) -> int:
    """Distinct (physical id, core id) pairs in cpuinfo; the logical CPU count if unreadable."""
    try:
        text = (proc / "cpuinfo").read_text(errors="replace")
    except OSError:
        return os.cpu_count() or 1
    pairs = set()
    phys = core = None
    for line in text.splitlines() + [""]:
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "physical id":
            phys = value.strip()
        elif key == "core id":
            core = value.strip()
        elif not line.strip():
            if core is not None:
                pairs.add((phys, core))
            phys = core = None
    return len(pairs) or os.cpu_count() or 1


def copy_bandwidth_gbs(size_mb: int = 128, repeats: int = 3, threads: int | None = None) -> float:
    """Best-of-`repeats` read+write bandwidth of a threaded numpy copy, in GB/s."""
    threads = threads or max(1, physical_cores())
    n = size_mb * 2**20 // 8
    src = np.ones(n)
    dst = np.empty_like(src)
    chunks = np.array_split(np.arange(n), threads)
    bounds = [(int(c[0]), int(c[-1]) + 1) for c in chunks if len(c)]

    def part(b: tuple[int, int]) -> None:
        np.copyto(dst[b[0] : b[1]], src[b[0] : b[1]])

    best = float("inf")
    with ThreadPoolExecutor(max_workers=len(bounds)) as pool:
        list(pool.map(part, bounds))  # warm up: page faults, thread start
        for _ in range(repeats):
            t0 = time.perf_counter()
            list(pool.map(part, bounds))
            best = min(best, time.perf_counter() - t0)
    return 2 * src.nbytes / best / 1e9


def detect_host_facts(
    bandwidth_gbs: float | None = None,
    *,
    fingerprint: str | None = None,
    refresh: bool = False,
    cache: Path | None = None,
) -> HostFacts:
    """This machine's facts: the user's bandwidth if given, else a cached copy benchmark."""
    cores = physical_cores()
    if bandwidth_gbs is not None:
        return HostFacts(float(bandwidth_gbs), cores, SOURCE_USER, fingerprint)
    path = (cache or cache_dir()) / CACHE_FILE
    key = f"{fingerprint or 'local'}:{cores}"
    stored: dict[str, float] = {}
    if path.exists():
        try:
            stored = json.loads(path.read_text())
        except (OSError, ValueError):
            stored = {}
    if refresh or key not in stored:
        stored[key] = copy_bandwidth_gbs()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(stored, indent=1))
        except OSError as err:  # a read-only cache only costs a re-measurement next time
            log.warning("cannot cache the bandwidth estimate at %s: %s", path, err)
    return HostFacts(
        stored[key],
        cores,
        SOURCE_ESTIMATE,
        fingerprint,
        note="threaded numpy copy (read+write), a lower bound; pass --bandwidth to override",
    )
