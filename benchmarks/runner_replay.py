"""ngram-mod on a repetitive workload: first encounter, warm server, and what replays reported.

    SPECREG_CACHE=$PWD/.cache flock /tmp/specreg-llama.lock \\
        python benchmarks/runner_replay.py [--prompts 20] [--first 10] [--k default,16]

The workload is a stream of one JSON schema: `--prompts` order records, each to be turned into
the same JSON structure (distinct customers, items, addresses). On the prompts after the first
`--first` (11-20 by default), side by side, for SmolLM2-135M:

- plain decoding (the baseline the ratios are over);
- ngram-mod on first encounter: `runner.measure` gives every sample a fresh llama-server, so
  each prompt is new to the server (what a user's first such request gets);
- ngram-mod warm: `runner.measure(warm_first=N)`, all prompts once each, in order, on one
  server; the later prompts are new to it but follow N requests of the same schema (what a
  long-lived server gets on this traffic; never a replay);
- what the replaying protocol (before measurement protocol v2) reported for the same prompts:
  one llama-server, a warm-up request of the first prompt, then every prompt `--repeat` times
  in turn; emulated here with LlamaServer because the runner no longer measures that way.

Prints a markdown table (drafted, accepted, acceptance, tokens/s, ratio over plain, foreign
CPU seconds during the timed requests) and the old protocol's per-repeat figures. Nothing is
recorded in the registry.

Measured 2026-11-23 on the 2-core EPYC (one thread, n_predict 96, other sessions' load: 11-38
foreign CPU seconds per row, so the speeds are rough; the token counts are deterministic):

| ngram-mod on prompts 11-20 | defaults (n-max 64) accepted/drafted, vs plain | n-max 16 |
|---|---|---|
| first encounter (fresh server per prompt) | 0/0, 1.02x | 0/0, 1.03x |
| warm, after prompts 1-10 on one server | 11/320 (3 %), 0.81x | 46/160 (29 %), 0.93x |
| replaying protocol (old runner, 3 repeats) | 48/960 (5 %), 0.86x | 1704/1864 (91 %), 1.18x |

With n-max 16 the old protocol's repeats 2-3 accepted 844 of 892 drafted tokens each, its
first repeat 16 of 80. With llama.cpp's defaults, ngram-mod resets its pool after five
low-acceptance rounds (common/speculative.cpp), which also erases what a replay would draft.
"""

from __future__ import annotations

import argparse
import random
import statistics
from dataclasses import dataclass

from specreg.home import logs_dir
from specreg.host.machine import detect_host
from specreg.llama.config import Config, server_command
from specreg.llama.install import find_llama
from specreg.llama.models import ensure_test_models
from specreg.llama.server import Completion, LlamaServer
from specreg.runner.measure import measure
from specreg.runner.protocol import Figures
from specreg.runner.settings import Settings
from specreg.runner.workload import Prompt, Workload

FIRST_NAMES = ["Ana", "Bram", "Chen", "Dalia", "Emil", "Farah", "Goran", "Hana", "Ivo", "Jun",
               "Kofi", "Lena", "Marek", "Nia", "Oskar", "Priya", "Quinn", "Rosa", "Sven", "Tomo",
               "Uma", "Viktor", "Wen", "Ximena"]  # fmt: skip
CITIES = ["Lisbon", "Utrecht", "Osaka", "Porto", "Gdansk", "Accra", "Leeds", "Turin", "Tartu",
          "Quito", "Graz", "Cork"]  # fmt: skip
ITEMS = [
    ("oak chair", 119.0), ("brass lamp", 189.5), ("wool rug", 240.0), ("desk", 329.0),
    ("bookshelf", 149.0), ("mirror", 89.9), ("armchair", 499.0), ("side table", 75.0),
]  # fmt: skip
SCHEMA = """{
  "order_id": <string>,
  "customer": {"name": <string>, "city": <string>},
  "items": [{"name": <string>, "quantity": <integer>, "unit_price": <number>}],
  "total": <number>,
  "express": <boolean>
}"""


def json_stream(n: int, seed: int = 7) -> Workload:
    """`n` distinct order descriptions, each to be written as the same JSON structure."""
    rnd = random.Random(seed)
    prompts = []
    for i in range(n):
        name = f"{FIRST_NAMES[i % len(FIRST_NAMES)]} {chr(65 + rnd.randrange(26))}."
        picked = rnd.sample(ITEMS, k=rnd.randint(1, 3))
        lines = [(item, rnd.randint(1, 4), price) for item, price in picked]
        bought = ", ".join(f"{q} x {item} at {p:.2f}" for item, q, p in lines)
        express = "with express delivery" if rnd.random() < 0.5 else "with standard delivery"
        text = (
            f"Write the order below as JSON with exactly this structure:\n{SCHEMA}\n\n"
            f"Order ORD-{1000 + i}: {name} from {rnd.choice(CITIES)} bought {bought}, "
            f"{express}.\nJSON:\n"
        )
        prompts.append(Prompt(f"order-{i + 1}", "json", text))
    return Workload("json-stream", tuple(prompts))


@dataclass(frozen=True)
class Row:
    label: str
    prompts: str
    figures: Figures
    foreign_s: float


