"""The recommender on the reference host's headline cases, computed from the fitted prior."""

from __future__ import annotations

import dataclasses
import math

import pytest

from specreg.errors import UsageError
from specreg.host.facts import REFERENCE_HOST
from specreg.recommender.prior import load_prior
from specreg.recommender.recommend import Recommendation, recommend
from specreg.registry.queries import list_models
from specreg.terms import Method

from support.recommender import demo_model


def _rec(con, model, basename, size, task, policy="quality") -> Recommendation:  # type: ignore[no-untyped-def]
    target = demo_model(con, basename, size)
    return recommend(
        con, target.model_id, model=model, host=REFERENCE_HOST, task=task, policy=policy,
        observations=load_prior().observations,
    )  # fmt: skip


def _best_k(rec: Recommendation, draft_basename_size: str) -> int:
    drafts = [
        o for o in rec.options if o.method is Method.DRAFT and o.draft_name == draft_basename_size
    ]
    assert drafts, [o.label for o in rec.options[:5]]
    best = max(drafts, key=lambda o: o.tps)
    assert best.k is not None
    return best.k


DRAFT_05B = "Qwen2.5 Coder 0.5B Instruct"


def test_coder32b_with_05b_draft_prefers_large_k_on_code_small_on_prose(demo_con, prior_model):  # type: ignore[no-untyped-def]
    code = _rec(demo_con, prior_model, "Qwen2.5-Coder", "32B", "code")
    prose = _rec(demo_con, prior_model, "Qwen2.5-Coder", "32B", "prose")
    k_code, k_prose = _best_k(code, DRAFT_05B), _best_k(prose, DRAFT_05B)
    assert 16 <= k_code <= 24
    assert k_prose <= 8 and k_prose < k_code
    # and speculation is the answer for both, by a clear margin on code
    assert code.speculate and code.best.method is Method.DRAFT
    assert code.best.speedup > prose.best.speedup > 1


def test_7b_target_prefers_k_near_8_and_below_the_32b(demo_con, prior_model):  # type: ignore[no-untyped-def]
    rec7 = _rec(demo_con, prior_model, "Qwen2.5", "7B", "code")
    rec32 = _rec(demo_con, prior_model, "Qwen2.5-Coder", "32B", "code")
    k7 = _best_k(rec7, DRAFT_05B)
    # "near 8": within one step of the K grid's doubling either side
    assert 4 <= k7 <= 12
    assert k7 < _best_k(rec32, DRAFT_05B)


def test_moe_speed_policy_considers_fewer_experts_quality_never(demo_con, prior_model):  # type: ignore[no-untyped-def]
    speed = _rec(demo_con, prior_model, "Qwen3-Coder", "30B-A3B", "code", policy="speed")
    quality = _rec(demo_con, prior_model, "Qwen3-Coder", "30B-A3B", "code", policy="quality")
    assert speed.considered_experts and max(speed.considered_experts) < 8
    fewer = [o for o in speed.options if o.experts is not None]
    assert fewer and all(o.experts < 8 and not o.lossless for o in fewer)
    assert any(k.name == "experts" and not k.lossless for k in fewer[0].knobs)
    # fewer experts read fewer bytes: predicted faster than the same option at full experts
    plain_fewer = [o for o in fewer if o.method is Method.NONE]
    assert plain_fewer and plain_fewer[0].tps > 1.0 * next(
        o.tps for o in speed.options if o.method is Method.NONE and o.experts is None
    )
    assert quality.considered_experts == ()
    assert all(o.lossless for o in quality.options)


def test_lower_temperature_is_offered_only_under_speed(demo_con, prior_model):  # type: ignore[no-untyped-def]
    target = demo_model(demo_con, "Qwen2.5-Coder", "32B").model_id
    kw = {"model": prior_model, "host": REFERENCE_HOST, "task": "prose", "temperature": 0.7}
    speed = recommend(demo_con, target, policy="speed", **kw)
    quality = recommend(demo_con, target, policy="quality", **kw)
    greedy = [o for o in speed.options if o.temperature == 0.0]
    assert greedy and all(not o.lossless and "temp=0" in o.label for o in greedy)
    assert all(o.temperature == 0.7 and o.lossless for o in quality.options)


def test_every_option_has_band_evidence_and_why(demo_con, prior_model):  # type: ignore[no-untyped-def]
    rec = _rec(demo_con, prior_model, "Qwen2.5-Coder", "32B", "code")
    for o in rec.options[:5]:
        assert o.tps_lo < o.tps < o.tps_hi
        assert o.speedup_lo < o.speedup < o.speedup_hi
        assert o.why and o.evidence
    # the closest measured runs of the headline pair are the headline pair's own runs
    best = rec.best.evidence
    assert best and all(e.same_target and "Qwen2.5-Coder-32B" in e.summary for e in best)
    assert all(e.draft is not None and "0.5B" in e.draft for e in best)


