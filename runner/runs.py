"""Run and verify configurations for real, and record every outcome in the registry.

Models are referenced by registry id: a target or draft not yet in the registry is scanned
first. Failed runs are recorded too, with llama.cpp's own message. A run is recorded as
`running` before llama.cpp starts, so one whose process is killed is seen as interrupted.
Each record carries the protocol its samples were taken under and per-repeat figures; a run
whose later repeats accepted far more than its first (a replay) is recorded as not trusted.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from functools import partial
from pathlib import Path

import duckdb

from specreg.errors import UsageError, param
from specreg.host.load import preflight
from specreg.host.machine import Host
from specreg.llama import spec_stats
from specreg.llama.config import Config
from specreg.llama.install import LlamaInstall
from specreg.llama.server import Completion
from specreg.llamacpp import NGRAM_CACHE_DRAFT_MAX
from specreg.registry.lookup_caches import LookupCache
from specreg.registry.queries import ModelRecord
from specreg.registry.run_store import (
    STATUS_FAILED,
    STATUS_INTERRUPTED,
    STATUS_OK,
    PromptRecord,
    RunRecord,
    finish_run,
    interrupt_run,
    start_run,
)
from specreg.registry.scan import model_record
from specreg.runner.draft_check import refuse_incompatible_draft
from specreg.runner.legacy import LOOKUP, choose_engine
from specreg.runner.lookup_cache import usable_cache
from specreg.runner.measure import load_verdict_of, measure
from specreg.runner.measurement import Measurement, MeasurementInterrupted
from specreg.runner.protocol import DISTURBED
from specreg.runner.verify import PromptVerdict, Verification, judge
from specreg.runner.workload import Workload
from specreg.stacks import NGRAM_CACHE
from specreg.terms import (
    DEFAULT_N_PREDICT,
    DEFAULT_REPEATS,
    ENGINE_AUTO,
    ENGINE_SERVER,
    REGIME_FIRST,
    STARTUP_TIMEOUT_S,
)


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


def _prompt_records(
    m: Measurement, verdicts: tuple[PromptVerdict, ...] = ()
) -> tuple[PromptRecord, ...]:
    by_id = {v.prompt_id: v for v in verdicts}
    out = []
    for p in m.prompts:
        tps = p.tps
        v = by_id.get(p.prompt.prompt_id)
        first = p.samples[0] if p.samples else None
        out.append(
            PromptRecord(
                samples_draft_n=tuple(s.draft_n for s in p.samples),
                samples_draft_n_accepted=tuple(s.draft_n_accepted for s in p.samples),
                samples_session=p.sessions,
                samples_position=p.positions,
                prompt_id=p.prompt.prompt_id,
                prompt_sha256=p.prompt.sha256,
                n_samples=len(p.samples),
                prompt_n=first.prompt_n if first else None,
                predicted_n=first.predicted_n if first else None,
                tokens_per_s=p.tps_median if tps else None,
                tokens_per_s_lo=min(tps) if tps else None,
                tokens_per_s_hi=max(tps) if tps else None,
                samples_tps=tps,
                foreign_cpu_s=tuple(s.foreign_cpu_s or 0.0 for s in p.samples),
                draft_n=p.draft_n,
                draft_n_accepted=p.draft_n_accepted,
                output_sha256=_tokens_sha(p.tokens) if p.tokens or not first else _text_sha(first),
                stop_type=first.stop_type if first else None,
                verdict=v.verdict if v else None,
                divergence=v.to_json() if v else None,
                prompt_text=p.prompt.text,
                output_text=first.content if first else None,
                type_figures=spec_stats.to_json(p.type_figures),
            )
        )
    return tuple(out)


def _tokens_sha(tokens: tuple[int, ...]) -> str:
    import hashlib

    return hashlib.sha256(",".join(map(str, tokens)).encode()).hexdigest()


def _text_sha(sample: Completion) -> str:
    """Legacy engines print text, not token ids: their output is identified by its text."""
    import hashlib

    return hashlib.sha256(b"text:" + sample.content.encode()).hexdigest()


def to_record(
    m: Measurement,
    kind: str,
    target_id: str | None,
    draft_id: str | None,
    *,
    task: str | None = None,
    verification: Verification | None = None,
    baseline_run_id: int | None = None,
    lookup_cache: LookupCache | None = None,
    baseline_disturbed: str | None = None,
) -> RunRecord:
    c = m.config
    rng = m.tokens_per_s_range
    failure = m.failure
    verdicts = verification.prompts if verification else ()
    flags = m.replay_flags
    phases = m.phase_figures
    # Other processes' load, or repeats spread beyond the quiet noise floor (issue 28).
    load = load_verdict_of(m)
    disturbed = load.reason or (
        f"its baseline run was disturbed ({baseline_disturbed})" if baseline_disturbed else None
    )
    return RunRecord(
        regime=m.protocol.regime if m.protocol else REGIME_FIRST,
        protocol={**m.protocol.to_json(), "load": load.facts} if m.protocol else None,
        repeat_figures=tuple(f.to_json() for f in m.repeat_figures),
        phase_figures={k: f.to_json() for k, f in phases.items()} if phases else None,
        trusted=not flags and not disturbed,
        trust_reason=(
            "replay-suspect: later repeats accepted far more than the first for the same "
            f"prompt ({'; '.join(flags)})"
            if flags
            else f"{DISTURBED}: {disturbed}"
            if disturbed
            else None
        ),
        kind=kind,
        status=STATUS_OK if m.ok else STATUS_FAILED,
        started_at=m.started_at,
        seconds=m.seconds,
        error_kind=failure.kind if failure else None,
        error=str(failure) if failure else None,
        llama_message=failure.llama_message if failure else None,
        target_model_id=target_id,
        draft_model_id=draft_id,
        target_path=os.fspath(m.target),
        draft_path=os.fspath(m.draft) if m.draft else None,
        config={**c.to_json(), "engine": m.engine},
        config_label=c.label,
        spec_type=c.spec_type,
        k=c.k,
        p_min=c.p_min,
        draft_threads=c.draft_threads,
        experts=c.experts,
        temperature=c.temperature,
        seed=c.seed,
        behaviour_changing=c.behaviour_changing,
        llama_version=m.install.version,
        llama_dialect=m.install.dialect,
        llama_bin_dir=os.fspath(m.install.bin_dir),
        argv=m.argv,
        host_fingerprint=m.host.fingerprint,
        host=m.host.to_json(),
        threads=m.host.threads,
        task=task,
        prompt_set=m.workload.name,
        n_predict=m.n_predict,
        repeats=m.repeats,
        speculative_active=m.speculative_active,
        tokens_per_s=m.tokens_per_s,
        tokens_per_s_lo=rng[0] if rng else None,
        tokens_per_s_hi=rng[1] if rng else None,
        draft_n=m.draft_n,
        draft_n_accepted=m.draft_n_accepted,
        acceptance=m.acceptance,
        baseline_run_id=baseline_run_id,
        speedup=verification.speedup if verification else None,
        speedup_lo=verification.speedup_range[0]
        if verification and verification.speedup_range
        else None,
        speedup_hi=verification.speedup_range[1]
        if verification and verification.speedup_range
        else None,
        verdict=verification.verdict if verification else None,
        verdict_reason=verification.reason if verification else None,
        log_path=os.fspath(m.log_path),
        lookup_cache=lookup_cache.name if lookup_cache else None,
        lookup_cache_sha256=lookup_cache.sha256 if lookup_cache else None,
        type_figures=spec_stats.to_json(m.type_figures),
        prompts=_prompt_records(m, verdicts),
    )


@dataclass(frozen=True)
class Plan:
    """Everything a run needs, resolved: models by registry id, the config's MoE key."""

    install: LlamaInstall
    host: Host
    target: ModelRecord
    draft: ModelRecord | None
    target_path: Path
    draft_path: Path | None
    config: Config
    workload: Workload
    task: str | None
    n_predict: int
    repeats: int
    startup_timeout: float
    request_timeout: float
    contention_retries: int = 2
    notes: tuple[str, ...] = ()  # things the user should know before reading the numbers
    engine: str = ENGINE_SERVER  # for the config; baselines always run on llama-server
    warm_first: int | None = None  # warm regime: prompts after the first N reported apart
    lookup_cache: LookupCache | None = None  # the workload cache ngram-cache reads

    @property
    def eog_texts(self) -> tuple[str, ...]:
        return tuple(t for t in (self.target.eos_text, self.target.eot_text) if t)


