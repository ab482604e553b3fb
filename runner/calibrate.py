"""`specreg calibrate`: this host's cost curve for a model, measured with llama.cpp's llama-bench.

Verifying K drafted tokens is one forward pass over K + 1 tokens. On a many-core host that pass
costs about as much as a single-token step up to K of 16-32 (memory-bound); on a small host it
grows almost linearly with K (compute-bound), which is why a draft that wins on the reference
EPYC loses here. `llama-bench -p 1,2,4,...,32 -n N` times exactly that curve plus plain
generation in one process (one model load); each test's repetitions are kept as samples.

Other processes' CPU use is measured per test (between llama-bench's output lines); a disturbed
test is measured again in a new invocation of just the disturbed tests, and the least disturbed
measurement is kept. The curves are stored per host fingerprint, model and thread count.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import duckdb

from specreg.errors import LlamaError, UsageError, param
from specreg.home import logs_dir
from specreg.host import progress
from specreg.host.load import current_policy, guarded, wait_quiet
from specreg.host.machine import Host, detect_host
from specreg.llama.bench import BENCH, BenchTest, bench_argv, run_bench
from specreg.llama.install import LlamaInstall, find_llama
from specreg.recommender.costmodel import SERVER_PASS_FACTOR
from specreg.registry.calibration import (
    KIND_BATCH,
    KIND_GEN,
    PASS_FALLBACK,
    PASS_MEASURED,
    CalibrationPoint,
    CalibrationRecord,
    point,
    record_calibration,
    record_pass_factor,
)
from specreg.registry.noise import (
    FALLBACK_NOISE,
    NoiseFigure,
    NoiseFloor,
    noise_figure,
    record_noise_floor,
)
from specreg.registry.queries import ModelRecord, resolve_model
from specreg.runner.pass_factor import PassFactorResult, measure_pass_factor
from specreg.runner.settings import DEFAULTS, Settings

log = logging.getLogger(__name__)

BATCH_SIZES: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
GEN_TOKENS = 128
REPETITIONS = 5
TIMEOUT_S = 1800.0
ROLE_TARGET = "target"
ROLE_DRAFT = "draft"


@dataclass(frozen=True)
class CalibrationResult:
    JSON_KIND = "calibration"
    JSON_VERSION = "2"  # 2: the pass factor and the noise floor, each with its source

    host_fingerprint: str
    records: tuple[CalibrationRecord, ...]  # target first, then its drafts; ids set
    seconds: float
    reruns: int
    # what this host's figures are after it (runner/pass_factor.py, registry/noise.py)
    pass_factor: PassFactorResult = PassFactorResult(None, "not measured")
    noise: NoiseFigure = FALLBACK_NOISE

    @property
    def contended(self) -> bool:
        return any(r.contended for r in self.records)

    @property
    def pass_factor_line(self) -> str:
        """llama-server's pass factor after this calibration, and where it comes from."""
        r = self.pass_factor.record
        if r is None:
            return (
                f"llama-server's pass factor: {SERVER_PASS_FACTOR} (fallback constant: "
                f"{self.pass_factor.skipped})"
            )
        busy = "; disturbed by other processes" if r.contended else ""
        return (
            f"llama-server's pass factor: {r.factor:.3f} (measured: {r.server_seconds * 1e3:.1f} "
            f"ms a token against llama-bench's {r.bench_seconds * 1e3:.1f}, median of "
            f"{len(r.samples)} requests{busy}; stored, what recommend reads)"
        )

    def to_json(self) -> dict[str, Any]:
        from specreg.jsonout import document, plain

        models = []
        for r in self.records:
            models.append(
                {
                    **plain(r),
                    "gen_seconds": r.gen_seconds,
                    "verify_ratio": {str(k): r.verify_ratio(k) for k in (1, 2, 4, 8, 16)},
                }
            )
        return document(
            self.JSON_KIND,
            self.JSON_VERSION,
            {
                "host_fingerprint": self.host_fingerprint,
                "contended": self.contended,
                "reruns": self.reruns,
                "seconds": self.seconds,
                "models": models,
                "pass_factor": _pass_factor_json(self.pass_factor),
                "noise_floor": self.noise.to_json(),
            },
        )


