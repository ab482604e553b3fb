"""Measured runs as evidence: which runs an option cites, what each differs in, how far runs of
its kind move its prediction, and how runs of exactly it on the same host bound it.

What a cited run is to an option (`Cited`): a run of the same target, or - marked so, with
its distance - the nearest run of another target; and everything it differs in (target,
quant, draft, K, task, temperature, experts, host, a baseline the recommender distrusts). An
option outside a cited run's spread names those differences in its why lines (issue 40).

Runs of exactly an option's configuration on the same host and task (`twins`) bound it: its
speed-up is pulled to theirs and kept within their spread (the noise figure either side).
A run whose speed-up exceeds the tokens its own reported acceptance can yield per verification
breaks the bound of speculation (`breaks_bound`) and is neither cited nor used.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from specreg.host.facts import HostFacts
from specreg.recommender.features import TASK_SLOTS, ConfigFacts, feature_matrix
from specreg.recommender.predictor import SpeedPredictor
from specreg.recommender.prior import Observation, model_key
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
# Hosts whose bandwidth differs by no more than this (and whose cores are the same) are the
# same host to evidence: the reference host's runs are this host's when its facts are stated.
SAME_BANDWIDTH = 0.05
# Bits per weight within this share are one quant where a name is missing (the prior's come
# from file sizes in GB or GiB, the registry's from tensors: Q4_K_M reads 4.6-5.1).
SAME_QUANT = 0.12

# What a run can differ in from an option, as its why lines name it.
DIFF_TARGET = "target"
DIFF_QUANT = "quant"
DIFF_DRAFT = "draft"
DIFF_DRAFT_QUANT = "draft quant"
DIFF_K = "K"
DIFF_TASK = "task"
DIFF_TEMPERATURE = "temperature"
DIFF_EXPERTS = "experts"
DIFF_HOST = "host"
DIFF_BASELINE = "baseline"


@dataclass(frozen=True)
class Identity:
    """Who an option is: its target's and draft's identities across sources (model ids and
    `prior.model_key` of their names) and quants, and the host it is asked for."""

    target: frozenset[str]
    draft: frozenset[str]
    host: HostFacts
    quant: str = ""
    draft_quant: str = ""
    # whether runs of a host with the same facts are this host's: yes while this host is known
    # only by its facts (stated, or never calibrated for the target); a calibrated host is
    # known by its own measurements, and another machine of its size is not it
    by_facts: bool = True

    def same_target(self, o: Observation) -> bool:
        return o.group in self.target

    def same_draft(self, o: Observation) -> bool:
        return bool(o.draft_key) and o.draft_key in self.draft


def identity_keys(model_id: str, display_name: str, path: str) -> frozenset[str]:
    """The identities a registry model is known by: its id, and the keys of its display name
    and its file's name (a Hugging Face blob's name is a hash: the display name still counts)."""
    return frozenset({model_id, model_key(display_name), model_key(Path(path).name)} - {""})


def same_host(o: Observation, host: HostFacts, by_facts: bool = True) -> bool:
    """A run of the host asked about: the same fingerprint or, while the host is known only by
    its facts (`by_facts`), the same facts (cores, and bandwidth within SAME_BANDWIDTH): the
    reference host's runs are this host's when its facts are stated."""
    if host.fingerprint and o.host == host.fingerprint:
        return True
    if not by_facts:
        return False
    c = o.config
    return c.physical_cores == host.physical_cores and (
        abs(c.bandwidth_gbs / max(host.bandwidth_gbs, 1e-9) - 1.0) <= SAME_BANDWIDTH
    )


def breaks_bound(o: Observation) -> bool:
    """A run that measured more speed-up than its own accepted / drafted allows: a
    verification yields at most 1 + acceptance x K tokens and costs at least one step."""
    c = o.config
    acc = o.reported_acceptance if o.reported_acceptance is not None else o.acceptance
    if acc is None or c.k <= 0 or not c.baseline_tps > 0:
        return False
    return o.speedup > 1.0 + acc * c.k + 1e-9


def usable(o: Observation) -> bool:
    return o.tps > 0 and not breaks_bound(o)


def _close(a: float, b: float, tol: float) -> bool:
    return abs(a - b) <= tol * max(abs(a), abs(b), 1e-12)


def _same_quant(a: str, b: str, bpw_a: float, bpw_b: float) -> bool:
    """One quant: by name where both are known, else by bits per weight (sizes are counted
    differently by the sources: SAME_QUANT)."""
    if a and b:
        return a.upper() == b.upper()
    return _close(bpw_a, bpw_b, SAME_QUANT)


def _experts(c: ConfigFacts) -> str:
    return f"{c.experts} of {c.default_experts}" if c.experts_ratio < 1 else "all"


def differences(
    o: Observation, c: ConfigFacts, who: Identity, baseline_distrusted: bool = False
) -> tuple[str, ...]:
    """What run `o` differs in from candidate `c` (with its identities `who`)."""
    rc = o.config
    out = []
    if not who.same_target(o):
        out.append(DIFF_TARGET)
    elif not _same_quant(o.quant, who.quant, rc.target_bpw, c.target_bpw):
        out.append(DIFF_QUANT)
    if c.method is Method.DRAFT:
        if not who.same_draft(o):
            out.append(DIFF_DRAFT)
        elif not _same_quant(o.draft_quant, who.draft_quant, rc.draft_bpw, c.draft_bpw):
            out.append(DIFF_DRAFT_QUANT)
    if c.method is not Method.NONE and rc.k != c.k:
        out.append(DIFF_K)
    if c.method is not Method.NONE and rc.task != c.task:
        out.append(DIFF_TASK)
    if abs(rc.temperature - c.temperature) > 1e-9:
        out.append(DIFF_TEMPERATURE)
    if _experts(rc) != _experts(c):
        out.append(DIFF_EXPERTS)
    if not same_host(o, who.host, who.by_facts):
        out.append(DIFF_HOST)
    if baseline_distrusted:
        out.append(DIFF_BASELINE)
    return tuple(out)


# The differences shown as the run's value beside this option's: "K (4, this option 8)".
_VERSUS: dict[str, Callable[[ConfigFacts], object]] = {
    DIFF_K: lambda f: f.k,
    DIFF_TASK: lambda f: f.task,
    DIFF_TEMPERATURE: lambda f: f"{f.temperature:g}",
    DIFF_EXPERTS: _experts,
    DIFF_HOST: lambda f: f"{f.bandwidth_gbs:.0f} GB/s, {f.physical_cores} cores",
}


def _difference_text(what: str, o: Observation, c: ConfigFacts, plain: PlainRuns) -> str:
    rc = o.config
    if what in _VERSUS:
        show = _VERSUS[what]
        return f"{what} ({show(rc)}, this option {show(c)})"
    if what == DIFF_TARGET:
        return f"target ({o.target_name or o.group})"
    if what == DIFF_DRAFT:
        return f"draft ({o.draft_name or o.draft_key})"
    if what == DIFF_QUANT:
        return f"quant ({o.quant or f'{rc.target_bpw:.2f} bits per weight'})"
    if what == DIFF_DRAFT_QUANT:
        return f"draft quant ({o.draft_quant or f'{rc.draft_bpw:.2f} bits per weight'})"
    median = plain.median(o)
    return (
        f"baseline ({rc.baseline_tps:.2f} t/s, distrusted: this target's plain runs on that "
        f"host have a median of {median:.2f} t/s, over which it is {o.tps / median:.2f}x)"
    )


class PlainRuns:
    """The plain decoding runs of each target and quant, per host facts: what a run's baseline
    is measured against (`distrusted`)."""

    def __init__(self, pool: Sequence[Observation], noise: float) -> None:
        self.noise = noise
        self._by: dict[tuple[str, float, float, int], list[float]] = {}
        for o in pool:
            c = o.config
            if c.method is Method.NONE and c.experts_ratio >= 1 and o.tps > 0:
                self._by.setdefault(self._key(o), []).append(o.tps)

    @staticmethod
    def _key(o: Observation) -> tuple[str, float, float, int]:
        c = o.config
        return (o.group, round(c.target_bpw, 1), round(c.bandwidth_gbs, -1), c.physical_cores)

    def median(self, o: Observation) -> float:
        runs = self._by.get(self._key(o), [])
        return statistics.median(runs) if runs else math.nan

    def distrusted(self, o: Observation) -> bool:
        """A speculative run's baseline further from its target's median plain run on the same
        host than one measurement scatters (the noise figure), with two or more plain runs."""
        runs = self._by.get(self._key(o), [])
        b = o.config.baseline_tps
        if o.config.method is Method.NONE or len(runs) < 2 or not b > 0:
            return False
        return abs(b / statistics.median(runs) - 1.0) > self.noise

    def speedup(self, o: Observation) -> float:
        """The run's speed-up, over its target's median plain run where its own baseline is
        distrusted."""
        return o.tps / self.median(o) if self.distrusted(o) else o.speedup


@dataclass(frozen=True)
class Cited:
    """A run an option cites, with what it differs in (as its why lines name it)."""

    obs: Observation
    evidence: Evidence
    differs: tuple[str, ...]
    speedup: float  # as compared: over the median plain run where its baseline is distrusted
    lines: tuple[str, ...]  # the differences in words


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


def _summary(o: Observation, same_target: bool, distance: float) -> str:
    oc = o.config
    bits = [o.target_name or f"{oc.target_params_b:.3g}B target"]
    if oc.method is Method.DRAFT:
        bits.append(f"draft {o.draft_name or f'{oc.draft_params_b:.3g}B'}")
    if oc.k:
        bits.append(f"K={oc.k}")
    if oc.experts_ratio < 1:
        bits.append(f"experts {oc.experts}/{oc.default_experts}")
    if oc.temperature:
        bits.append(f"temp {oc.temperature:g}")
    bits.append(oc.task)
    text = ", ".join(bits)
    if not same_target:
        text = f"nearest run of another target (distance {distance:.2f}): {text}"
    return text


def cite(
    c: ConfigFacts,
    pool: Sequence[Observation],
    who: Identity,
    plain: PlainRuns,
    ran: Sequence[Observation] = (),
) -> tuple[Cited, ...]:
    """The runs candidate `c` cites: this host's runs of it where given (`ran`, stacks and
    caches, newest first), else the closest runs of its method and target (twins first, then
    the same draft, then any), else - marked so - the nearest run of another target."""
    if ran:
        chosen = [(o, 0.0) for o in sorted(ran, key=run_number, reverse=True)[:N_EVIDENCE]]
    else:
        same = [o for o in pool if o.config.method is c.method and usable(o)]
        if not same:
            return ()
        d = np.sqrt(((_evidence_space([o.config for o in same]) - _evidence_space([c])[0]) ** 2)
                    .sum(axis=1))  # fmt: skip
        mine = [i for i, o in enumerate(same) if who.same_target(o)]
        if mine:

            def rank(i: int) -> tuple[int, float]:
                o = same[i]
                tier = len(differences(o, c, who)) if who.same_target(o) else 99
                local = -1.0 if o.source == "local" else 0.0
                return (tier, float(d[i]) + local)

            picked = sorted(mine, key=rank)[:N_EVIDENCE]
        else:
            picked = [int(np.argmin(d))]
        chosen = [(same[i], float(d[i])) for i in picked]
    out = []
    for o, dist in chosen:
        distrust = plain.distrusted(o)
        diff = differences(o, c, who, distrust)
        same_t = who.same_target(o)
        sp = o.speedup
        ev = Evidence(
            row_id=o.row_id,
            source=o.source,
            summary=_summary(o, same_t, round(dist, 2)) if not ran else _ran_summary(o),
            tps=o.tps,
            speedup=None if math.isnan(sp) else sp,
            target=o.target_name or o.group,
            same_target=same_t,
            distance=None if same_t else round(dist, 2),
            draft=o.draft_name or None,
            k=o.config.k if o.config.method is not Method.NONE else None,
            task=o.config.task,
            temperature=o.config.temperature,
            experts=o.config.experts if o.config.experts_ratio < 1 else None,
            same_host=same_host(o, who.host, who.by_facts),
            baseline_tps=o.config.baseline_tps if o.config.baseline_tps > 0 else None,
            baseline_distrusted=distrust,
            differs=diff,
        )
        words = tuple(_difference_text(w, o, c, plain) for w in diff)
        out.append(Cited(o, ev, diff, plain.speedup(o), words))
    return tuple(out)


def _ran_summary(o: Observation) -> str:
    acc = f", {o.acceptance:.0%} of drafted accepted" if o.acceptance is not None else ""
    return f"{o.note}, {o.config.task}{acc}"


def run_number(o: Observation) -> int:
    """A local run's id (row ids are `run:N`), for ordering runs by age."""
    tail = o.row_id.rpartition(":")[2]
    return int(tail) if tail.isdigit() else 0


