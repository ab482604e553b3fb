"""Run and verify configurations for real, and record every outcome in the registry.

Models are referenced by registry id: a target or draft not yet in the registry is scanned
first. Failed runs are recorded too, with llama.cpp's own message. A run is recorded as
`running` before llama.cpp starts, so one whose process is killed is seen as interrupted.
Each record carries the protocol its samples were taken under and per-repeat figures; a run
whose later repeats accepted far more than its first (a replay) is recorded as not trusted.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path

import duckdb

from specreg.errors import UsageError, param
from specreg.host.load import preflight
from specreg.host.machine import Host
from specreg.llama.config import DEFAULT_CTX, DEFAULT_SEED, Config, user_server_args
from specreg.llama.install import LlamaInstall
from specreg.llamacpp import NGRAM_CACHE_DRAFT_MAX
from specreg.registry.lookup_caches import LookupCache
from specreg.registry.queries import ModelRecord
from specreg.registry.run_store import (
    STATUS_INTERRUPTED,
    RunRecord,
    VerifiedRun,
    finish_run,
    get_run,
    interrupt_run,
    start_run,
)
from specreg.registry.scan import model_record
from specreg.runner.draft_check import refuse_incompatible_draft
from specreg.runner.legacy import LOOKUP, choose_engine
from specreg.runner.lookup_cache import usable_cache
from specreg.runner.measure import NO_PROBES, Probes, load_verdict_of, measure
from specreg.runner.measurement import Measurement, MeasurementInterrupted
from specreg.runner.records import Models, run_record, to_record
from specreg.runner.settings import DEFAULTS, Settings
from specreg.runner.verify import Verification, judge
from specreg.runner.workload import Prompts, Workload
from specreg.stacks import NGRAM_CACHE
from specreg.terms import ENGINE_SERVER, SPEC_DRAFT_SIMPLE, SPEC_NONE


@dataclass(frozen=True)
class RunOutcome:
    """What `specreg run` produced: the measurement and the id it was recorded under."""

    run_id: int
    measurement: Measurement


@dataclass(frozen=True)
class VerifyOutcome:
    baseline_run_id: int
    run_id: int
    verification: Verification


def with_expert_key(config: Config, target: ModelRecord) -> Config:
    """Fill in the exact `--override-kv` key for `--experts` from the target's record."""
    if config.experts is None or config.expert_key:
        return config
    key = target.expert_used_key or (
        f"{target.architecture}.expert_used_count" if target.architecture else None
    )
    if key is None:
        raise UsageError(
            f"{target.path} has no architecture in the registry, so the expert-count key is "
            "unknown: rescan it with `specreg scan`"
        )
    return config.with_(expert_key=key)


def model_file(con: duckdb.DuckDBPyConnection, ref: str) -> Path:
    """The file of the model `ref` names (a path, an id prefix or a name), exactly as the OS
    names it (its first part for a split model): what llama.cpp is given. A file on disk is
    that file, registered or not (a run scans a new one)."""
    import os

    from specreg.registry.queries import model_fs_paths, resolve_model

    if os.path.isfile(ref):
        return Path(ref)
    record = resolve_model(con, ref)
    paths = model_fs_paths(con, record.model_id)
    return Path(paths[0] if paths else record.path)


# -- what a run measures ------------------------------------------------------------------------


@dataclass(frozen=True)
class RunSpec:
    """What one run measures, resolved: the target's and draft's files, the configuration, the
    prompts, the task recorded with them, and the lookup cache ngram-cache reads (by name)."""

    target: Path
    draft: Path | None
    config: Config
    workload: Workload
    task: str | None = None
    lookup_cache: str | None = None


