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
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from specreg.samples.small_models import SmallModels

TIMEOUT_S = 300.0


@dataclass(frozen=True)
class Cli:
    """`specreg` in processes of their own, on one registry and home, as a user's shells."""

    db: Path
    home: Path
    bin_dir: Path

    def env(self) -> dict[str, str]:
        return {**os.environ, "SPECREG_HOME": str(self.home)}

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        """A command on the registry, to its end."""
        argv = [sys.executable, "-m", "specreg", *args, "--db", str(self.db)]
        return subprocess.run(argv, capture_output=True, text=True, timeout=120, env=self.env())

    def runs(self, *args: str) -> list[dict]:  # type: ignore[type-arg]
        listed = self.run("runs", *args, "--json")
        assert listed.returncode == 0, listed.stderr
        return list(json.loads(listed.stdout)["runs"])

    @contextmanager
    def measuring(self, target: Path, *extra: str) -> Iterator[subprocess.Popen[str]]:
        """`specreg run TARGET` started (one thread, 8 tokens, no retries); killed on the way
        out if it is still running."""
        argv = [
            sys.executable, "-m", "specreg", "run", str(target), "--db", str(self.db),
            "--llama-bin", str(self.bin_dir), "--threads", "1", "--n-predict", "8",
            "--retries", "0", *extra,
        ]  # fmt: skip
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=self.env())  # fmt: skip
        try:
            yield proc
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


@pytest.fixture
def cli(llama_bin: Path, specreg_home: Path, tmp_path: Path) -> Cli:
    return Cli(tmp_path / "registry.duckdb", specreg_home, llama_bin)


def until(proc: subprocess.Popen[str], ready: Callable[[], bool]) -> None:
    """Wait while `proc` runs until `ready()` (at most TIMEOUT_S)."""
    deadline = time.monotonic() + TIMEOUT_S
    while proc.poll() is None and time.monotonic() < deadline and not ready():
        time.sleep(0.05)


def test_models_reads_the_registry_while_run_measures(small_models: SmallModels, cli: Cli) -> None:
    seen: list[str] = []  # "models" for each read that worked, "running" once the run showed

    def read() -> bool:
        if not cli.db.exists():
            return False
        models = cli.run("models")
        assert models.returncode == 0, models.stderr
        assert "in use by another specreg process" not in models.stderr
        seen.append("models")
        if any(r["status"] == "running" for r in cli.runs()):
            seen.append("running")
        return "running" in seen

    # ngram-mod keeps state, so every timed sample gets a fresh llama-server: a long window
    with cli.measuring(small_models.smollm2.path, "--spec-type", "ngram-mod",
                       "--max-prompts", "2", "--repeat", "2") as proc:  # fmt: skip
        until(proc, read)
        out, err = proc.communicate(timeout=TIMEOUT_S)
    assert proc.returncode == 0, err
    assert "models" in seen
    assert "running" in seen, "the run was never seen running by another process"
    (run,) = cli.runs()
    assert (run["status"], run["kind"], run["spec_type"]) == ("ok", "run", "ngram-mod")
    models = cli.run("models")
    assert models.returncode == 0 and "Smollm2" in models.stdout, models.stdout


def _completions(logs: Path) -> int:
    """Requests llama-server answered so far (its `total time` timing line, one per request)."""
    return sum(p.read_text(errors="replace").count("total time =") for p in logs.glob("*.log"))


def test_ctrl_c_records_the_run_interrupted_with_its_samples(
    small_models: SmallModels, cli: Cli
) -> None:
    logs = cli.home / "logs"
    # plain decoding: one llama-server, the warm-up then 3 prompts x 5 repeats
    with cli.measuring(small_models.smollm2.path, "--max-prompts", "3", "--repeat", "5") as proc:
        # the warm-up and one timed sample
        until(proc, lambda: logs.is_dir() and _completions(logs) >= 2)
        assert proc.poll() is None, "the run ended before it could be interrupted"
        os.kill(proc.pid, signal.SIGINT)  # what Ctrl-C sends (llama-server has its own session)
        out, err = proc.communicate(timeout=TIMEOUT_S)
    assert proc.returncode == 130, err
    assert "aborted" in err
    (run,) = cli.runs()
    assert (run["status"], run["error_kind"]) == ("interrupted", "interrupted")
    assert run["error"] == "stopped before it finished (KeyboardInterrupt)"
    (shown_run,) = cli.runs(str(run["run_id"]))
    prompts = shown_run["prompts"]
    taken = sum(p["n_samples"] for p in prompts)
    assert 1 <= taken < 15, prompts
    assert all(len(p["samples_tps"]) == p["n_samples"] for p in prompts)
    assert run["tokens_per_s"] is not None and run["tokens_per_s"] > 0
