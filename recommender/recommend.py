"""What to run for a target: ranked configurations with predicted speed, band, evidence, why.

`recommend` gathers the candidates the registry allows (compatible drafts from the auditor,
n-gram lookup, the target's MTP heads, and - under the speed policy - fewer MoE experts), scores
them with the speed model, pulls each towards this host's measurements where they exist, and
ranks them. "Do not speculate" and "no compatible draft" are answers like any other.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import duckdb
import numpy as np

from specreg.errors import UsageError
from specreg.host.facts import HostFacts
from specreg.recommender.acceptance import (
    ACC_AGREEMENT,
    ACC_PREDICTED,
    ACC_REPLAYED,
    Adjusted,
    MeasuredAgreement,
    agreement_why,
    apply_agreement,
    apply_lookup,
    apply_stack,
    load_agreement,
    lookup_why,
    measured_texts,
    stack_line,
)
from specreg.recommender.calibrated import Calibration, load_calibration
from specreg.recommender.costmodel import (
    CostParams,
    compute_share,
    draft_step_seconds,
    drafted_acceptance,
    expected_tokens_per_step,
    logit,
    ngram_draft_rate,
    per_token_acceptance,
    predict_tps,
    roofline_tps,
    verify_ratio,
)
from specreg.recommender.features import TASK_SLOTS, ConfigFacts, column, feature_matrix
from specreg.recommender.local import NGRAM_MATCH_DEFAULT, draft_fields, target_fields
from specreg.recommender.lookup_replay import N_MAX_DEFAULT, N_MIN_DEFAULT, StackSteps
from specreg.recommender.predictor import SpeedPredictor
from specreg.recommender.prior import Observation
from specreg.recommender.quality_cost import QualityCost, expert_cost, load_quality
from specreg.recommender.stacks import DRAFT_STACK, shown, stack_candidates
from specreg.registry.lookup_caches import LookupCache, list_caches
from specreg.registry.quality_store import QualityRecord
from specreg.registry.queries import ModelRecord, get_model, human_bytes, resolve_model
from specreg.stacks import Stack, parse_stack
from specreg.terms import (
    DEFAULT_TYPE_OF,
    POLICIES,
    POLICY_QUALITY,
    POLICY_SPEED,
    TASK_CHOICES,
    TASKS,
    Method,
    canonical_task,
)

K_GRID = (2, 3, 4, 6, 8, 12, 16, 24, 32)
NGRAM_K_GRID = (8, 16, 32)
MTP_K_GRID = (1, 2, 3)
MAX_DRAFTS = 6
MAX_DRAFT_SHARE = 1.0  # of the target's file size
# Hypothetical drafts for "this draft would fit": same tokenizer, Q8_0.
HYPOTHETICAL_PARAMS_B = (0.1, 0.25, 0.5, 1.0, 1.5, 3.0)
HYPOTHETICAL_BPW = 8.5
# Speculation must beat plain decoding by this much (point estimate) to be worth its memory.
MIN_GAIN = 1.05
# Scatter of one recorded local run (log tokens/s), for weighing it against the prediction.
LOCAL_RUN_SIGMA = 0.08
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
# Below this measured per-token agreement a draft cannot pay for itself at any K or cost.
RULED_OUT_AGREEMENT = 0.1


@dataclass(frozen=True)
class Knob:
    name: str
    value: str
    lossless: bool


@dataclass(frozen=True)
class Evidence:
    """A measured run close to an option: where it comes from and what it measured."""

    row_id: str
    source: str  # seed | sweep | local
    summary: str
    tps: float
    speedup: float | None


@dataclass(frozen=True)
class Option:
    """One configuration with its prediction. Speeds are tokens/s, speedups vs plain decoding."""

    method: Method
    k: int | None
    experts: int | None  # None: the model's default
    temperature: float
    draft_id: str | None
    draft_name: str | None
    draft_path: str | None
    expert_key: str | None
    tps: float
    tps_lo: float
    tps_hi: float
    speedup: float
    speedup_lo: float
    speedup_hi: float
    acceptance: float | None  # per-token, predicted
    tokens_per_step: float | None
    knobs: tuple[Knob, ...]
    why: tuple[str, ...]
    evidence: tuple[Evidence, ...] = ()
    measured_tps: float | None = None  # this host's runs of exactly this configuration
    n_measured: int = 0
    acceptance_source: str = ACC_PREDICTED  # run measured | agreement measured | predicted
    agreement: MeasuredAgreement | None = None  # `specreg agree`, when it set the acceptance
    quality: QualityCost | None = None  # what a behaviour-changing option costs in output
    stack: str | None = None  # llama.cpp's --spec-type when not the method's default type
    lookup_cache: str | None = None  # the workload cache ngram-cache reads, by name ...
    lookup_cache_path: str | None = None  # ... and its file
    weights_bytes: int = 0  # the target's and the draft's files: what must fit in memory
    evidence_shift: float = 1.0  # the factor measured runs near it moved the model's prediction
    memory_short_bytes: int = 0  # how far they exceed the host's memory (0: fit, or unknown)

    @property
    def spec_type(self) -> str:
        return self.stack or DEFAULT_TYPE_OF[self.method]

    @property
    def lossless(self) -> bool:
        return all(k.lossless for k in self.knobs)

    @property
    def label(self) -> str:
        parts = [self.spec_type if self.method is not Method.NONE else "plain"]
        if self.draft_name:
            parts.append(self.draft_name)
        if self.k is not None:
            parts.append(f"K={self.k}")
        if self.lookup_cache:
            parts.append(f"cache={self.lookup_cache}")
        if self.experts is not None:
            parts.append(f"experts={self.experts}")
        if any(k.name == "temperature" for k in self.knobs):
            parts.append(f"temp={self.temperature:g}")
        return " ".join(parts)

    @property
    def speedup_str(self) -> str:
        return f"{self.speedup:.2f}x [{self.speedup_lo:.2f}-{self.speedup_hi:.2f}]"

    @property
    def memory_note(self) -> str | None:
        """When its weights do not fit in the host's memory: what they need, how much more."""
        if not self.memory_short_bytes:
            return None
        what = "target and draft do" if self.draft_id else "the target does"
        return (
            f"{what} not fit in this host's memory ({human_bytes(self.weights_bytes)}, "
            f"{human_bytes(self.memory_short_bytes)} too many)"
        )


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


