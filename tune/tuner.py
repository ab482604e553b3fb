"""`specreg tune`: measure the likeliest configurations, refit, stop when the best is confirmed.

Before the first run the target and its drafts are calibrated on this host when they are not
yet (`specreg calibrate`: the verify cost of each K), so the first ranking already knows
whether a verify pass is cheap here. The loop then asks the recommender for a ranking,
measures the top unmeasured option with the real llama-server (recorded like any run), refits
on the new local evidence and asks again. Plain decoding is measured first (every speedup needs
it, and it anchors this host), then the most promising K of every method/draft family once (a
probe re-anchors that family's whole K curve), then the top predictions. The search stops when
the best measured configuration beats every unmeasured one's prediction (confirmed), or when
the budget of runs is spent.

Then it settles. Each run's repeats give an interval (slowest to fastest repeat); a candidate
whose interval overlaps the best one's is a tie within the measured noise. Budget left over
goes to interleaved repeats of the best and its closest rival (A, B, A, B: drifts of a shared
host hit both), pooled into one interval each; what still overlaps is a tie, said so, and the
cheaper configuration is picked (plain before n-gram before a draft model, then the smaller K).

`tune_target` is the command's entry: on this machine (`llama_runner`), or for one host of a
Ray cluster (`tune_on_ray`: every run measured there, recorded here).
"""

from __future__ import annotations

import logging
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import duckdb

from specreg.errors import UsageError, param
from specreg.host.facts import HostFacts
from specreg.host.machine import Host
from specreg.llama.install import LlamaInstall
from specreg.llama.options import option_config
from specreg.recommender.advisor import open_advisor
from specreg.recommender.recommend import Option, Recommendation
from specreg.recommender.train import default_estimator
from specreg.registry.run_store import STATUS_OK
from specreg.runner import runs
from specreg.runner.calibrate import Bench, Calibrating
from specreg.runner.settings import DEFAULTS, Settings
from specreg.runner.workload import Workload
from specreg.terms import POLICY_QUALITY, Method, canonical_task
from specreg.tune.distributed import LOCAL, Cluster, RayHost, RayHosts
from specreg.tune.jobs import Job

if TYPE_CHECKING:
    from specreg.host.facts import HostQuery

log = logging.getLogger(__name__)

# A run of an option: measured tokens/s (None when it failed) and the recorded run id; a run
# that is not recorded (a replay) may add the draft tokens it proposed as a third element (a
# recorded run's are read from the registry).
Ran = tuple[float | None, int | None] | tuple[float | None, int | None, int | None]
RunOption = Callable[[Option], Ran]
# Predictions within this share of the best measured speed do not need measuring (nor within
# the best run's own spread, when that is wider): a run cannot tell them apart.
CONFIRM_MARGIN = 0.03
# Interleaved settling rounds of the two closest candidates, budget permitting.
SETTLE_ROUNDS = 2
# A family never measured is probed if its best prediction reaches this share of the best
# measured speed: the prior's acceptance may be off by that much (the cost side is calibrated).
PROBE_RATIO = 0.6


def llama_runner(
    con: duckdb.DuckDBPyConnection,
    install: LlamaInstall,
    host: Host,
    target: Path,
    workload: Workload,
    *,
    task: str | None,
    settings: Settings = DEFAULTS,
) -> RunOption:
    """Run options for real with llama-server, each measured with `settings` (its threads
    override the host's default, one per physical core); every run is recorded in the
    registry."""

    def run_option(option: Option) -> Ran:
        draft = Path(option.draft_path) if option.draft_path else None
        spec = runs.RunSpec(
            target, draft, option_config(option), workload, task=task,
            lookup_cache=option.lookup_cache,
        )  # fmt: skip
        out = runs.run(con, runs.plan(con, install, host, spec, settings))
        # a run disturbed by other processes is recorded, never evidence: no speed to rank by
        disturbed = runs.load_verdict_of(out.measurement).disturbed
        return (None if disturbed else out.measurement.tokens_per_s), out.run_id

    return run_option


