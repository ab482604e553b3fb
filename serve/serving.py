"""Run `serve`: start the backends, serve HTTP until told to stop, then stop everything.

SIGTERM and SIGINT stop the HTTP server gracefully, then every backend (process group,
SIGTERM then SIGKILL) and write the runs still queued. SIGKILL of specreg leaves nothing
behind either: Linux kills every backend with it (the runner's death signal).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import math
import signal
import socket
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from specreg.errors import UsageError
from specreg.home import logs_dir
from specreg.host import progress
from specreg.host.machine import Host
from specreg.host.placement import Warming, warm_page_cache
from specreg.llama.config import user_server_args
from specreg.llama.install import LlamaInstall
from specreg.llama.server import STARTUP_TIMEOUT_S
from specreg.llamacpp import keeps_state
from specreg.registry.run_store import STATUS_OK, RunRecord
from specreg.runner.protocol import Protocol, state_source
from specreg.serve.adaptive import Router
from specreg.serve.app import DEFAULT_MAX_BODY, KIND_SERVE, REQUEST_TIMEOUT_S, Service
from specreg.serve.backends import DEFAULT_MAX_QUEUE, BackendPool, BackendStatus
from specreg.serve.classify import fitted_classifier
from specreg.serve.layouts import Replica, split_evidence
from specreg.serve.loadpolicy import LoadModel, load_model_for
from specreg.serve.memory import default_budget
from specreg.serve.policy import KIND_PLAIN
from specreg.serve.pooled import PooledState
from specreg.serve.probe import probe_candidates
from specreg.serve.recorder import RunRecorder
from specreg.serve.routes import (
    DEFAULT_PARALLEL,
    POLICY_ADAPTIVE,
    BackendSpec,
    RouteTable,
    Shape,
    cache_candidate,
    parse_pin,
    plan_routes,
    replica_backend,
)
from specreg.serve.traffic import (
    TrafficCaches,
    TrafficState,
    latest_cache,
    traffic_state,
)
from specreg.terms import REGIME_WARM, TASKS, TRAFFIC_CACHE_EVERY

if TYPE_CHECKING:
    import duckdb
    import uvicorn

    from specreg.host.facts import HostFacts, HostQuery
    from specreg.host.topology import Layouts, Placement
    from specreg.registry.lookup_caches import LookupCache

log = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"
# Served traffic: whatever clients send, in arrival order, to one long-lived server.
ISOLATION_SERVED = "served-traffic"
PROMPT_SET = "serve"


@dataclass(frozen=True)
class ServeOptions:
    host: str = LOOPBACK
    port: int = 8080
    max_body: int = DEFAULT_MAX_BODY
    startup_timeout: float = STARTUP_TIMEOUT_S
    request_timeout: float = REQUEST_TIMEOUT_S
    record: bool = True
    seed: int = 0  # the adaptive policy's: the same evidence gives the same choices
    memory_budget: int | None = None  # bytes all backends may hold; None: MemAvailable share
    traffic_every: int = TRAFFIC_CACHE_EVERY  # requests of a task per traffic cache (0: none)
    # adaptive: backends with pooled n-gram state read the traffic sent elsewhere (serve.pooled);
    # off by default: the catch-up's prompt processing cost 50-75 % of the generation seconds
    # on the 2-core host's streams (docs/measurements/adaptive-serving.md)
    share_state: bool = False
    max_queue: int = DEFAULT_MAX_QUEUE  # requests that may wait for cores
    keys: frozenset[str] = frozenset()  # API keys clients must send; empty: none asked
    public: bool = False  # a non-loopback address without keys, on purpose

    @classmethod
    def of(
        cls,
        *,
        bind: str,
        api_keys: Sequence[str] = (),
        keys_file: Path | None = None,
        memory_budget: int | None = None,
        no_record: bool = False,
        policy: str = POLICY_ADAPTIVE,
        **given: Any,
    ) -> ServeOptions:
        """The options as the command line gives them: keys read, sizes parsed, and a
        server reachable from other machines refused unless it asks for a key or is
        public on purpose (`UsageError` says which flag to add)."""
        keys = frozenset(k for k in (*api_keys, *read_keys(keys_file)) if k)
        made = cls(
            host=bind, keys=keys, memory_budget=check_budget(memory_budget),
            record=not no_record, **given,
        )  # fmt: skip
        if not made.loopback and not keys and not made.public:
            raise UsageError(
                f"--host {bind} is reachable from other machines: give --api-key KEY (or "
                "--api-keys FILE) so only clients with a key get in, or --public to let "
                "anyone use these models"
            )
        return made

    @property
    def loopback(self) -> bool:
        return is_loopback(self.host)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"


def read_keys(path: Path | None) -> list[str]:
    """API keys from a file: one a line, blank lines and # comments ignored."""
    if path is None:
        return []
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise UsageError(f"--api-keys {path}: cannot read it ({err.strerror})") from err
    keys = [line.strip() for line in text.splitlines()]
    keys = [k for k in keys if k and not k.startswith("#")]
    if not keys:
        raise UsageError(f"--api-keys {path}: no key in it (one a line, # for comments)")
    return keys


