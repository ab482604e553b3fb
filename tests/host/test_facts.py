"""Host facts in one place (issue 24) and one bandwidth figure per host (issue 25 point 5).

The speed model and the printed commands take their cores from the same `Host`; another host's
facts (`--host-facts FILE`, `--cores`, `--bandwidth`) give the answer that host would get; the
bandwidth recommend uses is the one `specreg doctor` measured here, shown with its source.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from specreg.cli.advice import command_lines, users_llama
from specreg.cli.main import cli
from specreg.host.facts import (
    SOURCE_DOCTOR,
    SOURCE_ESTIMATE,
    Figure,
    HostQuery,
    resolve_host,
    stored_figure,
)
from specreg.host.machine import (
    ENV_HOST_FACTS,
    detect_host,
    parse_cpuinfo,
    read_host_facts,
    read_meminfo,
)
from specreg.llama.install import LlamaInstall
from specreg.recommender.advisor import open_advisor
from specreg.registry.calibration import BandwidthRecord, record_bandwidth
from specreg.registry.db import opened

from support.cli import specreg

TARGET = "Qwen2.5 Coder 32B Instruct"  # the demo's, with its 0.5B draft
ASK = ("recommend", TARGET, "--task", "code", "--top", "5", "--json")


def fake_tree(root: Path, cores: int, *, model: str = "Fake EPYC 9655") -> tuple[Path, Path]:
    """A /proc and /sys of a host with `cores` physical cores, one thread each, one NUMA node,
    and this machine's memory (what fits in it is part of the answer too)."""
    proc, sys_root = root / "proc", root / "sys"
    proc.mkdir(parents=True)
    (sys_root / "devices/system/node/node0").mkdir(parents=True)
    blocks = [
        f"processor\t: {n}\nmodel name\t: {model}\nphysical id\t: 0\ncore id\t: {n}\n"
        f"flags\t\t: fpu avx2 avx512f\n"
        for n in range(cores)
    ]
    (proc / "cpuinfo").write_text("\n".join(blocks))
    total = read_meminfo()["MemTotal"] // 1024
    (proc / "meminfo").write_text(f"MemTotal:       {total} kB\nMemAvailable:   {total // 2} kB\n")
    return proc, sys_root


def run(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args), env=env)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout, result.stderr


def recommend_json(db: Path, *args: str) -> dict[str, Any]:
    code, out, err = run(*ASK, "--db", str(db), *args)
    assert code == 0, err + out
    doc: dict[str, Any] = json.loads(out)
    return doc


def answer(doc: dict[str, Any]) -> dict[str, Any]:
    """What a recommendation says, apart from where its host facts came from."""
    return {k: doc[k] for k in ("options", "roofline", "speculate", "advice", "n_options")} | {
        "roofline": {**doc["roofline"], "bandwidth_source": None}
    }


@pytest.fixture
def no_stated_facts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_HOST_FACTS, raising=False)


def test_cores_and_bandwidth_give_what_a_96_core_host_gets(
    scanned_db: Path, tmp_path: Path, no_stated_facts: None
) -> None:
    asked = recommend_json(scanned_db, "--bandwidth", "460", "--cores", "96")
    facts_file = tmp_path / "epyc.json"
    facts_file.write_text(json.dumps({"physical_cores": 96, "bandwidth_gbs": 460}))
    from_file = recommend_json(scanned_db, "--host-facts", str(facts_file))

    # The host whose /proc shows 96 cores, detected the way the runner detects this one.
    proc, sys_root = fake_tree(tmp_path / "epyc", 96)
    with opened(scanned_db) as con:
        host, facts = resolve_host(HostQuery(460.0), con, proc=proc, sys_root=sys_root)
        assert (host.physical_cores, facts.physical_cores, facts.cores_source) == (
            96,
            96,
            "detected",
        )
        rec = open_advisor(con, facts).recommend(con, TARGET, task="code")
    real = rec.to_json(command_lines(rec, host, users_llama(None), 5), 5)

    assert answer(asked) == answer(real) == answer(from_file)
    assert asked["host"]["physical_cores"] == 96 and asked["host"]["cores_source"] == "user"
    assert (asked["host"]["source"], from_file["host"]["source"]) == ("user", "stated")
    assert from_file["host"]["cores_source"] == "stated"
    assert all(" -t 96 " in o["command"] for o in asked["options"])
    assert asked["speculate"] is True and asked["options"][0]["method"] == "draft"

    # ... and SPECREG_HOST_FACTS stating the same reaches the speed model, not only `-t`
    code, out, err = run(
        *ASK, "--db", str(scanned_db),
        env={ENV_HOST_FACTS: '{"physical_cores": 96, "bandwidth_gbs": 460}'},
    )  # fmt: skip
    assert code == 0, err
    stated = json.loads(out)
    assert answer(stated) == answer(real)
    assert (stated["host"]["source"], stated["roofline"]["bandwidth_source"]) == ("stated",) * 2

    # The cores matter: this machine's 2 cores at the same bandwidth predict something else.
    two = recommend_json(scanned_db, "--bandwidth", "460", "--cores", "2")
    assert [o["tps"] for o in two["options"]] != [o["tps"] for o in asked["options"]]
    assert all(" -t 2 " in o["command"] for o in two["options"])


