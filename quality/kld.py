"""What a lossy knob costs in output, measured: fewer MoE experts, or a smaller quant.

`measure_quality` compares the lossy configuration with its lossless reference on task texts
using the build's own llama-perplexity: the reference's logits are saved once per model, text
and build (`LogitsCache`), then `--kl-divergence` scores the lossy configuration against
them. Every measurement is recorded in the registry, failed ones included.

The reference is the target itself with its default expert count (`--experts N`), or another
quantization of the same model (`--against REF`), or both at once.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from importlib.resources import files
from pathlib import Path
from typing import Any, ClassVar

import duckdb

from specreg.errors import UsageError, param
from specreg.home import cache_dir
from specreg.host.load import measurement_lock
from specreg.host.machine import Host
from specreg.jsonout import document
from specreg.llama.config import Config
from specreg.llama.install import LlamaInstall
from specreg.llama.perplexity import (
    DEFAULT_CTX,
    DEFAULT_MAX_LOGITS_BYTES,
    DEFAULT_TIMEOUT_S,
    KldRun,
    KldStats,
    LogitsCache,
    Perplexity,
    PerplexityFailed,
    logits_key,
)
from specreg.llama.process import ServerFailed
from specreg.registry.quality_store import (
    METHOD_KLD,
    PURPOSE_QUALITY,
    TEXT_SHIPPED,
    TEXT_USER,
    QualityRecord,
    record_quality,
)
from specreg.registry.queries import ModelRecord
from specreg.registry.scan import model_record
from specreg.runner.runs import with_expert_key
from specreg.terms import TASKS, canonical_task

log = logging.getLogger(__name__)

# Chunks of each text scored by default: 4 x 63 = 252 tokens at the default chunk length.
DEFAULT_CHUNKS = 4


@dataclass(frozen=True)
class TextSource:
    """One text llama-perplexity reads: a shipped task text, the user's, or a generated one."""

    name: str
    task: str | None
    path: Path
    sha256: str
    source: str  # shipped | user | generated

    def record_fields(self) -> dict[str, Any]:
        """The columns of a quality record that say which text it scored."""
        return {
            "task": self.task,
            "text_name": self.name,
            "text_sha256": self.sha256,
            "text_source": self.source,
        }


def _sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def shipped_text(task: str) -> TextSource:
    """The text specreg ships for `task` (quality/texts/<task>.txt, written for specreg; one
    for every task in specreg.terms.TASKS) or for an alias of one."""
    task = canonical_task(task)
    if task not in TASKS:
        raise UsageError(f"no shipped text for task {task!r}: use one of {', '.join(TASKS)}")
    resource = files("specreg.quality").joinpath("texts").joinpath(f"{task}.txt")
    path = Path(str(resource))
    if not path.is_file():  # a zipped install: llama-perplexity needs a real file
        path = cache_dir() / "texts" / f"{task}.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(resource.read_bytes())
    return TextSource(task, task, path, _sha256_file(path), TEXT_SHIPPED)


def user_text(path: Path) -> TextSource:
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise UsageError(f"cannot read the text {path}: {err.strerror or err}") from err
    if not raw.strip():
        raise UsageError(f"the text {path} is empty: give a text of a few hundred words or more")
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise UsageError(f"the text {path} is not UTF-8 (byte {err.start}): convert it") from err
    return TextSource(path.stem, None, path.resolve(), hashlib.sha256(raw).hexdigest(), TEXT_USER)


def quality_texts(tasks: Sequence[str] = (), paths: Sequence[Path] = ()) -> tuple[TextSource, ...]:
    """The user's texts when given, else the shipped texts of `tasks` (all by default)."""
    if paths:
        return tuple(user_text(p) for p in paths)
    return tuple(shipped_text(t) for t in (tasks or TASKS))


def same_tokenizer(a: ModelRecord, b: ModelRecord) -> bool:
    if a.vocab_sha and b.vocab_sha:
        return a.vocab_sha == b.vocab_sha
    return (a.n_tokens, a.tok_fingerprint) == (b.n_tokens, b.tok_fingerprint)


