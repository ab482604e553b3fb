"""Measurements sent to a Ray cluster: one run at a time per host, every run recorded by the
caller, in its registry.

A host is a Ray node that offers one unit of the resource `specreg_host` and names itself with
a second resource, `specreg-host:NAME`:

    ray start --address HEAD:6379 --resources '{"specreg_host": 1, "specreg-host:box1": 1}'

A job asks for the whole `specreg_host` unit and a sliver of its host's name, so Ray places it
on that host and never runs two measurements there at once, even for two callers sharing the
cluster; the caller also hands each host one job at a time. Each host's own specreg runs the job
(`sweep.run_job`): it finds the models in its registry by id, or scans the caller's path there,
and returns the run record with its own host fingerprint. Nothing is written on the host.

The caller records each job as `running` before sending it and completes the record with the
host's result, one transaction each. A host whose worker dies under a job (killed, out of
memory, the node lost) gives a failed run (`worker-died`), and so does an error of specreg on
the host (`host-error`); either way the host gets no more jobs in this sweep, and with
`retry_elsewhere` the job runs again, as a new run, on another host. A job is never sent twice
under one run id (Ray's own task retries are off): nothing is lost or recorded twice.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from specreg.errors import UsageError, param
from specreg.registry.run_store import RunRecord
from specreg.runner.runs import RunLog
from specreg.tune.jobs import Hosts, Job, LocalHost, OnRun, Outcome, Swept

log = logging.getLogger(__name__)

RESOURCE = "specreg_host"
NAME_PREFIX = "specreg-host:"
NAME_SHARE = 0.001  # what a job takes of its host's name resource: only a placement
DESCRIBE_TIMEOUT_S = 300.0  # a host's first answer: a worker process starting, a bandwidth test
INSTALL_HINT = "Ray is not installed: pip install 'specreg[ray]'"
HOST_HINT = (
    "start each host with ray start --address HEAD:PORT --resources "
    '\'{"specreg_host": 1, "specreg-host:NAME": 1}\''
)
KIND_DIED = "worker-died"  # the host's worker process or node went away mid-run
KIND_HOST_ERROR = "host-error"  # specreg raised on the host


@dataclass(frozen=True)
class Cluster:
    """Where runs go: this machine (`address` None), or the hosts of the Ray cluster at
    `address`, all of them or those `hosts` names; `retry_elsewhere` runs a job whose host died
    under it again, on another host."""

    address: str | None = None
    hosts: tuple[str, ...] = ()
    retry_elsewhere: bool = False

    def check(self) -> None:
        """Options about a Ray cluster's hosts need a cluster."""
        if self.address is None and (self.hosts or self.retry_elsewhere):
            given = param("host") if self.hosts else param("retry_elsewhere")
            raise UsageError(
                f"{given} is about the hosts of a Ray cluster: add {param('ray', 'ADDRESS')}"
            )


LOCAL = Cluster()


def import_ray() -> Any:
    """The `ray` module, or a usage error saying how to get it."""
    try:
        import ray
    except ImportError as err:
        raise UsageError(INSTALL_HINT) from err
    return ray


# -- on the host ------------------------------------------------------------------------------


def host_facts() -> dict[str, Any]:
    """This host's facts as the caller records them: the runner's host and fingerprint, and the
    bandwidth the recommender places its runs with."""
    from specreg.host.facts import detect_host_facts
    from specreg.host.machine import detect_host

    host = detect_host()
    facts = detect_host_facts(fingerprint=host.fingerprint)
    return {
        **host.to_json(),
        "bandwidth_gbs": facts.bandwidth_gbs,
        "bandwidth_source": facts.source,
    }


def host_job(job: Job, name: str) -> RunRecord:
    """Run `job` here (in a Ray worker on the host called `name`) with this host's specreg:
    its registry, its llama.cpp, its facts."""
    from specreg.home import default_db_path
    from specreg.host.machine import detect_host
    from specreg.llama.install import find_llama
    from specreg.registry.db import opened
    from specreg.tune.jobs import run_job

    facts = {**host_facts(), "name": name}
    return run_job(
        job, opened(default_db_path()), find_llama(None), detect_host(), host_facts=facts
    )


