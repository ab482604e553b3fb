"""The bound no pair's K curve can break, a sweep read between its measured K, and the shape
the sweeps that keep the bound share (issue 40)."""

from __future__ import annotations

import numpy as np
import pytest

from specreg.recommender.kshape import (
    KShape,
    bound_breaks,
    interpolated,
    shape_factors,
    sweep_shape,
)
from specreg.recommender.prior import load_sweep_series


def test_a_rise_faster_than_the_tokens_breaks_the_bound() -> None:
    # from K=16 to 24 the tokens a verification yields can grow by 25/17 = 1.47x at most
    assert bound_breaks({16: 6.8, 24: 12.6}) == [(16, 24)]
    assert bound_breaks({16: 6.8, 24: 9.9}) == []
    assert bound_breaks({4: 10.0, 8: 18.1}) == [(4, 8)] and bound_breaks({4: 10.0, 8: 17.9}) == []
    # any pair of K, not only neighbours
    assert (8, 24) in bound_breaks({8: 18.5, 16: 10.3, 24: 60.0})


def test_the_shipped_sweeps_five_of_which_break_the_bound() -> None:
    broken = [s.series for s in load_sweep_series() if bound_breaks(s.k_tps)]
    assert len(load_sweep_series()) == 46 and len(broken) == 5
    assert "worker_summarize|draft_qwen25_coder|" in broken


def test_a_sweep_is_read_between_its_measured_k() -> None:
    k_tps = {4: 10.0, 8: 14.0, 16: 12.0}
    assert interpolated(k_tps, 8) == 14.0
    assert interpolated(k_tps, 12) == pytest.approx(13.0)  # half way, not the nearer K
    assert interpolated(k_tps, 6) == pytest.approx(12.0)
    assert interpolated(k_tps, 2, baseline=6.0) == pytest.approx(8.0)  # plain at K = 0
    assert interpolated(k_tps, 2) == 10.0  # no baseline: the smallest K's speed
    assert interpolated(k_tps, 32, baseline=6.0) == 12.0  # beyond: the largest K's


def test_the_shared_shape_leaves_out_sweeps_that_break_the_bound() -> None:
    keep = ({4: 8.0, 8: 10.0, 16: 9.0}, 5.0)
    broken = ({4: 5.0, 8: 10.0, 16: 10.0}, 5.0)  # 4 -> 8 doubles: 9/5 at most
    shape = sweep_shape([keep, broken], points=(2, 4, 8, 16, 32))
    assert shape is not None and shape.n_series == 1
    at = dict(shape.points)
    assert at[8] == 1.0 and at[4] == pytest.approx(0.8) and at[2] == pytest.approx(0.65)
    assert 32 not in at  # no sweep measured beyond 16
    assert sweep_shape([broken]) is None
    assert KShape.from_json(shape.to_json()) == shape


def test_a_curve_bends_half_way_to_the_shape_and_keeps_its_level() -> None:
    shape = KShape(((2, 0.5), (4, 0.8), (8, 1.0), (16, 0.8)), 3)
    ks, tps = [2, 4, 8, 16], [20.0, 16.0, 10.0, 5.0]  # the model: best at K=2
    f = shape_factors(shape, ks, tps)
    bent = np.array(tps) * f
    assert f[0] == pytest.approx(np.sqrt(0.5))  # its best K moves by the shape's share alone
    # each K half way (in log) between the two curves' shapes
    model = np.log(np.array(tps) / max(tps))
    shared = np.log(np.array([0.5, 0.8, 1.0, 0.8]))
    assert np.log(bent / bent.max()) == pytest.approx(
        0.5 * (model + shared) - max(0.5 * (model + shared))
    )
