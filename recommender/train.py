"""Fitting the speed model on prior + local runs, keeping it, and loading it back.

The fitted model is a file in `$SPECREG_HOME/recommender/` (joblib), next to a JSON summary of
what it was trained on; no registry table is needed. Without a trained file the recommender fits
on the shipped prior alone (a few seconds).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

import joblib

from specreg.home import specreg_home
from specreg.recommender.evaluate import CVReport, grouped_cv, training_set
from specreg.recommender.model import SpeculationRegressor
from specreg.recommender.prior import DATA_VERSION, Observation, load_prior, load_sweep_series

log = logging.getLogger(__name__)

MODEL_FILE = "model.joblib"
SUMMARY_FILE = "model.json"
# Bump when the feature set or the estimator changes: older files are then refitted.
MODEL_FORMAT = "2"


def model_dir() -> Path:
    return specreg_home() / "recommender"


@dataclass(frozen=True)
class TrainSummary:
    trained_at: str
    data_version: str
    model_format: str
    n_prior: int
    n_local: int
    host: str | None
    cv_k_within_10pct: float | None = None
    cv_rule_within_10pct: float | None = None
    cv_speedup_mape_draft: float | None = None
    cv_speedup_mape_all: float | None = None
    cv_band_coverage: float | None = None
    cv_series: int | None = None


def default_estimator(random_state: int = 0) -> SpeculationRegressor:
    return SpeculationRegressor(random_state=random_state)


def fit(
    local: list[Observation] | tuple[Observation, ...] = (),
    estimator: SpeculationRegressor | None = None,
) -> SpeculationRegressor:
    data = training_set([*load_prior().observations, *local])
    est = estimator if estimator is not None else default_estimator()
    return est.fit(
        data.X,
        data.y,
        sample_weight=data.weight,
        groups=data.groups,
        acceptance=data.acceptance,
        series=data.series,
    )


def cross_validate(
    local: list[Observation] | tuple[Observation, ...] = (),
    estimator: SpeculationRegressor | None = None,
) -> CVReport:
    data = training_set([*load_prior().observations, *local])
    est = estimator if estimator is not None else default_estimator()
    return grouped_cv(est, data, load_sweep_series())


def train(
    local: list[Observation] | tuple[Observation, ...] = (),
    *,
    host: str | None = None,
    with_cv: bool = True,
    estimator: SpeculationRegressor | None = None,
) -> tuple[SpeculationRegressor, TrainSummary, CVReport | None]:
    """Refit on prior + local runs, cross-validate (optional), save; return all three."""
    model = fit(local, estimator)
    report = cross_validate(local, estimator) if with_cv else None
    summary = TrainSummary(
        trained_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        data_version=DATA_VERSION,
        model_format=MODEL_FORMAT,
        n_prior=len(load_prior().observations),
        n_local=len(local),
        host=host,
        cv_k_within_10pct=report.k_within_tolerance if report else None,
        cv_rule_within_10pct=report.rule_within_tolerance if report else None,
        cv_speedup_mape_draft=report.speedup_mape_draft if report else None,
        cv_speedup_mape_all=report.speedup_mape if report else None,
        cv_band_coverage=report.coverage if report else None,
        cv_series=len(report.series) if report else None,
    )
    out = model_dir()
    out.mkdir(parents=True, exist_ok=True)
    joblib.dump(model, out / MODEL_FILE)
    (out / SUMMARY_FILE).write_text(json.dumps(asdict(summary), indent=1))
    return model, summary, report


def cached_fit(local: list[Observation] | tuple[Observation, ...] = ()) -> SpeculationRegressor:
    """`fit(local)`, kept in the cache: the next call with the same evidence loads it.

    The file name is a digest of this code's model format, the prior's data version and the
    local observations, so new runs, a changed package or new data never load a stale fit.
    """
    digest = hashlib.sha256(
        repr((MODEL_FORMAT, DATA_VERSION, sorted(repr(o) for o in local))).encode()
    ).hexdigest()[:16]
    path = model_dir() / "cache" / f"fit-{digest}.joblib"
    if path.exists():
        try:
            model = joblib.load(path)
            if isinstance(model, SpeculationRegressor):
                return model
        except Exception as err:  # a damaged cache file is refitted, never fatal
            log.warning("refitting the recommender (cached %s unreadable: %s)", path, err)
    model = fit(local)
    path.parent.mkdir(parents=True, exist_ok=True)
    for old in path.parent.glob("fit-*.joblib"):  # one cached fit is enough
        old.unlink(missing_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    joblib.dump(model, tmp)
    tmp.replace(path)
    return model


def load_trained() -> tuple[SpeculationRegressor, TrainSummary] | None:
    """The saved model if it exists and matches this code's format and data, else None."""
    path, spath = model_dir() / MODEL_FILE, model_dir() / SUMMARY_FILE
    if not path.exists() or not spath.exists():
        return None
    try:
        summary = TrainSummary(**json.loads(spath.read_text()))
        if summary.model_format != MODEL_FORMAT or summary.data_version != DATA_VERSION:
            return None
        model = joblib.load(path)
    except Exception as err:  # a stale or foreign file is refitted, never fatal
        log.warning("ignoring the saved recommender model at %s: %s", path, err)
        return None
    return model, summary
