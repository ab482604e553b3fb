"""Host facts the speed model needs: memory bandwidth, physical cores and memory, with their
sources.

They are built from `Host` (host/machine.py), so the cores the speed model uses are the cores
the printed commands give llama.cpp (`-t`), `SPECREG_HOST_FACTS` included. A command may ask
about another host (`HostQuery`: `--host-facts FILE`, `--cores N`, `--bandwidth GB/s`,
`--memory SIZE`). A fact no one states is this machine's, and the memory says so when the host
asked about is another: what fits is judged against it.

One bandwidth figure per host, in this order: the user's (`--bandwidth`, trusted as given);
the stated one (`bandwidth_gbs` in SPECREG_HOST_FACTS or the facts file, or the bandwidth
doctor measured in a `specreg doctor --json` file); the newest figure `specreg doctor` measured
for this host's fingerprint (recorded in the registry and in the cache); else one measurement
with doctor's kernel (host/membw.py), stored in the cache and reused: an estimate, because
doctor also compares page sizes and checks the memory configuration.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from specreg.errors import UsageError
from specreg.home import cache_dir
from specreg.host.machine import (
    STATED,
    STATED_BY_DOCTOR,
    Host,
    StatedFacts,
    detect_host,
    read_host_facts,
)

if TYPE_CHECKING:
    import duckdb

log = logging.getLogger(__name__)

# The reference host the shipped prior was measured on (recommender/data/PROVENANCE.md).
REFERENCE_BANDWIDTH_GBS = 460.0
REFERENCE_CORES = 96

# Where a bandwidth figure came from (HostFacts.source; the roofline line shows it).
SOURCE_USER = "user"
SOURCE_STATED = STATED
SOURCE_DOCTOR = STATED_BY_DOCTOR  # "measured by doctor"
SOURCE_ESTIMATE = "estimate"
SOURCE_REFERENCE = "reference"
# Where the core count came from (HostFacts.cores_source).
CORES_DETECTED = "detected"
CORES_STATED = "stated"
CORES_USER = "user"
# Where the memory figure came from (HostFacts.mem_source): detection on the host predicted
# for, stated facts, the user, or this machine's standing in for another host's.
MEM_DETECTED = "detected"
MEM_STATED = "stated"
MEM_USER = "user"
MEM_HERE = "this machine's"

STORE_FILE = "host_bandwidth.json"  # in cache_dir()/membw: the figure per host fingerprint


@dataclass(frozen=True)
class HostFacts:
    bandwidth_gbs: float
    physical_cores: int
    source: str  # user | stated | measured by doctor | estimate | reference (| recorded)
    fingerprint: str | None = None  # the runner's host fingerprint, to find this host's runs
    note: str = ""  # where the figures come from, in words
    cores_source: str = ""  # detected | stated | user
    mem_bytes: int = 0  # the host's memory (MemTotal, or as stated); 0: unknown
    mem_source: str = ""  # detected | stated | user | this machine's

    @property
    def bandwidth_str(self) -> str:
        return f"{self.bandwidth_gbs:.0f} GB/s ({self.source})"

    @property
    def cores_str(self) -> str:
        how = f" ({self.cores_source})" if self.cores_source else ""
        return f"{self.physical_cores} cores{how}"

    @property
    def mem_str(self) -> str:
        """The memory, in GB as every size specreg prints (specreg.units), with its source."""
        from specreg.registry.queries import human_bytes

        if self.mem_bytes <= 0:
            return "memory unknown"
        how = f" ({self.mem_source})" if self.mem_source else ""
        if self.mem_source == MEM_HERE:
            how = f" ({MEM_HERE}; --memory states that host's)"
        return f"{human_bytes(self.mem_bytes)} of memory{how}"

    def to_json(self) -> dict[str, object]:
        return asdict(self)


REFERENCE_HOST = HostFacts(
    REFERENCE_BANDWIDTH_GBS,
    REFERENCE_CORES,
    SOURCE_REFERENCE,
    note="AMD EPYC 9655, 12 x DDR5-5600: the host the shipped prior was measured on",
)


@dataclass(frozen=True)
class HostQuery:
    """The host a prediction is for, as a command was asked: all None is this machine.

    facts_file: another host's facts (the SPECREG_HOST_FACTS object or a doctor --json file);
    cores and bandwidth_gbs win over it and over detection.
    """

    bandwidth_gbs: float | None = None
    cores: int | None = None
    facts_file: Path | None = None
    mem_bytes: int | None = None

    @property
    def elsewhere(self) -> bool:
        """Asks about a host other than this machine (its runs are not this machine's)."""
        return self.cores is not None or self.facts_file is not None or self.mem_bytes is not None


@dataclass(frozen=True)
class Figure:
    """One host's bandwidth figure as stored: GB/s, its source, when and how it was measured."""

    read_gbs: float
    source: str
    measured_at: datetime
    method: str = ""

    @property
    def note(self) -> str:
        when = self.measured_at.strftime("%Y-%m-%d %H:%M UTC")
        if self.source == SOURCE_DOCTOR:
            return f"memory bandwidth measured by specreg doctor on {when}"
        return (
            f"memory bandwidth estimated on {when} (one measurement, reused); "
            "run specreg doctor to measure and record it"
        )


# --- the stored figure per host ---------------------------------------------------------


def _store_path(cache: Path | None) -> Path:
    return (cache or cache_dir() / "membw") / STORE_FILE


def stored_figure(fingerprint: str, cache: Path | None = None) -> Figure | None:
    """The figure stored for `fingerprint` in the cache (doctor's or the one estimate)."""
    try:
        entry = json.loads(_store_path(cache).read_text()).get(fingerprint)
        return Figure(
            float(entry["read_gbs"]),
            str(entry["source"]),
            datetime.fromisoformat(entry["measured_at"]),
            str(entry.get("method", "")),
        )
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None


def store_figure(fingerprint: str, figure: Figure, cache: Path | None = None) -> None:
    """Keep `figure` as this host's, replacing any before it (atomic; a cache that cannot be
    written only costs a measurement next time)."""
    path = _store_path(cache)
    try:
        stored = json.loads(path.read_text()) if path.exists() else {}
        if not isinstance(stored, dict):
            stored = {}
    except (OSError, ValueError):
        stored = {}
    stored[fingerprint] = {**asdict(figure), "measured_at": figure.measured_at.isoformat()}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".host_bandwidth.")
        with os.fdopen(fd, "w") as f:
            json.dump(stored, f, indent=1)
        os.replace(tmp, path)
    except OSError as err:
        log.warning("cannot store the bandwidth figure at %s: %s", path, err)


