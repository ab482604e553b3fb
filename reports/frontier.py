"""Per target: the speed of each lossy option against what it costs in output.

The points are the target at its defaults (quality cost 0), every expert count and every
other quantization `specreg quality` measured against it, and (MoE targets) the expert
counts the recommender's speed policy considers, with a predicted cost. Speed is this host's
median plain-decoding run of that configuration when there is one; otherwise predicted from
the plain baseline (measured or the recommender's) by the cost model: fewer experts read
fewer bytes, another quant reads its own file size. Each axis says which it is. The frontier
is the set of points no other point beats on both axes.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

import duckdb

from specreg.recommender.costmodel import CostParams
from specreg.recommender.quality_cost import COST_MEASURED, expert_cost, load_quality
from specreg.registry.quality_store import PURPOSE_QUALITY, latest_measurements
from specreg.registry.queries import ModelRecord, get_model
from specreg.reports.data import FrontierPoint, Roofline, RunView


def pareto(points: Sequence[FrontierPoint]) -> tuple[FrontierPoint, ...]:
    """`points` with `on_frontier` set: faster than every point that costs as little."""
    from dataclasses import replace

    out = []
    for p in points:
        if p.tokens_per_s is None:
            out.append(p)
            continue
        beaten = any(
            q is not p
            and q.tokens_per_s is not None
            and q.tokens_per_s >= p.tokens_per_s
            and q.mean_kld <= p.mean_kld
            and (q.tokens_per_s > p.tokens_per_s or q.mean_kld < p.mean_kld)
            for q in points
        )
        out.append(replace(p, on_frontier=not beaten))
    return tuple(out)


def _plain_speed(runs: Sequence[RunView], target_id: str, experts: int | None) -> float | None:
    values = [
        r.tokens_per_s
        for r in runs
        if r.ok and r.target_id == target_id and r.is_baseline and r.experts == experts
        and r.tokens_per_s
    ]  # fmt: skip
    return statistics.median(values) if values else None


def gather_frontier(
    con: duckdb.DuckDBPyConnection,
    target: ModelRecord,
    runs: Sequence[RunView],
    roofline: Roofline | None,
) -> tuple[FrontierPoint, ...]:
    """The target's lossy options as points, or () when it has none to show."""
    target_id = target.model_id or ""
    rows = latest_measurements(con, PURPOSE_QUALITY, target_id)
    default = int(target.expert_used_count or 0) if target.is_moe else 0
    if not rows and not default:
        return ()
    base_measured = _plain_speed(runs, target_id, None)
    base = base_measured or (roofline.predicted_baseline_tps if roofline else None)
    share = CostParams().expert_share
    points = [
        FrontierPoint(
            label=f"{Path(target.path).name} (reference)",
            mean_kld=0.0,
            kld_measured=True,
            tokens_per_s=base,
            speed_measured=base_measured is not None,
            same_top=1.0,
        )
    ]
    expert_rows = load_quality(con, target_id)
    counts = {r.experts for r in expert_rows if r.experts is not None}
    if default > 1:
        counts |= {max(1, default // 2), max(1, (3 * default) // 4)} - {default}
    for n in sorted(c for c in counts if c is not None and c != default):
        cost = expert_cost(n, default, "", expert_rows)
        measured = _plain_speed(runs, target_id, n)
        ratio = n / default if default else 1.0
        predicted = base / (share + (1 - share) * ratio) if base and ratio < 1 else base
        points.append(
            FrontierPoint(
                label=f"{n} of {default} experts",
                mean_kld=cost.mean_kld,
                kld_measured=cost.source == COST_MEASURED,
                tokens_per_s=measured or predicted,
                speed_measured=measured is not None,
                same_top=cost.same_top,
            )
        )
    quants: dict[str, list[float]] = defaultdict(list)
    tops: dict[str, list[float]] = defaultdict(list)
    for r in rows:
        if r.model_id and r.model_id != target_id and r.experts is None and r.mean_kld is not None:
            quants[r.model_id].append(r.mean_kld)
            if r.same_top is not None:
                tops[r.model_id].append(r.same_top)
    for model_id, klds in sorted(quants.items()):
        other = get_model(con, model_id)
        if other is None:
            continue
        measured = _plain_speed(runs, model_id, None)
        size_ratio = (target.n_bytes or 0) / (other.n_bytes or 1)
        points.append(
            FrontierPoint(
                label=f"{Path(other.path).name} ({other.quant or '?'})",
                mean_kld=max(0.0, statistics.fmean(klds)),
                kld_measured=True,
                tokens_per_s=measured or (base * size_ratio if base else None),
                speed_measured=measured is not None,
                same_top=statistics.fmean(tops[model_id]) if tops[model_id] else None,
            )
        )
    return pareto(points) if len(points) > 1 else ()
