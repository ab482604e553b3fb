"""Memory bandwidth as llama.cpp's decoding sees it, and the DIMMs' theoretical peak.

Decoding one token streams the active weights from DRAM once, so the number that matters is the
aggregate streaming-read bandwidth of one thread per physical core. A numpy copy at one thread
reaches a fraction of it (on the 2-core development VM: 41 GB/s of read+write traffic against 75
GB/s of reads by two threads of the C kernel below), so the measurement is a small C kernel
compiled once with the system compiler (the one that built llama.cpp) into the cache:

* one thread per physical core, each pinned to its own core and touching its own buffer first
  (so on a NUMA host every node serves its own threads: the best case interleaving approaches);
* buffers of at least 8x the last-level cache in total, so no pass is served from cache;
* a warm-up pass, then the best of several barrier-synchronised passes (STREAM's "best rate"),
  of a vectorised 64-bit sum (read) and of `memcpy` (read + write, counted twice);
* the CPU time other processes used meanwhile is measured, and a disturbed run is repeated.

Without a compiler the same protocol runs with numpy threads (int32 max as the read pass); the
result says which method produced it.

The peak is channels x MT/s x 8 bytes, from `dmidecode -t memory` (one DIMM per channel
assumed) or the user's description such as `12xDDR5-5600`.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import resource
import shutil
import statistics
import subprocess
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from specreg.errors import UsageError
from specreg.home import cache_dir
from specreg.host.cpu import cpu_ticks_total
from specreg.host.topology import read_topology

log = logging.getLogger(__name__)

METHOD_C = "c-kernel"
METHOD_NUMPY = "numpy-threads"
MIN_TOTAL_MIB = 256
LLC_MULTIPLE = 8  # total buffer >= this many times the last-level cache
REPS = 12
COMPILE_TIMEOUT_S = 60.0
RUN_TIMEOUT_S = 120.0
# A run is disturbed when other processes used more than this share of all CPUs meanwhile.
CONTENDED_SHARE = 0.1

KERNEL_SOURCE = r"""
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

/* specreg memory bandwidth kernel.
   usage: membw THREADS MIB_PER_THREAD REPS PAGES [CPU ...]
   PAGES: 0 = the kernel's default pages, 1 = madvise(MADV_HUGEPAGE), 2 = both, passes alternating
   prints one line per timed pass: seconds bytes hugepages */

typedef struct { int id, cpu; size_t n; uint64_t *buf[2]; uint64_t sink; } worker_t;
static pthread_barrier_t bar;
static int reps, pages;
static double *t0s, *t1s;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static uint64_t *alloc(size_t n, int huge) {
    size_t bytes = n * sizeof(uint64_t);
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) { perror("mmap"); exit(3); }
#ifdef MADV_HUGEPAGE
    if (huge) madvise(p, bytes, MADV_HUGEPAGE);
#endif
    uint64_t *a = (uint64_t *)p;
    for (size_t i = 0; i < n; i++) a[i] = i;  /* first touch by this thread: its NUMA node */
    return a;
}

static uint64_t read_pass(const uint64_t *a, size_t n) {
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0, s4 = 0, s5 = 0, s6 = 0, s7 = 0;
    for (size_t i = 0; i + 8 <= n; i += 8) {
        s0 += a[i]; s1 += a[i + 1]; s2 += a[i + 2]; s3 += a[i + 3];
        s4 += a[i + 4]; s5 += a[i + 5]; s6 += a[i + 6]; s7 += a[i + 7];
    }
    return s0 + s1 + s2 + s3 + s4 + s5 + s6 + s7;
}

static int huge_of(int r) { return pages == 2 ? (r & 1) : pages; }