@dataclass(frozen=True)
class TuneStep:
    option: Option  # the prediction when it was chosen
    measured_tps: float | None
    run_id: int | None
    reason: str = ""  # why this option was measured next
    measured_lo: float | None = None  # the run's slowest and fastest repeat
    measured_hi: float | None = None
    drafted: int | None = None  # draft tokens it proposed (None: unknown, or plain)

    @property
    def drafted_nothing(self) -> bool:
        """A speculative run that proposed no draft token decoded as plain decoding does."""
        return self.drafted == 0 and self.option.method is not Method.NONE

    @property
    def label(self) -> str:
        return self.option.label


@dataclass(frozen=True)
class Measured:
    """One option's runs pooled: the median of their medians, and the interval between the
    median slowest and median fastest repeat (a single point when runs have one repeat)."""

    option: Option
    tps: float
    lo: float
    hi: float
    n_runs: int

    def overlaps(self, other: Measured) -> bool:
        return self.hi >= other.lo and other.hi >= self.lo


def cost_rank(o: Option) -> tuple[int, int, int]:
    """Cheaper first: no extra model or memory, then n-gram, MTP heads, a draft model; all
    experts before fewer; then the smaller K (less work thrown away on a rejection)."""
    order = {Method.NONE: 0, Method.NGRAM: 1, Method.MTP: 2, Method.DRAFT: 3}
    return (order.get(o.method, 4), 0 if o.experts is None else 1, o.k or 0)


def pooled(steps: Sequence[TuneStep]) -> list[Measured]:
    """The measured options, each with its runs pooled; best first."""
    by_key: dict[tuple[object, ...], list[TuneStep]] = {}
    for s in steps:
        if s.measured_tps:
            by_key.setdefault(_key(s.option), []).append(s)
    out = []
    for runs_of in by_key.values():
        mids = [s.measured_tps or 0.0 for s in runs_of]
        los = [s.measured_lo if s.measured_lo is not None else s.measured_tps for s in runs_of]
        his = [s.measured_hi if s.measured_hi is not None else s.measured_tps for s in runs_of]
        out.append(
            Measured(
                runs_of[-1].option,
                statistics.median(mids),
                statistics.median(x or 0.0 for x in los),
                statistics.median(x or 0.0 for x in his),
                len(runs_of),
            )
        )
    return sorted(out, key=lambda m: -m.tps)


def settle(steps: Sequence[TuneStep]) -> tuple[Measured | None, tuple[Measured, ...], str]:
    """The pick among measured options: the fastest, unless others tie with it within the
    measured noise (overlapping intervals), then the cheapest of the tie."""
    ranked = pooled(steps)
    if not ranked:
        return None, (), "nothing measured"
    top = ranked[0]
    tied = tuple(m for m in ranked[1:] if m.overlaps(top))
    if not tied:
        return top, (), f"{top.option.label} is fastest beyond the measured noise"
    pick = min((top, *tied), key=lambda m: cost_rank(m.option))
    others = ", ".join(f"{m.option.label} {m.tps:.1f} [{m.lo:.1f}-{m.hi:.1f}]" for m in tied)
    why = (
        f"tie within the measured noise: {top.option.label} {top.tps:.1f} "
        f"[{top.lo:.1f}-{top.hi:.1f}] t/s against {others}; picked the cheaper "
        f"{pick.option.label}"
    )
    if pick is top:
        why = (
            f"tie within the measured noise: {top.option.label} {top.tps:.1f} "
            f"[{top.lo:.1f}-{top.hi:.1f}] t/s against {others}; {top.option.label} is also the "
            "cheapest"
        )
    return pick, tied, why


@dataclass(frozen=True)
class TuneResult:
    JSON_KIND = "tune"
    JSON_VERSION = "1"

    target_name: str
    steps: tuple[TuneStep, ...]
    final: Recommendation
    confirmed: bool
    stop_reason: str
    n_candidates: int
    pick_reason: str = ""
    ties: tuple[str, ...] = ()  # labels of the options tied with the fastest

    @property
    def n_runs(self) -> int:
        return len(self.steps)

    def to_json(self) -> dict[str, Any]:
        from specreg.jsonout import document

        best = self.best
        runs = [
            {
                "label": s.label,
                "predicted_tps": s.option.tps,
                "measured_tps": s.measured_tps,
                "run_id": s.run_id,
                "reason": s.reason,
            }
            for s in self.steps
        ]
        payload = {
            "target": self.target_name,
            "runs": runs,
            "best": None if best is None else {"label": best.label, "tps": best.measured_tps},
            "baseline_tps": self.baseline_tps,
            "confirmed": self.confirmed,
            "stop_reason": self.stop_reason,
            "n_candidates": self.n_candidates,
            "pick_reason": self.pick_reason,
            "ties": list(self.ties),
        }
        return document(self.JSON_KIND, self.JSON_VERSION, payload)

    @property
    def best(self) -> TuneStep | None:
        """The pick: the fastest measured option, or the cheapest of those tied with it
        within the measured noise (see `settle`); its latest run."""
        pick, _, _ = settle(self.steps)
        if pick is None:
            return None
        return [s for s in self.steps if _key(s.option) == _key(pick.option)][-1]

    @property
    def baseline_tps(self) -> float | None:
        for s in self.steps:
            if s.option.method.value == "none" and s.option.experts is None:
                return s.measured_tps
        return None


