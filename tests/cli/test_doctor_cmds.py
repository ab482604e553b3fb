"""`specreg doctor` on this machine, through the real entry point."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from specreg.host.machine import detect_host
from specreg.registry.calibration import latest_bandwidth
from specreg.registry.db import opened


def _doctor(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "specreg", "doctor", *args],
        capture_output=True,
        text=True,
        env=dict(os.environ),
        timeout=120,
    )


def test_this_machine_json_exit_code_follows_findings(tmp_path: Path) -> None:
    db = tmp_path / "registry.duckdb"
    with opened(db):
        pass  # an empty registry: doctor compares against it and records the bandwidth
    r = _doctor("--json", "--db", str(db))
    doc = json.loads(r.stdout)
    assert (doc["version"], doc["kind"]) == ("2", "doctor")
    assert r.returncode == (1 if doc["n_findings"] else 0), r.stderr
    names = {c["name"] for c in doc["checks"]}
    assert {"numa", "smt", "threads", "thp", "governor", "cpu-features", "memory"} <= names
    assert {"bandwidth", "load", "omp-threads"} <= names
    for c in doc["checks"]:
        if c["status"] == "finding":
            assert c["fix"] and c["cost"], c
    bw = doc["bandwidth"]
    assert bw["read_gbs"] > 1.0
    assert bw["threads"] == detect_host().threads
    with opened(db, read_only=True) as con:
        stored = latest_bandwidth(con, doc["host"]["fingerprint"])
    assert stored is not None and stored.read_gbs == bw["read_gbs"]


def test_text_output_names_each_check_and_the_time() -> None:
    r = _doctor("--no-bandwidth")
    assert r.returncode in (0, 1), r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("host ")
    assert any(line.split()[1:2] == ["cpu-features"] for line in lines[1:])
    assert "doctor took" in lines[-1]


def test_bad_memory_description_is_a_usage_error() -> None:
    r = _doctor("--memory", "lots", "--no-bandwidth")
    assert r.returncode == 2
    assert r.stderr.strip() == (
        "error: 'lots' is not a memory description: give DIMMs x type-speed, e.g. 12xDDR5-5600"
    )


# A llama.cpp build that starts (--help, --version) and dies with SIGILL on any model, as the
# pinned native build does on AMX Xeons.
DYING = """#!/bin/sh
case "$1" in
  --help) echo '--spec-type [none|draft-simple|ngram-mod]'; exit 0 ;;
  --version) echo 'version: 0.6.0-dev (build 11434, commit pypi-sdist)' >&2; exit 0 ;;
esac
echo 'load_tensors: CPU_REPACK model buffer size = 0.44 MiB' >&2
kill -ILL $$
"""


def test_a_build_that_dies_here_is_a_finding_with_its_cost_and_fix(tmp_path: Path) -> None:
    bin_dir = tmp_path / "llama-bin"
    bin_dir.mkdir()
    for name in ("llama-server", "llama-bench", "llama-perplexity", "llama-completion"):
        (bin_dir / name).write_text(DYING)
        (bin_dir / name).chmod(0o755)
    r = _doctor("--json", "--no-bandwidth", "--llama-bin", str(bin_dir))
    assert r.returncode == 1, r.stderr
    check = next(c for c in json.loads(r.stdout)["checks"] if c["name"] == "llama-runs")
    assert check["status"] == "finding"
    assert check["summary"].startswith(
        f"llama.cpp in {bin_dir} dies on this host: llama-server was killed by signal 4 "
        "(SIGILL: an instruction this CPU cannot run)"
    )
    assert check["cost"] == "every model fails"
    assert check["fix"][0].startswith("specreg llama build")
    assert "'-DCMAKE_C_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16'" in check["fix"][1]
    assert "'-DCMAKE_CXX_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16'" in check["fix"][1]
    text = _doctor("--no-bandwidth", "--llama-bin", str(bin_dir)).stdout
    assert "FINDING  llama-runs" in text and "costs: every model fails" in text
