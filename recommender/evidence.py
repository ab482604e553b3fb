"""Measured runs as evidence: the runs an option cites, and how far the runs of its kind move
its prediction (the evidence correction), with the line that says so."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from specreg.recommender.features import TASK_SLOTS, ConfigFacts, feature_matrix
from specreg.recommender.predictor import SpeedPredictor
from specreg.recommender.prior import Observation
from specreg.recommender.results import Evidence
from specreg.terms import Method

N_EVIDENCE = 3
# Measured runs of the same kind as a candidate (method, target and draft sizes: one pair at
# every K, expert count and task) move its prediction by their mean log speedup residual
# (measured / predicted on the run's own host), closer runs weighing more; the model's own
# prediction counts as EVIDENCE_PRIOR_WEIGHT runs.
EVIDENCE_PRIOR_WEIGHT = 1.0
# Relative difference in parameters (total, active, draft) within one kind: the prior's sizes
# come from names ("480B-A35B", "0.5B"), the registry's from tensors (475.1B, 30.4B, 0.63B).
SAME_SIZE = 0.3
# An option whose nearest evidence measured a speedup this many times apart says why.
EVIDENCE_DISAGREES = 1.5


@dataclass(frozen=True)
class Near:
    """A candidate's nearest measured run of its method (the evidence it cites first), what
    the model predicts for that run on its own host, and how many runs of its kind moved it."""

    obs: Observation
    predicted_speedup: float
    n_kind: int


def _evidence_space(configs: Sequence[ConfigFacts]) -> np.ndarray:
    """Where runs are compared for closeness: sizes on a log scale, K, task, arch, experts."""
    rows = []
    for c in configs:
        rows.append(
            [
                math.log(max(c.target_active_b, 1e-3)),
                math.log(max(c.target_read_gb, 1e-3)),
                math.log(max(c.draft_params_b, 1e-3) / max(c.target_active_b, 1e-3))
                if c.method is Method.DRAFT
                else 0.0,
                math.log2(max(c.k, 1)),
                c.experts_ratio * 2,
                float(c.same_arch_family),
                float(c.target_is_moe),
                *(1.5 * float(c.task == t) for t in TASK_SLOTS),
            ]
        )
    return np.asarray(rows, dtype=float).reshape(len(rows), -1)


def _cited(o: Observation, summary: str) -> Evidence:
    sp = o.speedup
    return Evidence(
        row_id=o.row_id,
        source=o.source,
        summary=summary,
        tps=o.tps,
        speedup=None if math.isnan(sp) else sp,
    )


def nearest_evidence(c: ConfigFacts, pool: Sequence[Observation]) -> tuple[Evidence, ...]:
    """The measured runs of the candidate's method closest to it (this host's first)."""
    same = [o for o in pool if o.config.method is c.method]
    if not same:
        return ()
    P = _evidence_space([o.config for o in same])
    d = np.sqrt(((P - _evidence_space([c])[0]) ** 2).sum(axis=1))
    # this host's runs are the best evidence: count them as closer
    d = d - np.array([1.0 if o.source == "local" else 0.0 for o in same])
    out = []
    for i in np.argsort(d, kind="stable")[:N_EVIDENCE]:
        o = same[int(i)]
        oc = o.config
        bits = [f"{oc.target_params_b:.3g}B target"]
        if oc.method is Method.DRAFT:
            bits.append(f"{oc.draft_params_b:.3g}B draft")
        if oc.k:
            bits.append(f"K={oc.k}")
        if oc.experts_ratio < 1:
            bits.append(f"experts {oc.experts}/{oc.default_experts}")
        bits.append(oc.task)
        out.append(_cited(o, ", ".join(bits)))
    return tuple(out)


def run_evidence(ran: Sequence[Observation]) -> tuple[Evidence, ...]:
    """This host's runs of a stack or cache, newest first: the evidence it is listed on."""
    out = []
    for o in sorted(ran, key=run_number, reverse=True)[:N_EVIDENCE]:
        acc = f", {o.acceptance:.0%} of drafted accepted" if o.acceptance is not None else ""
        out.append(_cited(o, f"{o.note}, {o.config.task}{acc}"))
    return tuple(out)


def run_number(o: Observation) -> int:
    """A local run's id (row ids are `run:N`), for ordering runs by age."""
    tail = o.row_id.rpartition(":")[2]
    return int(tail) if tail.isdigit() else 0


