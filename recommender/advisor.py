"""The one place the recommender is set up: `recommend`, `report --recommend` and `tune` all
open an `Advisor` instead of assembling host facts, fitted model and evidence themselves.

Opening one with a kept fit reads JSON and numpy arrays only; SciPy and scikit-learn are
imported when a fit has to run (no kept model yet, new evidence, or tune's own estimator).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import duckdb

from specreg.host.facts import HostFacts
from specreg.recommender.local import local_observations, other_host_observations
from specreg.recommender.predictor import SpeedPredictor
from specreg.recommender.prior import Observation, load_prior
from specreg.recommender.recommend import recommend
from specreg.recommender.results import Recommendation
from specreg.recommender.train import cached_fit, fit, load_trained
from specreg.terms import POLICY_QUALITY

if TYPE_CHECKING:
    from specreg.recommender.model import SpeculationRegressor


@dataclass(frozen=True)
class Advisor:
    """A fitted model, the host it predicts for, and the evidence it cites.

    observations: the shipped prior, this host's usable local runs and other hosts' runs
    (source `other-host`, with their own host's facts), in that order.
    """

    host: HostFacts
    model: SpeedPredictor
    observations: tuple[Observation, ...]
    n_local: int

    def recommend(
        self,
        con: duckdb.DuckDBPyConnection,
        target_ref: str,
        *,
        task: str = "chat",
        policy: str = POLICY_QUALITY,
        temperature: float = 0.0,
        max_kld: float | None = None,
        spec_type: str | None = None,
    ) -> Recommendation:
        return recommend(
            con,
            target_ref,
            model=self.model,
            host=self.host,
            task=task,
            policy=policy,
            temperature=temperature,
            observations=self.observations,
            max_kld=max_kld,
            spec_type=spec_type,
        )


def open_advisor(
    con: duckdb.DuckDBPyConnection,
    host: HostFacts,
    *,
    estimator: SpeculationRegressor | None = None,
    model: SpeedPredictor | None = None,
    without: Collection[str] = (),
) -> Advisor:
    """The recommender for `host` with the registry's current evidence.

    Without `estimator` or `model`: the model saved by `specreg train` if it matches this code
    and data, else the cached fit on the prior plus this host's runs (refitted only when they
    change). With `estimator` (tune's small ensemble): a fresh fit of that estimator, never
    cached. With `model`: that fitted model as it is, next to the current evidence. Runs of
    the kinds `without` are no evidence here (adaptive serve replays its served runs itself).
    """
    local = local_observations(con, host, without)
    # other hosts' runs inform the fit as prior rows do, with their own host's facts
    evidence = [*local, *other_host_observations(con, host, without)]
    if model is None:
        if estimator is not None:
            model = fit(evidence, estimator).predictor()
        else:
            trained = load_trained()
            model = trained[0] if trained else cached_fit(evidence)
    observations: Sequence[Observation] = (*load_prior().observations, *evidence)
    return Advisor(host=host, model=model, observations=tuple(observations), n_local=len(local))
