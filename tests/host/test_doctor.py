"""`specreg doctor` against fake /proc and /sys trees: every planted problem is reported with
what it costs and the command that fixes it; a healthy tree has no findings."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest

from specreg.host.doctor import (
    COST_ESTIMATE,
    COST_HERE,
    COST_USER,
    FINDING,
    INFO,
    OK,
    BuildFacts,
    DoctorReport,
    SystemView,
    TargetSize,
    diagnose,
)
from specreg.host.machine import Host
from specreg.host.membw import Bandwidth, parse_dmidecode, parse_memory_spec

GB = 10**9
ALL_FEATURES = (
    "CPU : SSE3 = 1 | AVX = 1 | AVX_VNNI = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | AVX512 = 1 | "
    "AVX512_VBMI = 1 | AVX512_VNNI = 1 | AVX512_BF16 = 1 | OPENMP = 1 | REPACK = 1 |"
)
HOST_FLAGS = "fpu sse2 avx f16c fma avx2 avx_vnni avx512f avx512vbmi avx512_vnni avx512_bf16"


def _write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def make_tree(
    root: Path,
    *,
    nodes: int = 2,
    cores: int = 4,
    smt: bool = True,
    thp: str = "never",
    defrag: str = "madvise",
    governor: str | None = "powersave",
    numa_balancing: str = "1",
    allowed: str | None = None,
    cgroup_v2_max: str | None = None,
    mem_total_gb: int = 64,
    mem_available_gb: int = 40,
) -> tuple[Path, Path]:
    """A fake machine: `cores` physical cores (x2 logical CPUs with SMT) over `nodes` NUMA
    nodes. Returns (proc, sys)."""
    proc, sys_root = root / "proc", root / "sys"
    logical = cores * (2 if smt else 1)
    blocks = []
    for cpu in range(logical):
        blocks.append(
            f"processor\t: {cpu}\nmodel name\t: Fake EPYC 9999\nphysical id\t: 0\n"
            f"siblings\t: {logical}\ncore id\t\t: {cpu % cores}\ncpu cores\t: {cores}\n"
            f"flags\t\t: {HOST_FLAGS}\n"
        )
    _write(proc, "cpuinfo", "\n".join(blocks) + "\n")
    _write(
        proc,
        "meminfo",
        f"MemTotal:       {mem_total_gb * GB // 1024} kB\n"
        f"MemFree:        {mem_available_gb * GB // 1024} kB\n"
        f"MemAvailable:   {mem_available_gb * GB // 1024} kB\n",
    )
    _write(proc, "sys/kernel/numa_balancing", numa_balancing + "\n")
    _write(
        proc, "self/status", f"Name:\tpython\nCpus_allowed_list:\t{allowed or f'0-{logical - 1}'}\n"
    )
    _write(proc, "self/cgroup", "0::/specreg.slice\n")
    _write(proc, "loadavg", "0.10 0.20 0.30 1/100 1234\n")
    if cgroup_v2_max is not None:
        _write(sys_root, "fs/cgroup/specreg.slice/cpu.max", cgroup_v2_max + "\n")
    per_node = max(1, cores // nodes)
    for n in range(nodes):
        _write(
            sys_root,
            f"devices/system/node/node{n}/cpulist",
            f"{n * per_node}-{(n + 1) * per_node - 1}\n",
        )
    _write(sys_root, "devices/system/cpu/smt/active", "1\n" if smt else "0\n")
    _write(sys_root, "devices/system/cpu/smt/control", "on\n" if smt else "off\n")
    modes = ["always", "madvise", "never"]
    _write(
        sys_root,
        "kernel/mm/transparent_hugepage/enabled",
        " ".join(f"[{m}]" if m == thp else m for m in modes) + "\n",
    )
    dmodes = ["always", "defer", "defer+madvise", "madvise", "never"]
    _write(
        sys_root,
        "kernel/mm/transparent_hugepage/defrag",
        " ".join(f"[{m}]" if m == defrag else m for m in dmodes) + "\n",
    )
    if governor is not None:
        for cpu in range(logical):
            base = f"devices/system/cpu/cpu{cpu}/cpufreq"
            _write(sys_root, f"{base}/scaling_governor", governor + "\n")
            _write(sys_root, f"{base}/scaling_driver", "acpi-cpufreq\n")
            _write(sys_root, f"{base}/scaling_min_freq", "1500000\n")
            _write(sys_root, f"{base}/cpuinfo_max_freq", "3700000\n")
    return proc, sys_root


def view_of(
    proc: Path,
    sys_root: Path,
    *,
    numactl: bool = False,
    env: Mapping[str, str] | None = None,
    dmidecode: str | None = None,
) -> SystemView:
    tools = {"numactl": "/usr/bin/numactl"} if numactl else {}
    return SystemView(
        proc=proc,
        sys_root=sys_root,
        env=dict(env or {}),
        which=tools.get,
        dmidecode=lambda: dmidecode,
    )


def build_facts(info: str = ALL_FEATURES) -> BuildFacts:
    return BuildFacts(Path("/opt/llama/bin"), "11434 (test)", info, native=True)


def fake_bandwidth(read: float = 400.0, gain: float | None = None) -> Bandwidth:
    return Bandwidth(
        read_gbs=read,
        read_median_gbs=read * 0.98,
        method="c-kernel",
        threads=4,
        buffer_mib=2048,
        reps=12,
        pinned=True,
        foreign_share=0.0,
        attempts=0,
        seconds=0.5,
        compiler="cc -O3",
        huge_gbs=None if gain is None else read * (1 + gain),
        huge_median_gbs=None if gain is None else read * 0.98 * (1 + gain),
        huge_gain=gain,
        huge_gain_lo=None if gain is None else gain - 0.01,
        huge_gain_hi=None if gain is None else gain + 0.01,
    )


def _measure(bw: Bandwidth):  # type: ignore[no-untyped-def]
    def measure(host: Host, compare: bool) -> Bandwidth:
        return bw

    return measure


@pytest.fixture
def sick(tmp_path: Path) -> DoctorReport:
    """Two NUMA nodes without numactl, balancing on, SMT on, THP never, powersave, a build
    without AVX-512, a target larger than the free memory."""
    proc, sys_root = make_tree(tmp_path)
    no_avx512 = ALL_FEATURES.replace("AVX512 = 1", "AVX512 = 0")
    return diagnose(
        view_of(proc, sys_root),
        build=build_facts(no_avx512),
        targets=[TargetSize("Llama-3-70B Q4_K_M", 42 * GB), TargetSize("small", 1 * GB)],
        measure=_measure(fake_bandwidth()),
    )


def test_every_planted_problem_is_a_finding_with_a_fix(sick: DoctorReport) -> None:
    findings = {c.name for c in sick.findings}
    assert findings == {
        "numa",
        "numa-balancing",
        "smt",
        "thp",
        "governor",
        "cpu-features",
        "memory",
    }
    for c in sick.findings:
        assert c.fix, c.name
        assert c.cost and c.cost_source, c.name
    assert not sick.ok


def test_user_measured_costs_are_quoted(sick: DoctorReport) -> None:
    smt = sick.check("smt")
    assert smt.cost_source == COST_USER
    assert (
        smt.cost == "-57% generation with llama.cpp threads on SMT siblings (the user's EPYC 9655)"
    )
    assert smt.fix[0] == "echo off | sudo tee /sys/devices/system/cpu/smt/control"
    numa = sick.check("numa")
    assert numa.cost_source == COST_USER
    assert numa.cost.startswith("-46% generation with memory bound to one NUMA node")
    assert numa.summary.startswith("2 NUMA nodes and no numactl: runs will not interleave")
    assert numa.fix[0].startswith("sudo apt-get install numactl")


def test_fix_commands_are_exact(sick: DoctorReport) -> None:
    assert sick.check("numa-balancing").fix[0] == "sudo sysctl -w kernel.numa_balancing=0"
    assert (
        sick.check("thp").fix[0]
        == "echo always | sudo tee /sys/kernel/mm/transparent_hugepage/enabled"
    )
    assert sick.check("governor").fix[0] == "sudo cpupower frequency-set -g performance"
    assert sick.check("cpu-features").fix[0].startswith("specreg llama build")


def test_costs_derive_from_the_hosts_own_numbers(sick: DoctorReport) -> None:
    gov = sick.check("governor")
    assert "1500 of 3700 MHz" in gov.cost
    assert "-59%" in gov.cost
    assert gov.cost_source == COST_ESTIMATE
    assert "AVX512" in sick.check("cpu-features").summary
    assert "Llama-3-70B Q4_K_M (42.0 GB) does not fit in the 40.0 GB available" in (
        sick.check("memory").summary
    )
    # THP never: no huge-page buffer to compare with, so the cost is an estimate
    assert sick.check("thp").cost_source == COST_ESTIMATE


def test_host_facts_come_from_the_fake_tree(sick: DoctorReport) -> None:
    assert sick.host.cpu_model == "Fake EPYC 9999"
    assert (sick.host.physical_cores, sick.host.logical_cpus, sick.host.numa_nodes) == (4, 8, 2)
    assert sick.host.threads == 4


def test_healthy_tree_has_no_findings(tmp_path: Path) -> None:
    proc, sys_root = make_tree(
        tmp_path, nodes=2, smt=False, thp="always", governor="performance", numa_balancing="0"
    )
    report = diagnose(
        view_of(proc, sys_root, numactl=True),
        build=build_facts(),
        targets=[TargetSize("t", 10 * GB)],
        measure=_measure(fake_bandwidth()),
        memory=parse_memory_spec("4xDDR5-4800"),
    )
    assert report.findings == ()
    assert report.check("numa").summary == (
        "2 NUMA nodes: specreg runs llama.cpp under `/usr/bin/numactl --interleave=all`"
    )
    bw = report.check("bandwidth")
    assert bw.status == OK
    assert "400.0 GB/s streaming reads (4 threads): 260% of the 154 GB/s peak" in bw.summary
    assert "can reach at most 40.0 t/s" in bw.summary


def test_thp_madvise_cost_is_measured_here(tmp_path: Path) -> None:
    proc, sys_root = make_tree(tmp_path, thp="madvise")
    clear = diagnose(view_of(proc, sys_root), measure=_measure(fake_bandwidth(gain=0.08)))
    thp = clear.check("thp")
    assert thp.status == FINDING and thp.cost_source == COST_HERE
    assert thp.cost.startswith("-7.4% streaming-read bandwidth against huge pages")
    noise = diagnose(view_of(proc, sys_root), measure=_measure(fake_bandwidth(gain=0.005)))
    assert noise.check("thp").status == INFO


def test_restricted_cpus_and_cgroup_quota(tmp_path: Path) -> None:
    proc, sys_root = make_tree(tmp_path / "a", smt=False, allowed="0-1")
    threads = diagnose(view_of(proc, sys_root)).check("threads")
    assert threads.status == FINDING
    assert threads.summary == (
        "llama.cpp would run 4 threads (one per physical core) but the CPU affinity allows 2 CPUs"
    )
    assert threads.fix[0].startswith("specreg run TARGET --threads 2")
    proc, sys_root = make_tree(tmp_path / "b", smt=False, cgroup_v2_max="150000 100000")
    quota = diagnose(view_of(proc, sys_root)).check("threads")
    assert quota.status == FINDING
    assert "the cgroup CPU quota allows 1.5 CPUs" in quota.summary


def test_openmp_environment(tmp_path: Path) -> None:
    proc, sys_root = make_tree(tmp_path, smt=False)
    env = {"OMP_THREAD_LIMIT": "2", "OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": "64"}
    report = diagnose(view_of(proc, sys_root, env=env), build=build_facts())
    assert report.check("omp-thread-limit").status == FINDING
    assert report.check("omp-thread-limit").fix == ("unset OMP_THREAD_LIMIT",)
    assert report.check("omp-wait-policy").status == FINDING
    # llama.cpp hands its own thread count to OpenMP: OMP_NUM_THREADS alone is no finding
    assert report.check("omp-threads").status == OK
    assert "OMP_NUM_THREADS=64" in report.check("omp-threads").summary


def test_build_using_features_the_cpu_lacks(tmp_path: Path) -> None:
    proc, sys_root = make_tree(tmp_path, smt=False)
    cpuinfo = (proc / "cpuinfo").read_text().replace(" avx512f", "").replace(" avx512_vnni", "")
    (proc / "cpuinfo").write_text(cpuinfo)
    check = diagnose(view_of(proc, sys_root), build=build_facts()).check("cpu-features")
    assert check.status == FINDING
    assert check.summary.startswith("the llama.cpp build uses AVX512, AVX512_VNNI, which this CPU")


DMIDECODE = """# dmidecode 3.4
Handle 0x0040, DMI type 17, 92 bytes
Memory Device
\tSize: 32 GB
\tLocator: DIMM_A1
\tType: DDR5
\tSpeed: 5600 MT/s
\tConfigured Memory Speed: 4800 MT/s
\tData Width: 64 bits

