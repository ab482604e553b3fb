"""The adaptive policy on real llama.cpp: SmolLM2 behind two candidates, plain and ngram-mod
(a candidate set pinned with --pin twice), one thread. On requests that edit a supplied text the
output repeats the input and ngram-mod drafts it. After a restart the policy continues from the
runs the first server recorded. On requests that repeat nothing ngram-mod drafts next to nothing
the target keeps: it measures what plain measures, and the policy settles on plain. The
requests plain serves are replayed for ngram-mod (serve.replay)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from specreg.llama.install import LlamaInstall
from specreg.samples.small_models import SmallModels

from support.serve import ServeProcess, start_serve

pytestmark = pytest.mark.llama

PINS = ("--pin", "default=none", "--pin", "default=ngram-mod:16")
TASK = "summarize"
N_PREDICT = 128  # ngram-mod matches 24 tokens before it drafts: the answer must outgrow that
SETTLE_WITHIN = 20  # requests after which the choice must be made
# ... and its last 8 requests must average this share of the choice's posterior speed
SETTLED = 0.95

SUBJECTS = ["lighthouse", "bakery", "orchard", "library", "harbour", "observatory", "garden",
            "bridge", "market", "railway station", "vineyard", "museum", "school", "castle",
            "river", "forest", "mill", "theatre", "island", "mountain hut"]  # fmt: skip


def text_about(subject: str) -> str:
    return (
        f"The old {subject} stood at the edge of the town for more than a hundred years. "
        f"Every morning the keeper of the {subject} opened the heavy wooden door, swept the "
        f"stone floor and wrote the date in a thick notebook. Visitors came from the villages "
        f"nearby to see the {subject}, and children liked to count the windows on the way up. "
        f"In the evening the keeper closed the door of the {subject}, lit a small lamp and "
        "read the letters that travellers had left on the table by the stairs."
    )


def edit_prompt(i: int) -> str:
    subject = SUBJECTS[i % len(SUBJECTS)]
    return (
        "Copy the following text exactly, word for word, but write 'keeper' as 'warden'.\n\n"
        f"{text_about(subject)}\n\nThe copied text:\n"
    )


def fresh_prompt(i: int) -> str:
    subject = SUBJECTS[i % len(SUBJECTS)]
    return f"Write a short story about a {subject} in winter, in your own words."


class Served(ServeProcess):
    def ask(self, prompt: str, *, chat: bool = False) -> httpx.Response:
        # Edits go to /v1/completions (the model continues the copy); fresh requests to the
        # chat endpoint, whose template keeps SmolLM2 from looping on one word.
        body: dict[str, Any] = {"max_tokens": N_PREDICT, "temperature": 0}
        if chat:
            body["messages"] = [{"role": "user", "content": prompt}]
        else:
            body["prompt"] = prompt
        return httpx.post(
            f"{self.url}/v1/{'chat/completions' if chat else 'completions'}",
            json=body,
            headers={"X-Specreg-Task": TASK},
            timeout=120,
        )


def start(home: Path, llama: LlamaInstall, model: Path) -> Served:
    return start_serve(Served, home, llama, model, *PINS, "--policy", "adaptive", "--seed", "0",
                       "--threads", "1", "--ctx", "2048")  # fmt: skip


@pytest.fixture
def home(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path


def run_stream(served: Served, prompt: Any, n: int, offset: int = 0) -> list[str]:
    chosen = []
    for i in range(n):
        got = served.ask(prompt(offset + i), chat=prompt is fresh_prompt)
        assert got.status_code == 200, got.text
        chosen.append(got.headers["x-specreg-backend"])
    return chosen


def test_edits_settle_and_a_restart_continues(
    home: Path, llama_install: LlamaInstall, small_models: SmallModels
) -> None:
    served = start(home, llama_install, small_models.smollm2.path)
    try:
        chosen = run_stream(served, edit_prompt, SETTLE_WITHIN)
        first = served.task(TASK)
    finally:
        served.stop()
    ngram = next(c["key"] for c in first["candidates"] if "ngram-mod" in c["label"])
    arms = {c["key"]: c for c in first["candidates"]}
    shown = [(c["label"], c["requests"], round(c["posterior_tps"], 1)) for c in first["candidates"]]
    # Settled: the choice is the candidate its evidence favours, and the last requests cost
    # little against sending them all there. Thompson sampling still tries the other where the
    # two measure close (both are then nearly as good), and stops where they do not.
    choice = first["choice"]
    assert choice == max(arms.values(), key=lambda c: c["posterior_tps"])["key"], shown
    last = [arms[b]["posterior_tps"] / arms[choice]["posterior_tps"] for b in chosen[-8:]]
    assert sum(last) / len(last) >= SETTLED, (chosen, shown)

    # On edits ngram-mod drafts the copied text. On a quiet 2-core host it measures about as
    # fast as plain (84.7 vs 83.4 t/s seen), elsewhere faster; where its band clears every
    # other candidate's, it is the choice.
    others = [c for k, c in arms.items() if k != ngram and c["requests"]]
    if all(arms[ngram]["posterior_lo"] > c["posterior_hi"] for c in others):
        assert choice == ngram, (shown, first["why"])

    # every request another candidate served was replayed for ngram-mod: on edits it would
    # have drafted the copied text (serve.replay), and that, not the prediction, is its prior
    replay = arms[ngram]["replay"]
    served_by_others = sum(1 for b in chosen if b != ngram)
    assert replay is not None and replay["requests"] == served_by_others, (chosen, replay)
    if served_by_others:
        assert replay["accepted"] > 0, replay

    # a new server reads the recorded runs back: the same posteriors, the same choice
    again = start(home, llama_install, small_models.smollm2.path)
    try:
        status = again.status()
        resumed = again.task(TASK)
        more = run_stream(again, edit_prompt, 2, offset=SETTLE_WITHIN)
    finally:
        again.stop()
    assert status["replayed"] == SETTLE_WITHIN
    assert resumed["choice"] == choice
    # the same requests per candidate and the same posteriors (the registry stores the
    # speeds in single precision: equal to a fraction of a percent)
    before = {c["key"]: c for c in first["candidates"]}
    after = {c["key"]: c for c in resumed["candidates"]}
    assert {k: c["requests"] for k, c in after.items()} == {
        k: c["requests"] for k, c in before.items()
    }
    # the same priors too: the recommender they come from leaves served runs out (it read
    # them as evidence once, and moved the priors 3 %: each request counted twice)
    assert after[ngram]["replay"] == replay  # the replays were recorded with their runs
    for k, c in after.items():
        assert c["prior_tps"] == pytest.approx(before[k]["prior_tps"], rel=1e-6)
        assert c["posterior_tps"] == pytest.approx(before[k]["posterior_tps"], rel=0.01)
    # and it goes on serving with them: a retired candidate gets nothing
    assert set(more) <= {k for k, c in after.items() if c["status"] == "active"}, more


def test_requests_that_repeat_nothing_settle_on_plain(
    home: Path, llama_install: LlamaInstall, small_models: SmallModels
) -> None:
    served = start(home, llama_install, small_models.smollm2.path)
    try:
        chosen = run_stream(served, fresh_prompt, 16)
        got = served.task(TASK)
    finally:
        served.stop()
    arms = {c["label"].split()[0]: c for c in got["candidates"]}
    plain, ngram = arms["plain"], arms["ngram-mod"]
    shown = [(c["label"], c["requests"], c["accepted"], c["generated"], c["status"], c["why"])
             for c in got["candidates"]]  # fmt: skip
    # settled as on edits: the choice, and most of the last requests (Thompson sampling may
    # still try the other now and then until its drafts retire it)
    assert got["choice"] == plain["key"], shown
    assert chosen[-4:].count(plain["key"]) >= 3, (chosen, shown)
    # it was tried, cost few requests, and what it drafted was not worth its cost
    assert 1 <= ngram["requests"] <= 4, shown
    assert ngram["status"] == "retired" or ngram["posterior_tps"] < plain["posterior_tps"], shown
