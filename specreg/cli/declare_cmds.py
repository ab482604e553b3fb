"""`specreg plan`, `import`, `propose`, `apply`, `export`, `init`: specreg.yaml, kept true."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import click
from rich.table import Table

from specreg.cli.common import F, console, db_option, emit_json, json_option, resolve_db
from specreg.declare import export as export_mod
from specreg.declare.importer import import_registry
from specreg.declare.launch import DIALECT_CURRENT, DIALECT_LEGACY, build
from specreg.declare.plan import make_plan
from specreg.declare.propose import apply_proposal, make_proposal
from specreg.declare.spec import SPEC_FILENAME, load_spec, write_yaml
from specreg.declare.stores import rescan_declared
from specreg.declare.templates import INIT_TEMPLATE
from specreg.errors import UsageError
from specreg.registry.db import opened


def spec_option(func: F) -> F:
    return click.option(
        "--spec",
        "spec_path",
        type=click.Path(dir_okay=False, path_type=Path),
        default=Path(SPEC_FILENAME),
        show_default=True,
        help="The declaration file.",
    )(func)


def out_option(help_text: str) -> Callable[[F], F]:
    return click.option(
        "-o",
        "--out",
        type=click.Path(dir_okay=False, path_type=Path),
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
    spec, _ = load_spec(spec_path)
    with opened(resolve_db(db_path)) as con:
        if rescan:
            rescan_declared(con, spec)
        result = make_plan(con, spec)
    if as_json:
        emit_json("plan", {"drift": result.drift, **dataclasses.asdict(result)})
    elif not result.findings:
        click.echo(f"no drift: {result.n_declared} models and {result.n_roles} roles as declared")
    else:
        table = Table("kind", "subject", "finding", "declared at")
        for f in result.findings:
            table.add_row(f.kind, f.subject, f.message, str(f.where) if f.where else "")
        console().print(table)
        click.echo(
            f"{len(result.findings)} difference(s); edit specreg.yaml or run "
            "`specreg propose` for measured improvements"
        )
    if result.drift:
        raise click.exceptions.Exit(1)


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
    if spec_path.exists() and not force:
        raise UsageError(f"{spec_path} exists: pass --force to replace it, or --spec NEW.yaml")
    with opened(resolve_db(db_path)) as con:
        result = import_registry(con, source, spec_path, base_path=base_path)
    write_yaml(spec_path, result.doc)
    if as_json:
        emit_json(
            "import",
            {
                "source": result.source,
                "spec": spec_path,
                "models": result.n_models,
                "roles": result.n_roles,
                "mapped": [dataclasses.asdict(e) for e in result.mapped],
                "unmapped": [dataclasses.asdict(e) for e in result.unmapped],
            },
        )
        return
    click.echo(
        f"wrote {spec_path}: {result.n_models} models, {result.n_roles} roles, "
        f"{len(result.mapped)} entries mapped"
    )
    if result.unmapped:
        table = Table("source entry", "line", "not mapped because")
        for e in result.unmapped:
            table.add_row(e.key, str(e.line or ""), e.note)
        console().print(table)
        click.echo(f"{len(result.unmapped)} entries not mapped (listed above)")


@click.command()
@spec_option
@out_option("Proposal file (default: specreg-proposal.yaml next to specreg.yaml).")
@db_option
def propose(spec_path: Path, out: Path | None, db_path: Path | None) -> None:
    """Write a reviewable patch to specreg.yaml from measured runs; applies nothing."""
    with opened(resolve_db(db_path)) as con:
        proposal = make_proposal(con, spec_path)
    if not proposal.changes:
        click.echo("nothing to propose: no measured run beats a pinned configuration")
        return
    out = out or spec_path.with_name("specreg-proposal.yaml")
    out.write_text(proposal.to_yaml(), encoding="utf-8")
    for c in proposal.changes:
        click.echo(f"{c.key}: {c.why}")
    click.echo(f"wrote {out}; review it, then `specreg apply {out}`")


@click.command()
@click.argument("proposal", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--spec",
    "spec_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="The declaration file (default: the one named in the proposal).",
)
def apply(proposal: Path, spec_path: Path | None) -> None:
    """Apply a proposal written by `specreg propose` to specreg.yaml (comments are kept)."""
    applied = apply_proposal(proposal, spec_path)
    for key in applied.keys:
        click.echo(f"updated {key}")
    click.echo(f"wrote {applied.spec_path}")


@click.command()
@click.option("--format", "fmt", type=click.Choice(export_mod.FORMATS), required=True)
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
    spec, _ = load_spec(spec_path)
    port = "${PORT}" if fmt == "llama-swap" else None if fmt == "models-preset" else "8080"
    with opened(resolve_db(db_path)) as con:
        launch_plan = build(con, spec, dialect=dialect, port=port, roles=roles)
    if as_json:
        emit_json(
            "export",
            {
                "format": fmt,
                "dialect": launch_plan.dialect,
                "dialect_origin": launch_plan.dialect_origin,
                "launches": [
                    {
                        "role": x.role,
                        "task": x.task,
                        "argv": x.argv,
                        "flags": [dataclasses.asdict(f) for f in (*x.prefix, *x.flags)],
                    }
                    for x in launch_plan.launches
                ],
                "skipped": [dataclasses.asdict(s) for s in launch_plan.skipped],
            },
        )
        return
    text = export_mod.render(launch_plan, fmt)
    if out is not None:
        out.write_text(text, encoding="utf-8")
        click.echo(
            f"wrote {out} ({len(launch_plan.launches)} launch configurations, "
            f"{len(launch_plan.skipped)} skipped)"
        )
    else:
        click.echo(text, nl=False)


@click.command()
@spec_option
def init(spec_path: Path) -> None:
    """Write a commented specreg.yaml skeleton to start from."""
    if spec_path.exists():
        raise UsageError(f"{spec_path} exists; edit it, or pass --spec NEW.yaml")
    spec_path.write_text(INIT_TEMPLATE, encoding="utf-8")
    load_spec(spec_path)  # the template itself must validate
    click.echo(f"wrote {spec_path}")


COMMANDS = [plan, import_, propose, apply, export, init]
