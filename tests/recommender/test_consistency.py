"""Every figure `recommend` prints agrees with the evidence it prints (issue 40).

The demo collection with the shipped runs, the reference host stated (96 cores, 460 GB/s, no
runs or calibration here): every option of every target, for every task (and the speed policy
for code), is checked against four rules.

(a) A cited run the option's figure (its speed-up; t/s for plain decoding) lies outside of
    (the noise figure either side) is named in a why line with everything it differs in; a run
    of exactly the option on this host and task lies in the printed spread of such runs, and so
    does the figure.
(b) The why arithmetic reproduces the figure: tokens over steps is the round's speed-up, the
    factors multiply it to the printed speed-up, and the round is the one the other why lines
    describe.
(c) A cited run is of the same target, or is marked as the nearest run of another target with
    its distance.
(d) No lossless option promises more speed-up than the tokens a verification yields.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import duckdb
import pytest

from specreg.auditor import target_refusal
from specreg.host.facts import HostFacts
from specreg.recommender.predictor import SpeedPredictor
from specreg.recommender.prior import load_prior, model_key
from specreg.recommender.recommend import Recommendation, recommend
from specreg.recommender.results import Evidence, Option
from specreg.registry.queries import ModelRecord, list_models
from specreg.terms import TASKS, Method

# The reference host as a user states it: a fingerprint of its own, nothing measured on it.
STATED = HostFacts(460.0, 96, "user", fingerprint="stated-reference-host")
NUMBER = r"(\d+(?:\.\d+)?)"
ARITHMETIC = re.compile(
    rf"^speed-up: (?:a lookup drafts in \d+% of rounds: )?{NUMBER} tokens / {NUMBER} target "
    rf"steps a (?:verification|round) \(verify {NUMBER} \+ draft {NUMBER}\) = {NUMBER}x(.*) "
    rf"-> {NUMBER}x$"
)
FACTOR = re.compile(rf"; x{NUMBER} ")
SPREAD = re.compile(
    rf"^\d+ runs of exactly this configuration on this host and task measured {NUMBER}-"
    rf"{NUMBER}(?:x| t/s).*: this figure is (within|OUTSIDE) their spread"
)
# what a cited run can differ in, as `Evidence.differs` and the why lines name it
NAMED = {
    "target": "target (", "quant": "quant (", "draft": "draft (", "draft quant": "draft quant (",
    "K": "K (", "task": "task (", "temperature": "temperature (", "experts": "experts (",
    "host": "host (", "baseline": "baseline (",
}  # fmt: skip


def targets(con: duckdb.DuckDBPyConnection) -> list[ModelRecord]:
    return [
        m
        for m in list_models(con)
        if not m.draft_kind and m.n_params and m.n_bytes and target_refusal(m) is None
    ]


def keys(m: ModelRecord) -> set[str]:
    return {m.model_id, model_key(m.display_name), model_key(Path(m.path).name)}


def figure(o: Option, e: Evidence) -> tuple[float, float | None]:
    """The option's figure and the run's, as rule (a) compares them."""
    if o.method is Method.NONE and o.experts is None:
        return o.tps, e.tps
    return o.speedup, e.speedup


def differences(o: Option, e: Evidence, rec: Recommendation) -> set[str]:
    """What the run differs in from the option, from the facts both print (the recommender
    may know more: draft, quant, a distrusted baseline)."""
    out = set()
    if not e.same_target:
        out.add("target")
    if o.method is not Method.NONE:
        if e.k != o.k:
            out.add("K")
        if e.task != rec.task:
            out.add("task")
    if abs(e.temperature - o.temperature) > 1e-9:
        out.add("temperature")
    if e.experts != o.experts:
        out.add("experts")
    if not e.same_host:
        out.add("host")
    return out


def check_evidence(o: Option, rec: Recommendation, target: ModelRecord) -> None:
    """Rules (a) and (c) for one option."""
    noise = rec.noise.spread
    spreads = [m for w in o.why if (m := SPREAD.match(w))]
    assert len(spreads) <= 1, o.why
    for e in o.evidence:
        # (c) the same target, or marked as the nearest one with its distance
        if e.same_target:
            assert model_key(e.target) in keys(target) or e.target in keys(target), e
        else:
            assert e.distance is not None and len(o.evidence) == 1, e
            assert e.summary.startswith(
                f"nearest run of another target (distance {e.distance:.2f}): "
            )
        mine, theirs = figure(o, e)
        assert differences(o, e, rec) <= set(e.differs), (o.label, e)
        if theirs is None or theirs / (1 + noise) <= mine <= theirs * (1 + noise):
            continue
        # (a) outside the run's spread: named, with everything it differs in
        if e.differs:
            lines = [w for w in o.why if w.startswith(f"run {e.row_id} measured ")]
            assert lines, (o.label, e.row_id, o.why)
            for what in e.differs:
                assert NAMED[what] in lines[0].split(": it differs from this option in ")[1]
        else:  # a run of exactly it: in the printed spread of such runs, as the figure is
            assert spreads, (o.label, e.row_id, o.why)
            lo, hi, verdict = float(spreads[0][1]), float(spreads[0][2]), spreads[0][3]
            assert lo - 0.006 <= theirs <= hi + 0.006
            assert (
                verdict == "within" and lo / (1 + noise) - 0.01 <= mine <= hi * (1 + noise) + 0.01
            )


def check_arithmetic(o: Option) -> None:
    """Rule (b) for one speculative (or fewer-experts) option."""
    a = o.arithmetic
    assert a is not None, o.label
    lines = [m for w in o.why if (m := ARITHMETIC.match(w))]
    assert len(lines) == 1, (o.label, o.why)
    tokens, steps, verify, draft, model = (float(lines[0][i]) for i in range(1, 6))
    rest, final = lines[0][6], float(lines[0][7])
    assert final == round(o.speedup, 2)
    assert verify + draft == pytest.approx(steps, abs=0.011)
    assert tokens / steps == pytest.approx(model, rel=0.006, abs=0.002)
    product = model * math.prod(float(f) for f in FACTOR.findall(rest))
    assert product == pytest.approx(o.speedup, rel=0.005, abs=0.005), (o.label, lines[0][0])
    if o.method is Method.NONE:
        return
    # the round is the one the other lines describe
    assert o.tokens_per_step is not None
    said = [w for w in o.why if " tokens per verification" in w and not w.startswith("speed-up")]
    assert said, o.why
    e = re.search(rf"{NUMBER} tokens per verification", said[0])
    assert e is not None and float(e[1]) == round(o.tokens_per_step, 1)
    if o.method is Method.DRAFT and o.experts is None and not o.stack:
        assert tokens == round(o.tokens_per_step, 2)
        v = re.search(rf"verifying K={o.k} costs {NUMBER}x a single step", " ".join(o.why))
        assert v is not None and float(v[1]) == pytest.approx(verify, abs=0.011)


def check_option(o: Option, rec: Recommendation, target: ModelRecord) -> None:
    check_evidence(o, rec, target)
    if o.method is Method.NONE and o.experts is None:
        assert o.arithmetic is None
        assert f"{o.tps:.1f} t/s" in o.why[0]
        return
    check_arithmetic(o)
    # (d) the bound of speculation, for every lossless option
    if o.lossless and o.method is not Method.NONE:
        assert o.tokens_per_step is not None and o.speedup <= o.tokens_per_step + 1e-9, o.label


def test_every_option_of_the_demo_agrees_with_its_evidence(
    demo_con: duckdb.DuckDBPyConnection, prior_model: SpeedPredictor
) -> None:
    observations = load_prior().observations
    n_options = n_cited = n_named = 0
    for target in targets(demo_con):
        asks = [(task, "quality") for task in TASKS] + [("code", "speed")]
        for task, policy in asks:
            rec = recommend(
                demo_con, target.model_id, model=prior_model, host=STATED, task=task,
                policy=policy, observations=observations,
            )  # fmt: skip
            for o in rec.options:
                check_option(o, rec, target)
                n_options += 1
                n_cited += len(o.evidence)
                n_named += sum(w.startswith("run ") for w in o.why)
    # the walk saw the collection: many options, citing runs, naming what differs
    assert n_options > 1000 and n_cited > n_options and n_named > 100


def test_a_host_calibrated_for_the_target_is_not_the_reference_host(
    demo_con: duckdb.DuckDBPyConnection, prior_model: SpeedPredictor
) -> None:
    """A host known by its own measurements of the target (here a calibration, with the
    reference host's facts) no longer takes the reference host's runs as its own: they are
    cited as another host's, named so where the figure stands apart, and bound nothing."""
    from dataclasses import replace

    from specreg.registry.calibration import record_calibration

    from support.calibration import calibration_record

    target = next(t for t in targets(demo_con) if t.display_name == "Qwen2.5 Coder 32B Instruct")
    observations = load_prior().observations

    def rec() -> Recommendation:
        return recommend(
            demo_con, target.model_id, model=prior_model, host=STATED, task="code",
            observations=observations,
        )  # fmt: skip

    stated = rec()
    assert any(e.same_host and not e.differs for o in stated.options for e in o.evidence)
    cal = calibration_record(target.model_id, scale=10.0, threads=96)
    record_calibration(demo_con, replace(cal, host_fingerprint=STATED.fingerprint or ""))
    calibrated = rec()
    assert calibrated.pass_factor is not None and calibrated.pass_factor.source == "fallback"
    for o in calibrated.options:
        assert all(not e.same_host and "host" in e.differs for e in o.evidence), o.label
        assert not any(w.startswith("runs of exactly") for w in o.why)
        assert not any("runs of exactly this configuration" in f for f, _ in (
            o.arithmetic.factors if o.arithmetic else ()))  # fmt: skip
        check_option(o, calibrated, target)
