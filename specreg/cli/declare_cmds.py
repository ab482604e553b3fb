"""`specreg plan`, `import`, `propose`, `apply`, `export`, `init`: specreg.yaml, kept true."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import click

from specreg.cli.common import (
    FILE,
    F,
    console,
    db_option,
    emit_document,
    json_option,
    present,
    resolve_db,
    write_output,
)
from specreg.declare import DIALECT_CURRENT, DIALECT_LEGACY, EXPORT_FORMATS, SPEC_FILENAME
from specreg.errors import UsageError
from specreg.text import shell_join

if TYPE_CHECKING:
    from specreg.declare.importer import ImportResult
    from specreg.declare.plan import Plan


def spec_option(func: F) -> F:
    return click.option(
        "--spec",
        "spec_path",
        type=FILE,
        default=Path(SPEC_FILENAME),
        show_default=True,
        help="The declaration file.",
    )(func)


def out_option(help_text: str) -> Callable[[F], F]:
    return click.option(
        "-o",
        "--out",
        type=FILE,
        default=None,
        help=help_text,
    )


@click.command()
@spec_option
@click.option("--scan", "rescan", is_flag=True, help="Rescan the declared roots and stores first.")
@db_option
@json_option
def plan(spec_path: Path, rescan: bool, db_path: Path | None, as_json: bool) -> None:
    """Show how disk and measurements differ from specreg.yaml. Changes nothing.

    Exit 0 when they agree, 1 on drift, 2 when specreg.yaml is invalid.
    """
    from specreg.declare.plan import make_plan
    from specreg.declare.spec import load_spec
    from specreg.declare.stores import rescan_declared
    from specreg.registry.db import opened

    spec, _ = load_spec(spec_path)
    with opened(resolve_db(db_path), read_only=not rescan) as con:
        if rescan:
            rescan_declared(con, spec)
        result = make_plan(con, spec)
    present(result, as_json, _print_plan)
    if result.drift:
        raise click.exceptions.Exit(1)


def _print_plan(result: Plan) -> None:
    from rich.table import Table

    out = console()
    if not result.findings:
        out.print(f"no drift: {result.n_declared} models and {result.n_roles} roles as declared")
        return
    table = Table("kind", "subject", "finding", "declared at")
    for f in result.findings:
        table.add_row(f.kind, f.subject, f.message, str(f.where) if f.where else "")
    out.print(table)
    out.print(
        f"{len(result.findings)} difference(s); edit specreg.yaml or run "
        "`specreg propose` for measured improvements"
    )


@click.command("import")
@click.argument("source", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@spec_option
@click.option(
    "--base-path",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Resolve relative model paths here instead of runtime_defaults.model_base_path.",
)
@click.option("--force", is_flag=True, help="Overwrite an existing specreg.yaml.")
@db_option
@json_option
def import_(
    source: Path,
    spec_path: Path,
    base_path: Path | None,
    force: bool,
    db_path: Path | None,
    as_json: bool,
) -> None:
    """Read an orchestrator-style model_registry.yaml into specreg.yaml.

    Every entry that could not be mapped is listed with the reason.
    """
    from specreg.declare.importer import import_to_spec
    from specreg.registry.db import opened

    with opened(resolve_db(db_path)) as con:
        result = import_to_spec(con, source, spec_path, base_path=base_path, force=force)
    present(result, as_json, _print_import)


def _print_import(result: ImportResult) -> None:
    from rich.table import Table

    out = console()
    out.print(
        f"wrote {result.spec_path}: {result.n_models} models, {result.n_roles} roles, "
        f"{len(result.mapped)} entries mapped"
    )
    if result.unmapped:
        table = Table("source entry", "line", "not mapped because")
        for e in result.unmapped:
            table.add_row(e.key, str(e.line or ""), e.note)
        out.print(table)
        out.print(f"{len(result.unmapped)} entries not mapped (listed above)")


@click.command()
@spec_option
@out_option("Proposal file (default: specreg-proposal.yaml next to specreg.yaml).")
@click.option(
    "--adopt", is_flag=True, help="Also declare the models on disk specreg.yaml does not declare."
)
@db_option
def propose(spec_path: Path, out: Path | None, adopt: bool, db_path: Path | None) -> None:
    """Write a reviewable patch to specreg.yaml from measured runs; applies nothing."""
    from specreg.declare.propose import make_proposal
    from specreg.registry.db import opened

    with opened(resolve_db(db_path), read_only=True) as con:
        proposal = make_proposal(con, spec_path, adopt=adopt)
    c = console()
    if not proposal.changes:
        c.print("nothing to propose: no measured run beats a pinned configuration")
        if proposal.n_undeclared:
            c.print(
                f"{proposal.n_undeclared} model(s) on disk are not declared: "
                f"`{shell_join(['specreg', 'propose', '--adopt', '--spec', spec_path])}` "
                "writes their declarations"
            )
        return
    out = out or spec_path.with_name("specreg-proposal.yaml")
    out.write_text(proposal.to_yaml(), encoding="utf-8")
    for change in proposal.changes:
        c.print(f"{change.key}: {change.why}")
    c.print(f"wrote {out}; review it, then `{shell_join(['specreg', 'apply', out])}`")


@click.command()
@click.argument("proposal", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--spec",
    "spec_path",
    type=FILE,
    default=None,
    help="The declaration file (default: the one named in the proposal).",
)
def apply(proposal: Path, spec_path: Path | None) -> None:
    """Apply a proposal written by `specreg propose` to specreg.yaml (comments are kept)."""
    from specreg.declare.propose import apply_proposal

    applied = apply_proposal(proposal, spec_path)
    c = console()
    for key in applied.keys:
        c.print(f"updated {key}")
    c.print(f"wrote {applied.spec_path}")


@click.command()
@click.option("--format", "fmt", type=click.Choice(EXPORT_FORMATS), required=True)
@spec_option
@click.option(
    "--dialect",
    type=click.Choice([DIALECT_CURRENT, DIALECT_LEGACY]),
    default=None,
    help="llama.cpp flag dialect (default: llama.dialect, else asked from the binary).",
)
@click.option("--role", "roles", multiple=True, help="Only these roles (repeatable).")
@out_option("Write here instead of stdout.")
@db_option
@json_option
def export(
    fmt: str,
    spec_path: Path,
    dialect: str | None,
    roles: tuple[str, ...],
    out: Path | None,
    db_path: Path | None,
    as_json: bool,
) -> None:
    """Launch configurations per role, the final argv and every flag's origin."""
    from specreg.declare.export import port_for, render
    from specreg.declare.launch import build
    from specreg.declare.spec import load_spec
    from specreg.registry.db import opened

    spec, _ = load_spec(spec_path)
    if not spec.roles:
        raise UsageError(
            f"{spec_path} declares no roles, so there is nothing to export: add one (a target "
            "and its configs), or write a new file with `specreg init --spec NEW.yaml`, which "
            "gives each target its best draft"
        )
    with opened(resolve_db(db_path), read_only=True) as con:
        launches = build(con, spec, dialect=dialect, port=port_for(fmt), roles=roles)
    if as_json:
        emit_document(launches.to_json(fmt))
        return
    text = render(launches, fmt)
    if out is None:
        write_output(text)
        return
    out.write_text(text, encoding="utf-8")
    n, skipped = len(launches.launches), len(launches.skipped)
    console().print(f"wrote {out} ({n} launch configurations, {skipped} skipped)")