def recorded_figure(con: duckdb.DuckDBPyConnection | None, fingerprint: str) -> Figure | None:
    """The newest bandwidth `specreg doctor` recorded for `fingerprint` in the registry."""
    if con is None:
        return None
    import duckdb

    from specreg.registry.calibration import latest_bandwidth

    try:
        rec = latest_bandwidth(con, fingerprint)
    except duckdb.Error:  # a registry without the calibration tables
        return None
    if rec is None:
        return None
    return Figure(rec.read_gbs, SOURCE_DOCTOR, rec.measured_at, rec.method)


def doctor_figure(
    con: duckdb.DuckDBPyConnection | None, fingerprint: str, cache: Path | None = None
) -> Figure | None:
    """The newest figure doctor measured for this host: in the registry or in the cache."""
    found = [recorded_figure(con, fingerprint), stored_figure(fingerprint, cache)]
    doctors = [f for f in found if f is not None and f.source == SOURCE_DOCTOR]
    return max(doctors, key=lambda f: f.measured_at) if doctors else None


def measure_estimate(host: Host) -> Figure:
    """One measurement with doctor's kernel (host/membw.py), one thread per physical core."""
    from specreg.host import membw
    from specreg.host.machine import read_meminfo

    bw = membw.measure_bandwidth(host.threads, mem_available=read_meminfo().get("MemAvailable", 0))
    return Figure(bw.read_gbs, SOURCE_ESTIMATE, datetime.now(timezone.utc), bw.method_str)


def host_figure(
    con: duckdb.DuckDBPyConnection | None,
    host: Host,
    *,
    may_measure: bool = True,
    refresh: bool = False,
    cache: Path | None = None,
    measure: Callable[[Host], Figure] = measure_estimate,
) -> Figure | None:
    """This host's one figure: doctor's newest, else the stored estimate, else (when
    `may_measure`: `host` is this machine) one measurement, stored for next time."""
    fp = host.fingerprint
    if not refresh:
        found = doctor_figure(con, fp, cache) or stored_figure(fp, cache)
        if found is not None:
            return found
    if not may_measure:
        return None
    figure = measure(host)
    store_figure(fp, figure, cache)
    return figure