def check_budget(budget: int | None, proc: Path = Path("/proc")) -> int | None:
    """A memory budget (bytes) no larger than this host's memory, where backends run."""
    from specreg.host.machine import read_meminfo
    from specreg.registry.queries import human_bytes

    total = read_meminfo(proc).get("MemTotal", 0)
    if budget is not None and total and budget > total:
        raise UsageError(
            f"--memory-budget {human_bytes(budget)} is more than this host's {human_bytes(total)} "
            "of memory: give less, or leave it out (90% of the memory available at start)"
        )
    return budget


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_port(host: str, port: int) -> None:
    """Fail before any backend starts when the address is taken (uvicorn would exit)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as err:
            raise UsageError(
                f"cannot listen on {host}:{port} ({err.strerror}): pass another --port, or "
                "stop what holds it"
            ) from err


@dataclass(frozen=True)
class Prepared:
    """Everything `serve` needs, resolved before any process starts."""

    table: RouteTable
    install: LlamaInstall
    host: Host
    evidence: tuple[RunRecord, ...] = ()  # served runs of the targets, for the policy
    traffic: Mapping[tuple[str, str], TrafficState] = field(default_factory=dict)
    # per target: how its configurations' speeds fall with load on this host
    load_models: Mapping[str, LoadModel] = field(default_factory=dict)

    def router(self, seed: int = 0) -> Router:
        """The policy with the stored evidence read back (what a restarted server knows)."""
        router = Router(self.table, seed=seed, load_models=dict(self.load_models))
        router.replay(self.evidence)
        return router


@dataclass(frozen=True)
class ServePlan:
    """What the command line asks of the routes and their backends."""

    spec_path: Path | None = None  # specreg.yaml, used when it exists
    pins: Sequence[str] = ()  # TASK=TYPE[:K][@DRAFT]
    llama_bin: Path | None = None
    host_query: HostQuery | None = None  # another host's facts (a dry run for it)
    threads: int | None = None
    ctx: int | None = None  # None: what the target's trained context and the memory allow
    server_args: Sequence[str] = ()  # serve --server-arg: llama-server flags of the user's own
    parallel: int = DEFAULT_PARALLEL
    policy: str = POLICY_ADAPTIVE
    dry_run: bool = False  # plan only: no llama.cpp build is needed


def prepare(db_path: Path, targets: Sequence[str], plan: ServePlan = ServePlan()) -> Prepared:
    """Find llama.cpp (a dry run plans with the pinned build's flags when there is none), read
    specreg.yaml when there is one, and plan every route (for the host the plan's
    `host_query` describes: this machine unless it asks about another)."""
    from specreg.declare.spec import load_spec
    from specreg.host.facts import resolve_host
    from specreg.recommender.advisor import open_advisor
    from specreg.registry.db import opened

    parsed = [parse_pin(p) for p in plan.pins]
    install = _install(plan)
    path = plan.spec_path
    spec = load_spec(path)[0] if path is not None and path.exists() else None
    adaptive = plan.policy == POLICY_ADAPTIVE
    with opened(db_path) as con:
        host, facts = resolve_host(plan.host_query, con)
        # The adaptive policy replays the served runs as its own evidence: priors drawn from a
        # recommender that had read them too would count each request twice.
        advisor = open_advisor(con, facts, without=(KIND_SERVE,) if adaptive else ())
        own = user_server_args(plan.server_args, "serve --server-arg") if plan.server_args else None
        shapes = host_layouts(host, plan.host_query)
        shape = Shape(plan.parallel, shapes.full, plan.threads, plan.ctx, own)
        table = plan_routes(
            con, install, host, advisor, targets, spec=spec, pins=parsed, shape=shape,
            policy=plan.policy,
        )  # fmt: skip
        if shapes.splits:  # where `specreg capacity` measured a split faster in all
            table = with_replicas(con, table, install, host, shapes.splits[0])
        if not adaptive:
            return Prepared(table, install, host)
        models = _load_models(con, table, host, facts)
        evidence = served_runs(con, table)
        table = with_traffic_caches(con, table, install, host)
        traffic = {(t.name, task): traffic_state(con, t.model_id, task)
                   for t in table.targets for task in TASKS}  # fmt: skip
    return Prepared(table, install, host, evidence, traffic, models)


def _install(plan: ServePlan) -> LlamaInstall:
    """The llama.cpp to serve with; for a dry run without one, the pinned build's dialect
    (the commands it prints are what that build would run)."""
    from specreg.errors import LlamaError
    from specreg.llama.install import find_llama, planned_install

    try:
        return find_llama(plan.llama_bin)
    except LlamaError:
        if not plan.dry_run or plan.llama_bin is not None:
            raise
        return planned_install()


def _load_models(
    con: duckdb.DuckDBPyConnection, table: RouteTable, host: Host, facts: HostFacts
) -> dict[str, LoadModel]:
    from specreg.registry.queries import get_model

    out = {}
    for target in table.targets:
        model = get_model(con, target.model_id)
        if model is not None:
            out[target.name] = load_model_for(
                con, host.fingerprint, facts.bandwidth_gbs, facts.physical_cores, model
            )
    return out


def host_layouts(host: Host, query: HostQuery | None) -> Layouts:
    """The placements of the host serve runs for (host.topology.layouts: every core one thread
    each, memory interleaved over its nodes, and the splits): this machine's topology from
    /sys, or another host's as its facts state it."""
    from specreg.host.topology import even_topology, layouts, read_topology

    if query is not None and query.elsewhere:
        topology = even_topology(host.physical_cores, host.numa_nodes)
    else:
        topology = read_topology()
    return layouts(topology)


def with_traffic_caches(
    con: duckdb.DuckDBPyConnection, table: RouteTable, install: LlamaInstall, host: Host
) -> RouteTable:
    """The table with each (target, task)'s newest cache grown from traffic as a candidate
    (a restarted server offers what the last one had built), where the task chooses among
    several candidates and the cache file is intact."""
    from specreg.errors import SpecregError
    from specreg.registry.queries import get_model
    from specreg.runner.lookup_cache import usable_cache

    backends, candidates = list(table.backends), list(table.candidates)
    for target in table.targets:
        model = get_model(con, target.model_id)
        for task in TASKS:
            own = [c for c in table.candidates_of(target.name, task) if not c.reserve]
            cache = latest_cache(con, target.model_id, task)
            if len(own) < 2 or cache is None or model is None:
                continue
            try:
                usable_cache(con, cache.name, model)
            except SpecregError as err:
                log.warning("traffic cache %s left out: %s", cache.name, err)
                continue
            plain = min(own, key=lambda c: (c.kind != KIND_PLAIN, -c.prior_tps))
            prior = (plain.prior_tps, plain.prior_lo, plain.prior_hi)
            spec, cand = cache_candidate(table, install, host, target.name, task, cache.path,
                                         prior=prior)  # fmt: skip
            if spec.name not in {b.name for b in backends}:
                backends.append(spec)
            candidates.append(cand)
    return replace(table, backends=tuple(backends), candidates=tuple(candidates))


def with_replicas(
    con: duckdb.DuckDBPyConnection,
    table: RouteTable,
    install: LlamaInstall,
    host: Host,
    split: Sequence[Placement],
) -> RouteTable:
    """The table with a replica on every placement of `split` (the host's first split, the one
    `specreg capacity` measures) for each backend whose configuration's newest capacity curve
    on this host has the split's aggregate above the full instance's at some load
    (serve.layouts); the table as it was without one. A replica has its share of the full
    instance's slots, as capacity gave each of the split's instances."""
    from specreg.registry.capacity import latest_capacity
    from specreg.registry.queries import get_model

    backends, notes = list(table.backends), list(table.notes)
    replicas: list[Replica] = []
    for target in table.targets:
        curve = latest_capacity(con, host.fingerprint, target.model_id)
        if curve is None:
            continue
        found, note = split_evidence(curve, split)
        if note is not None:
            notes.append(f"{target.name}: {note}")
        for evidence in (e for e in found if e.levels):
            bases = [b for b in table.backends
                     if b.target == target and evidence.runs(b.config, b.draft_id)]  # fmt: skip
            for base in bases:
                draft = get_model(con, base.draft_id) if base.draft_id else None
                slots = math.ceil(base.slots / len(split))
                for place in split:
                    spec = replica_backend(base, place, slots, install, host, draft)
                    backends.append(spec)
                    replicas.append(Replica(spec.name, base.name, place, evidence))
    return replace(table, backends=tuple(backends), replicas=tuple(replicas), notes=tuple(notes))


def served_runs(con: duckdb.DuckDBPyConnection, table: RouteTable) -> tuple[RunRecord, ...]:
    """Every served request recorded for the table's targets (the policy's evidence)."""
    from specreg.registry.run_store import list_runs

    runs: list[RunRecord] = []
    for target in table.targets:
        runs += [r for r in list_runs(con, model_id=target.model_id) if r.kind == KIND_SERVE]
    return tuple(runs)


def run_template(spec: BackendSpec, install: LlamaInstall, host: Host) -> RunRecord:
    """The fields every served request on `spec` shares; the request fills in the rest."""
    from specreg.runner.records import Models, run_record
    from specreg.terms import ENGINE_SERVER

    c = spec.config
    models = Models(spec.target.model_id, spec.target.path, spec.draft_id, spec.draft_path)
    made = run_record(
        KIND_SERVE, c, models, engine=ENGINE_SERVER, install=install, host=host,
        status=STATUS_OK, behaviour_changing=c.experts is not None,
        threads=c.threads or host.threads,
        argv=spec.argv, prompt_set=PROMPT_SET, repeats=1, regime=REGIME_WARM,
        protocol=serve_protocol(c.spec_type).to_json(),
        # a cache file is named after its registry entry (specreg.runner.lookup_cache)
        lookup_cache=Path(c.lookup_cache).stem if c.lookup_cache else None,
        temperature=None, seed=None,  # each request's own, filled in when it is recorded
    )  # fmt: skip
    return replace(made, config={**made.config, "backend": spec.name})


def initial_backends(table: RouteTable, router: Router) -> list[str]:
    """The backends to start with: each (target, task)'s current best, most wanted first
    (adaptive); every backend but the split replicas, which start when the load first sends
    them a request (fixed)."""
    if not router.adaptive:
        replicas = {r.backend for r in table.replicas}
        return [b.name for b in table.backends if b.name not in replicas]
    wanted = [router.best(t.name, task) for t in table.targets for task in TASKS]
    counts = Counter(wanted)
    return sorted(dict.fromkeys(wanted), key=lambda name: -counts[name])


def serve_protocol(spec_type: str) -> Protocol:
    """How a served request's figures were taken: one sample, on a long-lived server that has
    answered other requests before (the warm regime: stateful methods have learned from them)."""
    return Protocol(
        regime=REGIME_WARM,
        isolation=ISOLATION_SERVED,
        repeats=1,
        contention_retries=0,
        warmup_tokens=0,
        warmup_sha256=None,
        keeps_state=keeps_state(spec_type),
        state_source=state_source(spec_type),
    )


def serve(
    table: RouteTable,
    install: LlamaInstall,
    host: Host,
    db_path: Path,
    options: ServeOptions,
    *,
    on_ready: Callable[[list[BackendStatus]], None] | None = None,
    router: Router | None = None,
    traffic: Mapping[tuple[str, str], TrafficState] | None = None,
) -> str:
    """Serve until SIGTERM/SIGINT; return why it stopped. `ServerFailed` if a backend
    cannot start (nothing is left running). `router`: the policy with its evidence
    (`Prepared.router`); by default one without evidence. `traffic`: where each task's
    traffic caches stand (`Prepared.traffic`)."""
    check_port(options.host, options.port)
    router = router or Router(table, seed=options.seed)
    main = _main(_Serving(table, install, host, db_path, options), on_ready, router, traffic or {})
    try:
        import uvloop  # the [serve] extra's faster event loop, where it installs
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)


