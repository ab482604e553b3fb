"""The fitted model's light form: same predictions as the estimator, kept as JSON, loaded and
used by `recommend` without scikit-learn or SciPy."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from specreg.recommender.evaluate import training_set
from specreg.recommender.model import SpeculationRegressor
from specreg.recommender.predictor import SpeedPredictor, residual_matrix
from specreg.recommender.prior import load_prior


@pytest.fixture(scope="module")
def fitted() -> tuple[SpeculationRegressor, np.ndarray]:
    data = training_set(load_prior().observations)
    est = SpeculationRegressor(n_members=2, residual_estimators=20, random_state=1)
    return est.fit(data.X, data.y, groups=data.groups), data.X


def test_trees_predict_what_scikit_learn_predicts(fitted) -> None:  # type: ignore[no-untyped-def]
    from sklearn.ensemble import GradientBoostingRegressor

    from specreg.recommender.model import residual_trees

    est, X = fitted
    R = residual_matrix(X)
    rng = np.random.default_rng(0)
    target = rng.normal(size=len(R))
    gbm = GradientBoostingRegressor(max_depth=3, n_estimators=25, random_state=0).fit(R, target)
    trees = residual_trees(gbm, R.shape[1])
    assert trees.depth == 3
    np.testing.assert_allclose(trees.predict(R), gbm.predict(R), rtol=1e-12, atol=1e-12)
    # rows the fit never saw, including values on both sides of every threshold
    fresh = R * rng.uniform(0.5, 1.5, size=R.shape)
    np.testing.assert_allclose(trees.predict(fresh), gbm.predict(fresh), rtol=1e-12, atol=1e-12)


def test_json_round_trip_predicts_the_same(fitted, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    est, X = fitted
    pred = est.predictor()
    path = tmp_path / "model.json"
    pred.save(path)
    back = SpeedPredictor.load(path)
    assert back.params == pred.params and back.noise == pred.noise
    for a, b in zip(back.predict_interval(X), est.predict_interval(X), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-12)
    np.testing.assert_allclose(back.predict_acceptance(X), est.predict_acceptance(X))


def test_a_foreign_document_is_refused(fitted) -> None:  # type: ignore[no-untyped-def]
    doc = fitted[0].predictor().to_json()
    with pytest.raises(ValueError, match="not a speed model"):
        SpeedPredictor.from_json({**doc, "version": "0"})
    short = {**doc, "params": {**doc["params"], "acc_task": [0.0]}}
    with pytest.raises(ValueError, match="wrong number of values"):
        SpeedPredictor.from_json(short)


def test_a_damaged_cache_file_is_refitted(specreg_home: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from specreg.recommender import train as train_mod

    real_fit = train_mod.fit
    calls: list[int] = []

    def small_fit(local=(), estimator=None):  # type: ignore[no-untyped-def]
        calls.append(1)
        return real_fit(local, train_mod.default_estimator().set_params(n_members=0))

    monkeypatch.setattr(train_mod, "fit", small_fit)
    first = train_mod.cached_fit()
    (kept,) = (specreg_home / "recommender" / "cache").glob(train_mod.CACHE_GLOB)
    kept.write_text(json.dumps({"kind": "speed-model", "version": "1"}))
    again = train_mod.cached_fit()
    assert len(calls) == 2 and again.params == first.params


def test_recommend_with_a_kept_fit_imports_neither_sklearn_nor_scipy(
    scanned_db: Path, specreg_home: Path
) -> None:
    """`specreg recommend` end to end in a fresh interpreter, after `train` kept a model."""
    from specreg.recommender.train import train

    train(with_cv=False, estimator=SpeculationRegressor(n_members=1, residual_estimators=10))
    script = (
        "import sys\n"
        "from specreg.cli.main import main\n"
        f"sys.argv = ['specreg', 'recommend', 'Qwen2.5 Coder 32B Instruct', '--bandwidth', '40',"
        f" '--db', {str(scanned_db)!r}]\n"
        "try:\n"
        "    main()\n"
        "finally:\n"
        "    heavy = ('sklearn', 'scipy', 'joblib')\n"
        "    print('HEAVY', sorted(m for m in sys.modules if m.split('.')[0] in heavy)[:5])\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "run: draft-simple" in out.stdout
    assert out.stdout.splitlines()[-1] == "HEAVY []"
