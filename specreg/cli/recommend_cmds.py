"""`specreg recommend`, `train` and `tune`: what to run, and finding out for sure."""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from rich.table import Table

from specreg.cli.common import console, db_option, emit_json, err_console, json_option, resolve_db
from specreg.errors import LlamaError
from specreg.recommender.host import HostFacts, detect_host_facts
from specreg.recommender.local import local_observations
from specreg.recommender.prior import load_prior
from specreg.recommender.recommend import POLICIES, TASK_CHOICES, Recommendation, recommend
from specreg.recommender.train import cached_fit, load_trained, train
from specreg.registry.db import opened
from specreg.registry.queries import resolve_model
from specreg.runner.host import Host, detect_host
from specreg.runner.llama import DIALECT_SPEC_TYPE, find_llama
from specreg.runner.tune import TuneResult, TuneStep, llama_runner, option_command, tune
from specreg.runner.workload import load_workload

F = Callable[..., Any]


def _common(func: F) -> F:
    options: list[Callable[[F], F]] = [
        click.option("--task", type=click.Choice(TASK_CHOICES), default="chat", show_default=True),
        click.option(
            "--policy",
            type=click.Choice(POLICIES),
            default="quality",
            show_default=True,
            help="quality: lossless knobs only; speed: may change outputs (fewer experts).",
        ),
        click.option(
            "--bandwidth",
            type=float,
            default=None,
            help="Memory bandwidth in GB/s (default: a cached copy benchmark, an estimate).",
        ),
        click.option(
            "--llama-bin",
            type=click.Path(file_okay=False, path_type=Path),
            default=None,
            help="Folder with llama-server, for commands in its flag dialect.",
        ),
        db_option,
        json_option,
    ]
    for option in reversed(options):
        func = option(func)
    return func


def _host(bandwidth: float | None) -> tuple[Host, HostFacts]:
    host = detect_host()
    return host, detect_host_facts(bandwidth, fingerprint=host.fingerprint)


def _install(llama_bin: Path | None) -> tuple[str, str]:
    """(dialect, server path) of the user's build; the pinned build's dialect if none found."""
    try:
        install = find_llama(llama_bin)
    except LlamaError:
        return DIALECT_SPEC_TYPE, "llama-server"
    return install.dialect, str(install.server)


def _commands(rec: Recommendation, host: Host, dialect: str, server: str) -> list[str | None]:
    out: list[str | None] = []
    for o in rec.options:
        try:
            out.append(shlex.join(option_command(o, rec.target_path, dialect, host, server)))
        except Exception as err:  # noqa: BLE001 - e.g. a method this build's dialect lacks
            out.append(f"# not available with this llama.cpp: {err}")
    return out


def _kld_budget(max_kld: float | None, role: str | None, spec_path: Path) -> float | None:
    """--max-kld, else the role's `max_kld` in specreg.yaml."""
    if max_kld is not None or role is None:
        return max_kld
    from specreg.declare.spec import load_spec
    from specreg.errors import UsageError

    spec, _ = load_spec(spec_path)
    found = next((r for r in spec.roles if r.name == role), None)
    if found is None:
        names = ", ".join(r.name for r in spec.roles) or "none"
        raise UsageError(f"no role {role!r} in {spec_path} (roles: {names})")
    return found.max_kld


@click.command("recommend")
@click.argument("target")
@_common
@click.option("--temp", type=float, default=0.0, show_default=True, help="Your temperature.")
@click.option("--top", type=int, default=5, show_default=True, help="Options to show.")
@click.option(
    "--max-kld", type=float, default=None,
    help="Quality budget: leave out lossy options whose mean KL divergence (measured by "
    "`specreg quality`, else predicted) is above it.",
)  # fmt: skip
@click.option("--role", default=None, help="Take the quality budget (max_kld) of this role.")
@click.option(
    "--spec", "spec_path", type=click.Path(dir_okay=False, path_type=Path),
    default=Path("specreg.yaml"), show_default=True, help="The declaration file for --role.",
)  # fmt: skip
def recommend_cmd(
    target: str,
    task: str,
    policy: str,
    bandwidth: float | None,
    llama_bin: Path | None,
    db_path: Path | None,
    as_json: bool,
    temp: float,
    top: int,
    max_kld: float | None,
    role: str | None,
    spec_path: Path,
) -> None:
    """Rank configurations for TARGET: predicted t/s and speedup band, command, why.

    Acceptance is measured agreement (`specreg agree`) for draft pairs without runs; under
    --policy speed each lossy option shows its quality cost (`specreg quality`, or predicted).
    """
    host, facts = _host(bandwidth)
    budget = _kld_budget(max_kld, role, spec_path)
    with opened(resolve_db(db_path)) as con:
        resolve_model(con, target)  # an unknown target fails before the model is fitted
        local = local_observations(con, facts)
        trained = load_trained()
        model = trained[0] if trained else cached_fit(local)
        rec = recommend(
            con, target, model=model, host=facts, task=task, policy=policy,
            temperature=temp, observations=[*load_prior().observations, *local], max_kld=budget,
        )  # fmt: skip
    commands = _commands(rec, host, *_install(llama_bin))
    if as_json:
        doc = dataclasses.asdict(rec)
        doc["options"] = [
            {**dataclasses.asdict(o), "lossless": o.lossless, "command": cmd}
            for o, cmd in zip(rec.options[:top], commands, strict=False)
        ]
        doc["n_options"] = len(rec.options)
        doc["roofline"]["fraction"] = rec.roofline.fraction
        emit_json("recommendation", doc)
        return
    _print_recommendation(rec, commands, top)