def _family(o: Option) -> tuple[object, ...]:
    """Options that share a K curve: one method, draft, expert count and temperature."""
    return (o.method, o.draft_id, o.experts, o.temperature)


def _key(o: Option) -> tuple[object, ...]:
    return (o.method, o.k, o.experts, o.draft_id, o.temperature)


def next_option(options: Sequence[Option], steps: Sequence[TuneStep]) -> tuple[Option | None, str]:
    """What to measure next, or None with the reason the search is over.

    In order: plain decoding (every speedup needs it); an unprobed family predicted to beat
    the best measured speed; the option predicted to beat the best measured one (predictions
    follow this host's runs: their level and their measured acceptance, which shapes the K
    curve); the best measured option's K neighbours in its own family, to confirm its peak;
    an unprobed family within PROBE_RATIO of the best (a long shot worth one run).
    """
    tried = {_key(s.option) for s in steps}
    pending = [o for o in options if _key(o) not in tried]
    plain = next((o for o in options if o.method.value == "none" and o.experts is None), None)
    if plain is not None and _key(plain) not in tried:
        return plain, "plain decoding anchors every speedup"
    if not pending:
        return None, "every candidate measured"
    measured = [s for s in steps if s.measured_tps]
    best = max(measured, key=lambda s: s.measured_tps or 0.0) if measured else None
    best_tps = (best.measured_tps or 0.0) if best else 0.0
    probed = {_family(s.option) for s in steps}
    unprobed = [o for o in pending if _family(o) not in probed]
    top = max(pending, key=lambda o: o.tps)
    contenders = [o for o in unprobed if o.tps >= best_tps]
    if contenders:
        return max(contenders, key=lambda o: o.tps), "probe: predicted to beat the best measured"
    margin = CONFIRM_MARGIN
    if best is not None and best.measured_hi and best_tps > 0:
        margin = max(margin, best.measured_hi / best_tps - 1.0)
    if top.tps > best_tps * (1 + margin):
        return top, "predicted to beat the best measured"
    ks = sorted(o.k for o in options if best and _family(o) == _family(best.option) and o.k)
    # A best that drafted nothing ran as plain decoding: its K cannot matter, so no run is spent
    # bracketing it.
    if best is not None and best.option.k in ks and not best.drafted_nothing:
        i = ks.index(best.option.k)
        near = {ks[j] for j in (i - 1, i + 1) if 0 <= j < len(ks)}
        neighbours = [o for o in pending if _family(o) == _family(best.option) and o.k in near]
        if neighbours:
            # Predictions within a few % of each other do not say which side is higher; a
            # best that measured above its prediction accepts more than predicted, and more
            # acceptance moves the peak to longer K (below, to shorter).
            up = best_tps >= best.option.tps
            top_pred = max(o.tps for o in neighbours)
            close = [o for o in neighbours if o.tps >= top_pred / (1 + CONFIRM_MARGIN)]
            pick = max(close, key=lambda o: (o.k or 0) if up else -(o.k or 0))
            return pick, "bracket the best K"
    long_shots = [o for o in unprobed if o.tps >= PROBE_RATIO * best_tps]
    if long_shots:
        return max(long_shots, key=lambda o: o.tps), "probe: one run for an untried family"
    return None, "best measured is bracketed and beats every prediction"


