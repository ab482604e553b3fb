"""A llama.cpp process on a placement (host/topology.py): how it is launched, how a child is
pinned from Python when numactl is missing, how the model's page cache is warmed interleaved
before any backend starts, and the check after start that it runs where it was placed.

With numactl the launch is `numactl --physcpubind=CPUS [--interleave=NODES] llama-server
-t N -tb N`; without it llama.cpp pins its own threads (`-C MASK --cpu-strict 1`) and the
caller pins the process in its preexec step (`Pinning.apply`: sched_setaffinity, and on a host
with several nodes set_mempolicy through ctypes). The check reads /proc/PID: the CPUs its
threads may use, and from numa_maps the memory policy and the nodes of the model file's pages
(a correctly pinned replica once read only 25 % of its pages locally: affinity is not enough).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import platform
import re
import signal
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from specreg.host.topology import INTERLEAVE, Placement, format_cpu_list, parse_cpu_list
from specreg.llamacpp import Flag

# linux/mempolicy.h
MPOL_INTERLEAVE = 3
# set_mempolicy's syscall number per architecture (platform.machine()); others are refused.
SET_MEMPOLICY = {"x86_64": 238, "aarch64": 237}
# Below this share of the model's pages on the placement's nodes the check reports it.
MIN_LOCAL_SHARE = 0.9
# A node of an interleaved placement holding less than this fraction of its even share of the
# model's pages: the pages were placed before the policy (a warm page cache), not by it.
MIN_EVEN_SHARE = 0.5
WARM_TIMEOUT_S = 600.0


# --- the launch --------------------------------------------------------------------------------


def launch_prefix(placement: Placement, numactl: str | None) -> list[str]:
    """`numactl --physcpubind=CPUS` (plus `--interleave=NODES` when the placement has that
    memory policy); nothing without numactl (then see `launch_flags` and `pinning`)."""
    if numactl is None:
        return []
    argv = [numactl, f"--physcpubind={placement.cpu_list}"]
    if placement.policy == INTERLEAVE:
        argv.append(f"--interleave={placement.node_list}")
    return argv


def cpu_mask(cpus: Iterable[int]) -> str:
    """llama.cpp's `-C` mask: hex, CPU 0 in the lowest bit (`0-3` -> `f`)."""
    return f"{sum(1 << cpu for cpu in set(cpus)):x}"


def launch_flags(placement: Placement, numactl: str | None) -> list[str]:
    """llama-server's threads for the placement: `-t N -tb N` (N = its physical cores); without
    numactl also `-C MASK --cpu-strict 1`, so llama.cpp pins one thread on each core's first
    CPU (the draft's and the batch threads follow these unless set)."""
    n = str(placement.threads)
    flags = [Flag.THREADS, n, Flag.THREADS_BATCH, n]
    if numactl is None:
        flags += [Flag.CPU_MASK, cpu_mask(placement.cpus), Flag.CPU_STRICT, "1"]
    return flags


# --- pinning a child from Python -----------------------------------------------------------------


def pin_cpus(cpus: Iterable[int]) -> str:
    """Pin the calling process (in a preexec step: the child) to `cpus`; the problem, or ""."""
    cpus = list(cpus)
    try:
        os.sched_setaffinity(0, cpus)
    except (OSError, ValueError) as err:
        return f"cannot pin to CPUs {format_cpu_list(cpus)}: {err}"
    return ""


