"""`specreg serve` under load, against the peers, in one run (issue 39).

    python3 benchmarks/serve_load.py MODEL [--draft DRAFT] [--spec ngram-mod:16]
        [--requests 16] [--max-tokens 96] [--seed 0] [--baseline-rev d6d1a6f]
        [--prompts prompts.jsonl] [--json results.json]
    python3 benchmarks/serve_load.py --qwen     # Qwen2.5-Coder-1.5B with its 0.5B draft

Input: a JSONL of prompts with tasks ({"task": ..., "text": ...} a line; default: a seeded
stream of distinct code, prose, summarize and JSON requests), each sent once per system.
Loads, mixed tasks: closed-loop clients at 1, 2, 4 and 8 (each sends its next request when its
last is answered); an open-loop Poisson arrival rate (about 70 % of the plain peer's capacity
at four clients); and a varying load (a burst of 8 at once, then 8 single requests, twice).
Systems, one after the other (the peers fresh for each load; each serve started once, serving
every load in turn as a deployment would, its policy learning as it goes, stopped before the
next system starts):
  (a) one llama-server with -np equal to the concurrency, plain (the peer);
  (b) the same with the best single-stream speculative configuration (--spec, or draft-simple
      with --draft);
  (c) today's `serve` (the code at --baseline-rev, checked out into a temporary worktree),
      --policy fixed and --policy adaptive;
  (d) the new `serve` (as shipped: adaptive, cores scheduled, 4 slots a backend).
Every request streams; measured per request: time to first token (first content chunk), end
to end, and its decode t/s (llama-server's timings); per load: the aggregate (tokens generated
by all over the wall time), p50/p95 of both latencies. The goals printed at the end:
  - at every concurrency, (d) aggregate >= 0.95x the better of (a) and (b) there, and its p95
    end to end <= 1.1x that one's;
  - with one client, (d) >= 0.97x today's adaptive serve;
  - over the varying load, (d) >= 1.1x the best fixed configuration where the per-phase oracle
    leaves that much room.
Numbers taken while other processes load the machine are not quiet-host numbers: run it alone.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from specreg.llama.build import cached_build
from specreg.llama.process import free_port
from specreg.samples.qwen_pair import ensure_qwen_pair

sys.path.insert(0, str(Path(__file__).parent))
from serve_adaptive import stream  # noqa: E402 - a sibling benchmark's seeded prompt stream

REPO = Path(__file__).resolve().parent.parent
CTX = 4096
CONCURRENCY = (1, 2, 4, 8)


# -- the measurement --------------------------------------------------------------------------


@dataclass
class Answer:
    ok: bool
    tokens: int
    ttft_s: float
    e2e_s: float
    decode_tps: float | None
    backend: str = ""


@dataclass
class LoadResult:
    system: str
    load: str
    answers: list[Answer] = field(default_factory=list)
    wall_s: float = 0.0

    @property
    def aggregate(self) -> float:
        return sum(a.tokens for a in self.answers if a.ok) / self.wall_s if self.wall_s else 0.0

    def pct(self, what: str, q: float) -> float:
        xs = sorted(getattr(a, what) for a in self.answers if a.ok)
        return xs[min(len(xs) - 1, max(0, int(q * len(xs) + 0.999) - 1))] if xs else float("nan")

    @property
    def per_request(self) -> float:
        xs = [a.decode_tps for a in self.answers if a.ok and a.decode_tps]
        return statistics.fmean(xs) if xs else 0.0

    @property
    def failed(self) -> int:
        return sum(not a.ok for a in self.answers)

    def backends(self) -> dict[str, int]:
        """How many of its answers each backend gave (serve's x-specreg-backend)."""
        out: dict[str, int] = {}
        for a in self.answers:
            if a.backend:
                out[a.backend] = out.get(a.backend, 0) + 1
        return out


async def ask(session: aiohttp.ClientSession, url: str, task: str, text: str,
              max_tokens: int) -> Answer:  # fmt: skip
    body = {"messages": [{"role": "user", "content": text}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True}  # fmt: skip
    t0 = time.monotonic()
    first = None
    timings: dict[str, Any] = {}
    chunks = 0
    try:
        async with session.post(url + "/v1/chat/completions", json=body,
                                headers={"X-Specreg-Task": task}) as resp:  # fmt: skip
            backend = resp.headers.get("x-specreg-backend", "")
            if resp.status != 200:
                await resp.read()
                return Answer(False, 0, 0.0, time.monotonic() - t0, None, backend)
            async for raw in resp.content:
                line = raw.strip()
                if not line.startswith(b"data:") or line.endswith(b"[DONE]"):
                    continue
                event = json.loads(line[5:])
                delta = (event.get("choices") or [{}])[0].get("delta") or {}
                if delta.get("content"):
                    chunks += 1
                    first = first or time.monotonic()
                timings = event.get("timings") or timings
    except aiohttp.ClientError:
        return Answer(False, 0, 0.0, time.monotonic() - t0, None)
    end = time.monotonic()
    tokens = int(timings.get("predicted_n", chunks))
    tps = timings.get("predicted_per_second")
    return Answer(True, tokens, (first or end) - t0, end - t0, float(tps) if tps else None,
                  backend)  # fmt: skip


def session_for_load() -> aiohttp.ClientSession:
    """A client session that opens a connection a request, for every system alike:
    llama-server closes a streamed answer's connection unannounced, and a kept one fails
    the next request sent on it."""
    return aiohttp.ClientSession(
        timeout=aiohttp.ClientTimeout(total=1800),
        connector=aiohttp.TCPConnector(force_close=True),
    )


async def closed_loop(url: str, prompts: list[tuple[str, str]], clients: int,
                      max_tokens: int) -> tuple[list[Answer], float]:  # fmt: skip
    queue = list(prompts)
    answers: list[Answer] = []
    async with session_for_load() as session:

        async def client() -> None:
            while queue:
                task, text = queue.pop(0)
                answers.append(await ask(session, url, task, text, max_tokens))

        t0 = time.monotonic()
        await asyncio.gather(*(client() for _ in range(clients)))
        return answers, time.monotonic() - t0


async def open_loop(url: str, prompts: list[tuple[str, str]], rate: float, max_tokens: int,
                    seed: int) -> tuple[list[Answer], float]:  # fmt: skip
    rng = random.Random(seed)
    async with session_for_load() as session:
        t0 = time.monotonic()
        jobs = []
        for task, text in prompts:
            jobs.append(asyncio.ensure_future(ask(session, url, task, text, max_tokens)))
            await asyncio.sleep(rng.expovariate(rate))
        answers = list(await asyncio.gather(*jobs))
        return answers, time.monotonic() - t0


async def varying(url: str, prompts: list[tuple[str, str]], max_tokens: int
                  ) -> tuple[list[Answer], float, list[float]]:  # fmt: skip
    """Bursts of 8 at once, then 8 single requests, twice; also each phase's aggregate."""
    answers: list[Answer] = []
    phases: list[float] = []
    chunks = [prompts[i : i + 8] for i in range(0, len(prompts), 8)]
    async with session_for_load() as session:
        t0 = time.monotonic()
        for i, chunk in enumerate(chunks):
            p0 = time.monotonic()
            if i % 2 == 0:
                got = list(await asyncio.gather(*(ask(session, url, t, x, max_tokens)
                                                  for t, x in chunk)))  # fmt: skip
            else:
                got = [await ask(session, url, t, x, max_tokens) for t, x in chunk]
            answers += got
            phases.append(sum(a.tokens for a in got if a.ok) / (time.monotonic() - p0))
        return answers, time.monotonic() - t0, phases


# -- the systems ------------------------------------------------------------------------------


class Process:
    """A server process on a free port, healthy, until `stop`."""

    def __init__(self, argv: list[str], env: dict[str, str], log: Path, health: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        argv = [a.replace("{port}", str(self.port)) for a in argv]
        self.log = log
        # In its log's folder: `python -m` puts the working directory first on sys.path, and
        # run from a checkout that would import the checkout's specreg before PYTHONPATH's
        # (today's serve measured as the new one, as every run before 2026-11-27 21:45 did).
        with log.open("wb") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env,
                                         cwd=log.parent, start_new_session=True)  # fmt: skip
        import httpx

        for _ in range(3000):
            try:
                if httpx.get(self.url + health, timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if self.proc.poll() is not None:
                break
            time.sleep(0.2)
        self.stop()
        tail = log.read_text(errors="replace").strip().splitlines()[-3:]
        raise SystemExit(f"did not come up: {' '.join(argv)}\n  " + "\n  ".join(tail))

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


@dataclass
class Bench:
    model: Path
    draft: Path | None
    spec: str  # the speculative peer's --spec-type[:K]
    bin_dir: Path
    threads: int
    max_tokens: int
    baseline: Path | None
    work: Path
    home_seed: Path

    def llama_server(self, slots: int, speculative: bool) -> Process:
        argv = [str(self.bin_dir / "llama-server"), "-m", str(self.model),
                "-t", str(self.threads), "-c", str(CTX * slots), "-np", str(slots),
                "--port", "{port}", "--metrics"]  # fmt: skip
        if speculative:
            kind, _, k = self.spec.partition(":")
            argv += ["--spec-type", kind]
            if self.draft is not None:
                argv += ["-md", str(self.draft), "--spec-draft-n-max", k or "4"]
            elif k:
                argv += ["--spec-ngram-mod-n-max", k] if kind == "ngram-mod" else []
        return Process(argv, dict(os.environ), self.work / f"llama-{slots}-{speculative}.log",
                       "/health")  # fmt: skip

    def serve(self, code: Path | None, *extra: str) -> Process:
        home = Path(tempfile.mkdtemp(dir=self.work, prefix="home-"))
        env = {**os.environ, "SPECREG_HOME": str(home)}
        if code is None:
            shutil.copy(self.home_seed / "registry.duckdb", home / "registry.duckdb")
        else:
            # today's code, with a registry of its own schema: it scans the models itself
            env["PYTHONPATH"] = str(code)
            imported = subprocess.run(
                [sys.executable, "-c", "import specreg; print(specreg.__file__)"],
                env=env, cwd=home, capture_output=True, text=True, check=True,
            ).stdout.strip()  # fmt: skip
            if not imported.startswith(str(code)):
                raise SystemExit(f"today's serve would import {imported}, not the code at {code}")
            models = [str(m) for m in (self.model, self.draft) if m is not None]
            subprocess.run([sys.executable, "-m", "specreg", "scan", *models], env=env, cwd=home,
                           check=True, capture_output=True)  # fmt: skip
        argv = [sys.executable, "-m", "specreg", "serve", str(self.model), "--port", "{port}",
                "--ctx", str(CTX), "--llama-bin", str(self.bin_dir), "--spec", "/nonexistent",
                *extra]  # fmt: skip
        return Process(argv, env, home / "serve.log", "/health")


SystemStart = Callable[[int], Process]  # the load's concurrency -> a system


class Lasting:
    """A server that, like a deployment, lives through every load (its policy learns as it
    serves); `stop_all` ends it."""

    def __init__(self, start: Callable[[], Process]):
        self.start = start
        self.proc: Process | None = None

    def __call__(self, concurrency: int) -> Process:
        if self.proc is None:
            self.proc = self.start()
        return self.proc

    def stop_all(self) -> None:
        if self.proc is not None:
            self.proc.stop()


def systems(b: Bench) -> dict[str, SystemStart]:
    """The peers get a fresh llama-server for each load (-np = its concurrency); each serve
    starts once and serves every load, as a deployment does."""
    out: dict[str, SystemStart] = {
        "(a) llama-server plain": lambda c: b.llama_server(c, False),
        "(b) llama-server " + b.spec: lambda c: b.llama_server(c, True),
    }
    if b.baseline is not None:
        base = b.baseline
        out["(c) today's serve, fixed"] = Lasting(lambda: b.serve(base, "--policy", "fixed"))
        out["(c) today's serve, adaptive"] = Lasting(lambda: b.serve(base, "--policy", "adaptive"))
    out["(d) new serve"] = Lasting(lambda: b.serve(None))
    return out


def run_load(start: SystemStart, concurrency: int,
             work: Callable[[str], Awaitable[Any]]) -> Any:  # fmt: skip
    proc = start(concurrency)
    try:
        return asyncio.run(work(proc.url))
    finally:
        if not isinstance(start, Lasting):
            proc.stop()


# -- main -------------------------------------------------------------------------------------


def load_prompts(path: Path | None, n: int, seed: int) -> list[tuple[str, str]]:
    if path is None:
        return stream(n, seed)
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    random.Random(seed).shuffle(rows)
    return [(r.get("task", "chat"), r["text"]) for r in rows][:n]


def baseline_tree(rev: str, work: Path) -> Path:
    tree = work / "baseline"
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(tree), rev],
                   check=True, capture_output=True)  # fmt: skip
    return tree


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", nargs="?")
    ap.add_argument("--qwen", action="store_true")
    ap.add_argument("--draft", type=Path)
    ap.add_argument("--spec", default=None, help="the speculative peer: TYPE[:K]")
    ap.add_argument("--requests", type=int, default=16, help="per closed-loop load")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--baseline-rev", default="d6d1a6f", help="today's serve ('' to skip)")
    ap.add_argument("--prompts", type=Path)
    ap.add_argument("--json", type=Path)
    ap.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="TEXT",
        help="measure only the systems whose name holds TEXT (repeatable; the plain "
        "peer always runs: the Poisson rate is set from it); for diagnosis",
    )
    args = ap.parse_args()
    build = cached_build()
    if build is None:
        raise SystemExit("run `specreg llama build` first")
    if args.qwen:
        pair = ensure_qwen_pair()
        model, draft = pair.target.path, pair.draft.path
        spec = args.spec or "draft-simple:4"
    else:
        model, draft = Path(args.model).resolve(), args.draft and args.draft.resolve()
        spec = args.spec or ("draft-simple:4" if draft else "ngram-mod:16")
    work = Path(tempfile.mkdtemp(prefix="serve-load-"))
    seed_home = work / "seed"
    seed_home.mkdir()
    env = {**os.environ, "SPECREG_HOME": str(seed_home)}
    subprocess.run([sys.executable, "-m", "specreg", "scan", str(model),
                    *([str(draft)] if draft else [])], env=env, check=True,
                   capture_output=True)  # fmt: skip
    baseline = baseline_tree(args.baseline_rev, work) if args.baseline_rev else None
    b = Bench(Path(model), draft, spec, build.bin_dir, args.threads, args.max_tokens, baseline,
              work, seed_home)  # fmt: skip
    prompts = load_prompts(args.prompts, 40 * args.requests, args.seed)
    results: list[LoadResult] = []
    try:
        # One system at a time, every load, then stopped: an idle serve's backends hold memory
        # (llama.cpp repacks the weights into each process's own), and several serves alive at
        # once left the next system measured on a host out of memory.
        for name, start in systems(b).items():
            if args.only and not name.startswith("(a)") and not any(t in name for t in args.only):
                continue
            try:
                results += closed_loops(name, start, prompts, args)
                results.append(poisson(name, start, prompts, args, results))
                results.append(varying_load(name, start, prompts, args))
            finally:
                if isinstance(start, Lasting):
                    start.stop_all()
    finally:
        if baseline is not None:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force",
                            str(baseline)], capture_output=True)  # fmt: skip
    report(results, Path(model).name)
    if args.json:
        args.json.write_text(json.dumps([
            {"system": r.system, "load": r.load, "aggregate": r.aggregate,
             "per_request": r.per_request, "failed": r.failed, "wall_s": r.wall_s,
             "ttft_p50": r.pct("ttft_s", 0.5), "ttft_p95": r.pct("ttft_s", 0.95),
             "e2e_p50": r.pct("e2e_s", 0.5), "e2e_p95": r.pct("e2e_s", 0.95),
             "backends": r.backends()}
            for r in results], indent=2))  # fmt: skip