def test_recommend_uses_the_bandwidth_doctor_recorded_and_says_so(
    scanned_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_stated_facts: None
) -> None:
    monkeypatch.setenv("SPECREG_CACHE", str(tmp_path / "cache"))
    fp = detect_host().fingerprint
    measured_at = datetime(2026, 11, 24, 12, 0, tzinfo=timezone.utc)
    record = BandwidthRecord(fp, measured_at, 31.4, "C kernel (cc): 2 thread(s)", 2, 256)
    with opened(scanned_db) as con:
        record_bandwidth(con, record)

    doc = recommend_json(scanned_db)
    assert doc["host"]["bandwidth_gbs"] == 31.4
    assert doc["host"]["source"] == doc["roofline"]["bandwidth_source"] == SOURCE_DOCTOR
    assert "measured by specreg doctor on 2026-11-24 12:00 UTC" in doc["host"]["note"]
    code, out, _ = run(*ASK[:-1], "--db", str(scanned_db))
    assert code == 0
    assert "roofline: 31 GB/s (measured by doctor) / " in out
    assert "cores (detected), 31 GB/s (measured by doctor)" in out
    assert stored_figure(fp) is None  # nothing was measured


def test_doctor_then_recommend_on_this_host_one_figure(
    scanned_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_stated_facts: None
) -> None:
    """The real doctor measures; recommend uses exactly that figure, with or without the
    registry doctor recorded it in (the figure is kept per host)."""
    monkeypatch.setenv("SPECREG_CACHE", str(tmp_path / "cache"))
    r = subprocess.run(
        [sys.executable, "-m", "specreg", "doctor", "--json", "--db", str(scanned_db)],
        capture_output=True, text=True, timeout=180, env=dict(os.environ),
    )  # fmt: skip
    measured = json.loads(r.stdout)["bandwidth"]["read_gbs"]
    doc = recommend_json(scanned_db)
    assert (doc["host"]["bandwidth_gbs"], doc["host"]["source"]) == (measured, SOURCE_DOCTOR)
    _, facts = resolve_host(None, None)  # no registry: the figure kept for this host
    assert (facts.bandwidth_gbs, facts.source) == (measured, SOURCE_DOCTOR)


def test_without_doctor_one_estimate_is_measured_once_and_reused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_stated_facts: None
) -> None:
    monkeypatch.setenv("SPECREG_CACHE", str(tmp_path / "cache"))
    calls: list[float] = []

    def measure(host: Any) -> Figure:
        calls.append(20.0 + len(calls))  # a different figure each time it is measured
        return Figure(calls[-1], SOURCE_ESTIMATE, datetime.now(timezone.utc), "test")

    first = resolve_host(None, None, measure=measure)[1]
    again = resolve_host(None, None, measure=measure)[1]
    assert calls == [20.0]
    assert (first.bandwidth_gbs, first.source) == (again.bandwidth_gbs, again.source)
    assert first.source == SOURCE_ESTIMATE and "run specreg doctor" in first.note
    assert resolve_host(HostQuery(55.0), None, measure=measure)[1].source == "user"
    # another host's bandwidth is never measured here
    with pytest.raises(Exception, match="bandwidth of the host asked about is unknown"):
        resolve_host(HostQuery(cores=96), None, measure=measure)
    assert calls == [20.0]


