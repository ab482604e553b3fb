"""`specreg doctor`: the host settings that decide llama.cpp's speed, each with its cost and fix.

Every check reads the kernel's own interfaces (/proc, /sys) through a `SystemView`, so tests run
them against fake trees; the memory bandwidth is measured (host/membw.py) and kept as this host's
one figure (host/facts.py: the registry and the cache, which recommend reads), and the llama.cpp
build's CPU features come from the build itself (`llama_print_system_info`).

What a finding costs is quoted from the user's own measurements where they exist (their
host-settings track on the EPYC 9655: threads on SMT siblings -57 % generation, memory bound to
one NUMA node -46 %), measured here where doctor can measure it (huge pages, bandwidth), and
otherwise given as an estimate that says so.
"""

from __future__ import annotations

import logging
import os
import re
import shlex
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from specreg import isa
from specreg.host.machine import Host, detect_host, read_cpuinfo, read_meminfo
from specreg.host.membw import Bandwidth, MemoryConfig, parse_dmidecode, read_dmidecode
from specreg.host.topology import parse_cpu_list

log = logging.getLogger(__name__)

OK = "ok"
FINDING = "finding"
INFO = "info"
UNKNOWN = "unknown"

COST_USER = "user-measured"
COST_HERE = "measured here"
COST_ESTIMATE = "estimate"

# The user's own measurements on the reference host (AMD EPYC 9655, 96 cores, 12 x DDR5-5600).
USER_SMT_COST = -0.57  # generation with llama.cpp threads on SMT siblings
USER_NUMA_COST = -0.46  # generation with memory bound to one NUMA node instead of interleaved

# Host CPU flag (/proc/cpuinfo) for each feature llama.cpp's system info names.
CPU_FEATURES: tuple[tuple[str, str], ...] = (
    ("AVX2", "avx2"),
    ("FMA", "fma"),
    ("F16C", "f16c"),
    ("AVX_VNNI", "avx_vnni"),
    ("AVX512", "avx512f"),
    ("AVX512_VBMI", "avx512vbmi"),
    ("AVX512_VNNI", "avx512_vnni"),
    ("AVX512_BF16", "avx512_bf16"),
    ("AMX_INT8", "amx_int8"),
)
# Governors that keep the clock low under llama.cpp's sustained load.
SLOW_GOVERNORS = ("powersave", "conservative")
PSTATE_DRIVERS = ("intel_pstate", "amd-pstate-epp", "amd-pstate")
HUGEPAGE_GAIN_FINDING = 0.02  # a measured huge-page gain below this is noise on a shared host
# The cmake definitions that compile llama.cpp without AMX, quoted for a shell.
AMX_OFF_CMAKE = " ".join(shlex.quote(flag) for flag in isa.cmake_flags((isa.AMX,)))


@dataclass(frozen=True)
class SystemView:
    """Where the checks look: the kernel's trees, the environment and the tools on PATH."""

    proc: Path = Path("/proc")
    sys_root: Path = Path("/sys")
    env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    which: Callable[[str], str | None] = shutil.which
    dmidecode: Callable[[], str | None] | None = None  # None: run the real one if installed

    def read(self, root: Path, rel: str) -> str | None:
        try:
            return (root / rel).read_text(errors="replace").strip()
        except OSError:
            return None

    def proc_text(self, rel: str) -> str | None:
        return self.read(self.proc, rel)

    def sys_text(self, rel: str) -> str | None:
        return self.read(self.sys_root, rel)

    def dmidecode_text(self) -> str | None:
        return self.dmidecode() if self.dmidecode is not None else read_dmidecode(self.which)


@dataclass(frozen=True)
class Check:
    """One thing doctor looked at: what it saw, what it costs, and the commands that fix it."""

    name: str
    status: str  # ok | finding | info | unknown
    summary: str
    cost: str = ""
    cost_source: str = ""  # user-measured | measured here | estimate
    fix: tuple[str, ...] = ()
    facts: dict[str, Any] = field(default_factory=dict)

    @property
    def is_finding(self) -> bool:
        return self.status == FINDING


