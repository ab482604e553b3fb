"""Caches grown from traffic, on real llama.cpp: SmolLM2 behind an adaptive policy of two
candidates (plain and ngram-mod), one thread, a traffic cache every four code requests.

The fourth request's run triggers llama-lookup-create on the served prompts and outputs; the
cache joins as ngram-cache reading it, is tried on a later request (never on one it was built
from), and a restarted server offers it again with its evidence."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from specreg.llama.install import LlamaInstall
from specreg.registry.db import opened
from specreg.registry.lookup_caches import list_caches
from specreg.registry.run_store import list_runs
from specreg.samples.small_models import SmallModels
from specreg.serve.traffic import parse_name

from support.serve import ServeProcess, start_serve

pytestmark = pytest.mark.llama

EVERY = 4
N_PREDICT = 48
NAMES = ["add", "subtract", "multiply", "divide", "power", "maximum", "minimum", "average",
         "median", "clamp", "swap", "square"]  # fmt: skip


def code_prompt(i: int) -> str:
    name = NAMES[i % len(NAMES)]
    return f"Write a Python function named {name}_numbers that takes a list of numbers."


class Served(ServeProcess):
    def ask(self, i: int, *, stream: bool = False) -> tuple[str, str]:
        """Send code prompt `i`; (the backend that answered, why the policy chose it)."""
        body = {"messages": [{"role": "user", "content": code_prompt(i)}],
                "max_tokens": N_PREDICT, "temperature": 0, "stream": stream}  # fmt: skip
        got = httpx.post(f"{self.url}/v1/chat/completions", json=body, timeout=120,
                         headers={"X-Specreg-Task": "code"})  # fmt: skip
        assert got.status_code == 200, got.text
        if stream:
            assert got.text.rstrip().endswith("data: [DONE]"), got.text[-200:]
        return got.headers["x-specreg-backend"], got.headers["x-specreg-policy"]


def start(home: Path, llama: LlamaInstall, model: Path, *extra: str) -> Served:
    return start_serve(Served, home, llama, model, "--pin", "default=none", "--pin",
                       "default=ngram-mod:16", "--policy", "adaptive", "--seed", "0",
                       "--threads", "1", "--ctx", "2048", *extra)  # fmt: skip


def cache_arm(task: dict[str, Any]) -> dict[str, Any] | None:
    return next((c for c in task["candidates"] if c["origin"] == "traffic-cache"), None)


def backend_ready(served: Served, name: str) -> bool:
    return any(b["name"] == name and b["ready"] for b in served.status()["backends"])


def test_a_cache_grown_from_traffic_joins_and_is_judged_on_later_requests(
    tmp_path: Path, llama_install: LlamaInstall, small_models: SmallModels
) -> None:
    model = small_models.smollm2.path
    served = start(tmp_path, llama_install, model, "--traffic-cache", str(EVERY))
    try:
        # the first four: one streamed (its text is read from the events), three whole
        asked = [served.ask(0, stream=True)] + [served.ask(i) for i in range(1, EVERY)]
        deadline = time.monotonic() + 90
        while (arm := cache_arm(served.task("code"))) is None and time.monotonic() < deadline:
            time.sleep(0.5)
        assert arm is not None, (served.status(), served.log.read_text()[-2000:])
        assert served.status()["traffic_caches"]["generation"] == {f"{model.stem}/code": 1}
        # its backend starts ahead of the request that first chooses it
        while not (ahead := backend_ready(served, arm["key"])) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert ahead, served.status()["backends"]
        later = [served.ask(i) for i in range(EVERY, EVERY + 4)]
        after = served.task("code")
    finally:
        served.stop()
    assert all(b != arm["key"] for b, _ in asked)
    # a never-tried candidate whose band reaches above the best gets a request
    to_cache = [(b, why) for b, why in later if b == arm["key"]]
    assert to_cache, (later, after)
    assert later[0] == to_cache[0], "a candidate that joined while serving is tried next"
    assert to_cache[0][1] == "explore"
    mine = next(c for c in after["candidates"] if c["key"] == arm["key"])
    assert mine["requests"] == len(to_cache)
    assert mine["drafted"] > 0, mine  # ngram-cache found the earlier answers in the cache

    with opened(tmp_path / "registry.duckdb", read_only=True) as con:
        # the first cache; four more requests may have built the second by the end
        caches = {parse_name(c.name): c for c in list_caches(con)}
        runs = sorted(
            (r for r in list_runs(con, with_prompts=True) if r.kind == "serve"),
            key=lambda r: r.run_id or 0,
        )
    target_id = next(iter(caches))[0]  # type: ignore[index]
    cache = caches[(target_id, "code", 1)]
    assert set(caches) <= {(target_id, "code", 1), (target_id, "code", 2)}
    first = runs[:EVERY]
    # built from exactly the first four requests, whose prompts and outputs were kept (the
    # streamed one's output read from its events)
    assert sorted(s.ref for s in cache.sources) == sorted(f"run:{r.run_id}" for r in first)
    for i, r in enumerate(first):
        assert r.prompts[0].prompt_text == code_prompt(i)
        assert r.prompts[0].output_text, f"request {i}'s output was not kept"
    # judged only on requests that arrived after it was built: none of them built it
    judged = [r for r in runs if r.config["serve"]["candidate"] == arm["key"]]
    assert len(judged) == len(to_cache)
    assert all(r.started_at > cache.built_at for r in judged)
    assert not {r.prompts[0].prompt_sha256 for r in judged} & set(cache.prompt_sha256s)
    assert all(r.lookup_cache_sha256 in (None, cache.sha256) for r in judged)

    # a restarted server offers the newest cache again, with the evidence it has
    newest = max(g for _, _, g in caches)  # type: ignore[misc]
    again = start(tmp_path, llama_install, model, "--traffic-cache", str(EVERY))
    try:
        status = again.status()
        resumed = cache_arm(again.task("code"))
    finally:
        again.stop()
    assert resumed is not None and resumed["key"].endswith(f"-code-g{newest}"), resumed
    if newest == 1:
        assert resumed["requests"] == mine["requests"]
    assert status["traffic_caches"]["generation"] == {f"{model.stem}/code": newest}


def test_no_text_is_kept_without_traffic_caches(
    tmp_path: Path, llama_install: LlamaInstall, small_models: SmallModels
) -> None:
    served = start(tmp_path, llama_install, small_models.smollm2.path, "--traffic-cache", "0")
    try:
        served.ask(0)
        status = served.status()
    finally:
        served.stop()
    assert status["traffic_caches"] is None
    with opened(tmp_path / "registry.duckdb", read_only=True) as con:
        (run,) = [r for r in list_runs(con, with_prompts=True) if r.kind == "serve"]
        assert list_caches(con) == []
    assert run.prompts[0].prompt_text is None and run.prompts[0].output_text is None