@dataclass(frozen=True)
class RunRequest:
    """What `run` and `verify` are asked, as given: the target and draft by path, id prefix or
    name; the configuration's knobs, `spec_type` None for the type they imply (ngram-cache with
    a lookup cache, draft-simple with a draft, else plain decoding); the lookup cache by name;
    the prompts; `force` runs a draft the auditor refuses, to see llama.cpp's own word."""

    target: str
    draft: str | None = None
    spec_type: str | None = None
    k: int | None = None
    p_min: float | None = None
    draft_threads: int | None = None
    experts: int | None = None
    temperature: float = 0.0
    seed: int = DEFAULT_SEED
    ctx: int = DEFAULT_CTX
    type_k: tuple[tuple[str, int], ...] = ()
    lookup_cache: str | None = None
    prompts: Prompts = field(default_factory=Prompts)
    force: bool = False
    server_args: tuple[str, ...] = ()  # llama-server flags of the user's own (--server-arg)

    def config(self) -> Config:
        """The configuration asked for, its speculative type implied when not given."""
        given = ((NGRAM_CACHE, self.lookup_cache), (SPEC_DRAFT_SIMPLE, self.draft))
        implied = [spec_type for spec_type, on in given if on]
        spec_type = self.spec_type or ",".join(implied) or SPEC_NONE
        if spec_type == SPEC_NONE and (self.k is not None or self.p_min is not None):
            raise UsageError(
                f"{param('k')} and {param('p_min')} need speculation: add {param('draft')} or "
                f"{param('spec_type')}"
            )
        return Config(
            spec_type=spec_type, k=self.k, p_min=self.p_min, draft_threads=self.draft_threads,
            experts=self.experts, temperature=self.temperature, seed=self.seed, ctx=self.ctx,
            type_k=self.type_k,
            server_args=user_server_args(self.server_args, param("server_args")).args,
        )  # fmt: skip


# -- the plan: everything checked before anything starts ---------------------------------------


@dataclass(frozen=True)
class Plan:
    """Everything a run needs, resolved: models by registry id, the config's MoE key, the
    settings with the engine that runs the config (`settings.engine`: llama-server or a legacy
    binary; a baseline always runs on llama-server)."""

    install: LlamaInstall
    host: Host
    target: ModelRecord
    draft: ModelRecord | None
    target_path: Path
    draft_path: Path | None
    config: Config
    workload: Workload
    task: str | None
    settings: Settings = DEFAULTS
    notes: tuple[str, ...] = ()  # things the user should know before reading the numbers
    lookup_cache: LookupCache | None = None  # the workload cache ngram-cache reads

    @property
    def engine(self) -> str:
        return self.settings.engine

    @property
    def eog_texts(self) -> tuple[str, ...]:
        return tuple(t for t in (self.target.eos_text, self.target.eot_text) if t)

    def models(self, baseline: bool = False) -> Models:
        """The models a run names in its record: a baseline's, the target only."""
        with_draft = self.draft is not None and not baseline
        return Models(
            self.target.model_id,
            self.target_path,
            self.draft.model_id if with_draft and self.draft else None,
            self.draft_path if with_draft else None,
        )


