"""A calibration decides the verify cost before any speculative run: the same target, draft and
model flip between "speculate" and "do not" with this host's llama-bench curve."""

from __future__ import annotations

from datetime import datetime, timezone

import duckdb
import pytest

from specreg.host.facts import HostFacts
from specreg.recommender.calibrated import load_calibration
from specreg.recommender.local import output_share
from specreg.recommender.prior import load_prior
from specreg.recommender.recommend import recommend
from specreg.registry.calibration import (
    KIND_BATCH,
    KIND_GEN,
    CalibrationRecord,
    point,
    record_calibration,
)
from specreg.registry.queries import ModelRecord
from specreg.terms import Method

from support.recommender import demo_model

# A many-core host: bandwidth and cores of the reference EPYC, so the prior alone speculates.
HOST = HostFacts(460.0, 96, "user", fingerprint="calibrated-host")
SIZES = (1, 2, 4, 8, 16, 32)


def _calibrate(
    con: duckdb.DuckDBPyConnection, model: ModelRecord, step_s: float, per_token: float
) -> None:
    """A curve: pass(n) = step_s + per_token * (n - 1); generation at step_s per token."""
    pts = [point(KIND_BATCH, n, (step_s + per_token * (n - 1),)) for n in SIZES]
    rec = CalibrationRecord(
        host_fingerprint=HOST.fingerprint or "",
        model_id=model.model_id,
        model_path=model.path,
        role="target",
        threads=96,
        measured_at=datetime.now(timezone.utc),
        repetitions=1,
        points=(*pts, point(KIND_GEN, 16, (16 * step_s,))),
    )
    record_calibration(con, rec)


def _draft_of(con: duckdb.DuckDBPyConnection, target: ModelRecord) -> ModelRecord:
    from specreg.recommender.candidates import usable_drafts as _drafts

    return next(d for d, _ in _drafts(con, target) if d.size_label == "0.5B")


def _rec(con, model):  # type: ignore[no-untyped-def]
    target = demo_model(con, "Qwen2.5-Coder", "32B")
    return recommend(
        con, target.model_id, model=model, host=HOST, task="code",
        observations=load_prior().observations,
    )  # fmt: skip


def test_compute_bound_curve_says_do_not_speculate(demo_con, prior_model) -> None:  # type: ignore[no-untyped-def]
    target = demo_model(demo_con, "Qwen2.5-Coder", "32B")
    before = _rec(demo_con, prior_model)
    assert before.speculate and before.best.method is Method.DRAFT
    assert "(modelled)" in before.roofline.line
    # this host: every further token in a batch costs a whole step (2 cores)
    _calibrate(demo_con, target, 0.40, 0.40)
    _calibrate(demo_con, _draft_of(demo_con, target), 0.012, 0.012)
    after = _rec(demo_con, prior_model)
    assert not after.speculate and after.best.method is Method.NONE
    drafts = [o for o in after.options if o.method is Method.DRAFT]
    assert max(o.speedup for o in drafts) < 1.0
    k4 = next(o for o in drafts if o.k == 4)
    # a pass over 5 tokens is 5 steps, plus a logits row per drafted token (llama-bench's
    # passes compute only the last one)
    cost = 5.0 + 4 * output_share(target)
    assert 5.05 < cost < 5.15
    assert any(f"verifying K=4 costs {cost:.2f}x a single step (calibrated on this host)" in w
               for w in k4.why)  # fmt: skip
    line = after.roofline.line
    assert "; compute 2.5 t/s bound (calibrated)" in line
    assert line.endswith(f"verifying K=4 costs {cost:.2f}x a step")


def test_flat_curve_keeps_long_k(demo_con, prior_model) -> None:  # type: ignore[no-untyped-def]
    target = demo_model(demo_con, "Qwen2.5-Coder", "32B")
    _calibrate(demo_con, target, 0.40, 0.0005)  # memory-bound to far past K=32
    _calibrate(demo_con, _draft_of(demo_con, target), 0.012, 0.0001)
    rec = _rec(demo_con, prior_model)
    assert rec.speculate and rec.best.method is Method.DRAFT
    assert rec.best.k is not None and rec.best.k >= 12


def test_load_calibration_matches_threads_and_drafts(demo_con) -> None:  # type: ignore[no-untyped-def]
    target = demo_model(demo_con, "Qwen2.5-Coder", "32B")
    draft = _draft_of(demo_con, target)
    assert load_calibration(demo_con, HOST.fingerprint, target.model_id).target is None
    _calibrate(demo_con, target, 0.40, 0.20)
    _calibrate(demo_con, draft, 0.010, 0.005)
    cal = load_calibration(demo_con, HOST.fingerprint, target.model_id, [draft.model_id], 96)
    assert cal.target_fields(3) == {"target_step_s": pytest.approx(0.40),
                                    "verify_ratio": pytest.approx(2.5)}  # fmt: skip
    fields = cal.draft_fields(draft.model_id, 3)
    assert fields["draft_step_ratio"] == pytest.approx(0.010 / 0.40)
    assert fields["draft_pass_ratio"] == pytest.approx(2.5)
    assert "draft_pass_ratio" not in cal.draft_fields(draft.model_id)
    assert load_calibration(demo_con, "other-host", target.model_id).target is None
