"""What a calibrated small host pays per token in llama-server beyond llama-bench's timings
(issue 26): every decode call a constant factor more, a drafted token a sampling cost that
grows with the draft's vocabulary (not with its step), and no residual learned on the prior's
modelled hosts on top of costs measured here."""

from __future__ import annotations

import numpy as np
import pytest

from specreg.recommender.costmodel import (
    SAMPLE_SECONDS_PER_VOCAB,
    SERVER_PASS_FACTOR,
    CostParams,
    baseline_seconds,
    predict_tps,
)
from specreg.recommender.features import ConfigFacts, feature_matrix
from specreg.recommender.predictor import ResidualTrees, SpeedPredictor
from specreg.terms import Method

STEP_S = 0.0319  # Qwen2.5-Coder-1.5B's llama-bench step on the 2-core development host
QWEN_VOCAB = 151936

PLAIN = ConfigFacts(
    bandwidth_gbs=20, physical_cores=2, target_params_b=1.54, target_active_b=1.54,
    target_bpw=5.8, target_gb=1.12, target_arch_family="qwen2", target_is_moe=False,
    target_is_hybrid=False, default_experts=0, method=Method.NONE, k=0, experts=0,
    temperature=0.0, task="code", target_step_s=STEP_S,
)  # fmt: skip


def _draft(k: int, step_ratio: float, n_vocab: int) -> ConfigFacts:
    """A calibrated draft whose pass over K + 1 tokens costs 1 + K/4 of its steps."""
    return PLAIN.with_(
        method=Method.DRAFT, k=k, draft_params_b=0.49, draft_bpw=8.0, draft_gb=0.49,
        draft_arch_family="qwen2", tok_relation="identical", verify_ratio=1.0 + k / 2,
        draft_step_ratio=step_ratio, draft_pass_ratio=1.0 + k / 4, draft_n_vocab=n_vocab,
    )  # fmt: skip


def _seconds_per_step(c: ConfigFacts) -> float:
    """Seconds of one speculative step, from the model's tokens/s at its acceptance."""
    X = feature_matrix([c])
    tps, a = predict_tps(X, CostParams())
    e = (1 - a[0] ** (c.k + 1)) / (1 - a[0])
    return float(e / tps[0])


def test_calibrated_plain_is_the_server_step() -> None:
    X = feature_matrix([PLAIN, PLAIN.with_(baseline_tps=27.0)])
    served, measured = baseline_seconds(X, CostParams())
    assert served == pytest.approx(SERVER_PASS_FACTOR * STEP_S)
    assert measured == pytest.approx(1 / 27.0)  # a run's figure is the server's already
    # the development host's plain runs: 37.0 ms a token (median of five tasks)
    assert 0.035 < served < 0.039


def test_a_measured_pass_factor_replaces_the_constant() -> None:
    """Issue 40: `calibrate` measures the factor per host and model; the constant is only the
    fallback of a host never calibrated."""
    X = feature_matrix([PLAIN.with_(pass_factor=0.97), PLAIN])
    measured, fallback = baseline_seconds(X, CostParams())
    assert measured == pytest.approx(0.97 * STEP_S)
    assert fallback == pytest.approx(SERVER_PASS_FACTOR * STEP_S)
    # every calibrated figure moves with it alike: a draft's step is a share of the target's
    draft = _draft(4, 0.4, QWEN_VOCAB)
    fast, slow = predict_tps(feature_matrix([draft.with_(pass_factor=0.97), draft]), CostParams())[
        0
    ]
    assert fast / slow == pytest.approx(SERVER_PASS_FACTOR / 0.97, rel=0.02)


def test_a_drafted_token_costs_seconds_of_vocabulary_not_steps() -> None:
    """Two drafts of different speed pay the same seconds per drafted token beyond their
    steps when they share a vocabulary; a vocabulary three times larger pays three times."""
    k = 8

    def extra(step_ratio: float, n_vocab: int) -> float:
        c = _draft(k, step_ratio, n_vocab)
        bare = _seconds_per_step(c.with_(draft_n_vocab=0))
        return (_seconds_per_step(c) - bare) / k

    fast, slow = extra(0.02, 49152), extra(0.7, 49152)
    assert fast == pytest.approx(slow, rel=1e-6)
    assert fast == pytest.approx(SAMPLE_SECONDS_PER_VOCAB * 49152, rel=1e-6)
    assert extra(0.7, QWEN_VOCAB) == pytest.approx(fast * QWEN_VOCAB / 49152, rel=1e-6)
    # Qwen2.5-Coder-0.5B (21.9 ms a llama-bench step): about 0.1 of a step; a tiny draft of
    # 0.7 ms (the synthetic d128 pair's, 49k entries): about one step
    assert 0.08 < extra(0.686, QWEN_VOCAB) / (0.686 * STEP_S) < 0.14
    assert 0.8 < fast / (0.022 * STEP_S) < 1.3


def test_residual_is_not_applied_to_calibrated_rows() -> None:
    """A learned residual of x2 moves the prior's modelled rows, not this host's calibrated."""
    trees = ResidualTrees(
        init=float(np.log(2.0)), rate=1.0, feature=np.zeros((1, 1), dtype=np.intp),
        threshold=np.zeros((1, 1)), left=np.full((1, 1), -1, dtype=np.intp),
        right=np.full((1, 1), -1, dtype=np.intp), value=np.zeros((1, 1)), depth=1,
    )  # fmt: skip
    model = SpeedPredictor(CostParams(), trees, (), noise=0.1, band=0.8)
    X = feature_matrix([PLAIN, PLAIN.with_(target_step_s=float("nan"))])
    calibrated, modelled = model.predict(X) / model.predict_structural(X)
    assert calibrated == pytest.approx(1.0)
    assert modelled == pytest.approx(2.0)
