"""The settings of a measurement travel as one object: built once by the command's option
decorator, the same defaults as the core, and picklable (a Ray job carries it to its host)."""

from __future__ import annotations

import pickle
from pathlib import Path

import click
from click.testing import CliRunner

from specreg.cli.common import settings_options
from specreg.llama.config import Config
from specreg.runner.settings import DEFAULTS, Settings
from specreg.runner.workload import load_workload
from specreg.tune.jobs import Job


def test_settings_pickle_with_the_job_that_carries_them() -> None:
    settings = Settings(n_predict=8, repeats=2, retries=0, threads=1, allow_load=True)
    job = Job(
        run_uuid="u", label="plain", config=Config(), target_id="t", target_path="/m.gguf",
        draft_id=None, draft_path=None, workload=load_workload(("code",)).head(1), task="code",
        settings=settings,
    )  # fmt: skip
    again = pickle.loads(pickle.dumps(job))
    assert again.settings == settings and again == job


def test_one_decorator_builds_the_settings_once() -> None:
    got: list[Settings] = []

    @click.command()
    @settings_options("n_predict", "repeats", "threads", "load", repeats={"default": 2})
    def measure_cmd(settings: Settings) -> None:
        got.append(settings)

    runner = CliRunner()
    assert runner.invoke(measure_cmd, []).exit_code == 0
    assert got[-1] == DEFAULTS.with_(repeats=2)  # the rest are the core's defaults
    args = ["--n-predict", "8", "--repeat", "1", "--threads", "1", "--allow-load"]
    assert runner.invoke(measure_cmd, args).exit_code == 0
    assert got[-1] == Settings(n_predict=8, repeats=1, threads=1, allow_load=True)
    bad = runner.invoke(measure_cmd, ["--threads", "0"])
    assert bad.exit_code == 2 and got[-1].threads == 1


def test_settings_apply_their_threads_and_timeouts() -> None:
    assert Settings().configured(Config(threads=3)).threads == 3
    assert Settings(threads=1).configured(Config(threads=3)).threads == 1
    assert Settings(startup_timeout=1.0, request_timeout=2.0).legacy_timeout == 3.0


def test_the_load_options_make_the_policy(tmp_path: Path) -> None:
    policy = Settings(allow_load=True, load_wait=0.0).load_policy()
    assert (policy.allow_load, policy.wait_s) == (True, 0.0)
