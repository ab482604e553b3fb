"""This machine's cores and NUMA nodes as the kernel describes them in /sys, and the core sets
(placements) a llama.cpp process may be given: the whole machine, or disjoint splits of it.

Why placements and not just `-t`: on the reference host (EPYC 9655, NPS4) a half-machine core
set straddling two NUMA nodes with no memory policy ran at 10.8 t/s against 23.4 t/s for the
whole machine interleaved; threads on SMT siblings cost 13 % per stream; two processes on the
same cores fell from 76.5 to 9 t/s (the reference host owner's measurements). So a placement is
one thread per physical core, on the first logical CPU of each core, and on a host with several
nodes always carries a memory policy (interleave over its nodes). How a placement is launched
and checked is in host/placement.py.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

INTERLEAVE = "interleave"
FULL = "full"
_RANGE = re.compile(r"(\d+)(?:-(\d+))?")


def parse_cpu_list(text: str | None) -> list[int]:
    """A kernel CPU or node list such as `0-23,96-119` as sorted unique numbers; malformed
    parts are skipped (the kernel writes none, a hand-made file may)."""
    out: set[int] = set()
    for part in (text or "").replace(" ", "").strip().split(","):
        m = _RANGE.fullmatch(part)
        if m:
            out.update(range(int(m[1]), int(m[2] or m[1]) + 1))
    return sorted(out)


def format_cpu_list(cpus: Iterable[int]) -> str:
    """Numbers as a kernel list, runs collapsed: [0, 1, 2, 5] -> `0-2,5` (numactl reads it)."""
    parts: list[str] = []
    run: list[int] = []
    for cpu in sorted(set(cpus)):
        if run and cpu == run[-1] + 1:
            run.append(cpu)
            continue
        if run:
            parts.append(_run(run))
        run = [cpu]
    if run:
        parts.append(_run(run))
    return ",".join(parts)


def _run(run: list[int]) -> str:
    return str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}"


@dataclass(frozen=True)
class Core:
    """One physical core: its allowed logical CPUs (SMT siblings, lowest first), its node."""

    cpus: tuple[int, ...]
    node: int
    core_id: int
    package: int

    @property
    def first(self) -> int:
        """The CPU a placement runs this core's one thread on (never an SMT sibling)."""
        return self.cpus[0]


@dataclass(frozen=True)
class Topology:
    """The host's NUMA nodes (those holding CPUs) and the physical cores this process may use,
    in the order of their first CPU."""

    nodes: tuple[int, ...]
    cores: tuple[Core, ...]

    @property
    def multi_node(self) -> bool:
        """Several nodes: memory lands where it is first touched unless a policy says otherwise."""
        return len(self.nodes) > 1

    @property
    def core_nodes(self) -> tuple[int, ...]:
        """The nodes that hold at least one allowed core."""
        return tuple(sorted({core.node for core in self.cores}))

    @property
    def cpus(self) -> tuple[int, ...]:
        """Every allowed logical CPU, siblings included."""
        return tuple(sorted(cpu for core in self.cores for cpu in core.cpus))

    @property
    def summary(self) -> str:
        cpus = len(self.cpus)
        nodes = len(self.nodes)
        return f"{len(self.cores)} cores ({cpus} CPUs) on {nodes} NUMA node{'s' * (nodes != 1)}"

    def to_json(self) -> dict[str, object]:
        return {
            "nodes": list(self.nodes),
            "cores": len(self.cores),
            "cpus": format_cpu_list(self.cpus),
            "node_cores": {
                str(node): sum(core.node == node for core in self.cores) for node in self.nodes
            },
        }