def set_interleave(nodes: Iterable[int], machine: str | None = None) -> str:
    """Set the calling process's memory policy to MPOL_INTERLEAVE over `nodes`, as
    `numactl --interleave` does: the set_mempolicy syscall through ctypes. Its number is known
    for x86_64 (238) and aarch64 (237) only; on another architecture (`machine`, default
    platform.machine()) nothing is changed and the problem is returned. Preexec-safe: nothing
    raises, the problem is returned ("" when the policy is set)."""
    nodes = sorted(set(nodes))
    machine = machine or platform.machine()
    number = SET_MEMPOLICY.get(machine)
    if number is None:
        return (
            f"cannot interleave memory over nodes {format_cpu_list(nodes)} on {machine}: "
            f"set_mempolicy's syscall number is known for {' and '.join(SET_MEMPOLICY)} only"
        )
    if not nodes:
        return "cannot interleave memory over no nodes"
    bits = 8 * ctypes.sizeof(ctypes.c_ulong)
    mask = (ctypes.c_ulong * (nodes[-1] // bits + 1))()
    for node in nodes:
        mask[node // bits] |= 1 << (node % bits)
    try:
        libc = _libc()
        # maxnode is one more than the bits given: the kernel drops the last (as libnuma does).
        rc = libc.syscall(number, MPOL_INTERLEAVE, mask, ctypes.c_ulong(len(mask) * bits + 1))
    except (OSError, AttributeError) as err:
        return f"cannot call set_mempolicy: {err}"
    if rc != 0:
        return (
            f"set_mempolicy(interleave {format_cpu_list(nodes)}) failed: "
            f"{os.strerror(ctypes.get_errno())}"
        )
    return ""


@functools.cache
def _libc() -> ctypes.CDLL:
    """The C library, loaded once (`pinning` loads it in the parent, so a child's preexec step
    does not dlopen after fork)."""
    return ctypes.CDLL(None, use_errno=True)


@dataclass(frozen=True)
class Pinning:
    """A child pinned to a placement without numactl: its CPUs, and the nodes its memory is
    interleaved over (empty: the policy is left alone). Made in the parent (`pinning`), where
    `problem` says what cannot be done on this machine; applied in the child before exec."""

    cpus: tuple[int, ...]
    nodes: tuple[int, ...] = ()
    problem: str = ""

    def apply(self) -> str:
        """Pin the calling process (a preexec step); the problems, or "". A problem in a child
        is not seen by the parent: `check_placement` after start finds it."""
        problems = [pin_cpus(self.cpus)] if self.cpus else []
        if self.nodes:
            problems.append(self.problem or set_interleave(self.nodes))
        return "; ".join(p for p in problems if p)


def pinning(placement: Placement, machine: str | None = None) -> Pinning:
    """How to pin a child to `placement` from Python (when numactl is missing)."""
    nodes = placement.nodes if placement.policy == INTERLEAVE else ()
    machine = machine or platform.machine()
    problem = ""
    if nodes and machine not in SET_MEMPOLICY:
        problem = set_interleave(nodes, machine)  # returns before any syscall
    elif nodes:
        with contextlib.suppress(OSError):
            _libc()
    return Pinning(placement.cpus, nodes, problem)


# --- the check after start -----------------------------------------------------------------------


@dataclass(frozen=True)
class PlacementCheck:
    """Where a started process runs against its placement.

    allowed: the CPUs its threads may use (their union), None when /proc/PID is unreadable;
    policies: the memory policies numa_maps shows on the model file's mappings; node_pages:
    the model file's resident pages per node (empty when numa_maps is unreadable or nothing is
    mapped yet); problem: one line when something does not match, else ""."""

    pid: int
    placement: str
    cpus: tuple[int, ...]
    nodes: tuple[int, ...]
    allowed: tuple[int, ...] | None
    policies: tuple[str, ...] = ()
    node_pages: dict[int, int] = field(default_factory=dict)
    problem: str = ""

    @property
    def ok(self) -> bool:
        return not self.problem

    @property
    def local_share(self) -> float | None:
        """The share of the model's resident pages on the placement's nodes."""
        return _share(self.node_pages, self.nodes)

    @property
    def summary(self) -> str:
        share = self.local_share
        where = f", {share:.0%} of the model's pages local" if share is not None else ""
        return self.problem or f"pid {self.pid} runs on its placement {self.placement}{where}"

    def to_json(self) -> dict[str, object]:
        return {
            "pid": self.pid,
            "placement": self.placement,
            "cpus": list(self.cpus),
            "nodes": list(self.nodes),
            "allowed": None if self.allowed is None else list(self.allowed),
            "policies": list(self.policies),
            "node_pages": {str(node): pages for node, pages in sorted(self.node_pages.items())},
            "local_share": self.local_share,
            "problem": self.problem,
        }


def _share(pages: dict[int, int], nodes: tuple[int, ...]) -> float | None:
    total = sum(pages.values())
    return sum(pages.get(node, 0) for node in nodes) / total if total else None


def _allowed_cpus(pid_dir: Path) -> tuple[int, ...] | None:
    """The union of the CPUs its threads may use (llama.cpp pins each compute thread to one)."""
    statuses = sorted((pid_dir / "task").glob("*/status")) or [pid_dir / "status"]
    cpus: set[int] = set()
    seen = False
    for status in statuses:
        try:
            text = status.read_text(errors="replace")
        except OSError:
            continue  # a thread that ended meanwhile
        m = re.search(r"^Cpus_allowed_list:\s*(\S+)", text, re.M)
        if m:
            seen = True
            cpus.update(parse_cpu_list(m.group(1)))
    return tuple(sorted(cpus)) if seen else None


# `file=` runs to the next field: a key=value or one of numa_maps' bare words.
_FILE = re.compile(r" file=(.+?)(?= [A-Za-z_]\w*=| heap\b| stack\b| huge\b|$)")
_NODE = re.compile(r" N(\d+)=(\d+)")


def parse_numa_maps(
    text: str, models: Sequence[Path] = ()
) -> tuple[tuple[str, ...], dict[int, int]]:
    """The memory policies and the resident pages per node of the mappings of `models` (any
    `.gguf` file when none are named) in a /proc/PID/numa_maps text."""
    names = {str(p) for p in models} | {str(p.resolve()) for p in models}
    policies: list[str] = []
    pages: dict[int, int] = {}
    for line in text.splitlines():
        m = _FILE.search(line)
        if not m or not (m.group(1) in names if names else m.group(1).endswith(".gguf")):
            continue
        policy = line[line.find(" ") + 1 : m.start()]  # may hold a space: `prefer (many):1`
        if policy not in policies:
            policies.append(policy)
        for node, count in _NODE.findall(line):
            pages[int(node)] = pages.get(int(node), 0) + int(count)
    return tuple(policies), pages


def _interleaves(policy: str, nodes: tuple[int, ...]) -> bool:
    """`interleave:0-3` (or `interleave=static:0-3`) over exactly `nodes`."""
    mode, _, over = policy.partition(":")
    return mode.split("=")[0] == INTERLEAVE and tuple(parse_cpu_list(over)) == nodes


def check_placement(
    pid: int,
    placement: Placement,
    proc: Path = Path("/proc"),
    models: Sequence[Path] = (),
    min_local: float = MIN_LOCAL_SHARE,
) -> PlacementCheck:
    """Whether process `pid` runs on `placement`: its threads' allowed CPUs are the placement's
    CPUs, and where /proc/PID/numa_maps is readable, the model file's pages (`models`, else any
    `.gguf`) carry its memory policy, at least `min_local` of them sit on its nodes and, when it
    interleaves over several nodes, evenly. Node replicas sharing a page cache warmed over all
    nodes hold 1/nodes of it locally: pass the `min_local` such a layout expects."""
    pid_dir = proc / str(pid)
    allowed = _allowed_cpus(pid_dir)
    try:
        policies, pages = parse_numa_maps((pid_dir / "numa_maps").read_text(), models)
    except OSError:
        policies, pages = (), {}
    problems = [_cpu_problem(pid, placement, allowed, pid_dir)]
    problems += _memory_problems(placement, policies, pages, min_local)
    return PlacementCheck(
        pid,
        placement.name,
        placement.cpus,
        placement.nodes,
        allowed,
        policies,
        pages,
        "; ".join(p for p in problems if p),
    )


def _cpu_problem(
    pid: int, placement: Placement, allowed: tuple[int, ...] | None, pid_dir: Path
) -> str:
    if allowed is None:
        return f"pid {pid} is gone (no {pid_dir / 'status'})"
    extra = format_cpu_list(set(allowed) - set(placement.cpus))
    missing = format_cpu_list(set(placement.cpus) - set(allowed))
    if not extra and not missing:
        return ""
    what = [f"may run on CPUs {extra}"] if extra else []
    what += [f"may not run on CPUs {missing}"] if missing else []
    return (
        f"pid {pid} {' and '.join(what)} against its placement {placement.name} "
        f"(CPUs {placement.cpu_list})"
    )


def _memory_problems(
    placement: Placement, policies: tuple[str, ...], pages: dict[int, int], min_local: float
) -> list[str]:
    problems = []
    interleaved = placement.policy == INTERLEAVE
    wrong = [p for p in policies if not _interleaves(p, placement.nodes)] if interleaved else []
    if wrong:
        problems.append(
            f"its model's pages have memory policy {', '.join(wrong)}, not "
            f"interleave:{placement.node_list}"
        )
    share = _share(pages, placement.nodes)
    if share is None:
        return problems
    if share < min_local:
        problems.append(f"only {share:.0%} of its model's pages are on nodes {placement.node_list}")
    if interleaved and len(placement.nodes) > 1:
        on = [pages.get(node, 0) for node in placement.nodes]
        if min(on) < MIN_EVEN_SHARE * sum(on) / len(on):
            spread = " ".join(f"N{node}={n}" for node, n in zip(placement.nodes, on, strict=True))
            problems.append(f"its model's pages are not interleaved evenly ({spread})")
    return problems


# --- the page cache ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Warming:
    """The page cache warmed with an interleave policy: how long it took and how much it read;
    `skipped` says why nothing was read (one node), `problem` what went wrong."""

    seconds: float
    bytes_read: int
    nodes: tuple[int, ...]
    skipped: str = ""
    problem: str = ""

    @property
    def summary(self) -> str:
        if self.skipped or self.problem:
            return self.skipped or self.problem
        return (
            f"read {self.bytes_read / 1e9:.1f} GB interleaved over nodes "
            f"{format_cpu_list(self.nodes)} in {self.seconds:.1f} s"
        )

    def to_json(self) -> dict[str, object]:
        return {
            "seconds": self.seconds,
            "bytes_read": self.bytes_read,
            "nodes": list(self.nodes),
            "skipped": self.skipped,
            "problem": self.problem,
        }


def evict_page_cache(path: Path) -> None:
    """Drop `path`'s clean, unmapped pages from the page cache (POSIX_FADV_DONTNEED; no root
    needed), so the next read places them anew. Pages a running process maps stay."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def warm_page_cache(
    paths: Sequence[Path],
    nodes: Sequence[int],
    numactl: str | None,
    *,
    timeout_s: float = WARM_TIMEOUT_S,
    evict: bool = False,
) -> Warming:
    """Read `paths` once in a child whose memory policy interleaves over `nodes` (the host's,
    `Topology.nodes`), before any backend maps them: a page lives on the node that first
    touched it, and `numactl --interleave` has no effect on pages already cached. `evict`
    first drops the files' cached pages (`evict_page_cache`) so they are placed anew. Skipped on
    a one-node host; stopped after `timeout_s` (the reference host read 120 GiB in 27 s)."""
    nodes = tuple(sorted(set(nodes)))
    if len(nodes) <= 1:
        return Warming(0.0, 0, nodes, skipped="one NUMA node: nothing to interleave")
    files = [Path(p) for p in paths]
    start = time.monotonic()
    try:
        size = sum(p.stat().st_size for p in files)
        if evict:
            for p in files:
                evict_page_cache(p)
    except OSError as err:
        return Warming(0.0, 0, nodes, problem=f"cannot read {err.filename}: {err.strerror}")
    if numactl is not None:
        argv = [numactl, f"--interleave={format_cpu_list(nodes)}", "cat", *map(str, files)]
        preexec = None
    elif platform.machine() not in SET_MEMPOLICY:
        return Warming(0.0, 0, nodes, problem=set_interleave(nodes))  # says why, changes nothing
    else:
        argv, preexec = ["cat", *map(str, files)], _interleave_or_fail(nodes)
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
            preexec_fn=preexec,
        )
    except OSError as err:
        return Warming(0.0, 0, nodes, problem=f"cannot start {argv[0]}: {err.strerror}")
    except subprocess.SubprocessError:  # the preexec step raised: the child read nothing
        why = f"cannot interleave the reader over nodes {format_cpu_list(nodes)}"
        return Warming(0.0, 0, nodes, problem=why)
    try:
        _, stderr = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        took = time.monotonic() - start
        return Warming(took, 0, nodes, problem=f"warming stopped after {timeout_s:g} s")
    took = time.monotonic() - start
    if proc.returncode != 0:
        lines = stderr.decode(errors="replace").strip().splitlines() or [f"exit {proc.returncode}"]
        return Warming(took, 0, nodes, problem=f"warming failed: {lines[-1]}")
    return Warming(took, size, nodes)


def _interleave_or_fail(nodes: tuple[int, ...]) -> Callable[[], None]:
    """A preexec step that sets the interleave policy or stops the start (a read without it
    would place the pages wherever the reader runs)."""

    def step() -> None:
        problem = set_interleave(nodes)
        if problem:
            raise OSError(problem)

    return step