def failures(r: LoadResult) -> str:
    return f" ({r.failed} failed)" if r.failed else ""


def closed_loops(name: str, start: SystemStart, prompts: list[tuple[str, str]],
                 args: argparse.Namespace) -> list[LoadResult]:  # fmt: skip
    out = []
    for i, c in enumerate(CONCURRENCY):
        n = max(args.requests, 2 * c)
        chunk = prompts[i * 2 * args.requests :][:n]
        answers, wall = run_load(start, c, lambda url, ch=chunk, c=c: closed_loop(
            url, ch, c, args.max_tokens))  # fmt: skip
        out.append(LoadResult(name, f"closed {c}", answers, wall))
        print(f"  closed {c} {name}: {out[-1].aggregate:.1f} t/s{failures(out[-1])}",
              flush=True)  # fmt: skip
    return out


def poisson(name: str, start: SystemStart, prompts: list[tuple[str, str]],
            args: argparse.Namespace, done: list[LoadResult]) -> LoadResult:  # fmt: skip
    """An open-loop Poisson arrival rate: 70 % of the plain peer's capacity at four clients
    (the peer is measured first)."""
    peer = next(r for r in done if r.system.startswith("(a)") and r.load == "closed 4")
    rate = 0.7 * peer.aggregate / args.max_tokens  # requests per second
    chunk = prompts[10 * args.requests :][: 2 * args.requests]
    answers, wall = run_load(start, 8, lambda url: open_loop(
        url, chunk, rate, args.max_tokens, args.seed))  # fmt: skip
    result = LoadResult(name, f"poisson {rate:.2f}/s", answers, wall)
    print(f"  poisson {name}: {result.aggregate:.1f} t/s{failures(result)}", flush=True)
    return result


