"""`specreg doctor` and `specreg calibrate`: this host's settings and its measured costs."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from specreg.cli.common import (
    console,
    db_option,
    json_option,
    llama_bin_option,
    option_group,
    present,
    resolve_db,
    settings_options,
)
from specreg.cli.progress import measuring
from specreg.errors import EXIT_FINDINGS

if TYPE_CHECKING:
    from specreg.host.doctor import BuildFacts, DoctorReport
    from specreg.runner.calibrate import Bench, CalibrationResult, DraftChoice

_MARK = {"ok": "ok", "finding": "FINDING", "info": "info", "unknown": "?"}


@click.command()
@click.option(
    "--memory",
    "memory_spec",
    default=None,
    help="Your DIMMs as COUNTxTYPE-SPEED, e.g. 12xDDR5-5600 (the peak to compare the measured "
    "bandwidth with, when dmidecode cannot tell).",
)
@click.option("--no-bandwidth", is_flag=True, help="Skip the bandwidth measurement (about 1 s).")
@llama_bin_option
@db_option
@json_option
def doctor(**kw: Any) -> None:
    """Check this host for llama.cpp: NUMA, SMT, threads, huge pages, governor, OpenMP, the
    build's CPU features, memory against the registry's targets, memory bandwidth.

    Each finding says what it costs and the command that fixes it. Exit 1 on findings.
    """
    from specreg.host.doctor import run_doctor
    from specreg.host.membw import parse_memory_spec

    memory = parse_memory_spec(kw["memory_spec"]) if kw["memory_spec"] else None
    report = run_doctor(resolve_db(kw["db_path"]), build=_build_facts(kw["llama_bin"]),
                        memory=memory, measure_bandwidth=not kw["no_bandwidth"])  # fmt: skip
    present(report, kw["as_json"], _print_doctor)
    if report.findings:
        raise click.exceptions.Exit(EXIT_FINDINGS)


def _build_facts(llama_bin: Path | None) -> BuildFacts | None:
    """The facts of the llama.cpp build; None without one (doctor checks the host all the
    same, and a finding says so)."""
    from specreg.errors import LlamaError
    from specreg.llama.facts import build_facts
    from specreg.llama.install import find_llama

    try:
        return build_facts(find_llama(llama_bin))
    except LlamaError:
        return None


def _print_doctor(report: DoctorReport) -> None:
    out = console()
    host = report.host
    out.print(
        f"host {host.cpu_model}: {host.physical_cores} cores, {host.logical_cpus} CPUs, "
        f"{host.mem_str}, {host.numa_nodes} NUMA node(s); fingerprint {host.fingerprint}"
    )
    for c in report.checks:
        out.print(f"{_MARK.get(c.status, c.status):8} {c.name:17} {c.summary}")
        if c.cost and c.status != "ok":
            out.print(f"{'':26}costs: {c.cost} ({c.cost_source})")
        if c.status != "ok":
            for cmd in c.fix:
                out.print(f"{'':26}fix:   {cmd}")
    if report.bandwidth is not None:
        out.print(f"bandwidth method: {report.bandwidth.method_str}")
    n = len(report.findings)
    out.print(f"{n} finding{'s' if n != 1 else ''}; doctor took {report.seconds:.1f} s")


def _drafts(given: dict[str, Any]) -> DraftChoice:
    from specreg.runner.calibrate import DraftChoice

    return DraftChoice.asked(given["drafts"], given["no_drafts"], given["max_drafts"])


def _bench(given: dict[str, Any]) -> Bench:
    from specreg.runner.calibrate import Bench

    return Bench(gen_tokens=given["gen_tokens"], repetitions=given["repetitions"])


@click.command()
@click.argument("target")
@option_group(
    "drafts",
    _drafts,
    click.option(
        "--draft",
        "drafts",
        multiple=True,
        help="Calibrate this draft too (default: the compatible drafts in the registry).",
    ),
    click.option("--no-drafts", is_flag=True, help="Calibrate the target only."),
    click.option(
        "--max-drafts",
        type=click.IntRange(0, 64),
        default=3,
        show_default=True,
        help="At most this many drafts.",
    ),
)
@option_group(
    "bench",
    _bench,
    click.option(
        "--repetitions",
        type=click.IntRange(1, 1000),
        default=5,
        show_default=True,
        help="llama-bench -r per test.",
    ),
    click.option(
        "--gen-tokens",
        type=click.IntRange(1, 1_000_000),
        default=128,
        show_default=True,
        help="Tokens of plain generation.",
    ),
)
@settings_options(
    "threads",
    "retries",
    "load",
    retries={
        "type": click.IntRange(min=0),
        "help": "Measure a test again up to N times when other processes took CPU during it.",
    },
)
@llama_bin_option
@db_option
@json_option
def calibrate(target: str, drafts: DraftChoice, bench: Bench, **kw: Any) -> None:
    """Time TARGET (and its drafts) with llama-bench on this host: one pass over 1, 2, 4, ...
    32 tokens (what verifying K drafted tokens costs) and plain generation; stored per host and
    model for the recommender.

    The quiet generation test's repetitions are this host's noise floor, stored for the load
    guard: a run whose repeats spread far beyond it is recorded as disturbed. A llama-server of
    the target then decodes plainly: its seconds per token over llama-bench's are this host's
    pass factor, stored and read by recommend (the constant 1.16 only where never measured).

    Exit 1 when a measurement stayed disturbed by other processes after every retry; exit 3
    when the host stayed busy (nothing measured).
    """
    from specreg.runner.calibrate import calibrate_target

    with measuring(as_json=kw["as_json"]):
        result = calibrate_target(resolve_db(kw["db_path"]), target, drafts=drafts, bench=bench,
                                  settings=kw["settings"], llama_bin=kw["llama_bin"])  # fmt: skip
    present(result, kw["as_json"], _print_calibration)
    if result.contended:
        raise click.exceptions.Exit(EXIT_FINDINGS)


def _print_calibration(result: CalibrationResult) -> None:
    from specreg.registry.text import escape_controls
    from specreg.runner.calibrate import noise_floor_of

    out = console()
    for rec in result.records:
        name = escape_controls(Path(rec.model_path).name)
        gen = rec.gen
        out.print(
            f"{rec.role} {name} ({rec.threads} threads): plain generation "
            + (f"{gen.tokens_per_s:.1f} t/s" if gen else "not measured")
        )
        for p in rec.batch:
            ratio = p.seconds / rec.batch_seconds(1)
            flag = "  (disturbed)" if p.contended else ""
            out.print(
                f"  batch {p.n_tokens:3}: {p.seconds * 1e3:8.2f} ms  "
                f"[{p.seconds_lo * 1e3:.2f}-{p.seconds_hi * 1e3:.2f}]  {ratio:5.2f}x one token"
                f"{flag}"
            )
    out.print(
        f"host {result.host_fingerprint}; {result.reruns} test(s) measured again under load; "
        f"took {result.seconds:.1f} s"
    )
    floors = [f for f in (noise_floor_of(r) for r in result.records[:1]) if f is not None]
    if floors:
        out.print(
            f"quiet noise floor: repeats spread {floors[0].spread:.1%} (stored; runs whose "
            "repeats spread far beyond it are recorded as disturbed)"
        )
    out.print(result.pass_factor_line)
    if result.contended:
        out.print(
            "some tests stayed disturbed by other processes (see `specreg calibrate --help`): "
            "run it again when the host is quiet; these curves mislead the recommender"
        )


COMMANDS = [doctor, calibrate]
