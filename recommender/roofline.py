"""The roofline of plain decoding on this host: the bound streaming the weights sets, the bound
the arithmetic of a token sets, and how close plain decoding comes to the lower one."""

from __future__ import annotations

import math
from dataclasses import dataclass

from specreg.host.facts import HostFacts
from specreg.recommender.calibrated import Calibration
from specreg.recommender.costmodel import CostParams, compute_share, roofline_tps, verify_ratio
from specreg.recommender.features import ConfigFacts, column, feature_matrix
from specreg.terms import Method

ROOFLINE_VERIFY_K = 4


@dataclass(frozen=True)
class Roofline:
    """Both bounds of plain decoding: streaming the weights (memory) and the arithmetic of a
    token (compute: calibrated as the marginal cost of a token in llama-bench's largest
    batches, else modelled from the host's bandwidth per core)."""

    bandwidth_gbs: float
    bandwidth_source: str
    read_gb: float  # bytes read per plain-decoded token
    bound_tps: float  # the memory bound
    baseline_tps: float
    baseline_measured: bool
    compute_bound_tps: float | None = None
    compute_calibrated: bool = False
    verify_k: int | None = None  # K of the verify cost shown
    verify_ratio: float | None = None  # a pass over K + 1 tokens, in single steps

    @property
    def lower_bound_tps(self) -> float:
        return min(self.bound_tps, self.compute_bound_tps or math.inf)

    @property
    def fraction(self) -> float:
        low = self.lower_bound_tps
        return self.baseline_tps / low if low > 0 else math.nan

    @property
    def line(self) -> str:
        how = "measured" if self.baseline_measured else "predicted"
        text = (
            f"roofline: {self.bandwidth_gbs:.0f} GB/s ({self.bandwidth_source}) / "
            f"{self.read_gb:.2f} GB per token = {self.bound_tps:.1f} t/s bound"
        )
        if self.compute_bound_tps is not None:
            src = "calibrated" if self.compute_calibrated else "modelled"
            text += f"; compute {self.compute_bound_tps:.1f} t/s bound ({src})"
        text += (
            f"; plain decoding {self.baseline_tps:.1f} t/s ({how}) = {self.fraction:.0%} of "
            f"the {'lower' if self.compute_bound_tps is not None else 'memory'} bound"
        )
        if self.verify_k is not None and self.verify_ratio is not None:
            text += f"; verifying K={self.verify_k} costs {self.verify_ratio:.2f}x a step"
        return text


def roofline(
    base: ConfigFacts,
    host: HostFacts,
    plain_tps: float,
    measured: bool,
    cal: Calibration,
    params: CostParams,
) -> Roofline:
    """Memory and compute bounds of plain decoding, and what verifying K=4 costs here."""
    read_gb = base.target_read_gb
    memory = roofline_tps(read_gb, host.bandwidth_gbs)
    compute = cal.compute_bound_tps
    calibrated = compute is not None
    row = feature_matrix([base.with_(method=Method.NGRAM, k=ROOFLINE_VERIFY_K,
                                     **cal.target_fields(ROOFLINE_VERIFY_K))])  # fmt: skip
    if compute is None:
        bpw, size = column(row, "target_bpw"), column(row, "target_active_b")
        share = float(compute_share(row, params, bpw, size)[0])
        compute = memory / share if share > 0 else None
    return Roofline(
        bandwidth_gbs=host.bandwidth_gbs,
        bandwidth_source=host.source,
        read_gb=read_gb,
        bound_tps=memory,
        baseline_tps=plain_tps,
        baseline_measured=measured,
        compute_bound_tps=compute,
        compute_calibrated=calibrated,
        verify_k=ROOFLINE_VERIFY_K,
        verify_ratio=float(verify_ratio(row, params)[0]),
    )