def plan(
    con: duckdb.DuckDBPyConnection,
    install: LlamaInstall,
    host: Host,
    spec: RunSpec,
    settings: Settings = DEFAULTS,
    *,
    force: bool = False,
) -> Plan:
    """Everything a run of `spec` needs, checked before anything starts; `settings.engine`
    resolved for its config on this llama.cpp. `settings.warm_first=N` plans the warm regime:
    the workload's distinct prompts once each on one llama-server, the later ones (after the
    first N) reported apart; it takes nothing else from `repeats`. `spec.lookup_cache` names a
    `specreg lookup-cache` for ngram-cache: checked for the target's tokenizer family and read
    as llama.cpp will read it, and refused for prompts whose own text built it. `force` runs a
    draft the auditor refuses (llama.cpp's own word only when asked for)."""
    config = settings.configured(spec.config)
    _check_draft(config, spec.draft)
    chosen = choose_engine(install, config, settings.engine)
    target_rec = model_record(con, spec.target)
    draft_rec = model_record(con, spec.draft) if spec.draft is not None else None
    if draft_rec is not None and not force:
        refuse_incompatible_draft(con, install, target_rec, draft_rec, config.stack.model_drafter)
    config, cache, notes = _stack_checks(
        con, config, chosen, target_rec, spec.workload, spec.lookup_cache
    )
    name = Path(spec.target).name
    if config.stack.has("draft-mtp") and spec.draft is None and not target_rec.has_mtp_tensors:
        raise UsageError(
            f"{name} has no MTP (NextN) layers, so draft-mtp cannot run on it: use a draft "
            "model or an n-gram method"
        )
    _check_warm(config, chosen, spec.workload, settings.warm_first)
    if config.server_args and chosen != ENGINE_SERVER:
        raise UsageError(
            f"{param('server_args')} adds llama-server flags, and {config.spec_type} runs on "
            f"{chosen} here: drop them, or pass {param('engine')} llama-server"
        )
    if chosen != ENGINE_SERVER:
        how = "its own n-gram cache lookup" if chosen == LOOKUP else "draft-model speculation"
        notes.append(
            f"{config.spec_type} runs on {chosen} ({how}), one process per prompt; it prints "
            "text, so verification compares text"
        )
    notes += _expert_notes(config, target_rec, name)
    return Plan(
        install=install,
        host=host,
        target=target_rec,
        draft=draft_rec,
        target_path=Path(spec.target).resolve(),
        draft_path=Path(spec.draft).resolve() if spec.draft is not None else None,
        config=with_expert_key(config, target_rec),
        workload=spec.workload,
        task=spec.task,
        settings=settings.with_(engine=chosen),
        notes=tuple(notes),
        lookup_cache=cache,
    )


def _check_draft(config: Config, draft: Path | None) -> None:
    """A draft where the configuration needs one, and only there."""
    if config.needs_draft and draft is None:
        raise UsageError(f"{config.spec_type} needs a draft model: pass {param('draft', 'PATH')}")
    if draft is not None and not config.speculative:
        raise UsageError(
            f"{param('draft')} given without speculation: add {param('spec_type')} draft-simple"
        )
    if draft is not None and config.stack.model_drafter is None:
        raise UsageError(
            f"{param('draft')} given, but {config.spec_type} drafts without a model: add "
            f"draft-simple to {param('spec_type')} (e.g. {config.spec_type},draft-simple)"
        )


def _check_warm(config: Config, engine: str, workload: Workload, warm_first: int | None) -> None:
    """The warm regime runs on one llama-server and sends distinct prompts, never a replay."""
    if warm_first is None:
        return
    if engine != ENGINE_SERVER:
        raise UsageError(
            f"{param('warm_first')} needs llama-server, and {config.spec_type} runs on "
            f"{engine} here (one process per prompt keeps no state): drop {param('warm_first')}"
        )
    workload.held_out(warm_first)  # distinct later prompts, or a one-line usage error
    if workload.repeated():
        raise UsageError(
            f"{', '.join(workload.repeated())} repeat(s) an earlier prompt: "
            f"{param('warm_first')} sends distinct prompts, never replays"
        )


def _expert_notes(config: Config, target: ModelRecord, name: str) -> list[str]:
    """An expert count the target cannot take is refused; one it ignores is noted."""
    if config.experts is None:
        return []
    if target.expert_count and config.experts > target.expert_count:
        raise UsageError(
            f"{param('experts')} {config.experts} exceeds the {target.expert_count} experts "
            f"of {name}"
        )
    if not target.is_moe:
        return [
            f"{name} is not a mixture of experts: llama.cpp ignores the expert-count override, "
            "so expect the baseline's output"
        ]
    return []


