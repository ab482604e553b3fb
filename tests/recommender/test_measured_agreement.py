"""The recommender with measured agreement and measured quality cost, on the demo registry
(no llama.cpp needed: the measurements are recorded as `specreg agree` / `quality` would).

Qwen2.5-Coder-32B with its 0.5B draft (152,064 against 151,936 ids) and Qwen3-Coder-30B-A3B
(8 experts used of 128) are the demo's headline pair and MoE."""

from __future__ import annotations

import dataclasses
import math
from datetime import datetime, timezone

import pytest

from specreg.drafttrace import DraftTrace
from specreg.host.facts import REFERENCE_HOST
from specreg.recommender.acceptance import (
    ACC_AGREEMENT,
    ACC_PREDICTED,
    ACC_REPLAYED,
    ACC_RUN,
    DraftRules,
    accepted_per_step,
    drafted_acceptance_at,
    effective_acceptance,
    replay,
)
from specreg.recommender.costmodel import drafted_acceptance
from specreg.recommender.local import local_observations
from specreg.recommender.prior import load_prior
from specreg.recommender.quality_cost import COST_MEASURED, COST_PREDICTED
from specreg.recommender.recommend import Recommendation, recommend
from specreg.registry.quality_store import (
    PURPOSE_AGREEMENT,
    PURPOSE_QUALITY,
    QualityRecord,
    record_quality,
)
from specreg.registry.run_store import RunRecord, record_run
from specreg.terms import Method

from support.recommender import demo_model

MY_HOST = dataclasses.replace(REFERENCE_HOST, fingerprint="this-host")
DRAFT_05B = "Qwen2.5 Coder 0.5B Instruct"


def agreement(con, target, draft, task, same_top, *, temperature=0.0, accept=None):  # type: ignore[no-untyped-def]
    return record_quality(
        con,
        QualityRecord(
            purpose=PURPOSE_AGREEMENT, status="ok", started_at=datetime.now(timezone.utc),
            config={}, base_model_id=target.model_id, model_id=draft.model_id, task=task,
            n_tokens=252, same_top=same_top, temperature=temperature,
            accept=same_top if accept is None else accept,
        ),
    )  # fmt: skip


def rec(con, model, target, task="code", **kw) -> Recommendation:  # type: ignore[no-untyped-def]
    host = kw.pop("host", REFERENCE_HOST)
    local = local_observations(con, host)
    return recommend(
        con, target.model_id, model=model, host=host, task=task,
        observations=[*load_prior().observations, *local], **kw,
    )  # fmt: skip


def drafts_of(r: Recommendation) -> list:  # type: ignore[type-arg]
    return [o for o in r.options if o.method is Method.DRAFT and o.draft_name == DRAFT_05B]


@pytest.fixture
def pair(demo_con):  # type: ignore[no-untyped-def]
    target = demo_model(demo_con, "Qwen2.5-Coder", "32B")
    draft = demo_model(demo_con, "Qwen2.5-Coder", "0.5B")
    return target, draft


def test_measured_agreement_replaces_the_prior_guess(demo_con, prior_model, pair) -> None:  # type: ignore[no-untyped-def]
    target, draft = pair
    before = rec(demo_con, prior_model, target)
    assert before.best.method is Method.DRAFT and before.best.draft_name == DRAFT_05B
    assert {o.acceptance_source for o in drafts_of(before)} == {ACC_PREDICTED}

    agreement(demo_con, target, draft, "code", 0.02)
    after = rec(demo_con, prior_model, target)
    ds = drafts_of(after)
    assert ds and all(o.acceptance_source == ACC_AGREEMENT for o in ds)
    assert all(o.acceptance == pytest.approx(0.02) and o.speedup < 1 for o in ds)
    assert after.best.draft_name != DRAFT_05B
    assert any(
        a.startswith("measured agreement rules out Qwen2.5 Coder 0.5B") for a in after.advice
    )
    why = " ".join(ds[0].why)
    assert "2% per token measured by `specreg agree` (same top token, on the target's own" in why

    agreement(demo_con, target, draft, "code", 0.97)
    high = {o.k: o for o in drafts_of(rec(demo_con, prior_model, target))}
    low = {o.k: o for o in drafts_of(before)}
    # the prior guessed lower than 97%: more tokens a verification, a faster round (before,
    # runs of the pair on a host of the reference host's facts also bound the figures)
    assert all(high[k].tokens_per_step > low[k].tokens_per_step for k in high)  # type: ignore[operator]
    assert all(high[k].arithmetic.model > low[k].arithmetic.model for k in high)  # type: ignore[union-attr]
    best = max(high.values(), key=lambda o: o.tps)
    guessed = max(low.values(), key=lambda o: o.arithmetic.model)  # type: ignore[union-attr]
    assert best.k is not None and best.k >= guessed.k  # type: ignore[operator]


