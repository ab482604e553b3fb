"""`specreg scan`, `models`, `show`, `demo`: what is on disk."""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from specreg.cli.common import (
    MODEL,
    PARAM_COUNT,
    console,
    db_option,
    emit,
    err_console,
    json_option,
    present,
    resolve_db,
)
from specreg.text import FIELD_LIMIT, clip, shell_join

if TYPE_CHECKING:
    import duckdb

    from specreg.registry.queries import ModelDetails, ModelRecord
    from specreg.registry.scan import ScanResult
    from specreg.samples.demo import DemoTree


@click.command()
@click.argument("paths", nargs=-1, type=click.Path(path_type=Path))
@click.option("--all-files", is_flag=True, help="Also check files without a .gguf name by magic.")
@click.option("-v", "--verbose", is_flag=True, help="List every new, changed and removed file.")
@db_option
@json_option
def scan(
    paths: tuple[Path, ...], all_files: bool, verbose: bool, db_path: Path | None, as_json: bool
) -> None:
    """Read GGUF headers under PATHS into the registry (incremental). Without PATHS, the model
    stores found here: LM Studio's, the Hugging Face cache, llama.cpp's cache and Ollama's
    (its blobs by magic), each named on stderr.

    Exit 1 if any file could not be read; the rest is recorded all the same.
    """
    from specreg.registry.db import opened

    by_magic: tuple[Path, ...] = ()
    if not paths:
        paths, by_magic = _stores(quiet=as_json)
    with opened(resolve_db(db_path)) as con:
        result = _scan(con, paths, all_files, by_magic, progress=not as_json)
    present(result, as_json, functools.partial(_print_scan, verbose=verbose))
    if not result.ok:
        raise click.exceptions.Exit(1)


def _stores(*, quiet: bool) -> tuple[tuple[Path, ...], tuple[Path, ...]]:
    """The model stores on this machine to scan, and those read by magic; each said on stderr
    (unless `quiet`), none found a usage error that says where specreg looked."""
    from specreg.errors import UsageError
    from specreg.registry.stores import found_stores, where_stores_live

    stores = found_stores()
    if not stores:
        raise UsageError(
            f"no PATH given and no model store here ({where_stores_live()}): give the folders "
            "or .gguf files to scan, e.g. `specreg scan ~/models`"
        )
    if not quiet:
        err = err_console()
        for s in stores:
            err.print(f"scanning {s.label}" + (", its blobs by magic" if s.by_magic else ""))
    return tuple(s.path for s in stores), tuple(s.path for s in stores if s.by_magic)


def _scan(
    con: duckdb.DuckDBPyConnection,
    paths: tuple[Path, ...],
    all_files: bool,
    by_magic: tuple[Path, ...] = (),
    *,
    progress: bool,
) -> ScanResult:
    """`scan_paths` with a progress bar on stderr once there are enough files to wait for
    (rich's progress module is loaded only then)."""
    from specreg.registry.scan import scan_paths

    if not progress:
        return scan_paths(con, paths, all_files=all_files, by_magic=by_magic)
    bar: Any = None
    task: Any = None

    def on_progress(done: int, total: int, _path: str) -> None:
        nonlocal bar, task
        if total < 20:  # not worth a bar
            return
        if bar is None:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
            )

            columns = (TextColumn("reading headers"), BarColumn(), MofNCompleteColumn())
            bar = Progress(*columns, TimeElapsedColumn(), console=err_console(), transient=True)
            bar.start()
            task = bar.add_task("scan", total=total)
        bar.update(task, completed=done)

    try:
        return scan_paths(con, paths, all_files=all_files, progress=on_progress, by_magic=by_magic)
    finally:
        if bar is not None:
            bar.stop()


def _print_scan(r: ScanResult, verbose: bool) -> None:
    from rich.table import Table

    out = console()
    table = Table(title=f"scan {r.scan_id} ({r.seconds:.2f} s)", show_header=True)
    for col in ("models", "files", "new", "changed", "unchanged", "removed", "errors"):
        table.add_column(col, justify="right")
    counts = (r.n_models, r.n_files, len(r.new), len(r.changed), r.n_unchanged, len(r.removed))
    table.add_row(*map(str, counts), str(len(r.errors)))
    out.print(table)
    limit = None if verbose else 5
    for label, items in (("new", r.new), ("changed", r.changed), ("removed", r.removed)):
        for path in items[:limit]:
            out.print(f"{label}: {path}")
        if limit is not None and len(items) > limit:
            out.print(f"... and {len(items) - limit} more {label} (-v lists all)")
    for path, same_as in r.duplicates:
        out.print(f"  duplicate {path} (same GGUF as {same_as})")
    if r.errors:
        out.print(f"{len(r.errors)} problem(s); the rest of the scan was recorded:")
        for e in r.errors:
            out.print(f"{e.kind}: {e.path}: {e.reason}")


