"""The OpenAI-compatible front: classify, route, forward, record.

Endpoints: POST /v1/chat/completions and /v1/completions (streaming or not), GET /v1/models,
GET /health, and GET /specreg/routes and /specreg/backends for people and tests. A request's
body is forwarded byte for byte to the chosen backend and the backend's answer is returned
byte for byte, with the route added as `X-Specreg-*` headers; the backend's `timings` (with
`draft_n` / `draft_n_accepted`) are read from the answer and the request is recorded as a run.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import math
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Any

import aiohttp
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route as HttpRoute

from specreg.errors import UsageError
from specreg.jsonout import plain
from specreg.llama.server import LlamaServer
from specreg.registry.run_store import STATUS_FAILED, STATUS_OK, PromptRecord, RunRecord
from specreg.serve.adaptive import (
    REASON_FIXED,
    REASON_JOINED,
    REASON_RETRY,
    SERVE_KEY,
    Lookups,
    Pick,
    Router,
    finite,
)
from specreg.serve.backends import Backend, BackendPool, BackendUnavailable
from specreg.serve.classify import TASK_HEADER, Classification, TaskClassifier, classify
from specreg.serve.cores import Grant, QueueFull
from specreg.serve.layouts import SplitLayouts
from specreg.serve.policy import PolicyStatus, Replay
from specreg.serve.pooled import CatchUp, PooledState
from specreg.serve.recorder import RunRecorder
from specreg.serve.replay import LookupReplays
from specreg.serve.routes import Route, RouteTable, Target, split_model
from specreg.serve.traffic import TrafficCaches, answer_text, delta_text, request_text
from specreg.terms import STARTUP_TIMEOUT_S, TASKS

log = logging.getLogger(__name__)

DEFAULT_MAX_BODY = 1 << 20  # bytes
READY_TIMEOUT_S = STARTUP_TIMEOUT_S  # the backends' llama-server startup
REQUEST_TIMEOUT_S = 600.0
KIND_SERVE = "serve"
HEADER_TASK = "X-Specreg-Task"
HEADER_TASK_SOURCE = "X-Specreg-Task-Source"
HEADER_BACKEND = "X-Specreg-Backend"
HEADER_CONFIG = "X-Specreg-Config"
HEADER_ROUTE = "X-Specreg-Route"
HEADER_POLICY = "X-Specreg-Policy"  # why this backend: explore | exploit | only | fixed | retry
# The backend the policy chose, when the request joined another lossless configuration of its
# target that could serve it sooner (its cores were busy with the chosen one's neighbour).
HEADER_PREFERRED = "X-Specreg-Preferred"
HEADER_QUEUED = "X-Specreg-Queued-Ms"  # how long it waited for cores
STATUS_PATH = "/v1/specreg/status"
_JSON = {"content-type": "application/json"}
# llama-server closes the connection after a streamed answer without saying so: a stream's
# connection is never kept, or the next request sent on it would find it closed.
_STREAM = {**_JSON, "connection": "close"}
# A kept-alive connection the backend closed before it read the request.
_STALE = (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError)
# The stream's last event carries `timings`; keep this much of the stream's tail to find it.
TAIL_BYTES = 64 * 1024
KEEPALIVE_S = 4.0


def error(status: int, message: str, kind: str, **extra: Any) -> JSONResponse:
    """An OpenAI-shaped error body."""
    return JSONResponse({"error": {"message": message, "type": kind, **extra}}, status)


async def _http_error(request: Request, exc: Exception) -> Response:
    """Starlette's own 404/405 (an unknown path, a wrong method) in the OpenAI error shape:
    clients parse `error.message`, and a text/plain "Not Found" breaks them."""
    status = exc.status_code if isinstance(exc, HTTPException) else 500
    if status == 404:
        message = (
            f"no endpoint {request.method} {request.url.path}: this server has POST "
            "/v1/chat/completions, POST /v1/completions, GET /v1/models, GET /health"
        )
        return error(404, message, "invalid_request_error", code="unknown_url")
    detail = exc.detail if isinstance(exc, HTTPException) else "error"
    resp = error(status, f"{request.method} {request.url.path}: {detail}", "invalid_request_error")
    if isinstance(exc, HTTPException) and exc.headers:
        resp.headers.update(exc.headers)
    return resp


class TooLarge(Exception):
    pass


class KeyCheck:
    """Only clients with a key get in (`serve --api-key`): `Authorization: Bearer KEY`, as the
    OpenAI clients send it, or `X-Api-Key`. /health stays open for load balancers."""

    OPEN = ("/health",)

    def __init__(self, app: Any, keys: frozenset[str]):
        self.app = app
        self.keys = tuple(k.encode() for k in keys)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] not in self.OPEN:
            given = self._given(dict(scope.get("headers") or ()))
            # compare with every key, whichever matches: the time says nothing of the keys
            if not sum(hmac.compare_digest(given, k) for k in self.keys):
                what = "a wrong API key" if given else "no API key"
                refused = error(
                    401,
                    f"{what}: send Authorization: Bearer KEY with a key this server was "
                    "started with (serve --api-key)",
                    "invalid_request_error",
                    code="invalid_api_key",
                )
                refused.headers["WWW-Authenticate"] = "Bearer"
                await refused(scope, receive, send)
                return
        await self.app(scope, receive, send)

    @staticmethod
    def _given(headers: dict[bytes, bytes]) -> bytes:
        auth = headers.get(b"authorization", b"").strip()
        if auth[:7].lower() == b"bearer ":
            return auth[7:].strip()
        return headers.get(b"x-api-key", b"").strip()


class Service:
    """What a running `serve` holds; `app` is the ASGI application."""

    def __init__(
        self,
        table: RouteTable,
        pool: BackendPool,
        classifier: TaskClassifier,
        *,
        templates: Mapping[str, RunRecord],
        recorder: RunRecorder | None = None,
        router: Router | None = None,
        traffic: TrafficCaches | None = None,
        pooled: PooledState | None = None,
        max_body: int = DEFAULT_MAX_BODY,
        ready_timeout: float = READY_TIMEOUT_S,
        request_timeout: float = REQUEST_TIMEOUT_S,
        keys: frozenset[str] = frozenset(),
    ):
        self.table = table
        self.pool = pool
        self.classifier = classifier
        self.templates = templates
        self.recorder = recorder
        self.router = router or Router(table)
        # where a configuration runs at a load: its full instance, or a split's replica
        self.layouts = SplitLayouts(table.replicas)
        # Requests' texts are kept (in their runs) only to grow lookup caches from them.
        self.traffic = traffic
        # Backends with pooled n-gram state read the traffic routed elsewhere (serve.pooled).
        self.pooled = pooled
        # ngram-mod candidates judged on the requests others served (serve.replay)
        self.replays = LookupReplays(self.router) if self.router.adaptive else None
        if self.router.adaptive:
            pool.on_crash = self._retires
        self.inflight: set[_Call] = set()
        # Work of serve's own on the same cores (a traffic cache's build): it counts as one
        # more request in flight for every request it overlaps.
        self.neighbours = 0
        self.max_body = max_body
        self.ready_timeout = ready_timeout
        self.request_timeout = request_timeout
        self.client: aiohttp.ClientSession | None = None
        self.app = Starlette(
            routes=[
                HttpRoute("/v1/chat/completions", self.completions, methods=["POST"]),
                HttpRoute("/v1/completions", self.completions, methods=["POST"]),
                HttpRoute("/v1/models", self.models, methods=["GET"]),
                HttpRoute("/health", self.health, methods=["GET"]),
                HttpRoute("/specreg/routes", self.routes, methods=["GET"]),
                HttpRoute("/specreg/backends", self.backends, methods=["GET"]),
                HttpRoute(STATUS_PATH, self.status, methods=["GET"]),
            ],
            exception_handlers={HTTPException: _http_error},
            middleware=[Middleware(KeyCheck, keys=keys)] if keys else [],
        )

    def _retires(self, backend: Backend, why: str) -> bool:
        """Whether a crashed backend is retired rather than restarted: a candidate is (unless
        a policy has no other); a split replica is restarted (its configuration is the
        policy's to judge, on the full instance)."""
        return not self.layouts.is_replica(backend.name) and self.router.retire(backend.name, why)

    def choose(self, target: str, task: str) -> Pick:
        """Where a request of (target, task) goes: the policy's configuration at the load it
        meets, on the layout serve.layouts says for that load (the full instance, or the
        replica of it with the fewest requests in flight)."""
        load = self.load_of(target)
        pick = self.router.choose(target, task, load=load)
        usable = {name: b.assigned for name, b in self.pool.backends.items() if not b.failure}
        placed = self.layouts.place(pick.backend, load, usable)
        return pick if placed == pick.backend else replace(pick, backend=placed)

    def count_concurrency(self) -> None:
        """Every request in flight ran alongside the others decoding on its cores (the
        scheduler lets nothing else decode there) and serve's own work."""
        sched = self.pool.scheduler
        for call in self.inflight:
            mine = call.backend.name
            n = sum(sched.share_cores(mine, c.backend.name) for c in self.inflight)
            call.concurrency = max(call.concurrency, n + self.neighbours)

    def load_of(self, target: str) -> int:
        """The load a new request of `target` would meet: the requests decoding on its
        backends' cores and waiting for them, plus itself."""
        sched = self.pool.scheduler
        names = [b.name for b in self.pool.backends.values() if b.spec.target.name == target]
        busy = max((sched.load(n) for n in names), default=0)
        return busy + sched.waiting + self.neighbours + 1

    def alternatives(self, target: str, task: str, chosen: Backend) -> list[str]:
        """Backends a request may join instead of `chosen` when they serve it sooner: other
        lossless configurations of its target (speculation never changes what is generated;
        fewer experts would, so it is never substituted), running and ready, the policy's
        ranking first; under the adaptive policy only its candidates at least JOIN_SHARE as
        fast as `chosen` at the load. A request on a split replica joins only another
        replica: the load it met chose the split, and joining a full instance's free slot
        would keep the full instance busy and the split idle for as long as the load lasts."""
        if chosen.spec.config.experts is not None:
            return []
        split = self.layouts.is_replica(chosen.name)
        # the adaptive policy's candidates fast enough at this load, else (fixed, replicas)
        # any lossless backend, the policy's ranking first
        allowed = None if split else self.router.joinable(
            target, task, chosen.name, load=self.load_of(target))  # fmt: skip
        ranked = allowed if allowed is not None else self.router.ranked(target, task)
        same = [
            b for b in self.pool.backends.values()
            if b is not chosen and b.spec.target.name == target and b.ready.is_set()
            and b.spec.config.experts is None and not b.failure
            and (not split or self.layouts.is_replica(b.name))
            and (allowed is None or b.name in allowed)
        ]  # fmt: skip
        order = {name: i for i, name in enumerate(ranked)}
        return [b.name for b in sorted(same, key=lambda b: order.get(b.name, len(order)))]

    def neighbour(self, started: bool) -> None:
        """Serve's own work on the cores started or ended (on the event loop's thread)."""
        self.neighbours = max(self.neighbours + (1 if started else -1), 0)
        self.count_concurrency()

    async def open(self) -> None:
        # aiohttp's client costs a quarter of httpx's per request (0.12 vs 0.44 ms measured
        # against llama-server here), which is most of what serve adds to a request.
        self.client = aiohttp.ClientSession(
            # No limit on a whole (streamed) answer; a backend silent this long has hung.
            timeout=aiohttp.ClientTimeout(total=None, connect=10.0, sock_read=self.request_timeout),
            # llama-server closes a connection idle for 5 s: never reuse one that old.
            connector=aiohttp.TCPConnector(limit=512, keepalive_timeout=KEEPALIVE_S),
            auto_decompress=False,
        )

    async def close(self) -> None:
        if self.replays is not None:
            await self.replays.drain()  # their requests' runs are recorded when they end
        if self.client is not None:
            await self.client.close()

    # -- small endpoints ----------------------------------------------------------------------

    async def models(self, request: Request) -> Response:
        return JSONResponse(
            {
                "object": "list",
                "data": [
                    {"id": t.name, "object": "model", "owned_by": "specreg", "created": 0}
                    for t in self.table.targets
                ],
            }
        )

    async def health(self, request: Request) -> Response:
        states = self.pool.status(memory=False)
        if self.pool.lazy:
            # Backends start when the policy first chooses them and a retired one stays
            # down: healthy when each (target, task)'s current choice can serve.
            wanted = {self.router.best(t.name, task) for t in self.table.targets for task in TASKS}
            ok = all(
                b.ready.is_set()
                for b in self.pool.backends.values()
                if b.name in wanted
                and (b.server is not None or b.failure or b.restarting or b.starting)
            )
        else:
            ok = all(s.ready for s in states)
        body = {
            "status": "ok" if ok else "degraded",
            "backends": [{"name": s.name, "ready": s.ready, "starts": s.starts} for s in states],
        }
        return JSONResponse(body, 200 if ok else 503)

    async def routes(self, request: Request) -> Response:
        return JSONResponse(self.table.to_json())

    async def backends(self, request: Request) -> Response:
        return JSONResponse({"backends": plain(self.pool.status())})

    def policy_status(self) -> PolicyStatus:
        """The policy per target and task, with the backends and the memory budget."""
        status = self.router.status()
        status = replace(status, tasks=tuple(self.layouts.annotate(t) for t in status.tasks))
        extra = {
            "memory_budget": self.pool.memory_budget,
            "memory_used": self.pool.used(),
            "evictions": list(self.pool.evictions),
            "cores": {
                **self.pool.scheduler.to_json(),
                "overlapping_grants": len(self.pool.scheduler.overlaps_seen()),
            },
            "traffic_caches": self.traffic.to_json() if self.traffic is not None else None,
            "pooled_state": self.pooled.to_json() if self.pooled is not None else None,
            "lookup_replays": self.replays.to_json() if self.replays is not None else None,
            "layouts": self.layouts.to_json(),
            "backends": [
                {
                    "name": b.name,
                    "running": b.running,
                    "ready": b.ready.is_set(),
                    "starts": b.starts,
                    "pss": b.last_pss,
                    "failure": b.failure,
                }  # fmt: skip
                for b in self.pool.backends.values()
            ],
        }
        return replace(status, extra=extra)

    async def status(self, request: Request) -> Response:
        return JSONResponse(self.policy_status().to_json())

    # -- the proxy ----------------------------------------------------------------------------

    async def _body(self, request: Request) -> bytes:
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body:
            raise TooLarge
        data = bytearray()
        async for chunk in request.stream():
            data += chunk
            if len(data) > self.max_body:
                raise TooLarge
        return bytes(data)

    async def _read(self, request: Request) -> _Asked | Response:
        """The request's body, its target and its task, or the error answer that says why
        there are none (413, 499, 400, 404)."""
        try:
            raw = await self._body(request)
        except TooLarge:
            return error(
                413,
                f"request body larger than {self.max_body} bytes (serve --max-body)",
                "request_too_large",
            )
        except ClientDisconnect:
            return Response(status_code=499)
        try:
            body = json.loads(raw)
        except ValueError:
            return error(400, "the body is not JSON", "invalid_request_error")
        if not isinstance(body, dict):
            return error(400, "the body must be a JSON object", "invalid_request_error")
        named = body.get("model")
        model, model_task = split_model(named if isinstance(named, str) else None)
        target = self.table.find_target(model)
        if target is None:
            names = ", ".join(t.name for t in self.table.targets)
            what = f"unknown model {model!r}" if model else "no model named"
            return error(
                404, f"{what}: this server has {names}", "invalid_request_error",
                code="model_not_found", param="model",
            )  # fmt: skip
        header = request.headers.get(TASK_HEADER)
        try:
            cls = classify(self.classifier, body, header=header, model_task=model_task)
        except UsageError as err:
            return error(400, str(err), "invalid_request_error")
        return _Asked(raw, body, target, cls)

    async def completions(self, request: Request) -> Response:
        t0 = time.perf_counter()
        started = datetime.now(timezone.utc)
        asked = await self._read(request)
        if isinstance(asked, Response):
            return asked
        raw, body, target, cls = asked.raw, asked.body, asked.target, asked.cls
        route = self.table.route(target.name, cls.task)
        pick = self.choose(target.name, cls.task)
        for attempt in (1, 2):
            backend = self.pool[pick.backend]
            headers = {
                HEADER_TASK: cls.task,
                HEADER_TASK_SOURCE: cls.source,
                HEADER_BACKEND: backend.name,
                HEADER_CONFIG: backend.spec.config.label,
                HEADER_ROUTE: route.source,
                HEADER_POLICY: pick.reason,
            }
            call = _Call(self, route, backend, cls, body, raw, started, t0, request.url.path,
                         target=target.name, pick=pick, attempt=attempt)  # fmt: skip
            call.claim()
            try:
                await self.pool.ensure(backend, self.ready_timeout)
            except BackendUnavailable as err:
                retry = self._retry_after(call, str(err)) if attempt == 1 else None
                if retry is not None:
                    pick = retry
                    continue
                status = 503 if attempt == 1 else 502
                call.record(None, status, str(err), "unavailable")
                kind = "backend_unavailable" if status == 503 else "backend_error"
                refused = error(status, str(err), kind, backend=backend.name)
                refused.headers.update(headers)
                return refused
            got = await self._cores(call, request, headers)
            if isinstance(got, Response):
                return got
            backend = call.backend
            call.position = backend.answered
            backend.answered += 1
            if body.get("stream"):
                return await call.stream(headers)
            resp = await call.forward(headers)
            if call.crashed is None or attempt == 2:
                return resp
            retry = self._retry_after(call, call.crashed, recorded=True)
            if retry is None:
                return resp
            pick = retry
        raise AssertionError("unreachable: the second attempt returns")

    async def _cores(
        self, call: _Call, request: Request, headers: dict[str, str]
    ) -> Grant | Response:
        """Wait for cores on the chosen backend, or a lossless alternative that can serve
        sooner; a 503 with Retry-After when the queue is full, a 499 when the client went
        away while it waited."""
        chosen = call.backend
        names = [chosen.name, *self.alternatives(call.target, call.cls.task, chosen)]
        try:
            grant = await _unless_gone(request, self.pool.scheduler.acquire(names))
        except QueueFull as err:
            call.record(None, 503, str(err), "capacity")
            refused = error(503, str(err), "server_overloaded", backend=chosen.name)
            refused.headers.update(headers)
            refused.headers["Retry-After"] = str(math.ceil(err.retry_after))
            return refused
        except _ClientGone as gone:
            if isinstance(gone, _GoneWith):  # granted as the client went: give it back
                self.pool.scheduler.release(gone.grant)
            call.record(None, 499, "the client went away while it waited for cores", "client")
            return Response(status_code=499)
        call.grant = grant
        call.concurrency = max(call.concurrency, grant.load + self.neighbours)
        headers[HEADER_QUEUED] = f"{grant.queued_s * 1000:.0f}"
        if grant.backend != chosen.name:
            call.move(self.pool[grant.backend])
            headers[HEADER_PREFERRED] = chosen.name
            headers[HEADER_BACKEND] = grant.backend
            headers[HEADER_CONFIG] = call.backend.spec.config.label
            headers[HEADER_POLICY] = REASON_JOINED
        return grant

    def _retry_after(self, call: _Call, why: str, *, recorded: bool = False) -> Pick | None:
        """After a candidate failed: retire it (adaptive policy) and name the current best to
        retry on; under the fixed policy, after a crash (`recorded`: the attempt is recorded
        already), another lossless backend of the target that is running, else the same
        configuration once its process has been started again. None when there is nothing to
        try. A failed attempt not yet recorded is recorded as a failed run with the reason.
        A split replica is never retired: the request is retried on its configuration's full
        instance (a replica that failed to start is left out from then on; one that crashed
        is restarted)."""
        backend = call.backend
        full = self.layouts.full_of(backend.name)
        if full is not None:
            if not recorded:
                call.record(None, 502, why, "unavailable")
            return Pick(full, REASON_RETRY, full)
        if not self.router.adaptive:
            if not recorded:
                return None  # not ready (or down): the fixed route has no other candidate
            others = self.alternatives(call.target, call.cls.task, backend)
            again = others[0] if others else backend.name
            if backend.failure and again == backend.name:
                return None  # given up (or it dies by SIGILL): the same process would fail too
            return Pick(again, REASON_RETRY, again)
        done = self.router.retire(backend.name, f"failed: {why}")
        if done:
            backend.failure = backend.failure or f"retired: {why}"
        call.retired = why
        best = self.router.best(call.target, call.cls.task)
        if best == backend.name:
            return None
        if not recorded:
            call.record(None, 502, why, "unavailable")
        return Pick(best, REASON_RETRY, best)


@dataclass(frozen=True)
class _Asked:
    """A request read and understood: its bytes, its JSON, its target and its task."""

    raw: bytes
    body: dict[str, Any]
    target: Target
    cls: Classification


@dataclass(eq=False)  # identity: calls in flight are kept in a set
class _Call:
    """One request on its way through a backend."""

    service: Service
    route: Route
    backend: Backend
    cls: Classification
    body: dict[str, Any]
    raw: bytes
    started: datetime
    t0: float
    path: str
    target: str = ""
    pick: Pick | None = None
    attempt: int = 1
    position: int = 0  # requests the backend's process had been sent before this one
    concurrency: int = 1  # the most requests in flight at once while this one was
    crashed: str | None = None  # why the backend broke during the request
    died: bool = False  # ... and whether its process ended (else only the connection broke)
    retired: str | None = None  # why the policy retired the candidate after this request
    streamed: list[str] | None = None  # a stream's text so far (when texts are kept)
    process: LlamaServer | None = None  # the backend's process this request was sent to
    caught_up: CatchUp | None = None  # texts a pooled-state backend read before this request
    warm: bool | None = None  # ... and whether it had read enough of them (None: not pooled)
    grant: Grant | None = None  # its time on the backend's cores (the scheduler's)
    _claimed: bool = False  # counted in its backend's `assigned`
    _live: bool = False
    _recorded: bool = False

    def claim(self) -> None:
        """Count it against its backend until it ends (Backend.assigned)."""
        self.backend.assigned += 1
        self._claimed = True

    def move(self, backend: Backend) -> None:
        """It runs on `backend` instead: it joined a lossless alternative that was free."""
        if self._claimed:
            self.backend.assigned -= 1
            backend.assigned += 1
        self.backend = backend

    def begin(self) -> None:
        """Count this request as decoding (with every other one in flight: same cores)."""
        live = self.service.inflight
        live.add(self)
        self.service.count_concurrency()
        self.backend.inflight += 1
        self.process = self.backend.server
        self._live = True

    def end(self) -> None:
        if self._claimed:
            self.backend.assigned -= 1
            self._claimed = False
        if self._live:
            self.service.inflight.discard(self)
            self.backend.inflight -= 1
            self._live = False
        if self.grant is not None:
            self.service.pool.scheduler.release(self.grant)
            self.service.count_concurrency()

    @property
    def client(self) -> aiohttp.ClientSession:
        assert self.service.client is not None
        return self.service.client

    async def _broken(self, err: Exception, headers: dict[str, str]) -> Response:
        message = await self._failure_message(err)
        self.crashed = message
        if self.service.router.adaptive and self.died:
            self.retired = message  # a broken connection while its process runs is not its fault
        self.record(None, 502, message, "crash")
        resp = error(502, message, "backend_error", backend=self.backend.name)
        resp.headers.update(headers)
        return resp

    async def _failure_message(self, err: Exception) -> str:
        report = await self.backend.crash_report(self.process)
        self.died = report is not None
        if report is not None:
            if self.backend.server is self.process:  # else the supervisor has been at it
                self.service.pool.restart_soon(self.backend)  # or retire it (adaptive policy)
            return f"backend {self.backend.name} crashed during the request: {report}"
        return f"backend {self.backend.name} broke the connection: {type(err).__name__}: {err}"

    @property
    def keeps_texts(self) -> bool:
        return (
            self.service.traffic is not None
            or self.service.pooled is not None
            or bool(self._lookups())
        )

    def _lookups(self) -> Lookups:
        """The ngram-mod candidates this request, once served, is replayed for."""
        replays = self.service.replays
        if replays is None or self.pick is None:
            return {}
        return replays.wanted(self.target, self.cls.task, self.backend.name)

    async def catch_up(self) -> None:
        """A backend with pooled n-gram state first reads the target's traffic it missed."""
        state = self.service.pooled
        if state is None or not self.backend.pooled:
            return
        b = self.backend
        self.caught_up = await state.catch_up(self.client, b.url, self.target, b.name, b.starts)
        self.warm = state.is_warm(b.name, b.starts)

    async def forward(self, headers: dict[str, str]) -> Response:
        self.begin()
        await self.catch_up()
        try:
            async with await self._send(_JSON) as resp:
                data = await resp.read()
                status = resp.status
                ctype = resp.headers.get("content-type", "application/json")
        except aiohttp.ClientError as err:
            return await self._broken(err, headers)
        parsed = _loads(data)
        message = None
        if status != 200:
            message = _error_message(parsed) or data[:200].decode(errors="replace")
        self.record(parsed if isinstance(parsed, dict) else None, status, message)
        return Response(data, status_code=status, media_type=ctype, headers=headers)

    async def stream(self, headers: dict[str, str]) -> Response:
        self.begin()
        await self.catch_up()
        try:
            resp = await self._send(_STREAM)
        except aiohttp.ClientError as err:
            return await self._broken(err, headers)
        if resp.status != 200:
            try:
                data = await resp.read()
            except aiohttp.ClientError as err:
                return await self._broken(err, headers)
            finally:
                resp.release()
            message = _error_message(_loads(data)) or data[:200].decode("replace")
            self.record(None, resp.status, message)
            return Response(data, resp.status, media_type="application/json", headers=headers)
        return StreamingResponse(self._relay(resp), media_type="text/event-stream", headers=headers)

    async def _send(self, headers: dict[str, str]) -> aiohttp.ClientResponse:
        """POST the request to the backend; once more, on a connection that is not kept, when
        a kept-alive one turns out closed before the backend read it and its process runs."""
        url = self.backend.url + self.path
        try:
            return await self.client.post(url, data=self.raw, headers=headers)
        except _STALE:
            proc = self.process.proc if self.process is not None else None
            if proc is None or proc.poll() is not None:
                raise
            return await self.client.post(url, data=self.raw, headers=_STREAM)

    async def _relay(self, resp: aiohttp.ClientResponse) -> AsyncIterator[bytes]:
        tail = b""
        failure: tuple[str, str] | None = None
        keep = self.keeps_texts
        self.streamed = [] if keep else None
        line = b""  # an event line not yet complete (texts kept only)
        try:
            async for chunk in resp.content.iter_any():
                tail = (tail + chunk)[-TAIL_BYTES:]
                if keep:
                    line = self._read_events(line + chunk)
                yield chunk
        except aiohttp.ClientError as err:
            # The status line has gone out already: the failure travels as an event.
            message = await self._failure_message(err)
            failure = (message, "crash")
            event = {"error": {"message": message, "type": "backend_error"}}
            yield f"data: {json.dumps(event)}\n\n".encode()
        finally:
            resp.release()
            final = _last_event_with(tail, b'"timings"')
            if failure is not None:
                self.record(final, 502, *failure)
            elif final is None and not tail.rstrip().endswith(b"[DONE]"):
                self.record(None, 499, "the client went away before the end", "client")
            else:
                self.record(final, 200, None)

    def _read_events(self, data: bytes) -> bytes:
        """Add the text of every complete event in `data`; return the incomplete rest."""
        *whole, rest = data.split(b"\n")
        assert self.streamed is not None
        for event in whole:
            if event.startswith(b"data:"):
                parsed = _loads(event[5:].strip())
                self.streamed.append(delta_text(parsed if isinstance(parsed, dict) else None))
        return rest[-TAIL_BYTES:]

    def record(
        self,
        answer: dict[str, Any] | None,
        status: int,
        message: str | None,
        kind: str | None = None,
    ) -> None:
        self.end()
        if self._recorded:
            return
        self._recorded = True
        timings = answer.get("timings") if isinstance(answer, dict) else None
        timings = timings if isinstance(timings, dict) else {}
        tps = finite(timings.get("predicted_per_second"))
        if status == 200 and self.pick is not None:
            # as the run records them: a server that reports timings but no drafts drafted 0
            drafted = int(timings.get("draft_n", 0) or 0) if timings else None
            accepted = int(timings.get("draft_n_accepted", 0) or 0) if timings else None
            self.service.router.observe(
                self.target, self.cls.task, self.backend.name, tps, self.concurrency,
                drafted=drafted, accepted=accepted, generated=_int(timings.get("predicted_n")),
                cold=self.warm is False,
            )  # fmt: skip
        if status == 200 and self.service.pooled is not None:
            prompt_text, output_text = self.texts(answer)
            text = "\n".join(t for t in (prompt_text, output_text) if t)
            self.service.pooled.served(self.target, self.backend.name, self.backend.starts, text)
        run = None
        if self.service.recorder is not None:
            try:
                run = self._run(answer, status, message, kind)
            except Exception:  # recording must never fail a request
                log.exception("could not record a served request")
                return
        lookups, replays = self._lookups() if status == 200 else {}, self.service.replays
        prompt_text, output_text = self.texts(answer) if lookups else (None, None)
        if replays is None or not prompt_text or not output_text:
            self._put(run)
            return

        def done(got: dict[str, Replay]) -> None:
            """The replays go into the run's config[SERVE_KEY] (a restart reads them back)."""
            if run is not None:
                replayed = {k: r.to_json() for k, r in got.items()}
                info = {**run.config[SERVE_KEY], "replays": replayed}
                self._put(replace(run, config={**run.config, SERVE_KEY: info}))

        texts = (prompt_text, output_text)
        url, task = self.backend.url, self.cls.task
        replays.submit(replays.replay(self.client, url, self.target, task, texts, lookups, done))

    def _put(self, run: RunRecord | None) -> None:
        """Record the run; a traffic cache hears of its text."""
        recorder = self.service.recorder
        if recorder is None or run is None:
            return
        try:
            recorder.put(run)
        except Exception:  # recording must never fail a request
            log.exception("could not record a served request")
            return
        traffic = self.service.traffic
        if traffic is not None and run.status == STATUS_OK and run.prompts[0].output_text:
            target = self.service.table.find_target(self.target)
            if target is not None:
                traffic.note(target.name, target.model_id, target.path, self.cls.task)

    def texts(self, answer: dict[str, Any] | None) -> tuple[str | None, str | None]:
        """The request's text and the answer's, when traffic caches or pooled state keep them."""
        if not self.keeps_texts:
            return None, None
        output = "".join(self.streamed) if self.streamed is not None else answer_text(answer)
        return request_text(self.body), output or None

    def _serve_info(self) -> dict[str, Any]:
        """How serve handled the request: the policy's choice and why, the load it met, its
        wait for cores, and what a pooled-state backend read first (config[SERVE_KEY])."""
        pick, caught = self.pick, self.caught_up
        return {
            "policy": self.service.router.name,
            "target": self.target,
            "candidate": self.backend.name,
            "reason": pick.reason if pick is not None else REASON_FIXED,
            "best": pick.best if pick is not None else None,
            "attempt": self.attempt,
            "concurrency": self.concurrency,
            "queued_s": round(self.grant.queued_s, 4) if self.grant else None,
            "preferred": pick.backend
            if pick is not None and pick.backend != self.backend.name
            else None,
            "retired": self.retired,
            "warm": self.warm,
            "catch_up_texts": caught.texts if caught else None,
            "catch_up_s": round(caught.seconds, 4) if caught else None,
        }

    def _run(
        self, answer: dict[str, Any] | None, status: int, message: str | None, kind: str | None
    ) -> RunRecord:
        seconds = time.perf_counter() - self.t0
        timings = answer.get("timings") if isinstance(answer, dict) else None
        timings = timings if isinstance(timings, dict) else {}
        draft_n = int(timings.get("draft_n", 0) or 0)
        accepted = int(timings.get("draft_n_accepted", 0) or 0)
        tps = timings.get("predicted_per_second")
        choices = answer.get("choices") if isinstance(answer, dict) else None
        finish = None
        if isinstance(choices, list) and choices and isinstance(choices[0], dict):
            finish = choices[0].get("finish_reason")
        template = self.service.templates[self.backend.name]
        ok = status == 200
        # texts go into the registry only for traffic caches (--traffic-cache 0 keeps none)
        kept = ok and self.service.traffic is not None
        prompt_text, output_text = self.texts(answer) if kept else (None, None)
        prompt = PromptRecord(
            prompt_id="request",
            prompt_sha256=hashlib.sha256(self.raw).hexdigest(),
            n_samples=1,
            prompt_n=_int(timings.get("prompt_n")),
            predicted_n=_int(timings.get("predicted_n")),
            tokens_per_s=float(tps) if tps else None,
            samples_tps=(float(tps),) if tps else (),
            draft_n=draft_n if timings else None,
            draft_n_accepted=accepted if timings else None,
            stop_type=str(finish) if finish else None,
            samples_draft_n=(draft_n,) if timings else (),
            samples_draft_n_accepted=(accepted,) if timings else (),
            samples_session=(self.backend.starts,),
            samples_position=(self.position,),
            prompt_text=prompt_text,
            output_text=output_text,
        )
        temperature = self.body.get("temperature")
        seed = self.body.get("seed")
        max_tokens = self.body.get("max_tokens", self.body.get("n_predict"))
        return replace(
            template,
            status=STATUS_OK if ok else STATUS_FAILED,
            started_at=self.started,
            seconds=seconds,
            error_kind=None if ok else (kind or "request"),
            error=None if ok else f"HTTP {status}: {message or ''}".strip(),
            llama_message=None if ok else message,
            config={
                **template.config,
                "endpoint": self.path,
                "stream": bool(self.body.get("stream")),
                "task_source": self.cls.source,
                "route": self.route.source,
                "latency_ms": round(seconds * 1000, 3),
                "prompt_ms": timings.get("prompt_ms"),
                "predicted_ms": timings.get("predicted_ms"),
                SERVE_KEY: self._serve_info(),
            },
            temperature=float(temperature) if isinstance(temperature, (int, float)) else None,
            seed=int(seed) if isinstance(seed, int) else None,
            task=self.cls.task,
            n_predict=int(max_tokens) if isinstance(max_tokens, int) else None,
            tokens_per_s=float(tps) if ok and tps else None,
            draft_n=draft_n if timings else None,
            draft_n_accepted=accepted if timings else None,
            acceptance=accepted / draft_n if draft_n else None,
            speculative_active=self.backend.speculative,
            log_path=str(self.backend.log_path) if self.backend.log_path else None,
            prompts=(prompt,),
        )


class _ClientGone(Exception):
    """The client closed its connection."""


async def _unless_gone(request: Request, work: Any) -> Any:
    """`work` (an awaitable), unless the client disconnects first: then `_ClientGone`, and
    the work is cancelled (a wait for cores leaves the queue)."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        done, _ = await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        raise
    finally:
        gone.cancel()
    if task in done:
        return task.result()
    task.cancel()
    try:
        got = await task
    except (asyncio.CancelledError, Exception):
        raise _ClientGone from None
    # granted as it was cancelled: hand it back
    if isinstance(got, Grant):
        raise _GoneWith(got)
    raise _ClientGone


class _GoneWith(_ClientGone):
    def __init__(self, grant: Grant):
        super().__init__()
        self.grant = grant


async def _disconnected(request: Request) -> None:
    """Returns when the client disconnects (the body has been read: the next ASGI message is
    the disconnect)."""
    while True:
        message = await request.receive()
        if message.get("type") == "http.disconnect":
            return


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, (int, float)) else None


def _loads(data: bytes) -> Any:
    try:
        return json.loads(data)
    except ValueError:
        return None


def _error_message(parsed: Any) -> str | None:
    if isinstance(parsed, dict) and isinstance(parsed.get("error"), dict):
        return str(parsed["error"].get("message", "")) or None
    return None


def _last_event_with(stream: bytes, needle: bytes) -> dict[str, Any] | None:
    """The last server-sent event in `stream` whose data contains `needle`, parsed."""
    for line in reversed(stream.split(b"\n")):
        if line.startswith(b"data:") and needle in line:
            got = _loads(line[5:].strip())
            return got if isinstance(got, dict) else None
    return None
