"""The load guard without llama.cpp (issue 28): a real busy process is seen and named, a busy
host is refused with one line, measurements take turns through the host's lock and the one
that waits says for whom, and a run whose repeats spread 29x is recorded disturbed and left out
of training and of every baseline."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from specreg.errors import EXIT_BUSY, HostBusy
from specreg.host import load, progress
from specreg.llama.config import Config
from specreg.registry.db import opened
from specreg.registry.run_store import record_run
from specreg.runner.measurement import PromptResult
from specreg.runner.records import to_record

from support.calibration import calibration_record
from support.load import spin, stop
from support.measurements import HOST, PROMPT, completion, measurement
from support.recommender import demo_model

HOLD_LOCK = """
import sys, time
from specreg.host.load import measurement_lock
with measurement_lock("the other measurement"):
    open(sys.argv[1], "w").write("held")
    time.sleep(float(sys.argv[2]))
    open(sys.argv[1], "w").write(repr(time.time()))  # the last moment it measured
"""


@pytest.fixture(autouse=True)
def strict(monkeypatch: pytest.MonkeyPatch) -> None:
    """The defaults a user gets: no allowance for neighbours (the suite sets a lenient one)."""
    for name in (load.ENV_MAX_LOAD, load.ENV_MAX_SPREAD, load.ENV_ALLOW_LOAD, load.ENV_LOAD_WAIT):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def busy_loops() -> Iterator[list[int]]:
    """One spinning process per core, each pinned to its core: a steady load."""
    pids = [spin(core) for core in sorted(os.sched_getaffinity(0))]
    time.sleep(0.3)  # running before anything looks
    try:
        yield pids
    finally:
        stop(pids)


class Notes:
    """A progress listener that keeps the notes."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def start(self, description: str, total: int | None) -> progress.Task:
        return progress._Quiet()

    def finish(self, task: progress.Task) -> None:
        pass

    def note(self, message: str) -> None:
        self.lines.append(message)


def test_a_busy_loop_is_seen_and_named(busy_loops: list[int]) -> None:
    sample = load.sample_load(0.5)
    mine = {c.pid: c for c in sample.consumers if c.pid in busy_loops}
    assert mine, sample.describe()  # the spinning processes are among the busiest
    assert all(c.name.startswith("python") and c.cpu_percent > 10 for c in mine.values())
    assert not any(c.measuring for c in mine.values())
    # with one loop per core, others' share of the CPU is far above what a measurement allows
    assert sample.foreign_cores > load.LoadPolicy().cores_allowed(sample.logical_cpus)


def test_a_busy_host_is_refused_at_once_with_one_line(busy_loops: list[int]) -> None:
    policy = load.LoadPolicy(wait_s=0.0)
    with pytest.raises(load.BusyHost) as err:
        load.wait_quiet(os.cpu_count() or 1, "plain on t.gguf", policy=policy)
    message = str(err.value)
    assert isinstance(err.value, HostBusy) and err.value.exit_code == EXIT_BUSY == 3
    # the busiest are named (other jobs on this host may outrank the loops for the top places)
    named = err.value.sample.consumers[: load.TOP]
    assert message.startswith(f"host busy: {named[0].describe()}, "), message
    assert {c.pid for c in err.value.sample.consumers} >= set(busy_loops)
    assert message.endswith("wait, or pass --allow-load to measure anyway (recorded as disturbed)")
    assert "\n" not in message


def test_a_busy_host_is_waited_for_saying_what_for_then_allowed_when_asked(
    busy_loops: list[int],
) -> None:
    notes = Notes()
    policy = load.LoadPolicy(wait_s=2.5, allow_load=True)
    t0 = time.monotonic()
    with progress.listening(notes):
        check = load.wait_quiet(os.cpu_count() or 1, "plain on t.gguf", policy=policy)
    assert time.monotonic() - t0 >= 2.5  # it waited its bounded time
    assert check.busy and check.to_json()["busy"] is True
    assert notes.lines[0].startswith("waiting up to ")
    assert " s for the host to quiet down before measuring plain on t.gguf: " in notes.lines[0]
    assert notes.lines[-1].startswith("measuring plain on t.gguf under load (--allow-load): ")
    assert notes.lines[-1].endswith("the run is recorded as disturbed")


