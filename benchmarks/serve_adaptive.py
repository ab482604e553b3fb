"""Adaptive serve on real llama.cpp: a seeded stream of distinct prompts through `specreg serve`.

    flock /tmp/specreg-llama.lock python3 benchmarks/serve_adaptive.py MODEL [--prompts 200]
        [--candidates none,ngram-mod:16] [--n-predict 128] [--threads 1] [--png regret.png]

The stream: code, prose, edit-a-supplied-text, summarise-a-supplied-text and JSON requests,
each sent once, in a seeded random order. Measured in one run, each on its own `serve`:
  (a) adaptive serve over the candidates (pinned as a candidate set for every task);
  (b) serve pinned to each single candidate (--policy fixed); the best of them is the best
      fixed configuration in hindsight;
  (c) today's static per-task routes (--policy fixed, no pin: the recommender's top);
  (d) the per-request oracle: for each prompt the fastest of the single-candidate runs of (b).
      (b) runs on one long-lived server per candidate, so a stateful method (ngram-mod) has
      seen the earlier prompts, as it would in service; it is not a fresh server per prompt.
Stream throughput = generated tokens / generation seconds over the whole stream. Printed: the
room (oracle / best fixed), adaptive / oracle and / best fixed, static / best fixed, each task's
adaptive / best-fixed after the first 20 requests, and the cumulative regret (PNG).
Numbers taken while other processes load the machine are not quiet-host numbers.
"""

from __future__ import annotations

import argparse
import os
import random
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
            str(args.threads), "--ctx", "4096", *extra]  # fmt: skip
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
    raise SystemExit(f"serve did not come up: {' '.join(argv)}")


def run(model: str, args: argparse.Namespace, prompts: list[tuple[str, str]], *extra: str
        ) -> list[tuple[str, int, float]]:  # fmt: skip
    """Per prompt: (backend, generated tokens, generation seconds)."""
    with tempfile.TemporaryDirectory() as home:
        proc, url = start(model, args, Path(home), *extra)
        out = []
        try:
            for task, prompt in prompts:
                r = httpx.post(url + "/v1/chat/completions", timeout=600, json={
                    "messages": [{"role": "user", "content": prompt}],
                    "max_tokens": args.n_predict, "temperature": 0,
                }, headers={"X-Specreg-Task": task})  # fmt: skip
                t = r.json().get("timings", {})
                backend = r.headers.get("x-specreg-backend", "?")
                seconds = t.get("predicted_ms", 0.0) / 1000
                out.append((backend, int(t.get("predicted_n", 0)), seconds))
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=120)
    return out


def tps(rows: list[tuple[str, int, float]]) -> float:
    return sum(n for _, n, _ in rows) / max(sum(s for _, _, s in rows), 1e-9)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("--prompts", type=int, default=200)
    ap.add_argument("--candidates", default="none,ngram-mod:16")
    ap.add_argument("--n-predict", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--png", default="serve_adaptive_regret.png")
    args = ap.parse_args()
    prompts = stream(args.prompts, args.seed)
    cands = args.candidates.split(",")
    pins = [x for c in cands for x in ("--pin", f"default={c}")]
    adaptive = run(args.model, args, prompts, *pins, "--policy", "adaptive", "--seed",
                   str(args.seed))  # fmt: skip
    single = {c: run(args.model, args, prompts, "--policy", "fixed", "--pin", f"default={c}")
              for c in cands}  # fmt: skip
    static = run(args.model, args, prompts, "--policy", "fixed")
    oracle = [max((single[c][i] for c in cands), key=lambda r: r[1] / max(r[2], 1e-9))
              for i in range(len(prompts))]  # fmt: skip
    best_c = max(cands, key=lambda c: tps(single[c]))
    best = tps(single[best_c])
    print(f"{len(prompts)} prompts, candidates {', '.join(cands)}, {args.n_predict} tokens, "
          f"{args.threads} thread(s)")  # fmt: skip
    print(f"room: oracle / best fixed ({best_c}) = {tps(oracle) / best:.3f}")
    for name, rows in [("adaptive", adaptive), *((f"fixed {c}", single[c]) for c in cands),
                       ("static routes", static), ("oracle", oracle)]:  # fmt: skip
        print(f"  {name:24} {tps(rows):8.2f} t/s  {tps(rows) / best:5.3f}x best fixed  "
              f"{tps(rows) / tps(oracle):5.3f}x oracle")  # fmt: skip
    by_task: dict[str, list[int]] = defaultdict(list)
    for i, (task, _) in enumerate(prompts):
        if i >= 20:
            by_task[task].append(i)
    for task, idx in sorted(by_task.items()):
        fixed_t = max(tps([single[c][i] for i in idx]) for c in cands)
        print(f"  after 20 requests, {task:10} adaptive / its best fixed = "
              f"{tps([adaptive[i] for i in idx]) / fixed_t:5.3f}")  # fmt: skip
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
    ax.set_title("adaptive serve: cumulative regret")
    fig.tight_layout()
    fig.savefig(args.png)
    print(f"regret plot: {args.png}")


if __name__ == "__main__":
    main()
