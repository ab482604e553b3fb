"""A measurement any host can run: a `Job` names its models by registry id and the caller's
path, `run_job` measures it on the host it lands on (that host's registry resolves the models,
scanning the same path if it has not seen them), and `Hosts` are where jobs run: this machine
(`LocalHost`) or a Ray cluster's hosts (`distributed.RayHosts`). The caller records each run
as `running` before it starts and completes it with the host's record: a host never writes
the caller's registry.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any, Protocol

import duckdb

from specreg.errors import SpecregError, UsageError
from specreg.host.machine import Host
from specreg.llama.config import Config
from specreg.llama.install import LlamaInstall
from specreg.registry.queries import get_model, model_fs_paths
from specreg.registry.run_store import STATUS_FAILED, RunRecord, new_run_uuid
from specreg.runner.measurement import Measurement
from specreg.runner.records import Models, run_record, to_record
from specreg.runner.runs import RunLog, RunSpec, measure_plan, plan
from specreg.runner.settings import DEFAULTS, Settings
from specreg.runner.workload import Workload
from specreg.terms import ENGINE_AUTO

log = logging.getLogger(__name__)

KIND_SWEEP = "sweep"  # the runs' kind in the registry


@dataclass(frozen=True)
class Job:
    """One measurement as any host can run it: models by registry id and the caller's path
    (a host that has not seen a model scans the same path, and checks it is the same model)."""

    run_uuid: str
    label: str
    config: Config
    target_id: str
    target_path: str
    draft_id: str | None
    draft_path: str | None
    workload: Workload
    task: str | None
    settings: Settings = DEFAULTS  # pickled with the job: a Ray host measures with it
    kind: str = KIND_SWEEP
    host: str | None = None  # a host name this job must run on (a host's plain baseline)
    avoid: tuple[str, ...] = ()  # host names it failed on (a retry goes elsewhere)
    attempt: int = 1
    retry_of: str | None = None  # run_uuid of the failed attempt this one retries

    def again(self, avoid: str) -> Job:
        """The same measurement as a new run (a new run_uuid), anywhere but `avoid`."""
        return replace(
            self, run_uuid=new_run_uuid(), attempt=self.attempt + 1, retry_of=self.run_uuid,
            avoid=(*self.avoid, avoid),
        )  # fmt: skip

    def fits(self, host_name: str) -> bool:
        """Whether this job may run on `host_name`."""
        return self.host in (None, host_name) and host_name not in self.avoid

    def started(self, host: Host | dict[str, Any] | None, host_name: str | None) -> RunRecord:
        """The `running` record the caller writes before the job starts."""
        facts = host.to_json() if isinstance(host, Host) else dict(host or {})
        if host_name is not None:
            facts["name"] = host_name
        models = Models(self.target_id, self.target_path, self.draft_id, self.draft_path)
        return run_record(
            self.kind, self.config, models, engine=ENGINE_AUTO, host=facts, task=self.task,
            prompt_set=self.workload.name, n_predict=self.settings.n_predict,
            repeats=self.settings.repeats, run_uuid=self.run_uuid,
        )  # fmt: skip

    def record_of(self, m: Measurement, facts: dict[str, Any]) -> RunRecord:
        """The record of this job's measurement `m`, with the facts of the host that took it."""
        record = to_record(m, self.kind, self.target_id, self.draft_id, task=self.task)
        return replace(record, run_uuid=self.run_uuid, host={**(record.host or {}), **facts})

    def failed(
        self, started: RunRecord, error_kind: str, error: str, seconds: float | None = None
    ) -> RunRecord:
        """The record of this job when it could not run, or its host died under it."""
        return replace(
            started, status=STATUS_FAILED, error_kind=error_kind, error=error, seconds=seconds
        )


