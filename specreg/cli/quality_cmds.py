"""`specreg quality` and `agree`: what lossy knobs cost, and how well drafts agree, measured
with the build's own llama-perplexity."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from rich.table import Table

from specreg.cli.common import (
    EXPERTS,
    FILE,
    MODEL,
    TEMPERATURE,
    FiniteFloat,
    console,
    db_option,
    err_console,
    json_option,
    llama_bin_option,
    n_predict_option,
    option_stack,
    present,
    resolve_db,
    resolve_model_path,
    task_option,
    threads_option,
)
from specreg.cli.progress import measuring
from specreg.errors import RunFailed
from specreg.registry.db import opened
from specreg.units import MAX_CTX, MAX_MEMORY_BYTES

if TYPE_CHECKING:
    from specreg.quality.agreement import AgreementResult
    from specreg.quality.kld import Measuring, QualityResult


_measure_options = option_stack(
    click.option(
        "--ctx", type=click.IntRange(8, MAX_CTX), default=128, show_default=True,
        help="Chunk length; llama-perplexity scores the second half of each chunk.",
    ),
    click.option(
        "--chunks", type=click.IntRange(0, 1_000_000), default=4, show_default=True,
        help="Chunks scored per text (0: all of it).",
    ),
    threads_option,
    click.option(
        "--timeout", type=FiniteFloat(1.0, 7 * 24 * 3600.0), default=900.0,
        show_default=True,
        help="Seconds one llama-perplexity call may take.",
    ),
    click.option(
        "--max-logits-gb", type=FiniteFloat(0.001, MAX_MEMORY_BYTES / 1e9), default=1.0,
        show_default=True,
        help="Largest saved-logits file to write (about n_vocab x tokens x 2 bytes).",
    ),
    llama_bin_option,
    db_option,
    json_option,
)  # fmt: skip


def _measuring(kw: dict[str, Any]) -> Measuring:
    from specreg.host.machine import detect_host
    from specreg.llama.install import find_llama
    from specreg.quality.kld import Measuring

    return Measuring(
        install=find_llama(kw["llama_bin"]),
        host=detect_host(),
        ctx=kw["ctx"],
        chunks=kw["chunks"] or None,
        threads=kw["threads"],
        timeout=kw["timeout"],
        max_logits_bytes=int(kw["max_logits_gb"] * 1e9),
        notify=lambda line: err_console().print(line, soft_wrap=True),
    )


@click.command("quality")
@click.argument("target", type=MODEL)
@click.option("--experts", type=EXPERTS, default=None, help="MoE experts used per token.")
@click.option(
    "--against", "reference", type=MODEL, default=None,
    help="Lossless reference: the same model at another quantization (e.g. its Q8_0).",
)  # fmt: skip
@task_option(help="Shipped task text (repeatable; default: every task's).")
@click.option(
    "--text", "texts", multiple=True, type=FILE,
    help="Your own text file instead of the shipped ones (repeatable).",
)  # fmt: skip
@_measure_options
def quality_cmd(**kw: Any) -> None:
    """What TARGET with --experts N, or TARGET as a quant of --against REF, costs in output:
    mean KL divergence (± its uncertainty), its 99th percentile, same top token and the
    perplexity change per text, against the lossless reference. Recorded in the registry.

    Exit 1 if a measurement failed (recorded, with llama.cpp's message), 2 on bad input.
    """
    from specreg.quality.kld import measure_quality, plan_quality, quality_texts

    with opened(resolve_db(kw["db_path"])) as con:
        target = resolve_model_path(con, kw["target"])
        reference = resolve_model_path(con, kw["reference"]) if kw["reference"] else None
        plan = plan_quality(con, target, reference=reference, experts=kw["experts"])
        texts = quality_texts(kw["tasks"], kw["texts"])
        with measuring(as_json=kw["as_json"]):  # takes its turn on the host, says so
            result = measure_quality(con, _measuring(kw), plan, texts)
    present(result, kw["as_json"], _print_quality)
    if not result.ok:
        _failed("quality", [p.error for p in result.points])


@click.command("agree")
@click.argument("target", type=MODEL)
@click.argument("drafts", nargs=-1, type=MODEL)
@task_option(help="Task prompts the target continues (repeatable; default: every task).")
@click.option(
    "--temp",
    "temperature",
    type=TEMPERATURE,
    default=0.0,
    show_default=True,
    help="Sampling temperature: above 0, acceptance is the target's probability of the "
    "draft's top token.",
)
@n_predict_option(default=160, help="Tokens the target generates per prompt for its text.")
@click.option(
    "--scored",
    type=click.Choice(["answers", "text"]),
    default="answers",
    show_default=True,
    help="Positions agreement is taken over: the target's generated answers (what "
    "speculation drafts; the draft's logits are saved and compared per position), or the "
    "whole text with its prompts (llama-perplexity's own statistics).",
)
@click.option(
    "--via",
    type=click.Choice(["auto", "server", "logits"]),
    default="auto",
    show_default=True,
    help="Where the draft's guesses come from: llama-server, after each prompt alone as in a "
    "run, one guess per answer token (kept, so drafting is replayed on them at any K); or "
    "saved logits, both models over one text (KL divergence too). auto: the server at "
    "temperature 0 on answers, else logits.",
)
@_measure_options
def agree_cmd(**kw: Any) -> None:
    """How often each DRAFT (default: every compatible draft in the registry) picks TARGET's
    top token on TARGET's own greedy text: the per-token acceptance of greedy speculation,
    measured in seconds without a speculative run. Recorded in the registry.

    Exit 1 if a measurement failed (recorded, with llama.cpp's message), 2 on bad input.
    """
    from specreg.quality.agreement import measure_agreement, plan_agreement

    with opened(resolve_db(kw["db_path"])) as con:
        target = resolve_model_path(con, kw["target"])
        drafts = [resolve_model_path(con, d) for d in kw["drafts"]]
        plan = plan_agreement(con, target, drafts, kw["tasks"], temperature=kw["temperature"])
        with measuring(as_json=kw["as_json"]):  # takes its turn on the host, says so
            result = measure_agreement(
                con,
                _measuring(kw),
                plan,
                n_predict=kw["n_predict"],
                scored=kw["scored"],
                via=kw["via"],
            )
    present(result, kw["as_json"], _print_agreement)
    if not result.ok:
        _failed("agreement", [p.error for p in result.points])


def _failed(what: str, errors: list[str | None]) -> None:
    """Exit 1 with the first failure's own line, which names its log."""
    failed = [e for e in errors if e is not None]
    first = failed[0] if failed else "see the table"
    raise RunFailed(
        f"{len(failed)} of {len(errors)} {what} measurements failed and were recorded "
        f"(see the table); the first: {first}"
    )


def _pm(value: float | None, unc: float | None, fmt: str = ".4f", scale: float = 1.0) -> str:
    if value is None:
        return "-"
    text = f"{value * scale:{fmt}}"
    if text.startswith("-") and float(text) == 0:
        text = text[1:]  # a KLD of -0.00000003 is 0 at this precision, not "-0.0000"
    return f"{text} ± {unc * scale:{fmt}}" if unc is not None else text


def _print_quality(r: QualityResult) -> None:
    out = console()
    what = Path(r.target).name
    if r.experts is not None:
        what += f" with {r.experts} of {r.expert_count} experts (default {r.default_experts})"
    out.print(f"{what} against {Path(r.reference).name} (llama.cpp {r.llama_version})")
    table = Table(
        "text", "tokens", "mean KLD", "KLD p99", "same top", "PPL ref -> this", "ln PPL ratio",
        box=None,
    )  # fmt: skip
    for p in r.points:
        s = p.stats
        if s is None:
            table.add_row(p.text.name, "-", f"failed: {p.error}", "", "", "", "")
            continue
        p99 = s.kld_p99
        table.add_row(
            p.text.name,
            str(p.n_tokens),
            _pm(s.mean_kld, s.mean_kld_unc),
            "-" if p99 is None else f"{p99:.4f}",
            _pm(s.same_top, s.same_top_unc, ".1f", 100) + " %",
            f"{s.ppl_base:.2f} -> {s.ppl:.2f}" if s.ppl_base is not None else f"{s.ppl:.2f}",
            _pm(s.ln_ppl_ratio, s.ln_ppl_ratio_unc),
        )
    out.print(table)


def _print_agreement(r: AgreementResult) -> None:
    out = console()
    out.print(f"agreement with {Path(r.target).name}; acceptance: {r.acceptance_label}")
    cols = ["draft", "task", "scored", "tokens", "same top", "whole text", "mean KLD", "method"]
    if r.temperature > 0:
        cols.insert(6, f"accept @ T={r.temperature:g}")
    table = Table(*cols, box=None)
    for p in r.points:
        if not p.ok:
            table.add_row(
                p.draft_name, p.task, "-", "-", f"failed: {p.error}", *[""] * (len(cols) - 5)
            )
            continue
        row = [
            p.draft_name,
            p.task,
            p.scored,
            str(p.n_tokens),
            _pm(p.same_top, p.same_top_unc, ".1f", 100) + " %",
            "-" if p.text_same_top is None else f"{p.text_same_top:.1%}",
            _pm(p.mean_kld, p.mean_kld_unc),
            p.method,
        ]
        if r.temperature > 0:
            row.insert(6, "-" if p.accept is None else f"{p.accept:.1%}")
        table.add_row(*row)
    out.print(table)


COMMANDS = [quality_cmd, agree_cmd]
