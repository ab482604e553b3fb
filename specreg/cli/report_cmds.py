"""`specreg report`: the static HTML site (overview, matrix, graph, targets, runs)."""

from __future__ import annotations

from pathlib import Path

import click

from specreg.cli.audit_cmds import _rules, build_option
from specreg.cli.common import console, db_option, emit_json, json_option, resolve_db
from specreg.errors import UsageError
from specreg.home import cache_dir, specreg_home
from specreg.registry.db import opened
from specreg.reports import build_site


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
@build_option
@db_option
@json_option
def report(
    out_dir: Path | None,
    open_browser: bool,
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


def _summary(result: object) -> dict[str, object]:
    keys = ("out_dir", "pages", "n_models", "n_pairs", "n_runs", "n_plots", "seconds", "parts")
    return {k: getattr(result, k) for k in keys}


COMMANDS = [report]
