"""`specreg sweep`: every point of a grid measured, here or on the hosts of a Ray cluster."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from specreg.cli.common import (
    MODEL,
    console,
    db_option,
    err_console,
    json_option,
    llama_bin_option,
    option_group,
    present,
    prompts_of,
    prompts_options,
    resolve_db,
    settings_options,
)
from specreg.cli.progress import measuring
from specreg.errors import RunFailed

if TYPE_CHECKING:
    from specreg.runner.settings import Settings
    from specreg.tune.distributed import Cluster
    from specreg.tune.jobs import Outcome
    from specreg.tune.sweep import SweepPlan, SweepRequest, SweepResult


def _request(given: dict[str, Any]) -> SweepRequest:
    from specreg.tune.sweep import SweepRequest

    return SweepRequest(given["target"], given["grids"], prompts_of(given))


def _cluster(given: dict[str, Any]) -> Cluster:
    from specreg.tune.distributed import Cluster

    return Cluster(given["ray_address"], given["hosts"], given["retry_elsewhere"])


@click.command("sweep")
@option_group(
    "request",
    _request,
    click.argument("target", type=MODEL),
    click.option(
        "--grid",
        "grids",
        multiple=True,
        required=True,
        metavar="'AXIS=V,V ...'",
        help="Axes spec= (a stack as ngram-mod+draft-simple), k= (2,4 or 2..8 or 4..32:4), "
        "draft= (models), experts=; the points are their product, plain decoding always "
        "included. Example: --grid 'spec=none,ngram-mod,draft-simple k=2,4 draft=MODEL'.",
    ),
    *prompts_options(),
)
@settings_options(
    "n_predict", "repeats", "retries", "threads", "startup_timeout", "load",
    retries={"help": "Measure a sample again up to N times when other processes took CPU."},
    threads={"help": "llama.cpp threads per run (default: physical cores)."},
)  # fmt: skip
@option_group(
    "cluster",
    _cluster,
    click.option(
        "--ray",
        "ray_address",
        metavar="ADDRESS",
        default=None,
        help="Send each run to the hosts of this Ray cluster (HOST:PORT of its head), one run "
        "at a time per host; needs pip install 'specreg[ray]'.",
    ),
    click.option(
        "--host",
        "hosts",
        multiple=True,
        metavar="NAME",
        help="Only this Ray host (by its specreg-host:NAME resource); repeatable.",
    ),
    click.option(
        "--retry-elsewhere",
        is_flag=True,
        help="A run whose Ray host died under it runs again on another host.",
    ),
)
@click.option("--dry-run", is_flag=True, help="List the points and run nothing.")
@llama_bin_option(
    help="Folder with llama-server for runs on this machine (Ray hosts use their own)."
)
@db_option
@json_option
def sweep_cmd(request: SweepRequest, settings: Settings, cluster: Cluster, **kw: Any) -> None:
    """Measure every point of a grid of configurations of TARGET and record each run: on this
    machine one after another, or with --ray on the hosts of a Ray cluster, where each host
    runs one measurement at a time and every run comes back with its host's fingerprint.

    A host is a Ray node started with the resources
    '{"specreg_host": 1, "specreg-host:NAME": 1}'.

    Exit 1 if a point has no successful run (every failed run is recorded, with the reason).
    """
    from specreg.tune.sweep import plan_target, sweep_target

    db, as_json = resolve_db(kw["db_path"]), kw["as_json"]
    if kw["dry_run"]:
        return present(plan_target(db, request, settings), as_json, _print_plan)
    with measuring(as_json=as_json):
        result = sweep_target(db, request, settings, cluster=cluster, llama_bin=kw["llama_bin"],
                              on_run=None if as_json else _print_step)  # fmt: skip
    present(result, as_json, _print_result)
    if not result.ok:
        raise RunFailed("a point of the sweep has no successful run: see the failed runs above")


def _print_plan(p: SweepPlan) -> None:
    out = console()
    out.print(f"sweep of {p.target.display_name}: {len(p.points)} points ({p.grid.text})")
    for point in p.points:
        out.print(f"  {point.label}")


def _print_step(outcome: Outcome) -> None:
    from specreg.registry.run_store import STATUS_OK

    r = outcome.record
    got = (
        f"{_fmt(r.tokens_per_s, '.1f')} tok/s"
        if r.status == STATUS_OK
        else f"{r.status}: {r.error}"
    )
    err_console().print(
        f"  [{outcome.host_name}] {outcome.job.label}: {got} (run {outcome.run_id})"
    )


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _print_result(r: SweepResult) -> None:
    from rich.table import Table

    from specreg.registry.run_store import STATUS_OK

    out = console()
    out.print(f"sweep of {r.target_name}: {len(r.runs)} runs in {r.seconds:.0f} s ({r.grid})")
    table = Table("host", "config", "tok/s", "accept", "speedup", "run", "status", box=None)
    for run in sorted(r.runs, key=lambda x: (x.host_name or "", -(x.tokens_per_s or 0))):
        status = run.status if run.status == STATUS_OK else f"{run.status} ({run.error_kind})"
        table.add_row(
            run.host_name or (run.host_fingerprint or "-"), run.label,
            _fmt(run.tokens_per_s, ".1f"), _fmt(run.acceptance, ".0%"),
            _fmt(run.speedup, ".2f") + ("x" if run.speedup is not None else ""),
            str(run.run_id), status,
        )  # fmt: skip
    out.print(table)
    for fingerprint, best in r.best().items():
        where = best.host_name or fingerprint
        out.print(f"best on {where}: {best.label} ({_fmt(best.tokens_per_s, '.1f')} tok/s)")
    for host in r.hosts:
        if host.dropped:
            out.print(f"host {host.name} left the sweep: {host.dropped}")
    for label in r.not_run:
        out.print(f"not run (no host left for it): {label}")


COMMANDS = [sweep_cmd]