# --- the facts a command predicts with ----------------------------------------------------


def resolve_host(
    query: HostQuery | None = None,
    con: duckdb.DuckDBPyConnection | None = None,
    *,
    cache: Path | None = None,
    measure: Callable[[Host], Figure] = measure_estimate,
    proc: Path = Path("/proc"),
    sys_root: Path = Path("/sys"),
) -> tuple[Host, HostFacts]:
    """The host a command predicts for and its facts: the same cores for llama.cpp's threads
    (`Host.threads`) and the speed model (`HostFacts.physical_cores`)."""
    from specreg.host.machine import env_facts

    query = query or HostQuery()
    env = env_facts()
    file = read_host_facts(query.facts_file) if query.facts_file is not None else None
    here = detect_host(proc, sys_root)
    host = file.apply(here) if file is not None else here
    cores_source = CORES_DETECTED
    if "physical_cores" in env.host or (file is not None and "physical_cores" in file.host):
        cores_source = CORES_STATED
    if query.cores is not None:
        if query.cores < 1:
            raise UsageError(f"a host has at least 1 core, not {query.cores}")
        logical = max(host.logical_cpus, query.cores)
        host = replace(host, physical_cores=query.cores, logical_cpus=logical)
        cores_source = CORES_USER
    host, mem_source = _memory(query, host, env, file)
    # Only this machine's bandwidth can be measured here, or stated by SPECREG_HOST_FACTS.
    this_machine = host.fingerprint == here.fingerprint
    notes = [f"host facts from {file.origin}"] if file is not None else []
    if query.bandwidth_gbs is not None:
        bandwidth, source = float(query.bandwidth_gbs), SOURCE_USER
    elif file is not None and file.bandwidth_gbs is not None:
        bandwidth, source = file.bandwidth_gbs, file.bandwidth_source
    elif env.bandwidth_gbs is not None and this_machine:
        bandwidth, source = env.bandwidth_gbs, env.bandwidth_source
        notes.append(f"bandwidth stated in {env.origin}")
    else:
        figure = host_figure(con, host, may_measure=this_machine, cache=cache, measure=measure)
        if figure is None:
            raise UsageError(
                "the memory bandwidth of the host asked about is unknown here (it cannot be "
                "measured on this machine): state it in GB/s with that host's facts"
            )
        bandwidth, source = figure.read_gbs, figure.source
        notes.append(figure.note)
    facts = HostFacts(
        bandwidth,
        host.physical_cores,
        source,
        host.fingerprint,
        "; ".join(notes),
        cores_source,
        mem_bytes=host.mem_bytes,
        mem_source=mem_source,
    )
    return host, facts


def _memory(
    query: HostQuery, host: Host, env: StatedFacts, file: StatedFacts | None
) -> tuple[Host, str]:
    """The host with the memory asked about, and where that figure came from."""
    if query.mem_bytes is not None:
        if query.mem_bytes < 1:
            raise UsageError(f"a host has some memory, not {query.mem_bytes} bytes")
        return replace(host, mem_bytes=int(query.mem_bytes)), MEM_USER
    if file is not None and "mem_bytes" in file.host:
        return host, MEM_STATED
    if query.elsewhere:  # SPECREG_HOST_FACTS states this machine's, not the one asked about
        return host, MEM_HERE
    return host, MEM_STATED if "mem_bytes" in env.host else MEM_DETECTED


def detect_host_facts(
    bandwidth_gbs: float | None = None,
    *,
    fingerprint: str | None = None,
    con: duckdb.DuckDBPyConnection | None = None,
    cache: Path | None = None,
) -> HostFacts:
    """This machine's facts (`SPECREG_HOST_FACTS` honoured): `resolve_host` without a query
    but the bandwidth. `fingerprint`, when given, must be this machine's."""
    host, facts = resolve_host(HostQuery(bandwidth_gbs), con, cache=cache)
    if fingerprint is not None and fingerprint != host.fingerprint:
        raise ValueError(
            f"host fingerprint {fingerprint} is not this machine's ({host.fingerprint})"
        )
    return facts
