"""A run's recording lifecycle with real llama.cpp (issue 25, points 6 and 7).

- While `specreg run` measures, the registry is not held: `specreg models` and `specreg runs`
  from other processes read it, and see the run as `running`.
- Ctrl-C (SIGINT) during `run` records the run as interrupted with the samples already taken.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from specreg.samples.small_models import SmallModels

TIMEOUT_S = 300.0


def _specreg(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "specreg", *args],
        capture_output=True, text=True, timeout=120, env={**os.environ, "SPECREG_HOME": str(home)},
    )  # fmt: skip


def _start_run(target: Path, db: Path, bin_dir: Path, home: Path, *extra: str) -> subprocess.Popen:  # type: ignore[type-arg]
    argv = [
        sys.executable, "-m", "specreg", "run", str(target), "--db", str(db),
        "--llama-bin", str(bin_dir), "--threads", "1", "--n-predict", "8", "--retries", "0",
        *extra,
    ]  # fmt: skip
    return subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "SPECREG_HOME": str(home)},
    )  # fmt: skip


def _runs(db: Path, home: Path) -> list[dict]:  # type: ignore[type-arg]
    listed = _specreg("runs", "--json", "--db", str(db), home=home)
    assert listed.returncode == 0, listed.stderr
    return list(json.loads(listed.stdout)["runs"])


def test_models_reads_the_registry_while_run_measures(
    small_models: SmallModels,
    llama_bin: Path,
    specreg_home: Path,
    tmp_path: Path,
) -> None:
    db = tmp_path / "registry.duckdb"
    target = small_models.smollm2.path
    # ngram-mod keeps state, so every timed sample gets a fresh llama-server: a long window
    proc = _start_run(target, db, llama_bin, specreg_home, "--spec-type", "ngram-mod",
                      "--max-prompts", "2", "--repeat", "2")  # fmt: skip
    seen_running = False
    models_ok = 0
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while proc.poll() is None and time.monotonic() < deadline:
            if not db.exists():
                time.sleep(0.1)
                continue
            models = _specreg("models", "--db", str(db), home=specreg_home)
            assert models.returncode == 0, models.stderr
            assert "in use by another specreg process" not in models.stderr
            models_ok += 1
            if any(r["status"] == "running" for r in _runs(db, specreg_home)):
                seen_running = True
                break
        out, err = proc.communicate(timeout=TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert models_ok >= 1
    assert seen_running, "the run was never seen running by another process"
    (run,) = _runs(db, specreg_home)
    assert (run["status"], run["kind"], run["spec_type"]) == ("ok", "run", "ngram-mod")
    models = _specreg("models", "--db", str(db), home=specreg_home)
    assert models.returncode == 0 and "Smollm2" in models.stdout, models.stdout


def _completions(logs: Path) -> int:
    """Requests llama-server answered so far (its `total time` timing line, one per request)."""
    return sum(p.read_text(errors="replace").count("total time =") for p in logs.glob("*.log"))


def test_ctrl_c_records_the_run_interrupted_with_its_samples(
    small_models: SmallModels,
    llama_bin: Path,
    specreg_home: Path,
    tmp_path: Path,
) -> None:
    db = tmp_path / "registry.duckdb"
    logs = specreg_home / "logs"
    # plain decoding: one llama-server, the warm-up then 3 prompts x 5 repeats
    proc = _start_run(small_models.smollm2.path, db, llama_bin, specreg_home,
                      "--max-prompts", "3", "--repeat", "5")  # fmt: skip
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while proc.poll() is None and time.monotonic() < deadline:
            if logs.is_dir() and _completions(logs) >= 2:  # the warm-up and one timed sample
                break
            time.sleep(0.05)
        assert proc.poll() is None, "the run ended before it could be interrupted"
        os.kill(proc.pid, signal.SIGINT)  # what Ctrl-C sends (llama-server has its own session)
        out, err = proc.communicate(timeout=TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert "aborted" in err
    (run,) = _runs(db, specreg_home)
    assert (run["status"], run["error_kind"]) == ("interrupted", "interrupted")
    assert run["error"] == "stopped before it finished (KeyboardInterrupt)"
    shown = _specreg("runs", str(run["run_id"]), "--json", "--db", str(db), home=specreg_home)
    assert shown.returncode == 0, shown.stderr
    (shown_run,) = json.loads(shown.stdout)["runs"]
    prompts = shown_run["prompts"]
    taken = sum(p["n_samples"] for p in prompts)
    assert 1 <= taken < 15, prompts
    assert all(len(p["samples_tps"]) == p["n_samples"] for p in prompts)
    assert run["tokens_per_s"] is not None and run["tokens_per_s"] > 0