def _step(
    con: duckdb.DuckDBPyConnection, option: Option, run_option: RunOption, reason: str
) -> TuneStep:
    tps, run_id, *given = run_option(option)
    lo = hi = None
    drafted = given[0] if given else None
    if run_id is not None:
        from specreg.registry.run_store import get_run

        rec = get_run(con, run_id)
        lo, hi = rec.tokens_per_s_lo, rec.tokens_per_s_hi
        if rec.speculative_active is not False and rec.spec_type != "none":
            drafted = rec.draft_n if rec.draft_n is not None else drafted
    return TuneStep(option, tps, run_id, reason, lo, hi, drafted)


@dataclass(frozen=True)
class TuneRequest:
    """What `specreg tune` is asked: the target (a path, an id prefix or a name), the task and
    policy it ranks for, one speculative type or stack only (`spec_type`, against plain
    decoding), the most runs it may spend (`budget`); `refit=False` keeps the model fitted at
    the start (each ranking still sees every run)."""

    target: str
    task: str = "chat"
    policy: str = POLICY_QUALITY
    spec_type: str | None = None
    budget: int = 6
    refit: bool = True


class _Tuning:
    """One tune: the rankings it asked for and the runs it measured."""

    def __init__(
        self,
        con: duckdb.DuckDBPyConnection,
        request: TuneRequest,
        run_option: RunOption,
        host: HostFacts,
        on_step: Callable[[TuneStep], None] | None,
    ):
        self.con = con
        self.request = request
        self.run_option = run_option
        self.host = host
        self.on_step = on_step
        self.steps: list[TuneStep] = []
        # A small ensemble: the loop refits after every run, and this host's runs move the
        # ranking mostly through the recommender's local correction, not through the refit.
        self.estimator = default_estimator().set_params(n_members=2)
        self.advisor = open_advisor(con, host, estimator=self.estimator)

    def rank(self, *, refit: bool, spec_type: str | None) -> Recommendation:
        """The recommender's ranking on the evidence so far (the registry holds every run)."""
        if self.steps:
            self.advisor = (
                open_advisor(self.con, self.host, estimator=self.estimator)
                if refit
                else open_advisor(self.con, self.host, model=self.advisor.model)
            )
        r = self.request
        return self.advisor.recommend(
            self.con, r.target, task=r.task, policy=r.policy, spec_type=spec_type
        )

    def measure(self, option: Option, reason: str) -> TuneStep:
        step = _step(self.con, option, self.run_option, reason)
        self.steps.append(step)
        if self.on_step is not None:
            self.on_step(step)
        return step

    def search(self) -> tuple[Recommendation, str, bool]:
        """Measure, refit, re-rank until the best is confirmed or the budget is spent: the last
        ranking, why the search stopped, and whether the best was confirmed."""
        while True:
            rec = self.rank(refit=self.request.refit, spec_type=self.request.spec_type)
            choice, why = next_option(rec.options, self.steps)
            if choice is None:
                return rec, why, True
            if len(self.steps) >= self.request.budget:
                return rec, "budget spent", False
            step = self.measure(choice, why)
            log.info("tune: %s -> %s t/s", choice.label, step.measured_tps)

    def settle(self) -> bool:
        """Interleaved repeats of the fastest and its closest rival while they overlap and the
        budget lasts; whether any were measured."""
        settled = False
        for _ in range(SETTLE_ROUNDS):
            ranked = pooled(self.steps)
            if (len(ranked) < 2 or not ranked[1].overlaps(ranked[0])
                    or len(self.steps) + 2 > self.request.budget):  # fmt: skip
                break
            self.measure(ranked[1].option, "settle: interleaved repeat of the closest rival")
            self.measure(ranked[0].option, "settle: interleaved repeat of the fastest")
            settled = True
        return settled


def tune(
    con: duckdb.DuckDBPyConnection,
    request: TuneRequest,
    run_option: RunOption,
    *,
    host: HostFacts,
    on_step: Callable[[TuneStep], None] | None = None,
    before: Sequence[Callable[[], object]] = (),
) -> TuneResult:
    """Measure, refit, re-rank until the best is confirmed or the budget is spent, then settle
    ties with the budget left (interleaved repeats of the two closest).

    `before` runs first, in order: the runner's calibration of the target and its drafts when
    this host has none (`calibrate_if_missing`), then the drafts' measured agreement on this
    task where the registry has none (`agree_if_missing`), so the first ranking already knows
    the verify cost and each draft's acceptance, and no run is spent on a draft that agreement
    says cannot win.
    """
    for hook in before:
        hook()
    tuning = _Tuning(con, request, run_option, host, on_step)
    rec, stop, confirmed = tuning.search()
    n_candidates = len(rec.options)
    if tuning.settle():  # the final ranking sees the settling runs too
        rec = tuning.rank(refit=False, spec_type=None)
    _, tied, pick_reason = settle(tuning.steps)
    return TuneResult(
        target_name=rec.target_name,
        steps=tuple(tuning.steps),
        final=rec,
        confirmed=confirmed,
        stop_reason=stop,
        n_candidates=n_candidates,
        pick_reason=pick_reason,
        ties=tuple(m.option.label for m in tied),
    )