def _call_soon(loop: asyncio.AbstractEventLoop, fn: Callable[..., None], *args: Any) -> None:
    with contextlib.suppress(RuntimeError):  # the loop has closed: serve has stopped
        loop.call_soon_threadsafe(fn, *args)


@dataclass
class _Stop:
    why: str = ""  # the signal that stopped serve
    server: uvicorn.Server | None = None


@dataclass(frozen=True)
class _Serving:
    """What `serve` runs: the routes, the llama.cpp, the host, the registry, the options."""

    table: RouteTable
    install: LlamaInstall
    host: Host
    db_path: Path
    options: ServeOptions


async def _main(
    serving: _Serving,
    on_ready: Callable[[list[BackendStatus]], None] | None,
    router: Router,
    traffic_states: Mapping[tuple[str, str], TrafficState],
) -> str:
    loop = asyncio.get_running_loop()
    main = asyncio.current_task()
    stop = _Stop()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        # Before HTTP serving starts (backends loading) cancel the start-up; afterwards
        # uvicorn has its own handlers and calls this one again once it has shut down.
        stop.why = stop.why or signal.Signals(signum).name
        if stop.server is None and main is not None:
            loop.call_soon_threadsafe(main.cancel)
        elif stop.server is not None:
            stop.server.should_exit = True

    options = serving.options
    recorder = RunRecorder(serving.db_path).start() if options.record else None
    service = _service(serving, router, recorder, traffic_states, loop)
    pool = service.pool
    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        # Fixed: every route's backend now. Adaptive: each task's current best now (in
        # order, within the budget: a task whose best does not fit waits for its request),
        # then the other candidates the budget holds beside them; the rest, and split
        # replicas, when the policy or the load first sends a request there.
        warming = await asyncio.to_thread(warm_models, serving.table, serving.host.numactl)
        if warming is not None:
            progress.note(f"page cache: {warming.summary}")
        await pool.start(initial_backends(serving.table, router))
        if router.adaptive:  # exploring a candidate then costs its requests, not its loading
            replicas = {r.backend for r in serving.table.replicas}
            await pool.prestart(b.name for b in serving.table.backends if b.name not in replicas)
            probed = await probe_candidates(router, pool.backends)  # ... nor its first requests
            if probed:
                progress.note("probed: " + "; ".join(p.line() for p in probed))
        await service.open()
        await _http(service, options, stop, on_ready)
    except asyncio.CancelledError:
        if not stop.why:
            raise
    finally:
        await service.close()
        await pool.stop()
        if recorder is not None:
            recorder.close()
        for sig, handler in previous.items():
            with contextlib.suppress(ValueError, TypeError):
                signal.signal(sig, handler)
    return stop.why or "stopped"


