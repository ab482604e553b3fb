"""The structure of speculative decoding, as formulas the learned model builds on.

Decoding one token on a CPU is memory-bound: it reads the active weights once, so its time is
about `bytes read / bandwidth` (divided by an efficiency the host reaches) plus a fixed overhead.
Speculation drafts K tokens (K cheap draft steps), then verifies them in one target pass that
costs a little more than a single-token pass (`1 + c*K` times it). With per-token acceptance
probability `a`, a verification step yields `(1 - a^(K+1)) / (1 - a)` tokens on average
(Leviathan et al., 2023). Throughput is tokens per step over seconds per step.

The parameters of these formulas (efficiencies, overheads, the verify slope, and how acceptance
depends on task, architecture family and relative size) are fitted by
`model.SpeculationRegressor`; everything here is pure numpy so it can be evaluated for
thousands of candidates at once.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from specreg.recommender.features import TASK_SLOTS, arch_index, column, task_index
from specreg.terms import ARCH_FAMILIES

# Cost of one MTP head step relative to a full target step (one extra layer of ~30-60).
MTP_STEP_FRACTION = 0.05


def expected_tokens_per_step(a: np.ndarray | float, k: np.ndarray | float) -> np.ndarray:
    """Leviathan et al.: E[tokens per verification] = (1 - a^(K+1)) / (1 - a); K+1 when a = 1."""
    a = np.clip(np.asarray(a, dtype=float), 0.0, 1.0 - 1e-9)
    k = np.asarray(k, dtype=float)
    return (1.0 - a ** (k + 1.0)) / (1.0 - a)


def drafted_acceptance(a: np.ndarray | float, k: np.ndarray | float) -> np.ndarray:
    """What llama.cpp reports as acceptance (accepted / drafted) for per-token acceptance a."""
    k = np.maximum(np.asarray(k, dtype=float), 1.0)
    return (expected_tokens_per_step(a, k) - 1.0) / k


def logit(p: np.ndarray | float, eps: float = 1e-3) -> np.ndarray:
    """log(p / (1 - p)), with p clipped to [eps, 1 - eps] (measured rates of 0 % and 100 %)."""
    p = np.clip(np.asarray(p, dtype=float), eps, 1.0 - eps)
    return np.log(p / (1.0 - p))


def roofline_tps(read_gb: float, bandwidth_gbs: float) -> float:
    """Plain-decoding bound: every token reads the active weights once."""
    return bandwidth_gbs / read_gb if read_gb > 0 else float("inf")


@dataclass(frozen=True)
class CostParams:
    """Fitted constants of the cost model (times in seconds, sizes in GB, bandwidth GB/s)."""

    target_eff: float = 0.25  # share of bandwidth a plain decode reaches
    target_tau: float = 0.003  # fixed seconds per token (kernel launches, sampling)
    draft_eff: float = 0.25
    draft_tau: float = 0.004
    verify_slope: float = 0.05  # extra verify cost per drafted token, relative to one step
    expert_share: float = 0.35  # share of a MoE step that does not scale with experts used
    acc_bias: float = 1.0  # logit of per-token acceptance, task unknown
    acc_same_arch: float = 1.0  # draft and target of one architecture family
    acc_pre_differs: float = -1.0
    acc_size: float = 0.3  # per unit of log(draft params / target active params)
    acc_temp: float = -1.0  # per unit of temperature
    acc_task: tuple[float, ...] = (0.0,) * len(TASK_SLOTS)
    acc_target_arch: tuple[float, ...] = (0.0,) * len(ARCH_FAMILIES)  # per target arch family
    ngram_bias: float = -1.0
    ngram_task: tuple[float, ...] = (0.0,) * len(TASK_SLOTS)
    mtp_bias: float = 1.5

    def to_vector(self) -> np.ndarray:
        out: list[float] = []
        for f in fields(self):
            v = getattr(self, f.name)
            out.extend(v if isinstance(v, tuple) else [v])
        return np.asarray(out, dtype=float)

    @classmethod
    def from_vector(cls, vec: np.ndarray) -> CostParams:
        kwargs: dict[str, object] = {}
        i = 0
        for f in fields(cls):
            n = vector_length(f.name)
            if n > 1:
                kwargs[f.name] = tuple(float(x) for x in vec[i : i + n])
                i += n
            else:
                kwargs[f.name] = float(vec[i])
                i += 1
        return cls(**kwargs)  # type: ignore[arg-type]


def vector_length(name: str) -> int:
    """How many numbers a CostParams field holds (tuples are per task or per arch family)."""
    return {
        "acc_task": len(TASK_SLOTS),
        "ngram_task": len(TASK_SLOTS),
        "acc_target_arch": len(ARCH_FAMILIES),
    }.get(name, 1)


def step_seconds(read_gb: np.ndarray, bw: np.ndarray, eff: float, tau: float) -> np.ndarray:
    return read_gb / (bw * eff) + tau


def acceptance(X: np.ndarray, p: CostParams, shift: np.ndarray | float = 0.0) -> np.ndarray:
    """Per-token acceptance probability for each row (0 for plain decoding).

    `shift` is added to the logit (the fit's per-sweep random effect)."""
    t = task_index(X)
    draft = column(X, "is_draft") > 0
    ngram = column(X, "is_ngram") > 0
    mtp = column(X, "is_mtp") > 0
    temp = column(X, "temperature")
    logit_draft = (
        p.acc_bias
        + np.asarray(p.acc_task)[t]
        + np.asarray(p.acc_target_arch)[arch_index(X)]
        + p.acc_same_arch * column(X, "same_arch_family")
        + p.acc_pre_differs * column(X, "tok_pre_differs")
        + p.acc_size * column(X, "log_size_ratio")
        + p.acc_temp * temp
    )
    logit_ngram = p.ngram_bias + np.asarray(p.ngram_task)[t]
    logit_mtp = p.mtp_bias + np.asarray(p.acc_task)[t] + p.acc_temp * temp
    logit = np.where(draft, logit_draft, np.where(ngram, logit_ngram, logit_mtp)) + shift
    a = 1.0 / (1.0 + np.exp(-logit))
    return np.where(draft | ngram | mtp, a, 0.0)


def baseline_seconds(X: np.ndarray, p: CostParams) -> np.ndarray:
    """Seconds per plain-decoded token at the default expert count: measured if known."""
    measured = column(X, "baseline_tps")
    modelled = step_seconds(
        column(X, "target_read_gb"), column(X, "bandwidth_gbs"), p.target_eff, p.target_tau
    )
    return np.where(
        np.isfinite(measured) & (measured > 0),
        1.0 / np.where(measured > 0, measured, 1.0),
        modelled,
    )


def predict_tps(
    X: np.ndarray, p: CostParams, acc_shift: np.ndarray | float = 0.0
) -> tuple[np.ndarray, np.ndarray]:
    """(tokens/s, per-token acceptance) from the cost model alone."""
    bw = column(X, "bandwidth_gbs")
    ratio = column(X, "experts_ratio")
    t_target = baseline_seconds(X, p) * (p.expert_share + (1.0 - p.expert_share) * ratio)
    k = column(X, "k")
    a = acceptance(X, p, acc_shift)
    draft = column(X, "is_draft") > 0
    mtp = column(X, "is_mtp") > 0
    speculating = (column(X, "is_ngram") > 0) | draft | mtp
    t_draft = np.where(
        draft,
        step_seconds(column(X, "draft_gb"), bw, p.draft_eff, p.draft_tau),
        np.where(mtp, MTP_STEP_FRACTION * t_target, 0.0),
    )
    tokens = np.where(speculating, expected_tokens_per_step(a, k), 1.0)
    seconds = np.where(speculating, t_target * (1.0 + p.verify_slope * k) + k * t_draft, t_target)
    return tokens / seconds, a
