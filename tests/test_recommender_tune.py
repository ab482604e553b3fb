"""`tune`: few runs reach the best configuration an exhaustive sweep finds."""

# ruff: noqa: F811  (pytest fixtures imported from the fixture modules are used as arguments)
from __future__ import annotations

import math
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pytest
from llama_fixtures import llama_bin, llama_install, small_models  # noqa: F401
from recommender_fixtures import demo_con, demo_model, prior_model  # noqa: F401

from specreg.recommender.costmodel import CostParams, predict_tps
from specreg.recommender.features import ConfigFacts, feature_matrix
from specreg.recommender.host import HostFacts
from specreg.recommender.local import draft_fields, target_fields
from specreg.recommender.recommend import Option
from specreg.registry.queries import get_model
from specreg.registry.runs import RunRecord, record_run
from specreg.runner.tune import tune
from specreg.terms import Method

HOST = HostFacts(20.0, 2, "user", fingerprint="test-host")
# The "true" host: cheaper drafts, higher acceptance than the prior believes.
TRUE = CostParams(
    target_eff=0.5,
    draft_eff=0.3,
    draft_tau=0.001,
    verify_slope=0.06,
    acc_bias=1.6,
    acc_same_arch=1.0,
)


def _true_tps(con, target, option: Option) -> float:  # type: ignore[no-untyped-def]
    tf = target_fields(target)
    c = ConfigFacts(
        bandwidth_gbs=HOST.bandwidth_gbs, physical_cores=2, **tf, method=option.method,
        k=option.k or 0, experts=option.experts or tf["default_experts"], temperature=0.0,
        task="code", ngram_n=4,
    )  # fmt: skip
    if option.method is Method.DRAFT:
        c = c.with_(**draft_fields(get_model(con, option.draft_id), target))
    return float(predict_tps(feature_matrix([c]), TRUE)[0][0])


def _simulated_runner(con, target):  # type: ignore[no-untyped-def]
    def run(option: Option) -> tuple[float | None, int | None]:
        tps = _true_tps(con, target, option)
        rec = RunRecord(
            kind="run", status="ok", started_at=datetime.now(timezone.utc), config={},
            config_label=option.label, spec_type=option.spec_type,
            target_model_id=target.model_id, draft_model_id=option.draft_id, k=option.k,
            experts=option.experts, temperature=0.0, task="code", tokens_per_s=tps,
            host_fingerprint=HOST.fingerprint,
        )  # fmt: skip
        return tps, record_run(con, rec)

    return run


def test_tune_finds_the_best_with_a_quarter_of_the_sweep(demo_con) -> None:  # type: ignore[no-untyped-def]
    target = demo_model(demo_con, "Qwen2.5-Coder", "32B")
    result = tune(
        demo_con, target.model_id, _simulated_runner(demo_con, target), host=HOST,
        task="code", budget=50,
    )  # fmt: skip
    sweep = [_true_tps(demo_con, target, o) for o in result.final.options]
    assert result.n_candidates == len(sweep) >= 20
    assert result.best is not None and result.best.measured_tps is not None
    assert result.best.measured_tps >= 0.95 * max(sweep)
    assert result.n_runs <= len(sweep) / 4
    assert result.confirmed and result.steps[0].option.method is Method.NONE


def test_tune_stops_at_the_budget(demo_con) -> None:  # type: ignore[no-untyped-def]
    target = demo_model(demo_con, "Qwen2.5-Coder", "32B")
    result = tune(
        demo_con, target.model_id, _simulated_runner(demo_con, target), host=HOST,
        task="code", budget=2,
    )  # fmt: skip
    assert result.n_runs == 2 and result.stop_reason == "budget spent"