def _stack_checks(
    con: duckdb.DuckDBPyConnection,
    config: Config,
    engine: str,
    target: ModelRecord,
    workload: Workload,
    lookup_cache: str | None,
) -> tuple[Config, LookupCache | None, list[str]]:
    """A stack's and a lookup cache's checks before anything starts: the config with the
    cache's file, the cache, and notes."""
    stack = config.stack
    notes = []
    if stack.stacked:
        notes.append(
            f"{stack.spelled}: llama.cpp asks {', then '.join(stack.types)} for a draft each step "
            "(the first that has one drafts); the run records each type's figures"
        )
    if engine == ENGINE_SERVER and stack.uses_lookup_cache and config.k_of(NGRAM_CACHE):
        raise UsageError(
            f"ngram-cache has no K in llama-server: it drafts {NGRAM_CACHE_DRAFT_MAX} tokens "
            f"(hard-coded); drop {param('k')}, or give it to another type of the stack with "
            f"{param('type_k')}"
        )
    if lookup_cache is None:
        return config, None, notes
    if not stack.uses_lookup_cache:
        raise UsageError(
            f"{param('lookup_cache')} {lookup_cache}: a lookup cache is read by ngram-cache "
            f"only; add ngram-cache to {param('spec_type')} (got {stack.spelled})"
        )
    cache, facts = usable_cache(con, lookup_cache, target)  # one line if it cannot be used
    built_from = set(cache.prompt_sha256s)
    replayed = [p.prompt_id for p in workload.prompts if p.sha256 in built_from]
    if replayed:
        raise UsageError(
            f"{', '.join(replayed)}: the lookup cache {cache.name} holds this prompt and its "
            "recorded output, so a run on it measures a replay; run prompts the cache was not "
            "built from"
        )
    notes.append(
        f"lookup cache {cache.name}: {facts.n_ngrams} n-grams from {cache.tokens_str} tokens "
        f"of {cache.task} ({cache.sources_str}), tokenizer family {cache.tok_family}"
    )
    return config.with_(lookup_cache=cache.path), cache, notes


KIND_RUN = "run"
KIND_BASELINE = "baseline"
KIND_VERIFY = "verify"


def measure_plan(
    p: Plan, settings: Settings | None = None, *, baseline: bool = False, probes: Probes = NO_PROBES
) -> Measurement:
    """The planned config measured, with the plan's settings unless given (a baseline: the
    plain model); not recorded."""
    settings = settings or p.settings
    config, draft = (p.config.baseline(), None) if baseline else (p.config, p.draft_path)
    return measure(
        p.install, p.host, config, p.target_path, draft, p.workload, settings, probes=probes,
        eog_texts=p.eog_texts,
    )  # fmt: skip


def _started(p: Plan, kind: str) -> RunRecord:
    """What is known before llama.cpp starts: recorded as `running` until the run ends."""
    baseline = kind == KIND_BASELINE
    return run_record(
        kind, p.config.baseline() if baseline else p.config, p.models(baseline),
        engine=ENGINE_SERVER if baseline else p.engine, install=p.install, host=p.host,
        task=p.task, prompt_set=p.workload.name, n_predict=p.settings.n_predict,
        repeats=p.settings.repeats,
    )  # fmt: skip


Registry = Callable[[], AbstractContextManager[duckdb.DuckDBPyConnection]]
"""Opens the registry for one short write and closes it after (`registry_at`)."""

# How long a run's last write waits for readers to let go of the registry: the measurement is
# lost if it cannot be recorded.
FINISH_WAIT_S = 120.0


def registry_at(db_path: Path) -> Registry:
    """The registry at `db_path`, opened for each write and closed after it."""
    from specreg.registry.db import opened

    return partial(opened, db_path, wait=FINISH_WAIT_S)


def stopped_why(err: BaseException | None) -> str:
    """The error of a run that stopped before it finished: Ctrl-C, a kill, an error."""
    if err is None:
        return "stopped before it finished"
    name = "KeyboardInterrupt" if isinstance(err, KeyboardInterrupt) else type(err).__name__
    return f"stopped before it finished ({name})"


class Recording:
    """A run recorded as `running`; `done` hands over its finished record."""

    def __init__(self, run_id: int):
        self.run_id = run_id
        self.finished: RunRecord | None = None

    def done(self, record: RunRecord) -> None:
        self.finished = record


