"""`specreg compat`, `drafts`, `audit`, `graph export`: what goes with what."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from specreg.cli.common import (
    FILE,
    MODEL,
    console,
    db_option,
    json_option,
    json_text,
    present,
    resolve_db,
    rules_option,
    write_output,
)
from specreg.errors import EXIT_FINDINGS
from specreg.text import clip, shell_join

if TYPE_CHECKING:
    from specreg.auditor import AuditResult, DraftList, PairSummary, PairVerdict, Severity
    from specreg.auditor.rules import RuleSet


def _exit_findings() -> None:
    raise click.exceptions.Exit(EXIT_FINDINGS)


@click.command()
@click.argument("target", type=MODEL)
@click.argument("draft", type=MODEL)
@rules_option
@db_option
@json_option
def compat(target: str, draft: str, rules: RuleSet, db_path: Path | None, as_json: bool) -> None:
    """Will DRAFT speculate for TARGET with llama.cpp, and if not, exactly why.

    Models by path, name or id. Exit 0 if compatible (warnings allowed), 1 if llama.cpp refuses
    the pair or it is risky at run time, or DRAFT is not a draft (TARGET itself, or as large).
    """
    from specreg.auditor import check_pair
    from specreg.registry.db import opened

    with opened(resolve_db(db_path), read_only=True) as con:
        pv = check_pair(con, target, draft, rules)
    present(pv, as_json, _print_verdict)
    if not pv.compatible or pv.not_a_draft:
        _exit_findings()


def _mark(passed: bool, severity: Severity) -> str:
    from specreg.auditor import Severity

    if passed:
        return "ok"
    marks = {Severity.BLOCKS: "FAIL", Severity.RISK: "RISK", Severity.WARNS: "warn"}
    return marks.get(severity, "info")


def _print_verdict(pv: PairVerdict) -> None:
    from rich.table import Table

    out = console()
    draft, target = clip(pv.draft.label), clip(pv.target.label)
    if pv.not_a_draft:
        out.print(f"not a draft: {draft} for {target}: {pv.not_a_draft}")
    else:
        out.print(f"{pv.verdict.text}: {draft} as draft for {target}")
    if pv.same_model:
        out.print(
            f"note: TARGET and DRAFT are the same file ({pv.target.model_id[:10]}, "
            f"{clip(pv.target.path)}): a model drafting for itself only adds work"
        )
    if pv.not_a_draft:
        out.print(f"llama.cpp's own check alone: {pv.verdict.text}")
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
        out.print("flags: " + shell_join(pv.flags))


@click.command()
@click.argument("target", type=MODEL)
@click.option("--rejected", is_flag=True, help="Also list the refused drafts and why.")
@rules_option
@db_option
@json_option
def drafts(
    target: str, rejected: bool, rules: RuleSet, db_path: Path | None, as_json: bool
) -> None:
    """Drafts in the registry for TARGET, best first (verdict, then size).

    Models as large as TARGET or larger are listed apart: they are no drafts.
    """
    from specreg.auditor import drafts_for
    from specreg.registry.db import opened

    with opened(resolve_db(db_path), read_only=True) as con:
        found = drafts_for(con, target, rules, include_rejected=rejected)
    present(found, as_json, _print_drafts)


def _print_drafts(found: DraftList) -> None:
    from specreg.auditor import Verdict
    from specreg.cli.tables import Column, fitted_table, model_cell, short_id
    from specreg.registry.quality_store import agreement_cell

    out = console()
    if found.draftless:
        out.print(f"without a draft: {found.spec_type_flag} " + " | ".join(found.draftless))
    if not found.drafts:
        out.print("no compatible draft in the registry (--rejected shows why)")
        _print_not_drafts(found)
        return
    ranked = found.drafts
    whys = [
        "; ".join(pv.reasons if pv.verdict is not Verdict.WARNINGS else pv.warnings)
        for pv in ranked
    ]
    cols = [
        Column("#", [str(i) for i in range(1, len(ranked) + 1)], justify="right"),
        Column("id", [short_id(pv.draft.model_id) for pv in ranked]),
        Column(
            "draft / file",
            [model_cell(pv.draft.label, pv.draft.path) for pv in ranked],
            flexible=True,
        ),
        Column("verdict", [pv.verdict.text for pv in ranked], wrap=True, min_width=10),
        Column(
            "agreement",
            [agreement_cell(found.agreement.get(pv.draft.model_id, {})) for pv in ranked],
        ),
        Column("why / warnings", whys, wrap=True, min_width=16),
    ]
    table, _ = fitted_table(cols, out.width)
    out.print(table)
    _print_not_drafts(found)


def _print_not_drafts(found: DraftList) -> None:
    """Models llama.cpp would take as drafts but as large as the target: apart, never ranked."""
    if not found.not_drafts:
        return
    out = console()
    out.print("not drafts (as large as the target or larger, so they cannot make it faster):")
    for n in found.not_drafts:
        out.print(f"  {n.pair.draft.model_id[:10]} {clip(n.pair.draft.label)}: {n.why}")


@click.command()
@click.option(
    "--fail-on-findings",
    is_flag=True,
    help="Exit 1 if a pair passes llama.cpp's check but is risky at run time.",
)
@rules_option
@db_option
@json_option
def audit(fail_on_findings: bool, rules: RuleSet, db_path: Path | None, as_json: bool) -> None:
    """Audit every ordered pair of the registry and save the verdicts (the graph's edges)."""
    from specreg.auditor import audit_and_save
    from specreg.registry.db import opened

    with opened(resolve_db(db_path)) as con:
        result, _ = audit_and_save(con, rules)
    present(result, as_json, _print_audit)
    if fail_on_findings and result.findings:
        _exit_findings()


# `audit` names at most this many pairs on a terminal; --json lists every one.
AUDIT_PAIRS_SHOWN = 60


def _print_audit(result: AuditResult) -> None:
    from specreg.auditor import Verdict

    out = console()
    out.print(
        f"audit {result.audit_id}: {result.n_models} models, {result.n_pairs} ordered pairs in "
        f"{result.seconds:.2f} s (llama.cpp {result.rules_label}); a pair is a (target, draft) "
        "of two models, every model with every other both ways, draft heads as targets included"
    )
    for verdict in Verdict:
        out.print(f"  {verdict.text}: {result.counts.get(verdict.value, 0)}")
    for name, n in sorted(result.refusals.items(), key=lambda kv: -kv[1]):
        out.print(f"  refused by {name}: {n}")
    _print_accepted(result)
    if result.findings:
        out.print(
            f"{len(result.findings)} pairs pass llama.cpp's check but are risky; "
            "see `specreg compat TARGET DRAFT`"
        )


def _print_accepted(result: AuditResult) -> None:
    """The pairs llama.cpp accepts, by name: target, draft, verdict and what it found."""
    from specreg.cli.tables import Column, fitted_table, model_cell

    accepted = result.accepted
    if not accepted:
        return
    out = console()
    shown = accepted[:AUDIT_PAIRS_SHOWN]
    out.print(
        f"pairs llama.cpp accepts ({len(accepted)}; `specreg compat TARGET DRAFT` explains one):"
    )
    cols = [
        Column(
            "target",
            [model_cell(result.name(p.target_id), model_id=p.target_id) for p in shown],
            flexible=True,
        ),
        Column(
            "draft",
            [model_cell(result.name(p.draft_id), model_id=p.draft_id) for p in shown],
            flexible=True,
        ),
        Column("verdict: findings", [_pair_verdict(p) for p in shown], wrap=True, min_width=10),
    ]
    table, _ = fitted_table(cols, out.width)
    out.print(table)
    if len(accepted) > len(shown):
        out.print(f"... and {len(accepted) - len(shown)} more: --json lists every pair")


def _pair_verdict(pair: PairSummary) -> str:
    """A pair's verdict in a word, then the checks that found something."""
    from specreg.auditor import Verdict

    word = {Verdict.WARNINGS: "warnings", Verdict.RISKY: "risky"}.get(pair.verdict)
    if word is None:
        return pair.verdict.text
    return f"{word}: {', '.join(pair.findings)}" if pair.findings else word


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
    type=FILE,
    default=None,
    help="Write to this file instead of stdout.",
)
@db_option
def graph_export(fmt: str, output: Path | None, db_path: Path | None) -> None:
    """Export the graph of the latest saved audit (auditing now if a scan came after it)."""
    from specreg.auditor import current_graph
    from specreg.auditor.graph import json_document, to_graphml
    from specreg.registry.db import opened

    with opened(resolve_db(db_path)) as con:
        g = current_graph(con)
    text = to_graphml(g) if fmt == "graphml" else json_text(json_document(g))
    if output:
        output.write_text(text + "\n", encoding="utf-8")
    else:
        write_output(text)


COMMANDS = [compat, drafts, audit, graph]
