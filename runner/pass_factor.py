"""llama-server's pass factor: what its plain decoding costs against llama-bench's (issue 40).

`specreg calibrate` times llama-bench; the runs, and what `recommend` predicts for them, are
llama-server's. Every decode call the server makes costs one factor more than llama-bench's of
the same size on a host (its sampling and slot loop; issue 26), and that factor is a fact of
the host and model, not a constant: one day's single samples on the development host gave
1.16, later three-sample runs 0.97. So `calibrate` measures it beside llama-bench's curve: a
llama-server of the model decodes `n_tokens` tokens plainly, `repeats` times after a warm-up,
and the median seconds per token over llama-bench's generation is the factor, stored per host,
model and thread count (registry/calibration.py, migration 13). The cost model reads it, the
constant only for a host never calibrated (recommender/costmodel.py).
"""

from __future__ import annotations

import logging
import statistics
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from specreg.errors import HostBusy, LlamaError
from specreg.home import logs_dir
from specreg.host.load import guarded
from specreg.host.machine import Host
from specreg.llama.bench import contended
from specreg.llama.config import Config, server_for
from specreg.llama.install import LlamaInstall
from specreg.llama.server import Completion
from specreg.registry.calibration import CalibrationRecord, PassFactorRecord

log = logging.getLogger(__name__)

PASS_REPEATS = 3
WARMUP_TOKENS = 4
# Plain prose the model continues for as long as asked (the end of text is ignored).
PASS_PROMPT = (
    "Write a long, detailed essay about the history of the printing press, its inventors, "
    "and how it changed science, religion and politics in Europe."
)
PASS_CTX = 1024


@dataclass(frozen=True)
class PassFactorResult:
    """A measured pass factor, or why none was measured (`skipped`)."""

    record: PassFactorRecord | None
    skipped: str | None = None


def measure_pass_factor(
    install: LlamaInstall,
    host: Host,
    calibration: CalibrationRecord,
    *,
    n_tokens: int,
    repeats: int = PASS_REPEATS,
) -> PassFactorResult:
    """llama-server's plain decoding of the calibrated model against llama-bench's generation
    in `calibration` (same host, model and threads). Nothing is measured (`skipped` says why)
    without llama-bench's generation, a llama-server in the build, or a server that runs."""
    bench = calibration.gen_seconds
    if not bench or n_tokens <= 0:
        return PassFactorResult(None, "llama-bench timed no generation")
    if not install.server.is_file():
        return PassFactorResult(None, f"no llama-server in {install.bin_dir}")
    started = datetime.now(timezone.utc)
    log_path = logs_dir() / f"pass-factor-{started.strftime('%Y%m%dT%H%M%S%f')}.log"
    config = Config(threads=calibration.threads, ctx=PASS_CTX)
    server = server_for(
        config, Path(calibration.model_path), None, install, host, log_path=log_path
    )
    body = {"prompt": PASS_PROMPT, "temperature": 0.0, "cache_prompt": False, "ignore_eos": True}
    what = f"llama-server of {Path(calibration.model_path).name} ({calibration.threads} threads)"
    samples: list[Completion] = []
    try:
        with guarded(host.logical_cpus, what), server:
            server.complete({**body, "n_predict": WARMUP_TOKENS})
            for _ in range(max(1, repeats)):
                samples.append(server.complete({**body, "n_predict": n_tokens}))
    except (LlamaError, HostBusy) as err:  # the curve stands; the factor falls back
        log.warning("pass factor not measured (%s): %s", what, err)
        return PassFactorResult(None, f"llama-server could not be timed: {err}")
    per_token = [c.predicted_ms / 1000.0 / c.predicted_n for c in samples if c.predicted_n > 0]
    if not per_token:
        return PassFactorResult(None, "llama-server decoded no tokens")
    server_s = statistics.median(per_token)
    return PassFactorResult(
        PassFactorRecord(
            host_fingerprint=calibration.host_fingerprint,
            model_id=calibration.model_id,
            threads=calibration.threads,
            measured_at=started,
            factor=server_s / bench,
            server_seconds=server_s,
            bench_seconds=bench,
            n_tokens=n_tokens,
            samples=tuple(per_token),
            calibration_id=calibration.calibration_id,
            llama_version=install.version,
            foreign_cpu_s=sum(c.foreign_cpu_s or 0.0 for c in samples),
            contended=any(contended(c.foreign_cpu_s, c.wall_s, host.logical_cpus) for c in samples),
        )
    )