@pytest.fixture
def lock_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The host's measurement lock, in this test's folder."""
    path = tmp_path / "host.lock"
    monkeypatch.setenv(load.ENV_LOCK, str(path))
    return path


@contextmanager
def other_holder(script: str, held: Path, *args: str) -> Iterator[subprocess.Popen[bytes]]:
    """Another process running `script` (its arguments: `args`), once it has written `held` to
    say it holds the lock; killed after the block."""
    other = subprocess.Popen([sys.executable, "-c", script, *args])
    try:
        while not held.exists():
            assert other.poll() is None, "the other measurement ended early"
            time.sleep(0.01)
        yield other
    finally:
        other.kill()
        other.wait()


def test_measurements_take_turns_and_the_one_that_waits_says_for_whom(
    tmp_path: Path, lock_file: Path
) -> None:
    held = tmp_path / "held"
    with other_holder(HOLD_LOCK, held, str(held), "2") as other:
        holder = load.lock_holder()
        assert holder is not None and holder.pid == other.pid
        notes = Notes()
        with progress.listening(notes), load.measurement_lock("plain on t.gguf") as waited:
            began = time.time()
        assert began >= float(held.read_text())  # the other had finished measuring
        assert waited >= 1.0
        assert notes.lines[0] == (
            f"waiting for specreg measurement (pid {other.pid}: the other measurement) to "
            "finish before measuring plain on t.gguf (taking turns)"
        )


SLOW_TO_SIGN = """
import fcntl, json, os, sys, time
with open(sys.argv[1], "a+") as fh:
    fcntl.flock(fh, fcntl.LOCK_EX)
    open(sys.argv[2], "w").write("held")
    time.sleep(0.5)  # holding, but not yet named in the file
    fh.seek(0); fh.truncate()
    fh.write(json.dumps({"pid": os.getpid(), "what": "the slow signer", "since": time.time()}))
    fh.flush()
    time.sleep(1.5)
"""


def test_a_wait_that_begins_before_the_holder_signs_still_names_it(
    tmp_path: Path, lock_file: Path
) -> None:
    """CI's race: the lock was taken, its name not yet written; the first note must wait."""
    held = tmp_path / "held"
    with other_holder(SLOW_TO_SIGN, held, str(lock_file), str(held)) as other:
        notes = Notes()
        with progress.listening(notes), load.measurement_lock("plain on t.gguf"):
            pass
        assert notes.lines[0] == (
            f"waiting for specreg measurement (pid {other.pid}: the slow signer) to "
            "finish before measuring plain on t.gguf (taking turns)"
        )


def test_a_lock_held_past_the_bound_is_a_refusal(tmp_path: Path, lock_file: Path) -> None:
    held = tmp_path / "held"
    with other_holder(HOLD_LOCK, held, str(held), "30") as other:
        lock = load.measurement_lock("x", policy=load.LoadPolicy(lock_wait_s=0.5))
        with pytest.raises(HostBusy) as err, lock:
            pass
        assert str(err.value).startswith(
            f"host busy: specreg measurement (pid {other.pid}: the other measurement) has held "
            "the measurement lock"
        )


SPREAD_29X = (3.6, 38.8, 104.7)  # issue 28's run: a median of 38.8 against about 95 quiet


PLAIN = Config()


def _plain(tps: tuple[float, ...], config: Config = PLAIN) -> object:
    samples = tuple(completion(tuple(range(64)), t) for t in tps)
    return measurement(config, [PromptResult(PROMPT, samples)])


