"""Issue 25 points 8 and 9: the classifier on bare code and inline "Summarize the following
text:" requests, and the front's JSON errors for a model or a path it does not have."""

from __future__ import annotations

from pathlib import Path

import pytest
from starlette.testclient import TestClient

from specreg.serve.classify import fitted_classifier, labelled_prompts

from support.serve import front_without_backend


def test_bare_code_and_inline_summaries_are_classified() -> None:
    clf = fitted_classifier()
    assert clf.predict_one("def fib(n):")[0] == "code"
    assert clf.predict_one("class Queue:")[0] == "code"
    text = (
        "Summarize the following text: Our neighbour planted three apple trees last autumn. "
        "This spring they blossomed early, and by July the branches were so heavy that he had "
        "to prop them up with sticks. He gave most of the fruit away."
    )
    assert clf.predict_one(text)[0] == "summarize"
    # the two requests of the report are in the labelled set, with their kind
    texts = {p.text: p.task for p in labelled_prompts()}
    assert texts["def fib(n):"] == "code"
    assert sum(t.startswith("Summarize the following text:") for t in texts) >= 3


@pytest.fixture
def client(tmp_path: Path) -> TestClient:
    return TestClient(front_without_backend(tmp_path).app)


def test_an_unknown_model_is_404_even_with_one_target(client: TestClient) -> None:
    got = client.post("/v1/chat/completions", json={"model": "nosuch", "messages": []})
    assert got.status_code == 404
    assert got.headers["content-type"] == "application/json"
    assert got.json() == {
        "error": {
            "message": "unknown model 'nosuch': this server has tiny",
            "type": "invalid_request_error",
            "code": "model_not_found",
            "param": "model",
        }
    }
    # no model at all still goes to the only target (which is down here: 503, not 404)
    assert client.post("/v1/completions", json={"prompt": "hi"}).status_code == 503


def test_unknown_paths_and_methods_answer_json(client: TestClient) -> None:
    got = client.get("/v1/nosuch")
    assert got.status_code == 404
    assert got.headers["content-type"] == "application/json"
    assert got.json()["error"]["message"] == (
        "no endpoint GET /v1/nosuch: this server has POST /v1/chat/completions, POST "
        "/v1/completions, GET /v1/models, GET /health"
    )
    wrong = client.get("/v1/chat/completions")
    assert wrong.status_code == 405
    assert wrong.headers["content-type"] == "application/json"
    assert wrong.json()["error"]["message"] == "GET /v1/chat/completions: Method Not Allowed"
