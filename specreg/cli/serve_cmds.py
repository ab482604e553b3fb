"""`specreg serve`: an OpenAI-compatible server that routes each request by task."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from rich.table import Table

from specreg.cli.common import (
    ADDRESS,
    CTX,
    FILE,
    PORT,
    SIZE,
    SLOTS,
    console,
    db_option,
    emit,
    err_console,
    host_facts_options,
    json_option,
    llama_bin_option,
    option_group,
    resolve_db,
    server_arg_option,
    threads_option,
)
from specreg.cli.progress import measuring
from specreg.errors import UsageError
from specreg.llamacpp import Flag
from specreg.terms import TRAFFIC_CACHE_EVERY
from specreg.units import INT32_MAX

# Slots per backend (llama-server -np): as serve.routes.DEFAULT_PARALLEL, which needs the
# [serve] extra to import.
DEFAULT_SLOTS = 8

if TYPE_CHECKING:
    from specreg.host.facts import HostQuery
    from specreg.serve.backends import BackendStatus
    from specreg.serve.policy import PolicyStatus
    from specreg.serve.routes import RouteTable

SERVE_EXTRA_HINT = "serve needs starlette, uvicorn and aiohttp: pip install 'specreg[serve]'"


# How `serve` listens and who may use it: --port, --host, --api-key/--api-keys, --public,
# --max-body and --queue, handed to the command as one `listening` dict.
_listening_options = option_group(
    "listening",
    dict,
    click.option("--port", type=PORT, default=8080, show_default=True,
                 help="Port to listen on."),
    click.option("--host", "bind", type=ADDRESS, default="127.0.0.1", show_default=True,
                 help="Address to listen on. Anything but loopback is reachable from other "
                 "machines: give --api-key, or --public to let anyone in."),
    click.option("--api-key", "api_keys", multiple=True, envvar="SPECREG_API_KEY",
                 help="A key clients must send (Authorization: Bearer KEY); repeat for "
                 "several. Requests without a valid key get 401 (/health stays open)."),
    click.option("--api-keys", "keys_file", type=FILE,
                 default=None, help="A file of keys, one per line (# comments)."),
    click.option("--public", is_flag=True,
                 help="Serve a non-loopback address without a key: anyone who can reach "
                 "this machine may use these models."),
    click.option("--max-body", type=click.IntRange(1, 10**9), default=1 << 20,
                 show_default=True, help="Largest request (bytes)."),
    click.option("--queue", "max_queue", type=click.IntRange(0, 1_000_000), default=64,
                 show_default=True, help="Requests that may wait for cores beyond every "
                 "backend's slots; past it serve answers 503 with Retry-After."),
)  # fmt: skip

# How `serve` chooses and what it keeps: --policy, --seed, --memory-budget, --traffic-cache,
# --share-state, --no-record, handed to the command as one `policy` dict.
_policy_options = option_group(
    "policy",
    dict,
    click.option("--policy", type=click.Choice(["adaptive", "fixed"]), default="adaptive",
                 show_default=True,
                 help="adaptive: a few candidate configurations per task, chosen per request "
                 "by Thompson sampling on the decode speed each request measured, at the "
                 "load it met (requests decoding on the same cores), starting from the "
                 "recommender's prediction and continuing from the registry's served runs "
                 "after a restart; fixed: one configuration per task, as pinned or "
                 "recommended."),
    click.option("--seed", type=int, default=0, show_default=True,
                 help="The adaptive policy's random seed."),
    click.option("--memory-budget", type=SIZE, default=None, metavar="SIZE",
                 help="Memory all backends may hold together (e.g. 16G: GB are 10^9 bytes, "
                 "GiB 2^30), at most this host's memory; the least recently used idle "
                 "backend stops to make room (default: 90% of the memory available at "
                 "start)."),
    click.option("--traffic-cache", "traffic_every", type=click.IntRange(min=0),
                 default=TRAFFIC_CACHE_EVERY, show_default=True, metavar="N",
                 help="Under --policy adaptive: every N served requests of a task, build a "
                 "lookup cache from their prompts and outputs and offer ngram-cache reading "
                 "it as a new candidate, judged on later requests only. Requests' texts are "
                 "kept in the registry for this; 0 builds no cache and keeps no text."),
    click.option("--share-state/--no-share-state", default=False, show_default=True,
                 help="Under --policy adaptive: before a backend whose drafts come from what "
                 "its server has read (ngram-mod) serves a request, it reads the target's "
                 "requests served elsewhere since (prompt processing only, shown in the "
                 "status). It costs prompt processing before those requests (on a 2-core "
                 "host 50-75 % of the stream's generation seconds)."),
    click.option("--no-record", is_flag=True,
                 help="Do not record served requests as runs."),
)  # fmt: skip


def _backends(given: dict[str, Any]) -> dict[str, Any]:
    ctx, slots = given["ctx"], given["parallel"]
    if ctx is not None and ctx * slots > INT32_MAX:  # llama-server's -c holds every slot's
        raise click.UsageError(
            f"--ctx {ctx} for each of --parallel {slots} slots is {ctx * slots} tokens, "
            f"more than llama-server takes ({INT32_MAX}): give fewer slots or less context"
        )
    return given


# What each backend runs: --spec, --pin, --threads, --ctx, --parallel, as `backends`.
_backend_options = option_group(
    "backends",
    _backends,
    click.option("--spec", "spec_path", type=FILE,
                 default=Path("specreg.yaml"), show_default=True,
                 help="specreg.yaml whose roles pin configurations per task (used when it "
                 "exists)."),
    click.option("--pin", "pins", multiple=True, metavar="TASK=TYPE[:K][@DRAFT]",
                 help="Serve TASK (or default: every other task) with this configuration, "
                 "e.g. code=ngram-mod:8; wins over specreg.yaml and the recommender."),
    threads_option(help="llama.cpp threads per backend (default: physical cores)."),
    click.option("--ctx", type=CTX, default=None,
                 help="Context size per request (each slot gets it; default: the target's "
                 "trained context, as much of it as half the memory beside the weights "
                 "holds, at least 4096)."),
    server_arg_option,
    click.option("--parallel", type=SLOTS, default=DEFAULT_SLOTS,
                 show_default=True, help="Slots per backend: requests it decodes at once, "
                 "batched into one pass per step."),
)  # fmt: skip


@click.command("serve")
@click.argument("targets", nargs=-1)
@_listening_options
@_backend_options
@_policy_options
@llama_bin_option
@host_facts_options
@click.option(
    "--dry-run", is_flag=True, help="Print the route table with the reasons; start nothing."
)
@db_option
@json_option
def serve_cmd(targets: tuple[str, ...], listening: dict[str, Any], backends: dict[str, Any],
              policy: dict[str, Any], llama_bin: Path | None, host_query: HostQuery,
              dry_run: bool, db_path: Path | None, as_json: bool) -> None:  # fmt: skip
    """Serve TARGETs (model paths, names or ids; default: the roles in specreg.yaml) with an
    OpenAI-compatible API (/v1/chat/completions, /v1/completions, /v1/models, /health).

    Each request is classified into a task (or forced with an X-Specreg-Task header or a
    `model` of `TARGET:TASK`) and forwarded to a llama-server running a configuration for
    it: chosen per request at the load it meets (adaptive), or pinned (--pin, specreg.yaml),
    else recommended (fixed). Backends on the same cores never decode at once; each request
    is recorded as a run. SIGTERM or Ctrl-C stops everything. --host-facts and --cores
    (another host) go with --dry-run, which needs no llama.cpp.
    """
    serving = _serving()
    if host_query.elsewhere and not dry_run:
        raise UsageError("--host-facts, --cores and --memory describe another host: add --dry-run")
    options = serving.ServeOptions.of(**listening, **policy)
    _warn_if_public(options)
    plan = serving.ServePlan(llama_bin=llama_bin, host_query=host_query,
                             policy=policy["policy"], dry_run=dry_run, **backends)  # fmt: skip
    with measuring(as_json=as_json):  # the recommender's fit, the first time
        prepared = serving.prepare(resolve_db(db_path), targets, plan)
    router = prepared.router(options.seed)
    if dry_run:
        _print_routes(prepared.table, router.status() if router.adaptive else None, as_json)
        return

    def ready(status: list[BackendStatus]) -> None:
        _print_ready(options.url, prepared.table, status)

    why = serving.serve(prepared.table, prepared.install, prepared.host, resolve_db(db_path),
                        options, on_ready=ready, router=router,
                        traffic=prepared.traffic)  # fmt: skip
    err_console().print(f"stopped ({why}); every backend has exited")


def _warn_if_public(options: Any) -> None:
    if options.public and not options.loopback:
        err_console().print(f"warning: listening on {options.host} without a key (--public): "
                            "anyone who can reach this machine can use these models")  # fmt: skip


def _serving() -> Any:
    try:
        from specreg.serve import serving
    except ImportError as err:
        raise UsageError(SERVE_EXTRA_HINT) from err
    return serving


def _print_routes(table: RouteTable, status: PolicyStatus | None, as_json: bool) -> None:
    if as_json:
        emit(table)
        return
    out = console()
    grid = Table("target", "task", "backend", "config", "source", "why", box=None)
    for r in table.routes:
        grid.add_row(r.target, r.task, r.backend, r.config_label, r.source, r.reason)
    out.print(grid)
    if status is not None:
        _print_policy(status)
    for b in table.backends:
        out.print(f"{b.name}:  {b.command}")
        ctx = f"{Flag.CTX} {b.config.ctx * b.slots}"
        out.print(f"  {ctx}: {b.config.ctx} tokens a request ({b.ctx_why})")
        for given in b.server_args:
            out.print(f"  {shlex.join(given.args)}: {given.origin}")
    for replica in table.replicas:
        out.print(f"{replica.backend}: replica of {replica.of} on {replica.placement.label}, "
                  f"serving its requests at {replica.loads} requests in flight; "
                  f"{replica.evidence.why}")  # fmt: skip
    for note in table.notes:
        out.print(f"note: {note}")


def _print_policy(status: PolicyStatus) -> None:
    """Per target and task: the candidates, each posterior with its band, the requests each
    received, the current choice and why."""
    out = console()
    out.print()
    out.print(
        f"adaptive policy (seed {status.seed}; {status.replayed} stored request(s) read back; "
        "* = current choice; status endpoint /v1/specreg/status)"
    )
    for t in status.tasks:
        if not t["candidates"]:
            continue
        out.print(f"{t['target']} / {t['task']}: {t['why']}")
        grid = Table("", "candidate", "prior t/s", "posterior t/s [90%]", "requests", "status",
                     box=None)  # fmt: skip
        for c in t["candidates"]:
            mark = "*" if c["key"] == t["choice"] else ""
            grid.add_row(
                mark, c["label"],
                f"{c['prior_tps']:.1f} [{c['prior_lo']:.1f}-{c['prior_hi']:.1f}]",
                f"{c['posterior_tps']:.1f} [{c['posterior_lo']:.1f}-{c['posterior_hi']:.1f}]",
                str(c["requests"]), c["status"] + (f": {c['why']}" if c["why"] else ""),
            )  # fmt: skip
        out.print(grid)


def _print_ready(url: str, table: RouteTable, status: list[BackendStatus]) -> None:
    out = err_console()
    names = ", ".join(t.name for t in table.targets)
    out.print(f"serving {names} at {url}/v1 (OpenAI API); health at {url}/health")
    replicas = {r.backend: r for r in table.replicas}
    for s in status:
        tasks = ", ".join(r.task for r in table.routes if r.backend == s.name)
        replica = replicas.get(s.name)
        if replica is not None and s.pid is None:
            out.print(f"  backend {s.name}: replica of {replica.of} on {replica.placement.name}, "
                      "starts when the load first sends it a request")  # fmt: skip
        elif s.pid is None:
            out.print(f"  backend {s.name}: starts when the policy first chooses it")
        else:
            out.print(f"  backend {s.name} (pid {s.pid}, port {s.port}): {tasks or 'a candidate'}")
    if table.policy == "adaptive":
        out.print(f"adaptive policy: candidates and posteriors at {url}/v1/specreg/status")


COMMANDS = [serve_cmd]
