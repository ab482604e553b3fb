"""`specreg compat`, `drafts`, `audit`, `graph export`: what goes with what."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import click
from rich.table import Table

import specreg.auditor as auditor
from specreg.auditor.graph import dumps_json, to_graphml
from specreg.auditor.pairs import draftless_modes
from specreg.auditor.rules import REFERENCE_HOST_RULES
from specreg.auditor.verdict import PairVerdict, Severity, Verdict
from specreg.cli.common import console, db_option, emit_json, json_option, resolve_db
from specreg.errors import EXIT_FINDINGS
from specreg.registry.db import opened
from specreg.registry.quality import agreement_by_draft, agreement_json, agreement_str
from specreg.registry.queries import resolve_model
from specreg.runner.llama import DIALECT_DRAFT_MAX, ENV_LLAMA_BIN, find_llama


def build_option(func):  # type: ignore[no-untyped-def]
    func = click.option(
        "--llama-bin",
        type=click.Path(file_okay=False, path_type=Path),
        default=None,
        help="Apply the rules of the llama.cpp build in this folder (also $SPECREG_LLAMA_BIN).",
    )(func)
    return click.option(
        "--llama-build",
        type=int,
        default=None,
        help="Apply the rules of this llama.cpp build number (default: the pinned build).",
    )(func)


def _rules(llama_build: int | None, llama_bin: Path | None) -> auditor.RuleSet:
    """The rules of the user's llama.cpp when specreg knows its build, else the pinned ones."""
    if llama_build is not None:
        return auditor.rules_for_build(llama_build)
    if llama_bin is None and not os.environ.get(ENV_LLAMA_BIN):
        return auditor.PINNED_RULES
    install = find_llama(llama_bin)
    number = re.match(r"(\d+)", install.version)
    if number and int(number.group(1)):
        return auditor.rules_for_build(int(number.group(1)))
    # An unnumbered build: its flag dialect still dates it.
    if install.dialect == DIALECT_DRAFT_MAX:
        return auditor.rules_for_build(REFERENCE_HOST_RULES.since_build)
    return auditor.PINNED_RULES


def _exit_findings() -> None:
    raise click.exceptions.Exit(EXIT_FINDINGS)


def _mark(passed: bool, severity: Severity) -> str:
    if passed:
        return "ok"
    return {Severity.BLOCKS: "FAIL", Severity.RISK: "RISK", Severity.WARNS: "warn"}.get(
        severity, "info"
    )


def _print_verdict(pv: PairVerdict) -> None:
    out = console()
    out.print(f"{pv.verdict.text}: {pv.draft.label} as draft for {pv.target.label}")
    out.print(f"rules: llama.cpp {pv.rules_label}")
    table = Table(show_header=True, header_style="bold")
    for col in ("check", "result", "evidence"):
        table.add_column(col)
    for c in pv.checks:
        table.add_row(c.name, _mark(c.passed, c.severity), c.message)
    out.print(table)
    for remedy in pv.remedies:
        out.print(f"remedy: {remedy}")
    if pv.flags:
        out.print("flags: " + " ".join(pv.flags))


@click.command()
@click.argument("target")
@click.argument("draft")
@build_option
@db_option
@json_option
def compat(
    target: str,
    draft: str,
    llama_build: int | None,
    llama_bin: Path | None,
    db_path: Path | None,
    as_json: bool,
) -> None:
    """Will DRAFT speculate for TARGET with llama.cpp, and if not, exactly why.

    Models by path, name or id. Exit 0 if compatible (warnings allowed), 1 if llama.cpp refuses
    the pair or it is risky at run time.
    """
    with opened(resolve_db(db_path), read_only=True) as con:
        pv = auditor.check_pair(con, target, draft, _rules(llama_build, llama_bin))
    if as_json:
        emit_json("compat", pv.as_dict())
    else:
        _print_verdict(pv)
    if not pv.compatible:
        _exit_findings()