def test_a_29x_spread_is_recorded_disturbed_with_the_reason() -> None:
    record = to_record(_plain(SPREAD_29X), "run", "t", None, task="code")  # type: ignore[arg-type]
    assert not record.trusted and not record.first_use_evidence
    assert record.trust_reason == (
        "disturbed: the repeats of code-1 spread 29.1x (3.6-104.7 tok/s), beyond this host's "
        "assumed noise floor of 10% (at most 40% allowed)"
    )
    steady = to_record(_plain((94.0, 95.0, 96.5)), "run", "t", None)  # type: ignore[arg-type]
    assert steady.trusted and steady.trust_reason is None
    # a measured quiet floor sets the limit: 2% quiet allows 35%, and 5% spread is fine
    with load.using(load.LoadPolicy(noise_floor=0.02)):
        wide = to_record(_plain((60.0, 95.0)), "run", "t", None)  # type: ignore[arg-type]
    assert not wide.trusted and "quiet noise floor of 2% (at most 35% allowed)" in str(
        wide.trust_reason
    )


def test_a_verify_run_against_a_disturbed_baseline_is_disturbed() -> None:
    cfg = _plain((120.0, 121.0), Config(spec_type="ngram-mod"))
    reason = "the repeats of code-1 spread 29.1x"
    record = to_record(cfg, "verify", "t", None, baseline_disturbed=reason)  # type: ignore[arg-type]
    assert not record.trusted
    assert record.trust_reason == f"disturbed: its baseline run was disturbed ({reason})"


def test_disturbed_runs_are_no_evidence_and_no_baseline(scanned_db: Path) -> None:
    from specreg.host.facts import REFERENCE_HOST
    from specreg.recommender.local import local_observations

    host = dataclasses.replace(REFERENCE_HOST, fingerprint=HOST.fingerprint)
    with opened(scanned_db) as con:
        target = demo_model(con, "Qwen2.5-Coder", "32B").model_id

        def recorded(tps: tuple[float, ...], config: Config = PLAIN) -> int:
            rec = to_record(_plain(tps, config), "run", target, None, task="code")  # type: ignore[arg-type]
            return record_run(con, rec)

        quiet = recorded((94.0, 95.0, 96.0))
        disturbed = recorded(SPREAD_29X)
        ngram = recorded((120.0, 121.0, 122.0), Config(spec_type="ngram-mod", k=16))
        observations = {o.row_id: o for o in local_observations(con, host)}
    assert set(observations) == {f"run:{quiet}", f"run:{ngram}"}  # training leaves it out
    assert f"run:{disturbed}" not in observations
    # the n-gram run's speedup is anchored on the quiet plain run alone (95, not 38.8 or 66.9)
    assert observations[f"run:{ngram}"].config.baseline_tps == pytest.approx(95.0)


def test_calibrate_stores_the_quiet_noise_floor_and_runs_are_judged_by_it(
    tmp_path: Path,
) -> None:
    from specreg.registry.noise import latest_noise_floor, record_noise_floor
    from specreg.runner.calibrate import noise_floor_of
    from specreg.runner.settings import Settings

    quiet = calibration_record()  # generation repeated at 0.64 and 0.70 s: a 9.4 % spread
    floor = noise_floor_of(quiet)
    assert floor is not None and floor.spread == pytest.approx(0.70 / 0.64 - 1)
    disturbed = dataclasses.replace(
        quiet, points=tuple(dataclasses.replace(p, contended=True) for p in quiet.points)
    )
    assert noise_floor_of(disturbed) is None  # a disturbed test is no floor
    with opened(tmp_path / "r.duckdb") as con:
        assert latest_noise_floor(con, "hostA") is None
        record_noise_floor(con, floor)
        policy = Settings(allow_load=True, load_wait=5.0).load_policy(con, "hostA")
        assert Settings().load_policy(con, "hostB").noise_floor is None
    assert policy.noise_floor == pytest.approx(floor.spread)
    assert (policy.allow_load, policy.wait_s) == (True, 5.0)
    assert policy.spread_allowed == pytest.approx(4 * floor.spread)  # 37.5 %, above the 35 %
    with load.using(policy):
        record = to_record(_plain((60.0, 95.0)), "run", "t", None)  # type: ignore[arg-type]
    assert record.trust_reason == (
        "disturbed: the repeats of code-1 spread 1.6x (60.0-95.0 tok/s), beyond this host's "
        "quiet noise floor of 9% (at most 38% allowed)"
    )
