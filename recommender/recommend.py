"""What to run for a target: ranked configurations with predicted speed, band, evidence, why.

`recommend` gathers the candidates the registry allows (compatible drafts from the auditor,
n-gram lookup, the target's MTP heads, and - under the speed policy - fewer MoE experts), scores
them with the speed model, pulls each towards this host's measurements where they exist, and
ranks them. "Do not speculate" and "no compatible draft" are answers like any other.

The stages, one module each: candidates.py (the question, what it stands on, what to score),
scoring.py (the model's predictions and the corrections by what was measured), evidence.py
(the runs an option cites and how they move it), ranking.py (options, why lines, order),
advice.py (what the options alone do not say), roofline.py, results.py (what comes back).
"""

from __future__ import annotations

from collections.abc import Sequence

import duckdb

from specreg.host.facts import HostFacts
from specreg.recommender.advice import advice
from specreg.recommender.candidates import checked_ask, gather_candidates, grounds
from specreg.recommender.predictor import SpeedPredictor
from specreg.recommender.prior import Observation
from specreg.recommender.quality_cost import load_quality
from specreg.recommender.ranking import Reading, rank
from specreg.recommender.results import Evidence, Knob, Option, Recommendation
from specreg.recommender.roofline import Roofline, roofline
from specreg.recommender.scoring import score
from specreg.terms import POLICY_QUALITY, POLICY_SPEED

# the result types, importable from here as before the split
__all__ = ["Evidence", "Knob", "Option", "Recommendation", "Roofline", "recommend"]


def recommend(
    con: duckdb.DuckDBPyConnection,
    target_ref: str,
    *,
    model: SpeedPredictor,
    host: HostFacts,
    task: str = "chat",
    policy: str = POLICY_QUALITY,
    temperature: float = 0.0,
    observations: Sequence[Observation] = (),
    max_kld: float | None = None,
    spec_type: str | None = None,
) -> Recommendation:
    """Rank configurations for `target_ref` on `host` for `task` under `policy`.

    observations: the runs the model was trained on (prior + local), used as evidence and, for
    this host's runs of a candidate, to pull its prediction towards what was measured.
    Measured draft agreement (`specreg agree`) replaces the predicted acceptance of pairs
    without runs. max_kld: leave out behaviour-changing options whose quality cost (measured,
    else predicted) is above this mean KL divergence. Stacks and workload lookup caches are
    candidates of their own, listed where this host's runs of them predict a win
    (recommender/stacks.py); spec_type: only that type or stack (and plain decoding), listed
    whether it wins or not.
    """
    ask = checked_ask(task, policy, temperature, max_kld, spec_type)
    g = grounds(con, target_ref, host, ask, observations)
    cands, reduced = gather_candidates(g, ask)
    scores = score(con, g, cands, model, ask, observations)
    quality_rows = load_quality(con, g.target.model_id) if policy == POLICY_SPEED else []
    reading = Reading(g, scores, model, observations, temperature, host.mem_bytes)
    ranking = rank(reading, cands, ask, quality_rows)
    roof = roofline(g.base, host, scores.plain_tps, scores.plain_measured, g.cal, model.params)
    return Recommendation(
        target_id=g.target.model_id,
        target_name=g.target.display_name,
        target_path=g.target.path,
        task=ask.task,
        policy=policy,
        host=host,
        roofline=roof,
        options=ranking.options,
        speculate=ranking.speculate,
        advice=tuple(advice(g, model, ask, ranking, roof)),
        n_compatible_drafts=len(g.drafts),
        n_considered=len(cands),
        considered_experts=tuple(reduced),
        noise=g.noise,
        pass_factor=g.cal.pass_factor_figure if g.cal.target is not None else None,
    )
