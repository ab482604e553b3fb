"""Cores, NUMA nodes and placements (issue 39): the topology read from fake /sys trees of the
reference host (AMD EPYC 9655, 96 cores with SMT, as NPS4 and NPS1) and of this machine's
2-core shape; the layouts, the launch, the pinning, the check after start and the warming."""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.request
from itertools import combinations
from pathlib import Path

import pytest

from specreg.host.placement import (
    Pinning,
    check_placement,
    cpu_mask,
    launch_flags,
    launch_prefix,
    parse_numa_maps,
    pinning,
    set_interleave,
    warm_page_cache,
)
from specreg.host.topology import (
    INTERLEAVE,
    Layouts,
    Placement,
    Topology,
    format_cpu_list,
    layouts,
    parse_cpu_list,
    read_topology,
    split_layout,
)
from specreg.llama.process import free_port
from specreg.samples.small_models import SmallModels

from support.topology import EPYC_CORES, EPYC_CPUS, fake_sys

NUMACTL = "/usr/bin/numactl"


def all_placements(lay: Layouts) -> list[Placement]:
    return [lay.full, *(p for split in lay.splits for p in split)]


def assert_sound(topology: Topology, lay: Layouts) -> None:
    """What every layout of every host keeps: splits are disjoint and cover the cores, threads
    are physical cores on their first CPUs, and nothing straddles nodes without a policy."""
    cores = set(topology.cores)
    assert set(lay.full.cores) == cores
    for split in lay.splits:
        assert len(split) >= 2
        for a, b in combinations(split, 2):
            assert not a.overlaps(b) and not b.overlaps(a)
        assert sum(len(p.cores) for p in split) == len(cores)
        assert {c for p in split for c in p.cores} == cores
    for p in all_placements(lay):
        assert p.threads == len(p.cores) == len(p.cpus)
        assert p.cpus == tuple(core.cpus[0] for core in p.cores)
        assert p.overlaps(lay.full)
        if len(p.nodes) > 1 or topology.multi_node:
            assert p.policy == INTERLEAVE
        assert p.nodes == tuple(sorted({core.node for core in p.cores}))


# --- CPU lists ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "cpus"),
    [
        ("0-23,96-119", [*range(24), *range(96, 120)]),
        ("0-1\n", [0, 1]),
        ("5", [5]),
        ("", []),
        (None, []),
        ("\n", []),
        (" 0-2 , 7", [0, 1, 2, 7]),
        ("3,1,1", [1, 3]),
        ("x,2", [2]),
        ("0-", []),
        ("4-2", []),
        ("1-2-3", []),
        ("0x3", []),
    ],
)
def test_parse_cpu_list(text: str | None, cpus: list[int]) -> None:
    assert parse_cpu_list(text) == cpus


def test_format_cpu_list_collapses_runs_and_parses_back() -> None:
    assert format_cpu_list([5, 0, 1, 2, 9, 10]) == "0-2,5,9-10"
    assert format_cpu_list([]) == ""
    cpus = [*range(24, 48), *range(120, 144)]
    assert format_cpu_list(cpus) == "24-47,120-143"
    assert parse_cpu_list(format_cpu_list(cpus)) == cpus


# --- the reference host ------------------------------------------------------------------------