def replaying_protocol(
    install, host, config: Config, target, workload: Workload, n_predict: int, repeats: int
) -> list[list[Completion]]:  # type: ignore[no-untyped-def]
    """The runner before protocol v2: one server, warm-up of the first prompt, repeats in turn."""
    command = server_command(
        config, target, None, install.dialect, host, server=install.server, port=None
    )
    body = {"n_predict": n_predict, "cache_prompt": False, "return_tokens": True,
            **config.request_fields()}  # fmt: skip
    log = logs_dir() / "benchmark-replay.log"
    per_repeat: list[list[Completion]] = []
    with LlamaServer(command, env=host.env(), log_path=log) as server:
        server.complete({**body, "prompt": workload.prompts[0].text, "n_predict": 8})
        for _ in range(repeats):
            per_repeat.append(
                [server.complete({**body, "prompt": p.text}) for p in workload.prompts]
            )
    return per_repeat


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=20)
    ap.add_argument("--first", type=int, default=10, help="prompts before the evaluated ones")
    ap.add_argument("--n-predict", type=int, default=96)
    ap.add_argument("--repeat", type=int, default=3, help="repeats of the replaying protocol")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument(
        "--k", default="default,16",
        help="ngram-mod n-max values to compare ('default': llama.cpp's 64 with n-min 48)",
    )  # fmt: skip
    ap.add_argument(
        "--retries", type=int, default=2,
        help="measure a contended plain/first-encounter sample again (each on a fresh server); "
        "the warm and replaying figures cannot be taken again without replaying",
    )  # fmt: skip
    args = ap.parse_args()
    install = find_llama()
    host = detect_host()
    model = ensure_test_models(install.binary("llama-quantize")).smollm2
    stream = json_stream(args.prompts)
    _, later = stream.held_out(args.first)
    span = f"{args.first + 1}-{args.prompts}"
    plain = Config(threads=args.threads)
    print(
        f"host: {host.cpu_model}, {host.logical_cpus} CPUs; llama.cpp {install.version}; "
        f"{model.path.name}, threads {args.threads}; n_predict {args.n_predict}; "
        f"workload: {args.prompts} prompts of one JSON schema, evaluated on {span}"
    )

    def flat(m) -> list[Completion]:  # type: ignore[no-untyped-def]
        assert m.ok, m.failure
        return [s for p in m.prompts for s in p.samples]

    def foreign(cs: list[Completion]) -> float:
        return sum(c.foreign_cpu_s or 0.0 for c in cs)

    once = Settings(n_predict=args.n_predict, repeats=1, retries=args.retries)
    base = flat(measure(install, host, plain, model.path, None, later, once))
    base_tps = Figures.of(base).tokens_per_s or 1.0
    for k_arg in args.k.split(","):
        k = None if k_arg == "default" else int(k_arg)
        ngram = plain.with_(spec_type="ngram-mod", k=k)
        fresh = flat(measure(install, host, ngram, model.path, None, later, once))
        warm = flat(
            measure(
                install, host, ngram, model.path, None, stream,
                Settings(n_predict=args.n_predict, warm_first=args.first),
            )
        )  # fmt: skip
        old = replaying_protocol(
            install, host, ngram, model.path, later, args.n_predict, args.repeat
        )
        old_all = [c for rep in old for c in rep]
        # the old runner's figure: tokens/s the median of its repeats, drafted/accepted summed
        old_tps = statistics.median(Figures.of(rep).tokens_per_s or 0.0 for rep in old)
        rows = [
            Row("plain decoding", span, Figures.of(base), foreign(base)),
            Row("first encounter (fresh server per prompt)", span, Figures.of(fresh),
                foreign(fresh)),
            Row(f"warm: after prompts 1-{args.first} on one server", span,
                Figures.of(warm[args.first :]), foreign(warm[args.first :])),
            Row(f"warm: prompts 1-{args.first} themselves", f"1-{args.first}",
                Figures.of(warm[: args.first]), foreign(warm[: args.first])),
            Row(f"replaying protocol (old runner, {args.repeat} repeats)", span,
                Figures.of(old_all), foreign(old_all)),
        ]  # fmt: skip
        label = "llama.cpp defaults (n-max 64, n-min 48)" if k is None else f"n-max {k}"
        print(f"\n### ngram-mod, {label}\n")
        print(
            "| protocol | prompts | drafted | accepted | acceptance | tok/s | vs plain "
            "| foreign CPU s |"
        )
        print("|---|---|---|---|---|---|---|---|")
        for r in rows:
            f = r.figures
            tps = old_tps if r.label.startswith("replaying") else (f.tokens_per_s or 0.0)
            acc = "-" if f.acceptance is None else f"{f.acceptance:.0%}"
            print(f"| {r.label} | {r.prompts} | {f.draft_n} | {f.draft_n_accepted} | {acc} | "
                  f"{tps:.1f} | {tps / base_tps:.2f}x | {r.foreign_s:.1f} |")  # fmt: skip
        print(
            "\nreplaying protocol per repeat (repeat 1 is a first encounter but for the warm-up):"
        )
        for n, rep in enumerate(old, 1):
            f = Figures.of(rep)
            print(f"  repeat {n}: {f.draft_n_accepted}/{f.draft_n} accepted, "
                  f"{f.tokens_per_s or 0:.1f} tok/s")  # fmt: skip
        print("\nper prompt accepted/drafted (first encounter | warm | replaying repeats):")
        for i, p in enumerate(later.prompts):
            w = warm[args.first + i]
            olds = " ".join(f"{rep[i].draft_n_accepted}/{rep[i].draft_n}" for rep in old)
            print(f"  {p.prompt_id}: {fresh[i].draft_n_accepted}/{fresh[i].draft_n} | "
                  f"{w.draft_n_accepted}/{w.draft_n} | {olds}")  # fmt: skip


if __name__ == "__main__":
    main()
