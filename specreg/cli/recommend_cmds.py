"""`specreg recommend`, `train` and `tune`: what to run, and finding out for sure."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from specreg.cli.common import (
    FILE,
    MODEL,
    POSITIVE,
    SPEC_STACK,
    TEMPERATURE,
    FiniteFloat,
    console,
    db_option,
    emit_document,
    err_console,
    host_facts_options,
    json_option,
    llama_bin_option,
    option_group,
    option_stack,
    present,
    resolve_db,
    settings_options,
    task_option,
)
from specreg.cli.progress import measuring
from specreg.terms import POLICIES, POLICY_QUALITY
from specreg.text import clip

if TYPE_CHECKING:
    from rich.table import Table

    from specreg.host.facts import HostFacts, HostQuery
    from specreg.recommender.evaluate import CVReport
    from specreg.recommender.recommend import Option, Recommendation
    from specreg.recommender.train import TrainSummary
    from specreg.runner.settings import Settings
    from specreg.tune.distributed import Cluster
    from specreg.tune.tuner import TuneRequest, TuneResult, TuneStep


_common = option_stack(
    task_option(multiple=False, default="chat", help="The task to predict for."),
    click.option(
        "--policy",
        type=click.Choice(POLICIES),
        default=POLICY_QUALITY,
        show_default=True,
        help="quality: lossless knobs only; speed: may change outputs (fewer experts).",
    ),
    click.option(
        "--spec-type",
        type=SPEC_STACK,
        default=None,
        help="Only this speculative type or stack (e.g. ngram-mod,draft-simple), listed "
        "against plain decoding whether or not it is predicted to win.",
    ),
    host_facts_options,
    llama_bin_option(help="Folder with llama-server, for commands in its flag dialect."),
    db_option,
    json_option,
)


def _kld_budget(max_kld: float | None, role: str | None, spec_path: Path) -> float | None:
    """--max-kld, else the role's `max_kld` in specreg.yaml."""
    if max_kld is not None or role is None:
        return max_kld
    from specreg.declare.spec import load_spec

    return load_spec(spec_path)[0].role(role).max_kld


@click.command("recommend")
@click.argument("target", type=MODEL)
@_common
@click.option("--temp", type=TEMPERATURE, default=0.0, show_default=True, help="Your temperature.")
@click.option("--top", type=POSITIVE, default=5, show_default=True, help="Options to show.")
@click.option(
    "--max-kld", type=FiniteFloat(), default=None,
    help="Quality budget: leave out lossy options whose mean KL divergence (measured by "
    "`specreg quality`, else predicted) is above it.",
)  # fmt: skip
@click.option("--role", default=None, help="Take the quality budget (max_kld) of this role.")
@click.option(
    "--spec", "spec_path", type=FILE,
    default=Path("specreg.yaml"), show_default=True, help="The declaration file for --role.",
)  # fmt: skip
def recommend_cmd(target: str, top: int, **kw: Any) -> None:
    """Rank configurations for TARGET: predicted t/s and speedup band, command, why.

    Acceptance is measured agreement (`specreg agree`) for draft pairs without runs; under
    --policy speed each lossy option shows its quality cost (`specreg quality`, or predicted).
    --host-facts, --cores, --bandwidth and --memory ask about another host (an EPYC from a
    laptop).
    """
    with measuring(as_json=kw["as_json"]):  # the first call on a registry fits the model
        rec, commands = _recommend(
            kw["db_path"], target, kw["host_query"], kw["llama_bin"], top, task=kw["task"],
            policy=kw["policy"], temperature=kw["temp"], spec_type=kw["spec_type"],
            max_kld=_kld_budget(kw["max_kld"], kw["role"], kw["spec_path"]),
        )  # fmt: skip
    if kw["as_json"]:
        emit_document(rec.to_json(commands, top))
    else:
        _print_recommendation(rec, commands, top)


def _recommend(
    db_path: Path | None,
    target: str,
    host_query: HostQuery,
    llama_bin: Path | None,
    top: int | None = None,
    **kwargs: Any,
) -> tuple[Recommendation, tuple[str, ...]]:
    """The recommendation for `target` on the host asked about, and the command lines of its
    first `top` options (recommend, tune --dry-run)."""
    from specreg.cli.advice import command_lines, this_host, users_llama
    from specreg.recommender.advisor import open_advisor
    from specreg.registry.db import opened
    from specreg.registry.queries import resolve_model

    with opened(resolve_db(db_path)) as con:
        resolve_model(con, target)  # an unknown target fails before the model is fitted
        host, facts = this_host(host_query, con)
        rec = open_advisor(con, facts).recommend(con, target, **kwargs)
    return rec, command_lines(rec, host, users_llama(llama_bin), top)