@pytest.mark.llama
@pytest.mark.xfail(
    strict=False,
    reason="issue 5 open: with 3 runs (a quarter of 13) tune measures plain, ngram-mod K=8 and "
    "K=16; the sweep's best is K=32 or K=16 (measured 118 vs 116 t/s, runs swing 10 %), so the "
    "pick lands at 93-100 % of it; it runs every time and reports XPASS when it holds",
)
def test_tune_on_real_small_models_beats_a_quarter_of_the_sweep(
    specreg_home: Path, llama_install, small_models
) -> None:  # type: ignore[no-untyped-def]
    """Exhaustive sweep of every candidate the recommender considers vs the tune loop."""
    from specreg.registry.db import opened
    from specreg.registry.scan import scan_paths
    from specreg.runner.host import detect_host
    from specreg.runner.tune import llama_runner
    from specreg.runner.workload import load_workload

    host = detect_host()
    facts = HostFacts(20.0, host.physical_cores, "user", fingerprint=host.fingerprint)
    target = small_models.smollm2.path
    with opened(specreg_home / "registry.duckdb") as con:
        scan_paths(con, [m.path for m in small_models.all])
        run = llama_runner(
            con, llama_install, host, target, load_workload(("code",)).head(1),
            task="code", n_predict=64, repeats=3, threads=1,
        )  # fmt: skip
        from specreg.recommender.recommend import recommend
        from specreg.recommender.train import fit

        model = fit().predictor()
        n_sweep = len(recommend(con, str(target), model=model, host=facts, task="code").options)
        budget = n_sweep // 4  # the budget is the claim: a quarter of the sweep's runs
        result = tune(con, str(target), run, host=facts, task="code", budget=budget)
        options = {o.label: o for o in result.final.options}
        measured = {label: run(o)[0] for label, o in options.items()}
        assert result.best is not None and result.best.measured_tps
        sweep_label = max((k for k, v in measured.items() if v), key=lambda k: measured[k] or 0)
        tuned, best = [result.best.measured_tps], [measured[sweep_label] or 0.0]
        if sweep_label != result.best.label:
            # One run per point swings by 10 % on two shared cores, and the sweep's best is
            # the maximum of 13 such runs (the winner's curse): settle the comparison with
            # fresh interleaved runs of just the two contenders, medians against medians.
            tuned, best = [], []
            for _ in range(5):
                tuned.append(run(options[result.best.label])[0] or 0.0)
                best.append(run(options[sweep_label])[0] or 0.0)
    assert len(measured) == n_sweep and result.n_runs <= math.floor(n_sweep / 4)
    assert float(np.median(tuned)) >= 0.95 * float(np.median(best))
    assert np.isfinite(best[0])


def test_next_option_brackets_a_peak_the_prediction_misplaced(demo_con, prior_model) -> None:  # type: ignore[no-untyped-def]
    """The prior puts the draft curve's peak at one K; this host's truth peaks two steps up."""
    from specreg.recommender.prior import load_prior
    from specreg.recommender.recommend import recommend
    from specreg.runner.tune import TuneStep, next_option

    target = demo_model(demo_con, "Qwen2.5-Coder", "32B")
    rec = recommend(
        demo_con, target.model_id, model=prior_model, host=HOST, task="code",
        observations=load_prior().observations,
    )  # fmt: skip
    options = rec.options
    best_draft = max((o for o in options if o.method is Method.DRAFT), key=lambda o: o.tps)
    curve = [o for o in options if o.method is Method.DRAFT and o.draft_id == best_draft.draft_id]
    ks = sorted(o.k for o in curve if o.k)
    i = ks.index(best_draft.k)
    true_peak = ks[min(i + 2, len(ks) - 1)] if i + 2 < len(ks) else ks[max(i - 2, 0)]
    assert true_peak != best_draft.k

    def truth(o: Option) -> float:
        if o in curve:  # 30 % faster at the true peak, falling 10 % per grid step from it
            return 1.3 * best_draft.tps * 0.9 ** abs(ks.index(o.k) - ks.index(true_peak))
        return 0.5 * o.tps

    steps: list[TuneStep] = []
    while (pick := next_option(options, steps))[0] is not None:
        steps.append(TuneStep(pick[0], truth(pick[0]), None, pick[1]))
        assert len(steps) <= len(options)
    winner = max(steps, key=lambda s: s.measured_tps or 0.0)
    assert winner.option.k == true_peak and winner.option.draft_id == best_draft.draft_id
    assert len(steps) <= len(options) / 4
    assert steps[0].option.method is Method.NONE and "bracket" in steps[-1].reason
