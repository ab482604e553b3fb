"""The adaptive policy inside `serve`, at the process boundary: fake llama-servers (a short
Python script) that report chosen timings, crash, fail to start or hold memory. Convergence,
retirement with a retry on the best, K moving outward, the memory budget and the restart from
stored evidence are checked deterministically (fixed timings, seeded policy)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections import Counter
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import httpx
import pytest

from specreg.host.machine import detect_host
from specreg.llama.config import Config
from specreg.llama.install import LlamaInstall
from specreg.runner.workload import task_prompts
from specreg.serve.adaptive import SERVE_KEY, Router
from specreg.serve.app import Service
from specreg.serve.backends import BackendPool
from specreg.serve.classify import fitted_classifier
from specreg.serve.policy import KIND_DRAFT, KIND_NGRAM, KIND_PLAIN, ORIGIN_K_OUTWARD
from specreg.serve.pooled import PooledState
from specreg.serve.probe import PROBE_TOKENS, probe_candidates
from specreg.serve.routes import (
    POLICY_ADAPTIVE,
    BackendSpec,
    CandidateRoute,
    Route,
    RouteTable,
    Target,
)
from specreg.serve.serving import run_template
from specreg.terms import TASKS

FAKE = r"""
import json, os, sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

args = sys.argv[1:]
def opt(name, default=None):
    return args[args.index(name) + 1] if name in args else default

tps = float(opt("--fake-tps", "10"))
accept = float(opt("--fake-accept", "0"))  # share of the generated tokens drafts gave
mode = opt("--fake-mode", "ok")
log = opt("--fake-log")  # every POST's path and body, a JSON line each
hold = bytearray(b"x" * (int(opt("--fake-mem", "0")) << 20))  # resident: written pages
if mode == "no-start":
    print("E main: failed to load model '/models/broken.gguf'", file=sys.stderr, flush=True)
    sys.exit(1)
served = 0

class H(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass
    def reply(self, code, body):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
    def do_GET(self):
        if self.path == "/health":
            self.reply(200, {"status": "ok"})
        elif self.path == "/slots":
            self.reply(200, [{"id": 0, "speculative": True}])
        else:
            self.reply(404, {"error": {"message": "no"}})
    def do_POST(self):
        global served
        n = int(self.headers.get("content-length", 0))
        data = self.rfile.read(n)
        if log:
            with open(log, "a") as f:
                f.write(json.dumps({"path": self.path, "body": json.loads(data)}) + "\n")
        served += 1
        if mode == "crash":
            print("E ggml_abort: fake crash", file=sys.stderr, flush=True)
            os._exit(134)
        timings = {"prompt_n": 5, "prompt_ms": 5.0, "predicted_n": 24,
                   "predicted_ms": 24000.0 / tps, "predicted_per_second": tps}
        if accept > 0:  # as llama-server: the draft figures only when something was drafted
            timings.update(draft_n=int(48 * accept), draft_n_accepted=int(24 * accept))
        self.reply(200, {
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                         "finish_reason": "length"}],
            "timings": timings,
        })