def _print_recommendation(rec: Recommendation, commands: list[str | None], top: int) -> None:
    c = console()
    c.print(f"{rec.target_name}  task={rec.task}  policy={rec.policy}")
    c.print(rec.roofline.line)
    table = Table(show_edge=False)
    cols = ["#", "configuration", "t/s [80% band]", "speedup", "acceptance", "knobs", "measured"]
    if rec.policy == "speed":
        cols.append("quality cost")
    for col in cols:
        table.add_column(col)
    for i, o in enumerate(rec.options[:top], start=1):
        row = [
            str(i),
            o.label,
            f"{o.tps:.1f} [{o.tps_lo:.1f}-{o.tps_hi:.1f}]",
            o.speedup_str,
            f"{o.acceptance:.0%} {o.acceptance_source}" if o.acceptance is not None else "-",
            "lossless" if o.lossless else "behaviour-changing",
            f"{o.measured_tps:.1f} x{o.n_measured}" if o.measured_tps else "-",
        ]
        if rec.policy == "speed":
            row.append(o.quality.label if o.quality else "-")
        table.add_row(*row)
    c.print(table)
    best = rec.best
    c.print("do not speculate" if not rec.speculate else f"run: {best.label}")
    c.print(f"  {commands[0]}")
    for line in best.why:
        c.print(f"  why: {line}")
    for e in best.evidence:
        sp = f", {e.speedup:.2f}x" if e.speedup else ""
        c.print(f"  evidence: {e.row_id} ({e.source}): {e.summary}: {e.tps:.1f} t/s{sp}")
    for line in rec.advice:
        c.print(f"note: {line}")


@click.command("train")
@click.option("--no-cv", is_flag=True, help="Skip the grouped cross-validation.")
@click.option("--bandwidth", type=float, default=None, help="Memory bandwidth in GB/s.")
@db_option
@json_option
def train_cmd(no_cv: bool, bandwidth: float | None, db_path: Path | None, as_json: bool) -> None:
    """Refit the speed model on the shipped prior and this host's runs; print CV error."""
    host, facts = _host(bandwidth)
    with opened(resolve_db(db_path)) as con:
        local = local_observations(con, facts)
    _, summary, report = train(local, host=host.fingerprint, with_cv=not no_cv)
    if as_json:
        emit_json("train", {"summary": summary})
        return
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


@click.command("tune")
@click.argument("target", type=click.Path(dir_okay=False, path_type=Path))
@_common
@click.option("--budget", type=int, default=6, show_default=True, help="Most runs to spend.")
@click.option("--n-predict", type=int, default=64, show_default=True)
@click.option("--repeat", "repeats", type=int, default=2, show_default=True)
def tune_cmd(
    target: Path,
    task: str,
    policy: str,
    bandwidth: float | None,
    llama_bin: Path | None,
    db_path: Path | None,
    as_json: bool,
    budget: int,
    n_predict: int,
    repeats: int,
) -> None:
    """Measure the most promising configurations of TARGET until the best is confirmed."""
    host, facts = _host(bandwidth)
    install = find_llama(llama_bin)
    progress = err_console()

    def show(step: TuneStep) -> None:
        got = f"{step.measured_tps:.1f} t/s" if step.measured_tps else "failed"
        progress.print(
            f"  {step.label}: predicted {step.option.tps:.1f}, measured {got} ({step.reason})",
        )

    with opened(resolve_db(db_path)) as con:
        run_option = llama_runner(
            con, install, host, target, load_workload((task,)),
            task=task, n_predict=n_predict, repeats=repeats,
        )  # fmt: skip
        result = tune(
            con, str(target), run_option, host=facts, task=task, policy=policy,
            budget=budget, on_step=None if as_json else show,
        )  # fmt: skip
    if as_json:
        emit_json("tune", _tune_doc(result))
        return
    _print_tune(result)


def _tune_doc(r: TuneResult) -> dict[str, Any]:
    best = r.best
    return {
        "target": r.target_name,
        "runs": [
            {
                "label": s.label,
                "predicted_tps": s.option.tps,
                "measured_tps": s.measured_tps,
                "run_id": s.run_id,
                "reason": s.reason,
            }
            for s in r.steps
        ],  # fmt: skip
        "best": None if best is None else {"label": best.label, "tps": best.measured_tps},
        "baseline_tps": r.baseline_tps,
        "confirmed": r.confirmed,
        "stop_reason": r.stop_reason,
        "n_candidates": r.n_candidates,
    }


def _print_tune(r: TuneResult) -> None:
    c = console()
    best = r.best
    c.print(f"{r.target_name}: {r.n_runs} runs of {r.n_candidates} candidates ({r.stop_reason})")
    if best is not None and best.measured_tps:
        base = r.baseline_tps
        sp = f" = {best.measured_tps / base:.2f}x plain" if base else ""
        state = "confirmed" if r.confirmed else "not confirmed (budget spent)"
        c.print(f"best: {best.label}: {best.measured_tps:.1f} t/s{sp}, {state}")


COMMANDS = [recommend_cmd, train_cmd, tune_cmd]