Handle 0x0041, DMI type 17, 92 bytes
Memory Device
\tSize: No Module Installed
\tLocator: DIMM_A2
\tType: Unknown

Handle 0x0042, DMI type 17, 92 bytes
Memory Device
\tSize: 32 GB
\tLocator: DIMM_B1
\tType: DDR5
\tSpeed: 5600 MT/s
\tConfigured Memory Speed: 4800 MT/s
\tData Width: 64 bits
"""


def test_dmidecode_dimms_and_a_slowed_speed(tmp_path: Path) -> None:
    config = parse_dmidecode(DMIDECODE)
    assert config is not None
    assert len(config.dimms) == 2
    assert config.peak_gbs == pytest.approx(2 * 4800 * 8 / 1000)
    assert config.description == "2x DDR5-4800"
    proc, sys_root = make_tree(tmp_path, smt=False)
    report = diagnose(
        view_of(proc, sys_root, dmidecode=DMIDECODE), measure=_measure(fake_bandwidth(60.0))
    )
    bw = report.check("bandwidth")
    assert bw.status == FINDING
    assert "2 DIMM(s) run at 4800 of their rated 5600 MT/s" in bw.summary
    assert bw.cost.startswith("-14% peak bandwidth")
    assert report.memory_config is not None and report.memory_config.source == "dmidecode"


def test_user_memory_spec_and_its_errors() -> None:
    config = parse_memory_spec("12xDDR5-5600")
    assert config.peak_gbs == pytest.approx(537.6)
    assert parse_memory_spec("8 x DDR4 3200").peak_gbs == pytest.approx(204.8)
    with pytest.raises(Exception, match="is not a memory description: give DIMMs x type-speed"):
        parse_memory_spec("lots")


def test_low_share_of_peak_needs_enough_cores(tmp_path: Path) -> None:
    proc, sys_root = make_tree(tmp_path, smt=False, cores=32, nodes=1)
    twelve = parse_memory_spec("12xDDR5-5600")
    slow = diagnose(view_of(proc, sys_root), measure=_measure(fake_bandwidth(150.0)), memory=twelve)
    assert slow.check("bandwidth").status == FINDING
    assert slow.check("bandwidth").cost_source == COST_HERE
    proc, sys_root = make_tree(tmp_path / "small", smt=False, cores=4, nodes=1)
    few = diagnose(view_of(proc, sys_root), measure=_measure(fake_bandwidth(150.0)), memory=twelve)
    assert few.check("bandwidth").status == INFO  # 4 cores cannot fill 12 channels


def test_json_document_is_versioned(sick: DoctorReport) -> None:
    doc = sick.to_json()
    assert list(doc)[:2] == ["version", "kind"]
    assert (doc["version"], doc["kind"]) == ("2", "doctor")
    assert doc["n_findings"] == 7 and doc["ok"] is False
    smt = next(c for c in doc["checks"] if c["name"] == "smt")
    assert set(smt) == {"name", "status", "summary", "cost", "cost_source", "fix", "facts"}
    assert doc["bandwidth"]["method_str"].startswith("C kernel (cc -O3)")
    assert doc["host"]["fingerprint"] == sick.host.fingerprint