def test_another_tasks_agreement_is_used_and_said(demo_con, prior_model, pair) -> None:  # type: ignore[no-untyped-def]
    target, draft = pair
    agreement(demo_con, target, draft, "prose", 0.5)
    agreement(demo_con, target, draft, "math", 0.7)
    o = drafts_of(rec(demo_con, prior_model, target, task="code"))[0]
    assert o.acceptance == pytest.approx(0.6) and o.agreement is not None
    assert o.agreement.tasks == ("math", "prose")
    assert "math/prose (no code measurement)" in o.agreement.summary


def test_temperature_uses_its_own_acceptance_or_says_greedy(demo_con, prior_model, pair) -> None:  # type: ignore[no-untyped-def]
    target, draft = pair
    agreement(demo_con, target, draft, "code", 0.9)
    agreement(demo_con, target, draft, "code", 0.9, temperature=0.7, accept=0.55)
    warm = drafts_of(rec(demo_con, prior_model, target, temperature=0.7))[0]
    assert warm.acceptance == pytest.approx(0.55)
    assert "probability of the draft's top token at temperature 0.7" in warm.agreement.summary  # type: ignore[union-attr]
    other = drafts_of(rec(demo_con, prior_model, target, temperature=0.3))[0]
    assert other.acceptance == pytest.approx(0.9)
    assert other.agreement is not None and other.agreement.greedy_only
    assert "greedy: no agreement at this temperature" in other.agreement.summary


def test_runs_of_the_pair_outrank_agreement(demo_con, prior_model, pair) -> None:  # type: ignore[no-untyped-def]
    target, draft = pair
    agreement(demo_con, target, draft, "code", 0.1)
    record_run(
        demo_con,
        RunRecord(
            kind="run", status="ok", started_at=datetime.now(timezone.utc), config={},
            config_label="draft-simple k=8", spec_type="draft-simple",
            target_model_id=target.model_id, draft_model_id=draft.model_id, k=8,
            temperature=0.0, task="code", tokens_per_s=30.0, draft_n=400,
            draft_n_accepted=300, acceptance=0.75, host_fingerprint=MY_HOST.fingerprint,
        ),
    )  # fmt: skip
    ds = drafts_of(rec(demo_con, prior_model, target, host=MY_HOST))
    assert ds and {o.acceptance_source for o in ds} == {ACC_RUN}
    assert all(o.agreement is None for o in ds)
    # what the run measured (300 of 400 drafted at K=8), per token, for every K of the pair
    assert {round(o.acceptance, 6) for o in ds} == {round(ds[0].acceptance, 6)}  # type: ignore[arg-type]
    k8 = next(o for o in ds if o.k == 8)
    assert float(drafted_acceptance(k8.acceptance, 8)) == pytest.approx(0.75, abs=1e-6)  # type: ignore[arg-type]


def test_quality_cost_measured_predicted_and_the_budget(demo_con, prior_model) -> None:  # type: ignore[no-untyped-def]
    moe = demo_model(demo_con, "Qwen3-Coder", "30B-A3B")
    speed = rec(demo_con, prior_model, moe, policy="speed")
    fewer = sorted({o.experts for o in speed.options if o.experts is not None})
    assert fewer == [4, 6]
    assert all(o.quality is not None and o.quality.source == COST_PREDICTED
               for o in speed.options if o.experts)  # fmt: skip
    for kld in (0.06, 0.04):  # two texts at 4 of 8 experts
        record_quality(
            demo_con,
            QualityRecord(
                purpose=PURPOSE_QUALITY, status="ok", started_at=datetime.now(timezone.utc),
                config={}, base_model_id=moe.model_id, model_id=moe.model_id, experts=4,
                task="code" if kld > 0.05 else "prose", n_tokens=252, mean_kld=kld,
                same_top=0.8,
            ),
        )  # fmt: skip
    speed = rec(demo_con, prior_model, moe, policy="speed")
    at4 = next(o for o in speed.options if o.experts == 4)
    at6 = next(o for o in speed.options if o.experts == 6)
    assert at4.quality is not None and at4.quality.source == COST_MEASURED
    assert at4.quality.mean_kld == pytest.approx(0.06) and at4.quality.tasks == ("code",)
    assert at4.quality.label == "KLD 0.060 measured (code, same top 80%)"
    # 6 of 8: predicted from this model's own measurements, c = median(0.06, 0.04) / 0.5^2
    assert at6.quality is not None and at6.quality.source == COST_PREDICTED
    assert at6.quality.mean_kld == pytest.approx(0.2 * 0.25**2)
    assert "from this model's measurements" in at6.quality.label
    assert all(o.quality is None for o in speed.options if o.experts is None)

    budget = rec(demo_con, prior_model, moe, policy="speed", max_kld=0.03)
    assert {o.experts for o in budget.options} == {None, 6}
    assert any("cost more than the KLD budget 0.03" in a for a in budget.advice)
    quality = rec(demo_con, prior_model, moe, policy="quality", max_kld=0.03)
    assert all(o.lossless and o.quality is None for o in quality.options)


