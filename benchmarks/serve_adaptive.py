"""Adaptive serve on real llama.cpp: a seeded stream of distinct prompts through `specreg serve`.

    flock /tmp/specreg-llama.lock python3 benchmarks/serve_adaptive.py MODEL [--prompts 200]
        [--candidates none,ngram-mod:16] [--n-predict 128] [--threads 1] [--png regret.png]
        [--traffic-cache 24] [--share-state] [--no-calibrate] [--json results.json]
    # the real pair (issue 26): --qwen serves Qwen2.5-Coder-1.5B with the 0.5B as draft
    python3 benchmarks/serve_adaptive.py --qwen [--candidates none,draft-simple:4,ngram-mod:16]

The stream: code, prose, edit-a-supplied-text, summarise-a-supplied-text and JSON requests,
each sent once, in a seeded random order. Measured in one run, each on its own `serve`, all up
at once; each prompt goes to every configuration in turn, in a rotating order, so a drift of
the host falls on all alike:
  (a) adaptive serve over the candidates (pinned as a candidate set for every task);
  (b) serve pinned to each single candidate (--policy fixed); the best of them is the best
      fixed configuration in hindsight;
  (c) today's static per-task routes (--policy fixed, no pin: the recommender's top);
  (d) the per-request oracle: each prompt measured on every candidate on a fresh server (first
      encounter), best per prompt. A candidate whose method keeps no state across requests
      (plain, draft-simple) answers a prompt on a long-lived server exactly as on a fresh one,
      so its figures of (b) are taken; a stateful one (ngram-mod) gets a fresh llama-server,
      with the flags `serve` gives it, for every prompt.
Every serve starts from one registry in which `specreg calibrate` has timed the target (and the
draft) on this host, as the README's set-up does before serving: the policy's prior is then the
recommender's calibrated prediction (--no-calibrate: the uncalibrated one).
Adaptive serve also grows lookup caches from the stream (--traffic-cache N, 0: none), judged on
later prompts only; the oracle does not get them (they are built from the stream itself).
Stream throughput = generated tokens / generation seconds over the whole stream. Printed: the
room (oracle / best fixed), adaptive / oracle and / best fixed, static / best fixed, each task's
adaptive / best-fixed after the first 20 requests, and the cumulative regret (PNG).
Numbers taken while other processes load the machine are not quiet-host numbers.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import httpx

from specreg.llama.process import free_port
from specreg.llama.server import LlamaServer
from specreg.llamacpp import keeps_state
from specreg.samples.qwen_pair import ensure_qwen_pair

CTX = 4096

SUBJECTS = ["lighthouse", "bakery", "orchard", "library", "harbour", "observatory", "garden",
            "bridge", "market", "railway station", "vineyard", "museum", "school", "castle",
            "river", "forest", "mill", "theatre", "island", "mountain hut", "canal", "farm",
            "factory", "monastery", "airport"]  # fmt: skip
ANIMALS = ["fox", "heron", "otter", "badger", "owl", "hare", "salmon", "wren"]


def text_about(subject: str, animal: str) -> str:
    return (
        f"The old {subject} stood at the edge of the town for more than a hundred years. "
        f"Every morning the keeper of the {subject} opened the heavy wooden door and wrote the "
        f"date in a thick notebook. A {animal} lived nearby and came to the door at dusk. "
        f"Visitors came from the villages to see the {subject}, and children counted the "
        "windows on the way up."
    )


def stream(n: int, seed: int) -> list[tuple[str, str]]:
    """(task, prompt) pairs, each prompt distinct, in a seeded order."""
    rng = random.Random(seed)
    out: list[tuple[str, str]] = []
    i = 0
    while len(out) < n:
        s, a = SUBJECTS[i % len(SUBJECTS)], ANIMALS[(i // len(SUBJECTS)) % len(ANIMALS)]
        text = text_about(s, a)
        out += [
            ("code", f"Write a Python function that records a visit to the {s} (visitor "
                     f"name, date, whether the {a} was seen) and returns the visit count."),
            ("prose", f"Write a short story about a {a} that lives near a {s}."),
            ("summarize", f"Copy the following text exactly, but write 'keeper' as "
                          f"'warden'.\n\n{text}"),
            ("summarize", f"Summarize the following text in two sentences.\n\n{text}"),
            ("json", f'Return a JSON object with keys "place", "animal" and "visitors" for '
                     f"this text.\n\n{text}"),
        ]  # fmt: skip
        i += 1
    out = out[:n]
    rng.shuffle(out)
    return out


def start(model: str, args: argparse.Namespace, home: Path, *extra: str) -> tuple[Any, str]:
    port = free_port()
    argv = [sys.executable, "-m", "specreg", "serve", model, "--port", str(port), "--threads",
            str(args.threads), "--ctx", str(CTX), *extra]  # fmt: skip
    log = (home / f"serve-{port}.log").open("wb")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, "SPECREG_HOME": str(home)})  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    for _ in range(1800):
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        if proc.poll() is not None:
            break
        time.sleep(0.2)
    log.close()
    said = (home / f"serve-{port}.log").read_text(errors="replace").strip().splitlines()[-1:]
    raise SystemExit(f"serve did not come up: {' '.join(argv)}" + "".join(f"\n  {x}" for x in said))


Row = tuple[str, int, float]  # (backend, generated tokens, generation seconds)


def ask(url: str, args: argparse.Namespace, task: str, prompt: str) -> tuple[dict[str, Any], str]:
    r = httpx.post(url + "/v1/chat/completions", timeout=600, json={
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": args.n_predict, "temperature": 0,
    }, headers={"X-Specreg-Task": task})  # fmt: skip
    r.raise_for_status()
    return r.json().get("timings", {}), r.headers.get("x-specreg-backend", "?")


def row(timings: dict[str, Any], backend: str) -> Row:
    return backend, int(timings.get("predicted_n", 0)), timings.get("predicted_ms", 0.0) / 1000


class Serve:
    """One `specreg serve` with its own home (a copy of `seed`'s registry), up until `stop`."""

    def __init__(self, model: str, args: argparse.Namespace, *extra: str, seed: Path | None = None):
        self._home = tempfile.TemporaryDirectory()
        if seed is not None:
            shutil.copy(seed, Path(self._home.name) / "registry.duckdb")
        self.proc, self.url = start(model, args, Path(self._home.name), *extra)
        self.rows: list[Row] = []

    def ask(self, args: argparse.Namespace, task: str, prompt: str) -> None:
        self.rows.append(row(*ask(self.url, args, task, prompt)))

    def stop(self) -> dict[str, Any]:
        """The final status; the serve and its backends are gone after."""
        try:
            return httpx.get(self.url + "/v1/specreg/status", timeout=30).json()
        finally:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=120)
            self._home.cleanup()


