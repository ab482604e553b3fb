"""Load as the policy's context: levels, the load's cost per configuration, and choices that
change with the load (speculation alone, plain decoding under load)."""

from __future__ import annotations

import math
from datetime import datetime, timezone
from pathlib import Path

import pytest

from specreg.registry.capacity import CapacityCurve, CapacityPoint, record_capacity
from specreg.registry.db import opened
from specreg.serve.loadpolicy import (
    LoadModel,
    LoadPolicy,
    level_of,
    measured_ratios,
    roofline_cost,
)
from specreg.serve.policy import KIND_DRAFT, KIND_NGRAM, KIND_PLAIN, Candidate, TaskPolicy


def test_levels_are_a_factor_of_two_apart() -> None:
    got = {n: level_of(n) for n in (1, 2, 3, 4, 5, 8, 9, 16, 17, 32, 33, 500)}
    assert got == {1: 1, 2: 2, 3: 4, 4: 4, 5: 8, 8: 8, 9: 16, 16: 16, 17: 32, 32: 32,
                   33: 64, 500: 64}  # fmt: skip


def test_the_loads_cost_follows_the_pass_over_every_requests_tokens() -> None:
    linear = LoadModel(lambda n: n)  # a compute-bound host: a pass costs its tokens
    plain = Candidate("p", "plain", 80, 60, 100)
    draft = Candidate("d", "draft", 60, 40, 90, k=4, kind=KIND_DRAFT)
    assert linear.factor(plain, 1) == 0.0
    assert linear.factor(plain, 4) == pytest.approx(-math.log(4))
    # a round over 4 x 5 tokens where alone it was over 5: the same share as plain's
    assert linear.factor(draft, 4) == pytest.approx(-math.log(4))
    flat = LoadModel(roofline_cost(0.02))  # memory-bound: a batch of 4 costs about a step
    assert flat.factor(plain, 4) > -0.01
    assert flat.factor(draft, 8) < flat.factor(plain, 8)  # 40 tokens leave the flat part
    measured = LoadModel(lambda n: n, measured={(KIND_DRAFT, 4): 0.3, ("p", 4): 0.9})
    assert measured.factor(draft, 4) == pytest.approx(math.log(0.3))
    assert measured.factor(plain, 4) == pytest.approx(math.log(0.9))  # by key before kind


def test_speculation_alone_and_plain_decoding_under_load() -> None:
    """Measured once on a quiet server, the draft wins alone; the capacity curve says its
    gain falls with the load, so at eight requests the policy serves plain decoding without
    having tried the draft there."""
    plain = Candidate("plain", "plain", 40, 30, 55)
    draft = Candidate("draft", "draft K=8", 40, 30, 55, k=8, kind=KIND_DRAFT)
    model = LoadModel(lambda n: n, measured={
        (KIND_PLAIN, 8): 0.5, (KIND_DRAFT, 8): 0.15,  # per request, over its speed alone
    })  # fmt: skip
    policy = LoadPolicy(TaskPolicy("t/code", [plain, draft], seed=1), model)
    for _ in range(8):
        policy.observe("plain", 40.0, concurrency=1)
        policy.observe("draft", 60.0, concurrency=1)
    assert policy.best_key(1) == "draft"
    assert policy.best_key(8) == "plain"
    picks = [policy.choose(8).key for _ in range(20)]
    assert picks.count("plain") >= 18
    # evidence under load counts for its level only, in full
    policy.observe("draft", 5.0, concurrency=8)
    assert policy.at(8)["draft"].weight == 1.0 and policy.at(1)["draft"].weight == 8.0


def test_a_crash_retires_everywhere_and_a_loss_alone_does_not() -> None:
    plain = Candidate("plain", "plain", 40, 30, 55)
    ngram = Candidate("ngram", "ngram-mod", 45, 30, 60, k=16, kind=KIND_NGRAM,
                      family="ngram-mod")  # fmt: skip
    policy = LoadPolicy(TaskPolicy("t/code", [plain, ngram], seed=0), LoadModel(lambda n: n))
    policy.at(4)
    policy.retire("ngram", "crashed")
    assert not policy.at(4)["ngram"].active and not policy.at(1)["ngram"].active


def test_capacity_curves_give_the_measured_ratios(tmp_path: Path) -> None:
    def point(label: str, spec: str, c: int, per_request: float) -> CapacityPoint:
        return CapacityPoint(label, spec, 16 if spec != "none" else None, None, "full", 1, 2,
                             8, "short", 20.0, c, c, 64 * c, 1.0, per_request * c,
                             per_request)  # fmt: skip

    curve = CapacityCurve("host", "m" * 32, datetime.now(timezone.utc), (
        point("plain", "none", 1, 80.0), point("plain", "none", 2, 60.0),
        point("plain", "none", 4, 40.0),
        point("ngram-mod k=16", "ngram-mod", 1, 90.0),
        point("ngram-mod k=16", "ngram-mod", 2, 45.0),
    ))  # fmt: skip
    with opened(tmp_path / "registry.duckdb") as con:
        record_capacity(con, curve)
        got = measured_ratios(con, "host", "m" * 32)
        assert measured_ratios(con, "other-host", "m" * 32) == {}
    assert got == {(KIND_PLAIN, 2): 0.75, (KIND_PLAIN, 4): 0.5, (KIND_NGRAM, 2): 0.5}
