"""`specreg tune`: measure the likeliest configurations, refit, stop when the best is confirmed.

The loop asks the recommender for a ranking, measures the top unmeasured option with the real
llama-server (recorded like any run), refits on the new local evidence and asks again. Plain
decoding is measured first (every speedup needs it, and it anchors this host), then the most
promising K of every method/draft family once (a probe re-anchors that family's whole K curve,
which the prior from another host may place wrongly), then the top predictions. It stops when
the best measured configuration beats every unmeasured one's prediction (confirmed), or when
the budget of runs is spent.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb

from specreg.recommender.advisor import open_advisor
from specreg.recommender.host import HostFacts
from specreg.recommender.recommend import Option, Recommendation
from specreg.recommender.train import default_estimator
from specreg.runner import runs
from specreg.runner.config import SPEC_NONE, Config, server_command
from specreg.runner.host import Host
from specreg.runner.llama import LlamaInstall
from specreg.runner.workload import Workload

log = logging.getLogger(__name__)

# A run of an option: measured tokens/s (None when it failed) and the recorded run id.
RunOption = Callable[[Option], tuple[float | None, int | None]]
# Predictions within this share of the best measured speed do not need measuring.
CONFIRM_MARGIN = 0.0
# A family never measured is probed if its best prediction reaches this share of the best
# measured speed: the prior may be off by that much on a new host.
PROBE_RATIO = 0.5


def option_config(option: Option) -> Config:
    """The runner's configuration for a recommended option."""
    return Config(
        spec_type=option.spec_type if option.spec_type != "none" else SPEC_NONE,
        k=option.k,
        experts=option.experts,
        expert_key=option.expert_key,
        temperature=option.temperature,
    )


def option_command(
    option: Option,
    target_path: str,
    dialect: str,
    host: Host,
    server: Path | str = "llama-server",
) -> list[str]:
    """The exact llama-server command line for `option` with the user's build and host."""
    draft = Path(option.draft_path) if option.draft_path else None
    return server_command(
        option_config(option), Path(target_path), draft, dialect, host, server=server
    )


def llama_runner(
    con: duckdb.DuckDBPyConnection,
    install: LlamaInstall,
    host: Host,
    target: Path,
    workload: Workload,
    *,
    task: str | None,
    n_predict: int = 64,
    repeats: int = 3,
    threads: int | None = None,
) -> RunOption:
    """Run options for real with llama-server; every run is recorded in the registry.

    `threads` overrides the host's default (one per physical core) for every run.
    """

    def run_option(option: Option) -> tuple[float | None, int | None]:
        draft = Path(option.draft_path) if option.draft_path else None
        p = runs.plan(
            con,
            install,
            host,
            target,
            draft,
            option_config(option).with_(threads=threads),
            workload,
            task=task,
            n_predict=n_predict,
            repeats=repeats,
        )
        out = runs.run(con, p)
        return out.measurement.tokens_per_s, out.run_id

    return run_option


@dataclass(frozen=True)
class TuneStep:
    option: Option  # the prediction when it was chosen
    measured_tps: float | None
    run_id: int | None
    reason: str = ""  # why this option was measured next

    @property
    def label(self) -> str:
        return self.option.label


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
        }
        return document(self.JSON_KIND, self.JSON_VERSION, payload)

    @property
    def best(self) -> TuneStep | None:
        """The measured option the final ranking puts first.

        The final ranking combines each option's runs with the refitted prediction, so two
        options whose single runs fall within noise of each other are told apart by what
        the rest of the evidence (their family's acceptance, its other K) says.
        """
        ok = [s for s in self.steps if s.measured_tps]
        if not ok:
            return None
        ranked = {_key(o): o.tps for o in self.final.options}
        return max(ok, key=lambda s: ranked.get(_key(s.option), s.measured_tps or 0.0))

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
    if top.tps > best_tps * (1 + CONFIRM_MARGIN):
        return top, "predicted to beat the best measured"
    ks = sorted(o.k for o in options if best and _family(o) == _family(best.option) and o.k)
    if best is not None and best.option.k in ks:
        i = ks.index(best.option.k)
        near = {ks[j] for j in (i - 1, i + 1) if 0 <= j < len(ks)}
        neighbours = [o for o in pending if _family(o) == _family(best.option) and o.k in near]
        if neighbours:
            return max(neighbours, key=lambda o: o.tps), "bracket the best K"
    long_shots = [o for o in unprobed if o.tps >= PROBE_RATIO * best_tps]
    if long_shots:
        return max(long_shots, key=lambda o: o.tps), "probe: one run for an untried family"
    return None, "best measured is bracketed and beats every prediction"


def tune(
    con: duckdb.DuckDBPyConnection,
    target_ref: str,
    run_option: RunOption,
    *,
    host: HostFacts,
    task: str = "chat",
    policy: str = "quality",
    budget: int = 6,
    refit: bool = True,
    on_step: Callable[[TuneStep], None] | None = None,
) -> TuneResult:
    """Measure, refit, re-rank until the best is confirmed or `budget` runs are spent.

    `refit=False` keeps the model fitted at the start; each ranking still sees every run.
    """
    steps: list[TuneStep] = []
    # A small ensemble: the loop refits after every run, and this host's runs move the
    # ranking mostly through the recommender's local correction, not through the refit.
    estimator = default_estimator().set_params(n_members=2)
    advisor = open_advisor(con, host, estimator=estimator)
    stop = "budget spent"
    confirmed = False
    n_candidates = 0
    while True:
        if steps:  # the registry holds a new run: re-read the evidence
            advisor = (
                open_advisor(con, host, estimator=estimator)
                if refit
                else open_advisor(con, host, model=advisor.model)
            )
        rec = advisor.recommend(con, target_ref, task=task, policy=policy)
        n_candidates = len(rec.options)
        choice, why = next_option(rec.options, steps)
        if choice is None:
            stop, confirmed = why, True
        if choice is None or len(steps) >= budget:
            break
        tps, run_id = run_option(choice)
        step = TuneStep(choice, tps, run_id, why)
        steps.append(step)
        log.info("tune: %s -> %s t/s", choice.label, tps)
        if on_step is not None:
            on_step(step)
    return TuneResult(
        target_name=rec.target_name,
        steps=tuple(steps),
        final=rec,
        confirmed=confirmed,
        stop_reason=stop,
        n_candidates=n_candidates,
    )
