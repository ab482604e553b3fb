"""`specreg sweep`: every point of a grid measured, here or on the hosts of a Ray cluster."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from specreg.cli.common import (
    MODEL,
    POSITIVE,
    console,
    db_option,
    emit,
    err_console,
    json_option,
    llama_bin_option,
    n_predict_option,
    repeats_option,
    resolve_db,
    resolve_model_path,
    startup_timeout_option,
    task_option,
    threads_option,
)
from specreg.cli.progress import load_options, load_policy, measuring
from specreg.errors import RunFailed

if TYPE_CHECKING:
    from specreg.tune.jobs import Outcome
    from specreg.tune.sweep import SweepPlan, SweepResult


@click.command("sweep")
@click.argument("target", type=MODEL)
@click.option(
    "--grid",
    "grids",
    multiple=True,
    required=True,
    metavar="'AXIS=V,V ...'",
    help="Axes spec= (a stack as ngram-mod+draft-simple), k= (2,4 or 2..8 or 4..32:4), draft= "
    "(models), experts=; the points are their product, plain decoding always included. "
    "Example: --grid 'spec=none,ngram-mod,draft-simple k=2,4 draft=MODEL'.",
)
@task_option
@click.option(
    "--prompts",
    "prompts_file",
    type=click.Path(dir_okay=False, path_type=Path),
    help='Your own prompts, JSONL lines like {"id": "a", "prompt": "..."}.',
)
@click.option("--max-prompts", type=POSITIVE, default=None, help="Use only the first N prompts.")
@n_predict_option
@repeats_option
@click.option(
    "--retries",
    type=click.IntRange(min=0),
    default=2,
    show_default=True,
    help="Measure a sample again up to N times when other processes took CPU.",
)
@threads_option(help="llama.cpp threads per run (default: physical cores).")
@startup_timeout_option
@click.option(
    "--ray",
    "ray_address",
    metavar="ADDRESS",
    default=None,
    help="Send each run to the hosts of this Ray cluster (HOST:PORT of its head), one run at a "
    "time per host; needs pip install 'specreg[ray]'.",
)
@click.option(
    "--host",
    "hosts",
    multiple=True,
    metavar="NAME",
    help="Only this Ray host (by its specreg-host:NAME resource); repeatable.",
)
@click.option(
    "--retry-elsewhere",
    is_flag=True,
    help="A run whose Ray host died under it runs again on another host.",
)
@click.option("--dry-run", is_flag=True, help="List the points and run nothing.")
@llama_bin_option(
    help="Folder with llama-server for runs on this machine (Ray hosts use their own)."
)
@load_options
@db_option
@json_option
def sweep_cmd(target: str, **kw: Any) -> None:
    """Measure every point of a grid of configurations of TARGET and record each run: on this
    machine one after another, or with --ray on the hosts of a Ray cluster, where each host
    runs one measurement at a time and every run comes back with its host's fingerprint.

    A host is a Ray node started with the resources
    '{"specreg_host": 1, "specreg-host:NAME": 1}'.

    Exit 1 if a point has no successful run (every failed run is recorded, with the reason).
    """
    from specreg.host.machine import detect_host
    from specreg.llama.config import Config
    from specreg.registry.db import opened
    from specreg.runner.runs import registry_at
    from specreg.runner.workload import load_workload
    from specreg.tune.distributed import sweep_hosts
    from specreg.tune.sweep import parse_grid, plan_sweep, sweep

    if kw["ray_address"] is not None and not kw["dry_run"]:
        from specreg.tune.distributed import import_ray

        import_ray()  # before any model is scanned: one line on how to get Ray
    grid = parse_grid(kw["grids"])
    tasks = tuple(dict.fromkeys(kw["tasks"])) or ("code",)
    workload = load_workload(tasks, kw["prompts_file"]).head(kw["max_prompts"])
    db = resolve_db(kw["db_path"])
    with opened(db) as con:
        p = plan_sweep(
            con, resolve_model_path(con, target), grid, workload, resolve=resolve_model_path,
            base=Config(threads=kw["threads"]), n_predict=kw["n_predict"], repeats=kw["repeats"],
            task=",".join(tasks) if kw["prompts_file"] is None else "custom",
            contention_retries=kw["retries"], startup_timeout=kw["timeout"],
        )  # fmt: skip
        policy = load_policy(
            con, detect_host().fingerprint, allow_load=kw["allow_load"], load_wait=kw["load_wait"]
        )
    if kw["dry_run"]:
        return emit(p) if kw["as_json"] else _print_plan(p)
    with sweep_hosts(
        kw["ray_address"], kw["hosts"], llama_bin=kw["llama_bin"],
        retry_elsewhere=kw["retry_elsewhere"],
    ) as where, measuring(policy, as_json=kw["as_json"]):  # fmt: skip
        # the registry is open only while a run is written: other commands read it meanwhile
        result = sweep(
            registry_at(db), p, where, retry_elsewhere=kw["retry_elsewhere"],
            ray_address=kw["ray_address"], on_run=None if kw["as_json"] else _print_step,
        )  # fmt: skip
    emit(result) if kw["as_json"] else _print_result(result)
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