class RunLog:
    """Where runs are recorded: as `running` before llama.cpp starts, then finished (ok or
    failed), or interrupted on Ctrl-C, an error or a kill; each write is one short transaction.

    Given a `Registry` (an opener), the registry is open only for those writes: no connection is
    held while llama.cpp runs, so other specreg processes read the registry (and record their
    own runs) during a measurement. Given an open connection, every write goes through it.
    """

    def __init__(self, registry: duckdb.DuckDBPyConnection | Registry):
        self._registry = registry

    def open(self) -> AbstractContextManager[duckdb.DuckDBPyConnection]:
        """A connection for one short block of work."""
        if isinstance(self._registry, duckdb.DuckDBPyConnection):
            return nullcontext(self._registry)
        return self._registry()

    def start(self, started: RunRecord) -> int:
        """Record `started` as running; its run_id."""
        with self.open() as con:
            return start_run(con, started)

    def finish(self, run_id: int, record: RunRecord) -> None:
        with self.open() as con:
            finish_run(con, run_id, record)

    def interrupt(
        self, run_id: int, err: BaseException | None, partial: RunRecord | None = None
    ) -> None:
        """Record `run_id` interrupted, with the samples of `partial` if it took any."""
        why = stopped_why(err)
        with self.open() as con:
            if partial is None:
                interrupt_run(con, run_id, why)
            else:
                stopped = replace(
                    partial, status=STATUS_INTERRUPTED, error_kind=STATUS_INTERRUPTED, error=why
                )
                finish_run(con, run_id, stopped)

    @contextmanager
    def recording(
        self,
        started: RunRecord,
        record_of: Callable[[Measurement], RunRecord] | None = None,
    ) -> Iterator[Recording]:
        """Record `started` as running for the block, then its finished record. A block that
        ends without one (Ctrl-C, an unexpected error) leaves the run interrupted, with the
        reason; a measurement stopped by Ctrl-C keeps its samples (`record_of` makes its record).
        """
        rec = Recording(self.start(started))
        try:
            yield rec
        except BaseException as err:
            partial = (
                record_of(err.measurement)
                if record_of is not None and isinstance(err, MeasurementInterrupted)
                else None
            )
            self.interrupt(rec.run_id, err, partial)
            raise
        if rec.finished is None:
            self.interrupt(rec.run_id, None)
        else:
            self.finish(rec.run_id, rec.finished)


def run(registry: duckdb.DuckDBPyConnection | Registry, p: Plan) -> RunOutcome:
    """Measure the planned config and record it (failed or not; interrupted with the samples
    taken on Ctrl-C). Given a `Registry`, it is open only while the run is written."""
    draft_id = p.draft.model_id if p.draft else None

    def record_of(m: Measurement) -> RunRecord:
        return to_record(
            m, KIND_RUN, p.target.model_id, draft_id, task=p.task, lookup_cache=p.lookup_cache
        )

    preflight(p.host.logical_cpus, p.config.label)  # refuse a busy host before recording
    with RunLog(registry).recording(_started(p, KIND_RUN), record_of) as rec:
        m = measure_plan(p, p.settings)
        rec.done(record_of(m))
    return RunOutcome(rec.run_id, m)


def verify(registry: duckdb.DuckDBPyConnection | Registry, p: Plan) -> VerifyOutcome:
    """Baseline and config on the same prompts (first encounter: the settings' warm regime is
    not used), a verdict, both runs recorded."""
    log = RunLog(registry)
    draft_id = p.draft.model_id if p.draft else None
    settings = p.settings.with_(warm_first=None)

    def baseline_of(m: Measurement) -> RunRecord:
        return to_record(m, KIND_BASELINE, p.target.model_id, None, task=p.task)

    preflight(p.host.logical_cpus, p.config.label)  # refuse a busy host before recording
    with log.recording(_started(p, KIND_BASELINE), baseline_of) as base_rec:
        base_settings = settings.with_(engine=ENGINE_SERVER)
        base = measure_plan(p, base_settings, baseline=True, probes=Probes(probs=True))
        base_rec.done(baseline_of(base))

    def config_of(m: Measurement, result: Verification | None = None) -> RunRecord:
        return to_record(
            m, KIND_VERIFY, p.target.model_id, draft_id, task=p.task, verification=result,
            baseline_run_id=base_rec.run_id, lookup_cache=p.lookup_cache,
            baseline_disturbed=load_verdict_of(base).reason,
        )  # fmt: skip

    with log.recording(_started(p, KIND_VERIFY), config_of) as rec:
        if base.ok:
            cfg = measure_plan(p, settings, probes=_reference(p, base))
        else:
            # No point starting the config's server when the plain model does not even run.
            cfg = replace(base, config=p.config, draft=p.draft_path, prompts=(), engine=p.engine)
        result = judge(base, cfg)
        rec.done(config_of(cfg, result))
    return VerifyOutcome(base_rec.run_id, rec.run_id, result)


