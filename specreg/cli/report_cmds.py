"""`specreg report`: the static HTML site (overview, matrix, graph, targets, runs)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from specreg.cli.common import (
    build_option,
    console,
    db_option,
    host_facts_options,
    json_option,
    llama_rules,
    present,
    resolve_db,
    task_option,
)
from specreg.cli.progress import measuring

if TYPE_CHECKING:
    import duckdb

    from specreg.host.facts import HostQuery
    from specreg.reports.data import SiteResult
    from specreg.reports.gather import Advise


# The task the report recommends for unless --task says otherwise: `specreg recommend`'s default.
DEFAULT_TASK = "chat"


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
    "--recommend/--no-recommend",
    default=True,
    show_default=True,
    help="What to run on each target, as `specreg recommend` says (about 0.5 s per question).",
)
@task_option(help="The tasks to recommend for (repeatable; default: chat).")
@host_facts_options
@build_option
@db_option
@json_option
def report(**kw: Any) -> None:
    """Write a static HTML report of the registry that works offline (open index.html).

    Each target's page says what to run first (the recommendation for each --task, chat by
    default), then its drafts in the order `specreg drafts` ranks them.
    """
    import time

    started = time.perf_counter()  # the fit of the recommender counts too
    with measuring(as_json=kw["as_json"]):  # the recommender's fit, the first time
        result = _site(kw, started)
    present(result, kw["as_json"], _print_report)
    if kw["open_browser"]:
        from specreg.host.desktop import open_in_browser

        open_in_browser(result.index)


def _site(kw: dict[str, Any], started: float) -> SiteResult:
    """The site of the registry, checked by the same rules as `specreg audit`, each target
    with what `specreg recommend` says for each task (unless --no-recommend)."""
    from specreg.errors import UsageError
    from specreg.home import cache_dir, specreg_home
    from specreg.registry.db import opened
    from specreg.reports import build_site

    db = resolve_db(kw["db_path"])
    if not db.exists():
        raise UsageError(f"no registry at {db}: run `specreg scan DIR` first")
    rules = llama_rules(kw["llama_build"], kw["llama_bin"])
    with opened(db) as con:
        return build_site(
            con,
            kw["out_dir"] or specreg_home() / "report",
            cache=cache_dir() / "report",
            db_label=str(db),
            rules=rules,
            advise=_advise(con, kw["host_query"], kw["llama_bin"]) if kw["recommend"] else None,
            tasks=tuple(dict.fromkeys(kw["tasks"])) or (DEFAULT_TASK,),
            started=started,
        )


def _advise(
    con: duckdb.DuckDBPyConnection, host_query: HostQuery, llama_bin: Path | None
) -> Advise:
    """The recommender as `specreg recommend` sets it up: this host, its evidence, your build."""
    from specreg.cli.advice import report_advise, this_host, users_llama
    from specreg.recommender.advisor import open_advisor

    host, facts = this_host(host_query, con)
    return report_advise(open_advisor(con, facts), host, users_llama(llama_bin))


def _print_report(result: SiteResult) -> None:
    out = console()
    out.print(f"wrote {len(result.pages)} pages in {result.seconds:.2f} s: {result.index}")
    for part in result.parts:
        if part.note:
            out.print(f"  {part.part}: {part.note}")


COMMANDS = [report]
