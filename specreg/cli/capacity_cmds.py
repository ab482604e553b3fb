"""`specreg capacity`: what this host serves under load, per layout and concurrency."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from specreg.cli.common import (
    POSITIVE,
    console,
    db_option,
    emit,
    err_console,
    json_option,
    llama_bin_option,
    option_group,
    resolve_db,
)

if TYPE_CHECKING:
    from specreg.registry.capacity import CapacityCurve, CapacityPoint
    from specreg.runner.capacity import CapacityPlan


def _counts(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError as err:
        raise click.BadParameter(f"{text!r}: write counts such as 1,2,4,8") from err


def _plan(given: dict[str, Any]) -> CapacityPlan:
    from specreg.runner.capacity import CapacityPlan

    return CapacityPlan(
        concurrency=_counts(given["concurrency"]),
        contexts=tuple(given["contexts"].split(",")),
        layouts=tuple(given["layouts"].split(",")),
        n_predict=given["n_predict"], rounds=given["rounds"], long_tokens=given["long_tokens"],
    )  # fmt: skip


# What to measure: --concurrency, --context, --layout, --n-predict, --rounds, --long-tokens,
# handed to the command as one CapacityPlan (`plan`).
_plan_options = option_group(
    "plan",
    _plan,
    click.option("--concurrency", default="1,2,4,8", show_default=True,
                 help="Closed-loop clients at each point, comma-separated."),
    click.option("--context", "contexts", default="short,long", show_default=True,
                 help="short: the task's prompt; long: a document before it."),
    click.option("--layout", "layouts", default="full,split", show_default=True,
                 help="full: one instance on every core; split: disjoint halves or NUMA "
                 "nodes, one instance each."),
    click.option("--n-predict", type=POSITIVE, default=64, show_default=True,
                 help="Tokens each request generates."),
    click.option("--rounds", type=POSITIVE, default=2, show_default=True,
                 help="Requests each client sends at each point."),
    click.option("--long-tokens", type=click.IntRange(min=16), default=1024,
                 show_default=True, help="Tokens of document before a long prompt (about)."),
)  # fmt: skip


@click.command("capacity")
@click.argument("target")
@_plan_options
@click.option("--plain-only", is_flag=True,
              help="Measure plain decoding only (not the best speculative option).")  # fmt: skip
@llama_bin_option
@db_option
@json_option
def capacity_cmd(target: str, plan: CapacityPlan, plain_only: bool, llama_bin: Path | None,
                 db_path: Path | None, as_json: bool) -> None:  # fmt: skip
    """Measure what this host serves of TARGET under load: aggregate and per-request decode
    t/s, time to first token and latency (p50/p95) at each concurrency, for plain decoding and
    the recommender's best speculative option, in each layout the cores allow, with a short
    and a long context. Stored per host and model: serve reads it."""
    from specreg.runner.capacity import capacity_target

    say = None if as_json else _progress
    curve = capacity_target(resolve_db(db_path), target, plan, llama_bin=llama_bin,
                            speculative=not plain_only, on_point=say)  # fmt: skip
    if as_json:
        emit(curve)
    else:
        _print_curve(curve)


def _progress(p: CapacityPoint) -> None:
    err_console().print(
        f"  {p.config_label}, {p.layout}, {p.context}, {p.concurrency} client(s): "
        f"{p.aggregate_tps:.1f} t/s"
    )


def _print_curve(curve: CapacityCurve) -> None:
    from rich.table import Table

    grid = Table("config", "layout", "context", "clients", "aggregate t/s", "per request t/s",
                 "TTFT p50/p95 s", "latency p50/p95 s", box=None)  # fmt: skip
    for p in curve.points:
        grid.add_row(
            p.config_label, f"{p.layout} x{p.instances}" if p.instances > 1 else p.layout,
            p.context, str(p.concurrency), f"{p.aggregate_tps:.1f}", f"{p.per_request_tps:.1f}",
            f"{p.ttft_p50_s or 0:.2f}/{p.ttft_p95_s or 0:.2f}",
            f"{p.latency_p50_s or 0:.2f}/{p.latency_p95_s or 0:.2f}",
        )  # fmt: skip
    out = console()
    out.print(grid)
    out.print(f"stored for host {curve.host_fingerprint}: serve and recommend read it")


COMMANDS = [capacity_cmd]