def test_roofline_compares_baseline_with_the_bandwidth_bound(demo_con, prior_model):  # type: ignore[no-untyped-def]
    rec = _rec(demo_con, prior_model, "Qwen2.5-Coder", "32B", "code")
    r = rec.roofline
    target = demo_model(demo_con, "Qwen2.5-Coder", "32B")
    assert r.read_gb == pytest.approx(target.n_bytes / 1e9)
    assert r.bound_tps == pytest.approx(460 / r.read_gb)
    assert 0 < r.fraction < 1 and not r.baseline_measured
    assert f"{r.bound_tps:.1f} t/s bound" in r.line and "(predicted)" in r.line


def test_no_compatible_draft_says_what_would_fit(tmp_path, prior_model):  # type: ignore[no-untyped-def]
    from specreg.registry.db import opened
    from specreg.registry.scan import scan_paths
    from specreg.samples.demo import demo_models, write_demo_model

    # A registry holding only the GLM 4.5 Air target (MTP layers, no draft at all).
    glm = next(m for _, m in demo_models() if m.size_label == "106B-A12B")
    write_demo_model(tmp_path, glm)
    with opened(tmp_path / "alone.duckdb") as con:
        scan_paths(con, [tmp_path])
        target = list_models(con)[0]
        rec = recommend(
            con, target.model_id, model=prior_model, host=REFERENCE_HOST, task="summarize"
        )
    assert rec.n_compatible_drafts == 0
    note = next(a for a in rec.advice if a.startswith("no compatible draft"))
    assert "use ngram-mod for summarize" in note
    assert "use the target's MTP heads (--spec-type draft-mtp)" in note
    assert "this draft would fit" in note and "sharing the target's tokenizer" in note
    assert all(o.method is not Method.DRAFT for o in rec.options)
    assert {Method.NGRAM, Method.MTP} <= {o.method for o in rec.options}


def test_do_not_speculate_when_nothing_beats_plain(demo_con, prior_model):  # type: ignore[no-untyped-def]
    # Make drafting as expensive as a target step: no candidate can win by 5 %.
    slow = prior_model.with_params(draft_eff=0.001, verify_slope=1.0)
    target = demo_model(demo_con, "Qwen2.5-Coder", "32B")
    rec = recommend(demo_con, target.model_id, model=slow, host=REFERENCE_HOST, task="prose")
    assert not rec.speculate
    assert rec.best.method is Method.NONE and rec.best.experts is None
    assert rec.advice[0].startswith("do not speculate")


def test_unknown_policy_and_task_are_usage_errors(demo_con, prior_model):  # type: ignore[no-untyped-def]
    target = demo_model(demo_con, "Qwen2.5-Coder", "32B").model_id
    with pytest.raises(UsageError, match="unknown policy 'fast': use quality or speed"):
        recommend(demo_con, target, model=prior_model, host=REFERENCE_HOST, policy="fast")
    with pytest.raises(UsageError, match="unknown task 'poetry'"):
        recommend(demo_con, target, model=prior_model, host=REFERENCE_HOST, task="poetry")
    assert math.isfinite(REFERENCE_HOST.bandwidth_gbs)


MY_HOST = dataclasses.replace(REFERENCE_HOST, fingerprint="this-host")


def _ngram_run(con, target, k: int, tps: float, acceptance: float):  # type: ignore[no-untyped-def]
    from datetime import datetime, timezone

    from specreg.registry.run_store import RunRecord, record_run

    drafted = 300
    rec = RunRecord(
        kind="run", status="ok", started_at=datetime.now(timezone.utc), config={},
        config_label=f"ngram-mod k={k}", spec_type="ngram-mod", target_model_id=target.model_id,
        k=k, temperature=0.0, task="code", tokens_per_s=tps, draft_n=drafted,
        draft_n_accepted=round(acceptance * drafted), acceptance=acceptance,
        host_fingerprint=MY_HOST.fingerprint,
    )  # fmt: skip
    return record_run(con, rec)


@pytest.mark.parametrize("acceptance", [1.0, 0.05])
def test_measured_acceptance_reshapes_the_k_curve(demo_con, prior_model, acceptance):  # type: ignore[no-untyped-def]
    """An n-gram run that was always accepted lifts the long-K end of its K curve; one
    that was almost never accepted does not (verifying more never pays then)."""
    from specreg.recommender.local import local_observations

    target = demo_model(demo_con, "Qwen2.5-Coder", "32B")

    def ngram_curve() -> dict[int, float]:
        local = local_observations(demo_con, MY_HOST)
        rec = recommend(
            demo_con, target.model_id, model=prior_model, host=MY_HOST, task="code",
            observations=[*load_prior().observations, *local],
        )  # fmt: skip
        return {o.k: o.tps for o in rec.options if o.method is Method.NGRAM and o.k}

    before = ngram_curve()
    k_mid = sorted(before)[len(before) // 2]
    _ngram_run(demo_con, target, k_mid, before[k_mid], acceptance)
    after = ngram_curve()
    longest, shortest = max(after), min(after)
    ratio_before = before[longest] / before[shortest]
    ratio_after = after[longest] / after[shortest]
    if acceptance > 0.5:
        assert ratio_after > ratio_before * 1.1
    else:
        assert ratio_after <= ratio_before * 1.02 and max(after, key=after.get) != longest