@dataclass(frozen=True)
class BuildFacts:
    """What the llama.cpp build was compiled for, and whether it runs here (llama/facts.py)."""

    bin_dir: Path
    version: str
    system_info: str | None  # llama_print_system_info(), e.g. "CPU : SSE3 = 1 | AVX = 1 | ..."
    native: bool | None  # GGML_NATIVE from the build's CMakeCache.txt, None when unknown
    # System-info features turned off on purpose because they kill this build here (specreg's
    # own build: `specreg llama info` says why); not a finding.
    turned_off: tuple[str, ...] = ()
    runs: bool | None = None  # it ran the proof model through its binaries; None: not tried
    died: bool = False  # a binary was killed by a signal (the build, not the input)
    runs_summary: str = ""  # which binary failed and how, or that all ran
    runs_seconds: float = 0.0

    @property
    def features(self) -> dict[str, bool]:
        if not self.system_info:
            return {}
        return {k: v == "1" for k, v in re.findall(r"(\w+) = (\d)", self.system_info)}


@dataclass(frozen=True)
class TargetSize:
    label: str
    n_bytes: int


@dataclass(frozen=True)
class DoctorReport:
    JSON_KIND = "doctor"
    JSON_VERSION = "2"  # 2: the llama-runs check, and build.turned_off/runs/died/runs_summary

    host: Host
    checks: tuple[Check, ...]
    seconds: float
    bandwidth: Bandwidth | None = None
    memory_config: MemoryConfig | None = None
    build: BuildFacts | None = None

    @property
    def findings(self) -> tuple[Check, ...]:
        return tuple(c for c in self.checks if c.is_finding)

    @property
    def ok(self) -> bool:
        return not self.findings

    def check(self, name: str) -> Check:
        return next(c for c in self.checks if c.name == name)

    def to_json(self) -> dict[str, Any]:
        from specreg.jsonout import document, plain

        return document(
            self.JSON_KIND,
            self.JSON_VERSION,
            {
                "ok": self.ok,
                "n_findings": len(self.findings),
                "host": self.host.to_json(),
                "checks": plain(self.checks),
                "bandwidth": {
                    **plain(self.bandwidth),
                    "method_str": self.bandwidth.method_str,
                }
                if self.bandwidth
                else None,
                "memory_config": {
                    **plain(self.memory_config),
                    "peak_gbs": self.memory_config.peak_gbs,
                    "description": self.memory_config.description,
                }
                if self.memory_config
                else None,
                "build": plain(self.build),
                "seconds": self.seconds,
            },
        )


# --- reading the trees -------------------------------------------------------------------------


def bracketed(text: str | None) -> str | None:
    """The selected value of a sysfs choice such as `always [madvise] never`."""
    if text is None:
        return None
    m = re.search(r"\[([^\]]+)\]", text)
    return m.group(1) if m else text.strip() or None