TUNE_BENCH = Bench(repetitions=3, gen_tokens=64)  # tune's calibration: quick curves


def calibrate_if_missing(
    con: duckdb.DuckDBPyConnection, target: Path, cal: Calibrating
) -> Callable[[], object]:
    """A hook for `tune` to run `before`: llama-bench curves of the target and its drafts on
    this host (the settings' threads and retries), measured only when the registry has none for
    the target yet."""
    from specreg.recommender.calibrated import load_calibration
    from specreg.registry.scan import model_record
    from specreg.runner.calibrate import calibrate_in

    def run() -> object:
        record = model_record(con, target)
        if load_calibration(con, cal.host.fingerprint, record.model_id).target is not None:
            return None
        return calibrate_in(con, record, cal)

    return run


def agree_if_missing(
    con: duckdb.DuckDBPyConnection,
    target: Path,
    install: LlamaInstall,
    host: Host,
    task: str,
    *,
    threads: int | None = None,
) -> Callable[[], object]:
    """A hook for `tune` to run `before`: teacher-forced agreement (`specreg agree`) of every
    compatible draft that has none recorded for `task` yet, seconds per draft instead of a
    speculative run each. Returns the AgreementResult, or None when nothing was missing."""
    from specreg.quality.agreement import AgreementPlan, agreement_drafts, measure_agreement
    from specreg.quality.kld import Measuring
    from specreg.registry.quality_store import agreement_by_draft
    from specreg.registry.scan import model_record

    def run() -> object:
        record = model_record(con, target)
        measured = agreement_by_draft(con, record.model_id)
        missing = tuple(
            d
            for d in agreement_drafts(con, record, ())
            if not any(r.task == task for r in measured.get(d.model_id, ()))
        )
        if not missing:
            return None
        plan = AgreementPlan(record, Path(target).resolve(), missing, (task,), 0.0)
        return measure_agreement(con, Measuring(install, host, threads=threads), plan)

    return run


# -- tune on a Ray host -----------------------------------------------------------------------


def tune_host(hosts: RayHosts, name: str | None) -> tuple[RayHost, HostFacts]:
    """The one host `tune` answers for, and its facts as the recommender sees them."""
    if name is None:
        if len(hosts.hosts) != 1:
            raise UsageError(
                f"tune answers for one host: add {param('host', 'NAME')} (one of "
                f"{', '.join(hosts.names())})"
            )
        chosen = hosts.hosts[0]
    else:
        chosen = hosts.host(name)
    bandwidth = chosen.facts.get("bandwidth_gbs")
    facts = HostFacts(
        float(bandwidth) if bandwidth else 0.0,
        int(chosen.facts.get("physical_cores") or 1),
        str(chosen.facts.get("bandwidth_source") or "recorded"),
        chosen.fingerprint,
        note=f"Ray host {chosen.name}",
    )
    return chosen, facts


def ray_runner(
    con: duckdb.DuckDBPyConnection,
    hosts: RayHosts,
    host: RayHost,
    target: Path,
    workload: Workload,
    *,
    task: str | None,
    settings: Settings = DEFAULTS,
) -> Callable[[Option], Ran]:
    """tune's `run_option` on the Ray host `host`: each option measured there, recorded here.
    A lookup cache is a file of this registry: such options are not sent (no run)."""
    from specreg.registry.run_store import new_run_uuid
    from specreg.registry.scan import model_record

    target_id = model_record(con, target).model_id

    def run_option(option: Option) -> Ran:
        if option.lookup_cache:
            log.warning("%s reads a lookup cache of this registry: not run on %s", option.label,
                        host.name)  # fmt: skip
            return None, None
        job = Job(
            run_uuid=new_run_uuid(), label=option.label,
            config=settings.configured(option_config(option)), target_id=target_id,
            target_path=str(target), draft_id=option.draft_id, draft_path=option.draft_path,
            workload=workload, task=task, settings=settings, kind="run", host=host.name,
        )  # fmt: skip
        (outcome,), _, _ = hosts.run(runs.RunLog(con), [job])
        record = outcome.record
        return (record.tokens_per_s if record.status == STATUS_OK else None), outcome.run_id

    return run_option