def warm_models(table: RouteTable, numactl: str | None) -> Warming | None:
    """Read every model the backends load once, interleaved over the nodes their placements
    spread memory over, before any backend maps them: a page lives on the node that first
    touched it, so a model already cached by one node's reader stays there whatever policy
    the backend asks for. None when no backend interleaves (a one-node host)."""
    nodes = {
        n for b in table.backends if b.placement and b.placement.policy for n in b.placement.nodes
    }
    if len(nodes) <= 1:
        return None
    paths = dict.fromkeys(p for b in table.backends for p in (b.target.path, b.draft_path) if p)
    return warm_page_cache([Path(p) for p in paths], sorted(nodes), numactl)


def _service(
    serving: _Serving,
    router: Router,
    recorder: RunRecorder | None,
    traffic_states: Mapping[tuple[str, str], TrafficState],
    loop: asyncio.AbstractEventLoop,
) -> Service:
    """The backends, the traffic caches and the front, wired to one another."""
    table, install, host, options = serving.table, serving.install, serving.host, serving.options
    adaptive = router.adaptive
    budget = options.memory_budget
    if budget is None and adaptive:
        budget = default_budget()
    pool = BackendPool(
        table, env=host.env(), logs=logs_dir(), startup_timeout=options.startup_timeout,
        memory_budget=budget, lazy=adaptive or bool(table.replicas), max_queue=options.max_queue,
    )  # fmt: skip
    templates = {b.name: run_template(b, install, host) for b in table.backends}
    dropping: set[asyncio.Task[None]] = set()

    def offer(target: str, task: str, cache: LookupCache) -> None:
        """A cache grown from traffic becomes a candidate (on the event loop's thread)."""
        spec, cand = cache_candidate(table, install, host, target, task, cache.path)
        pool.add(spec)
        made = run_template(spec, install, host)
        templates.setdefault(spec.name, replace(made, lookup_cache_sha256=cache.sha256))
        why = f"built from {len(cache.sources)} served request(s) of {task}"
        for gone in router.offer_cache(cand, why):
            job = asyncio.create_task(pool.drop(gone, f"superseded by {cand.label}"))
            dropping.add(job)
            job.add_done_callback(dropping.discard)
        pool.start_ahead(spec.name)

    traffic = None
    if adaptive and recorder is not None and options.traffic_every > 0:
        traffic = TrafficCaches(
            serving.db_path, install, host, every=options.traffic_every, states=traffic_states,
            schedule=recorder.schedule,
            on_built=lambda *built: _call_soon(loop, offer, *built),
            on_busy=lambda busy: _call_soon(loop, service.neighbour, busy),
            lost=router.cache_lost, wanted=router.takes_cache,
        )  # fmt: skip
    service = Service(
        table, pool, fitted_classifier(), templates=templates, recorder=recorder,
        router=router, traffic=traffic,
        pooled=PooledState() if adaptive and options.share_state else None,
        max_body=options.max_body, ready_timeout=options.startup_timeout,
        request_timeout=options.request_timeout, keys=options.keys,
    )  # fmt: skip
    return service


async def _http(
    service: Service,
    options: ServeOptions,
    stop: _Stop,
    on_ready: Callable[[list[BackendStatus]], None] | None,
) -> None:
    """Serve HTTP until uvicorn is told to exit; `on_ready` hears once it listens."""
    import uvicorn

    config = uvicorn.Config(
        service.app, host=options.host, port=options.port, log_level="warning",
        access_log=False, lifespan="off", timeout_graceful_shutdown=10,
    )  # fmt: skip
    server = uvicorn.Server(config)
    stop.server = server
    task = asyncio.create_task(server.serve())
    while not server.started and not task.done():
        await asyncio.sleep(0.02)
    if server.started and on_ready is not None:
        on_ready(service.pool.status())
    await task