@click.command()
@spec_option
@db_option
def init(spec_path: Path, db_path: Path | None) -> None:
    """Write a commented specreg.yaml to start from: the registry's models, the folders and
    stores its scans read, and a role for each target with the draft `specreg drafts` ranks
    first."""
    from specreg.declare.deps import best_drafts, list_models, scanned_roots
    from specreg.declare.spec import load_spec
    from specreg.declare.templates import init_template
    from specreg.registry.db import opened

    if spec_path.exists():
        raise UsageError(f"{spec_path} exists; edit it, or pass --spec NEW.yaml")
    db = resolve_db(db_path)
    text = init_template([])
    if db.exists():
        with opened(db, read_only=True) as con:
            text = init_template(list_models(con), scanned_roots(con), best_drafts(con))
    spec_path.write_text(text, encoding="utf-8")
    spec, _ = load_spec(spec_path)  # what init writes must validate
    if not spec.models:
        console().print(f"wrote {spec_path}")
        return
    roots = len(spec.roots) + len(spec.stores)
    console().print(
        f"wrote {spec_path}, declaring the registry's {len(spec.models)} model(s), "
        f"{roots} folder(s) or store(s) to scan and {len(spec.roles)} role(s), each target "
        "with its best draft; `specreg plan` shows what changes from here, `specreg export` "
        "how to run them"
    )


COMMANDS = [plan, import_, propose, apply, export, init]
