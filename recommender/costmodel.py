"""The structure of speculative decoding, as formulas the learned model builds on.

Decoding one token on a CPU reads the active weights once, so on a big host its time is about
`bytes read / bandwidth` (divided by an efficiency the host reaches) plus a fixed overhead.
Speculation drafts K tokens (K cheap draft steps), then verifies them in one target pass over
K + 1 tokens. That pass costs what the host's llama-bench says: leaving llama.cpp's single-token
path costs a fixed share from the second token on, then the pass stays about flat while the
arithmetic of K + 1 tokens hides under the time the weights take to stream in (the reference
EPYC: to 16 tokens), and grows with K beyond (compute-bound; a 2-core host is there at K = 1).
`specreg calibrate` measures that curve on this host (llama-bench, one pass per batch size);
rows without it use the reference host's own measured curve (`REFERENCE_VERIFY_CURVE`), its
knee moved by how much more arithmetic a token costs against its bytes on the row's host
(bandwidth / cores) and at its quant (bits per weight). With per-token acceptance probability
`a`, a verification yields `(1 - a^(K+1)) / (1 - a)` tokens on average (Leviathan et al., 2023).

n-gram lookup drafts only when the context repeats (llama.cpp's ngram-mod needs a 24-token
match): a step drafts with probability `q` (per task) and costs a plain step when it does not.

The parameters of these formulas (efficiencies, overheads, the compute share, and how acceptance
depends on task, architecture family and relative size) are fitted by
`model.SpeculationRegressor`; everything here is pure numpy so it can be evaluated for
thousands of candidates at once.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from specreg.recommender.features import (
    REFERENCE_BANDWIDTH_GBS,
    REFERENCE_CORES,
    TASK_SLOTS,
    arch_index,
    column,
    task_index,
)
from specreg.terms import ARCH_FAMILIES

# A shift of the acceptance's logit: one for every row, or one per row.
Shift = np.ndarray | float
# Cost of one MTP head step relative to a full target step (one extra layer of ~30-60).
MTP_STEP_FRACTION = 0.05
# The bits per weight `verify_slope` is stated for (Q4_K_M): a wider quant streams more bytes
# per multiply, so its pass stays memory-bound to a larger batch.
REFERENCE_BPW = 4.85
REFERENCE_PARAMS_B = 10.0  # and the target size it is stated for
# llama-server against llama-bench on one host and thread count (calibrated rows only), where
# `specreg calibrate` has not measured it for the host and model (the fallback): every
# decode call the server makes (the target's plain step and verify pass, the draft's steps and
# its pass over the verified batch) takes this much longer than llama-bench's of the same size,
# and plain decoding's per-token sampling and slot loop are inside it. Measured on the 2-core
# development host with Qwen2.5-Coder-1.5B and its 0.5B draft (issue 26, 64 tokens a task):
# plain 37.0 ms a token against llama-bench's 31.9 (median of five tasks: 1.16), and fitted
# jointly over those five plain and twenty draft-simple runs, 1.16 again. One host and one pair:
# it scales every calibrated speed alike, so it moves no ranking between them.
SERVER_PASS_FACTOR = 1.16
# Seconds per vocabulary entry llama-server spends drafting a token beyond the draft's decode:
# its draft sampler takes a candidate per vocabulary entry (and the top-k of them) every time,
# so the cost is fixed seconds that grow with n_vocab, not a multiple of the draft's step. The
# Qwen pair's twenty draft-simple runs, with SERVER_PASS_FACTOR on every pass, leave 0.10 draft
# steps a drafted token (2.2 ms of 152k entries, 14 ns each); the synthetic d128 MoE pair's
# whole plain step in llama-server is 0.75 ms with SmolLM2's 49k entries, which bounds it at 15
# ns. At 15 ns a drafted token costs the d128 draft about its own step (1.1 steps were measured
# there) and the 0.5B draft 0.10 of one. The reference host's rows are modelled, not calibrated:
# their per-token costs stay in the fitted draft efficiency.
SAMPLE_SECONDS_PER_VOCAB = 15e-9
# Compute time of a token / memory time of a step, for a 10B Q4_K_M target on the reference
# host: a pass stays memory-bound to about 29 tokens (llama.cpp notes: flat to K of 16-32).
REFERENCE_COMPUTE_SHARE = 0.035
# The reference host's own verify curve (EPYC 9655, 96 cores, ~460 GB/s; llama-bench -p N -n 0
# of Qwen2.5-Coder-32B Q4_K_M, measured by its owner in 2026, the shared peers notes): a pass
# over N tokens in single-token passes. From the second token on a pass leaves the single-token
# kernels (1.6x), stays flat to 16 tokens, then turns compute-bound. Rows no `specreg calibrate`
# measured read it, their N scaled by their compute share against this model's on that host
# (`verify_ratio`): the issue-40 change, scored on the sweeps that keep the bound
# (benchmarks/k_choice.py).
REFERENCE_VERIFY_CURVE: tuple[tuple[int, float], ...] = (
    (1, 1.0), (2, 1.64), (4, 1.58), (8, 2.07), (16, 2.09), (32, 3.70), (64, 4.96),
)  # fmt: skip


def _monotone(points: tuple[tuple[int, float], ...]) -> tuple[tuple[int, float], ...]:
    """A measured pass curve made non-decreasing (a pass over more tokens never costs less):
    neighbours that fall are pooled to their mean (isotonic regression, equal weights)."""
    blocks: list[tuple[list[int], float]] = []
    for n, v in points:
        blocks.append(([n], v))
        while len(blocks) > 1 and blocks[-2][1] > blocks[-1][1]:
            (a, va), (b, vb) = blocks[-2], blocks[-1]
            blocks[-2:] = [(a + b, (va * len(a) + vb * len(b)) / (len(a) + len(b)))]
    return tuple((n, v) for ns, v in blocks for n in ns)


# ... as the model reads it: 1.64 and 1.58 at 2 and 4 tokens are one level (1.61)
VERIFY_CURVE = _monotone(REFERENCE_VERIFY_CURVE)
# ... and that model's bits per weight: the curve's compute share is this quant's
REFERENCE_CURVE_BPW = 4.85
# How sharply a pass turns from memory-bound to compute-bound (p-norm of the two times).
VERIFY_SHARPNESS = 5.0


def expected_tokens_per_step(
    a: np.ndarray | float, k: np.ndarray | float, burst: np.ndarray | float = 0.0
) -> np.ndarray:
    """E[tokens per verification] of K drafted tokens, per-token acceptance `a`.

    `burst` is the correlation of neighbouring acceptances within a step (where the target
    copies or follows a pattern, the draft gets long runs right): the first drafted token is
    accepted with probability `a`, each next one after an accepted one with
    `p = a + burst (1 - a)`, so `E = 1 + a (1 - p^K) / (1 - p)`. At burst 0 this is Leviathan
    et al.'s `(1 - a^(K+1)) / (1 - a)` (independent tokens, saturating at `1 / (1 - a)`); at
    a = 1 it is K + 1; it never falls with K or with burst.

    The first token is taken at the marginal rate, not at the rate after a rejection: in a
    stationary two-state chain entered after a rejection (`q = a (1 - burst)`) the mean run is
    `q / (1 - p) = a / (1 - a)` whatever the burst, so such a chain cannot make a long draft
    pay more than independent tokens do (issue 26).
    """
    a = np.clip(np.asarray(a, dtype=float), 0.0, 1.0)
    b = np.clip(np.asarray(burst, dtype=float), 0.0, 1.0)
    k = np.asarray(k, dtype=float)
    miss = np.clip((1.0 - a) * (1.0 - b), 1e-12, 1.0 - 1e-12)  # 1 - p
    run = -np.expm1(k * np.log1p(-miss)) / miss  # 1 + p + ... + p^(K-1)
    return 1.0 + a * run


def drafted_acceptance(
    a: np.ndarray | float, k: np.ndarray | float, burst: np.ndarray | float = 0.0
) -> np.ndarray:
    """What llama.cpp reports as acceptance (accepted / drafted) for per-token acceptance a."""
    k = np.maximum(np.asarray(k, dtype=float), 1.0)
    return (expected_tokens_per_step(a, k, burst) - 1.0) / k


def per_token_acceptance(
    drafted: np.ndarray | float, k: np.ndarray | float, burst: np.ndarray | float = 0.0
) -> np.ndarray:
    """The per-token acceptance whose drafted acceptance (llama.cpp's accepted / drafted) at
    draft length `k` is `drafted`: the inverse of `drafted_acceptance`, which rises with it
    (bisection, all elements at once)."""
    drafted = np.asarray(drafted, dtype=float)
    lo = np.zeros(np.broadcast(drafted, np.asarray(k), np.asarray(burst)).shape)
    hi = np.full_like(lo, 1.0 - 1e-9)
    for _ in range(50):
        mid = (lo + hi) / 2
        below = drafted_acceptance(mid, k, burst) < drafted
        lo, hi = np.where(below, mid, lo), np.where(below, hi, mid)
    return (lo + hi) / 2


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
    # a draft's share of bandwidth relative to the target's: the same kernels on the same host
    # stream alike (1); a draft step's own extra cost is its fixed seconds per token
    draft_eff: float = 1.0
    draft_tau: float = 0.004
    verify_slope: float = REFERENCE_COMPUTE_SHARE  # compute per token / memory per step
    verify_size_exp: float = 0.5  # how that share falls with the target's size (params^-exp)
    expert_share: float = 0.35  # share of a MoE step that does not scale with experts used
    # a MoE target's bandwidth efficiency relative to a dense one's (the shipped MoE rows: 12-27
    # t/s where their active bytes at a dense efficiency give 33); kept where no MoE row is seen
    moe_eff: float = 0.5
    acc_bias: float = 1.0  # logit of per-token acceptance, task unknown
    acc_same_arch: float = 1.0  # draft and target of one architecture family
    acc_pre_differs: float = -1.0
    acc_size: float = 0.3  # per unit of log(draft params / target active params)
    acc_temp: float = -1.0  # per unit of temperature
    acc_task: tuple[float, ...] = (0.0,) * len(TASK_SLOTS)
    acc_target_arch: tuple[float, ...] = (0.0,) * len(ARCH_FAMILIES)  # per target arch family
    ngram_bias: float = -1.0  # logit of the share of steps an n-gram lookup drafts at all
    ngram_task: tuple[float, ...] = (0.0,) * len(TASK_SLOTS)
    ngram_accept: float = 1.5  # logit of per-token acceptance when a lookup drafts
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


def compute_share(
    X: np.ndarray, p: CostParams, bpw: np.ndarray, params_b: np.ndarray
) -> np.ndarray:
    """Compute time of one token / memory time of a step, for this row's host, quant and size.

    Streaming the weights scales with bits per weight and 1/bandwidth, the arithmetic with
    1/cores: the share moves from the reference host by (bandwidth / cores) and 1/bpw. Work per
    token that does not scale with the weights (attention over the context, norms, per-operation
    overheads) is a larger share of a narrow model's pass: the share falls with size."""
    host = (column(X, "bandwidth_gbs") / REFERENCE_BANDWIDTH_GBS) * (
        REFERENCE_CORES / np.maximum(column(X, "physical_cores"), 1.0)
    )
    size = (np.maximum(params_b, 0.01) / REFERENCE_PARAMS_B) ** (-p.verify_size_exp)
    return p.verify_slope * host * size * REFERENCE_BPW / np.maximum(bpw, 1.0)


def pass_ratio(n_tokens: np.ndarray, share: np.ndarray) -> np.ndarray:
    """Soft roofline: a pass over n tokens in single-token passes (1 at n = 1)."""
    s = VERIFY_SHARPNESS
    n = np.maximum(np.asarray(n_tokens, dtype=float), 1.0)
    one = (1.0 + share**s) ** (1.0 / s)
    return (1.0 + (n * share) ** s) ** (1.0 / s) / one


def reference_pass_ratio(n_tokens: np.ndarray, scale: np.ndarray | float = 1.0) -> np.ndarray:
    """A pass over n tokens in single-token passes on the reference host's measured curve
    (`REFERENCE_VERIFY_CURVE`, linear between its points and along its last two beyond), its
    batch sizes scaled by `scale` (a row's compute share against the curve's): a host or quant
    whose tokens cost twice the arithmetic against their bytes reaches the knee at half the N.
    The fixed cost of leaving the single-token path stays: 1 at n = 1, the curve's 2-token
    cost at the least for every larger pass."""
    n = np.maximum(np.asarray(n_tokens, dtype=float), 1.0)
    xs = np.array([x for x, _ in VERIFY_CURVE], dtype=float)
    ys = np.array([y for _, y in VERIFY_CURVE], dtype=float)
    scaled = np.maximum(n * np.asarray(scale, dtype=float), 2.0)
    slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
    curve = np.where(scaled > xs[-1], ys[-1] + slope * (scaled - xs[-1]), np.interp(scaled, xs, ys))
    return np.where(n > 1.0, curve, 1.0)


def curve_scale(X: np.ndarray, p: CostParams) -> np.ndarray:
    """How much more arithmetic each row's token costs against its bytes than the reference
    curve's model on the reference host: (bandwidth / cores) against the reference host's, and
    the curve's bits per weight against the row's (a wider quant streams more bytes per
    multiply, so its pass stays memory-bound to a larger batch)."""
    host = (column(X, "bandwidth_gbs") / REFERENCE_BANDWIDTH_GBS) * (
        REFERENCE_CORES / np.maximum(column(X, "physical_cores"), 1.0)
    )
    return host * REFERENCE_CURVE_BPW / np.maximum(column(X, "target_bpw"), 1.0)


def verify_ratio(X: np.ndarray, p: CostParams) -> np.ndarray:
    """Cost of verifying each row's K (a pass over K + 1 tokens) in single target steps:
    calibrated on this host where `specreg calibrate` measured it, else the reference host's
    measured curve at the row's scale (`reference_pass_ratio`). Plus a logits row per drafted
    position: llama-bench's passes compute only the last one, and at small batches the output
    layer streams its weights again for every row."""
    measured = column(X, "verify_ratio")
    k = column(X, "k")
    modelled = reference_pass_ratio(k + 1.0, curve_scale(X, p))
    rows = k * np.nan_to_num(column(X, "output_share"))
    return np.where(np.isfinite(measured) & (measured > 0), measured, modelled) + rows


def acceptance(X: np.ndarray, p: CostParams, shift: Shift = 0.0) -> np.ndarray:
    """Per-token acceptance probability for each row (0 for plain decoding); for n-gram rows,
    the acceptance of a lookup's draft when it makes one.

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
    logit_ngram = np.full(len(X), p.ngram_accept)
    logit_mtp = p.mtp_bias + np.asarray(p.acc_task)[t] + p.acc_temp * temp
    logit = np.where(draft, logit_draft, np.where(ngram, logit_ngram, logit_mtp)) + shift
    a = 1.0 / (1.0 + np.exp(-logit))
    return np.where(draft | ngram | mtp, a, 0.0)


def ngram_draft_rate(X: np.ndarray, p: CostParams) -> np.ndarray:
    """Share of steps in which an n-gram lookup finds a match and drafts (per task)."""
    logit = p.ngram_bias + np.asarray(p.ngram_task)[task_index(X)]
    return 1.0 / (1.0 + np.exp(-logit))


def pass_factor(X: np.ndarray) -> np.ndarray:
    """llama-server's pass against llama-bench's for each row: as `specreg calibrate` measured
    it on the row's host, else the constant SERVER_PASS_FACTOR."""
    measured = column(X, "pass_factor")
    return np.where(np.isfinite(measured) & (measured > 0), measured, SERVER_PASS_FACTOR)


def baseline_seconds(X: np.ndarray, p: CostParams) -> np.ndarray:
    """Seconds per plain-decoded token at the default expert count: measured by a run if
    known, else by `specreg calibrate` (llama-bench's step, times what llama-server's steps
    take more: the pass factor, `pass_factor`), else modelled from the bytes read."""
    measured = column(X, "baseline_tps")
    calibrated = column(X, "target_step_s")
    # a MoE target's step streams its active experts at a share of a dense one's efficiency:
    # llama.cpp gathers each token's experts (mul_mat_id) where a dense step reads one matrix
    eff = p.target_eff * np.where(column(X, "target_is_moe") > 0, p.moe_eff, 1.0)
    modelled = column(X, "target_read_gb") / (column(X, "bandwidth_gbs") * eff) + p.target_tau
    served = pass_factor(X) * calibrated
    out = np.where(np.isfinite(calibrated) & (calibrated > 0), served, modelled)
    return np.where(
        np.isfinite(measured) & (measured > 0),
        1.0 / np.where(measured > 0, measured, 1.0),
        out,
    )


def draft_step_seconds(X: np.ndarray, p: CostParams, t_target: np.ndarray) -> np.ndarray:
    """Seconds per draft token: the calibrated ratio to the target's step, else modelled."""
    ratio = column(X, "draft_step_ratio")
    modelled = step_seconds(
        column(X, "draft_gb"), column(X, "bandwidth_gbs"), p.target_eff * p.draft_eff, p.draft_tau
    )
    return np.where(np.isfinite(ratio) & (ratio > 0), ratio * t_target, modelled)


@dataclass(frozen=True, eq=False)
class Rounds:
    """What one verification round of each row yields and costs (arrays, one per row), in the
    row's plain decoding steps at full experts: the cost model's arithmetic, as `recommend`'s
    why lines print it. Plain decoding is a round of one token costing one step (at fewer
    experts, the share of a full step it costs)."""

    tokens: np.ndarray  # tokens per round (n-gram: drafting and non-drafting rounds averaged)
    verify: np.ndarray  # steps of the target's passes per round
    draft: np.ndarray  # steps the draft (or MTP heads) spends per round
    drafting: np.ndarray  # share of rounds that draft (n-gram: the match rate; else 1)
    per_verification: np.ndarray  # tokens a drafting verification yields
    acceptance: np.ndarray  # per-token acceptance (0 for plain decoding)
    plain_seconds: np.ndarray  # seconds of a plain step at full experts
    verify_ratio: np.ndarray  # a verification pass in the row's own (expert-scaled) steps
    draft_ratio: np.ndarray  # a drafted token in the row's own steps
    step_share: np.ndarray  # the row's own step in full plain steps (fewer experts: below 1)

    @property
    def steps(self) -> np.ndarray:
        return self.verify + self.draft

    @property
    def speedup(self) -> np.ndarray:
        """Tokens per round over steps per round: the speed-up over plain decoding."""
        return self.tokens / np.maximum(self.steps, 1e-12)

    @property
    def tps(self) -> np.ndarray:
        return self.speedup / np.maximum(self.plain_seconds, 1e-12)

    @property
    def bound(self) -> np.ndarray:
        """The most speed-up a row's round can give: the tokens a verification yields over the
        least a round costs (one of the row's own steps)."""
        return self.per_verification / np.maximum(self.step_share, 1e-12)


@dataclass(frozen=True)
class Replayed:
    """What replays on the target's text measured, per row, in place of the fitted figures
    where finite. `lookup`: (q, tokens per drafting step) of n-gram rows (`lookup_replay`).
    `stack`: (share of steps the lookup drafts, tokens per step) of draft rows with n-gram
    lookup stacked in front (`lookup_replay.stack_replay`): on the lookup's steps the draft
    model drafts nothing and only takes in the verified batch."""

    lookup: tuple[np.ndarray, np.ndarray] | None = None
    stack: tuple[np.ndarray, np.ndarray] | None = None


NOT_REPLAYED = Replayed()


def rounds(
    X: np.ndarray, p: CostParams, acc_shift: Shift = 0.0, replayed: Replayed = NOT_REPLAYED
) -> Rounds:
    """The cost model's round of every row (see `predict_tps` for the arguments)."""
    lookup, stack = replayed.lookup, replayed.stack
    plain = baseline_seconds(X, p)
    ratio = column(X, "experts_ratio")
    share = p.expert_share + (1.0 - p.expert_share) * ratio
    t_target = plain * share
    k = column(X, "k")
    a = acceptance(X, p, acc_shift)
    draft = column(X, "is_draft") > 0
    mtp = column(X, "is_mtp") > 0
    ngram = column(X, "is_ngram") > 0
    speculating = ngram | draft | mtp
    e = expected_tokens_per_step(a, k)
    verify = verify_ratio(X, p)
    t_d = draft_step_seconds(X, p, t_target)
    # Calibrated rows (this host, the pinned build's llama-server): the draft mirrors the
    # verified batch (one pass over K + 1 tokens), then decodes a token per drafted one and
    # samples each from its vocabulary (t_d is a server step: the target's is). Modelled rows
    # follow the build the prior was measured with (7371): the draft takes in the accepted
    # tokens (a pass over about E), then drafts the rest of its K; its fixed seconds per token
    # hold the per-token costs beyond its bytes.
    mirrored = column(X, "draft_pass_ratio")
    calibrated = np.isfinite(mirrored)
    draft_share = compute_share(X, p, column(X, "draft_bpw"), column(X, "draft_params_b"))
    sampling = SAMPLE_SECONDS_PER_VOCAB * np.nan_to_num(column(X, "draft_n_vocab"))
    per_step = np.where(
        calibrated,
        mirrored + k * (1.0 + sampling / np.maximum(t_d, 1e-12)),
        pass_ratio(e, draft_share) + np.maximum(k - 1.0, 0.0),
    )
    draft_seconds = np.where(
        draft, t_d * per_step, np.where(mtp, MTP_STEP_FRACTION * t_target * k, 0.0)
    )
    if stack is not None:
        known = draft & np.isfinite(stack[0]) & np.isfinite(stack[1])
        f = np.where(known, stack[0], 0.0)
        take_in = np.where(calibrated, t_d * np.nan_to_num(mirrored), 0.0)
        draft_seconds = np.where(known, (1.0 - f) * draft_seconds + f * take_in, draft_seconds)
        e = np.where(known, stack[1], e)
    q = np.where(ngram, ngram_draft_rate(X, p), 1.0)
    if lookup is not None:
        measured = ngram & np.isfinite(lookup[0]) & np.isfinite(lookup[1])
        q = np.where(measured, lookup[0], q)
        e = np.where(measured, lookup[1], e)
    tokens = np.where(speculating, (1.0 - q) + q * e, 1.0)
    verify_steps = np.where(speculating, share * ((1.0 - q) + q * verify), share)
    return Rounds(
        tokens=tokens,
        verify=verify_steps,
        draft=np.where(speculating, draft_seconds / plain, 0.0),
        drafting=np.where(speculating, q, 0.0),
        per_verification=np.where(speculating, e, 1.0),
        acceptance=a,
        plain_seconds=plain,
        verify_ratio=np.where(speculating, verify, 1.0),
        draft_ratio=np.where(draft, t_d / np.maximum(t_target, 1e-12), 0.0),
        step_share=share,
    )


def predict_tps(
    X: np.ndarray, p: CostParams, acc_shift: Shift = 0.0, replayed: Replayed = NOT_REPLAYED
) -> tuple[np.ndarray, np.ndarray]:
    """(tokens/s, per-token acceptance) from the cost model alone.

    A draft step: the target verifies K + 1 tokens in one pass and the draft drafts K (see
    `rounds` for the two builds' ways of feeding the draft). An n-gram step drafts with
    probability q and costs a plain step when it does not; an MTP head costs a small share of
    a target step per token. `replayed`: what replays measured, in place of the fitted
    figures (`Replayed`)."""
    r = rounds(X, p, acc_shift, replayed)
    return r.tps, r.acceptance