@dataclass(frozen=True)
class Recommendation:
    JSON_KIND = "recommendation"
    JSON_VERSION = "1"

    target_id: str
    target_name: str
    target_path: str
    task: str
    policy: str
    host: HostFacts
    roofline: Roofline
    options: tuple[Option, ...]  # allowed by the policy, best first; plain decoding included
    speculate: bool
    advice: tuple[str, ...]
    n_compatible_drafts: int
    n_considered: int
    considered_experts: tuple[int, ...] = field(default=())

    @property
    def best(self) -> Option:
        return self.options[0]

    @property
    def memory_advice(self) -> str | None:
        """Whether the options fit in the host's memory (one of `advice`), None when they do."""
        return _memory_advice(self.options)

    def to_json(
        self, commands: Sequence[str | None] = (), top: int | None = None
    ) -> dict[str, Any]:
        """The document `recommend --json` prints: the first `top` options (all by default),
        each with the command line at the same index of `commands` (None where not given)."""
        from specreg.jsonout import document, plain

        shown = self.options if top is None else self.options[:top]
        payload = plain(self)
        payload["options"] = [
            {
                **plain(o),
                "lossless": o.lossless,
                "command": commands[i] if i < len(commands) else None,
            }
            for i, o in enumerate(shown)
        ]
        payload["n_options"] = len(self.options)
        payload["roofline"]["fraction"] = self.roofline.fraction
        return document(self.JSON_KIND, self.JSON_VERSION, payload)


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


def _evidence(c: ConfigFacts, pool: Sequence[Observation]) -> tuple[Evidence, ...]:
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
        sp = o.speedup
        out.append(
            Evidence(
                row_id=o.row_id,
                source=o.source,
                summary=", ".join(bits),
                tps=o.tps,
                speedup=None if math.isnan(sp) else sp,
            )
        )
    return tuple(out)


def _config_key(c: ConfigFacts) -> tuple[object, ...]:
    return (
        c.method, c.k, c.experts, round(c.draft_gb, 3), round(c.temperature, 3), c.stack,
        c.lookup_cache,
    )  # fmt: skip


def _k_curve(c: ConfigFacts) -> tuple[object, ...]:
    """The options that differ only in K: one method (or stack, or cache), draft and expert
    count."""
    return (c.method, round(c.draft_gb, 3), c.experts, c.stack, c.lookup_cache)


def _acceptance_shift(X: np.ndarray, params: CostParams, measured: np.ndarray) -> float:
    """The acceptance-logit shift that makes the cost model report the measured acceptances.

    `X` holds the measured runs' rows; `measured` is llama.cpp's accepted/drafted for each.
    """
    target = logit(measured, eps=0.01)
    k = column(X, "k")
    shifts = np.linspace(-6.0, 6.0, 241)
    errors = [
        float(np.sum((logit(drafted_acceptance(predict_tps(X, params, s)[1], k)) - target) ** 2))
        for s in shifts
    ]
    return float(shifts[int(np.argmin(errors))])