def calibrated(home: Path, args: argparse.Namespace, model: str, draft: str | None) -> Path:
    """A registry in which `specreg calibrate` timed the target (and the draft) here."""
    db = home / "registry.duckdb"
    models = [model, *([draft] if draft else [])]
    common = ["--db", str(db)]
    subprocess.run([sys.executable, "-m", "specreg", "scan", *models, *common],
                   check=True, capture_output=True)  # fmt: skip
    t0, load0 = time.monotonic(), loadavg()
    got = subprocess.run(
        [sys.executable, "-m", "specreg", "calibrate", model,
         *(["--draft", draft] if draft else ["--no-drafts"]), "--threads", str(args.threads),
         "--repetitions", "3", "--gen-tokens", "64", *common, "--json"],
        capture_output=True, text=True,
    )  # fmt: skip
    if got.returncode not in (0, 1):  # 1: still disturbed after every retry, recorded as such
        raise SystemExit(f"calibrate failed ({got.returncode}): {got.stderr[-800:]}")
    doc = json.loads(got.stdout)
    print(f"calibrate: {time.monotonic() - t0:.0f} s, load {load0} -> {loadavg()}; contended "
          f"{doc.get('contended')}")  # fmt: skip
    return db


def backend_argv(model: str, args: argparse.Namespace, pin: str) -> list[str]:
    """The llama-server argv `serve` runs for one pinned candidate."""
    with tempfile.TemporaryDirectory() as home:
        got = subprocess.run(
            [sys.executable, "-m", "specreg", "serve", model, "--pin", f"default={pin}",
             "--threads", str(args.threads), "--ctx", str(CTX), "--dry-run", "--json"],
            env={**os.environ, "SPECREG_HOME": home}, capture_output=True, text=True, check=True,
        )  # fmt: skip
    (backend,) = json.loads(got.stdout)["backends"]
    return list(backend["argv"])


