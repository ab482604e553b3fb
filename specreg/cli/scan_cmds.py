"""`specreg scan`, `models`, `show`, `demo`: what is on disk."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import click
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from specreg.cli.common import (
    console,
    db_option,
    emit_json,
    err_console,
    json_option,
    resolve_db,
)
from specreg.registry import queries
from specreg.registry.db import opened
from specreg.registry.scan import ScanResult, scan_paths

_PARAM_UNITS = {"K": 1e3, "M": 1e6, "B": 1e9, "T": 1e12}


def _parse_params(text: str | None) -> int | None:
    if text is None:
        return None
    text = text.strip().upper()
    try:
        if text[-1] in _PARAM_UNITS:
            return int(float(text[:-1]) * _PARAM_UNITS[text[-1]])
        return int(float(text))
    except (ValueError, IndexError):
        raise click.BadParameter(f"'{text}' is not a parameter count like 500M or 32B") from None


@click.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--all-files", is_flag=True, help="Also check files without a .gguf name by magic.")
@click.option("-v", "--verbose", is_flag=True, help="List every new, changed and removed file.")
@db_option
@json_option
def scan(
    paths: tuple[Path, ...], all_files: bool, verbose: bool, db_path: Path | None, as_json: bool
) -> None:
    """Read GGUF headers under PATHS into the registry (incremental).

    Exit 1 if any file could not be read; the rest is recorded all the same.
    """
    with opened(resolve_db(db_path)) as con:
        if as_json:
            result = scan_paths(con, paths, all_files=all_files)
        else:
            result = _scan_with_progress(con, paths, all_files)
    if as_json:
        emit_json("scan", dataclasses.asdict(result))
    else:
        _print_scan(result, verbose)
    if not result.ok:
        raise click.exceptions.Exit(1)


def _scan_with_progress(con, paths, all_files) -> ScanResult:  # type: ignore[no-untyped-def]
    progress = Progress(
        TextColumn("reading headers"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err_console(),
        transient=True,
    )
    task = None

    def on_progress(done: int, total: int, _path: str) -> None:
        nonlocal task
        if total < 20:  # not worth a bar
            return
        if task is None:
            progress.start()
            task = progress.add_task("scan", total=total)
        progress.update(task, completed=done)

    try:
        return scan_paths(con, paths, all_files=all_files, progress=on_progress)
    finally:
        if task is not None:
            progress.stop()


def _print_scan(r: ScanResult, verbose: bool) -> None:
    out = console()
    table = Table(title=f"scan {r.scan_id} ({r.seconds:.2f} s)", show_header=True)
    for col in ("models", "files", "new", "changed", "unchanged", "removed", "errors"):
        table.add_column(col, justify="right")
    table.add_row(
        str(r.n_models),
        str(r.n_files),
        str(len(r.new)),
        str(len(r.changed)),
        str(r.n_unchanged),
        str(len(r.removed)),
        str(len(r.errors)),
    )
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
@click.option("--min-params", help="At least this many parameters (e.g. 7B).")
@click.option("--max-params", help="At most this many parameters (e.g. 1.5B; drafts).")
@click.option("--name", help="Substring of the name or path.")
@click.option(
    "--role",
    type=click.Choice(["draft", "target"]),
    help="draft: up to 4B parameters or a draft head; target: everything larger.",
)
@click.option("--all", "include_gone", is_flag=True, help="Include models whose files are gone.")
@db_option
@json_option
def models(
    architecture: str | None,
    tokenizer: str | None,
    min_params: str | None,
    max_params: str | None,
    name: str | None,
    role: str | None,
    include_gone: bool,
    db_path: Path | None,
    as_json: bool,
) -> None:
    """List models in the registry."""
    with opened(resolve_db(db_path)) as con:
        rows = queries.list_models(
            con,
            architecture=architecture,
            tokenizer=tokenizer,
            min_params=_parse_params(min_params),
            max_params=_parse_params(max_params),
            include_gone=include_gone,
            name=name,
            role=role,
        )
    if as_json:
        emit_json("models", {"models": [dataclasses.asdict(m) for m in rows]})
        return
    table = Table(show_header=True, header_style="bold")
    for col in ("id", "name", "arch", "params", "quant", "size", "tokenizer", "vocab", "status"):
        table.add_column(col)
    for m in rows:
        table.add_row(
            m.model_id[:10],
            m.display_name,
            m.architecture or "?",
            m.params_str,
            m.quant or "?",
            m.size_str,
            f"{m.tok_model or '-'}/{m.tok_pre or '-'} {(m.tok_fingerprint or '')[:8]}",
            str(m.n_tokens or "-"),
            m.status,
        )
    console().print(table)
    console().print(f"{len(rows)} model(s)")


@click.command()
@click.argument("model")
@db_option
@json_option
def show(model: str, db_path: Path | None, as_json: bool) -> None:
    """Every fact about MODEL (a path, an id prefix, or a name)."""
    with opened(resolve_db(db_path)) as con:
        record = queries.resolve_model(con, model)
        kv = queries.model_kv(con, record.model_id)
        files = queries.model_files(con, record.model_id)
    if as_json:
        emit_json(
            "model",
            {
                "model": dataclasses.asdict(record),
                "files": files,
                "kv": [{"key": k, "type": t, "value": v} for k, t, v in kv],
            },
        )
        return
    out = console()
    facts = Table(title=record.display_name, show_header=False)
    facts.add_column("fact", style="bold")
    facts.add_column("value")
    for field in dataclasses.fields(record):
        value = getattr(record, field.name)
        if field.name == "n_bytes":
            value = f"{value} ({record.size_str})"
        elif field.name == "n_params":
            value = f"{value} ({record.params_str})"
        facts.add_row(field.name, "" if value is None else str(value))
    out.print(facts)
    keys = Table(title="GGUF key/values", show_header=True)
    keys.add_column("key")
    keys.add_column("type")
    keys.add_column("value", overflow="fold")
    for k, t, v in kv:
        text = str(v)
        keys.add_row(k, t, text if len(text) <= 200 else text[:200] + "...")
    out.print(keys)


@click.command()
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def demo(directory: Path, as_json: bool) -> None:
    """Write a demo model tree of sparse GGUFs (about 530 GB apparent, under 50 MB on disk)."""
    from specreg.registry.demo import make_demo_tree

    made = make_demo_tree(directory)
    if as_json:
        emit_json("demo", {"directory": str(directory), "files": [str(p) for p in made]})
        return
    total = sum(p.stat().st_size for p in made if p.exists() and not p.is_symlink())
    console().print(
        f"wrote {len(made)} files under {directory} ({queries.human_bytes(total)} apparent); "
        f"next: specreg scan {directory}"
    )


COMMANDS = [scan, models, show, demo]