def _options_table(options: Sequence[Option], speed: bool, width: int) -> Table:
    """The ranked options, fitted to `width`: the draft's id whole, its name and file cut."""
    from specreg.cli.tables import Column, Lines, fitted_table, model_cell

    def config(o: Option) -> Lines:
        if not o.draft_name:
            return Lines([o.label], wrap_first=True)
        first = o.label.replace(f" {o.draft_name}", "", 1)
        return model_cell(o.draft_name, o.draft_path, first=first, model_id=o.draft_id)

    def tps(o: Option) -> Lines:
        ran = [f"ran {o.measured_tps:.1f} x{o.n_measured}"] if o.measured_tps else []
        return Lines([f"{o.tps:.1f}", f"[{o.tps_lo:.1f}-{o.tps_hi:.1f}]", *ran])

    def output(o: Option) -> str:
        if o.lossless:
            return "lossless"
        # the cost without its basis, which the best option's why lines give
        return "changed" + (f": {o.quality.label.split(' (')[0]}" if speed and o.quality else "")

    cols = [
        Column("#", [str(i) for i in range(1, len(options) + 1)], justify="right"),
        Column("configuration / draft", [config(o) for o in options], flexible=True),
        Column("t/s [80%]", [tps(o) for o in options]),
        Column(
            "speedup",
            [Lines([o.speedup_str.split(" ")[0], o.speedup_str.split(" ")[1]]) for o in options],
        ),
        Column(
            "acceptance",
            [
                f"{o.acceptance:.0%} {o.acceptance_source}" if o.acceptance is not None else "-"
                for o in options
            ],
            wrap=True,
            min_width=10,
        ),
        Column("output", [output(o) for o in options], wrap=True, min_width=16),
    ]
    table, _ = fitted_table(cols, width)
    return table


def _print_recommendation(rec: Recommendation, commands: Sequence[str], top: int) -> None:
    c = console()
    c.print(f"{clip(rec.target_name)}  task={rec.task}  policy={rec.policy}")
    c.print(rec.roofline.line)
    _print_host(rec.host)
    c.print(rec.figures_line)
    table = _options_table(rec.options[:top], rec.policy == "speed", c.width)
    c.print(table)
    best = rec.best
    c.print("do not speculate" if not rec.speculate else f"run: {clip(best.label)}")
    c.print(f"  {commands[0]}")
    for line in best.why:
        c.print(f"  why: {line}")
    for e in best.evidence:
        sp = f", {e.speedup:.2f}x" if e.speedup else ""
        c.print(f"  evidence: {e.row_id} ({e.source}): {e.summary}: {e.tps:.1f} t/s{sp}")
    for line in rec.advice:
        c.print(f"note: {line}")


def _print_host(facts: HostFacts) -> None:
    """The host predicted for: its cores, bandwidth and memory, each with its source."""
    c = console()
    c.print(f"host: {facts.cores_str}, {facts.bandwidth_str}, {facts.mem_str}")
    if facts.note:
        c.print(f"  ({facts.note})")


@click.command("train")
@click.option("--no-cv", is_flag=True, help="Skip the grouped cross-validation.")
@host_facts_options
@db_option
@json_option
def train_cmd(no_cv: bool, host_query: HostQuery, db_path: Path | None, as_json: bool) -> None:
    """Refit the speed model on the shipped prior and this host's runs; print CV error."""
    from specreg.cli.advice import this_host
    from specreg.recommender.local import local_observations, other_host_observations
    from specreg.recommender.train import train
    from specreg.registry.db import opened

    with opened(resolve_db(db_path), read_only=True) as con:
        host, facts = this_host(host_query, con)
        local = [*local_observations(con, facts), *other_host_observations(con, facts)]
    _, summary, report = train(local, host=host.fingerprint, with_cv=not no_cv)
    present(summary, as_json, functools.partial(_print_train, report=report))


def _print_train(summary: TrainSummary, report: CVReport | None) -> None:
    c = console()
    c.print(f"trained on {summary.n_prior} prior rows and {summary.n_local} local runs")
    if report is not None:
        c.print(
            f"grouped CV by target ({report.n_folds} folds, {len(report.series)} K sweeps): "
            f"picked K within 10% of the best for {report.k_within_tolerance:.0%} "
            f"(rule of thumb {report.rule_within_tolerance:.0%}); speedup MAPE "
            f"{report.speedup_mape_draft:.0%} on draft runs, {report.speedup_mape:.0%} on all; "
            f"80% band covers {report.coverage:.0%}"
        )


def _tune_cluster(given: dict[str, Any]) -> Cluster:
    from specreg.tune.distributed import Cluster

    name = given["ray_host"]
    return Cluster(given["ray_address"], (name,) if name else ())


