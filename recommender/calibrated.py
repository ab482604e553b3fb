"""This host's calibration (`specreg calibrate`) as cost-model facts for the recommender.

A calibration is llama-bench's time for one pass over 1, 2, 4, ... 32 tokens and for plain
generation, per model, host fingerprint and thread count (registry/calibration.py). The cost
model needs, per configuration: the target's verify cost at its K in single steps, the target's
seconds per generated token, the draft's step relative to the target's, and the draft's pass over
the same K + 1 tokens (llama-server's draft-simple feeds the draft every batch the target
decodes). These are ratios of one tool's timings, so they hold whatever measured the baseline.
Beside them, the draft's vocabulary: llama-server samples every drafted token from it, a cost
llama-bench never pays (costmodel.SAMPLE_SECONDS_PER_VOCAB).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import duckdb

from specreg.recommender.costmodel import SERVER_PASS_FACTOR
from specreg.registry.calibration import (
    PASS_FALLBACK,
    PASS_MEASURED,
    CalibrationRecord,
    PassFactorRecord,
    latest_pass_factor,
    list_calibrations,
)
from specreg.registry.queries import get_model


@dataclass(frozen=True)
class PassFactor:
    """What llama-server's passes cost against llama-bench's on this host for the target: as
    `specreg calibrate` measured it (`record`), else the constant SERVER_PASS_FACTOR."""

    value: float
    source: str  # PASS_MEASURED | PASS_FALLBACK
    record: PassFactorRecord | None = None

    @property
    def label(self) -> str:
        if self.record is not None:
            r = self.record
            return (
                f"pass factor {self.value:.3f} (measured by specreg calibrate on "
                f"{r.measured_at:%Y-%m-%d}: llama-server {r.server_seconds * 1e3:.1f} ms a token "
                f"against llama-bench's {r.bench_seconds * 1e3:.1f})"
            )
        return (
            f"pass factor {self.value:.2f} (fallback constant: this host's was never measured; "
            "run specreg calibrate)"
        )

    def to_json(self) -> dict[str, Any]:
        r = self.record
        return {
            "value": self.value,
            "source": self.source,
            "measured_at": r.measured_at.isoformat() if r is not None else None,
            "server_seconds": r.server_seconds if r is not None else None,
            "bench_seconds": r.bench_seconds if r is not None else None,
        }


FALLBACK_PASS = PassFactor(SERVER_PASS_FACTOR, PASS_FALLBACK)


@dataclass(frozen=True)
class Calibration:
    """The calibrations of one target (and its drafts) on one host, at one thread count."""

    target: CalibrationRecord | None
    drafts: dict[str, CalibrationRecord]  # model id -> its calibration
    vocab: dict[str, int] = field(default_factory=dict)  # draft model id -> its n_vocab
    pass_factor: PassFactorRecord | None = None  # the target's, at the same thread count

    @property
    def pass_factor_figure(self) -> PassFactor:
        """The pass factor every calibrated figure is read with, and where it comes from."""
        r = self.pass_factor
        if r is None or not r.factor > 0:
            return FALLBACK_PASS
        return PassFactor(r.factor, PASS_MEASURED, r)

    @property
    def threads(self) -> int | None:
        return self.target.threads if self.target is not None else None

    def target_fields(self, k: int | None = None) -> dict[str, Any]:
        """ConfigFacts fields of the target: its step, and its verify cost at K (if given)."""
        t = self.target
        if t is None or t.gen_seconds is None or not t.batch:
            return {}
        out: dict[str, Any] = {"target_step_s": float(t.gen_seconds)}
        if self.pass_factor is not None and self.pass_factor.factor > 0:
            out["pass_factor"] = float(self.pass_factor.factor)
        if k:
            out["verify_ratio"] = float(t.verify_ratio(k))
        return out

    def draft_fields(self, draft_id: str, k: int | None = None) -> dict[str, Any]:
        """ConfigFacts fields of a draft: its step relative to the target's, its vocabulary
        (when the registry knows it) and, given K, its pass over the K + 1 tokens the target
        verifies (the draft mirrors every target batch)."""
        d = self.drafts.get(draft_id)
        t = self.target
        if d is None or t is None or not d.gen_seconds or not t.gen_seconds or not d.batch:
            return {}
        out: dict[str, Any] = {"draft_step_ratio": float(d.gen_seconds / t.gen_seconds)}
        if self.vocab.get(draft_id):
            out["draft_n_vocab"] = self.vocab[draft_id]
        if k:
            out["draft_pass_ratio"] = float(d.verify_ratio(k))
        return out

    @property
    def compute_bound_tps(self) -> float | None:
        """Tokens/s if every token cost only its arithmetic: the marginal cost of a token in
        the largest batches measured (the compute roof of this host for this model)."""
        t = self.target
        if t is None or len(t.batch) < 2:
            return None
        a, b = t.batch[-2], t.batch[-1]
        marginal = (b.seconds - a.seconds) / (b.n_tokens - a.n_tokens)
        return 1.0 / marginal if marginal > 0 else None


def load_calibration(
    con: duckdb.DuckDBPyConnection,
    host_fingerprint: str | None,
    target_id: str,
    draft_ids: Sequence[str] = (),
    threads: int | None = None,
) -> Calibration:
    """The newest calibration of the target on this host (at `threads` when given and measured,
    else the newest at any thread count), and its drafts' at the same thread count (with each
    draft's vocabulary from the registry)."""
    empty = Calibration(None, {})
    if host_fingerprint is None:
        return empty
    try:
        mine = list_calibrations(con, host_fingerprint=host_fingerprint, model_id=target_id)
    except duckdb.Error:  # a registry from before migration 9 has no calibrations
        return empty
    if not mine:
        return empty
    target = next((c for c in mine if c.threads == threads), mine[0])
    drafts: dict[str, CalibrationRecord] = {}
    for d in draft_ids:
        found = list_calibrations(
            con, host_fingerprint=host_fingerprint, model_id=d, threads=target.threads
        )
        if found:
            drafts[d] = found[0]
    vocab: dict[str, int] = {}
    for d in drafts:
        rec = get_model(con, d)
        if rec is not None and rec.n_tokens:
            vocab[d] = int(rec.n_tokens)
    factor = latest_pass_factor(con, host_fingerprint, target_id, target.threads)
    return Calibration(target, drafts, vocab, factor)
