"""Caches grown from traffic, the parts without llama.cpp: what text a request and its answer
give, cache names, and the recorder running a build only after the runs it reads."""

from __future__ import annotations

import threading
from datetime import datetime, timezone
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from specreg.host.machine import detect_host
from specreg.llama.config import Config
from specreg.llama.install import LlamaInstall
from specreg.registry.db import opened
from specreg.registry.run_store import STATUS_OK, PromptRecord, RunRecord, list_runs
from specreg.serve.app import Service
from specreg.serve.backends import BackendPool
from specreg.serve.classify import fitted_classifier
from specreg.serve.recorder import RunRecorder
from specreg.serve.routes import BackendSpec, RouteTable, Target
from specreg.serve.traffic import (
    MAX_TEXT_CHARS,
    TrafficCaches,
    answer_text,
    cache_name,
    delta_text,
    parse_name,
    request_text,
)
from specreg.terms import TASKS


def test_the_text_of_a_request_and_of_its_answer() -> None:
    parts = [{"type": "text", "text": "Sum 2, 3."}, {"type": "image_url", "image_url": {}}]
    chat = {"messages": [{"role": "system", "content": "Be brief."},
                         {"role": "user", "content": parts}]}  # fmt: skip
    assert request_text(chat) == "Be brief.\nSum 2, 3."
    assert request_text({"prompt": "def f():"}) == "def f():"
    assert request_text({"prompt": ["a", 3, "b"]}) == "a\nb"
    assert request_text({"messages": [{"role": "user"}]}) is None
    assert request_text({"prompt": "x" * (MAX_TEXT_CHARS + 10)}) == "x" * MAX_TEXT_CHARS
    assert answer_text({"choices": [{"message": {"content": "5"}}]}) == "5"
    assert answer_text({"choices": [{"text": " return 1"}]}) == " return 1"
    assert answer_text({"error": {"message": "no"}}) is None
    assert answer_text(None) is None
    assert delta_text({"choices": [{"delta": {"content": "ab"}}]}) == "ab"
    assert delta_text({"choices": [{"delta": {"role": "assistant"}}]}) == ""
    assert delta_text({"choices": [{"text": "c"}]}) == "c"
    assert delta_text({"choices": []}) == ""


@given(
    st.text(alphabet="0123456789abcdef", min_size=12, max_size=64),
    st.sampled_from(TASKS),
    st.integers(min_value=1, max_value=10**6),
)
def test_a_cache_name_says_whose_it_is(model_id: str, task: str, generation: int) -> None:
    name = cache_name(model_id, task, generation)
    assert parse_name(name) == (model_id[:12], task, generation)
    assert len(name) <= 64  # a valid lookup cache name
    assert parse_name("code-cache") is None
    assert parse_name(name + "x") is None


def _run(i: int) -> RunRecord:
    return RunRecord(
        kind="serve", status=STATUS_OK, started_at=datetime.now(timezone.utc),
        config={}, config_label="plain", spec_type="none", task="code",
        prompts=(PromptRecord(f"p{i}", f"{i:064x}", 1, output_text=f"out {i}"),),
    )  # fmt: skip


def test_a_scheduled_job_runs_after_the_runs_queued_before_it(tmp_path: Path) -> None:
    db = tmp_path / "registry.duckdb"
    with opened(db):
        pass
    seen: list[int] = []
    done = threading.Event()

    def job() -> None:
        with opened(db, read_only=True) as con:
            seen.append(len(list_runs(con)))
        done.set()

    recorder = RunRecorder(db, interval=30.0).start()  # only a wake-up writes
    try:
        for i in range(3):
            recorder.put(_run(i))
        recorder.schedule(job)
        assert done.wait(30)
    finally:
        recorder.close()
    assert seen == [3]


class _InFlight:
    """A request in flight on a backend (what count_concurrency reads of one)."""

    def __init__(self, backend: object):
        self.backend = backend
        self.concurrency = 1


