"""Stacks and workload lookup caches in recommend: candidates of their own, listed where this
host's runs of them predict a win (the evidence names those runs) or when asked for by
--spec-type; a cache only for its tokenizer family and task."""

from __future__ import annotations

import dataclasses
from datetime import datetime, timezone
from pathlib import Path

import duckdb

from specreg.host.facts import REFERENCE_HOST
from specreg.recommender.local import local_observations
from specreg.recommender.predictor import SpeedPredictor
from specreg.recommender.prior import load_prior
from specreg.recommender.recommend import Recommendation, recommend
from specreg.registry.lookup_caches import LookupCache, record_cache
from specreg.registry.queries import ModelRecord, list_models
from specreg.registry.run_store import RunRecord, record_run
from specreg.terms import Method

from support.lookup_cache import cache_record, write_cache
from support.recommender import demo_model

HOST = dataclasses.replace(REFERENCE_HOST, fingerprint="this-host")
DRAFT_05B = "Qwen2.5 Coder 0.5B Instruct"


def rec_for(
    con: duckdb.DuckDBPyConnection,
    model: SpeedPredictor,
    target: ModelRecord,
    spec_type: str | None = None,
    task: str = "code",
) -> Recommendation:
    return recommend(
        con, target.model_id, model=model, host=HOST, task=task, spec_type=spec_type,
        observations=[*load_prior().observations, *local_observations(con, HOST)],
    )  # fmt: skip


def run(con: duckdb.DuckDBPyConnection, target: ModelRecord, spec_type: str, tps: float,
        **kw: object) -> int:  # fmt: skip
    drafted = 200
    acceptance = float(kw.pop("acceptance", 0.7))  # type: ignore[arg-type]
    record = RunRecord(
        kind="run", status="ok", started_at=datetime.now(timezone.utc), config={},
        config_label=f"{spec_type} {kw}", spec_type=spec_type, target_model_id=target.model_id,
        temperature=0.0, task="code", tokens_per_s=tps, draft_n=drafted,
        draft_n_accepted=round(acceptance * drafted), acceptance=acceptance,
        host_fingerprint=HOST.fingerprint, **kw,  # type: ignore[arg-type]
    )  # fmt: skip
    return record_run(con, record)


def test_a_draft_stack_is_listed_when_runs_here_show_it_wins(demo_con, prior_model) -> None:  # type: ignore[no-untyped-def]
    target = demo_model(demo_con, "Qwen2.5-Coder", "32B")
    draft = next(o for o in rec_for(demo_con, prior_model, target).options if o.draft_name)
    assert draft.draft_id is not None and draft.k is not None
    # no runs of the stack: it is scored as its draft alone, so it is not listed
    before = rec_for(demo_con, prior_model, target)
    assert not [o for o in before.options if o.stack]
    # asked for, it is listed whatever it is predicted to do, with what it rests on
    asked = rec_for(demo_con, prior_model, target, "ngram-mod,draft-simple")
    stacked = [o for o in asked.options if o.method is not Method.NONE]
    assert stacked and {o.spec_type for o in stacked} == {"ngram-mod,draft-simple"}
    assert (
        stacked[0]
        .why[0]
        .startswith(
            "ngram-mod,draft-simple: llama.cpp asks ngram-mod, then draft-simple for a draft each "
            "step; scored as draft-simple, no runs of it here"
        )
    )
    # this host measured the stack faster than its draft alone: now it is listed, on its runs
    predicted = next(
        o.tps for o in before.options if o.draft_id == draft.draft_id and o.k == draft.k
    )
    run(demo_con, target, "draft-simple", predicted, k=draft.k, draft_model_id=draft.draft_id)
    ids = [
        run(demo_con, target, "ngram-mod,draft-simple", predicted * 1.6, k=draft.k,
            draft_model_id=draft.draft_id, acceptance=0.9)
        for _ in range(2)
    ]  # fmt: skip
    after = rec_for(demo_con, prior_model, target)
    listed = [o for o in after.options if o.stack == "ngram-mod,draft-simple"]
    assert listed, [o.label for o in after.options[:8]]
    best = max(listed, key=lambda o: o.tps)
    alone = max(
        o.tps
        for o in after.options
        if not o.stack and o.draft_id == best.draft_id and o.k == best.k and o.experts is None
    )
    assert best.tps > alone
    assert {e.row_id for e in best.evidence} == {f"run:{i}" for i in ids}
    assert all(e.source == "local" for e in best.evidence)
    assert f"moved by this host's runs of it (run:{ids[0]}, run:{ids[1]})" in best.why[0]
    assert best.label.startswith("ngram-mod,draft-simple ")


def _cache(con: duckdb.DuckDBPyConnection, target: ModelRecord, tmp_path: Path) -> LookupCache:
    path = write_cache(tmp_path / "code.lcs", [([1, 2], [(3, 2)]), ([2, 3], [(4, 1)])])
    cache = dataclasses.replace(
        cache_record("my-code", path, target, task="code"), tok_family="qwen2:x"
    )
    record_cache(con, cache)
    return cache


def test_a_workload_cache_is_a_candidate_of_its_family_and_task(
    demo_con, prior_model, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    target = demo_model(demo_con, "Qwen2.5-Coder", "32B")
    assert target.tok_fingerprint
    cache = _cache(demo_con, target, tmp_path)
    assert not [o for o in rec_for(demo_con, prior_model, target).options if o.lookup_cache]
    asked = rec_for(demo_con, prior_model, target, "ngram-cache")
    (opt,) = [o for o in asked.options if o.lookup_cache]
    assert opt.spec_type == "ngram-cache" and opt.k == 8
    assert opt.lookup_cache_path == cache.path and opt.label == "ngram-cache K=8 cache=my-code"
    assert "reads the workload cache my-code (5 tokens of code" in opt.why[0]
    # not for another task
    assert not [
        o for o in rec_for(demo_con, prior_model, target, "ngram-cache", "prose").options
        if o.lookup_cache
    ]  # fmt: skip
    # runs of it here that beat n-gram lookup: listed without being asked for, on those runs
    best_ngram = max(o.tps for o in asked.options if o.method is Method.NGRAM)
    ran = run(demo_con, target, "ngram-cache", best_ngram * 1.5, lookup_cache="my-code",
              acceptance=0.8)  # fmt: skip
    listed = [o for o in rec_for(demo_con, prior_model, target).options if o.lookup_cache]
    assert [e.row_id for e in listed[0].evidence] == [f"run:{ran}"]


def test_a_cache_is_never_offered_to_another_tokenizer_family(
    demo_con, prior_model, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    coder = demo_model(demo_con, "Qwen2.5-Coder", "32B")
    _cache(demo_con, coder, tmp_path)
    other = next(
        m
        for m in list_models(demo_con)
        if m.tok_fingerprint and m.tok_fingerprint != coder.tok_fingerprint and m.n_params
        and m.n_bytes and not m.draft_kind
    )  # fmt: skip
    rec = rec_for(demo_con, prior_model, other, "ngram-cache")
    offered = [o for o in rec.options if o.spec_type == "ngram-cache"]
    assert offered and all(o.lookup_cache is None for o in offered)  # its own context only
