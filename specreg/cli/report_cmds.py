"""`specreg report`: the static HTML site (overview, matrix, graph, targets, runs)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import click
import duckdb

from specreg.cli.audit_cmds import _rules, build_option
from specreg.cli.common import console, db_option, emit_json, json_option, resolve_db
from specreg.cli.recommend_cmds import _commands, _host, _install
from specreg.errors import UsageError
from specreg.home import cache_dir, specreg_home
from specreg.recommender.local import local_observations
from specreg.recommender.prior import load_prior
from specreg.recommender.recommend import TASK_CHOICES
from specreg.recommender.recommend import recommend as recommend_fn
from specreg.recommender.train import cached_fit, load_trained
from specreg.registry.db import opened
from specreg.registry.queries import ModelRecord
from specreg.reports import build_site
from specreg.reports.gather import Advise


@click.command()
@click.option(
    "-o",
    "--output",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Folder for the site (default: $SPECREG_HOME/report).",
)
@click.option("--open", "open_browser", is_flag=True, help="Open the overview in a browser.")
@click.option(
    "--recommend",
    is_flag=True,
    help="Add the recommender's answer per target and task (about 0.5 s per question).",
)
@click.option(
    "--task",
    "tasks",
    type=click.Choice(TASK_CHOICES),
    multiple=True,
    help="With --recommend: only these tasks (repeatable; default: all).",
)
@click.option("--bandwidth", type=float, default=None, help="Memory bandwidth in GB/s.")
@build_option
@db_option
@json_option
def report(
    out_dir: Path | None,
    open_browser: bool,
    recommend: bool,
    tasks: tuple[str, ...],
    bandwidth: float | None,
    llama_build: int | None,
    llama_bin: Path | None,
    db_path: Path | None,
    as_json: bool,
) -> None:
    """Write a static HTML report of the registry that works offline (open index.html)."""
    db = resolve_db(db_path)
    if not db.exists():
        raise UsageError(f"no registry at {db}: run `specreg scan DIR` first")
    out = out_dir or specreg_home() / "report"
    with opened(db) as con:
        result = build_site(
            con,
            out,
            cache=cache_dir() / "report",
            db_label=str(db),
            rules=_rules(llama_build, llama_bin),  # the same rules as `specreg audit`
            advise=_advisor(con, bandwidth, llama_bin) if recommend else None,
            tasks=tasks or TASK_CHOICES,
        )
    if as_json:
        emit_json("report", {"index": result.index, **_summary(result)})
    else:
        out_c = console()
        out_c.print(f"wrote {len(result.pages)} pages in {result.seconds:.2f} s: {result.index}")
        for part in result.parts:
            if part.note:
                out_c.print(f"  {part.part}: {part.note}")
    if open_browser:
        click.launch(str(result.index))


def _advisor(
    con: duckdb.DuckDBPyConnection, bandwidth: float | None, llama_bin: Path | None
) -> Advise:
    """The recommender as `specreg recommend` sets it up: trained model, this host, your build."""
    host, facts = _host(bandwidth)
    local = local_observations(con, facts)
    trained = load_trained()
    model = trained[0] if trained else cached_fit(local)
    observations = [*load_prior().observations, *local]
    dialect, server = _install(llama_bin)

    def advise(con: duckdb.DuckDBPyConnection, target: ModelRecord, task: str) -> tuple[Any, str]:
        rec = recommend_fn(
            con, target.model_id or "", model=model, host=facts, task=task,
            observations=observations,
        )  # fmt: skip
        best_only = dataclasses.replace(rec, options=rec.options[:1])
        return rec, _commands(best_only, host, dialect, server)[0] or ""

    return advise


def _summary(result: object) -> dict[str, object]:
    keys = ("out_dir", "pages", "n_models", "n_pairs", "n_runs", "n_plots", "seconds", "parts")
    return {k: getattr(result, k) for k in keys}


COMMANDS = [report]