def tune_on_ray(
    con: duckdb.DuckDBPyConnection,
    request: TuneRequest,
    settings: Settings,
    cluster: Cluster,
    on_step: Callable[[TuneStep], None] | None = None,
) -> TuneResult:
    """`specreg tune --ray`: tune `request` (its target a file) for one host of the `cluster`,
    every run measured there and recorded here; the recommender predicts for that host (its
    fingerprint, bandwidth and cores), so its runs are its local evidence. Calibration and
    agreement, which run llama.cpp on this machine, are left out."""
    from specreg.runner.workload import load_workload

    assert cluster.address is not None
    name = cluster.hosts[0] if cluster.hosts else None
    with RayHosts(cluster) as hosts:
        host, facts = tune_host(hosts, name)
        target = Path(request.target)
        workload = load_workload((request.task,))
        run_option = ray_runner(
            con, hosts, host, target, workload, task=request.task, settings=settings
        )
        return tune(con, request, run_option, host=facts, on_step=on_step)


# -- `specreg tune` ----------------------------------------------------------------------------


def _check_where(cluster: Cluster, host_query: HostQuery | None) -> None:
    """What tune measures on: this machine, or one host of a Ray cluster; never the host that
    --host-facts or --cores describe (those are for `tune --dry-run`)."""
    from specreg.tune.distributed import import_ray

    if host_query is not None and host_query.elsewhere:
        raise UsageError(
            f"tune measures on this machine: {param('host_facts')}, {param('cores')} and "
            f"{param('memory')} describe another host, for {param('dry_run')}"
        )
    if cluster.address is None and not cluster.hosts:
        return
    if host_query is not None and host_query.bandwidth_gbs is not None:
        raise UsageError(f"with {param('ray')}, tune predicts with the Ray host's own bandwidth")
    if cluster.address is None:
        raise UsageError(f"{param('host')} names a Ray host: add {param('ray', 'ADDRESS')}")
    import_ray()


def tune_target(
    db_path: Path,
    request: TuneRequest,
    settings: Settings = DEFAULTS,
    *,
    cluster: Cluster = LOCAL,
    host_query: HostQuery | None = None,
    llama_bin: Path | None = None,
    on_step: Callable[[TuneStep], None] | None = None,
) -> TuneResult:
    """`specreg tune`: `request` tuned with the registry at `db_path` on this machine (the
    llama.cpp in `llama_bin`; calibration and agreement first where the registry has none), or
    for one host of the Ray `cluster` (every run measured there, recorded here). `host_query`
    may give this host's bandwidth; it may not describe another host (that is `--dry-run`)."""
    from specreg.host import load
    from specreg.host.facts import resolve_host
    from specreg.llama.install import find_llama
    from specreg.registry.db import opened
    from specreg.runner.workload import load_workload

    _check_where(cluster, host_query)
    if cluster.address is not None:
        with opened(db_path) as con:
            target = str(runs.model_file(con, request.target))
            return tune_on_ray(con, replace(request, target=target), settings, cluster, on_step)
    install = find_llama(llama_bin)
    with opened(db_path) as con:
        host, facts = resolve_host(host_query, con)
        path = runs.model_file(con, request.target)
        workload = load_workload((request.task,))
        run_option = llama_runner(
            con, install, host, path, workload, task=request.task, settings=settings
        )
        before = (
            calibrate_if_missing(con, path, Calibrating(install, host, TUNE_BENCH, settings)),
            agree_if_missing(con, path, install, host, canonical_task(request.task),
                             threads=settings.threads),
        )  # fmt: skip
        with load.using(settings.load_policy(con, host.fingerprint)):
            asked = replace(request, target=str(path))
            return tune(con, asked, run_option, host=facts, on_step=on_step, before=before)
