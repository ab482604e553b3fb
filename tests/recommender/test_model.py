"""The speed model: estimator contract, the formulas it is built on, the shipped prior."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from sklearn.base import clone

from specreg.recommender.costmodel import (
    CostParams,
    drafted_acceptance,
    expected_tokens_per_step,
    per_token_acceptance,
    predict_tps,
)
from specreg.recommender.evaluate import training_set
from specreg.recommender.model import SpeculationRegressor
from specreg.recommender.prior import (
    DIGESTS,
    PriorDataError,
    _rows,
    load_prior,
    load_sweep_series,
    parse_speedup,
)
from specreg.recommender.quant import bits_per_weight


@pytest.mark.parametrize(("a", "k"), [(0.0, 8), (0.5, 1), (0.8, 4), (0.95, 24)])
def test_leviathan_expected_tokens(a: float, k: int) -> None:
    # direct sum: P(at least i tokens accepted) = a^i for i = 1..k, plus the bonus token
    assert expected_tokens_per_step(a, k) == pytest.approx(sum(a**i for i in range(k + 1)))
    assert drafted_acceptance(a, k) == pytest.approx(sum(a**i for i in range(1, k + 1)) / k)


def test_expected_tokens_at_full_acceptance_is_k_plus_one() -> None:
    assert expected_tokens_per_step(1.0, 7) == pytest.approx(8.0, rel=1e-6)


rates = st.floats(0.0, 1.0)
draft_lengths = st.integers(0, 64)


@given(rates, draft_lengths)
def test_bursty_acceptance_without_burst_is_leviathans(a: float, k: int) -> None:
    assert expected_tokens_per_step(a, k, 0.0) == pytest.approx(
        sum(a**i for i in range(k + 1)), rel=1e-6
    )


@given(rates, rates, draft_lengths)
def test_bursty_acceptance_rises_with_k_and_burst_up_to_k_plus_one(
    a: float, burst: float, k: int
) -> None:
    e = float(expected_tokens_per_step(a, k, burst))
    assert 1.0 <= e <= k + 1.0 + 1e-9
    assert float(expected_tokens_per_step(a, k + 1, burst)) >= e - 1e-9
    assert e >= float(expected_tokens_per_step(a, k, 0.0)) - 1e-9  # runs never yield less
    assert float(expected_tokens_per_step(a, k, min(burst + 0.1, 1.0))) >= e - 1e-9


@pytest.mark.parametrize(("a", "burst", "k"), [(0.7, 0.5, 3), (0.9, 0.8, 6), (0.5, 1.0, 4)])
def test_bursty_acceptance_by_direct_sum(a: float, burst: float, k: int) -> None:
    # P(the first i drafted tokens accepted) = a p^(i-1), p = a + burst (1 - a)
    p = a + burst * (1 - a)
    direct = 1 + sum(a * p ** (i - 1) for i in range(1, k + 1))
    assert expected_tokens_per_step(a, k, burst) == pytest.approx(direct)
    assert per_token_acceptance(drafted_acceptance(a, k, burst), k, burst) == pytest.approx(
        a, abs=1e-6
    )


def test_bursty_acceptance_makes_long_drafts_pay() -> None:
    # independent tokens at a = 0.9 saturate at 10 a step; runs keep paying at K = 24
    e = expected_tokens_per_step(0.9, np.array([8, 24]), 0.8)
    iid = expected_tokens_per_step(0.9, np.array([8, 24]))
    assert iid[1] / iid[0] < 1.55 < e[1] / e[0]


@pytest.mark.parametrize(
    ("text", "value"),
    [("10.0x", 10.0), ("+48%", 1.48), ("-20%", 0.8), ("3.4x vs Q8_0", None), ("", None)],
)
def test_parse_speedup_wording(text: str, value: float | None) -> None:
    assert parse_speedup(text) == (pytest.approx(value) if value is not None else None)


def test_bits_per_weight_from_gguf_block_sizes() -> None:
    assert bits_per_weight("Q8_0") == pytest.approx(8.5)
    assert bits_per_weight("Q4_K_M") > bits_per_weight("Q4_K_S") > bits_per_weight("Q4_K")  # type: ignore[operator]
    assert bits_per_weight("IQ3_S") == pytest.approx(3.4375)
    assert bits_per_weight("nonsense") is None


def test_prior_is_shipped_with_provenance_and_notice() -> None:
    from importlib import resources

    data = resources.files("specreg.recommender").joinpath("data")
    notice = data.joinpath("NOTICE-epyc-inference-research").read_text()
    assert "Copyright (c) 2025-2026 Daniele Pinna" in notice and "MIT License" in notice
    assert set(DIGESTS) <= {p.name for p in data.iterdir()}
    prior = load_prior()
    sources = {o.source for o in prior.observations}
    assert sources == {"seed", "sweep"}
    reasons = {r for _, r in prior.skipped}
    assert "failed combination (compatibility evidence, not speed)" in reasons
    assert "other hardware or literature" in reasons
    assert "copy of another role's figures" in reasons
    # every K sweep of the bestk file is present as rows
    series = {o.series for o in prior.observations if o.series}
    assert {s.series for s in load_sweep_series()} <= series
    assert len(load_sweep_series()) == 46


def test_prior_facts_come_from_columns_not_roles() -> None:
    obs = {o.row_id: o for o in load_prior().observations}
    # coder_escalation ran a different model than its registry entry: the run model's facts win
    c = obs["epyc_sweeps.csv:9"].config
    assert (c.target_params_b, c.target_active_b, c.target_is_moe) == (53.0, 3.0, True)
    headline = obs["seed_runs.csv:r014"]
    assert headline.config.k == 24 and headline.config.task == "code"
    assert headline.speedup == pytest.approx(28.79 / 2.89)


def test_an_edited_data_file_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(DIGESTS, "seed_runs.csv", "0" * 64)
    with pytest.raises(PriorDataError, match="differs from data version 1"):
        _rows("seed_runs.csv")


@pytest.fixture(scope="module")
def small_data():  # type: ignore[no-untyped-def]
    return training_set(load_prior().observations)


def test_estimator_contract(small_data) -> None:  # type: ignore[no-untyped-def]
    est = SpeculationRegressor(n_members=1, residual_estimators=10, random_state=3)
    assert not [k for k in vars(est) if k.endswith("_")]  # __init__ stores parameters only
    params = est.get_params()
    assert params["random_state"] == 3 and params["n_members"] == 1
    fitted = est.fit(small_data.X, small_data.y, groups=small_data.groups)
    assert fitted is est
    learned = {k for k in vars(est) if k.endswith("_")}
    assert {"params_", "residual_", "members_", "noise_", "n_features_in_"} <= learned
    twin = clone(est).fit(small_data.X, small_data.y, groups=small_data.groups)
    np.testing.assert_allclose(twin.predict(small_data.X[:20]), est.predict(small_data.X[:20]))
    lo, mid, hi = est.predict_interval(small_data.X[:20])
    assert np.all(lo < mid) and np.all(mid < hi)


def test_fit_rejects_bad_input(small_data) -> None:  # type: ignore[no-untyped-def]
    est = SpeculationRegressor(n_members=0, residual=False)
    with pytest.raises(ValueError, match="columns"):
        est.fit(small_data.X[:, :5], small_data.y)
    with pytest.raises(ValueError, match="positive"):
        est.fit(small_data.X, -small_data.y)


def test_cost_model_shape_over_k() -> None:
    """Throughput over K rises then falls; higher acceptance moves the best K up."""
    from specreg.recommender.features import ConfigFacts, feature_matrix
    from specreg.terms import Method

    base = ConfigFacts(
        bandwidth_gbs=460, physical_cores=96, target_params_b=32, target_active_b=32,
        target_bpw=4.8, target_gb=19, target_arch_family="qwen2", target_is_moe=False,
        target_is_hybrid=False, default_experts=0, method=Method.DRAFT, k=1, experts=0,
        temperature=0.0, task="code", draft_params_b=0.5, draft_bpw=8.5, draft_gb=0.53,
        draft_arch_family="qwen2", tok_relation="identical", baseline_tps=3.0,
    )  # fmt: skip
    ks = [1, 2, 4, 8, 16, 32, 64]
    # a draft streaming at 0.06 of the bandwidth (draft_eff is relative to target_eff, 0.25)
    p = CostParams(verify_slope=0.03, draft_eff=0.24, draft_tau=0.0)
    X = feature_matrix(base.with_(k=k) for k in ks)
    best = {}
    # per-token acceptance 0.56 and 0.97: a pass over 2+ tokens costs 1.6 steps on the
    # reference host's curve, so a pair accepting a third of its tokens never pays there
    for shift in (-0.5, 1.5):
        tps, a = predict_tps(X, p, shift)
        assert tps.max() > 3.0 and tps[-1] < tps.max()
        best[shift] = ks[int(np.argmax(tps))]
    assert best[1.5] > best[-0.5]