def _read(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace").strip()
    except OSError:
        return None


def _int(text: str | None, default: int) -> int:
    try:
        return int(text) if text is not None else default
    except ValueError:
        return default


def read_topology(sys_root: Path = Path("/sys"), allowed: Iterable[int] | None = None) -> Topology:
    """Nodes from `node*/cpulist`, cores from each CPU's `topology/` (SMT siblings grouped by
    `thread_siblings_list`), under `sys_root`. `allowed`: the CPUs this process may use
    (default: its affinity); a core with no allowed CPU is left out, and a core keeps only its
    allowed CPUs. Without node folders the machine is one node 0 holding every CPU; an allowed
    CPU /sys does not describe is a core of its own."""
    if allowed is None:
        allowed = os.sched_getaffinity(0)
    allowed = set(allowed)
    node_of: dict[int, int] = {}
    nodes: list[int] = []
    for folder in (sys_root / "devices/system/node").glob("node[0-9]*"):
        cpus = parse_cpu_list(_read(folder / "cpulist"))
        if cpus:
            nodes.append(int(folder.name[4:]))
            node_of.update(dict.fromkeys(cpus, nodes[-1]))
    groups: dict[tuple[int, ...], Core] = {}
    described: set[int] = set()
    cpu_root = sys_root / "devices/system/cpu"
    for folder in cpu_root.glob("cpu[0-9]*"):
        topo = folder / "topology"
        if not folder.name[3:].isdigit() or not topo.is_dir():
            continue  # offline CPUs have no topology
        cpu = int(folder.name[3:])
        described.add(cpu)
        siblings = tuple(parse_cpu_list(_read(topo / "thread_siblings_list")) or [cpu])
        mine = tuple(c for c in siblings if c in allowed)
        if mine and siblings not in groups:
            groups[siblings] = Core(
                cpus=mine,
                node=node_of.get(mine[0], 0),
                core_id=_int(_read(topo / "core_id"), cpu),
                package=_int(_read(topo / "physical_package_id"), 0),
            )
    cores = list(groups.values())
    cores += [Core((cpu,), node_of.get(cpu, 0), cpu, 0) for cpu in allowed - described]
    cores.sort(key=lambda core: core.first)
    if not nodes:
        nodes = [0]
    return Topology(tuple(sorted(nodes)), tuple(cores))


@dataclass(frozen=True)
class Placement:
    """A core set for one llama.cpp process: one thread per physical core on the first CPU of
    each core; `policy` is `interleave` (over `nodes`) on a host with several NUMA nodes, so no
    page lands on a node by accident, and None on a one-node host."""

    name: str  # full, node1, nodes0-1, half0, ...
    cores: tuple[Core, ...]
    nodes: tuple[int, ...]
    policy: str | None

    @property
    def threads(self) -> int:
        """llama.cpp's -t: the physical cores of the set."""
        return len(self.cores)

    @property
    def cpus(self) -> tuple[int, ...]:
        """The CPUs its threads run on: the first logical CPU of each core."""
        return tuple(core.first for core in self.cores)

    @property
    def all_cpus(self) -> frozenset[int]:
        """Every logical CPU of its cores, SMT siblings included (what it occupies)."""
        return frozenset(cpu for core in self.cores for cpu in core.cpus)

    @property
    def cpu_list(self) -> str:
        return format_cpu_list(self.cpus)

    @property
    def node_list(self) -> str:
        return format_cpu_list(self.nodes)

    @property
    def label(self) -> str:
        """`node1: 24 threads on CPUs 24-47, interleave 1`."""
        memory = f", {self.policy} {self.node_list}" if self.policy else ""
        threads = f"{self.threads} thread{'s' * (self.threads != 1)}"
        cpus = f"CPU{'s' * (len(self.cpus) != 1)} {self.cpu_list}"
        return f"{self.name}: {threads} on {cpus}{memory}"

    def overlaps(self, other: Placement) -> bool:
        """Whether the two share a physical core (so they must never decode at once)."""
        return not self.all_cpus.isdisjoint(other.all_cpus)

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "threads": self.threads,
            "cpus": list(self.cpus),
            "nodes": list(self.nodes),
            "memory_policy": self.policy,
            "label": self.label,
        }


def placement(topology: Topology, name: str, cores: Iterable[Core]) -> Placement:
    """The placement of `cores` on this host, with the memory policy the host needs."""
    chosen = tuple(sorted(cores, key=lambda core: core.first))
    nodes = tuple(sorted({core.node for core in chosen}))
    return Placement(name, chosen, nodes, INTERLEAVE if topology.multi_node else None)


@dataclass(frozen=True)
class Layouts:
    """The whole machine, and the ways to split it into disjoint placements covering its
    cores (each split a tuple of placements)."""

    full: Placement
    splits: tuple[tuple[Placement, ...], ...]

    def to_json(self) -> dict[str, object]:
        return {
            "full": self.full.to_json(),
            "splits": [[p.to_json() for p in split] for split in self.splits],
        }


def split_layout(split: Sequence[Placement]) -> str:
    """The name of a split's layout, as `specreg capacity` records it: its placements' name
    without their numbers (`node` for node0, node1 ...; `nodes` for nodes0-1 ...; `half`)."""
    return split[0].name.rstrip("0123456789-")


def layouts(topology: Topology) -> Layouts:
    """`full` over all cores, and splits: with cores on several nodes, one placement per node
    and (on an even count of four or more) one per pair of adjacent nodes, so no placement
    straddles nodes by accident; with cores on one node, two halves in core order (none with
    a single core)."""
    full = placement(topology, FULL, topology.cores)
    nodes = topology.core_nodes
    on = {node: [c for c in topology.cores if c.node == node] for node in nodes}
    splits: list[tuple[Placement, ...]] = []
    if len(nodes) > 1:
        splits.append(tuple(placement(topology, f"node{n}", on[n]) for n in nodes))
        if len(nodes) >= 4 and len(nodes) % 2 == 0:
            pairs = zip(nodes[::2], nodes[1::2], strict=True)
            splits.append(
                tuple(placement(topology, f"nodes{a}-{b}", on[a] + on[b]) for a, b in pairs)
            )
    elif len(topology.cores) > 1:
        cut = (len(topology.cores) + 1) // 2
        halves = (topology.cores[:cut], topology.cores[cut:])
        splits.append(tuple(placement(topology, f"half{i}", h) for i, h in enumerate(halves)))
    return Layouts(full, tuple(splits))


def even_topology(physical_cores: int, numa_nodes: int = 1) -> Topology:
    """A topology stated rather than read (another host's facts: `--cores`, a facts file):
    `physical_cores` cores numbered from 0, no SMT siblings, spread evenly over the nodes."""
    nodes = max(1, numa_nodes)
    per = max(1, math.ceil(physical_cores / nodes))
    cores = tuple(Core((i,), min(i // per, nodes - 1), i, 0) for i in range(max(1, physical_cores)))
    return Topology(tuple(range(nodes)), cores)