@dataclass(frozen=True)
class Bench:
    """What llama-bench measures of a model: one verify pass of each of `batch_sizes` tokens,
    `gen_tokens` of plain generation (0: none), `repetitions` of each test, and how long one
    invocation may take. The threads and the retries of a disturbed test are `Settings`'."""

    batch_sizes: tuple[int, ...] = BATCH_SIZES
    gen_tokens: int = GEN_TOKENS
    repetitions: int = REPETITIONS
    timeout: float = TIMEOUT_S

    @property
    def tests(self) -> list[tuple[str, int]]:
        """The tests, by kind and tokens."""
        return [(KIND_BATCH, n) for n in self.batch_sizes] + (
            [(KIND_GEN, self.gen_tokens)] if self.gen_tokens else []
        )


@dataclass(frozen=True)
class DraftChoice:
    """Which drafts are calibrated with a target: those `refs` names (a path, an id prefix or
    a name), else with `auto` the compatible ones in the registry, at most `limit`."""

    refs: tuple[str, ...] = ()
    auto: bool = True
    limit: int = 3

    @classmethod
    def asked(cls, refs: Sequence[str], none: bool, limit: int) -> DraftChoice:
        """`calibrate --draft ... [--no-drafts] --max-drafts N`: the drafts named, else the
        compatible ones, unless none are wanted."""
        return cls(() if none else tuple(refs), not none and not refs, limit)


DEFAULT_BENCH = Bench()
ALL_DRAFTS = DraftChoice()


@dataclass(frozen=True)
class Calibrating:
    """What every curve of one calibration shares: the llama.cpp it runs, this host, what
    llama-bench measures and the settings (threads, retries)."""

    install: LlamaInstall
    host: Host
    bench: Bench = DEFAULT_BENCH
    settings: Settings = DEFAULTS


def _pass_factor_json(result: PassFactorResult) -> dict[str, Any]:
    """The pass factor the cost model reads after this calibration, and where it comes from."""
    r = result.record
    return {
        "value": r.factor if r is not None else SERVER_PASS_FACTOR,
        "source": PASS_MEASURED if r is not None else PASS_FALLBACK,
        "skipped": result.skipped if r is None else None,
        "server_seconds": r.server_seconds if r is not None else None,
        "bench_seconds": r.bench_seconds if r is not None else None,
        "samples": list(r.samples) if r is not None else [],
        "contended": r.contended if r is not None else None,
    }


def _best(tests: Sequence[BenchTest]) -> BenchTest:
    return min(tests, key=lambda t: t.foreign_cpu_s or 0.0)


class _Curve:
    """One model's llama-bench invocations on this host, into one log."""

    def __init__(
        self, install: LlamaInstall, host: Host, model: ModelRecord, bench: Bench, threads: int
    ):
        self.install = install
        self.host = host
        self.path = Path(model.path)
        self.bench = bench
        self.threads = threads
        self.started = datetime.now(timezone.utc)
        self.log_path = logs_dir() / f"{BENCH}-{self.started.strftime('%Y%m%dT%H%M%S%f')}.log"

    def argv(self, sizes: Sequence[int], gen: int) -> list[str]:
        return bench_argv(
            self.install, self.host, self.path, threads=self.threads, batch_sizes=sizes,
            gen_tokens=gen, repetitions=self.bench.repetitions,
        )  # fmt: skip

    def run(self, sizes: Sequence[int], gen: int) -> list[BenchTest]:
        argv = self.argv(sizes, gen)
        env = self.host.env()
        return run_bench(argv, env=env, log_path=self.log_path, timeout=self.bench.timeout)