def test_nps4_topology(nps4: Path) -> None:
    topo = read_topology(nps4, allowed=EPYC_CPUS)
    assert topo.nodes == (0, 1, 2, 3) and topo.multi_node
    assert len(topo.cores) == EPYC_CORES
    assert all(core.cpus == (k, k + 96) for k, core in enumerate(topo.cores))
    assert [core.node for core in topo.cores] == [k // 24 for k in range(EPYC_CORES)]
    assert topo.summary == "96 cores (192 CPUs) on 4 NUMA nodes"
    assert topo.to_json()["node_cores"] == {"0": 24, "1": 24, "2": 24, "3": 24}


def test_nps4_full_placement_uses_one_cpu_per_core(nps4: Path) -> None:
    full = layouts(read_topology(nps4, allowed=EPYC_CPUS)).full
    assert full.threads == 96
    assert full.cpus == tuple(range(96))  # never an SMT sibling 96-191
    assert full.nodes == (0, 1, 2, 3) and full.policy == INTERLEAVE
    assert full.label == "full: 96 threads on CPUs 0-95, interleave 0-3"
    assert full.to_json() == {
        "name": "full",
        "threads": 96,
        "cpus": list(range(96)),
        "nodes": [0, 1, 2, 3],
        "memory_policy": "interleave",
        "label": full.label,
    }


def test_nps4_splits_per_node_and_per_pair(nps4: Path) -> None:
    topo = read_topology(nps4, allowed=EPYC_CPUS)
    lay = layouts(topo)
    assert_sound(topo, lay)
    per_node, pairs = lay.splits
    assert [p.name for p in per_node] == ["node0", "node1", "node2", "node3"]
    assert [p.name for p in pairs] == ["nodes0-1", "nodes2-3"]
    assert all(p.threads == 24 and len(p.nodes) == 1 for p in per_node)
    assert per_node[1].cpus == tuple(range(24, 48)) and per_node[1].nodes == (1,)
    assert per_node[1].label == "node1: 24 threads on CPUs 24-47, interleave 1"
    assert all(p.threads == 48 for p in pairs)
    assert pairs[1].cpus == tuple(range(48, 96)) and pairs[1].nodes == (2, 3)
    assert per_node[0].overlaps(pairs[0]) and not per_node[2].overlaps(pairs[0])
    assert json.loads(json.dumps(lay.to_json()))["splits"][1][0]["name"] == "nodes0-1"
    assert [split_layout(s) for s in lay.splits] == ["node", "nodes"]  # as capacity records it


def test_nps1_full_and_halves(nps1: Path) -> None:
    topo = read_topology(nps1, allowed=EPYC_CPUS)
    assert topo.nodes == (0,) and not topo.multi_node
    lay = layouts(topo)
    assert_sound(topo, lay)
    assert lay.full.threads == 96 and lay.full.cpus == tuple(range(96))
    assert lay.full.policy is None
    (halves,) = lay.splits
    assert [(p.name, p.cpus) for p in halves] == [
        ("half0", tuple(range(48))),
        ("half1", tuple(range(48, 96))),
    ]
    assert all(p.threads == 48 and p.policy is None for p in halves)
    assert split_layout(halves) == "half"
    assert halves[1].label == "half1: 48 threads on CPUs 48-95"


def test_small_host_halves_and_one_core(small: Path) -> None:
    topo = read_topology(small, allowed={0, 1})
    lay = layouts(topo)
    assert_sound(topo, lay)
    assert lay.full.cpus == (0, 1) and lay.full.threads == 2
    assert [p.label for p in lay.splits[0]] == [
        "half0: 1 thread on CPU 0",
        "half1: 1 thread on CPU 1",
    ]
    one = layouts(read_topology(small, allowed={1}))
    assert one.full.cpus == (1,) and one.splits == ()


def test_no_node_folder_is_one_node_holding_every_cpu(tmp_path: Path) -> None:
    root = fake_sys(tmp_path / "sys", [(0, 2), (1, 3)], None)
    topo = read_topology(root, allowed=range(4))
    assert topo.nodes == (0,)
    assert [core.cpus for core in topo.cores] == [(0, 2), (1, 3)]
    assert {core.node for core in topo.cores} == {0}


def test_cpus_sys_does_not_describe_are_cores_of_their_own(tmp_path: Path) -> None:
    topo = read_topology(tmp_path / "empty", allowed={0, 1, 2})
    assert [core.cpus for core in topo.cores] == [(0,), (1,), (2,)]
    assert topo.nodes == (0,)


def test_allowed_removes_cores(nps4: Path) -> None:
    node1 = read_topology(nps4, allowed=parse_cpu_list("24-47,120-143"))
    assert len(node1.cores) == 24 and node1.core_nodes == (1,)
    assert node1.multi_node  # the host still has four nodes: memory needs a policy
    lay = layouts(node1)
    assert_sound(node1, lay)
    assert lay.full.cpus == tuple(range(24, 48)) and lay.full.nodes == (1,)
    assert lay.full.policy == INTERLEAVE
    assert [p.threads for p in lay.splits[0]] == [12, 12]
    # Half the cores of every node: 48 cores, 12 a node.
    half = read_topology(nps4, allowed=[c for c in EPYC_CPUS if c % 24 < 12])
    assert len(half.cores) == 48
    assert [p.threads for p in layouts(half).splits[0]] == [12, 12, 12, 12]
    # Only the SMT siblings allowed: the cores stay, run on the sibling they may use.
    siblings = read_topology(nps4, allowed=range(96, 192))
    assert len(siblings.cores) == 96
    assert layouts(siblings).full.cpus == tuple(range(96, 192))


def test_interleaved_splits_on_two_and_three_nodes(tmp_path: Path) -> None:
    cores = [(c,) for c in range(6)]
    two = read_topology(fake_sys(tmp_path / "two", cores, {0: "0-2", 1: "3-5"}), range(6))
    lay = layouts(two)
    assert_sound(two, lay)
    assert [[p.name for p in s] for s in lay.splits] == [["node0", "node1"]]  # pairs = full
    three = read_topology(
        fake_sys(tmp_path / "three", cores, {0: "0-1", 1: "2-3", 2: "4-5"}), range(6)
    )
    lay = layouts(three)
    assert_sound(three, lay)
    assert [[p.name for p in s] for s in lay.splits] == [["node0", "node1", "node2"]]


# --- the launch ---------------------------------------------------------------------------------


def test_launch_with_numactl(nps4: Path, nps1: Path) -> None:
    lay = layouts(read_topology(nps4, allowed=EPYC_CPUS))
    node1 = lay.splits[0][1]
    assert launch_prefix(node1, NUMACTL) == [NUMACTL, "--physcpubind=24-47", "--interleave=1"]
    assert launch_prefix(lay.full, NUMACTL) == [
        NUMACTL,
        "--physcpubind=0-95",
        "--interleave=0-3",
    ]
    assert launch_flags(node1, NUMACTL) == ["-t", "24", "-tb", "24"]
    assert launch_flags(lay.splits[1][0], NUMACTL) == ["-t", "48", "-tb", "48"]
    half1 = layouts(read_topology(nps1, allowed=EPYC_CPUS)).splits[0][1]
    assert launch_prefix(half1, NUMACTL) == [NUMACTL, "--physcpubind=48-95"]
    assert launch_flags(half1, NUMACTL) == ["-t", "48", "-tb", "48"]


def test_launch_without_numactl(nps4: Path) -> None:
    lay = layouts(read_topology(nps4, allowed=EPYC_CPUS))
    node1 = lay.splits[0][1]
    assert launch_prefix(node1, None) == []
    assert launch_flags(node1, None) == [
        "-t", "24", "-tb", "24", "-C", "ffffff000000", "--cpu-strict", "1"
    ]  # fmt: skip
    assert launch_flags(lay.full, None)[4:6] == ["-C", "f" * 24]
    assert cpu_mask([0, 1, 2, 3]) == "f" and cpu_mask([4]) == "10"
    assert int(cpu_mask(range(96, 192)), 16) == ((1 << 96) - 1) << 96


def test_pinning_without_numactl(nps4: Path, nps1: Path) -> None:
    lay = layouts(read_topology(nps4, allowed=EPYC_CPUS))
    pin = pinning(lay.splits[1][0], machine="x86_64")
    assert pin == Pinning(tuple(range(48)), (0, 1), "")
    elsewhere = pinning(lay.splits[1][0], machine="riscv64")
    assert elsewhere.problem == (
        "cannot interleave memory over nodes 0-1 on riscv64: set_mempolicy's syscall number "
        "is known for x86_64 and aarch64 only"
    )
    one_node = pinning(layouts(read_topology(nps1, allowed=EPYC_CPUS)).full, machine="riscv64")
    assert one_node == Pinning(tuple(range(96)), (), "")


def test_set_interleave_elsewhere_changes_nothing() -> None:
    assert "known for x86_64 and aarch64 only" in set_interleave([0, 1], machine="mips")


@pytest.mark.skipif(os.uname().machine not in ("x86_64", "aarch64"), reason="set_mempolicy")
def test_pinning_applies_in_a_preexec_step() -> None:
    """A real child: pinned to CPU 0, its memory interleaved over node 0 (numa_maps shows it)."""
    pin = Pinning((0,), (0,))
    out = subprocess.run(
        ["sh", "-c", "grep Cpus_allowed_list /proc/self/status; head -1 /proc/self/numa_maps"],
        preexec_fn=pin.apply,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "Cpus_allowed_list:\t0\n" in out
    assert " interleave:0 " in out
    # A node that does not exist is a problem returned (the child exits 9 without one), not an
    # exception in the child, and the policy stays as it was.
    bad = subprocess.run(
        ["sh", "-c", "head -1 /proc/self/numa_maps"],
        preexec_fn=lambda: None if set_interleave([63]) else os._exit(9),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert " default " in bad


# --- the check after start ---------------------------------------------------------------------


def fake_proc(
    root: Path,
    pid: int,
    threads: dict[int, str],
    numa_maps: str | None = None,
) -> Path:
    """/proc/PID with each thread's Cpus_allowed_list, and numa_maps when given."""
    for tid, cpus in threads.items():
        task = root / str(pid) / "task" / str(tid)
        task.mkdir(parents=True)
        (task / "status").write_text(f"Name:\tllama-server\nCpus_allowed_list:\t{cpus}\n")
    (root / str(pid) / "status").write_text(
        f"Name:\tllama-server\nCpus_allowed_list:\t{threads[pid]}\n"
    )
    if numa_maps is not None:
        (root / str(pid) / "numa_maps").write_text(numa_maps)
    return root


MODEL = "/models/Qwen3.6-35B-A3B-Q8_0.gguf"


def numa_maps(policy: str, pages: dict[int, int], model: str = MODEL) -> str:
    nodes = " ".join(f"N{n}={c}" for n, c in pages.items())
    return (
        "55a2ba3ec000 default file=/usr/bin/llama-server mapped=2 N0=2 kernelpagesize_kB=4\n"
        f"7f0000000000 {policy} file={model} mapped={sum(pages.values())} mapcount=4 "
        f"{nodes} kernelpagesize_kB=4\n"
        "7f9000000000 default anon=900 dirty=900 N0=900 kernelpagesize_kB=4\n"
        "7ffd00000000 default stack anon=3 dirty=3 N1=3 kernelpagesize_kB=4\n"
    )


def test_check_placement_matches(tmp_path: Path, nps4: Path) -> None:
    node1 = layouts(read_topology(nps4, allowed=EPYC_CPUS)).splits[0][1]
    # llama.cpp pins each compute thread to one CPU; other threads keep the whole set.
    threads = {500: "24", 501: "24-47", **{502 + i: str(25 + i) for i in range(23)}}
    proc = fake_proc(tmp_path / "proc", 500, threads, numa_maps("interleave:1", {1: 5000}))
    got = check_placement(500, node1, proc)
    assert got.ok and got.problem == ""
    assert got.allowed == tuple(range(24, 48))
    assert got.policies == ("interleave:1",)
    assert got.node_pages == {1: 5000} and got.local_share == 1.0
    assert got.summary == "pid 500 runs on its placement node1, 100% of the model's pages local"
    assert got.to_json()["node_pages"] == {"1": 5000}


def test_check_placement_cpu_mismatch(tmp_path: Path, nps4: Path) -> None:
    node1 = layouts(read_topology(nps4, allowed=EPYC_CPUS)).splits[0][1]
    proc = fake_proc(tmp_path / "proc", 7, {7: "0-30,120"})
    got = check_placement(7, node1, proc)
    assert got.problem == (
        "pid 7 may run on CPUs 0-23,120 and may not run on CPUs 31-47 against its placement "
        "node1 (CPUs 24-47)"
    )
    assert got.node_pages == {} and got.local_share is None  # numa_maps unreadable
    gone = check_placement(8, node1, proc)
    assert gone.allowed is None
    assert gone.problem == f"pid 8 is gone (no {proc / '8' / 'status'})"


def test_check_placement_reads_the_model_pages(tmp_path: Path, nps4: Path) -> None:
    lay = layouts(read_topology(nps4, allowed=EPYC_CPUS))
    node1, full = lay.splits[0][1], lay.full
    # A replica pinned right on a page cache another process warmed: a quarter local.
    maps = numa_maps("interleave:1", {0: 250, 1: 250, 2: 250, 3: 250})
    proc = fake_proc(tmp_path / "a", 9, {9: "24-47"}, maps)
    got = check_placement(9, node1, proc)
    assert got.local_share == 0.25
    assert got.problem == "only 25% of its model's pages are on nodes 1"
    assert check_placement(9, node1, proc, min_local=0.25).ok
    # The full instance with no memory policy, all pages first touched on node 0.
    maps = numa_maps("default", {0: 1000})
    proc = fake_proc(tmp_path / "b", 9, {9: "0-95"}, maps)
    assert check_placement(9, full, proc).problem == (
        "its model's pages have memory policy default, not interleave:0-3; its model's pages "
        "are not interleaved evenly (N0=1000 N1=0 N2=0 N3=0)"
    )
    # Interleaved right.
    maps = numa_maps("interleave:0-3", {0: 251, 1: 250, 2: 249, 3: 250})
    proc = fake_proc(tmp_path / "c", 9, {9: "0-95"}, maps)
    assert check_placement(9, full, proc).ok
    # Only the named model counts.
    other = fake_proc(tmp_path / "d", 9, {9: "0-95"}, numa_maps("default", {0: 9}, "/x.gguf"))
    assert check_placement(9, full, other, models=[Path(MODEL)]).node_pages == {}


def test_parse_numa_maps_fields() -> None:
    text = (
        "7f00 interleave=static:0-3 file=/m/a b.gguf mapped=8 N0=2 N1=2 N2=2 N3=2 "
        "kernelpagesize_kB=4\n"
        "7f10 interleave:0-3 file=/m/c.gguf huge N2=5 kernelpagesize_kB=2048\n"
        "7f20 default file=/m/c.gguf.txt N0=7\n"
        "7f30 prefer (many):1-2 file=/m/c.gguf N1=1\n"
        "garbage\n"
    )
    policies, pages = parse_numa_maps(text)
    assert policies == ("interleave=static:0-3", "interleave:0-3", "prefer (many):1-2")
    assert pages == {0: 2, 1: 3, 2: 7, 3: 2}
    assert parse_numa_maps(text, [Path("/m/a b.gguf")])[1] == {0: 2, 1: 2, 2: 2, 3: 2}


# --- warming the page cache --------------------------------------------------------------------


def fake_numactl(tmp_path: Path, body: str = 'shift; exec "$@"') -> str:
    """numactl that records its arguments and runs the command after the first option."""
    path = tmp_path / "numactl"
    path.write_text(f'#!/bin/sh\necho "$@" > {tmp_path / "argv"}\n{body}\n')
    path.chmod(0o755)
    return str(path)


def test_warm_page_cache(tmp_path: Path) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"x" * 5000)
    assert warm_page_cache([model], [0], NUMACTL).skipped == "one NUMA node: nothing to interleave"
    numactl = fake_numactl(tmp_path)
    got = warm_page_cache([model], [3, 0, 1, 2], numactl, evict=True)
    assert got.problem == "" and got.bytes_read == 5000 and got.seconds >= 0
    assert (tmp_path / "argv").read_text().split() == ["--interleave=0-3", "cat", str(model)]
    assert got.summary.startswith("read 0.0 GB interleaved over nodes 0-3 in ")
    missing = warm_page_cache([tmp_path / "no.gguf"], [0, 1], numactl)
    assert missing.problem == f"cannot read {tmp_path / 'no.gguf'}: No such file or directory"
    slow = fake_numactl(tmp_path, "sleep 30")
    start = time.monotonic()
    stopped = warm_page_cache([model], [0, 1], slow, timeout_s=0.5)
    assert stopped.problem == "warming stopped after 0.5 s"
    assert time.monotonic() - start < 10
    failing = fake_numactl(tmp_path, "echo 'numactl: bad node' >&2; exit 1")
    assert warm_page_cache([model], [0, 1], failing).problem == "warming failed: numactl: bad node"


@pytest.mark.skipif(os.uname().machine not in ("x86_64", "aarch64"), reason="set_mempolicy")
def test_warm_without_numactl_needs_the_policy(tmp_path: Path) -> None:
    """Nodes this machine lacks: the reader cannot take the policy, so it reads nothing."""
    model = tmp_path / "m.gguf"
    model.write_bytes(b"x")
    got = warm_page_cache([model], [62, 63], None)
    assert got.problem == "cannot interleave the reader over nodes 62-63" and got.bytes_read == 0


# --- this machine ------------------------------------------------------------------------------


def test_this_machine() -> None:
    topo = read_topology()
    assert len(topo.cores) >= 1
    full = layouts(topo).full
    assert set(full.cpus) <= os.sched_getaffinity(0)
    assert full.threads == len(topo.cores)


@pytest.mark.llama
def test_real_server_runs_on_its_placement(
    llama_bin: Path, small_models: SmallModels, tmp_path: Path
) -> None:
    """llama-server started the no-numactl way (preexec pinning, `-C --cpu-strict`) on the
    last split of this machine runs there after a completion, by check_placement."""
    lay = layouts(read_topology())
    place = lay.splits[0][-1] if lay.splits else lay.full
    model = small_models.smollm2.path
    port = free_port()
    argv = [str(llama_bin / "llama-server"), "-m", str(model), "--port", str(port)]
    with open(tmp_path / "server.log", "wb") as log:
        server = subprocess.Popen(
            [*argv, *launch_flags(place, None)],
            stdout=log,
            stderr=log,
            preexec_fn=pinning(place).apply,
            start_new_session=True,
        )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"{url}/health", timeout=1)
                break
            except OSError:
                assert server.poll() is None and time.monotonic() < deadline
                time.sleep(0.2)
        body = json.dumps({"prompt": "Hello", "n_predict": 4}).encode()
        request = urllib.request.Request(
            f"{url}/completion", body, {"Content-Type": "application/json"}
        )
        urllib.request.urlopen(request, timeout=60).read()
        # Where the model's cached pages sit depends on who read it first: not checked here.
        got = check_placement(server.pid, place, models=[model], min_local=0.0)
        assert got.ok, got.problem
        assert got.allowed == place.cpus
        assert sum(got.node_pages.values()) > 0
    finally:
        server.terminate()
        server.wait(timeout=30)
