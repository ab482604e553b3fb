"""Issue 16's must-show, on a real Ray cluster on loopback (tests/support/ray_lab.py: a head and two
worker nodes standing in for the hosts alpha and beta, each with its own fingerprint and
registry) and real llama.cpp with SmolLM2: a sweep lands every run in the caller's registry with
the fingerprint of the host that measured it; a worker killed mid-run gives a failed run and the
sweep finishes on the other host; the caller's runs export and import without duplicates.

Run serialized with the other llama.cpp tests: flock /tmp/specreg-llama.lock pytest ...
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from specreg.host.machine import ENV_HOST_FACTS, detect_host
from specreg.registry.db import opened
from specreg.registry.run_store import RunRecord, list_runs
from specreg.samples.small_models import SmallModels

from support.ray_lab import RayLab, cmdline, host_facts, parent, process_env, require_ray

pytestmark = pytest.mark.llama
GRID = "spec=ngram-mod,ngram-simple,draft-simple k=2"


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayLab]:
    require_ray()
    started = RayLab(tmp_path_factory.mktemp("ray-lab")).start()
    try:
        yield started
    finally:
        started.stop()  # raises if a process of the lab survives
    assert started.leftovers() == []


def fingerprint(name: str) -> str:
    with pytest.MonkeyPatch.context() as m:
        m.setenv(ENV_HOST_FACTS, host_facts(name))
        return detect_host().fingerprint


def sweep_args(models: SmallModels, lab: RayLab, db: Path, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "specreg", "sweep", str(models.smollm2.path),
        "--grid", f"{GRID} draft={models.draft('smollm2', 'Q4_0').path}",
        "--ray", lab.address, "--threads", "1", "--repeat", "1", "--max-prompts", "1",
        "--retries", "0", "--db", str(db), "--json", *extra,
    ]  # fmt: skip


@dataclass(frozen=True)
class Caller:
    """This machine, calling the lab: its registry, its environment (its own SPECREG_HOME)
    and the fingerprint of each lab host, by name."""

    db: Path
    env: dict[str, str]
    fps: dict[str, str]


@pytest.fixture
def caller(lab: RayLab, tmp_path: Path) -> Caller:
    fps = {name: fingerprint(name) for name in lab.hosts}
    return Caller(tmp_path / "caller.duckdb", lab.env(SPECREG_HOME=str(tmp_path / "home")), fps)


def runs_of(db: Path) -> list[RunRecord]:
    with opened(db, read_only=True) as con:
        return list_runs(con)


def llama_servers(lab: RayLab) -> list[int]:
    return [p for p in lab.leftovers() if any("llama-server" in a for a in cmdline(p)[:1])]


def test_a_sweep_on_two_hosts_lands_every_run_here_with_its_host(
    lab: RayLab, small_models: SmallModels, caller: Caller, tmp_path: Path
) -> None:
    db, fps = caller.db, caller.fps
    assert len(set(fps.values())) == 2 and detect_host().fingerprint not in fps.values()
    # beta knows the models by id already; alpha finds them at the same path and scans them
    scanned = subprocess.run(
        [sys.executable, "-m", "specreg", "scan", str(small_models.smollm2.path),
         str(small_models.draft("smollm2", "Q4_0").path)],
        env=lab.env(SPECREG_HOME=str(lab.home("beta"))), capture_output=True, text=True,
    )  # fmt: skip
    assert scanned.returncode == 0, scanned.stderr
    t0 = time.monotonic()
    done = subprocess.run(
        sweep_args(small_models, lab, db, "--n-predict", "16"),
        env=caller.env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    wall = time.monotonic() - t0
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert (doc["kind"], doc["ok"], doc["not_run"]) == ("sweep", True, [])

    runs = runs_of(db)
    # plain once per host (pinned), each grid point once, all measured and recorded here
    assert len(runs) == 2 + 3 and {r.status for r in runs} == {"ok"}
    assert {r.kind for r in runs} == {"sweep"}
    assert len({r.run_uuid for r in runs}) == len(runs)
    assert {r.run_uuid for r in runs} == {r["run_uuid"] for r in doc["runs"]}
    for r in runs:
        name = (r.host or {})["name"]
        assert r.host_fingerprint == fps[name], f"run {r.run_id} on {name}"
        assert (r.host or {})["cpu_model"] == f"lab host {name}"
        assert (r.host or {}).get("bandwidth_gbs"), "the host's bandwidth travels with its runs"
        assert r.config["threads"] == 1 and r.tokens_per_s
    plain = {(r.host or {})["name"] for r in runs if r.spec_type == "none"}
    assert plain == set(lab.hosts)
    per_host = {name: sum((r.host or {})["name"] == name for r in runs) for name in lab.hosts}
    assert all(n >= 1 for n in per_host.values())
    assert all(r["speedup"] for r in doc["runs"])  # against plain on the run's own host
    print(f"sweep on the lab: {wall:.1f} s wall, runs per host {per_host}")

    # hosts measure and return; they record nothing in their own registries
    for name in lab.hosts:
        assert runs_of(lab.home(name) / "registry.duckdb") == []
    assert llama_servers(lab) == []

    # the must-show's exchange: export here, import into another registry, twice
    out = tmp_path / "runs.parquet"
    other = tmp_path / "other.duckdb"
    base = [sys.executable, "-m", "specreg", "runs"]
    env = caller.env
    exported = subprocess.run([*base, "export", str(out), "--db", str(db), "--json"], env=env,
                              capture_output=True, text=True)  # fmt: skip
    assert exported.returncode == 0, exported.stderr
    for new in (5, 0):
        imported = subprocess.run([*base, "import", str(out), "--db", str(other), "--json"],
                                  env=env, capture_output=True, text=True)  # fmt: skip
        assert imported.returncode == 0, imported.stderr
        assert json.loads(imported.stdout)["n_new"] == new
    copied = runs_of(other)
    assert sorted((r.run_uuid, r.host_fingerprint, r.tokens_per_s) for r in copied) == sorted(
        (r.run_uuid, r.host_fingerprint, r.tokens_per_s) for r in runs
    )


def _speculative_server_on(lab: RayLab, name: str) -> int | None:
    """A llama-server of a speculative configuration running on the stand-in host `name`."""
    for pid in llama_servers(lab):
        env = process_env(pid)
        if f'"hostname": "{name}"' in env.get(ENV_HOST_FACTS, "") and "--spec-type" in cmdline(pid):
            return pid
    return None


def test_a_worker_killed_mid_run_is_a_failed_run_and_the_sweep_finishes_elsewhere(
    lab: RayLab, small_models: SmallModels, caller: Caller
) -> None:
    db, fps = caller.db, caller.fps
    proc = subprocess.Popen(
        sweep_args(small_models, lab, db, "--n-predict", "48", "--retry-elsewhere"),
        env=caller.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    killed = None
    end = time.monotonic() + 300
    while killed is None and proc.poll() is None and time.monotonic() < end:
        server = _speculative_server_on(lab, "alpha")
        worker = parent(server) if server else None
        if worker:
            os.kill(worker, signal.SIGKILL)  # the Ray worker running alpha's job
            killed = worker
        time.sleep(0.02)
    stdout, stderr = proc.communicate(timeout=600)
    assert killed is not None, f"alpha never ran a speculative point: {stderr}"
    assert proc.returncode == 0, stderr
    doc = json.loads(stdout)

    runs = runs_of(db)
    failed = [r for r in runs if r.status != "ok"]
    assert len(failed) == 1, [(r.run_id, r.status, r.error) for r in runs]
    (dead,) = failed
    assert (dead.status, dead.error_kind) == ("failed", "worker-died")
    assert dead.host_fingerprint == fps["alpha"] and (dead.host or {})["name"] == "alpha"
    assert "alpha" in (dead.error or "")
    # the point ran again, as a new run, on beta; every point has a successful run
    (retry,) = [r for r in doc["runs"] if r["retry_of"] == dead.run_uuid]
    assert (retry["status"], retry["host_name"], retry["attempt"]) == ("ok", "beta", 2)
    assert retry["host_fingerprint"] == fps["beta"] and retry["run_uuid"] != dead.run_uuid
    assert doc["ok"] and doc["not_run"] == []
    ok_labels = {r["label"] for r in doc["runs"] if r["status"] == "ok"}
    assert ok_labels == {r["label"] for r in doc["runs"]}
    # alpha left the sweep: nothing ran there after the failure
    after = [r for r in runs if r.run_id > (dead.run_id or 0) and (r.host or {})["name"] == "alpha"]
    assert after == []
    assert [h["name"] for h in doc["hosts"] if h["dropped"]] == ["alpha"]
    # nothing lost or recorded twice
    assert len({r.run_uuid for r in runs}) == len(runs) == len(doc["runs"])
    assert {r.status for r in runs} <= {"ok", "failed"}
    assert llama_servers(lab) == []


def test_tune_on_a_ray_host_records_its_runs_here_for_that_host(
    lab: RayLab, small_models: SmallModels, caller: Caller
) -> None:
    db = caller.db
    done = subprocess.run(
        [sys.executable, "-m", "specreg", "tune", str(small_models.smollm2.path), "--ray",
         lab.address, "--host", "beta", "--budget", "2", "--n-predict", "16", "--repeat", "1",
         "--task", "code", "--db", str(db), "--json"],
        env=caller.env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    runs = runs_of(db)
    assert sorted(r.run_id for r in runs) == sorted(s["run_id"] for s in doc["runs"])
    # plain first; a second run only when a prediction could still beat it
    assert 1 <= len(runs) <= 2 and {r.status for r in runs} == {"ok"}
    # measured on beta, recorded here, and tune's evidence is beta's: its plain run counts
    assert {r.host_fingerprint for r in runs} == {caller.fps["beta"]}
    assert doc["runs"][0]["label"] == "plain" and doc["baseline_tps"]
    assert llama_servers(lab) == []