ThreadingHTTPServer(("127.0.0.1", int(opt("--port"))), H).serve_forever()
"""

INSTALL = LlamaInstall(Path("/nonexistent"), "test", "0 (test)", "spec-type", (), ())
TARGET = Target("tiny", "f" * 32, "/models/tiny.gguf")


def backend(fake: Path, name: str, config: Config, *flags: str) -> BackendSpec:
    """A fake llama-server; a speculative one reports that drafts gave half its tokens."""
    if config.speculative and "--fake-accept" not in flags:
        flags = (*flags, "--fake-accept", "0.5")
    return BackendSpec(
        name=name, target=TARGET, config=config, draft_id=None, draft_path=None,
        prefix=(sys.executable,), binary=str(fake), flags=flags,
    )  # fmt: skip


def cand(b: BackendSpec, kind: str, prior: float, *, family: str | None = None,
         reserve: bool = False) -> CandidateRoute:  # fmt: skip
    return CandidateRoute(
        "tiny", "code", b.name, b.name, kind, family, b.config.k, prior, prior / 1.6,
        prior * 1.6, 0.8, "recommend", reserve,
    )  # fmt: skip


def table(backends: list[BackendSpec], cands: list[CandidateRoute]) -> RouteTable:
    routes = tuple(
        Route("tiny", task, backends[0].name, "plain", "recommended", "test") for task in TASKS
    )
    return RouteTable((TARGET,), routes, tuple(backends), policy=POLICY_ADAPTIVE,
                      candidates=tuple(cands))  # fmt: skip


Body = Callable[[httpx.AsyncClient, Service], Awaitable[Any]]


def serve(tmp_path: Path, t: RouteTable, body: Body, *, budget: int | None = None,
          router: Router | None = None, recorder: Any = None,
          pooled: PooledState | None = None) -> Any:  # fmt: skip
    async def main() -> Any:
        pool = BackendPool(t, env=dict(os.environ), logs=tmp_path / "logs", memory_budget=budget,
                           lazy=True, startup_timeout=30)  # fmt: skip
        service = Service(
            t, pool, fitted_classifier(),
            templates={b.name: run_template(b, INSTALL, detect_host()) for b in t.backends},
            router=router or Router(t, seed=0), recorder=recorder, ready_timeout=30,
            pooled=pooled,
        )  # fmt: skip
        await pool.start([t.routes[0].backend])
        await service.open()
        transport = httpx.ASGITransport(app=service.app)
        try:
            async with httpx.AsyncClient(transport=transport, base_url="http://serve") as client:
                return await body(client, service)
        finally:
            await service.close()
            await pool.stop()

    return asyncio.run(main())


async def ask(client: httpx.AsyncClient, text: str = "hi") -> httpx.Response:
    return await client.post(
        "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": text}], "max_tokens": 24},
        headers={"X-Specreg-Task": "code"},
    )


@pytest.fixture
def fake(tmp_path: Path) -> Path:
    path = tmp_path / "fake-llama-server.py"
    path.write_text(FAKE)
    return path


def test_it_converges_and_the_status_shows_why(tmp_path: Path, fake: Path) -> None:
    plain = backend(fake, "plain", Config(), "--fake-tps", "20")
    ngram = backend(fake, "ngram", Config(spec_type="ngram-mod"), "--fake-tps", "34")
    t = table([plain, ngram], [cand(plain, KIND_PLAIN, 22.0), cand(ngram, KIND_NGRAM, 20.0)])

    async def body(client: httpx.AsyncClient, service: Service) -> Any:
        got = [await ask(client) for _ in range(30)]
        status = (await client.get("/v1/specreg/status")).json()
        return got, status

    got, status = serve(tmp_path, t, body)
    assert {r.status_code for r in got} == {200}
    chosen = [r.headers["x-specreg-backend"] for r in got]
    assert chosen[-10:] == ["ngram"] * 10
    assert Counter(chosen)["plain"] <= 5
    assert {r.headers["x-specreg-policy"] for r in got} <= {"explore", "exploit", "only"}
    (code,) = [x for x in status["tasks"] if x["task"] == "code"]
    assert code["choice"] == "ngram"
    assert code["why"].startswith("ngram: best posterior 3") or "only candidate" in code["why"]
    arms = {c["key"]: c for c in code["candidates"]}
    assert arms["ngram"]["requests"] == Counter(chosen)["ngram"]
    assert arms["ngram"]["posterior_lo"] < 34 < arms["ngram"]["posterior_hi"]
    assert status["kind"] == "serve-policy" and status["policy"] == "adaptive"
    # which host figure the policy's prior scatter is, and where it came from (issue 40)
    assert status["version"] == "3" and status["figures"][0].startswith("noise prior of a ")
    assert "noise floor" in status["figures"][0] and code["noise_prior"] > 0


def test_a_crash_retires_the_candidate_and_the_request_is_retried(
    tmp_path: Path, fake: Path
) -> None:
    plain = backend(fake, "plain", Config(), "--fake-tps", "20")
    broken = backend(fake, "broken", Config(spec_type="ngram-mod"), "--fake-mode", "crash")
    nostart = backend(fake, "nostart", Config(spec_type="ngram-simple"), "--fake-mode",
                      "no-start")  # fmt: skip
    # the broken ones are predicted far faster: the policy tries them first
    t = table([plain, broken, nostart], [cand(plain, KIND_PLAIN, 10.0),
              cand(broken, KIND_NGRAM, 80.0), cand(nostart, KIND_NGRAM, 70.0)])  # fmt: skip

    async def body(client: httpx.AsyncClient, service: Service) -> Any:
        got = [await ask(client) for _ in range(6)]
        return got, service.router.status().to_json(), service.pool

    got, status, pool = serve(tmp_path, t, body)
    # 1st request: one of the two fails, the retry goes to the best left (the other one),
    # which fails too: a 502 naming it. Then both are retired and plain serves.
    assert [r.status_code for r in got] == [502] + [200] * 5
    assert got[0].headers["x-specreg-policy"] == "retry"
    second = got[0].headers["x-specreg-backend"]
    message = got[0].json()["error"]["message"]
    assert message.startswith(
        "backend nostart failed to start"
        if second == "nostart"
        else "backend broken crashed during the request"
    )
    assert {r.headers["x-specreg-backend"] for r in got[1:]} == {"plain"}
    (code,) = [x for x in status["tasks"] if x["task"] == "code"]
    arms = {c["key"]: c for c in code["candidates"]}
    assert arms["broken"]["status"] == "retired"
    assert arms["broken"]["why"].startswith(
        "crashed: llama-server exited with code 134 (crash); llama.cpp's last message: "
        "ggml_abort: fake crash; log: "
    )
    assert arms["broken"]["why"].endswith("serve-broken-1.log")
    assert arms["nostart"]["status"] == "retired"
    assert "failed to start" in arms["nostart"]["why"]
    assert "failed to load model" in arms["nostart"]["why"]
    assert pool["broken"].starts == 1  # retired: never restarted


def test_k_moves_outward_to_a_reserve_k(tmp_path: Path, fake: Path) -> None:
    def d(k: int, tps: int) -> BackendSpec:
        return backend(fake, f"d{k}", Config(spec_type="ngram-mod", k=k), "--fake-tps", str(tps))

    plain = backend(fake, "plain", Config(), "--fake-tps", "10")
    d4, d8, d16, d2 = d(4, 12), d(8, 16), d(16, 26), d(2, 6)
    t = table(
        [plain, d4, d8, d16, d2],
        [cand(plain, KIND_PLAIN, 10.0), cand(d4, KIND_DRAFT, 14.0, family="d"),
         cand(d8, KIND_DRAFT, 15.0, family="d"),
         cand(d16, KIND_DRAFT, 13.0, family="d", reserve=True),
         cand(d2, KIND_DRAFT, 9.0, family="d", reserve=True)],
    )  # fmt: skip

    async def body(client: httpx.AsyncClient, service: Service) -> Any:
        got = [await ask(client) for _ in range(40)]
        return got, service.router.status().to_json()

    got, status = serve(tmp_path, t, body)
    chosen = [r.headers["x-specreg-backend"] for r in got]
    assert chosen[-10:] == ["d16"] * 10
    assert "d2" not in chosen  # the low edge never was the best
    (code,) = [x for x in status["tasks"] if x["task"] == "code"]
    arms = {c["key"]: c for c in code["candidates"]}
    assert arms["d16"]["origin"] == ORIGIN_K_OUTWARD and code["choice"] == "d16"
    assert any(e.startswith("added d16: d8 is the best of its K range") for e in code["events"])


def test_the_memory_budget_stops_the_least_recently_used(tmp_path: Path, fake: Path) -> None:
    mem = ("--fake-mem", "100")
    plain = backend(fake, "plain", Config(), "--fake-tps", "10", *mem)
    a = backend(fake, "a", Config(spec_type="ngram-mod"), "--fake-tps", "11", *mem)
    b = backend(fake, "b", Config(spec_type="ngram-simple"), "--fake-tps", "12", *mem)
    t = table([plain, a, b], [cand(plain, KIND_PLAIN, 10.0), cand(a, KIND_NGRAM, 10.0),
              cand(b, KIND_NGRAM, 10.0)])  # fmt: skip
    budget = 300 * 2**20  # two fakes (100 MiB and Python each), never three

    async def body(client: httpx.AsyncClient, service: Service) -> Any:
        most = 0
        for _ in range(24):
            assert (await ask(client)).status_code == 200
            most = max(most, sum(x.running for x in service.pool.backends.values()))
        used = [x.last_pss or 0 for x in service.pool.backends.values()]
        return most, list(service.pool.evictions), used

    most, evictions, used = serve(tmp_path, t, body, budget=budget)
    assert most == 2
    assert evictions and "(least recently used)" in evictions[0]
    assert all(100 * 2**20 < u < 150 * 2**20 for u in used)


def test_a_restart_continues_from_the_stored_evidence(tmp_path: Path, fake: Path) -> None:
    plain = backend(fake, "plain", Config(), "--fake-tps", "20")
    ngram = backend(fake, "ngram", Config(spec_type="ngram-mod"), "--fake-tps", "34")
    t = table([plain, ngram], [cand(plain, KIND_PLAIN, 22.0), cand(ngram, KIND_NGRAM, 20.0)])
    runs: list[Any] = []

    async def body(client: httpx.AsyncClient, service: Service) -> Any:
        for _ in range(20):
            await ask(client)
        return service.router.status().to_json()

    class Keep:
        def put(self, run: Any) -> None:
            runs.append(run)

    first = serve(tmp_path, t, body, recorder=Keep())
    assert len(runs) == 20 and all(r.config[SERVE_KEY]["candidate"] for r in runs)
    # the recorder's clock orders the runs; give them distinct times as the registry would
    base = datetime.now(timezone.utc)
    stored = [r.__class__(**{**r.__dict__, "started_at": base + timedelta(seconds=i)})
              for i, r in enumerate(runs)]  # fmt: skip
    again = Router(t, seed=0)
    assert again.replay(stored) == 20
    before = {c["key"]: c for c in first["tasks"][0]["candidates"]}
    after = {c["key"]: c for c in again.status().to_json()["tasks"][0]["candidates"]}
    assert after == before
    assert again.best("tiny", "code") == "ngram"


def test_a_candidate_that_drafts_nothing_retires_in_favour_of_plain(
    tmp_path: Path, fake: Path
) -> None:
    # as llama-server reports it: no draft figures at all when nothing was drafted, at the
    # speed plain has (a tie Thompson sampling alone would split for ever)
    plain = backend(fake, "plain", Config(), "--fake-tps", "20")
    idle = backend(fake, "idle", Config(spec_type="ngram-mod"), "--fake-tps", "20",
                   "--fake-accept", "0")  # fmt: skip
    t = table([plain, idle], [cand(plain, KIND_PLAIN, 20.0), cand(idle, KIND_NGRAM, 22.0)])

    async def body(client: httpx.AsyncClient, service: Service) -> Any:
        got = [await ask(client) for _ in range(16)]
        return got, service.router.status().to_json()

    got, status = serve(tmp_path, t, body)
    chosen = [r.headers["x-specreg-backend"] for r in got]
    (code,) = [x for x in status["tasks"] if x["task"] == "code"]
    arms = {c["key"]: c for c in code["candidates"]}
    assert arms["idle"]["status"] == "retired" and arms["idle"]["requests"] == 3
    assert "0 accepted draft token(s) of 72 generated in 3 request(s)" in arms["idle"]["why"]
    last = max(i for i, c in enumerate(chosen) if c == "idle")
    assert last < 8 and chosen[last + 1 :] == ["plain"] * (15 - last), chosen
    assert code["choice"] == "plain"


def test_a_pooled_state_backend_reads_the_traffic_sent_elsewhere(
    tmp_path: Path, fake: Path
) -> None:
    # ngram-mod drafts from a pool of everything its server read: before each request it
    # serves, it reads the requests plain served since (one token generated per catch-up), and
    # its drafts are judged by the idle rule only once it has read WARM_TEXTS of them
    log = tmp_path / "ngram.jsonl"
    plain = backend(fake, "plain", Config(), "--fake-tps", "20")
    ngram = backend(fake, "ngram", Config(spec_type="ngram-mod"), "--fake-tps", "20",
                    "--fake-accept", "0", "--fake-log", str(log))  # fmt: skip
    t = table([plain, ngram], [cand(plain, KIND_PLAIN, 20.0), cand(ngram, KIND_NGRAM, 22.0)])
    state = PooledState(warm=4)

    async def body(client: httpx.AsyncClient, service: Service) -> Any:
        got = [await ask(client, f"prompt number {i}") for i in range(16)]
        return got, (await client.get("/v1/specreg/status")).json()

    got, status = serve(tmp_path, t, body, pooled=state)
    chosen = [r.headers["x-specreg-backend"] for r in got]
    posts = [json.loads(line) for line in log.read_text().splitlines()]
    # what the ngram backend was sent, in order: catch-ups, then the requests it served
    served_here = [p["body"]["messages"][0]["content"] for p in posts if "messages" in p["body"]]
    assert served_here == [f"prompt number {i}" for i, b in enumerate(chosen) if b == "ngram"]
    read = " ".join(p["body"]["prompt"] for p in posts if p["path"] == "/completion")
    last = max(i for i, b in enumerate(chosen) if b == "ngram")
    for i, b in enumerate(chosen):
        # every request plain served before ngram's last one was read by ngram, once
        if b == "plain" and i < last:
            assert read.count(f"prompt number {i}\n") == 1, (i, chosen)
        elif b == "plain":
            assert f"prompt number {i}\n" not in read, (i, chosen)
    assert all(p["body"]["n_predict"] == 1 for p in posts if p["path"] == "/completion")
    (code,) = [x for x in status["tasks"] if x["task"] == "code"]
    arms = {c["key"]: c for c in code["candidates"]}
    # retired by the idle rule on its third warm request: at the start of request i it has
    # read the i requests before it (the backlog holds them all), so it is warm from i = 4
    warm = [i for i, b in enumerate(chosen) if b == "ngram" and i >= state.warm]
    assert arms["ngram"]["status"] == "retired", arms
    assert len(warm) == 3 and warm[-1] == last, chosen
    assert any(b == "ngram" for b in chosen[: state.warm]), chosen  # cold ones were served
    assert "in 3 request(s)" in arms["ngram"]["why"] and arms["ngram"]["generated"] == 72
    shown = status["pooled_state"]
    assert shown["fed_texts"] == read.count("prompt number ") == last - (len(served_here) - 1)
    assert shown["texts_read"]["ngram"] == last + 1 and shown["failures"] == 0


def test_a_crash_is_reported_for_the_process_that_crashed_after_a_restart(
    tmp_path: Path, fake: Path
) -> None:
    """The supervisor may restart a crashed backend before the broken request asks how its
    process ended: the answer is the crashed process's exit, not the new one's 'running'."""
    spec = backend(fake, "plain", Config(), "--fake-mode", "crash")
    t = table([spec], [cand(spec, KIND_PLAIN, 10.0)])

    async def main() -> tuple[str | None, str | None]:
        pool = BackendPool(t, env=dict(os.environ), logs=tmp_path / "logs", startup_timeout=30)
        try:
            b = pool.backends["plain"]
            await b.start()
            crashed = b.server
            async with httpx.AsyncClient() as client:
                with pytest.raises(httpx.HTTPError):  # the fake exits without an answer
                    await client.post(b.url + "/v1/chat/completions", json={})
            await b.start()  # what the supervisor does meanwhile
            assert b.server is not crashed and b.exit_code() is None
            return await b.crash_report(crashed), await b.crash_report(b.server, wait=0.2)
        finally:
            await pool.stop()

    old, new = asyncio.run(main())
    assert old is not None and old.startswith("llama-server exited with code 134")
    assert "ggml_abort: fake crash" in old
    assert new is None


def test_candidates_that_fit_start_before_the_first_request(tmp_path: Path, fake: Path) -> None:
    """Each candidate the memory budget holds beside the others is loaded at start (exploring
    it then costs its requests, not its loading); one that does not fit, or fails to start,
    waits for a request that needs it, and serve still starts."""
    mem = ("--fake-mem", "100")
    plain = backend(fake, "plain", Config(), "--fake-tps", "10", *mem)
    a = backend(fake, "a", Config(spec_type="ngram-mod"), "--fake-tps", "11", *mem)
    b = backend(fake, "b", Config(spec_type="ngram-simple"), "--fake-tps", "12", *mem)
    broken = backend(fake, "broken", Config(spec_type="ngram-map-k"), "--fake-mode", "no-start")
    t = table([plain, a, b, broken], [cand(x, KIND_NGRAM, 10.0) for x in (plain, a, b, broken)])

    def started(budget: int | None) -> tuple[list[str], list[str]]:
        async def body(client: httpx.AsyncClient, service: Service) -> Any:
            extra = await service.pool.prestart(x.name for x in t.backends)
            running = [n for n, x in service.pool.backends.items() if x.running]
            return extra, running

        got: tuple[list[str], list[str]] = serve(tmp_path, t, body, budget=budget)
        return got

    assert started(None) == (["a", "b"], ["plain", "a", "b"])
    # two fakes (100 MiB and Python each) fit, never three: nothing is stopped to make room
    assert started(300 * 2**20) == (["a"], ["plain", "a"])


def test_a_backend_added_while_serving_starts_ahead_of_its_first_request(
    tmp_path: Path, fake: Path
) -> None:
    """A traffic cache's backend joins while serving (`BackendPool.start_ahead`): it loads in
    the background when the memory budget holds it, a request that needs it meanwhile waits
    for that one start (not a second process), and one that does not fit waits for a request."""
    mem = ("--fake-mem", "200")
    plain = backend(fake, "plain", Config(), "--fake-tps", "10", *mem)
    cache = backend(fake, "cache", Config(spec_type="ngram-cache"), "--fake-tps", "12", *mem)
    t = table([plain], [cand(plain, KIND_PLAIN, 10.0)])

    def added(budget: int | None) -> tuple[bool, bool, int]:
        async def body(client: httpx.AsyncClient, service: Service) -> Any:
            joined = service.pool.add(cache)
            service.pool.start_ahead(cache.name)
            loading = joined.starting is not None
            await service.pool.ensure(joined, 30)  # a request that chose it
            return loading, joined.running, joined.starts

        got: tuple[bool, bool, int] = serve(tmp_path, t, body, budget=budget)
        return got

    assert added(None) == (True, True, 1)
    # beside plain (200 MiB and Python), a second fake does not fit 300 MiB: it starts when a
    # request needs it, after plain (idle) makes room
    assert added(300 * 2**20) == (False, True, 1)


def plain_draft_ngram(
    fake: Path, tps: tuple[int, int, int], priors: tuple[float, float, float], *draft_flags: str
) -> RouteTable:
    """Plain decoding, a draft and an n-gram lookup of one target, each a fake at its `tps`
    (draft_flags: the draft's own fake options) with the recommender's prediction `priors`."""
    configs = (Config(), Config(spec_type="draft-simple", k=4), Config(spec_type="ngram-mod"))
    names, kinds = ("plain", "draft", "ngram"), (KIND_PLAIN, KIND_DRAFT, KIND_NGRAM)
    made = [backend(fake, n, c, "--fake-tps", str(x), *(draft_flags if n == "draft" else ()))
            for n, c, x in zip(names, configs, tps, strict=True)]  # fmt: skip
    cands = [cand(b, kind, prior, family="d" if kind == KIND_DRAFT else None)
             for b, kind, prior in zip(made, kinds, priors, strict=True)]  # fmt: skip
    return table(made, cands)


def test_each_candidate_is_probed_before_serving_and_a_losing_draft_serves_no_one(
    tmp_path: Path, fake: Path
) -> None:
    """The prior says the draft is a little faster than plain; it decodes at a third of plain's
    speed. Probed at start, it never costs a user's request. A lookup (its state outlives a
    request) is not probed, and a candidate with evidence is not probed again."""
    calls = tmp_path / "draft-calls.jsonl"
    t = plain_draft_ngram(fake, (30, 10, 29), (10.0, 11.0, 9.0), "--fake-log", str(calls))
    router = Router(t, seed=0)

    async def body(client: httpx.AsyncClient, service: Service) -> Any:
        await service.pool.prestart(x.name for x in t.backends)
        probed = await probe_candidates(router, service.pool.backends)
        again = await probe_candidates(router, service.pool.backends)
        got = [await ask(client, f"request {i}") for i in range(12)]
        return probed, again, got

    probed, again, got = serve(tmp_path, t, body, router=router)
    assert [(p.backend, p.tps) for p in probed] == [("plain", 30.0), ("draft", 10.0)]
    assert probed[1].drafts() == (24, 12, 24)
    assert again == []
    (call,) = [json.loads(line) for line in calls.read_text().splitlines()][:1]
    assert call["body"]["max_tokens"] == PROBE_TOKENS and call["body"]["temperature"] == 0
    assert call["body"]["messages"][0]["content"] == task_prompts("code")[0].text
    chosen = [r.headers["x-specreg-backend"] for r in got]
    assert set(chosen) <= {"plain", "ngram"} and "plain" in chosen, chosen
    code = router.policy("tiny", "code")
    assert code is not None and code["draft"].requests == 1  # the probe, nothing since
    assert code["ngram"].requests == chosen.count("ngram")  # users' requests only


def test_a_request_joins_only_a_candidate_about_as_fast_as_its_own(
    tmp_path: Path, fake: Path
) -> None:
    """Busy cores let a request join another lossless backend of its target, but not one the
    policy knows to decode at a third of the chosen one's speed: starting sooner there loses
    more than the wait."""
    t = plain_draft_ngram(fake, (30, 10, 28), (30.0, 30.0, 30.0))
    router = Router(t, seed=0)
    for _ in range(4):
        for name, tps in (("plain", 30.0), ("draft", 10.0), ("ngram", 28.0)):
            router.observe("tiny", "code", name, tps, 1)

    async def body(client: httpx.AsyncClient, service: Service) -> Any:
        await service.pool.prestart(x.name for x in t.backends)
        pool = service.pool
        return (
            service.alternatives("tiny", "code", pool["plain"]),
            service.alternatives("tiny", "code", pool["draft"]),
        )

    from_plain, from_draft = serve(tmp_path, t, body, router=router)
    assert from_plain == ["ngram"]
    assert from_draft == ["plain", "ngram"]  # a faster one always serves it
    assert router.joinable("tiny", "code", "plain") == ["ngram"]
    # a lookup retired as idle on this task (it found nothing to draft) decodes as plain does:
    # still one to join; a candidate retired as slower is not
    code = router.policy("tiny", "code")
    assert code is not None
    for _ in range(3):
        router.observe("tiny", "code", "ngram", 29.0, 1, drafted=0, accepted=0, generated=96)
    assert code["ngram"].idle and not code["ngram"].active
    assert not code["draft"].active and not code["draft"].idle
    assert router.joinable("tiny", "code", "plain") == ["ngram"]