static void *run(void *arg) {
    worker_t *w = (worker_t *)arg;
    if (w->cpu >= 0) {
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(w->cpu, &set);
        pthread_setaffinity_np(pthread_self(), sizeof set, &set);
    }
    if (pages != 1) w->buf[0] = alloc(w->n, 0);
    if (pages != 0) w->buf[1] = alloc(w->n, 1);
    for (int r = -2; r < reps; r++) {  /* r = -2, -1: warm-up of each buffer */
        pthread_barrier_wait(&bar);
        if (w->id == 0 && r >= 0) t0s[r] = now();
        w->sink += read_pass(w->buf[huge_of(r + 2)], w->n);
        pthread_barrier_wait(&bar);
        if (w->id == 0 && r >= 0) t1s[r] = now();
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: membw THREADS MIB_PER_THREAD REPS PAGES [CPU ...]\n");
        return 2;
    }
    int threads = atoi(argv[1]);
    size_t mib = strtoull(argv[2], NULL, 10);
    reps = atoi(argv[3]);
    pages = atoi(argv[4]);
    if (threads < 1 || mib < 1 || reps < 1 || pages < 0 || pages > 2) return 2;
    worker_t *ws = calloc(threads, sizeof *ws);
    pthread_t *th = calloc(threads, sizeof *th);
    t0s = calloc(reps, sizeof(double));
    t1s = calloc(reps, sizeof(double));
    pthread_barrier_init(&bar, NULL, threads);
    for (int i = 0; i < threads; i++) {
        ws[i].id = i;
        ws[i].n = mib * 1048576 / sizeof(uint64_t);
        ws[i].cpu = argc > 5 + i ? atoi(argv[5 + i]) : -1;
        pthread_create(&th[i], NULL, run, &ws[i]);
    }
    uint64_t sink = 0;
    for (int i = 0; i < threads; i++) { pthread_join(th[i], NULL); sink += ws[i].sink; }
    double bytes = (double)mib * 1048576 * threads;
    for (int r = 0; r < reps; r++) printf("%.9f %.0f %d\n", t1s[r] - t0s[r], bytes, huge_of(r + 2));
    fprintf(stderr, "sink %llu\n", (unsigned long long)sink);
    return 0;
}
"""


@dataclass(frozen=True)
class Bandwidth:
    """Measured streaming-read bandwidth in GB/s (1e9 bytes/s), and how it was measured.

    `read_gbs` is with the pages llama.cpp gets under this host's THP setting; `huge_gbs` with
    transparent huge pages (measured in alternating passes when THP is `madvise`)."""

    read_gbs: float  # best pass
    read_median_gbs: float
    method: str  # c-kernel | numpy-threads
    threads: int
    buffer_mib: int  # total over all threads (per page kind)
    reps: int
    pinned: bool
    foreign_share: float | None  # share of all CPUs other processes used meanwhile
    attempts: int  # measured again this many times because of that load
    seconds: float
    compiler: str | None = None
    huge_gbs: float | None = None  # best pass on huge pages
    huge_median_gbs: float | None = None
    # Huge pages against 4 KiB pages, pass by pass (each huge-page pass against the 4 KiB pass
    # just before it): median and quartiles of the relative gain.
    huge_gain: float | None = None
    huge_gain_lo: float | None = None
    huge_gain_hi: float | None = None

    @property
    def contended(self) -> bool:
        return self.foreign_share is not None and self.foreign_share > CONTENDED_SHARE

    @property
    def huge_gain_clear(self) -> bool:
        """Huge pages were faster in at least three quarters of the paired passes."""
        return self.huge_gain_lo is not None and self.huge_gain_lo > 0

    @property
    def method_str(self) -> str:
        how = (
            f"C kernel ({self.compiler})"
            if self.method == METHOD_C
            else "numpy threads (int32 max; no C compiler found)"
        )
        pin = ", pinned one per physical core" if self.pinned else ""
        pages = ", alternating 4 KiB and huge-page buffers" if self.huge_gbs is not None else ""
        return (
            f"{how}: {self.threads} thread(s){pin}, {self.buffer_mib} MiB in total{pages}, "
            f"best of {self.reps} barrier-synchronised streaming-read passes"
        )


@dataclass(frozen=True)
class Dimm:
    locator: str
    size_bytes: int
    mem_type: str  # DDR4, DDR5, ...
    speed_mts: int | None  # rated
    configured_mts: int | None  # what it runs at
    data_width_bits: int = 64

    @property
    def running_mts(self) -> int | None:
        return self.configured_mts or self.speed_mts


@dataclass(frozen=True)
class MemoryConfig:
    """The populated DIMMs, from dmidecode or from the user's description."""

    dimms: tuple[Dimm, ...]
    source: str  # dmidecode | user

    @property
    def peak_gbs(self) -> float | None:
        """Theoretical peak: every DIMM on its own channel, 8 bytes per transfer."""
        rates = [d.running_mts * d.data_width_bits / 8 for d in self.dimms if d.running_mts]
        return sum(rates) / 1000 if rates else None

    @property
    def slowed(self) -> tuple[Dimm, ...]:
        """DIMMs configured below their rated speed."""
        return tuple(
            d
            for d in self.dimms
            if d.speed_mts and d.configured_mts and d.configured_mts < d.speed_mts
        )

    @property
    def description(self) -> str:
        kinds: dict[str, int] = {}
        for d in self.dimms:
            label = f"{d.mem_type}-{d.running_mts or '?'}"
            kinds[label] = kinds.get(label, 0) + 1
        return ", ".join(f"{n}x {label}" for label, n in sorted(kinds.items()))