def test_drafting_rules_turn_agreement_into_accepted_tokens() -> None:
    # p_min 0, n_min 0 (the build's defaults): the geometric prefix, K drafted every time.
    acc, drafted = accepted_per_step(0.8, 4)
    assert acc == pytest.approx(0.8 + 0.64 + 0.512 + 0.4096) and drafted == 4
    assert drafted_acceptance_at(0.8, 4) == pytest.approx(acc / 4)
    assert effective_acceptance(0.8, 4) == 0.8
    # p_min: the draft stops at a token it is unsure of (half the positions here), and is
    # right 90 % of the time where it is sure.
    conf = {0.0: (1.0, 0.8), 0.75: (0.5, 0.9)}
    acc, drafted = accepted_per_step(0.8, 3, DraftRules(p_min=0.75, confidence=conf))
    assert drafted == pytest.approx(0.5 + 0.25 + 0.125)
    assert acc == pytest.approx(0.45 + 0.45**2 + 0.45**3)
    a_eff = effective_acceptance(0.8, 3, DraftRules(p_min=0.75, confidence=conf))
    assert sum(a_eff**i for i in (1, 2, 3)) == pytest.approx(acc, rel=1e-6)
    # n_min: drafts shorter than n_min are dropped; n_min > K drafts nothing at all.
    acc, drafted = accepted_per_step(0.8, 3, DraftRules(p_min=0.75, n_min=2, confidence=conf))
    assert drafted == pytest.approx(0.25 + 0.25 + 0.125)
    assert acc == pytest.approx(0.45 * 0.5 + 0.45**2 + 0.45**3)
    assert accepted_per_step(0.8, 3, DraftRules(n_min=4)) == (0.0, 0.0)
    assert math.isnan(drafted_acceptance_at(0.8, 3, DraftRules(n_min=4)))


def trace(bits: str, top_p: float | list[float] = 1.0) -> DraftTrace:
    ps = [top_p] * len(bits) if isinstance(top_p, float) else top_p
    return DraftTrace(tuple(b == "1" for b in bits), tuple(ps))


def test_replay_drafts_as_the_build_does_on_the_drafts_own_guesses() -> None:
    # K=4 on 10 agreeing tokens: the first comes from the prompt's pass; 4 accepted and the
    # target's own token, then a draft of 3 (no further than the last token but one) and
    # the target's last token.
    assert replay([trace("1" * 10)], 4) == (7 / 2, 7 / 2)
    # A miss at the third guess: 2 accepted, the target's token replaces the third, and the
    # next verification starts after it.
    assert replay([trace("1" + "110" + "1111" + "1")], 4) == ((2 + 4) / 2, (4 + 4) / 2)
    # p_min: the draft stops before a guess it is less sure of; n_min drops a short draft.
    unsure = trace("111111", [1.0, 0.9, 0.9, 0.2, 0.9, 0.9])
    assert replay([unsure], 4, p_min=0.5) == ((2 + 1) / 2, (2 + 1) / 2)
    assert replay([unsure], 4, p_min=0.5, n_min=2) == ((2 + 0 + 0) / 3, (2 + 0 + 0) / 3)
    assert all(math.isnan(x) for x in replay([], 4))