def _local_correction(
    cands: Sequence[tuple[ConfigFacts, object]],
    local: Sequence[Observation],
    X: np.ndarray,
    model: SpeedPredictor,
    mid: np.ndarray,
    sigma: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Move predictions by what this host's runs showed for the same K curve.

    A K curve is one method + draft + expert count over all K. Its measured acceptance
    re-shapes the curve (acceptance decides where the curve peaks: a draft that is always
    right keeps paying off at long K); then its runs' mean log ratio (measured / predicted)
    moves the whole curve, shrunk towards zero while runs are few. Options of unmeasured
    curves move by the mean over all speculative runs, shrunk harder. So a few runs
    re-anchor the K curve of a pair without refitting the prior.
    """
    index = {_config_key(c): i for i, (c, _) in enumerate(cands)}
    curves: dict[tuple[object, ...], list[int]] = {}
    for i, (c, _) in enumerate(cands):
        if c.method is not Method.NONE:
            curves.setdefault(_k_curve(c), []).append(i)
    runs: dict[tuple[object, ...], list[tuple[int, Observation]]] = {}
    for o in local:
        at = index.get(_config_key(o.config))
        if at is not None and o.config.method is not Method.NONE:
            runs.setdefault(_k_curve(o.config), []).append((at, o))
    if not runs:
        return mid, sigma
    mid, sigma = mid.copy(), sigma.copy()
    for curve, measured in runs.items():
        with_acc = [(i, o.acceptance) for i, o in measured if o.acceptance is not None]
        if not with_acc:
            continue
        rows = np.array([i for i, _ in with_acc])
        shift = _acceptance_shift(X[rows], model.params, np.array([a for _, a in with_acc]))
        on_curve = np.array(curves[curve])
        before = predict_tps(X[on_curve], model.params)[0]
        after = predict_tps(X[on_curve], model.params, shift)[0]
        mid[on_curve] *= after / np.maximum(before, 1e-12)
    every: list[float] = []
    level: dict[tuple[object, ...], list[float]] = {}
    for curve, measured in runs.items():
        for i, o in measured:
            r = math.log(o.tps) - math.log(float(mid[i]))
            level.setdefault(curve, []).append(r)
            every.append(r)
    g = float(np.mean(every)) * len(every) / (len(every) + 2.0)
    for curve, members in curves.items():
        rs = level.get(curve)
        for i in members:
            if rs:
                n = len(rs)
                mid[i] *= math.exp(float(np.mean(rs)) * n / (n + 0.5))
                sigma[i] /= math.sqrt(1.0 + n)
            else:
                mid[i] *= math.exp(g)
    return mid, sigma


def _posterior(mid: float, sigma: float, measured: list[float]) -> tuple[float, float]:
    """Log-normal prediction combined with n local measurements (precision-weighted)."""
    if not measured:
        return mid, sigma
    prec = 1 / sigma**2 + len(measured) / LOCAL_RUN_SIGMA**2
    mean = (
        math.log(mid) / sigma**2 + sum(math.log(m) for m in measured) / LOCAL_RUN_SIGMA**2
    ) / prec
    return math.exp(mean), math.sqrt(1 / prec)


def _drafts(con: duckdb.DuckDBPyConnection, target: ModelRecord) -> list[tuple[ModelRecord, str]]:
    """Compatible drafts (best first) with their tokenizer relation, via the auditor."""
    from specreg.auditor import compatible_drafts

    out = []
    for pv in compatible_drafts(con, target):
        if pv.spec_type != DEFAULT_TYPE_OF[Method.DRAFT]:
            continue  # EAGLE-3 / DFlash heads are not modelled by the prior; None cannot run
        d = get_model(con, pv.draft.model_id)
        if d is None or d.draft_kind or (d.n_bytes or 0) > MAX_DRAFT_SHARE * (target.n_bytes or 0):
            continue  # a draft bigger than the target cannot pay for itself
        relation = "identical" if d.tok_fingerprint == target.tok_fingerprint else "padding-only"
        if any(c.name == "pre_tokenizer" and not c.passed for c in pv.checks):
            relation = "pre-tokenizer-differs"
        out.append((d, relation))
    return out[:MAX_DRAFTS]


def _why(c: ConfigFacts, model: SpeedPredictor, a: float, base_tps: float) -> tuple[str, ...]:
    p = model.params
    out = []
    t_target = 1.0 / base_tps
    if c.method is Method.NONE and c.experts_ratio >= 1:
        return ("plain decoding: the reference every speedup is measured against",)
    if c.experts_ratio < 1:
        share = p.expert_share + (1 - p.expert_share) * c.experts_ratio
        out.append(
            f"{c.experts} of {c.default_experts} experts: a step costs ~{share:.0%} of a full "
            "one, and the output changes (behaviour-changing)"
        )
    if c.method is Method.NONE:
        return tuple(out)
    e = float(expected_tokens_per_step(a, c.k))
    row = feature_matrix([c])
    calibrated = math.isfinite(c.verify_ratio)
    verify = float(verify_ratio(row, p)[0])
    if c.method is Method.DRAFT:
        t_d = float(draft_step_seconds(row, p, np.array([t_target]))[0])
        rel = "same architecture family" if c.same_arch_family else "other architecture"
        out.append(
            f"acceptance ~{a:.0%} per token ({c.task}, {rel}, draft "
            f"{c.draft_params_b / max(c.target_active_b, 1e-9):.1%} of the target's active "
            f"parameters) -> {e:.1f} tokens per verification at K={c.k}"
        )
        out.append(
            f"a draft step costs ~{t_d / t_target:.0%} of a target step; verifying K={c.k} "
            f"costs {verify:.2f}x a single step "
            f"({'calibrated on this host' if calibrated else 'modelled: run specreg calibrate'})"
        )
    elif c.method is Method.NGRAM:
        q = float(ngram_draft_rate(row, p)[0])
        out.append(
            f"n-gram lookup reuses text already in the context: no draft model; it finds a "
            f"match in ~{q:.0%} of the steps for {c.task}, then acceptance ~{a:.0%} -> "
            f"{e:.1f} tokens per verification of {verify:.2f}x a step"
        )
    else:
        out.append(
            f"the target's own MTP heads: acceptance ~{a:.0%} -> {e:.1f} tokens per verification"
            " (no measured runs in the prior: low confidence)"
        )
    return tuple(out)


def _knobs(c: ConfigFacts, draft_name: str | None, user_temp: float) -> tuple[Knob, ...]:
    knobs = []
    if c.method is Method.DRAFT:
        knobs.append(Knob("draft", draft_name or "?", True))
    if c.method is Method.NGRAM:
        knobs.append(Knob("ngram", DEFAULT_TYPE_OF[Method.NGRAM], True))
    if c.method is Method.MTP:
        knobs.append(Knob("mtp", DEFAULT_TYPE_OF[Method.MTP], True))
    if c.method is not Method.NONE:
        knobs.append(Knob("K", str(c.k), True))
    if c.experts_ratio < 1:
        knobs.append(Knob("experts", f"{c.experts}/{c.default_experts}", False))
    if c.temperature != user_temp:
        knobs.append(Knob("temperature", f"{c.temperature:g} (was {user_temp:g})", False))
    return tuple(knobs)


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
    requested = parse_stack(spec_type) if spec_type else None
    task = _checked_task(task, policy)
    target = _target(con, target_ref)
    local = [
        o
        for o in observations
        if o.source == "local" and o.group == target.model_id and o.host == host.fingerprint
    ]
    drafts = _drafts(con, target)
    # this host's llama-bench curves (`specreg calibrate`): verify cost per K, step ratios
    cal = load_calibration(
        con, host.fingerprint, target.model_id, [d.model_id for d, _ in drafts],
        threads=host.physical_cores,
    )  # fmt: skip
    base = _base_config(target, host, task, temperature, local, cal)
    caches = _usable_caches(con, target, task)
    cands, reduced = _candidates(
        target, base, drafts, cal, caches, policy=policy, temperature=temperature,
        requested=requested,
    )  # fmt: skip
    scores = _score(con, target, cands, base, model, local, task, temperature, observations)
    quality_rows = load_quality(con, target.model_id) if policy == POLICY_SPEED else []
    listed, over_budget = _options(
        target, cands, scores, model, local, caches, quality_rows, policy=policy, task=task,
        temperature=temperature, max_kld=max_kld, pool=observations, mem_bytes=host.mem_bytes,
    )  # fmt: skip
    options = _ranked(listed, requested)
    # options that fit in memory compete first: a prediction assumes the weights stay in memory
    fitting = [o for o in options if not o.memory_short_bytes] or options
    spec = [o for o in fitting if o.method is not Method.NONE or o.experts is not None]
    speculate = bool(spec) and spec[0].tps >= MIN_GAIN * scores.plain_tps
    if not speculate:
        options.sort(
            key=lambda o: (
                o.memory_short_bytes > 0,
                o.method is not Method.NONE or o.experts is not None,
                -o.tps,
            )
        )
    roof = _roofline(base, host, scores.plain_tps, scores.plain_measured, cal, model.params)
    advice = _advice(
        target, base, model, task, options, roof, speculate=speculate, has_drafts=bool(drafts),
        requested=requested, over_budget=over_budget, max_kld=max_kld,
    )  # fmt: skip
    return Recommendation(
        target_id=target.model_id,
        target_name=target.display_name,
        target_path=target.path,
        task=task,
        policy=policy,
        host=host,
        roofline=roof,
        options=tuple(options),
        speculate=speculate,
        advice=tuple(advice),
        n_compatible_drafts=len(drafts),
        n_considered=len(cands),
        considered_experts=tuple(reduced),
    )


Candidate = tuple[ConfigFacts, ModelRecord | None]  # a configuration and its draft model


def _checked_task(task: str, policy: str) -> str:
    """The canonical task, after checking it and the policy are ones specreg knows."""
    if policy not in POLICIES:
        raise UsageError(f"unknown policy {policy!r}: use {' or '.join(POLICIES)}")
    task = canonical_task(task)
    if task not in TASKS:
        raise UsageError(f"unknown task {task!r}: use one of {', '.join(TASK_CHOICES)}")
    return task


def _target(con: duckdb.DuckDBPyConnection, target_ref: str) -> ModelRecord:
    """The target model; refused when the auditor refuses it as a target whatever the draft
    (a draft head, a vision projector) or the registry lacks what the speed model reads."""
    from specreg.auditor import target_refusal

    target = resolve_model(con, target_ref)
    if (refusal := target_refusal(target)) is not None:
        raise UsageError(
            f"{target.display_name} is not a target: {refusal.message} ({refusal.name}); "
            "recommend for the model it drafts for"
        )
    if not target.n_params or not target.n_bytes:
        raise UsageError(
            f"{target.display_name} has no parameter count or size in the registry: rescan it"
        )
    return target


def _base_config(
    target: ModelRecord,
    host: HostFacts,
    task: str,
    temperature: float,
    local: Sequence[Observation],
    cal: Calibration,
) -> ConfigFacts:
    """Plain decoding of the target on this host: the configuration every candidate varies."""
    tf = target_fields(target)
    plain_runs = [
        o.tps for o in local if o.config.method is Method.NONE and o.config.experts_ratio >= 1
    ]
    base = ConfigFacts(
        bandwidth_gbs=host.bandwidth_gbs,
        physical_cores=host.physical_cores,
        **tf,
        method=Method.NONE,
        k=0,
        experts=tf["default_experts"],
        temperature=temperature,
        task=task,
        baseline_tps=float(np.median(plain_runs)) if plain_runs else math.nan,
    )
    return base.with_(**cal.target_fields())


def _candidates(
    target: ModelRecord,
    base: ConfigFacts,
    drafts: Sequence[tuple[ModelRecord, str]],
    cal: Calibration,
    caches: Sequence[LookupCache],
    *,
    policy: str,
    temperature: float,
    requested: Stack | None,
) -> tuple[list[Candidate], list[int]]:
    """Every configuration to score, plain decoding first, and the reduced expert counts tried.

    Drafts over K_GRID, n-gram lookup, the target's MTP heads, stacks and workload caches;
    under the speed policy also each of them with fewer MoE experts and, when the user samples,
    at temperature 0.
    """
    cands: list[Candidate] = [(base, None)]
    for draft, relation in drafts:
        drafted = draft_fields(draft, target, relation)
        for k in K_GRID:
            calibrated = {**cal.target_fields(k), **cal.draft_fields(draft.model_id, k)}
            c = base.with_(method=Method.DRAFT, k=k, **drafted, **calibrated)
            cands.append((c, draft))
    for k in NGRAM_K_GRID:
        c = base.with_(method=Method.NGRAM, k=k, ngram_n=NGRAM_MATCH_DEFAULT)
        cands.append((c.with_(**cal.target_fields(k)), None))
    if (target.nextn_predict_layers or 0) > 0:
        for k in MTP_K_GRID:
            cands.append((base.with_(method=Method.MTP, k=k, **cal.target_fields(k)), None))
    cands += stack_candidates(
        list(cands), list(caches), base, cal.target_fields,
        ngram_n=NGRAM_MATCH_DEFAULT, ngram_ks=NGRAM_K_GRID, requested=requested,
    )  # fmt: skip
    reduced: list[int] = []
    if policy == POLICY_SPEED and target.is_moe and base.default_experts > 1:
        de = base.default_experts
        reduced = sorted({max(1, de // 2), max(1, (3 * de) // 4)} - {de})
        full = list(cands)
        for e in reduced:
            cands.extend((c.with_(experts=e), d) for c, d in full)
    if policy == POLICY_SPEED and temperature > 0:
        # greedy sampling raises acceptance, at the price of deterministic output
        cands.extend(
            (c.with_(temperature=0.0), d) for c, d in list(cands) if c.method is not Method.NONE
        )
    return cands, reduced


@dataclass(frozen=True)
class _Scores:
    """The speed model's view of every candidate (arrays in candidate order), moved by measured
    agreement and this host's runs."""

    X: np.ndarray
    mid: np.ndarray
    sigma: np.ndarray
    acceptance: np.ndarray
    z: float  # the band's half-width in sigmas
    plain_tps: float
    plain_measured: bool
    adjusted: Adjusted
    runs_by_config: dict[tuple[object, ...], list[float]]  # this host's tokens/s per config
    accepted_by_curve: dict[tuple[object, ...], list[float]]  # per-token acceptance per K curve
    shift: np.ndarray  # the factor evidence moved each prediction by (`_evidence_correction`)
    near: list[_Near | None]  # each candidate's nearest measured run, as the model sees it
    stacks: tuple[StackSteps | None, ...] = ()  # draft stacks replayed on the target's text


def _score(
    con: duckdb.DuckDBPyConnection,
    target: ModelRecord,
    cands: Sequence[Candidate],
    base: ConfigFacts,
    model: SpeedPredictor,
    local: Sequence[Observation],
    task: str,
    temperature: float,
    observations: Sequence[Observation],
) -> _Scores:
    """Predict every candidate, then move the predictions by what was measured: the target's
    plain runs, `specreg agree`'s acceptance, this host's runs of each K curve and, for curves
    without them, the measured runs nearest to each candidate."""
    X = feature_matrix([c for c, _ in cands])
    lo, mid, hi = model.predict_interval(X)
    sigma = model.predict_log_sigma(X)
    acc = model.predict_acceptance(X)
    plain_tps = float(mid[0])
    by_key: dict[tuple[object, ...], list[float]] = {}
    for o in local:
        by_key.setdefault(_config_key(o.config), []).append(o.tps)
    measured_plain = by_key.get(_config_key(base), [])
    if measured_plain:
        plain_tps = _posterior(plain_tps, float(sigma[0]), measured_plain)[0]
    run_curves = {_k_curve(o.config) for o in local if o.acceptance is not None}
    agreements = load_agreement(con, target.model_id, task, temperature)
    adjusted = apply_agreement(
        [
            (d.model_id if d is not None and c.method is Method.DRAFT else None, c.k,
             _k_curve(c) in run_curves)
            for c, d in cands
        ],
        X, model.params, mid, acc, agreements,
    )  # fmt: skip
    stacks: tuple[StackSteps | None, ...] = ()
    if temperature == 0:  # the replay is greedy: the target's text is its greedy answers
        adjusted = apply_lookup(
            [(c.k, max(1, c.k // 4)) if _is_ngram_mod(c) else None for c, _ in cands],
            X, model.params, adjusted, measured_texts(agreements),
        )  # fmt: skip
        # a stack's K is its draft model's; its ngram-mod drafts with the build's defaults
        adjusted, stacks = apply_stack(
            [(d.model_id, c.k, N_MAX_DEFAULT, N_MIN_DEFAULT)
             if c.stack == DRAFT_STACK and c.method is Method.DRAFT and d is not None else None
             for c, d in cands],
            X, model.params, adjusted, agreements,
        )  # fmt: skip
    mid, sigma = _local_correction(cands, local, X, model, adjusted.mid, sigma)
    mine = {id(o) for o in local}
    ran_here = {_k_curve(o.config) for o in local if o.config.method is not Method.NONE}
    shift, near = _evidence_correction(
        [c for c, _ in cands], [o for o in observations if id(o) not in mine], model,
        # a replayed candidate's error elsewhere is the workload's, which the replay measured
        skip=[
            i == 0 or _k_curve(c) in ran_here or adjusted.sources[i] == ACC_REPLAYED
            for i, (c, _) in enumerate(cands)
        ],
    )  # fmt: skip
    mid = mid * shift
    # half of the move is doubt: the model and the runs disagree
    sigma = np.sqrt(sigma**2 + (0.5 * np.log(shift)) ** 2)
    return _Scores(
        X=X,
        mid=mid,
        sigma=sigma,
        acceptance=adjusted.acceptance,
        z=math.log(hi[0] / mid[0]) / sigma[0] if sigma[0] > 0 else 1.2816,
        plain_tps=plain_tps,
        plain_measured=bool(measured_plain),
        adjusted=adjusted,
        runs_by_config=by_key,
        accepted_by_curve=_accepted_by_curve(local),
        stacks=stacks,
        shift=shift,
        near=near,
    )


@dataclass(frozen=True)
class _Near:
    """A candidate's nearest measured run of its method (the evidence it cites first), what
    the model predicts for that run on its own host, and how many runs of its kind moved it."""

    obs: Observation
    predicted_speedup: float
    n_kind: int


def _is_ngram_mod(c: ConfigFacts) -> bool:
    """An ngram-mod candidate of its own: not a stack, no workload cache."""
    return c.method is Method.NGRAM and not c.stack and not c.lookup_cache and c.k > 0


def _evidence_correction(
    configs: Sequence[ConfigFacts],
    pool: Sequence[Observation],
    model: SpeedPredictor,
    skip: Sequence[bool],
) -> tuple[np.ndarray, list[_Near | None]]:
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
    near: list[_Near | None] = [None] * len(configs)
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
        near[i] = _Near(rows[j], float(predicted[j]), n)
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


def _evidence_why(c: ConfigFacts, speedup: float, shift: float, near: _Near) -> str | None:
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


def _accepted_by_curve(local: Sequence[Observation]) -> dict[tuple[object, ...], list[float]]:
    """Per-token acceptance of each K curve (pair, method, stack, task...), from its runs'
    accepted / drafted at the K they ran: one figure for every K of the curve."""
    drafting = [o for o in local if o.acceptance is not None and o.config.k > 0]
    per_token = per_token_acceptance(
        np.array([o.acceptance for o in drafting], dtype=float),
        np.array([o.config.k for o in drafting], dtype=float),
    )
    out: dict[tuple[object, ...], list[float]] = {}
    for o, a_run in zip(drafting, per_token, strict=True):
        out.setdefault(_k_curve(o.config), []).append(float(a_run))
    return out


Listed = tuple[Option, ConfigFacts, bool]  # an option, its facts, whether this host ran its curve


def _options(
    target: ModelRecord,
    cands: Sequence[Candidate],
    scores: _Scores,
    model: SpeedPredictor,
    local: Sequence[Observation],
    caches: Sequence[LookupCache],
    quality_rows: Sequence[QualityRecord],
    *,
    policy: str,
    task: str,
    temperature: float,
    max_kld: float | None,
    pool: Sequence[Observation],
    mem_bytes: int,
) -> tuple[list[Listed], int]:
    """The options the policy allows, in candidate order, and how many behaviour-changing
    options the KLD budget left out."""
    cache_of = {c.name: c for c in caches}
    over_budget = 0
    out: list[Listed] = []
    for i, (c, d) in enumerate(cands):
        changes_output = c.behaviour_changing or c.temperature != temperature
        if policy != POLICY_SPEED and changes_output:
            continue
        cost = None
        if c.experts_ratio < 1:
            cost = expert_cost(c.experts, c.default_experts, task, quality_rows)
            if max_kld is not None and cost.mean_kld > max_kld:
                over_budget += 1
                continue
        ran = [o for o in local if _k_curve(o.config) == _k_curve(c)] if c.stack else []
        option = _option(
            target, c, d, i, scores, model, cost, ran, cache_of, temperature=temperature,
            pool=pool, mem_bytes=mem_bytes,
        )  # fmt: skip
        out.append((option, c, bool(ran)))
    return out, over_budget


def _option(
    target: ModelRecord,
    c: ConfigFacts,
    d: ModelRecord | None,
    i: int,
    scores: _Scores,
    model: SpeedPredictor,
    cost: QualityCost | None,
    ran: Sequence[Observation],
    cache_of: dict[str, LookupCache],
    *,
    temperature: float,
    pool: Sequence[Observation],
    mem_bytes: int,
) -> Option:
    """Candidate `i` as an option: its band after this host's runs of exactly it, its
    acceptance, why and evidence."""
    meas = scores.runs_by_config.get(_config_key(c), [])
    m, s = _posterior(float(scores.mid[i]), float(scores.sigma[i]), meas)
    tps, tlo, thi = m, m * math.exp(-scores.z * s), m * math.exp(scores.z * s)
    plain_tps = scores.plain_tps
    a = float(scores.acceptance[i]) if c.method is not Method.NONE else None
    if a is not None and (measured := scores.accepted_by_curve.get(_k_curve(c))):
        a = float(np.median(measured))  # as this host's runs measured it
    why = _why(c, model, a or 0.0, plain_tps)
    if (used := scores.adjusted.used[i]) is not None:
        why = agreement_why(why, used, c.k)
    if scores.adjusted.lookups and (steps := scores.adjusted.lookups[i]) is not None:
        why = lookup_why(why, steps, c.task)
    if scores.stacks and (stacked := scores.stacks[i]) is not None:
        why = (*why, stack_line(stacked, c.task))
    if cost is not None:
        why = (*why, f"quality cost: {cost.label}")
    if c.stack:
        why = (_stack_why(c, cache_of.get(c.lookup_cache), ran), *why)
    near = scores.near[i]
    if near is not None and (
        line := _evidence_why(c, tps / plain_tps, float(scores.shift[i]), near)
    ):
        why = (*why, line)
    weights = (target.n_bytes or 0) + ((d.n_bytes or 0) if d else 0)
    short = max(0, weights - mem_bytes) if mem_bytes > 0 else 0
    if short:
        why = (*why, _memory_why(weights, mem_bytes, draft=d is not None))
    return Option(
        method=c.method,
        k=c.k if c.method is not Method.NONE else None,
        experts=c.experts if c.experts_ratio < 1 else None,
        temperature=c.temperature,
        draft_id=d.model_id if d else None,
        draft_name=d.display_name if d else None,
        draft_path=d.path if d else None,
        expert_key=target.expert_used_key if c.experts_ratio < 1 else None,
        tps=tps,
        tps_lo=tlo,
        tps_hi=thi,
        speedup=tps / plain_tps,
        speedup_lo=tlo / plain_tps,
        speedup_hi=thi / plain_tps,
        acceptance=a,
        tokens_per_step=float(expected_tokens_per_step(a, c.k)) if a is not None else None,
        knobs=_knobs(c, d.display_name if d else None, temperature),
        why=why,
        evidence=_run_evidence(ran) if ran else _evidence(c, pool),
        measured_tps=float(np.median(meas)) if meas else None,
        n_measured=len(meas),
        acceptance_source=scores.adjusted.sources[i],
        agreement=scores.adjusted.used[i],
        quality=cost,
        stack=c.stack or None,
        lookup_cache=c.lookup_cache or None,
        lookup_cache_path=cache_of[c.lookup_cache].path if c.lookup_cache else None,
        weights_bytes=weights,
        memory_short_bytes=short,
        evidence_shift=float(scores.shift[i]),
    )


def _memory_why(weights: int, mem_bytes: int, *, draft: bool) -> str:
    what = "the target's and the draft's weights" if draft else "the target's weights"
    return (
        f"{what} ({human_bytes(weights)}) do not fit in this host's {human_bytes(mem_bytes)} "
        f"of memory, by {human_bytes(weights - mem_bytes)}: what does not fit is read from "
        "disk again for every token, far below this prediction"
    )


def _ranked(listed: Sequence[Listed], requested: Stack | None) -> list[Option]:
    """The options recommend lists (recommender/stacks.py decides for stacks and caches; only
    the requested type and plain decoding when the user asked for one), fastest first."""
    keep = shown([(c, o.draft_id, o.tps, ran) for o, c, ran in listed], requested)
    options = [o for (o, _, _), k in zip(listed, keep, strict=True) if k]
    if requested is not None:
        options = [
            o for o in options if o.spec_type == requested.spelled or o.method is Method.NONE
        ]
    # what does not fit in memory is read from disk for every token: listed after what fits
    options.sort(key=lambda o: (o.memory_short_bytes > 0, -o.tps))
    return options


def _advice(
    target: ModelRecord,
    base: ConfigFacts,
    model: SpeedPredictor,
    task: str,
    options: Sequence[Option],
    roof: Roofline,
    *,
    speculate: bool,
    has_drafts: bool,
    requested: Stack | None,
    over_budget: int,
    max_kld: float | None,
) -> list[str]:
    """What the options alone do not say: no gain, no draft, no candidate of the requested
    type, drafts measured agreement rules out, options over the KLD budget, slow rollbacks,
    plain decoding far below its bound."""
    advice: list[str] = []
    if not speculate:
        advice.append(
            "do not speculate: no candidate is predicted to beat plain decoding by "
            f"{MIN_GAIN - 1:.0%} on this host"
        )
    if not has_drafts:
        advice.append(_no_draft_advice(target, base, model, task))
    if requested is not None and not any(o.spec_type == requested.spelled for o in options):
        advice.append(_no_candidate(requested, target, task))
    advice.extend(_agreement_advice(options))
    if memory := _memory_advice(options):
        advice.append(memory)
    if over_budget:
        advice.append(
            f"{over_budget} behaviour-changing options cost more than the KLD budget "
            f"{max_kld:g} and are not shown"
        )
    if target.is_hybrid or target.is_recurrent:
        advice.append(
            "hybrid/recurrent target: llama-server speculates on it with context checkpoints "
            "(slower rollbacks than a plain transformer)"
        )
    if roof.baseline_measured and roof.fraction < 0.3:
        advice.append(
            f"plain decoding runs at {roof.fraction:.0%} of its roofline bound: check "
            "threads (-t = physical cores), NUMA interleave and memory pinning first"
        )
    return advice


def _usable_caches(
    con: duckdb.DuckDBPyConnection, target: ModelRecord, task: str
) -> list[LookupCache]:
    """Workload caches of the target's tokenizer family for `task` whose file is as built (the
    run checks every record before llama-server reads it)."""
    if not target.tok_fingerprint:
        return []
    out = []
    for cache in list_caches(con, tok_fingerprint=target.tok_fingerprint, task=task):
        try:
            if os.stat(cache.path).st_size == cache.n_bytes:
                out.append(cache)
        except OSError:
            continue
    return out


def _stack_why(c: ConfigFacts, cache: LookupCache | None, ran: Sequence[Observation]) -> str:
    """What a stack or cache option is, and what its prediction rests on."""
    runs = ", ".join(o.row_id for o in sorted(ran, key=_run_number))
    basis = (
        f"moved by this host's runs of it ({runs})"
        if ran
        else "no runs of it here: scored as its method alone"
    )
    if c.lookup_cache and cache is not None:
        return (
            f"ngram-cache reads the workload cache {cache.name} ({cache.tokens_str} tokens of "
            f"{cache.task}, {cache.sources_str}; tokenizer family {cache.tok_family}) and drafts "
            f"up to {c.k} tokens (hard-coded in llama-server); {basis}"
        )
    stack = parse_stack(c.stack)
    if stack.stacked:
        return (
            f"{stack.spelled}: llama.cpp asks {', then '.join(stack.types)} for a draft each "
            f"step; scored as {stack.types[-1]}, {basis}"
        )
    return f"{stack.spelled}: scored as {c.method.value} lookup, {basis}"


def _run_evidence(ran: Sequence[Observation]) -> tuple[Evidence, ...]:
    """This host's runs of a stack or cache, newest first: the evidence it is listed on."""
    out = []
    for o in sorted(ran, key=_run_number, reverse=True)[:N_EVIDENCE]:
        acc = f", {o.acceptance:.0%} of drafted accepted" if o.acceptance is not None else ""
        sp = o.speedup
        out.append(
            Evidence(
                row_id=o.row_id,
                source=o.source,
                summary=f"{o.note}, {o.config.task}{acc}",
                tps=o.tps,
                speedup=None if math.isnan(sp) else sp,
            )
        )
    return tuple(out)


def _run_number(o: Observation) -> int:
    """A local run's id (row ids are `run:N`), for ordering runs by age."""
    tail = o.row_id.rpartition(":")[2]
    return int(tail) if tail.isdigit() else 0


def _no_candidate(requested: Stack, target: ModelRecord, task: str) -> str:
    if requested.needs_draft_file:
        why = "no compatible draft model in the registry"
    elif requested.uses_lookup_cache:
        why = (
            f"no lookup cache for {task} in the target's tokenizer family: build one with "
            "`specreg lookup-cache build`"
        )
    else:
        why = f"{target.display_name} cannot run it"
    return f"no candidate for --spec-type {requested.spelled}: {why}"


ROOFLINE_VERIFY_K = 4


def _roofline(
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


def _memory_advice(options: Sequence[Option]) -> str | None:
    """Whether the proposed configurations fit in the host's memory, and by how much not."""
    short = [o for o in options if o.memory_short_bytes]
    if not short:
        return None
    mem = short[0].weights_bytes - short[0].memory_short_bytes  # the host's memory
    plain = min(options, key=lambda o: o.weights_bytes)
    if plain.memory_short_bytes:
        return (
            f"memory: the target alone ({human_bytes(plain.weights_bytes)}) is larger than "
            f"this host's {human_bytes(mem)} of memory, by "
            f"{human_bytes(plain.memory_short_bytes)}, and no option fits: its weights would be "
            "read from disk for every token, far slower than predicted here; use a smaller "
            "quant or a host with more memory"
        )
    worst = max(short, key=lambda o: o.memory_short_bytes)
    return (
        f"memory: {len(short)} options do not fit in this host's {human_bytes(mem)} of memory "
        f"(target plus draft up to {human_bytes(worst.weights_bytes)}, "
        f"{human_bytes(worst.memory_short_bytes)} too many) and are listed after those that fit"
    )


def _agreement_advice(options: Sequence[Option]) -> list[str]:
    """Drafts that measured agreement rules out: no K of theirs beats plain decoding."""
    best: dict[str, Option] = {}
    for o in options:
        mine = o.acceptance_source == ACC_AGREEMENT and o.draft_id and o.experts is None
        if mine and (o.draft_id not in best or o.speedup > best[o.draft_id].speedup):
            best[o.draft_id] = o  # type: ignore[index]
    out = []
    for o in best.values():
        if o.agreement is None or o.speedup >= 1.0:
            continue
        if o.agreement.acceptance < RULED_OUT_AGREEMENT:
            out.append(
                f"measured agreement rules out {o.draft_name}: {o.agreement.summary}; it "
                f"almost never drafts the target's token (best K={o.k}: {o.speedup:.2f}x)"
            )
        else:
            out.append(
                f"with its measured agreement {o.draft_name} does not beat plain decoding on "
                f"this host: {o.agreement.summary}; best K={o.k}: {o.speedup:.2f}x"
            )
    return out


def _no_draft_advice(
    target: ModelRecord, base: ConfigFacts, model: SpeedPredictor, task: str
) -> str:
    """What would fit: the best hypothetical same-tokenizer draft, and the model-free modes."""
    hyp = [
        base.with_(
            method=Method.DRAFT,
            k=k,
            draft_params_b=p,
            draft_bpw=HYPOTHETICAL_BPW,
            draft_gb=p * HYPOTHETICAL_BPW / 8,
            draft_arch_family=base.target_arch_family,
            tok_relation="identical",
        )
        for p in HYPOTHETICAL_PARAMS_B
        for k in K_GRID
    ]
    pred = model.predict(feature_matrix([base, *hyp]))
    i = int(np.argmax(pred[1:]))
    best = hyp[i]
    parts = ["no compatible draft in the registry"]
    if task in ("summarize", "code", "json"):
        parts.append(f"use ngram-mod for {task} (it reuses text from the prompt)")
    if (target.nextn_predict_layers or 0) > 0:
        parts.append("use the target's MTP heads (--spec-type draft-mtp)")
    parts.append(
        f"this draft would fit: a {best.draft_params_b:g}B {target.architecture or ''} model "
        f"sharing the target's tokenizer (fingerprint {(target.tok_fingerprint or '?')[:12]}), "
        f"Q8_0, K={best.k}: predicted {pred[1 + i] / pred[0]:.1f}x"
    )
    return "; ".join(parts)