_USER_MEMORY = re.compile(r"^\s*(\d+)\s*[x×*]\s*(L?P?DDR\d[A-Z]?)[\s-]*(\d{3,5})\s*$", re.I)


def parse_memory_spec(text: str) -> MemoryConfig:
    """The user's DIMM description, e.g. `12xDDR5-5600` (one DIMM per channel)."""
    m = _USER_MEMORY.match(text)
    if not m:
        raise UsageError(
            f"'{text}' is not a memory description: give DIMMs x type-speed, e.g. 12xDDR5-5600"
        )
    count, kind, speed = int(m.group(1)), m.group(2).upper(), int(m.group(3))
    dimm = Dimm("", 0, kind, speed, speed)
    return MemoryConfig(tuple(dimm for _ in range(count)), "user")


def _mts(value: str) -> int | None:
    m = re.match(r"(\d+)\s*(MT/s|MHz)", value)
    return int(m.group(1)) if m else None


def _size_bytes(value: str) -> int:
    m = re.match(r"(\d+)\s*([KMGT]B)", value)
    if not m:
        return 0
    return int(m.group(1)) * {"KB": 2**10, "MB": 2**20, "GB": 2**30, "TB": 2**40}[m.group(2)]


def parse_dmidecode(text: str) -> MemoryConfig | None:
    """Populated `Memory Device` entries of `dmidecode -t memory`; None when there are none."""
    dimms = []
    for block in re.split(r"\n(?=Handle )", text):
        if "Memory Device" not in block:
            continue
        fields: dict[str, str] = {}
        for line in block.splitlines():
            key, sep, value = line.strip().partition(":")
            if sep:
                fields.setdefault(key.strip(), value.strip())
        size = _size_bytes(fields.get("Size", ""))
        if not size:
            continue  # "No Module Installed"
        width = re.match(r"(\d+)", fields.get("Data Width", ""))
        dimms.append(
            Dimm(
                locator=fields.get("Locator", ""),
                size_bytes=size,
                mem_type=fields.get("Type", "unknown"),
                speed_mts=_mts(fields.get("Speed", "")),
                configured_mts=_mts(
                    fields.get("Configured Memory Speed", fields.get("Configured Clock Speed", ""))
                ),
                data_width_bits=int(width.group(1)) if width else 64,
            )
        )
    return MemoryConfig(tuple(dimms), "dmidecode") if dimms else None