@click.command()
@click.argument("target")
@click.option("--rejected", is_flag=True, help="Also list the refused drafts and why.")
@build_option
@db_option
@json_option
def drafts(
    target: str,
    rejected: bool,
    llama_build: int | None,
    llama_bin: Path | None,
    db_path: Path | None,
    as_json: bool,
) -> None:
    """Drafts in the registry for TARGET, best first (verdict, then size)."""
    rules = _rules(llama_build, llama_bin)
    with opened(resolve_db(db_path), read_only=True) as con:
        model = resolve_model(con, target)
        found = auditor.compatible_drafts(con, model, rules, include_rejected=rejected)
        agreement = agreement_by_draft(con, model.model_id)  # `specreg agree`
    draftless = draftless_modes(model, rules)
    if as_json:
        emit_json(
            "drafts",
            {
                "target": target,
                "draftless": list(draftless),
                "drafts": [
                    {**pv.as_dict(), "agreement": agreement_json(agreement.get(pv.draft.model_id))}
                    for pv in found
                ],
            },
        )
        return
    if draftless:
        flag = rules.spec_type_flag or "--spec-type"
        console().print(f"without a draft: {flag} " + " | ".join(draftless))
    if not found:
        console().print("no compatible draft in the registry (--rejected shows why)")
        return
    table = Table(show_header=True, header_style="bold")
    for col in ("draft", "verdict", "agreement", "why / warnings", "path"):
        table.add_column(col)
    for pv in found:
        why = "; ".join(pv.reasons if pv.verdict is not Verdict.WARNINGS else pv.warnings)
        agree = agreement_str(agreement.get(pv.draft.model_id))
        table.add_row(pv.draft.label, pv.verdict.text, agree, why, pv.draft.path)
    console().print(table)


@click.command()
@click.option(
    "--fail-on-findings",
    is_flag=True,
    help="Exit 1 if a pair passes llama.cpp's check but is risky at run time.",
)
@build_option
@db_option
@json_option
def audit(
    fail_on_findings: bool,
    llama_build: int | None,
    llama_bin: Path | None,
    db_path: Path | None,
    as_json: bool,
) -> None:
    """Audit every ordered pair of the registry and save the verdicts (the graph's edges)."""
    with opened(resolve_db(db_path)) as con:
        result, audit_id = auditor.audit_and_save(con, _rules(llama_build, llama_bin))
    findings = result.findings
    if as_json:
        emit_json(
            "audit",
            {
                "audit_id": audit_id,
                "rules": result.rules_label,
                "llama_build": result.llama_build,
                "n_models": result.n_models,
                "n_pairs": result.n_pairs,
                "counts": result.counts,
                "refusals": result.refusals,
                "seconds": result.seconds,
                "pairs": [
                    {
                        "target": p.target_id,
                        "draft": p.draft_id,
                        "verdict": p.verdict.value,
                        "compatible": p.verdict in (Verdict.COMPATIBLE, Verdict.WARNINGS),
                        "findings": list(p.findings),
                    }
                    for p in result.pairs
                ],
            },
        )
    else:
        out = console()
        out.print(
            f"audit {audit_id}: {result.n_models} models, {result.n_pairs} ordered pairs in "
            f"{result.seconds:.2f} s (llama.cpp {result.rules_label})"
        )
        for verdict in Verdict:
            out.print(f"  {verdict.text}: {result.counts.get(verdict.value, 0)}")
        for name, n in sorted(result.refusals.items(), key=lambda kv: -kv[1]):
            out.print(f"  refused by {name}: {n}")
        if findings:
            out.print(
                f"{len(findings)} pairs pass llama.cpp's check but are risky; "
                "see `specreg compat TARGET DRAFT`"
            )
    if fail_on_findings and findings:
        _exit_findings()


@click.group()
def graph() -> None:
    """The compatibility graph of the registry."""


@graph.command("export")
@click.option(
    "--format", "fmt", type=click.Choice(["graphml", "json"]), default="json", show_default=True
)
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write to this file instead of stdout.",
)
@db_option
def graph_export(fmt: str, output: Path | None, db_path: Path | None) -> None:
    """Export the graph of the latest saved audit (auditing now if a scan came after it)."""
    with opened(resolve_db(db_path)) as con:
        g = auditor.stored_graph(con)
        if g is None:
            auditor.audit_and_save(con)
            g = auditor.stored_graph(con)
    assert g is not None
    text = to_graphml(g) if fmt == "graphml" else dumps_json(g)
    if output:
        output.write_text(text + "\n")
    else:
        sys.stdout.write(text + "\n")


COMMANDS = [compat, drafts, audit, graph]