def twins(
    c: ConfigFacts, pool: Sequence[Observation], who: Identity, plain: PlainRuns
) -> list[Observation]:
    """Runs of exactly candidate `c` on the host asked about, for its task: the same target and
    quant, draft and its quant, method and type, K, temperature and experts (baselines the
    recommender distrusts included: their speed-up is read over the median plain run)."""
    out = []
    for o in pool:
        rc = o.config
        if rc.method is not c.method or (rc.stack, rc.lookup_cache) != (c.stack, c.lookup_cache):
            continue
        if usable(o) and not [d for d in differences(o, c, who) if d != DIFF_BASELINE]:
            out.append(o)
    return out


@dataclass(frozen=True)
class Near:
    """How many runs of a candidate's kind moved it (`evidence_correction`)."""

    n_kind: int


def evidence_correction(
    configs: Sequence[ConfigFacts],
    pool: Sequence[Observation],
    model: SpeedPredictor,
    skip: Sequence[bool],
) -> tuple[np.ndarray, list[Near | None]]:
    """The factor measured runs move each candidate's prediction by.

    A run's residual is its measured speedup over the model's speedup for the same
    configuration on the run's own host (log scale): what the host explains stays with the
    model, what the model gets wrong about a pair moves the candidate. The runs of the
    candidate's kind (`_same_kind`: one pair at any K, expert count or task) give a mean
    residual, weighted by closeness exp(-d^2 / 2), shrunk by n / (n + EVIDENCE_PRIOR_WEIGHT):
    one run moves a candidate half way, three three quarters. Candidates in `skip` (plain
    decoding, curves this host has runs of) are not moved; runs that break the bound of
    speculation never move anything.
    """
    shift = np.ones(len(configs))
    near: list[Near | None] = [None] * len(configs)
    rows = [o for o in pool if o.config.baseline_tps > 0 and usable(o)]
    if not rows:
        return shift, near
    resid, _ = _speedup_residuals(rows, model)
    space = _evidence_space([o.config for o in rows])
    here = _evidence_space(configs)
    methods = np.array([o.config.method.value for o in rows])
    for i, c in enumerate(configs):
        if skip[i]:
            continue
        same = np.flatnonzero(methods == c.method.value)
        if not len(same):
            continue
        kind = np.array([_same_kind(c, rows[j].config) for j in same], dtype=bool)
        n = int(kind.sum())
        if n:
            d = np.sqrt(((space[same[kind]] - here[i]) ** 2).sum(axis=1))
            w = np.exp(-0.5 * d**2)
            mean = float(w @ resid[same[kind]]) / float(w.sum())
            shift[i] = math.exp(mean * n / (n + EVIDENCE_PRIOR_WEIGHT))
            near[i] = Near(n)
    return shift, near