def read_dmidecode(which: Callable[[str], str | None] = shutil.which) -> str | None:
    """`dmidecode -t memory` output, or None (not installed, not root, or it failed)."""
    exe = which("dmidecode")
    if exe is None:
        return None
    try:
        proc = subprocess.run(
            [exe, "-t", "memory"], capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout if proc.returncode == 0 else None


# --- the kernel --------------------------------------------------------------------------------


def _compiler() -> str | None:
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return name
    return None


def compile_kernel(cache: Path | None = None) -> tuple[Path, str] | None:
    """The compiled kernel (built once per source and compiler) and how it was compiled; None
    without a working C compiler."""
    cc = _compiler()
    if cc is None:
        return None
    digest = hashlib.sha256(f"{KERNEL_SOURCE}\0{shutil.which(cc)}".encode()).hexdigest()[:16]
    out_dir = (cache or cache_dir()) / "membw" / digest
    exe = out_dir / "membw"
    flags_file = out_dir / "flags"
    if exe.is_file() and flags_file.is_file():
        return exe, flags_file.read_text().strip()
    out_dir.mkdir(parents=True, exist_ok=True)
    src = out_dir / "membw.c"
    src.write_text(KERNEL_SOURCE)
    for flags in (["-O3", "-march=native"], ["-O3"]):
        tmp = out_dir / f"membw.{os.getpid()}.tmp"
        try:
            proc = subprocess.run(
                [cc, *flags, "-pthread", str(src), "-o", str(tmp)],
                capture_output=True,
                text=True,
                timeout=COMPILE_TIMEOUT_S,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as err:
            log.warning("cannot compile the bandwidth kernel with %s: %s", cc, err)
            return None
        if proc.returncode == 0:
            label = f"{cc} {' '.join(flags)}"
            flags_file.write_text(label)
            os.replace(tmp, exe)  # atomic: a concurrent doctor sees a whole binary or none
            return exe, label
        log.info("%s %s failed: %s", cc, " ".join(flags), proc.stderr.strip()[:200])
    return None


def _llc_bytes(sys_root: Path) -> int:
    """Total last-level cache: the largest cache level, summed over its distinct instances."""
    best_level, total = -1, 0
    seen: set[tuple[int, str]] = set()
    for index in sys_root.glob("devices/system/cpu/cpu[0-9]*/cache/index[0-9]*"):
        try:
            level = int((index / "level").read_text())
            size = _size_bytes((index / "size").read_text().strip() + "B")
            shared = (index / "shared_cpu_list").read_text().strip()
        except (OSError, ValueError):
            continue
        if level > best_level:
            best_level, total, seen = level, 0, set()
        if level == best_level and (level, shared) not in seen:
            seen.add((level, shared))
            total += size
    return total


def one_cpu_per_core(sys_root: Path = Path("/sys")) -> list[int]:
    """One logical CPU of each physical core this process may run on (SMT siblings skipped)."""
    if not hasattr(os, "sched_getaffinity"):
        return []
    return [core.first for core in read_topology(sys_root).cores]


def _foreign_share(
    total0: int | None, total1: int | None, child_s: float, own_s: float, wall: float
) -> float | None:
    if total0 is None or total1 is None or wall <= 0:
        return None
    hz = os.sysconf("SC_CLK_TCK")
    foreign = max(0.0, (total1 - total0) / hz - child_s - own_s)
    return foreign / (wall * (os.cpu_count() or 1))


@dataclass(frozen=True)
class _Passes:
    rates: tuple[float, ...]  # GB/s of each timed pass
    huge: tuple[bool, ...]  # whether that pass read the huge-page buffer
    foreign_share: float | None

    def of(self, huge: bool) -> list[float]:
        return [r for r, h in zip(self.rates, self.huge, strict=True) if h == huge]

    def paired_gains(self) -> list[float]:
        """Each huge-page pass against the 4 KiB pass just before it."""
        return [
            self.rates[i] / self.rates[i - 1] - 1.0
            for i in range(1, len(self.rates))
            if self.huge[i] and not self.huge[i - 1] and self.rates[i - 1] > 0
        ]


def _run_kernel(
    exe: Path, threads: int, mib: int, reps: int, pages: int, cpus: Sequence[int]
) -> _Passes:
    argv = [str(exe), str(threads), str(mib), str(reps), str(pages)]
    argv += [str(c) for c in cpus[:threads]]
    child0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    total0, own0, t0 = cpu_ticks_total(), sum(os.times()[:2]), time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False)
    wall = time.monotonic() - t0
    child1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    child = (child1.ru_utime + child1.ru_stime) - (child0.ru_utime + child0.ru_stime)
    share = _foreign_share(total0, cpu_ticks_total(), child, sum(os.times()[:2]) - own0, wall)
    if proc.returncode != 0:
        raise OSError(f"bandwidth kernel failed ({proc.returncode}): {proc.stderr.strip()[:200]}")
    rates, huge = [], []
    for line in proc.stdout.splitlines():
        seconds, nbytes, is_huge = line.split()
        if float(seconds) > 0:
            rates.append(float(nbytes) / float(seconds) / 1e9)
            huge.append(is_huge == "1")
    return _Passes(tuple(rates), tuple(huge), share)


def _numpy_passes(threads: int, mib: int, reps: int) -> _Passes:
    import numpy as np

    n = mib * 2**20 // 4
    arrays: list[np.ndarray] = [np.empty(0, dtype=np.int32)] * threads

    def touch(i: int) -> None:  # first touch in the thread that reads it (its NUMA node)
        arrays[i] = np.ones(n, dtype=np.int32)

    def work(i: int) -> None:
        arrays[i].max()  # a vectorised read; numpy releases the GIL for it

    rates = []
    total0, t0, own0 = cpu_ticks_total(), time.monotonic(), sum(os.times()[:2])
    with ThreadPoolExecutor(max_workers=threads) as pool:
        list(pool.map(touch, range(threads)))
        list(pool.map(work, range(threads)))
        for _ in range(reps):
            start = time.perf_counter()
            list(pool.map(work, range(threads)))
            rates.append(n * 4 * threads / (time.perf_counter() - start) / 1e9)
    wall = time.monotonic() - t0
    share = _foreign_share(total0, cpu_ticks_total(), 0.0, sum(os.times()[:2]) - own0, wall)
    return _Passes(tuple(rates), (False,) * len(rates), share)


def buffer_mib(threads: int, sys_root: Path = Path("/sys"), mem_available: int = 0) -> int:
    """MiB per thread: in total at least LLC_MULTIPLE x the last-level cache (and 512 MiB),
    at most an eighth of the available memory."""
    total = max(MIN_TOTAL_MIB, LLC_MULTIPLE * _llc_bytes(sys_root) // 2**20)
    if mem_available > 0:
        total = min(total, mem_available // 8 // 2**20)
    return max(16, -(-total // threads))


def measure_bandwidth(
    threads: int | None = None,
    *,
    reps: int = REPS,
    retries: int = 2,
    compare_hugepages: bool = False,
    sys_root: Path = Path("/sys"),
    mem_available: int = 0,
    cache: Path | None = None,
    use_compiler: bool = True,
    time_budget_s: float = 5.0,
) -> Bandwidth:
    """Streaming-read bandwidth of one thread per physical core (see the module docstring).

    A run disturbed by other processes is measured again up to `retries` times, while another
    attempt fits in `time_budget_s`, and the least disturbed is kept. `compare_hugepages`
    alternates passes over a 4 KiB-page and a huge-page buffer (meaningful when THP is
    `madvise`)."""
    start = time.monotonic()
    cpus = one_cpu_per_core(sys_root)
    threads = threads or max(1, len(cpus))
    per_thread = buffer_mib(threads, sys_root, mem_available)
    kernel = compile_kernel(cache) if use_compiler else None
    pinned = kernel is not None and len(cpus) >= threads
    huge = kernel is not None and compare_hugepages

    best: _Passes | None = None
    attempts = 0
    for attempt in range(retries + 1):
        began = time.monotonic()
        if kernel is not None:
            got = _run_kernel(
                kernel[0],
                threads,
                per_thread,
                reps * (2 if huge else 1),
                2 if huge else 0,
                cpus if pinned else (),
            )
        else:
            got = _numpy_passes(threads, per_thread, reps)
        if best is None or (got.foreign_share or 0.0) < (best.foreign_share or 0.0):
            best = got
        if got.foreign_share is None or got.foreign_share <= CONTENDED_SHARE:
            break
        took = time.monotonic() - began
        if attempt == retries or time.monotonic() - start + took > time_budget_s:
            break
        attempts += 1
    assert best is not None
    small = best.of(False)
    big = best.of(True)
    gains = best.paired_gains()
    quartiles = statistics.quantiles(gains, n=4) if len(gains) >= 2 else None
    return Bandwidth(
        read_gbs=max(small),
        read_median_gbs=statistics.median(small),
        method=METHOD_C if kernel is not None else METHOD_NUMPY,
        threads=threads,
        buffer_mib=per_thread * threads,
        reps=reps,
        pinned=pinned,
        foreign_share=best.foreign_share,
        attempts=attempts,
        seconds=time.monotonic() - start,
        compiler=kernel[1] if kernel is not None else None,
        huge_gbs=max(big) if big else None,
        huge_median_gbs=statistics.median(big) if big else None,
        huge_gain=statistics.median(gains) if gains else None,
        huge_gain_lo=quartiles[0] if quartiles else None,
        huge_gain_hi=quartiles[2] if quartiles else None,
    )
