"""What recommend scores and what it says of what it does not score: draft heads (issue 41,
point 5). An EAGLE-3 head is listed with the reason it is not ranked and how to measure it, and
`--spec-type draft-eagle3` never pairs that type with a plain draft model."""

from __future__ import annotations

from specreg.auditor import spec_type_refusal
from specreg.host.facts import REFERENCE_HOST
from specreg.recommender.recommend import recommend
from specreg.registry.queries import resolve_model
from specreg.terms import Method

LLAMA = "Meta Llama 3.1 8B Instruct"
HEAD = "EAGLE3 LLaMA3.1 Instruct 8B"


def _rec(con, model, target: str, spec_type: str | None = None):  # type: ignore[no-untyped-def]
    return recommend(con, target, model=model, host=REFERENCE_HOST, spec_type=spec_type)


def test_an_eagle3_head_is_listed_with_why_it_is_not_ranked(demo_con, prior_model) -> None:  # type: ignore[no-untyped-def]
    head = resolve_model(demo_con, HEAD)
    target = resolve_model(demo_con, LLAMA)
    rec = _rec(demo_con, prior_model, LLAMA)
    said = [a for a in rec.advice if HEAD in a]
    assert said == [
        f"{HEAD} ({head.model_id[:10]}) is a draft head for {LLAMA} (--spec-type draft-eagle3), "
        "not ranked: the speed model has no runs of eagle3 heads to predict one from; measure "
        f"it: specreg run {target.model_id[:10]} --draft {head.model_id[:10]} --spec-type "
        "draft-eagle3 --task chat"
    ]


def test_draft_eagle3_is_never_a_plain_draft(demo_con, prior_model) -> None:  # type: ignore[no-untyped-def]
    rec = _rec(demo_con, prior_model, LLAMA, "draft-eagle3")
    assert all(o.method is Method.NONE for o in rec.options), [o.label for o in rec.options]
    assert any(
        a.startswith("no candidate for --spec-type draft-eagle3: " + HEAD) for a in rec.advice
    )
    none = _rec(demo_con, prior_model, "Qwen2.5 Coder 32B Instruct", "draft-eagle3")
    assert all(o.method is Method.NONE for o in none.options)
    assert (
        "no candidate for --spec-type draft-eagle3: it needs a draft head (eagle3) trained for "
        "Qwen2.5 Coder 32B Instruct, and the registry holds none; a plain draft model runs as "
        "draft-simple"
    ) in none.advice


def test_a_type_and_a_draft_of_different_kinds_are_refused(demo_con) -> None:  # type: ignore[no-untyped-def]
    """What `run` refuses before llama.cpp starts (llama.cpp: "draft model is not eagle3")."""
    head = resolve_model(demo_con, HEAD)
    plain = resolve_model(demo_con, "Llama 3.2 1B Instruct")
    assert spec_type_refusal("draft-eagle3", plain, "Llama 3.2 1B Instruct") == (
        "--spec-type draft-eagle3 needs a draft head (eagle3) trained for the target, and "
        "Llama 3.2 1B Instruct is a plain model: run it with --spec-type draft-simple"
    )
    assert spec_type_refusal("draft-simple", head, "the head") == (
        "the head is a draft head (eagle3), which draft-simple cannot run: use --spec-type "
        "draft-eagle3"
    )
    assert spec_type_refusal("draft-eagle3", head) is None
    assert spec_type_refusal("draft-simple", plain) is None
    assert spec_type_refusal(None, plain) is None