def test_a_doctor_document_from_another_host_is_its_facts(
    scanned_db: Path, tmp_path: Path, no_stated_facts: None
) -> None:
    host = {
        "hostname": "epyc", "cpu_model": "AMD EPYC 9655 96-Core Processor",
        "physical_cores": 96, "logical_cpus": 192, "mem_bytes": 768 * 2**30, "numa_nodes": 1,
        "numactl": None, "system": "Linux 6.8", "fingerprint": "0123456789abcdef", "threads": 96,
    }  # fmt: skip
    doc = {"version": "1", "kind": "doctor", "host": host, "bandwidth": {"read_gbs": 412.5}}
    path = tmp_path / "doctor-epyc.json"
    path.write_text(json.dumps(doc))
    stated = read_host_facts(path)
    assert (stated.bandwidth_gbs, stated.bandwidth_source) == (412.5, SOURCE_DOCTOR)
    got = recommend_json(scanned_db, "--host-facts", str(path))
    assert got["host"]["physical_cores"] == 96 and got["host"]["bandwidth_gbs"] == 412.5
    assert got["host"]["source"] == SOURCE_DOCTOR and str(path) in got["host"]["note"]
    assert all(" -t 96 " in o["command"] for o in got["options"])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--cores", "96"), "the memory bandwidth of the host asked about is unknown here"),
        (("--host-facts", "{missing}"), "cannot read host facts from"),
        (("--host-facts", "{bad}"), "names 'cores', which is no host fact: use hostname"),
        (("--cores", "0"), "0 is not in the range 1<=x<=4096"),
        (("--bandwidth", "-3"), "-3 is not a number of at least 0.001"),
    ],
)
def test_bad_host_facts_are_one_line_usage_errors(
    scanned_db: Path, tmp_path: Path, args: tuple[str, ...], message: str, no_stated_facts: None
) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"cores": 96}')
    args = tuple(a.format(missing=tmp_path / "none.json", bad=bad) if "{" in a else a for a in args)
    r = specreg(*ASK, "--db", str(scanned_db), *args)
    assert r.returncode == 2, r.stdout
    assert message in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_tune_and_serve_take_another_hosts_facts_only_to_plan(
    scanned_db: Path, no_stated_facts: None
) -> None:
    db = ("--db", str(scanned_db))
    r = specreg("tune", TARGET, "--task", "code", "--cores", "96", *db)
    assert (r.returncode, r.stderr) == (
        2,
        "error: tune measures on this machine: --host-facts, --cores "
        "and --memory describe another host, for --dry-run\n",
    )
    r = specreg("serve", TARGET, "--cores", "96", "--bandwidth", "460", *db)
    assert (r.returncode, r.stderr) == (
        2,
        "error: --host-facts, --cores and --memory describe another host: add --dry-run\n",
    )

    code, out, err = run(
        "tune", TARGET, "--task", "code", "--dry-run", "--budget", "3",
        "--bandwidth", "460", "--cores", "96", *db,
    )  # fmt: skip
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].endswith("tune would start with 3 of 3 runs")
    assert lines[1].startswith("host: 96 cores (user), 460 GB/s (user), ")
    assert lines[1].endswith(" GB of memory (this machine's; --memory states that host's)")
    assert lines[2].startswith("1. plain: predicted ")
    assert lines[2].endswith("(plain decoding anchors every speedup)")
    assert " -t 96 " in lines[3]


def test_serve_dry_run_routes_as_that_host_would(
    scanned_db: Path, llama_install: LlamaInstall, no_stated_facts: None
) -> None:
    facts = ("--bandwidth", "460", "--cores", "96", "--db", str(scanned_db))
    code, out, err = run(
        "serve", TARGET, "--dry-run", "--json", "--llama-bin", str(llama_install.bin_dir), *facts
    )
    assert code == 0, err
    routes = json.loads(out)
    code_route = next(r for r in routes["routes"] if r["task"] == "code")
    best = recommend_json(scanned_db, *facts[:-2])["options"][0]
    assert code_route["config_label"] == f"draft-simple k={best['k']}"
    assert best["method"] == "draft" and best["draft_name"] in code_route["reason"]
    assert f"K={best['k']} predicted {best['tps']:.1f} t/s" in code_route["reason"]
    assert all(" -t 96 " in b["command"] for b in routes["backends"])


def test_one_cpuinfo_parser_for_cores_and_flags() -> None:
    text = "".join(
        f"processor\t: {n}\nmodel name\t: X\nphysical id\t: {n // 4}\ncore id\t: {n % 4 // 2}\n"
        "flags\t\t: fpu avx2 fma\n\n"
        for n in range(8)
    )  # 2 sockets x 2 cores x 2 SMT threads
    info = parse_cpuinfo(text)
    assert (info.model, info.physical_cores, info.logical_cpus) == ("X", 4, 8)
    assert info.flags == {"fpu", "avx2", "fma"}


def test_a_ray_host_describes_itself_with_its_stated_bandwidth(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from specreg.tune.distributed import host_facts

    monkeypatch.setenv(ENV_HOST_FACTS, '{"hostname": "alpha", "bandwidth_gbs": 123.5}')
    facts = host_facts()
    assert (facts["hostname"], facts["bandwidth_gbs"], facts["bandwidth_source"]) == (
        "alpha",
        123.5,
        "stated",
    )
    assert facts["fingerprint"] == detect_host().fingerprint  # bandwidth is no part of it