def plan(
    con: duckdb.DuckDBPyConnection,
    install: LlamaInstall,
    host: Host,
    target: Path,
    draft: Path | None,
    config: Config,
    workload: Workload,
    *,
    task: str | None = None,
    n_predict: int = DEFAULT_N_PREDICT,
    repeats: int = DEFAULT_REPEATS,
    startup_timeout: float = STARTUP_TIMEOUT_S,
    request_timeout: float = 600.0,
    contention_retries: int = 2,
    engine: str = ENGINE_AUTO,
    warm_first: int | None = None,
    lookup_cache: str | None = None,
    force: bool = False,
) -> Plan:
    """Everything a run needs, checked before anything starts. `warm_first=N` plans the warm
    regime: the workload's distinct prompts once each on one llama-server, the later ones
    (after the first N) reported apart; it takes nothing else from `repeats`. `lookup_cache`
    names a `specreg lookup-cache` for ngram-cache: checked for the target's tokenizer family
    and read as llama.cpp will read it, and refused for prompts whose own text built it."""
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
    chosen = choose_engine(install, config, engine)
    target_rec = model_record(con, target)
    draft_rec = model_record(con, draft) if draft is not None else None
    if draft_rec is not None and not force:  # llama.cpp's own word only when asked for
        refuse_incompatible_draft(con, install, target_rec, draft_rec)
    config, cache, notes = _stack_checks(con, config, chosen, target_rec, workload, lookup_cache)
    if config.stack.has("draft-mtp") and draft is None and not target_rec.has_mtp_tensors:
        raise UsageError(
            f"{Path(target).name} has no MTP (NextN) layers, so draft-mtp cannot run on it: "
            "use a draft model or an n-gram method"
        )
    if warm_first is not None:
        if chosen != ENGINE_SERVER:
            raise UsageError(
                f"{param('warm_first')} needs llama-server, and {config.spec_type} runs on "
                f"{chosen} here (one process per prompt keeps no state): drop "
                f"{param('warm_first')}"
            )
        workload.held_out(warm_first)  # distinct later prompts, or a one-line usage error
        if workload.repeated():
            raise UsageError(
                f"{', '.join(workload.repeated())} repeat(s) an earlier prompt: "
                f"{param('warm_first')} sends "
                "distinct prompts, never replays"
            )
    if chosen != ENGINE_SERVER:
        how = "its own n-gram cache lookup" if chosen == LOOKUP else "draft-model speculation"
        notes.append(
            f"{config.spec_type} runs on {chosen} ({how}), one process per prompt; it prints "
            "text, so verification compares text"
        )
    if config.experts is not None:
        if target_rec.expert_count and config.experts > target_rec.expert_count:
            raise UsageError(
                f"{param('experts')} {config.experts} exceeds the {target_rec.expert_count} "
                "experts of "
                f"{Path(target).name}"
            )
        if not target_rec.is_moe:
            notes.append(
                f"{Path(target).name} is not a mixture of experts: llama.cpp ignores the "
                "expert-count override, so expect the baseline's output"
            )
    return Plan(
        notes=tuple(notes),
        engine=chosen,
        install=install,
        host=host,
        target=target_rec,
        draft=draft_rec,
        target_path=Path(target).resolve(),
        draft_path=Path(draft).resolve() if draft is not None else None,
        config=with_expert_key(config, target_rec),
        workload=workload,
        task=task,
        n_predict=n_predict,
        repeats=repeats,
        startup_timeout=startup_timeout,
        request_timeout=request_timeout,
        contention_retries=contention_retries,
        warm_first=warm_first,
        lookup_cache=cache,
    )


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