def calibrate_model(
    cal: Calibrating, model: ModelRecord, role: str = ROLE_TARGET
) -> tuple[CalibrationRecord, int]:
    """One model's curve on this host (the settings' threads, else the host's), and how many
    tests were measured again under load (up to the settings' retries each)."""
    install, host, bench, settings = cal.install, cal.host, cal.bench, cal.settings
    if not bench.batch_sizes and bench.gen_tokens <= 0:
        raise UsageError("nothing to calibrate: give batch sizes or generation tokens")
    threads = settings.threads or host.threads
    t0 = time.monotonic()
    curve = _Curve(install, host, model, bench, threads)
    found: dict[tuple[str, int], list[BenchTest]] = {}
    wanted = bench.tests
    what = f"llama-bench of {curve.path.name} ({threads} threads)"
    # The host's lock and a quiet host (host/load.py), for the measurement only.
    with guarded(host.logical_cpus, what) as load, progress.task(what, len(wanted)) as bar:
        for t in curve.run(bench.batch_sizes, bench.gen_tokens):
            found.setdefault((t.kind, t.n_tokens), []).append(t)
            bar.advance(detail=f"{t.kind} {t.n_tokens}")
        reruns = _rerun_disturbed(found, curve, settings.retries, what)
    points = [_point(found[key], host, busy=load.busy) for key in wanted]
    record = CalibrationRecord(
        host_fingerprint=host.fingerprint,
        model_id=model.model_id,
        model_path=str(curve.path),
        role=role,
        threads=threads,
        measured_at=curve.started,
        repetitions=bench.repetitions,
        points=tuple(points),
        model_bytes=model.n_bytes,
        seconds=time.monotonic() - t0,
        llama_version=install.version,
        llama_bin_dir=str(install.bin_dir),
        argv=tuple(curve.argv(bench.batch_sizes, bench.gen_tokens)),
        load_foreign_cpu=sum(p.foreign_cpu_s or 0.0 for p in points),
    )
    return record, reruns


def _point(tests: Sequence[BenchTest], host: Host, *, busy: bool) -> CalibrationPoint:
    """A test's least disturbed measurement, as a point of the curve."""
    best = _best(tests)
    return point(
        best.kind,
        best.n_tokens,
        best.samples,
        wall_s=best.wall_s,
        foreign_cpu_s=best.foreign_cpu_s,
        reruns=len(tests) - 1,
        # measured under load by --allow-load: disturbed however quiet it looked
        contended=best.contended(host.logical_cpus) or busy,
    )


def _rerun_disturbed(
    found: dict[tuple[str, int], list[BenchTest]], curve: _Curve, retries: int, what: str
) -> int:
    """Measure the tests other processes disturbed again, up to `retries` times, each time
    after the host is quiet again (saying why); how many tests were measured again."""
    wanted, host, gen_tokens = curve.bench.tests, curve.host, curve.bench.gen_tokens
    missing = [key for key in wanted if key not in found]
    if missing:
        raise LlamaError(
            f"{BENCH} did not report {', '.join(f'{k}{n}' for k, n in missing)} ({what})"
        )
    reruns = 0
    for _ in range(retries):
        disturbed = [k for k in wanted if _best(found[k]).contended(host.logical_cpus)]
        if not disturbed:
            break
        reruns += len(disturbed)
        progress.note(
            f"{what}: {', '.join(f'{k} {n}' for k, n in disturbed)} measured again: other "
            "processes took the CPU during them"
        )
        policy = current_policy()
        if not policy.allow_load:
            wait_quiet(host.logical_cpus, what, policy=policy)
        sizes = [n for kind, n in disturbed if kind == KIND_BATCH]
        gen = gen_tokens if (KIND_GEN, gen_tokens) in disturbed else 0
        for t in curve.run(sizes, gen):
            found.setdefault((t.kind, t.n_tokens), []).append(t)
    return reruns


def noise_floor_of(record: CalibrationRecord) -> NoiseFloor | None:
    """The spread of the quiet generation test's repetitions: this host's noise floor (None
    when the test was disturbed or has fewer than two repetitions)."""
    gen = next((p for p in record.points if p.kind == KIND_GEN), None)
    if gen is None or gen.contended or len(gen.samples) < 2 or min(gen.samples) <= 0:
        return None
    return NoiseFloor(
        host_fingerprint=record.host_fingerprint,
        spread=max(gen.samples) / min(gen.samples) - 1.0,
        n_samples=len(gen.samples),
        source="calibrate",
        measured_at=record.measured_at,
        model_id=record.model_id,
        threads=record.threads,
        foreign_cpu_s=gen.foreign_cpu_s,
    )


