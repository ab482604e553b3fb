"""The one run-recording lifecycle (runner.runs.RunLog), without llama.cpp: recorded running in
one short write, no registry connection held in between, finished, or interrupted with what
was measured (issue 25 points 6-7, issue 24)."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

import pytest

from specreg.registry.db import opened
from specreg.registry.run_store import (
    STATUS_INTERRUPTED,
    STATUS_OK,
    STATUS_RUNNING,
    PromptRecord,
    RunRecord,
    get_run,
    mark_interrupted,
    owner_gone,
)
from specreg.runner.measurement import MeasurementInterrupted
from specreg.runner.runs import RunLog, registry_at


def _record(status: str = STATUS_OK, tps: float | None = None) -> RunRecord:
    return RunRecord(
        kind="run", status=status, started_at=datetime.now(timezone.utc), config={},
        config_label="plain", spec_type="none", tokens_per_s=tps,
    )  # fmt: skip


def _read_only_elsewhere(db: Path) -> subprocess.CompletedProcess[str]:
    """Another process opening the registry read-only, as `specreg models` does."""
    code = (
        "import sys, duckdb; con = duckdb.connect(sys.argv[1], read_only=True); "
        "print(con.execute('SELECT status FROM runs').fetchall())"
    )
    return subprocess.run(
        [sys.executable, "-c", code, str(db)], capture_output=True, text=True, timeout=60
    )


def test_no_connection_is_held_while_the_block_measures(specreg_home: Path) -> None:
    db = specreg_home / "registry.duckdb"
    with opened(db):
        pass  # created and migrated
    with RunLog(registry_at(db)).recording(_record(STATUS_RUNNING)) as rec:
        other = _read_only_elsewhere(db)  # what llama.cpp's time looks like to other processes
        rec.done(_record(tps=5.0))
    assert other.returncode == 0, other.stderr
    assert "running" in other.stdout
    with opened(db, read_only=True) as con:
        done = get_run(con, rec.run_id)
    assert (done.status, done.tokens_per_s) == (STATUS_OK, 5.0)


def test_ctrl_c_records_what_was_measured(specreg_home: Path) -> None:
    db = specreg_home / "registry.duckdb"
    taken = PromptRecord(prompt_id="p1", prompt_sha256="0" * 64, n_samples=1, samples_tps=(7.0,))
    partial = replace(_record(tps=7.0), prompts=(taken,))
    log = RunLog(registry_at(db))
    recording = log.recording(_record(STATUS_RUNNING), lambda m: partial)
    with pytest.raises(KeyboardInterrupt), recording as rec:
        raise MeasurementInterrupted(None)  # type: ignore[arg-type]
    with opened(db, read_only=True) as con:
        stopped = get_run(con, rec.run_id)
    assert (stopped.status, stopped.error_kind) == (STATUS_INTERRUPTED, STATUS_INTERRUPTED)
    assert stopped.error == "stopped before it finished (KeyboardInterrupt)"
    assert stopped.tokens_per_s == 7.0
    assert [(p.prompt_id, p.n_samples) for p in stopped.prompts] == [("p1", 1)]


def test_an_error_without_samples_leaves_the_run_interrupted(specreg_home: Path) -> None:
    with opened(specreg_home / "r.duckdb") as con:
        log = RunLog(con)  # a held connection works the same way
        with pytest.raises(RuntimeError), log.recording(_record(STATUS_RUNNING)) as rec:
            raise RuntimeError("boom")
        stopped = get_run(con, rec.run_id)
        assert (stopped.status, stopped.error) == (
            STATUS_INTERRUPTED, "stopped before it finished (RuntimeError)",
        )  # fmt: skip
        assert stopped.prompts == ()


MEASURING = """
import sys, time
from datetime import datetime, timezone
from pathlib import Path
from specreg.registry.run_store import RunRecord
from specreg.runner.runs import RunLog, registry_at
record = RunRecord(kind="run", status="running", started_at=datetime.now(timezone.utc),
                   config={}, config_label="plain", spec_type="none")
print(RunLog(registry_at(Path(sys.argv[1]))).start(record), flush=True)
time.sleep(120)
"""


def test_a_live_measuring_process_keeps_its_run_running(specreg_home: Path) -> None:
    """Another process's `running` run is interrupted only once that process has ended: it
    holds no connection while it measures, so a writer opening the registry meanwhile is no
    sign that it is gone."""
    db = specreg_home / "registry.duckdb"
    with opened(db):
        pass
    measuring = subprocess.Popen(
        [sys.executable, "-c", MEASURING, str(db)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert measuring.stdout is not None
        run_id = int(measuring.stdout.readline())
        with opened(db) as con:
            assert mark_interrupted(con) == 0  # what the next `specreg run` does first
            assert get_run(con, run_id).status == STATUS_RUNNING
            assert not owner_gone(get_run(con, run_id).owner)
        measuring.kill()
        measuring.wait()
        with opened(db) as con:
            assert get_run(con, run_id).status == STATUS_INTERRUPTED  # as readers see it
            assert mark_interrupted(con) == 1
            assert mark_interrupted(con) == 0
    finally:
        if measuring.poll() is None:
            measuring.kill()
            measuring.wait()