def fresh(argv: list[str], args: argparse.Namespace, task: str, prompt: str, logs: Path
          ) -> Row:  # fmt: skip
    """One prompt on a fresh llama-server running argv as serve would: first encounter."""
    server = LlamaServer(argv, env=dict(os.environ), log_path=logs / f"{time.time_ns()}.log")
    with server:
        return row(*ask(f"http://127.0.0.1:{server.port}", args, task, prompt))


def tps(rows: list[Row]) -> float:
    return sum(n for _, n, _ in rows) / max(sum(s for _, _, s in rows), 1e-9)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", nargs="?")
    ap.add_argument("--qwen", action="store_true", help="the real pair: Qwen2.5-Coder-1.5B/0.5B")
    ap.add_argument("--prompts", type=int, default=200)
    ap.add_argument("--candidates", default=None)
    ap.add_argument("--n-predict", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--traffic-cache", type=int, default=24)
    ap.add_argument("--share-state", action="store_true", help="adaptive serve --share-state")
    ap.add_argument("--no-calibrate", action="store_true", help="serve on uncalibrated priors")
    ap.add_argument("--png", default="serve_adaptive_regret.png")
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = ap.parse_args()
    draft: str | None = None
    if args.qwen:
        pair = ensure_qwen_pair()
        model, draft = str(pair.target.path), str(pair.draft.path)
        default = f"none,draft-simple:4@{draft},ngram-mod:16"
    elif args.model:
        model, default = args.model, "none,ngram-mod:16"
    else:
        ap.error("give MODEL or --qwen")
    seed_home = tempfile.TemporaryDirectory()
    seed = None if args.no_calibrate else calibrated(Path(seed_home.name), args, model, draft)
    prompts = stream(args.prompts, args.seed)
    cands = (args.candidates or default).split(",")
    pins = [x for c in cands for x in ("--pin", f"default={c}")]
    t0, load0 = time.monotonic(), loadavg()
    # Every configuration is up at once and each prompt goes to all of them in turn, in an order
    # that rotates: a slow drift of the host falls on every configuration alike.
    share = ["--share-state"] if args.share_state else []
    adaptive_argv = [*pins, "--policy", "adaptive", "--seed", str(args.seed), "--traffic-cache",
                     str(args.traffic_cache), *share]  # fmt: skip
    serves = {"adaptive": Serve(model, args, *adaptive_argv, seed=seed)}
    serves |= {c: Serve(model, args, "--policy", "fixed", "--pin", f"default={c}", seed=seed)
               for c in cands}  # fmt: skip
    serves["static"] = Serve(model, args, "--policy", "fixed", seed=seed)
    # a stateful candidate's first encounter: a turn of its own, a fresh llama-server per prompt
    stateful = {c: backend_argv(model, args, c) for c in cands if keeps_state(c.split(":")[0])}
    first_rows: dict[str, list[Row]] = {c: [] for c in stateful}
    fresh_turns = {f"fresh {c}": c for c in stateful}
    try:
        with tempfile.TemporaryDirectory() as logs:
            turns = [*serves, *fresh_turns]
            for i, (task, prompt) in enumerate(prompts):
                for name in turns[i % len(turns) :] + turns[: i % len(turns)]:
                    if name in serves:
                        serves[name].ask(args, task, prompt)
                    else:
                        c = fresh_turns[name]
                        first_rows[c].append(fresh(stateful[c], args, task, prompt, Path(logs)))
                if (i + 1) % 20 == 0:
                    print(f"  {i + 1}/{len(prompts)} prompts, {time.monotonic() - t0:.0f} s",
                          file=sys.stderr, flush=True)  # fmt: skip
    finally:
        statuses = {name: srv.stop() for name, srv in serves.items()}
    adaptive, status = serves["adaptive"].rows, statuses["adaptive"]
    single = {c: serves[c].rows for c in cands}
    static = serves["static"].rows
    # plain and draft-simple keep no state across requests: a long-lived server's answer to a
    # prompt is its first-encounter answer
    first = {c: first_rows.get(c) or single[c] for c in cands}
    assert all(len(r) == len(prompts) for r in (*first.values(), *single.values(), adaptive))
    oracle = [max((first[c][i] for c in cands), key=lambda r: r[1] / max(r[2], 1e-9))
              for i in range(len(prompts))]  # fmt: skip
    best_c = max(cands, key=lambda c: tps(single[c]))
    best = tps(single[best_c])
    short = {c: c.split("@")[0] for c in cands}
    print(f"{Path(model).name}: {len(prompts)} prompts, candidates "
          f"{', '.join(short.values())}, {args.n_predict} tokens, {args.threads} thread(s), "
          f"traffic cache every {args.traffic_cache}; {time.monotonic() - t0:.0f} s, load "
          f"{load0} -> {loadavg()}")  # fmt: skip
    room = tps(oracle) / best
    print(f"room: oracle / best fixed ({short[best_c]}) = {room:.3f}")
    named = [("adaptive", adaptive), *((f"fixed {short[c]}", single[c]) for c in cands),
             ("static routes", static), ("oracle", oracle)]  # fmt: skip
    for name, rows in named:
        print(f"  {name:24} {tps(rows):8.2f} t/s  {tps(rows) / best:5.3f}x best fixed  "
              f"{tps(rows) / tps(oracle):5.3f}x oracle")  # fmt: skip
    goal = tps(adaptive) / tps(oracle)
    print(f"goal adaptive >= 0.9x oracle: {goal:.3f} ({'met' if goal >= 0.9 else 'MISSED'})")
    if room >= 1.25:
        g2 = tps(adaptive) / best
        print(f"goal adaptive >= 1.2x best fixed (room {room:.2f}): {g2:.3f} "
              f"({'met' if g2 >= 1.2 else 'MISSED'})")  # fmt: skip
    by_task: dict[str, list[int]] = defaultdict(list)
    for i, (task, _) in enumerate(prompts):
        if i >= 20:
            by_task[task].append(i)
    worst = math.inf
    for task, idx in sorted(by_task.items()):
        fixed_t = max(tps([single[c][i] for i in idx]) for c in cands)
        ratio = tps([adaptive[i] for i in idx]) / fixed_t
        worst = min(worst, ratio)
        print(f"  after 20 requests, {task:10} adaptive / its best fixed = {ratio:5.3f}")
    print(f"goal no task below 0.95x its best fixed: worst {worst:.3f} "
          f"({'met' if worst >= 0.95 else 'MISSED'})")  # fmt: skip
    chosen: dict[str, int] = defaultdict(int)
    for b, _, _ in adaptive:
        chosen[b] += 1
    print("adaptive's requests per backend:", dict(chosen))
    for t in status.get("tasks", []):
        if t.get("candidates"):
            print(f"  {t['task']:10} choice {t['choice']}: {t['why']}")
            for e in t.get("events", []):
                print(f"      {e}")
    print("traffic caches:", status.get("traffic_caches"))
    pooled = status.get("pooled_state")
    if pooled:
        gen_s = sum(r[2] for r in adaptive)
        print(f"pooled n-gram state: {pooled['fed_texts']} texts read by catch-up in "
              f"{pooled['fed_calls']} calls, {pooled['fed_seconds']:.1f} s of prompt processing "
              f"({pooled['fed_seconds'] / gen_s:.1%} of adaptive's {gen_s:.0f} generation "
              f"seconds; not in its t/s), {pooled['failures']} failure(s)")  # fmt: skip
    regret, acc = [], 0.0
    for a, o in zip(adaptive, oracle, strict=True):
        acc += a[2] - o[2] * (a[1] / max(o[1], 1))
        regret.append(acc)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(range(1, len(regret) + 1), regret)
    ax.set_xlabel("request")
    ax.set_ylabel("generation seconds lost against the oracle")
    ax.set_title(f"adaptive serve, {Path(model).stem}: cumulative regret")
    fig.tight_layout()
    fig.savefig(args.png)
    print(f"regret plot: {args.png}")
    if args.json is not None:
        args.json.write_text(json.dumps({
            "model": model, "candidates": cands, "room": room, "adaptive_vs_oracle": goal,
            "tps": {name: tps(rows) for name, rows in named}, "worst_task": worst,
            "status": status, "tasks": [task for task, _ in prompts],
            "rows": {name: rows for name, rows in named},
        }, indent=1, default=str))  # fmt: skip


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


if __name__ == "__main__":
    main()