def test_where_the_misses_fall_changes_what_a_verification_accepts() -> None:
    # The same share of agreement (14 guesses of 18) at K=4: the misses together after a run
    # longer than K, against one miss in every four. Together, each miss costs a verification
    # of its own and the run is cut at K; spread, every verification accepts three. The
    # geometric formula on the share alone lies between.
    runs = [trace("1" + "1" * 12 + "0" * 4 + "11")]
    spread = [trace("1" + "1110" * 4 + "11")]
    in_runs, _ = replay(runs, 4)
    evenly, _ = replay(spread, 4)
    iid, _ = accepted_per_step(14 / 18, 4)
    assert (in_runs, evenly) == (11 / 7, 13 / 5)
    assert in_runs < iid < evenly
    # accepted_per_step replays traces where it has them, and the effective acceptance
    # lands the cost model's geometric prefix on the replayed tokens.
    assert accepted_per_step(14 / 18, 4, DraftRules(traces=runs))[0] == pytest.approx(in_runs)
    for traces, side in ((runs, -1), (spread, 1)):
        a_eff = effective_acceptance(14 / 18, 4, DraftRules(traces=traces))
        got, _ = replay(traces, 4)
        assert sum(a_eff**i for i in range(1, 5)) == pytest.approx(got, rel=1e-6)
        assert (a_eff - 14 / 18) * side > 0


def texts(con, target, draft, task, pairs):  # type: ignore[no-untyped-def]
    """An agreement measurement on llama-server that kept the target's text as token ids."""
    return record_quality(
        con,
        QualityRecord(
            purpose=PURPOSE_AGREEMENT, status="ok", started_at=datetime.now(timezone.utc),
            config={"prompt_ids": [list(p) for p, _ in pairs],
                    "answer_ids": [list(a) for _, a in pairs]},
            base_model_id=target.model_id, model_id=draft.model_id, task=task, n_tokens=64,
            same_top=0.9, temperature=0.0, accept=0.9,
        ),
    )  # fmt: skip


def plain(r: Recommendation):  # type: ignore[no-untyped-def]
    return next(o for o in r.options if o.method is Method.NONE and o.experts is None)


def test_ngram_mod_is_replayed_on_the_targets_own_text(demo_con, prior_model, pair) -> None:  # type: ignore[no-untyped-def]
    target, draft = pair

    def ngram(r: Recommendation) -> dict:  # type: ignore[type-arg]
        return {
            o.k: o
            for o in r.options
            if o.method is Method.NGRAM and not o.lookup_cache and not o.stack
        }

    before = ngram(rec(demo_con, prior_model, target, task="summarize"))
    assert before and all(o.acceptance_source == ACC_PREDICTED for o in before.values())
    # answers that repeat nothing of their prompts: ngram-mod never drafts, so it runs as
    # plain decoding does
    prompt = list(range(1000, 1080))
    fresh = [(prompt, list(range(2000 + 100 * i, 2064 + 100 * i))) for i in range(3)]
    texts(demo_con, target, draft, "summarize", fresh)
    r = rec(demo_con, prior_model, target, task="summarize")
    none = ngram(r)
    assert none and all(o.acceptance_source == ACC_REPLAYED for o in none.values())
    assert all(o.tps == pytest.approx(plain(r).tps, rel=1e-6) for o in none.values())
    assert "drafts in 0 of 189 steps" in " ".join(none[min(none)].why)
    # answers that copy their prompts: it drafts and accepts, and outruns plain decoding
    copied = [(prompt, prompt[10 * i : 10 * i + 64]) for i in range(3)]
    texts(demo_con, target, draft, "summarize", copied)
    r = rec(demo_con, prior_model, target, task="summarize")
    some = ngram(r)
    assert all(o.tps > 1.5 * plain(r).tps and o.acceptance == 1.0 for o in some.values())
    assert "tokens per drafting verification" in " ".join(some[min(some)].why)
    # another task's text says nothing about this one
    other = ngram(rec(demo_con, prior_model, target, task="code"))
    assert all(o.acceptance_source == ACC_PREDICTED for o in other.values())