def _cgroup_cpus(view: SystemView) -> float | None:
    """CPUs this process's cgroup may use (quota / period), None when unlimited or unknown."""
    for line in (view.proc_text("self/cgroup") or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        path = path.lstrip("/")
        if controllers == "":
            text = view.sys_text(str(Path("fs/cgroup") / path / "cpu.max"))
            if text:
                limit, _, period = text.partition(" ")
                if limit != "max" and period:
                    return int(limit) / int(period)
        elif "cpu" in controllers.split(","):
            for folder in (controllers, "cpu", "cpu,cpuacct"):
                base = Path("fs/cgroup") / folder / path
                quota_s = view.sys_text(str(base / "cpu.cfs_quota_us"))
                period_s = view.sys_text(str(base / "cpu.cfs_period_us"))
                if quota_s and period_s:
                    quota = int(quota_s)
                    return quota / int(period_s) if quota > 0 else None
    return None


# --- the checks --------------------------------------------------------------------------------


def check_numa(view: SystemView, host: Host) -> list[Check]:
    nodes = host.numa_nodes
    if nodes <= 1:
        return [Check("numa", OK, "one NUMA node: nothing to interleave", facts={"nodes": nodes})]
    checks = []
    facts = {"nodes": nodes, "numactl": host.numactl}
    if host.numactl is None:
        checks.append(
            Check(
                "numa",
                FINDING,
                f"{nodes} NUMA nodes and no numactl: runs will not interleave, so llama.cpp's "
                "memory stays on the node that first touched it",
                cost=f"{USER_NUMA_COST:+.0%} generation with memory bound to one NUMA node "
                "(the user's EPYC 9655)",
                cost_source=COST_USER,
                fix=(
                    "sudo apt-get install numactl   # or: sudo dnf install numactl",
                    "sync; echo 3 | sudo tee /proc/sys/vm/drop_caches   # re-place cached "
                    "model pages before the first interleaved run",
                ),
                facts=facts,
            )
        )
    else:
        checks.append(
            Check(
                "numa",
                OK,
                f"{nodes} NUMA nodes: specreg runs llama.cpp under "
                f"`{host.numactl} --interleave=all`",
                facts=facts,
            )
        )
    balancing = view.proc_text("sys/kernel/numa_balancing")
    if balancing is not None and balancing != "0":
        checks.append(
            Check(
                "numa-balancing",
                FINDING,
                "automatic NUMA balancing is on: the kernel migrates llama.cpp's pages and "
                "threads while it runs (llama.cpp warns that this 'has been observed to impair "
                "performance')",
                cost="unmeasured by the user; page migrations stall generation while they run",
                cost_source=COST_ESTIMATE,
                fix=(
                    "sudo sysctl -w kernel.numa_balancing=0",
                    "echo kernel.numa_balancing=0 | sudo tee /etc/sysctl.d/90-llama.conf   "
                    "# keep it after a reboot",
                ),
                facts={"numa_balancing": balancing},
            )
        )
    return checks


def check_smt(view: SystemView, host: Host) -> Check:
    active = view.sys_text("devices/system/cpu/smt/active")
    control = view.sys_text("devices/system/cpu/smt/control")
    on = active == "1" or (active is None and host.logical_cpus > host.physical_cores)
    facts = {
        "smt_active": active,
        "smt_control": control,
        "logical_cpus": host.logical_cpus,
        "physical_cores": host.physical_cores,
    }
    if not on:
        return Check(
            "smt",
            OK,
            f"SMT off: {host.logical_cpus} CPUs are {host.physical_cores} physical cores",
            facts=facts,
        )
    return Check(
        "smt",
        FINDING,
        f"SMT is on: {host.logical_cpus} logical CPUs on {host.physical_cores} cores. specreg "
        f"runs llama.cpp with {host.threads} threads (one per core), but the scheduler may still "
        "put two of them on one core, and any -t above that lands on siblings",
        cost=f"{USER_SMT_COST:+.0%} generation with llama.cpp threads on SMT siblings "
        "(the user's EPYC 9655)",
        cost_source=COST_USER,
        fix=(
            "echo off | sudo tee /sys/devices/system/cpu/smt/control",
            "# to keep it: add `nosmt` to the kernel command line, or disable SMT in the BIOS; "
            f"with SMT kept, pass -t {host.threads} to llama.cpp",
        ),
        facts=facts,
    )


def check_threads(view: SystemView, host: Host) -> Check:
    status = view.proc_text("self/status") or ""
    m = re.search(r"^Cpus_allowed_list:\s*(\S+)", status, re.M)
    allowed = len(parse_cpu_list(m.group(1))) if m else host.logical_cpus
    quota = _cgroup_cpus(view)
    usable = min(float(allowed), quota) if quota is not None else float(allowed)
    facts = {
        "threads": host.threads,
        "allowed_cpus": allowed,
        "cgroup_cpus": quota,
        "physical_cores": host.physical_cores,
    }
    if host.threads <= usable:
        return Check(
            "threads",
            OK,
            f"{host.threads} llama.cpp threads (one per physical core), all on usable CPUs",
            facts=facts,
        )
    limit = max(1, int(usable))
    why = "the CPU affinity" if allowed < (quota or allowed + 1) else "the cgroup CPU quota"
    return Check(
        "threads",
        FINDING,
        f"llama.cpp would run {host.threads} threads (one per physical core) but {why} allows "
        f"{usable:g} CPUs",
        cost="threads wait for each other at every layer: generation slows by more than "
        f"{host.threads}/{limit} when the extra threads queue",
        cost_source=COST_ESTIMATE,
        fix=(
            f"specreg run TARGET --threads {limit}   # and -t {limit} for llama.cpp you launch",
            "# or give this container/process more CPUs (docker --cpus, taskset, cgroup cpu.max)",
        ),
        facts=facts,
    )


def check_thp(view: SystemView, bandwidth: Bandwidth | None) -> list[Check]:
    base = "kernel/mm/transparent_hugepage"
    enabled = bracketed(view.sys_text(f"{base}/enabled"))
    defrag = bracketed(view.sys_text(f"{base}/defrag"))
    facts: dict[str, Any] = {"enabled": enabled, "defrag": defrag}
    if enabled is None:
        return [Check("thp", UNKNOWN, "no transparent huge page interface", facts=facts)]
    fix = (
        f"echo always | sudo tee /sys/{base}/enabled",
        "# to keep it: add transparent_hugepage=always to the kernel command line",
    )
    checks = []
    gain = bandwidth.huge_gain if bandwidth is not None else None
    clear = bandwidth is not None and bandwidth.huge_gain_clear
    facts["measured_gain"] = gain
    if gain is not None and bandwidth is not None:
        facts["measured_gain_quartiles"] = [bandwidth.huge_gain_lo, bandwidth.huge_gain_hi]
    if enabled == "always":
        checks.append(Check("thp", OK, "transparent huge pages: always", facts=facts))
    elif (
        enabled == "madvise" and gain is not None and not (clear and gain >= HUGEPAGE_GAIN_FINDING)
    ):
        checks.append(
            Check(
                "thp",
                INFO,
                "transparent huge pages only on request (madvise), which llama.cpp never makes; "
                f"huge pages measured {gain:+.1%} on streaming reads here, not a clear gain",
                fix=fix,
                facts=facts,
            )
        )
    else:
        what = (
            "transparent huge pages only on request (madvise), and llama.cpp never asks: its "
            "buffers (KV cache, repacked weights) stay on 4 KiB pages"
            if enabled == "madvise"
            else "transparent huge pages are off (never): llama.cpp's buffers (KV cache, "
            "repacked weights) stay on 4 KiB pages"
        )
        if gain is not None:
            cost = (
                f"{-gain / (1 + gain):+.1%} streaming-read bandwidth against huge pages "
                "(median of paired passes)"
            )
            source = COST_HERE
        else:
            cost = "more TLB misses on every pass over the weights (a few % of generation)"
            source = COST_ESTIMATE
        checks.append(Check("thp", FINDING, what, cost, source, fix, facts))
    if enabled != "never" and defrag == "never":
        checks.append(
            Check(
                "thp-defrag",
                FINDING,
                "THP defrag is `never`: huge pages only when free ones happen to exist, which "
                "after some uptime is rarely",
                cost="huge pages silently missing on a long-running host",
                cost_source=COST_ESTIMATE,
                fix=(f"echo defer+madvise | sudo tee /sys/{base}/defrag",),
                facts=facts,
            )
        )
    return checks


def check_governor(view: SystemView) -> Check:
    cpus = sorted(
        view.sys_root.glob("devices/system/cpu/cpu[0-9]*/cpufreq"),
        key=lambda p: int(p.parent.name[3:]),
    )
    governors: dict[str, int] = {}
    for path in cpus:
        gov = view.read(path, "scaling_governor")
        if gov:
            governors[gov] = governors.get(gov, 0) + 1
    if not governors:
        return Check(
            "governor",
            INFO,
            "no CPU frequency interface (a virtual machine or a fixed clock): the host decides",
        )
    first = cpus[0]
    driver = view.read(first, "scaling_driver")
    epp = view.read(first, "energy_performance_preference")
    facts: dict[str, Any] = {"governors": governors, "driver": driver, "epp": epp}
    slow = {g: n for g, n in governors.items() if g in SLOW_GOVERNORS}
    fix = (
        "sudo cpupower frequency-set -g performance",
        "# without cpupower: echo performance | sudo tee "
        "/sys/devices/system/cpu/cpu*/cpufreq/scaling_governor",
    )
    if not slow:
        return Check("governor", OK, f"CPU governor: {_counts(governors)}", facts=facts)
    if driver in PSTATE_DRIVERS:
        cost = (
            f"the CPU picks its clock by energy preference ({epp or 'unknown'}): a few % "
            "of generation, more of prompt processing"
        )
    else:
        lo = _khz(view.read(first, "scaling_min_freq"))
        hi = _khz(view.read(first, "cpuinfo_max_freq"))
        facts.update(min_khz=lo, max_khz=hi)
        if lo and hi and "powersave" in slow:
            cost = (
                f"the clock is held at its minimum, {lo / 1e3:.0f} of {hi / 1e3:.0f} MHz: up to "
                f"{lo / hi - 1:+.0%} on compute-bound work (prompt processing, batched "
                "verification on a small host)"
            )
        else:
            cost = "the clock rises slowly under load: compute-bound work runs below full speed"
    return Check(
        "governor",
        FINDING,
        f"CPU governor {_counts(slow)} (driver {driver or 'unknown'})",
        cost=cost,
        cost_source=COST_ESTIMATE,
        fix=fix,
        facts=facts,
    )


def _khz(text: str | None) -> int | None:
    return int(text) if text and text.isdigit() else None


def _counts(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{g} on {n} CPU{'s' if n > 1 else ''}" for g, n in sorted(counts.items()))


def check_openmp(view: SystemView, host: Host, build: BuildFacts | None) -> list[Check]:
    env = view.env
    openmp = build.features.get("OPENMP") if build is not None else None
    checks = []
    limit = env.get("OMP_THREAD_LIMIT")
    if limit and limit.isdigit() and int(limit) < host.threads:
        checks.append(
            Check(
                "omp-thread-limit",
                FINDING,
                f"OMP_THREAD_LIMIT={limit} caps llama.cpp's OpenMP pool below its "
                f"{host.threads} threads",
                cost=f"{int(limit) / host.threads - 1:+.0%} of the cores idle during every "
                "token (compute-bound work scales with them)",
                cost_source=COST_ESTIMATE,
                fix=("unset OMP_THREAD_LIMIT",),
                facts={"OMP_THREAD_LIMIT": limit, "openmp_build": openmp},
            )
        )
    passive = env.get("OMP_WAIT_POLICY", "").lower() == "passive" or env.get("GOMP_SPINCOUNT") in (
        "0",
    )
    if passive:
        checks.append(
            Check(
                "omp-wait-policy",
                FINDING,
                "OpenMP threads sleep between the graph's operations (OMP_WAIT_POLICY=passive or "
                "GOMP_SPINCOUNT=0) instead of spinning",
                cost="a wake-up per operation, hundreds per token: noticeable on small models",
                cost_source=COST_ESTIMATE,
                fix=("unset OMP_WAIT_POLICY GOMP_SPINCOUNT",),
                facts={k: env.get(k) for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")},
            )
        )
    if env.get("OMP_DYNAMIC", "").lower() in ("true", "1"):
        checks.append(
            Check(
                "omp-dynamic",
                FINDING,
                "OMP_DYNAMIC=true lets the OpenMP runtime give llama.cpp fewer threads than asked",
                cost="fewer cores on compute-bound work, varying run to run",
                cost_source=COST_ESTIMATE,
                fix=("unset OMP_DYNAMIC",),
                facts={"OMP_DYNAMIC": env.get("OMP_DYNAMIC")},
            )
        )
    names = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS")
    given = {k: env[k] for k in names if k in env}
    checks.append(
        Check(
            "omp-threads",
            OK,
            "llama.cpp passes its thread count to OpenMP and BLAS itself, so "
            + (
                ", ".join(f"{k}={v}" for k, v in given.items())
                or "OMP_NUM_THREADS and BLAS thread variables"
            )
            + " do not change it; specreg starts llama.cpp with OMP_NUM_THREADS=1, as the "
            "reference host did"
            + ("" if openmp is None else f" (this build: OpenMP {'on' if openmp else 'off'})"),
            facts={**given, "openmp_build": openmp},
        )
    )
    return checks


def check_build(view: SystemView, build: BuildFacts | None) -> Check:
    if build is None:
        return Check(
            "cpu-features",
            UNKNOWN,
            "llama.cpp not found: its CPU features are unknown",
            fix=("specreg llama build",),
        )
    flags = read_cpuinfo(view.proc).flags
    built = build.features
    facts: dict[str, Any] = {
        "bin_dir": str(build.bin_dir),
        "native": build.native,
        "build": {k: built.get(k) for k, _ in CPU_FEATURES},
        "host": {k: flag in flags for k, flag in CPU_FEATURES},
    }
    if not built:
        return Check(
            "cpu-features",
            UNKNOWN,
            f"llama.cpp in {build.bin_dir} did not report its CPU features",
            facts=facts,
        )
    unused = [
        k
        for k, flag in CPU_FEATURES
        if flag in flags and built.get(k) is False and k not in build.turned_off
    ]
    missing = [k for k, flag in CPU_FEATURES if built.get(k) and flags and flag not in flags]
    native = {True: "native", False: "not native", None: "native unknown"}[build.native]
    have = [k for k, _ in CPU_FEATURES if built.get(k)]
    if missing:
        return Check(
            "cpu-features",
            FINDING,
            f"the llama.cpp build uses {', '.join(missing)}, which this CPU lacks: it will stop "
            "with an illegal instruction",
            cost="llama.cpp does not run",
            cost_source=COST_ESTIMATE,
            fix=("specreg llama build   # compiles for this CPU (GGML_NATIVE=ON)",),
            facts=facts,
        )
    if unused:
        return Check(
            "cpu-features",
            FINDING,
            f"the llama.cpp build ({native}) leaves out {', '.join(unused)}, which this CPU has",
            cost="prompt processing and batched verification (compute-bound on small hosts) run "
            "on narrower vectors; plain generation, memory-bound, suffers less",
            cost_source=COST_ESTIMATE,
            fix=(
                "specreg llama build   # compiles for this CPU (GGML_NATIVE=ON)",
                "# your own build: cmake -B build -DGGML_NATIVE=ON && cmake --build build -j",
            ),
            facts=facts,
        )
    return Check(
        "cpu-features",
        OK,
        f"the llama.cpp build ({native}) uses every vector feature of this CPU it knows: "
        f"{', '.join(have) or 'none'}",
        facts=facts,
    )


def check_runs(build: BuildFacts | None) -> Check:
    """Whether the llama.cpp the user will run runs here at all: a build that dies by a signal
    on a tiny model dies on every model."""
    if build is None or build.runs is None:
        return Check("llama-runs", UNKNOWN, "llama.cpp was not tried on this host",
                     fix=("specreg llama build",))  # fmt: skip
    facts = {"bin_dir": str(build.bin_dir), "seconds": round(build.runs_seconds, 2)}
    if build.runs:
        return Check("llama-runs", OK, f"llama.cpp in {build.bin_dir}: {build.runs_summary}",
                     facts=facts)  # fmt: skip
    if build.died:
        return Check(
            "llama-runs",
            FINDING,
            f"llama.cpp in {build.bin_dir} dies on this host: {build.runs_summary}",
            cost="every model fails",
            cost_source=COST_HERE,
            fix=(
                "specreg llama build   # proves its build here and turns off what kills it",
                f"# your own build: cmake -B build {AMX_OFF_CMAKE} && cmake --build build -j",
            ),
            facts=facts,
        )
    return Check(
        "llama-runs",
        FINDING,
        f"llama.cpp in {build.bin_dir} cannot run a tiny model: {build.runs_summary}",
        cost="models may fail to load or run",
        cost_source=COST_HERE,
        fix=("specreg llama build",),
        facts=facts,
    )


def check_memory(view: SystemView, targets: Sequence[TargetSize] | None) -> Check:
    mem = read_meminfo(view.proc)
    total, available = mem.get("MemTotal", 0), mem.get("MemAvailable", mem.get("MemFree", 0))
    facts: dict[str, Any] = {"mem_total": total, "mem_available": available}
    if targets is None:
        return Check(
            "memory",
            UNKNOWN,
            f"{available / 1e9:.1f} of {total / 1e9:.1f} GB available; no registry to compare "
            "with its targets",
            fix=("specreg scan DIR   # then run doctor again",),
            facts=facts,
        )
    largest = sorted(targets, key=lambda t: -t.n_bytes)[:3]
    facts["largest_targets"] = [{"label": t.label, "n_bytes": t.n_bytes} for t in largest]
    if not largest:
        return Check(
            "memory",
            OK,
            f"{available / 1e9:.1f} GB available; no targets in the registry",
            facts=facts,
        )
    too_big = [t for t in largest if t.n_bytes > available]
    if not too_big:
        t = largest[0]
        return Check(
            "memory",
            OK,
            f"the largest target, {t.label} ({t.n_bytes / 1e9:.1f} GB), fits in the "
            f"{available / 1e9:.1f} GB available",
            facts=facts,
        )
    t = too_big[0]
    never = t.n_bytes > total
    return Check(
        "memory",
        FINDING,
        f"{t.label} ({t.n_bytes / 1e9:.1f} GB) "
        + (
            f"is larger than this host's {total / 1e9:.1f} GB of memory"
            if never
            else f"does not fit in the {available / 1e9:.1f} GB available"
        )
        + (f" (and {len(too_big) - 1} more)" if len(too_big) > 1 else ""),
        cost="the weights that do not fit are read from disk again for every token: generation "
        "falls to disk speed, often 10-100x slower",
        cost_source=COST_ESTIMATE,
        fix=(
            "ps -eo rss,pid,comm --sort=-rss | head   # what holds the memory"
            if not never
            else "specreg models --role target   # pick a smaller quant of it",
        ),
        facts=facts,
    )


def check_bandwidth(
    bandwidth: Bandwidth | None,
    memory: MemoryConfig | None,
    host: Host,
    targets: Sequence[TargetSize] | None,
) -> Check:
    if bandwidth is None:
        return Check("bandwidth", UNKNOWN, "memory bandwidth not measured (--no-bandwidth)")
    facts: dict[str, Any] = {
        "read_gbs": bandwidth.read_gbs,
        "read_median_gbs": bandwidth.read_median_gbs,
        "method": bandwidth.method_str,
    }
    peak = memory.peak_gbs if memory is not None else None
    facts["peak_gbs"] = peak
    largest = max(targets or (), key=lambda t: t.n_bytes, default=None)
    bound = (
        f"; decoding {largest.label} can reach at most "
        f"{bandwidth.read_gbs / (largest.n_bytes / 1e9):.1f} t/s"
        if largest is not None and largest.n_bytes > 0
        else ""
    )
    seen = f"{bandwidth.read_gbs:.1f} GB/s streaming reads ({bandwidth.threads} threads)"
    if memory is not None and memory.slowed:
        d = memory.slowed[0]
        assert d.speed_mts and d.configured_mts
        return Check(
            "bandwidth",
            FINDING,
            f"{seen}; {len(memory.slowed)} DIMM(s) run at {d.configured_mts} of their rated "
            f"{d.speed_mts} MT/s",
            cost=f"{d.configured_mts / d.speed_mts - 1:+.0%} peak bandwidth, and generation "
            "with it",
            cost_source=COST_ESTIMATE,
            fix=("# set the memory speed (or enable EXPO/XMP) in the BIOS, then run doctor again",),
            facts=facts,
        )
    if peak is None:
        return Check(
            "bandwidth",
            INFO,
            f"{seen}{bound}; the DIMMs' peak is unknown",
            fix=(
                "specreg doctor --memory 12xDDR5-5600   # your DIMM count, type and speed",
                "# or install dmidecode and run doctor as root",
            ),
            facts=facts,
        )
    share = bandwidth.read_gbs / peak
    facts["share_of_peak"] = share
    n_dimms = len(memory.dimms) if memory is not None else 0
    dimms = memory.description if memory is not None else ""
    text = f"{seen}: {share:.0%} of the {peak:.0f} GB/s peak of {dimms}{bound}"
    # Few cores cannot saturate many channels: a low share is only a finding with enough cores.
    if share < 0.5 and host.physical_cores >= 2 * n_dimms:
        return Check(
            "bandwidth",
            FINDING,
            text,
            cost=f"{share - 1:+.0%} against the DIMMs, and generation with it",
            cost_source=COST_HERE,
            fix=(
                "# check that every memory channel is populated and the BIOS NUMA-per-socket and "
                "interleave settings; `sudo dmidecode -t memory` lists the DIMMs",
            ),
            facts=facts,
        )
    return Check("bandwidth", OK if share >= 0.5 else INFO, text, facts=facts)


def check_load(view: SystemView, bandwidth: Bandwidth | None) -> Check:
    loadavg = (view.proc_text("loadavg") or "").split()
    load1 = float(loadavg[0]) if loadavg else None
    share = bandwidth.foreign_share if bandwidth is not None else None
    facts = {"loadavg_1m": load1, "foreign_share": share}
    busy = share is not None and bandwidth is not None and bandwidth.contended
    if busy:
        assert share is not None
        return Check(
            "load",
            INFO,
            f"other processes used {share:.0%} of the CPUs while doctor measured (load "
            f"{load1}): measurements on this host now are noisy; specreg measures disturbed "
            "samples again",
            facts=facts,
        )
    return Check("load", OK, f"load {load1}: quiet enough to measure", facts=facts)


# --- all of it ---------------------------------------------------------------------------------


def diagnose(
    view: SystemView | None = None,
    *,
    build: BuildFacts | None = None,
    targets: Sequence[TargetSize] | None = None,
    measure: Callable[[Host, bool], Bandwidth] | None = None,
    memory: MemoryConfig | None = None,
) -> DoctorReport:
    """Every check, in the order a user should fix them. `measure(host, compare_hugepages)`
    measures the bandwidth (None skips it); `memory` is the user's DIMM description, else
    dmidecode's when it can be read."""
    start = time.monotonic()
    view = view or SystemView()
    host = replace(detect_host(view.proc, view.sys_root), numactl=view.which("numactl"))
    if memory is None:
        text = view.dmidecode_text()
        memory = parse_dmidecode(text) if text else None
    thp = bracketed(view.sys_text("kernel/mm/transparent_hugepage/enabled"))
    bandwidth = measure(host, thp == "madvise") if measure is not None else None
    checks: list[Check] = []
    checks += check_numa(view, host)
    checks.append(check_smt(view, host))
    checks.append(check_threads(view, host))
    checks += check_thp(view, bandwidth)
    checks.append(check_governor(view))
    checks += check_openmp(view, host, build)
    checks.append(check_runs(build))
    checks.append(check_build(view, build))
    checks.append(check_memory(view, targets))
    checks.append(check_bandwidth(bandwidth, memory, host, targets))
    checks.append(check_load(view, bandwidth))
    return DoctorReport(
        host=host,
        checks=tuple(checks),
        seconds=time.monotonic() - start,
        bandwidth=bandwidth,
        memory_config=memory,
        build=build,
    )


def run_doctor(
    db_path: Path | None,
    *,
    build: BuildFacts | None = None,
    memory: MemoryConfig | None = None,
    measure_bandwidth: bool = True,
    view: SystemView | None = None,
) -> DoctorReport:
    """Doctor as the command runs it: the llama.cpp `build` (`build_facts`; None when there is
    none), the registry's targets (when a registry exists), the bandwidth measured and recorded
    for this host."""
    from specreg.errors import RegistryError
    from specreg.host import membw
    from specreg.host.facts import SOURCE_DOCTOR, Figure, store_figure
    from specreg.registry.calibration import BandwidthRecord, record_bandwidth
    from specreg.registry.db import opened
    from specreg.registry.queries import list_models

    view = view or SystemView()
    available = read_meminfo(view.proc).get("MemAvailable", 0)

    def measure(host: Host, compare_hugepages: bool) -> Bandwidth:
        return membw.measure_bandwidth(
            host.threads,
            compare_hugepages=compare_hugepages,
            sys_root=view.sys_root,
            mem_available=available,
        )

    targets: list[TargetSize] | None = None
    if db_path is not None and db_path.exists():
        try:
            with opened(db_path) as con:
                targets = [
                    TargetSize(m.name or Path(m.path).name, m.n_bytes)
                    for m in list_models(con, role="target")
                    if m.n_bytes and m.status == "present"
                ]
        except RegistryError as err:
            log.warning("doctor runs without the registry: %s", err)
    report = diagnose(
        view,
        build=build,
        targets=targets,
        measure=measure if measure_bandwidth else None,
        memory=memory,
    )
    bw = report.bandwidth
    now = datetime.now(timezone.utc)
    if bw is not None:  # this host's one figure, for recommend with or without this registry
        figure = Figure(bw.read_gbs, SOURCE_DOCTOR, now, bw.method_str)
        store_figure(report.host.fingerprint, figure)
    if bw is not None and db_path is not None and db_path.exists():
        peak = report.memory_config.peak_gbs if report.memory_config else None
        record = BandwidthRecord(
            host_fingerprint=report.host.fingerprint,
            measured_at=now,
            read_gbs=bw.read_gbs,
            method=bw.method_str,
            threads=bw.threads,
            buffer_mib=bw.buffer_mib,
            peak_gbs=peak,
            peak_source=report.memory_config.source if report.memory_config else None,
            foreign_share=bw.foreign_share,
        )
        try:
            with opened(db_path) as con:
                record_bandwidth(con, record)
        except RegistryError as err:
            log.warning("bandwidth not recorded: %s", err)
    return report