def _reference(p: Plan, base: Measurement) -> Probes:
    """The probe of the first divergence from the baseline's tokens; a legacy engine prints
    text only, with no token ids to probe a divergence with."""
    if p.engine != ENGINE_SERVER:
        return NO_PROBES
    return Probes(reference_tokens={r.prompt.prompt_id: r.tokens for r in base.prompts})


# -- `specreg run` and `verify` ----------------------------------------------------------------


def prepare(
    con: duckdb.DuckDBPyConnection,
    request: RunRequest,
    settings: Settings = DEFAULTS,
    *,
    llama_bin: Path | None = None,
) -> Plan:
    """`request` planned with the llama.cpp in `llama_bin` (the usual search otherwise) on this
    host, its models found (or scanned) in the registry `con`."""
    from specreg.host.machine import detect_host
    from specreg.llama.install import find_llama

    config = request.config()  # the request's own mistakes first
    workload = request.prompts.workload()
    install, host = find_llama(llama_bin), detect_host()
    spec = RunSpec(
        model_file(con, request.target),
        model_file(con, request.draft) if request.draft is not None else None,
        config,
        workload,
        task=request.prompts.task,
        lookup_cache=request.lookup_cache,
    )
    return plan(con, install, host, spec, settings, force=request.force)


@contextmanager
def _planned(
    db_path: Path,
    request: RunRequest,
    settings: Settings,
    llama_bin: Path | None,
    on_plan: Callable[[Plan], None] | None,
) -> Iterator[Plan]:
    """The plan, shown to `on_plan` before anything runs; the block measures under the load
    guard's policy (the settings' options and this host's quiet noise floor)."""
    from specreg.host import load
    from specreg.registry.db import opened

    with opened(db_path) as con:
        planned = prepare(con, request, settings, llama_bin=llama_bin)
        policy = settings.load_policy(con, planned.host.fingerprint)
    if on_plan is not None:
        on_plan(planned)
    with load.using(policy):
        yield planned


def run_target(
    db_path: Path,
    request: RunRequest,
    settings: Settings = DEFAULTS,
    *,
    llama_bin: Path | None = None,
    on_plan: Callable[[Plan], None] | None = None,
) -> RunRecord:
    """`specreg run`: `request` planned, measured and recorded in the registry at `db_path`,
    which is open only while the run is written (other commands read it meanwhile); the run as
    recorded (failed or not)."""
    from specreg.registry.db import opened

    with _planned(db_path, request, settings, llama_bin, on_plan) as planned:
        outcome = run(registry_at(db_path), planned)
    with opened(db_path, read_only=True) as con:
        return get_run(con, outcome.run_id)


def verify_target(
    db_path: Path,
    request: RunRequest,
    settings: Settings = DEFAULTS,
    *,
    llama_bin: Path | None = None,
    on_plan: Callable[[Plan], None] | None = None,
) -> VerifiedRun:
    """`specreg verify`: the plain baseline and `request` on the same prompts, judged, both
    recorded in the registry at `db_path` (open only while a run is written)."""
    from specreg.registry.db import opened

    with _planned(db_path, request, settings, llama_bin, on_plan) as planned:
        outcome = verify(registry_at(db_path), planned)
    with opened(db_path, read_only=True) as con:
        return VerifiedRun(get_run(con, outcome.baseline_run_id), get_run(con, outcome.run_id))