def test_a_build_is_load_on_every_request_it_overlaps(tmp_path: Path) -> None:
    """llama-lookup-create shares the cores: requests decoding beside it count less."""
    db = tmp_path / "registry.duckdb"
    with opened(db):
        pass
    target = Target("tiny", "f" * 32, str(tmp_path / "tiny.gguf"))
    spec = BackendSpec(
        name="tiny-plain", target=target, config=Config(), draft_id=None, draft_path=None,
        prefix=(), binary="/nonexistent/llama-server", flags=("-m", target.path),
    )  # fmt: skip
    table = RouteTable((target,), (), (spec,))
    pool = BackendPool(table, env={}, logs=tmp_path)
    service = Service(table, pool, fitted_classifier(), templates={})
    before, during, after = (_InFlight(pool["tiny-plain"]) for _ in range(3))
    service.inflight.add(before)  # type: ignore[arg-type]
    seen: list[tuple[bool, int]] = []

    def on_busy(busy: bool) -> None:
        service.neighbour(busy)
        if busy:
            assert before.concurrency == 2  # itself and the build
            service.inflight.add(during)  # type: ignore[arg-type]
            service.count_concurrency()  # as a request's begin() does
        else:
            service.inflight -= {before, during}  # type: ignore[arg-type]
            service.inflight.add(after)  # type: ignore[arg-type]
            service.count_concurrency()
        seen.append((busy, service.neighbours))

    install = LlamaInstall(tmp_path / "no-build", "test", "0 (test)", "spec-type", (), ())
    caches = TrafficCaches(
        db, install, detect_host(), every=1, states={}, schedule=lambda job: job(),
        on_built=lambda *built: None, on_busy=on_busy,
    )  # fmt: skip
    caches.note("tiny", target.model_id, target.path, "code")
    # the build failed (no runs, no binary), and still gave the cores back
    assert seen == [(True, 1), (False, 0)]
    assert caches.failures and caches.failures[0].startswith("traffic cache for tiny/code")
    # both ran beside each other and the build; the one after it, alone
    assert (before.concurrency, during.concurrency, after.concurrency) == (3, 3, 1)


def test_after_a_cache_lost_the_next_waits_until_the_texts_have_doubled(tmp_path: Path) -> None:
    """A lost cache is followed by one built from twice its texts, not from `every` more."""
    from specreg.serve.policy import (
        KIND_CACHE,
        KIND_PLAIN,
        ORIGIN_TRAFFIC_CACHE,
        Candidate,
        TaskPolicy,
    )

    jobs: list[object] = []
    lost = {"now": False}
    install = LlamaInstall(tmp_path / "no-build", "test", "0 (test)", "spec-type", (), ())
    caches = TrafficCaches(
        tmp_path / "registry.duckdb", install, detect_host(), every=4, states={},
        schedule=jobs.append, on_built=lambda *built: None,
        lost=lambda target, task: lost["now"],
    )  # fmt: skip
    key = ("tiny", "code")
    caches.built_from[key] = 12  # the newest cache read 12 requests
    assert caches.due(*key) == 4
    lost["now"] = True
    assert caches.due(*key) == 12
    for i in range(11):
        caches.note("tiny", "f" * 32, "tiny.gguf", "code")
        assert not jobs, f"built after {i + 1} request(s)"
    caches.note("tiny", "f" * 32, "tiny.gguf", "code")
    assert len(jobs) == 1
    # when a cache never lost (or none was built yet), every `every`
    fresh = TrafficCaches(
        tmp_path / "registry.duckdb", install, detect_host(), every=4, states={},
        schedule=jobs.append, on_built=lambda *built: None,
    )  # fmt: skip
    for _ in range(4):
        fresh.note("tiny", "f" * 32, "tiny.gguf", "code")
    assert len(jobs) == 2

    # what the router calls a loss: the newest traffic cache retired on evidence
    from specreg.serve.adaptive import Router

    plain = Candidate("plain", "plain", 20.0, 15.0, 27.0, kind=KIND_PLAIN)
    policy = TaskPolicy("tiny/code", [plain], seed=0)
    router = Router.__new__(Router)
    router.policies = {key: policy}
    assert not router.cache_lost(*key)  # no cache yet
    g1 = Candidate("g1", "ngram-cache traffic-g1", 20.0, 15.0, 27.0, kind=KIND_CACHE,
                   origin=ORIGIN_TRAFFIC_CACHE)  # fmt: skip
    policy.add_near("plain", g1, "built from 4 served request(s)")
    for _ in range(4):
        policy.observe("plain", 20.0)
    assert not router.cache_lost(*key)  # untried
    policy.observe("g1", 8.0)
    assert not policy["g1"].active and router.cache_lost(*key)
    g2 = Candidate("g2", "ngram-cache traffic-g2", 20.0, 15.0, 27.0, kind=KIND_CACHE,
                   origin=ORIGIN_TRAFFIC_CACHE)  # fmt: skip
    policy.add_near("plain", g2, "built from 8 served request(s)")
    assert not router.cache_lost(*key)  # the newest has not lost (yet)
    policy.retire("g2", "its backend crashed")
    assert not router.cache_lost(*key)  # a crash is not a loss on evidence
    # one slow try seldom retires a cache, but measured and not the best, it has lost
    g3 = Candidate("g3", "ngram-cache traffic-g3", 20.0, 15.0, 27.0, kind=KIND_CACHE,
                   origin=ORIGIN_TRAFFIC_CACHE)  # fmt: skip
    policy.add_near("plain", g3, "built from 12 served request(s)")
    policy.observe("g3", 17.0)
    assert policy["g3"].active and router.cache_lost(*key)
    policy.observe("g3", 30.0)
    policy.observe("g3", 30.0)
    assert policy.best().candidate.key == "g3" and not router.cache_lost(*key)