def _locate(con: duckdb.DuckDBPyConnection, model_id: str, path: str, host: str) -> Path:
    """A model's file on this host: from this host's registry by id, else the caller's path
    scanned here (it must be the same model)."""
    from specreg.registry.scan import model_record

    if get_model(con, model_id) is not None:
        for found in model_fs_paths(con, model_id):
            if Path(found).is_file():
                return Path(found)
    if not Path(path).is_file():
        raise UsageError(
            f"model {model_id[:12]} is not in {host}'s registry and {path} is not there: scan "
            "the model folders on that host, or mount them at the same path"
        )
    record = model_record(con, Path(path))
    if record.model_id != model_id:
        raise UsageError(
            f"{path} on {host} is a different model ({record.model_id[:12]}, not "
            f"{model_id[:12]}): give that host the same file"
        )
    return Path(path)


def run_job(
    job: Job,
    registry: AbstractContextManager[duckdb.DuckDBPyConnection],
    install: LlamaInstall,
    host: Host,
    *,
    host_facts: dict[str, Any] | None = None,
) -> RunRecord:
    """Measure `job` on this host and return its record (never written here: the caller
    records it). `registry` opens this host's registry, for the models; it is closed before
    llama.cpp starts. A job this host cannot run (a model it lacks, a configuration its build
    rejects) is a failed record saying why; Ctrl-C raises `MeasurementInterrupted` with the
    samples taken."""
    started = job.started(host, None)
    facts = {**(started.host or {}), **(host_facts or {})}
    started = replace(started, host=facts)
    t0 = time.monotonic()
    try:
        with registry as con:
            target = _locate(con, job.target_id, job.target_path, host.hostname)
            draft = (
                _locate(con, job.draft_id, job.draft_path, host.hostname)
                if job.draft_id and job.draft_path
                else None
            )
            spec = RunSpec(target, draft, job.config, job.workload, task=job.task)
            p = plan(con, install, host, spec, job.settings)
    except SpecregError as err:
        return job.failed(started, "host-setup", str(err), time.monotonic() - t0)
    m = measure_plan(p)
    return job.record_of(m, facts)


@dataclass(frozen=True)
class Outcome:
    """A job and what the caller recorded for it."""

    job: Job
    run_id: int
    host_name: str | None
    record: RunRecord  # as recorded (finished, failed or interrupted)


OnRun = Callable[[Outcome], None] | None  # told of each run as it is recorded
# What hosts made of a list of jobs: the outcomes, the jobs no host could run, and the hosts
# taken out of the sweep, with why.
Swept = tuple[tuple[Outcome, ...], tuple[Job, ...], dict[str, str]]


class Hosts(Protocol):
    """Where a sweep's jobs run: this machine, or a Ray cluster (tune/distributed.py)."""

    address: str | None  # the Ray cluster's head, None for this machine

    def names(self) -> tuple[str, ...]: ...

    def run(self, run_log: RunLog, jobs: Sequence[Job], on_run: OnRun = None) -> Swept:
        """Run `jobs` (a job naming a host runs there), record each in `run_log`."""
        ...


class LocalHost:
    """This machine: jobs one after another, in this process (a failed job has nowhere else
    to go)."""

    def __init__(self, install: LlamaInstall, host: Host):
        self.install = install
        self.host = host
        self.address: str | None = None

    def names(self) -> tuple[str, ...]:
        return (self.host.hostname,)

    def run(self, run_log: RunLog, jobs: Sequence[Job], on_run: OnRun = None) -> Swept:
        outcomes = []
        for job in jobs:
            facts = self.host.to_json()
            with run_log.recording(
                job.started(self.host, None), partial(job.record_of, facts=facts)
            ) as rec:
                # the models are resolved on a connection closed before llama.cpp starts
                record = run_job(job, run_log.open(), self.install, self.host)
                rec.done(record)
            outcome = Outcome(job, rec.run_id, self.host.hostname, record)
            outcomes.append(outcome)
            if on_run is not None:
                on_run(outcome)
        return tuple(outcomes), (), {}