def _measure(p: Plan, config: Config, draft: Path | None, **kw: object) -> Measurement:
    return measure(
        p.install,
        p.host,
        config,
        p.target_path,
        draft,
        p.workload,
        n_predict=p.n_predict,
        repeats=p.repeats,
        startup_timeout=p.startup_timeout,
        request_timeout=p.request_timeout,
        contention_retries=p.contention_retries,
        eog_texts=p.eog_texts,
        **kw,  # type: ignore[arg-type]
    )


def _config_kw(p: Plan, refs: dict[str, tuple[int, ...]] | None) -> dict[str, object]:
    if p.engine != ENGINE_SERVER:
        return {"engine": p.engine}  # text only: no token ids to probe a divergence with
    return {"reference_tokens": refs}


def _started(p: Plan, kind: str, config: Config, draft: ModelRecord | None) -> RunRecord:
    """What is known before llama.cpp starts: recorded as `running` until the run ends."""
    return RunRecord(
        kind=kind,
        status="running",
        started_at=datetime.now(timezone.utc),
        config={**config.to_json(), "engine": p.engine if kind != "baseline" else ENGINE_SERVER},
        config_label=config.label,
        spec_type=config.spec_type,
        target_model_id=p.target.model_id,
        draft_model_id=draft.model_id if draft else None,
        target_path=os.fspath(p.target_path),
        draft_path=os.fspath(p.draft_path) if draft and p.draft_path else None,
        k=config.k,
        experts=config.experts,
        temperature=config.temperature,
        llama_version=p.install.version,
        host_fingerprint=p.host.fingerprint,
        task=p.task,
        prompt_set=p.workload.name,
        n_predict=p.n_predict,
        repeats=p.repeats,
    )


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
            m, "run", p.target.model_id, draft_id, task=p.task, lookup_cache=p.lookup_cache
        )

    preflight(p.host.logical_cpus, p.config.label)  # refuse a busy host before recording
    with RunLog(registry).recording(_started(p, "run", p.config, p.draft), record_of) as rec:
        m = _measure(p, p.config, p.draft_path, engine=p.engine, warm_first=p.warm_first)
        rec.done(record_of(m))
    return RunOutcome(rec.run_id, m)


