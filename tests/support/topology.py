"""Fake /sys trees for the topology: the reference host (AMD EPYC 9655, 96 cores with SMT) as
NPS4 and NPS1, and this machine's 2-core shape (fixtures `nps4`, `nps1`, `small`: the root of
each tree, for host.topology.read_topology)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import pytest

from specreg.host.topology import format_cpu_list

EPYC_CORES = 96
EPYC_CPUS = range(2 * EPYC_CORES)


def fake_sys(root: Path, cores: Iterable[tuple[int, ...]], nodes: dict[int, str] | None) -> Path:
    """A /sys tree: each core's CPUs (SMT siblings) with their topology files, and the node
    folders with their cpulist (none: a machine without NUMA folders)."""
    for core_id, siblings in enumerate(cores):
        for cpu in siblings:
            topo = root / f"devices/system/cpu/cpu{cpu}/topology"
            topo.mkdir(parents=True)
            (topo / "thread_siblings_list").write_text(format_cpu_list(siblings) + "\n")
            (topo / "core_id").write_text(f"{core_id}\n")
            (topo / "physical_package_id").write_text("0\n")
    (root / "devices/system/cpu/cpufreq").mkdir(parents=True, exist_ok=True)  # not a CPU
    for node, cpulist in (nodes or {}).items():
        folder = root / f"devices/system/node/node{node}"
        folder.mkdir(parents=True)
        (folder / "cpulist").write_text(cpulist + "\n")
    return root


def epyc_cores() -> list[tuple[int, int]]:
    return [(cpu, cpu + EPYC_CORES) for cpu in range(EPYC_CORES)]


@pytest.fixture
def nps4(tmp_path: Path) -> Path:
    """EPYC 9655 in NPS4: node N holds cores 24N..24N+23 and their siblings 96 above."""
    nodes = {n: f"{24 * n}-{24 * n + 23},{96 + 24 * n}-{96 + 24 * n + 23}" for n in range(4)}
    return fake_sys(tmp_path / "nps4", epyc_cores(), nodes)


@pytest.fixture
def nps1(tmp_path: Path) -> Path:
    return fake_sys(tmp_path / "nps1", epyc_cores(), {0: "0-191"})


@pytest.fixture
def small(tmp_path: Path) -> Path:
    """This machine's shape: 2 cores, no SMT, one node."""
    return fake_sys(tmp_path / "sys", [(0,), (1,)], {0: "0-1"})