def evidence_correction(
    configs: Sequence[ConfigFacts],
    pool: Sequence[Observation],
    model: SpeedPredictor,
    skip: Sequence[bool],
) -> tuple[np.ndarray, list[Near | None]]:
    """The factor measured runs move each candidate's prediction by, and its nearest run.

    A run's residual is its measured speedup over the model's speedup for the same
    configuration on the run's own host (log scale): what the host explains stays with the
    model, what the model gets wrong about a pair moves the candidate. The runs of the
    candidate's kind (`_same_kind`: one pair at any K, expert count or task) give a mean
    residual, weighted by closeness exp(-d^2 / 2), shrunk by n / (n + EVIDENCE_PRIOR_WEIGHT):
    one run moves a candidate half way, three three quarters. Candidates in `skip` (plain
    decoding, curves this host has runs of) are not moved.
    """
    shift = np.ones(len(configs))
    near: list[Near | None] = [None] * len(configs)
    rows = [o for o in pool if o.config.baseline_tps > 0 and o.tps > 0]
    if not rows:
        return shift, near
    resid, predicted = _speedup_residuals(rows, model)
    space = _evidence_space([o.config for o in rows])
    here = _evidence_space(configs)
    methods = np.array([o.config.method.value for o in rows])
    for i, c in enumerate(configs):
        if skip[i]:
            continue
        same = np.flatnonzero(methods == c.method.value)
        if not len(same):
            continue
        d = np.sqrt(((space[same] - here[i]) ** 2).sum(axis=1))
        kind = np.array([_same_kind(c, rows[j].config) for j in same], dtype=bool)
        n = int(kind.sum())
        if n:
            w = np.exp(-0.5 * d[kind] ** 2)
            mean = float(w @ resid[same[kind]]) / float(w.sum())
            shift[i] = math.exp(mean * n / (n + EVIDENCE_PRIOR_WEIGHT))
        j = int(same[int(np.argmin(d))])
        near[i] = Near(rows[j], float(predicted[j]), n)
    return shift, near


def _same_kind(c: ConfigFacts, run: ConfigFacts) -> bool:
    """A run of the candidate's method with its target and draft (by size and family)."""

    def close(a: float, b: float, tol: float) -> bool:
        return abs(a - b) <= tol * max(a, b)

    if (c.method, c.target_arch_family, c.target_is_moe) != (
        run.method,
        run.target_arch_family,
        run.target_is_moe,
    ):
        return False
    if not (
        close(c.target_params_b, run.target_params_b, SAME_SIZE)
        and close(c.target_active_b, run.target_active_b, SAME_SIZE)
    ):
        return False
    return c.method is not Method.DRAFT or (
        close(c.draft_params_b, run.draft_params_b, SAME_SIZE)
        and c.draft_arch_family == run.draft_arch_family
    )


def _speedup_residuals(
    rows: Sequence[Observation], model: SpeedPredictor
) -> tuple[np.ndarray, np.ndarray]:
    """log(measured / predicted speedup) of each run on its own host, and the prediction."""
    configs = [o.config for o in rows]
    plain = [
        c.with_(method=Method.NONE, k=0, experts=c.default_experts, ngram_n=0,
                draft_params_b=0.0, draft_bpw=0.0, draft_gb=0.0, draft_arch_family="",
                tok_relation="unknown", stack="", lookup_cache="")
        for c in configs
    ]  # fmt: skip
    pred = model.predict(feature_matrix([*configs, *plain]))
    n = len(rows)
    predicted = pred[:n] / np.maximum(pred[n:], 1e-12)
    measured = np.array([o.speedup for o in rows])
    return np.log(measured) - np.log(np.maximum(predicted, 1e-12)), predicted


def evidence_why(c: ConfigFacts, speedup: float, shift: float, near: Near) -> str | None:
    """What the nearest measured run says about an option whose prediction differs from it,
    or that runs of its kind moved, and why the option stands where it does."""
    o = near.obs
    measured = o.speedup
    apart = speedup / measured if measured > 0 else math.nan
    disagrees = not 1 / EVIDENCE_DISAGREES <= apart <= EVIDENCE_DISAGREES
    if not disagrees and abs(math.log(shift)) < math.log(1.25):
        return None
    text = (
        f"nearest measured run {o.row_id} ({o.source}) measured {measured:.2f}x on its host "
        f"({o.config.bandwidth_gbs:.0f} GB/s, {o.config.physical_cores} cores), where the "
        f"model predicts {near.predicted_speedup:.2f}x"
    )
    if near.n_kind:
        text += f"; {near.n_kind} runs of this target and draft move this option by x{shift:.2f}"
    else:
        text += "; no runs of this target and draft: the model's prediction stands"
    if disagrees:
        host = speedup / shift / near.predicted_speedup  # the model's own, here / there
        text += (
            f"; it stays {apart:.1f}x {'above' if apart > 1 else 'below'} that run: the model "
            f"predicts {host:.2f}x as much speedup for this option on this host "
            f"({c.bandwidth_gbs:.0f} GB/s, {c.physical_cores} cores) as for that run on its own"
        )
        if near.n_kind:
            text += ", and the runs move it only part of the way"
    return text