def _same_kind(c: ConfigFacts, run: ConfigFacts) -> bool:
    """A run of the candidate's method with its target and draft (by size and family)."""

    if (c.method, c.target_arch_family, c.target_is_moe) != (
        run.method,
        run.target_arch_family,
        run.target_is_moe,
    ):
        return False
    if not (
        _close(c.target_params_b, run.target_params_b, SAME_SIZE)
        and _close(c.target_active_b, run.target_active_b, SAME_SIZE)
    ):
        return False
    return c.method is not Method.DRAFT or (
        _close(c.draft_params_b, run.draft_params_b, SAME_SIZE)
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


def outside(figure: float, measured: float, noise: float) -> bool:
    """Whether a figure lies outside one measurement's spread (the noise figure either side)."""
    return not measured / (1.0 + noise) <= figure <= measured * (1.0 + noise)


def evidence_lines(
    cited: Sequence[Cited],
    figure: float,
    noise: float,
    *,
    plain: bool,
    twin_figures: Sequence[float] = (),
) -> tuple[str, ...]:
    """The why lines that set the option's figure (its speed-up; t/s for plain decoding)
    beside the runs it cites: the spread of the runs of exactly it on this host and task
    (`twin_figures`, as compared), and every other cited run the figure lies outside of, with
    what that run differs in."""
    out = []
    unit = " t/s" if plain else "x"
    if twin_figures:
        lo, hi = min(twin_figures), max(twin_figures)
        inside = lo / (1.0 + noise) <= figure <= hi * (1.0 + noise)
        out.append(
            f"{len(twin_figures)} runs of exactly this configuration on this host and task "
            f"measured {lo:.2f}-{hi:.2f}{unit}"
            + (" (distrusted baselines read over the median plain run)" if not plain else "")
            + f": this figure is {'within' if inside else 'OUTSIDE'} their spread (the noise "
            f"figure {noise:.0%} either side)"
        )
    for ct in cited:
        e = ct.evidence
        measured = e.tps if plain else e.speedup
        if not ct.differs or not measured or not outside(figure, measured, noise):
            continue  # it agrees, or it is a run of exactly it: the line above has its spread
        what = f"{e.tps:.1f} t/s" if plain else f"{e.speedup or 0:.2f}x ({e.tps:.1f} t/s)"
        out.append(
            f"run {e.row_id} measured {what}: it differs from this option in " + "; ".join(ct.lines)
        )
    return tuple(out)
