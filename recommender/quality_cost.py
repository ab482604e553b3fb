"""What a behaviour-changing candidate costs in output: measured, or predicted and said so.

`specreg quality TARGET --experts N` records the mean KL divergence of the target with N
experts from the target with its default count, per task text. A candidate with that expert
count shows the measured cost (the task's own text if measured, else the mean over the
texts measured). Without a measurement the cost is predicted from the expert counts:
KLD = c * (1 - N / default)^2, with c fitted to this target's own measurements at other
expert counts when there are some, else a prior guess (half the experts -> KLD 0.1) that
says it is one.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import duckdb

from specreg.registry.quality_store import PURPOSE_QUALITY, QualityRecord, latest_measurements

COST_MEASURED = "measured"
COST_PREDICTED = "predicted"
# KLD at half the default experts when nothing about the model is measured: a rough prior.
PRIOR_KLD_AT_HALF = 0.1


@dataclass(frozen=True)
class QualityCost:
    """Mean KL divergence from the lossless configuration (nats per token)."""

    mean_kld: float
    source: str  # measured | predicted
    same_top: float | None = None
    kld_p99: float | None = None
    tasks: tuple[str, ...] = ()
    n_tokens: int = 0
    basis: str = ""  # how a predicted cost was made

    @property
    def measured(self) -> bool:
        return self.source == COST_MEASURED

    @property
    def label(self) -> str:
        if self.measured:
            top = f", same top {self.same_top:.0%}" if self.same_top is not None else ""
            return f"KLD {self.mean_kld:.3f} measured ({', '.join(self.tasks)}{top})"
        return f"KLD ~{self.mean_kld:.3f} predicted ({self.basis})"


def load_quality(con: duckdb.DuckDBPyConnection, target_id: str) -> list[QualityRecord]:
    """The newest measurement per expert count and task of the target against itself."""
    return [
        r
        for r in latest_measurements(con, PURPOSE_QUALITY, target_id)
        if r.model_id == target_id and r.experts is not None and r.mean_kld is not None
    ]


def _weighted(rows: Sequence[QualityRecord], values: Sequence[float | None]) -> float | None:
    pairs = [
        (v, max(r.n_tokens or 0, 1))
        for r, v in zip(rows, values, strict=True)
        if v is not None and math.isfinite(v)
    ]
    if not pairs:
        return None
    return sum(v * w for v, w in pairs) / sum(w for _, w in pairs)


def expert_cost(
    experts: int, default_experts: int, task: str, rows: Sequence[QualityRecord]
) -> QualityCost:
    """The cost of running `experts` of `default_experts` for `task`."""
    here = [r for r in rows if r.experts == experts]
    if here:
        chosen = [r for r in here if r.task == task] or here
        kld = _weighted(chosen, [r.mean_kld for r in chosen])
        assert kld is not None
        return QualityCost(
            mean_kld=max(0.0, kld),
            source=COST_MEASURED,
            same_top=_weighted(chosen, [r.same_top for r in chosen]),
            kld_p99=_weighted(chosen, [r.kld_p99 for r in chosen]),
            tasks=tuple(sorted({r.task or r.text_name or "?" for r in chosen})),
            n_tokens=sum(r.n_tokens or 0 for r in chosen),
        )
    gap = max(0.0, 1.0 - experts / max(default_experts, 1))
    coefs = [
        (r.mean_kld or 0.0) / (1.0 - r.experts / default_experts) ** 2
        for r in rows
        if r.experts is not None and r.experts < default_experts
    ]
    if coefs:
        c = statistics.median(coefs)
        basis = f"from this model's measurements at other expert counts, {len(coefs)} texts"
    else:
        c = PRIOR_KLD_AT_HALF / 0.25
        basis = "expert counts only, no measurement of this model: `specreg quality --experts`"
    return QualityCost(mean_kld=c * gap**2, source=COST_PREDICTED, basis=basis)