@dataclass(frozen=True)
class QualityPlan:
    """A checked quality request: models by registry record, the override to apply."""

    target: ModelRecord
    reference: ModelRecord
    target_path: Path
    reference_path: Path
    experts: int | None
    expert_key: str | None

    @property
    def overrides(self) -> tuple[str, ...]:
        if self.experts is None or not self.expert_key:
            return ()
        return (f"{self.expert_key}=int:{self.experts}",)

    @property
    def label(self) -> str:
        parts = [Path(self.target_path).name]
        if self.experts is not None:
            parts.append(f"experts={self.experts}")
        return " ".join(parts)


def plan_quality(
    con: duckdb.DuckDBPyConnection,
    target: Path,
    *,
    reference: Path | None = None,
    experts: int | None = None,
) -> QualityPlan:
    """Check a request; a bad one raises `UsageError` with one line that says what to do."""
    if experts is None and reference is None:
        raise UsageError(
            f"nothing to compare: pass {param('experts', 'N')} (fewer MoE experts) or "
            f"{param('against', 'REFERENCE.gguf')} (the same model at a lossless quantization)"
        )
    t = model_record(con, target)
    ref = model_record(con, reference) if reference is not None else t
    key = None
    if experts is not None:
        name = Path(target).name
        if experts < 1:
            raise UsageError(f"{param('experts')} must be at least 1, got {experts}")
        if not t.is_moe or not t.expert_count:
            raise UsageError(
                f"{name} is a dense model ({t.architecture or 'unknown architecture'}): "
                f"{param('experts')} applies to mixture-of-experts models only"
            )
        if experts > t.expert_count:
            raise UsageError(
                f"{param('experts')} {experts} is more than the {t.expert_count} experts {name} "
                "has: "
                f"use 1 to {t.expert_count} (default {t.expert_used_count})"
            )
        key = with_expert_key(Config(experts=experts), t).expert_key
    if reference is not None and not same_tokenizer(t, ref):
        raise UsageError(
            f"{Path(reference).name} has another tokenizer than {Path(target).name} "
            f"({ref.n_tokens} vs {t.n_tokens} ids): {param('against')} needs the same model at "
            "another "
            "quantization"
        )
    return QualityPlan(
        target=t,
        reference=ref,
        target_path=Path(target).resolve(),
        reference_path=Path(reference if reference is not None else target).resolve(),
        experts=experts,
        expert_key=key,
    )


@dataclass(frozen=True)
class QualityPoint:
    """One text's measurement. `stats` is None when it failed (`error` says why)."""

    text: TextSource
    measurement_id: int
    stats: KldStats | None
    n_tokens: int | None
    ctx: int
    reference_cached: bool
    seconds: float
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.stats is not None


@dataclass(frozen=True)
class QualityResult:
    JSON_KIND: ClassVar[str] = "quality"
    JSON_VERSION: ClassVar[str] = "1"

    target: str
    target_id: str
    reference: str
    reference_id: str
    experts: int | None
    default_experts: int | None
    expert_count: int | None
    build: str
    llama_version: str
    points: tuple[QualityPoint, ...]

    @property
    def ok(self) -> bool:
        return all(p.ok for p in self.points)

    def to_json(self) -> dict[str, Any]:
        points = []
        for p in self.points:
            s = p.stats
            points.append(
                {
                    "measurement_id": p.measurement_id,
                    "task": p.text.task,
                    "text": p.text.name,
                    "text_source": p.text.source,
                    "text_sha256": p.text.sha256,
                    "ok": p.ok,
                    "error": p.error,
                    "n_tokens": p.n_tokens,
                    "ctx": p.ctx,
                    "reference_cached": p.reference_cached,
                    "seconds": p.seconds,
                    "mean_kld": s.mean_kld if s else None,
                    "mean_kld_unc": s.mean_kld_unc if s else None,
                    "kld_p99": s.kld_p99 if s else None,
                    "kld_percentiles": s.percentiles if s else None,
                    "same_top": s.same_top if s else None,
                    "same_top_unc": s.same_top_unc if s else None,
                    "ppl": s.ppl if s else None,
                    "ppl_base": s.ppl_base if s else None,
                    "ln_ppl_ratio": s.ln_ppl_ratio if s else None,
                    "ln_ppl_ratio_unc": s.ln_ppl_ratio_unc if s else None,
                }
            )
        return document(
            self.JSON_KIND,
            self.JSON_VERSION,
            {
                "target": self.target,
                "target_id": self.target_id,
                "reference": self.reference,
                "reference_id": self.reference_id,
                "experts": self.experts,
                "default_experts": self.default_experts,
                "expert_count": self.expert_count,
                "llama_build": self.build,
                "llama_version": self.llama_version,
                "points": points,
            },
        )


