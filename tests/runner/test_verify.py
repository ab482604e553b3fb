"""The verdict rules on constructed measurements, and the runs store round trip."""

from __future__ import annotations

from pathlib import Path

import pytest

from specreg.llama.config import Config
from specreg.llama.process import ServerFailed
from specreg.llama.server import TokenProbs
from specreg.registry.db import opened
from specreg.registry.run_store import get_run, list_runs, record_run
from specreg.runner.measurement import Probe, PromptResult, first_divergence
from specreg.runner.records import to_record
from specreg.runner.verify import judge

from support.measurements import HOST, PROMPT, completion, measurement


def tp(token: int, *cands: tuple[int, float]) -> TokenProbs:
    return TokenProbs(token, tuple((t, str(t), p) for t, p in cands))


def base_run(tokens=(1, 2, 3, 4), tps=(100.0, 110.0, 90.0), probs=()):  # type: ignore[no-untyped-def]
    ref = completion(tokens, probs=probs)
    return measurement(
        Config(), [PromptResult(PROMPT, tuple(completion(tokens, t) for t in tps), ref)]
    )


SPEC = Config(spec_type="draft-simple", k=4)


def cfg_run(tokens, config=SPEC, draft_n=8, probe=None, tps=(50.0, 55.0, 45.0)):  # type: ignore[no-untyped-def]
    samples = tuple(completion(tokens, t, draft_n, draft_n // 2) for t in tps)
    return measurement(config, [PromptResult(PROMPT, samples, None, probe)])


def test_first_divergence() -> None:
    assert first_divergence((1, 2, 3), (1, 2, 3)) is None
    assert first_divergence((1, 2, 3), (1, 9, 3)) == 1
    assert first_divergence((1, 2), (1, 2, 3)) == 2


def test_identical_but_slower_passes_and_says_so() -> None:
    v = judge(base_run(), cfg_run((1, 2, 3, 4)))
    assert v.verdict == "pass"
    assert v.speedup == pytest.approx(0.5)
    assert v.speedup_range == pytest.approx((45 / 110, 55 / 90))
    assert v.slower
    assert v.reason == "identical tokens on 1/1 prompts; slower than baseline: 0.50x"


def test_near_tie_is_equivalent_up_to_numerics() -> None:
    probs = [tp(1, (1, 0.9)), tp(2, (2, 0.9)), tp(3, (3, 0.46), (7, 0.44)), tp(4, (4, 0.9))]
    probe = Probe(2, tp(7, (7, 0.47), (3, 0.45)), " three", " seven")
    v = judge(base_run(probs=probs), cfg_run((1, 2, 7, 4), probe=probe))
    assert v.verdict == "pass"
    (p,) = v.prompts
    assert (p.verdict, p.position, p.baseline_token, p.config_token) == ("near-tie", 2, 3, 7)
    assert p.margin == pytest.approx(0.02)
    assert "1 equivalent up to numerics (near-tie, margin <= 0.020)" in v.reason


def test_confident_divergence_fails() -> None:
    probs = [tp(1, (1, 0.9)), tp(2, (2, 0.9)), tp(3, (3, 0.95), (7, 0.01)), tp(4, (4, 0.9))]
    v = judge(base_run(probs=probs), cfg_run((1, 2, 7, 4)))
    assert v.verdict == "fail"
    assert v.reason == (
        "output differs from the baseline at a confident position: prompt code-1 token 2 "
        "(baseline p=0.950 vs config token p=0.010, numerical noise n/a)"
    )


def test_flip_within_measured_noise_is_a_near_tie() -> None:
    # Measured on gemma-3-270m + Q4_0 draft (summarize-2, token 13): the baseline preferred
    # its token by 0.050, while re-decoding the prefix in one batch preferred it by 0.140.
    probs = [tp(1, (1, 0.9)), tp(2, (2, 0.9)), tp(3, (3, 0.385), (7, 0.335))]
    probe = Probe(2, tp(3, (3, 0.419), (7, 0.279)), ".", " because")
    v = judge(base_run((1, 2, 3), probs=probs), cfg_run((1, 2, 7), probe=probe))
    (p,) = v.prompts
    assert p.verdict == "near-tie" and v.verdict == "pass"
    assert p.margin == pytest.approx(0.05) and p.noise == pytest.approx(0.09)


def test_confident_baseline_is_never_excused_by_noise() -> None:
    probs = [tp(1, (1, 0.9)), tp(2, (2, 0.9)), tp(3, (3, 0.60), (7, 0.30))]
    probe = Probe(2, tp(7, (7, 0.7), (3, 0.2)), "a", "b")  # noise 0.8, capped at 0.25
    v = judge(base_run((1, 2, 3), probs=probs), cfg_run((1, 2, 7), probe=probe))
    assert v.prompts[0].verdict == "diverged" and v.verdict == "fail"


def test_token_outside_top_candidates_fails() -> None:
    probs = [tp(1, (1, 0.9)), tp(2, (2, 0.9)), tp(3, (3, 0.95), (8, 0.01))]
    v = judge(base_run(probs=probs), cfg_run((1, 2, 7, 4)))
    assert v.verdict == "fail" and v.prompts[0].verdict == "diverged"


def test_no_drafting_fails() -> None:
    v = judge(base_run(), cfg_run((1, 2, 3, 4), draft_n=0))
    assert v.verdict == "fail"
    assert v.reason == (
        "speculation did not happen: draft-simple drafted no tokens on any of 1 prompts "
        "(draft_n = 0)"
    )


def test_behaviour_changing_is_labelled_not_failed() -> None:
    cfg = Config(experts=4, expert_key="x.expert_used_count")
    v = judge(base_run(), cfg_run((1, 9, 9, 9), config=cfg, draft_n=0))
    assert v.verdict == "pass" and v.label == "behaviour-changing"
    assert v.prompts[0].verdict == "changed"
    assert v.reason.startswith(
        "behaviour-changing (plain experts=4): differs from the full baseline on 1/1 "
        "prompts, first at token 1"
    )


def test_failed_config_fails_with_its_message() -> None:
    err = ServerFailed("spec-init", "llama-server started without speculation (draft-simple)",
                       "draft model vocab type must match target model", None)  # fmt: skip
    v = judge(base_run(), measurement(SPEC, [], failure=err))
    assert v.verdict == "fail" and "vocab type must match" in v.reason


def test_runs_store_round_trip(specreg_home: Path) -> None:
    probs = [tp(1, (1, 0.9)), tp(2, (2, 0.9)), tp(3, (3, 0.46), (7, 0.44)), tp(4, (4, 0.9))]
    base = base_run(probs=probs)
    cfg = cfg_run((1, 2, 7, 4), probe=Probe(2, tp(7, (7, 0.5), (3, 0.4)), "a", "b"))
    v = judge(base, cfg)
    with opened(specreg_home / "registry.duckdb") as con:
        base_id = record_run(con, to_record(base, "baseline", "tid", None, task="code"))
        run_id = record_run(
            con,
            to_record(cfg, "verify", "tid", "did", verification=v, baseline_run_id=base_id),
        )
        got = get_run(con, run_id)
        listed = list_runs(con)
    assert [r.run_id for r in listed] == [run_id, base_id]
    assert (got.kind, got.status, got.verdict, got.baseline_run_id) == ("verify", "ok", "pass", 1)
    assert got.config["spec_type"] == "draft-simple" and got.config_label == "draft-simple k=4"
    assert got.tokens_per_s == pytest.approx(50.0)
    assert got.acceptance == pytest.approx(0.5)
    assert got.host and got.host["fingerprint"] == HOST.fingerprint
    (p,) = got.prompts
    assert p.verdict == "near-tie" and p.divergence and p.divergence["position"] == 2
    assert p.samples_tps == pytest.approx((50.0, 55.0, 45.0))
    assert got.started_at.tzinfo is not None
