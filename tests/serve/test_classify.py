"""The request classifier: its labelled set, its accuracy against the user's rule, forcing."""

from __future__ import annotations

from collections import Counter

import pytest

from specreg.errors import UsageError
from specreg.runner.workload import load_workload
from specreg.serve.classify import (
    SOURCE_CLASSIFIER,
    SOURCE_HEADER,
    SOURCE_MODEL,
    RequestText,
    TaskClassifier,
    classify,
    fitted_classifier,
    heuristic_task,
    labelled_prompts,
    request_text,
    split_document,
)
from specreg.serve.routes import split_model
from specreg.terms import TASKS


@pytest.fixture(scope="module")
def clf() -> TaskClassifier:
    return fitted_classifier()


def test_labelled_set_covers_every_task_with_unique_ids() -> None:
    prompts = labelled_prompts()
    counts = Counter(p.task for p in prompts)
    assert set(counts) == set(TASKS)
    assert min(counts.values()) >= 45
    assert len({p.prompt_id for p in prompts}) == len(prompts)
    assert len({p.text for p in prompts}) == len(prompts)


def test_held_out_accuracy_beats_the_character_count_rule() -> None:
    from sklearn.model_selection import train_test_split

    prompts = labelled_prompts()
    X = [p.text for p in prompts]
    y = [p.task for p in prompts]
    Xtr, Xte, ytr, yte = train_test_split(X, y, test_size=0.3, stratify=y, random_state=0)
    accuracy = TaskClassifier().fit(Xtr, ytr).score(Xte, yte)
    rule = sum(heuristic_task(x) == t for x, t in zip(Xte, yte, strict=True)) / len(yte)
    assert accuracy >= 0.8
    assert accuracy > rule + 0.4


def test_runner_prompts_written_separately_are_classified(clf: TaskClassifier) -> None:
    prompts = load_workload(TASKS).prompts
    right = sum(clf.predict_one(p.text)[0] == p.task for p in prompts)
    assert right >= 0.8 * len(prompts)


def test_the_user_rule_as_documented() -> None:
    assert heuristic_task("for (i = 0; i < n; i++) { a[i] = b[i]; }") == "code"
    assert heuristic_task("Here is my file:\n```\nhello\n```") == "code"
    assert heuristic_task("Give a proof that there are infinitely many primes") == "math"
    assert heuristic_task('Return a schema whose "type": "object" describes a user') == "json"
    assert heuristic_task("{ the three largest cities of Portugal as an object please }") == "json"
    assert heuristic_task("Write a poem about the sea") == "prose"
    assert heuristic_task("Summarize the following article about bees") == "prose"


def test_a_supplied_document_and_the_questions_overlap_with_it() -> None:
    doc = (
        "The old station in Ferrow closed in 1971 when the branch line stopped running. "
        "In 2019 the regional transport authority bought the building and it reopened in 2021."
    )
    rt = split_document(f"{doc}\n\nWhen did the station in Ferrow reopen?")
    assert rt.document == doc
    assert rt.question == "When did the station in Ferrow reopen?"
    assert rt.overlap == pytest.approx(2 / 3)  # station, ferrow found; reopen is not
    assert split_document("Write a poem about the sea").document == ""
    assert RequestText("Summarize this").overlap == 0.0


def test_chat_bodies_text_parts_and_earlier_documents() -> None:
    doc = "A long meeting transcript. " * 10
    body = {
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": doc},
            {"role": "assistant", "content": "Noted."},
            {"role": "user", "content": [{"type": "text", "text": "Summarize it"}]},
        ]
    }
    rt = request_text(body)
    assert rt.question == "Summarize it"
    assert rt.document == doc
    assert rt.system == "You are terse."
    assert request_text({"prompt": ["def f(x):"]}).question == "def f(x):"


def test_classification_header_beats_model_suffix_beats_classifier(clf: TaskClassifier) -> None:
    body = {"messages": [{"role": "user", "content": "Write a Python function that sorts a list"}]}
    got = classify(clf, body)
    assert (got.task, got.source) == ("code", SOURCE_CLASSIFIER)
    assert got.confidence is not None and 0 < got.confidence <= 1
    assert classify(clf, body, model_task="summary").task == "summarize"
    assert classify(clf, body, model_task="math").source == SOURCE_MODEL
    forced = classify(clf, body, header="prose", model_task="math")
    assert (forced.task, forced.source) == ("prose", SOURCE_HEADER)
    with pytest.raises(UsageError) as err:
        classify(clf, body, header="poetry")
    assert str(err.value) == (
        "unknown task 'poetry' in the x-specreg-task header: use one of "
        "code, prose, summarize, json, math, chat"
    )


def test_model_suffix_splits_only_on_a_task_name() -> None:
    assert split_model("smollm2:code") == ("smollm2", "code")
    assert split_model("smollm2:general") == ("smollm2", "general")
    assert split_model("org/model:q4") == ("org/model:q4", None)
    assert split_model(None) == (None, None)


def test_prediction_is_cheap_on_a_huge_request(clf: TaskClassifier) -> None:
    # Classified on bounded prefixes: a 2 MB body gives the same answer as its first pages.
    doc = "The harbour grew around a fishing village and later a market. " * 30000
    big = f"Summarize the text below.\n\n{doc}"
    assert clf.predict_one(big)[0] == clf.predict_one(big[:40000])[0] == "summarize"