@dataclass(frozen=True)
class Measuring:
    """What every logit comparison of one command shares: tool, host, cache, limits."""

    install: LlamaInstall
    host: Host
    ctx: int = DEFAULT_CTX
    chunks: int | None = DEFAULT_CHUNKS
    threads: int | None = None
    timeout: float = DEFAULT_TIMEOUT_S
    max_logits_bytes: int = DEFAULT_MAX_LOGITS_BYTES
    cache: LogitsCache | None = None
    notify: Callable[[str], None] | None = None

    def tool(self) -> Perplexity:
        return Perplexity(self.install, self.host, threads=self.threads, timeout=self.timeout)

    def logits_cache(self) -> LogitsCache:
        return self.cache or LogitsCache()

    def say(self, message: str) -> None:
        log.info("%s", message)
        if self.notify:
            self.notify(message)

    def base_record(self, tool: Perplexity, purpose: str, **facts: Any) -> QualityRecord:
        """A record with what is known before anything ran: the build, the host, the text."""
        known: dict[str, Any] = {
            "purpose": purpose,
            "status": "failed",
            "started_at": datetime.now(timezone.utc),
            "llama_version": self.install.version,
            "llama_build_id": tool.build,
            "llama_bin_dir": os.fspath(self.install.bin_dir),
            "host_fingerprint": self.host.fingerprint,
            "host": self.host.to_json(),
            "threads": tool.threads,
            "ctx": self.ctx,
            "log_path": os.fspath(tool.log_path),
        }
        return QualityRecord(**{**known, **facts})


def stats_fields(stats: KldStats) -> dict[str, Any]:
    """The registry columns of a `--kl-divergence` result."""
    pct = stats.percentiles
    return {
        "mean_kld": stats.mean_kld,
        "mean_kld_unc": stats.mean_kld_unc,
        "kld_median": pct.get("median"),
        "kld_p90": pct.get("p90"),
        "kld_p95": pct.get("p95"),
        "kld_p99": pct.get("p99"),
        "kld_p999": pct.get("p999"),
        "kld_max": pct.get("max"),
        "same_top": stats.same_top,
        "same_top_unc": stats.same_top_unc,
        "ppl": stats.ppl,
        "ppl_unc": stats.ppl_unc,
        "ppl_base": stats.ppl_base,
        "ppl_base_unc": stats.ppl_base_unc,
        "ln_ppl_ratio": stats.ln_ppl_ratio,
        "ln_ppl_ratio_unc": stats.ln_ppl_ratio_unc,
        "rms_dp": stats.rms_dp,
    }


def failure_fields(err: ServerFailed | UsageError) -> dict[str, Any]:
    if isinstance(err, ServerFailed):  # llama-perplexity's failures are llama-server's kind
        return {"error_kind": err.kind, "error": str(err), "llama_message": err.llama_message}
    return {"error_kind": "usage", "error": str(err)}