VARYING: dict[str, list[float]] = {}


def varying_load(name: str, start: SystemStart, prompts: list[tuple[str, str]],
                 args: argparse.Namespace) -> LoadResult:  # fmt: skip
    chunk = prompts[14 * args.requests :][:32]
    answers, wall, phases = run_load(start, 8, lambda url: varying(
        url, chunk, args.max_tokens))  # fmt: skip
    VARYING[name] = phases
    result = LoadResult(name, "varying", answers, wall)
    print(f"  varying {name}: {result.aggregate:.1f} t/s{failures(result)}", flush=True)
    return result


def report(results: list[LoadResult], model: str) -> None:
    print(f"\n{model}: aggregate t/s | per-request t/s | TTFT p50/p95 s | e2e p50/p95 s")
    loads = list(dict.fromkeys(r.load for r in results))
    for load in loads:
        print(f"{load}:")
        for r in (r for r in results if r.load == load):
            failed = f"  ({r.failed} failed)" if r.failed else ""
            print(f"  {r.system:34} {r.aggregate:7.1f} {r.per_request:7.1f}   "
                  f"{r.pct('ttft_s', .5):5.2f}/{r.pct('ttft_s', .95):5.2f}   "
                  f"{r.pct('e2e_s', .5):6.2f}/{r.pct('e2e_s', .95):6.2f}{failed}")  # fmt: skip
            if len(r.backends()) > 1:  # which of serve's backends answered
                print("      " + ", ".join(f"{n} {k}" for k, n in r.backends().items()))
    print("\ngoals:")
    by = {(r.system, r.load): r for r in results}
    new = "(d) new serve"
    for c in CONCURRENCY:
        load = f"closed {c}"
        peers = [r for r in results if r.load == load and r.system[:3] in ("(a)", "(b)")]
        best = max(peers, key=lambda r: r.aggregate)
        d = by[(new, load)]
        ratio, lat = d.aggregate / best.aggregate, d.pct("e2e_s", 0.95) / best.pct("e2e_s", 0.95)
        ok = ratio >= 0.95 and lat <= 1.1
        print(f"  {load}: new / best peer ({best.system}) = {ratio:.3f} (goal >= 0.95), p95 "
              f"e2e {lat:.3f}x (goal <= 1.1): {'met' if ok else 'MISSED'}")  # fmt: skip
    today = by.get(("(c) today's serve, adaptive", "closed 1"))
    if today is not None:
        ratio = by[(new, "closed 1")].aggregate / today.aggregate
        print(f"  one client: new / today's adaptive = {ratio:.3f} (goal >= 0.97): "
              f"{'met' if ratio >= 0.97 else 'MISSED'}")  # fmt: skip
    fixed = {k: v for k, v in VARYING.items() if k[:3] in ("(a)", "(b)")}
    if fixed and new in VARYING:
        best_fixed = max(by[(k, "varying")].aggregate for k in fixed)
        oracle_phases = [max(v[i] for v in fixed.values()) for i in range(len(VARYING[new]))]
        # the oracle's aggregate: each phase at its best peer's rate, over the best fixed
        # peer's (both as the mean of the phases' rates)
        room = statistics.fmean(oracle_phases) / max(statistics.fmean(v) for v in fixed.values())
        ratio = by[(new, "varying")].aggregate / best_fixed
        applies = room >= 1.1
        print(f"  varying load: new / best fixed = {ratio:.3f}; the oracle's room {room:.3f}: "
              + (f"goal >= 1.1 {'met' if ratio >= 1.1 else 'MISSED'}" if applies
                 else "under 1.1, the goal does not apply"))  # fmt: skip


if __name__ == "__main__":
    main()