@click.command()
@click.option("--arch", "architecture", help="Only this general.architecture (e.g. qwen2).")
@click.option("--tokenizer", help="Tokenizer model (gpt2, llama), pre-tokenizer, or fingerprint.")
@click.option("--min-params", type=PARAM_COUNT, help="At least this many parameters (e.g. 7B).")
@click.option("--max-params", type=PARAM_COUNT, help="At most this many parameters (e.g. 1.5B).")
@click.option("--name", help="Substring of the name or path.")
@click.option(
    "--role",
    type=click.Choice(["draft", "target"]),
    help="draft: up to 4B parameters or a draft head; target: everything larger.",
)
@click.option("--all", "include_gone", is_flag=True, help="Include models whose files are gone.")
@db_option
@json_option
def models(db_path: Path | None, as_json: bool, **filters: object) -> None:
    """List models in the registry."""
    from specreg.registry.db import opened
    from specreg.registry.queries import ModelList, list_models

    with opened(resolve_db(db_path), read_only=True) as con:
        found = ModelList(tuple(list_models(con, **filters)))  # type: ignore[arg-type]
    if as_json:
        emit(found)
    else:
        _print_models(found.models)


def _print_models(rows: tuple[ModelRecord, ...]) -> None:
    from specreg.cli.tables import Column, fitted_table, left_out_note, model_cell, short_id

    cols = [
        Column("id", [short_id(m.model_id) for m in rows]),
        Column("name / file", [model_cell(m.display_name, m.path) for m in rows], flexible=True),
        Column("arch", [clip(m.architecture or "?", 16) for m in rows], drop=3),
        Column("params", [m.params_str for m in rows], justify="right"),
        Column("quant", [m.quant or "?" for m in rows]),
        Column("size", [m.size_str for m in rows], justify="right"),
        Column(
            "tokenizer",
            [
                clip(f"{m.tok_model or '-'}/{m.tok_pre or '-'}", 24)
                + f" {(m.tok_fingerprint or '')[:8]}"
                for m in rows
            ],
            drop=1,
        ),
        Column("vocab", [str(m.n_tokens or "-") for m in rows], justify="right", drop=2),
        Column("status", [m.status for m in rows]),
    ]
    out = console()
    table, dropped = fitted_table(cols, out.width)
    out.print(table)
    out.print(f"{len(rows)} model(s)")
    if note := left_out_note(dropped):
        out.print(note)


@click.command()
@click.argument("model", type=MODEL)
@click.option("--full", is_flag=True, help="Whole values, however long (default: cut for reading).")
@db_option
@json_option
def show(model: str, full: bool, db_path: Path | None, as_json: bool) -> None:
    """Every fact about MODEL (a path, an id prefix, or a name)."""
    from specreg.registry.db import opened
    from specreg.registry.queries import model_details

    with opened(resolve_db(db_path), read_only=True) as con:
        details = model_details(con, model)
    if as_json:
        emit(details)
    else:
        _print_details(details, full)


# How much of one GGUF value `show` prints without --full (templates run to kilobytes).
KV_LIMIT = 200
# Facts shown whole even without --full: file paths, bounded by the OS (and the console's
# own limit), which a user copies.
WHOLE_FIELDS = ("path", "paths", "parts_missing")


def _print_details(d: ModelDetails, full: bool) -> None:
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    field_limit, kv_limit = (None, None) if full else (FIELD_LIMIT, KV_LIMIT)
    record = d.model
    out = console(full=full)
    facts = Table(title=clip(record.display_name, field_limit), show_header=False)
    facts.add_column("fact", style="bold")
    facts.add_column("value", overflow="fold")
    cut = False
    for field in dataclasses.fields(record):
        value = getattr(record, field.name)
        if field.name in WHOLE_FIELDS:  # a path is what a user copies: never cut, one a line
            lines = value if isinstance(value, tuple) else (value,)
            facts.add_row(field.name, Group(*(Text(str(v), overflow="fold") for v in lines)))
            continue
        cut = cut or len(str(value)) > FIELD_LIMIT
        if field.name == "n_bytes":
            value = f"{value} ({record.size_str})"
        elif field.name == "n_params":
            value = f"{value} ({record.params_str})"
        facts.add_row(field.name, "" if value is None else clip(str(value), field_limit))
    out.print(facts)
    keys = Table(title="GGUF key/values", show_header=True)
    keys.add_column("key", overflow="fold")
    keys.add_column("type")
    keys.add_column("value", overflow="fold")
    for kv in d.kv:
        cut = cut or len(str(kv.value)) > KV_LIMIT
        keys.add_row(clip(kv.key, field_limit), kv.type, clip(str(kv.value), kv_limit))
    out.print(keys)
    if cut and not full:
        out.print("long values are cut for reading: --full shows them whole, --json exactly")


@click.command()
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
@click.option("--force", is_flag=True, help="Write into a folder that holds other files too.")
@json_option
def demo(directory: Path, force: bool, as_json: bool) -> None:
    """Write a demo model tree of sparse GGUFs (about 530 GB apparent, under 50 MB on disk).

    DIRECTORY must be new, empty or an earlier demo (exit 2 otherwise, unless --force).
    """
    from specreg.samples.demo import DemoTree, make_demo_tree

    present(
        DemoTree(directory, tuple(make_demo_tree(directory, force=force))), as_json, _print_demo
    )


def _print_demo(tree: DemoTree) -> None:
    from specreg.registry.queries import human_bytes

    made = tree.files
    total = sum(p.stat().st_size for p in made if p.exists() and not p.is_symlink())
    console().print(
        f"wrote {len(made)} files under {tree.directory} ({human_bytes(total)} apparent); "
        f"next: {shell_join(['specreg', 'scan', tree.directory])}"
    )


COMMANDS = [scan, models, show, demo]