def record_failure(
    con: duckdb.DuckDBPyConnection, rec: QualityRecord, t0: float, err: ServerFailed | UsageError
) -> tuple[int, float]:
    """Record a measurement begun at `t0` that failed with `err`: its id and its seconds."""
    seconds = time.monotonic() - t0
    return record_quality(con, replace(rec, seconds=seconds, **failure_fields(err))), seconds


def record_kld(
    con: duckdb.DuckDBPyConnection, rec: QualityRecord, t0: float, run: KldRun, **more: Any
) -> tuple[int, float]:
    """Record a `--kl-divergence` run begun at `t0` (with `more` columns): its id, seconds."""
    seconds = time.monotonic() - t0
    done = replace(
        rec, status="ok", seconds=seconds, n_tokens=run.n_tokens, n_chunks=run.n_chunks,
        argv=run.argv, **stats_fields(run.stats), **more,
    )  # fmt: skip
    return record_quality(con, done), seconds


def measure_quality(
    con: duckdb.DuckDBPyConnection,
    m: Measuring,
    plan: QualityPlan,
    texts: Sequence[TextSource],
) -> QualityResult:
    """Score the planned lossy configuration against its reference on every text and record
    each measurement. llama.cpp failures are recorded and returned, never raised."""
    tool = m.tool()
    config = {
        "experts": plan.experts,
        "expert_key": plan.expert_key,
        "overrides": list(plan.overrides),
        "reference": os.fspath(plan.reference_path),
        "ctx": m.ctx,
        "chunks": m.chunks,
        "threads": tool.threads,
    }
    cache = m.logits_cache()
    points = [_quality_point(con, m, tool, cache, plan, text, config) for text in texts]
    return QualityResult(
        target=os.fspath(plan.target_path),
        target_id=plan.target.model_id,
        reference=os.fspath(plan.reference_path),
        reference_id=plan.reference.model_id,
        experts=plan.experts,
        default_experts=plan.target.expert_used_count,
        expert_count=plan.target.expert_count,
        build=tool.build,
        llama_version=m.install.version,
        points=tuple(points),
    )


def _quality_point(
    con: duckdb.DuckDBPyConnection,
    m: Measuring,
    tool: Perplexity,
    cache: LogitsCache,
    plan: QualityPlan,
    text: TextSource,
    config: dict[str, Any],
) -> QualityPoint:
    """The planned configuration scored against its reference on one text, recorded."""
    t0 = time.monotonic()
    rec = m.base_record(
        tool,
        PURPOSE_QUALITY,
        config=config,
        base_model_id=plan.reference.model_id,
        base_path=os.fspath(plan.reference_path),
        model_id=plan.target.model_id,
        model_path=os.fspath(plan.target_path),
        experts=plan.experts,
        expert_key=plan.expert_key,
        **text.record_fields(),
        n_chunks=m.chunks,
        method=METHOD_KLD,
        n_vocab_base=plan.reference.n_tokens,
        n_vocab_model=plan.target.n_tokens,
    )
    key = logits_key(
        plan.reference_path, plan.reference.model_id, text.name, text.sha256, tool.build,
        m.ctx, m.chunks,
    )  # fmt: skip
    cached = False
    try:
        # its turn on the host (host/load.py): untimed, but it loads every core
        with measurement_lock(f"quality of {plan.label} on {text.name}"):
            base = cache.ensure(
                tool, key, text.path, plan.reference.n_tokens or 0,
                max_bytes=m.max_logits_bytes, notify=m.notify,
            )  # fmt: skip
            cached = base.cached
            m.say(f"scoring {plan.label} against {plan.reference_path.name} on {text.name}")
            run = tool.kl_divergence(
                plan.target_path, text.path, base.path, overrides=plan.overrides
            )
    except PerplexityFailed as err:
        mid, seconds = record_failure(con, rec, t0, err)
        return QualityPoint(text, mid, None, None, m.ctx, cached, seconds, str(err))
    mid, seconds = record_kld(con, rec, t0, run, ctx=run.ctx)
    return QualityPoint(text, mid, run.stats, run.n_tokens, run.ctx, base.cached, seconds)