def verify(registry: duckdb.DuckDBPyConnection | Registry, p: Plan) -> VerifyOutcome:
    """Baseline and config on the same prompts, a verdict, both runs recorded."""
    log = RunLog(registry)
    draft_id = p.draft.model_id if p.draft else None

    def baseline_of(m: Measurement) -> RunRecord:
        return to_record(m, "baseline", p.target.model_id, None, task=p.task)

    started = _started(p, "baseline", p.config.baseline(), None)
    preflight(p.host.logical_cpus, p.config.label)  # refuse a busy host before recording
    with log.recording(started, baseline_of) as base_rec:
        base = _measure(p, p.config.baseline(), None, with_probs=True)
        base_rec.done(baseline_of(base))
    refs = {r.prompt.prompt_id: r.tokens for r in base.prompts} if base.ok else None

    def config_of(m: Measurement, result: Verification | None = None) -> RunRecord:
        return to_record(
            m, "verify", p.target.model_id, draft_id, task=p.task, verification=result,
            baseline_run_id=base_rec.run_id, lookup_cache=p.lookup_cache,
            baseline_disturbed=load_verdict_of(base).reason,
        )  # fmt: skip

    with log.recording(_started(p, "verify", p.config, p.draft), config_of) as rec:
        if base.ok:
            cfg = _measure(p, p.config, p.draft_path, **_config_kw(p, refs))
        else:
            # No point starting the config's server when the plain model does not even run.
            cfg = replace(base, config=p.config, draft=p.draft_path, prompts=(), engine=p.engine)
        result = judge(base, cfg)
        rec.done(config_of(cfg, result))
    return VerifyOutcome(base_rec.run_id, rec.run_id, result)
