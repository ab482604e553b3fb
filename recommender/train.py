"""Fitting the speed model on prior + local runs, keeping it, and loading it back.

The fitted model is kept as a `SpeedPredictor` JSON document in `$SPECREG_HOME/recommender/`:
`train` writes `trained.json` (the model with a summary of what it was trained on), the
recommender's fit cache `cache/fit-<digest>.json`. Loading either needs numpy only; fitting
imports SciPy and scikit-learn (`model`, `evaluate`), so those imports wait until a fit runs.
Without a kept model the recommender fits on the shipped prior alone (a few seconds).
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specreg.home import specreg_home
from specreg.host import progress
from specreg.recommender.predictor import SpeedPredictor, write_json
from specreg.recommender.prior import DATA_VERSION, Observation, load_prior

if TYPE_CHECKING:
    from collections.abc import Sequence

    from specreg.recommender.evaluate import CVReport, TrainingSet
    from specreg.recommender.model import SpeculationRegressor

log = logging.getLogger(__name__)

TRAINED_FILE = "trained.json"
CACHE_GLOB = "fit-*.json"
# Bump when the feature set or the estimator changes: older files are then refitted.
MODEL_FORMAT = "5"


def model_dir() -> Path:
    return specreg_home() / "recommender"


@dataclass(frozen=True)
class TrainSummary:
    JSON_KIND = "train"
    JSON_VERSION = "1"

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

    def to_json(self) -> dict[str, Any]:
        from specreg.jsonout import document

        return document(self.JSON_KIND, self.JSON_VERSION, {"summary": self})


def default_estimator(random_state: int = 0) -> SpeculationRegressor:
    from specreg.recommender.model import SpeculationRegressor

    return SpeculationRegressor(random_state=random_state)


def _training(
    local: Sequence[Observation], estimator: SpeculationRegressor | None
) -> tuple[SpeculationRegressor, TrainingSet]:
    """The estimator (the default one unless given) and its rows: the shipped prior plus
    `local`."""
    from specreg.recommender.evaluate import training_set

    data = training_set([*load_prior().observations, *local])
    return (estimator if estimator is not None else default_estimator()), data


def fit(
    local: list[Observation] | tuple[Observation, ...] = (),
    estimator: SpeculationRegressor | None = None,
) -> SpeculationRegressor:
    """The estimator fitted on the shipped prior plus `local` (imports SciPy, scikit-learn)."""
    est, data = _training(local, estimator)
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
    from specreg.recommender.evaluate import grouped_cv
    from specreg.recommender.prior import load_sweep_series

    est, data = _training(local, estimator)
    return grouped_cv(est, data, load_sweep_series())


def train(
    local: list[Observation] | tuple[Observation, ...] = (),
    *,
    host: str | None = None,
    with_cv: bool = True,
    estimator: SpeculationRegressor | None = None,
) -> tuple[SpeedPredictor, TrainSummary, CVReport | None]:
    """Refit on prior + local runs, cross-validate (optional), save; return all three."""
    model = fit(local, estimator).predictor()
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
    write_json(model_dir() / TRAINED_FILE, {"summary": asdict(summary), "model": model.to_json()})
    return model, summary, report


def cached_fit(local: list[Observation] | tuple[Observation, ...] = ()) -> SpeedPredictor:
    """`fit(local)`, kept in the cache: the next call with the same evidence loads it.

    The file name is a digest of this code's model format, the prior's data version and the
    local observations, so new runs, a changed package or new data never load a stale fit.
    """
    digest = hashlib.sha256(
        repr((MODEL_FORMAT, DATA_VERSION, sorted(repr(o) for o in local))).encode()
    ).hexdigest()[:16]
    path = model_dir() / "cache" / CACHE_GLOB.replace("*", digest)
    if path.exists():
        try:
            return SpeedPredictor.load(path)
        except (OSError, ValueError, KeyError, TypeError) as err:  # refitted, never fatal
            log.warning("refitting the recommender (cached %s unreadable: %s)", path, err)
    # the first recommend on a registry fits for seconds: say so, where a listener shows it
    with progress.task(f"fitting the recommender on the prior and {len(local)} runs (once)"):
        model = fit(local).predictor()
    for old in path.parent.glob(CACHE_GLOB):  # one cached fit is enough
        old.unlink(missing_ok=True)
    model.save(path)
    return model


def load_trained() -> tuple[SpeedPredictor, TrainSummary] | None:
    """The saved model if it exists and matches this code's format and data, else None."""
    path = model_dir() / TRAINED_FILE
    if not path.exists():
        return None
    try:
        doc = json.loads(path.read_text())
        summary = TrainSummary(**doc["summary"])
        if summary.model_format != MODEL_FORMAT or summary.data_version != DATA_VERSION:
            return None
        model = SpeedPredictor.from_json(doc["model"])
    except (OSError, ValueError, KeyError, TypeError) as err:  # refitted, never fatal
        log.warning("ignoring the saved recommender model at %s: %s", path, err)
        return None
    return model, summary