@click.command("tune")
@click.argument("target", type=MODEL)
@_common
@click.option("--budget", type=POSITIVE, default=6, show_default=True, help="Most runs to spend.")
@settings_options(
    "n_predict", "repeats", "load",
    repeats={"default": 2, "help": "Timed samples of each prompt in each run."},
)  # fmt: skip
@option_group(
    "cluster",
    _tune_cluster,
    click.option(
        "--ray",
        "ray_address",
        metavar="ADDRESS",
        default=None,
        help="Tune for a host of this Ray cluster: every run measured there, recorded here "
        "(pip install 'specreg[ray]').",
    ),
    click.option("--host", "ray_host", metavar="NAME", default=None, help="That Ray host's name."),
)
@click.option(
    "--dry-run",
    is_flag=True,
    help="Print the runs tune would start with (each measuring as predicted) and their "
    "commands, for this host or the one --host-facts/--cores describe; run nothing.",
)
def tune_cmd(target: str, settings: Settings, cluster: Cluster, **kw: Any) -> None:
    """Measure the most promising configurations of TARGET until the best is confirmed.

    TARGET is a path, an id prefix or a name. With --ray the runs happen on one host of a Ray
    cluster (--host NAME when it has several) and the answer is for that host.
    """
    from specreg.tune.tuner import TuneRequest, tune_target

    request = TuneRequest(target, kw["task"], kw["policy"], kw["spec_type"], kw["budget"])
    if kw["dry_run"]:
        return _dry_run(request, cluster, kw)
    with measuring(as_json=kw["as_json"]):
        result = tune_target(
            resolve_db(kw["db_path"]), request, settings, cluster=cluster,
            host_query=kw["host_query"], llama_bin=kw["llama_bin"],
            on_step=None if kw["as_json"] else _print_step,
        )  # fmt: skip
    present(result, kw["as_json"], _print_tune)


def _dry_run(request: TuneRequest, cluster: Cluster, kw: dict[str, Any]) -> None:
    """tune --dry-run: for this host or the host facts given, never a Ray host."""
    from specreg.errors import UsageError

    if cluster.address is not None or cluster.hosts:
        raise UsageError("--dry-run plans for this host or the host facts given, not --ray")
    with measuring(as_json=kw["as_json"]):
        rec, commands = _recommend(
            kw["db_path"], request.target, kw["host_query"], kw["llama_bin"],
            task=request.task, policy=request.policy, spec_type=request.spec_type,
        )  # fmt: skip
    if kw["as_json"]:
        emit_document(rec.to_json(commands))
    else:
        _print_plan(rec, commands, request.budget)


def _print_plan(rec: Recommendation, commands: Sequence[str], budget: int) -> None:
    """tune --dry-run: the runs tune would spend first, were each to measure what it predicts
    (tune's own choice of the next run), with their commands; nothing runs."""
    from specreg.tune.tuner import TuneStep, next_option

    steps: list[TuneStep] = []
    while len(steps) < budget:
        choice, why = next_option(rec.options, steps)
        if choice is None:
            break
        steps.append(TuneStep(choice, choice.tps, None, why))
    c = console()
    c.print(f"{clip(rec.target_name)}: tune would start with {len(steps)} of {budget} runs")
    _print_host(rec.host)
    for i, s in enumerate(steps, start=1):
        c.print(f"{i}. {clip(s.label)}: predicted {s.option.tps:.1f} t/s ({s.reason})")
        c.print(f"   {commands[rec.options.index(s.option)]}")
    if rec.memory_advice:
        c.print(f"note: {rec.memory_advice}")


def _print_step(step: TuneStep) -> None:
    got = f"{step.measured_tps:.1f} t/s" if step.measured_tps else "failed"
    err_console().print(
        f"  {clip(step.label)}: predicted {step.option.tps:.1f}, measured {got} ({step.reason})"
    )


def _print_tune(r: TuneResult) -> None:
    c = console()
    best = r.best
    name = clip(r.target_name)
    c.print(f"{name}: {r.n_runs} runs of {r.n_candidates} candidates ({r.stop_reason})")
    if best is not None and best.measured_tps:
        base = r.baseline_tps
        sp = f" = {best.measured_tps / base:.2f}x plain" if base else ""
        state = "confirmed" if r.confirmed else "not confirmed (budget spent)"
        c.print(f"best: {clip(best.label)}: {best.measured_tps:.1f} t/s{sp}, {state}")
    if r.pick_reason:
        c.print(f"pick: {clip(r.pick_reason)}")


COMMANDS = [recommend_cmd, train_cmd, tune_cmd]