def _drafts_of(
    con: duckdb.DuckDBPyConnection, target: ModelRecord, refs: Sequence[str], auto: bool, limit: int
) -> list[ModelRecord]:
    """The given drafts, else the compatible ones the recommender would weigh: separate files
    no larger than the target, the target's architecture family first, then the smallest."""
    if refs:
        return [resolve_model(con, ref) for ref in refs]
    if not auto or limit <= 0:
        return []
    from specreg.auditor import compatible_drafts
    from specreg.registry.queries import get_model
    from specreg.terms import arch_family

    family = arch_family(target.architecture)
    found = []
    for rank, pv in enumerate(compatible_drafts(con, target)):
        m = get_model(con, pv.draft.model_id)
        # Draft heads (MTP, EAGLE) do not run on their own: llama-bench cannot time them.
        if m is None or m.draft_kind is not None or m.status != "present":
            continue
        if (m.n_bytes or 0) > (target.n_bytes or 0):
            continue
        found.append((arch_family(m.architecture) != family, rank, m))
    return [m for _, _, m in sorted(found, key=lambda f: f[:2])[:limit]]


def calibrate_in(
    con: duckdb.DuckDBPyConnection,
    target: ModelRecord,
    cal: Calibrating,
    drafts: DraftChoice = ALL_DRAFTS,
) -> CalibrationResult:
    """Calibrate `target` and its drafts on this host into the open registry `con`."""
    install, host, bench = cal.install, cal.host, cal.bench
    threads, retries = cal.settings.threads, cal.settings.retries
    if bench.repetitions < 1 or retries < 0 or (threads is not None and threads < 1):
        raise UsageError(
            f"{param('repetitions')} and {param('threads')} must be at least 1, "
            f"{param('retries')} at least 0"
        )
    t0 = time.monotonic()
    install.binary(BENCH)  # a clear error before anything runs
    chosen = _drafts_of(con, target, drafts.refs, drafts.auto, drafts.limit)
    models = [(target, ROLE_TARGET)] + [(d, ROLE_DRAFT) for d in chosen]
    records: list[CalibrationRecord] = []
    reruns = 0
    for model, role in models:
        rec, again = calibrate_model(cal, model, role)
        reruns += again
        records.append(replace(rec, calibration_id=record_calibration(con, rec)))
        floor = noise_floor_of(rec)
        if floor is not None and role == ROLE_TARGET:
            record_noise_floor(con, floor)
    # llama-server's plain decoding of the target against llama-bench's (issue 40)
    factor = measure_pass_factor(install, host, records[0], n_tokens=bench.gen_tokens)
    if factor.record is not None:
        record_pass_factor(con, factor.record)
    return CalibrationResult(
        host.fingerprint, tuple(records), time.monotonic() - t0, reruns,
        factor, noise_figure(con, host.fingerprint),
    )  # fmt: skip


def calibrate_target(
    db_path: Path,
    target: str,
    *,
    drafts: DraftChoice = ALL_DRAFTS,
    bench: Bench = DEFAULT_BENCH,
    settings: Settings = DEFAULTS,
    llama_bin: Path | None = None,
    install: LlamaInstall | None = None,
    host: Host | None = None,
) -> CalibrationResult:
    """`specreg calibrate`: TARGET and its drafts on this host, under the load guard's policy
    (the settings' options), the curves stored in the registry at `db_path`."""
    from specreg.host import load
    from specreg.registry.db import opened

    install = install or find_llama(llama_bin)
    with load.using(settings.load_policy()), opened(db_path) as con:
        cal = Calibrating(install, host or detect_host(), bench, settings)
        return calibrate_in(con, resolve_model(con, target), cal, drafts)