def test_a_stack_is_replayed_on_the_text_and_the_drafts_guesses(
    demo_con, prior_model, pair
) -> None:  # type: ignore[no-untyped-def]
    # Answers that copy 60 tokens of their prompt, then 40 new ones the draft guesses right
    # but every fifth: the stack's lookup drafts the copy (its build default needs a 48-token
    # chain), the draft model the rest.
    target, draft = pair
    prompt = list(range(1000, 1100))
    pairs = [(prompt, prompt[5:65] + list(range(3000 + 50 * i, 3040 + 50 * i))) for i in range(3)]
    guesses = [
        DraftTrace(tuple(i < 60 or (i - 60) % 5 != 4 for i in range(100)), (1.0,) * 100)
        for _ in pairs
    ]
    record_quality(
        demo_con,
        QualityRecord(
            purpose=PURPOSE_AGREEMENT, status="ok", started_at=datetime.now(timezone.utc),
            config={"prompt_ids": [list(p) for p, _ in pairs],
                    "answer_ids": [list(a) for _, a in pairs],
                    "traces": [g.to_json() for g in guesses]},
            base_model_id=target.model_id, model_id=draft.model_id, task="summarize",
            n_tokens=297, same_top=0.86, temperature=0.0, accept=0.86,
        ),
    )  # fmt: skip
    stacked = rec(
        demo_con, prior_model, target, task="summarize", spec_type="ngram-mod,draft-simple"
    )
    alone = rec(demo_con, prior_model, target, task="summarize", spec_type="draft-simple")
    mine = {o.k: o for o in stacked.options if o.stack and o.draft_name == DRAFT_05B}
    theirs = {o.k: o for o in drafts_of(alone)}
    assert mine and set(mine) <= set(theirs)
    for o in mine.values():
        line = next(w for w in o.why if w.startswith("stack replayed"))
        assert "the lookup drafts in 3 of" in line  # once per answer: the 60-token copy
    # At a small K the lookup takes the copy's rest in one step where the draft model needs
    # one step per K tokens; at a large K the draft model's own steps go nearly as far, and
    # past the copy it guesses the new tokens the lookup drafts wrong.
    gain = {k: o.tps / theirs[k].tps for k, o in mine.items()}
    assert gain[min(gain)] > 1.1 and gain[max(gain)] < gain[min(gain)], gain


def test_the_command_takes_the_budget_from_a_role(demo_con, scanned_db, tmp_path) -> None:  # type: ignore[no-untyped-def]
    import json

    from click.testing import CliRunner

    from specreg.cli.main import cli

    moe = demo_model(demo_con, "Qwen3-Coder", "30B-A3B")
    spec = tmp_path / "specreg.yaml"
    spec.write_text(
        f"version: 1\nmodels:\n  {moe.model_id}:\n    path: {moe.path}\n    aliases: [coder]\n"
        "roles:\n  architect:\n    target: coder\n    policy: speed\n    max_kld: 0.0001\n"
    )
    demo_con.close()  # the command opens the registry itself
    base = ["recommend", moe.model_id, "--policy", "speed", "--task", "code", "--db",
            str(scanned_db), "--json", "--top", "500"]  # fmt: skip

    def experts(*extra: str) -> set[int | None]:
        r = CliRunner().invoke(cli, [*base, *extra], catch_exceptions=False)
        assert r.exit_code == 0, r.output
        return {o["experts"] for o in json.loads(r.stdout)["options"]}

    assert experts() == {None, 4, 6}
    assert experts("--role", "architect", "--spec", str(spec)) == {None}
    assert experts("--max-kld", "1", "--role", "architect", "--spec", str(spec)) == {None, 4, 6}
    missing = CliRunner().invoke(cli, [*base, "--role", "coder", "--spec", str(spec)])
    assert "no role 'coder'" in str(missing.exception)


def test_drafts_shows_the_measured_agreement(demo_con, scanned_db, pair) -> None:  # type: ignore[no-untyped-def]
    import json

    from click.testing import CliRunner

    from specreg.cli.main import cli

    target, draft = pair
    agreement(demo_con, target, draft, "code", 0.93)
    agreement(demo_con, target, draft, "prose", 0.71)
    agreement(demo_con, target, draft, "prose", 0.5, temperature=1.0)  # not a greedy figure
    demo_con.close()
    args = ["drafts", target.model_id, "--db", str(scanned_db)]
    r = CliRunner().invoke(cli, [*args, "--json"], catch_exceptions=False)
    by_id = {d["draft"]["id"]: d for d in json.loads(r.stdout)["drafts"]}
    assert by_id[draft.model_id]["agreement"] == {"code": 0.93, "prose": 0.71}
    assert all(d["agreement"] == {} for i, d in by_id.items() if i != draft.model_id)
    table = CliRunner().invoke(cli, args, catch_exceptions=False, terminal_width=250).stdout
    assert "agreement" in table and "71-93% (2 tasks)" in table