# -- on the caller ----------------------------------------------------------------------------


@dataclass(frozen=True)
class RayHost:
    """A host of the cluster: its name (the resource) and the facts it reported."""

    name: str
    node_id: str
    facts: dict[str, Any]

    @property
    def fingerprint(self) -> str | None:
        value = self.facts.get("fingerprint")
        return str(value) if value is not None else None


def _first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0]


def cluster_hosts(nodes: Sequence[dict[str, Any]]) -> dict[str, str]:
    """Host name -> node id of the alive nodes that offer `specreg_host` (`ray.nodes()`)."""
    out: dict[str, str] = {}
    for node in nodes:
        resources = node.get("Resources") or {}
        if not node.get("Alive") or resources.get(RESOURCE, 0) < 1:
            continue
        names = [k[len(NAME_PREFIX) :] for k in resources if k.startswith(NAME_PREFIX)]
        for name in names or [str(node.get("NodeID", "?"))[:12]]:
            out[name] = str(node.get("NodeID"))
    return out


class RayHosts:
    """The hosts of the Ray `cluster` (all, or those it names), as a sweep's `Hosts`. Use as a
    context manager: it connects on entry (Ray's own `ray.init(address=...)`) and disconnects
    on exit."""

    def __init__(self, cluster: Cluster):
        assert cluster.address is not None
        self.address: str | None = cluster.address
        self.wanted = tuple(dict.fromkeys(cluster.hosts))
        self.retry_elsewhere = cluster.retry_elsewhere
        self.hosts: tuple[RayHost, ...] = ()
        self._ray: Any = None
        self._job: Any = None
        self._stdout: contextlib.redirect_stdout[Any] = contextlib.redirect_stdout(sys.stderr)

    def __enter__(self) -> RayHosts:
        ray = import_ray()
        # Ray's driver prints the cluster's error messages ("A worker died ...") on stdout from
        # a thread of its own; stdout carries --json, and each such failure is recorded as a
        # run anyway: while connected, Ray's prints go to stderr.
        self._stdout.__enter__()
        try:
            ray.init(
                address=self.address,
                namespace="specreg",
                log_to_driver=False,
                logging_level=logging.WARNING,
            )
        except Exception as err:  # noqa: BLE001 - Ray raises several types for one cause
            self._stdout.__exit__(None, None, None)
            raise UsageError(
                f"cannot join the Ray cluster at {self.address}: {_first_line(err)} (give the "
                "head's address, HOST:PORT, as `ray start --head` printed it)"
            ) from err
        self._ray = ray
        try:
            self.hosts = self._discover()
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        if self._ray is not None:
            self._ray.shutdown()
            self._ray = None
            self._stdout.__exit__(None, None, None)

    def _discover(self) -> tuple[RayHost, ...]:
        ray = self._ray
        found = cluster_hosts(ray.nodes())
        if not found:
            raise UsageError(
                f"no host of the Ray cluster at {self.address} runs specreg: {HOST_HINT}"
            )
        if self.wanted:
            unknown = [n for n in self.wanted if n not in found]
            if unknown:
                raise UsageError(
                    f"no host called {', '.join(unknown)} in the Ray cluster at {self.address}: "
                    f"its hosts are {', '.join(sorted(found))}"
                )
            found = {n: found[n] for n in self.wanted}
        describe = ray.remote(num_cpus=0, max_retries=0)(host_facts)
        self._job = ray.remote(num_cpus=0, max_retries=0)(host_job)
        refs = {name: describe.options(resources=self._placement(name)).remote() for name in found}
        hosts = []
        for name, ref in refs.items():
            try:
                facts = ray.get(ref, timeout=DESCRIBE_TIMEOUT_S)
            except Exception as err:  # noqa: BLE001 - a host that cannot answer is left out
                log.warning("host %s did not describe itself: %s", name, _first_line(err))
                continue
            hosts.append(RayHost(name, found[name], {**facts, "name": name}))
        if not hosts:
            raise UsageError(
                f"no host of the Ray cluster at {self.address} answered: check that specreg is "
                "installed on the hosts (pip install 'specreg[ray]')"
            )
        return tuple(hosts)

    @staticmethod
    def _placement(name: str) -> dict[str, float]:
        return {RESOURCE: 1.0, NAME_PREFIX + name: NAME_SHARE}

    def names(self) -> tuple[str, ...]:
        return tuple(h.name for h in self.hosts)

    def host(self, name: str) -> RayHost:
        return next(h for h in self.hosts if h.name == name)

    def run(self, run_log: RunLog, jobs: Sequence[Job], on_run: OnRun = None) -> Swept:
        """Every job on a free host, one per host at a time, each recorded in `run_log` as it ends
        (see the module's docstring for failures and retries)."""
        ray = self._ray
        queue = list(jobs)
        free = list(self.hosts)
        dropped: dict[str, str] = {}
        inflight: dict[Any, tuple[Job, int, RayHost, RunRecord, float]] = {}
        outcomes: list[Outcome] = []
        with self._interruptible(run_log, inflight):
            while queue or inflight:
                for host in list(free):
                    job = next((j for j in queue if j.fits(host.name)), None)
                    if job is None:
                        continue
                    queue.remove(job)
                    free.remove(host)
                    started = job.started(host.facts, host.name)
                    run_id = run_log.start(started)
                    ref = self._job.options(resources=self._placement(host.name)).remote(
                        job, host.name
                    )
                    inflight[ref] = (job, run_id, host, started, time.monotonic())
                if not inflight:
                    break  # what is left may run only on hosts the sweep has dropped
                (ref,), _ = ray.wait(list(inflight), num_returns=1)
                job, run_id, host, started, t0 = inflight.pop(ref)
                try:
                    record = ray.get(ref)
                except ray.exceptions.RayError as err:
                    kind = (
                        KIND_HOST_ERROR
                        if isinstance(err, ray.exceptions.RayTaskError)
                        else KIND_DIED
                    )
                    why = f"{kind} on {host.name}: {_first_line(err)}"
                    record = job.failed(started, kind, why, time.monotonic() - t0)
                    run_log.finish(run_id, record)
                    dropped[host.name] = why
                    log.warning("%s; %s gets no more jobs in this sweep", why, host.name)
                    if self.retry_elsewhere and job.host is None:
                        queue.insert(0, job.again(avoid=host.name))
                else:
                    record = replace(record, run_uuid=job.run_uuid)
                    run_log.finish(run_id, record)
                    free.append(host)
                outcome = Outcome(job, run_id, host.name, record)
                outcomes.append(outcome)
                if on_run is not None:
                    on_run(outcome)
        # a host's own plain baseline is moot once the host is dropped
        not_run = tuple(j for j in queue if not (j.host and j.host in dropped))
        return tuple(outcomes), not_run, dropped

    @contextmanager
    def _interruptible(
        self,
        run_log: RunLog,
        inflight: dict[Any, tuple[Job, int, RayHost, RunRecord, float]],
    ) -> Iterator[None]:
        """On Ctrl-C or an error of the caller: the jobs in flight are cancelled on their
        hosts (their llama-server dies with its worker) and recorded as interrupted."""
        try:
            yield
        except BaseException as err:
            for ref, (_, run_id, host, _, _) in inflight.items():
                try:
                    self._ray.cancel(ref, force=True)
                except Exception as cancel_err:  # noqa: BLE001 - best effort, then recorded
                    log.warning("cannot cancel the job on %s: %s", host.name, cancel_err)
                run_log.interrupt(run_id, err)
            raise


@contextmanager
def sweep_hosts(cluster: Cluster = LOCAL, *, llama_bin: Path | None = None) -> Iterator[Hosts]:
    """Where a sweep runs: this machine (the llama.cpp in `llama_bin`), or the hosts of the
    Ray `cluster` (all of them, or those it names), connected for the block."""
    cluster.check()
    if cluster.address is None:
        from specreg.host.machine import detect_host
        from specreg.llama.install import find_llama

        yield LocalHost(find_llama(llama_bin), detect_host())
        return
    with RayHosts(cluster) as hosts:
        yield hosts
