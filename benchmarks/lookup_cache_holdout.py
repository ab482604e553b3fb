"""A workload lookup cache on held-out prompts against ngram-mod alone, and a stacked run.

    SPECREG_CACHE=$PWD/.cache flock /tmp/specreg-llama.lock \\
        python benchmarks/lookup_cache_holdout.py [--prompts 20] [--rounds 2] [--n-predict 96]

A repetitive workload: prompts of one JSON schema (customer orders), generated here. The first
half is run once with plain decoding and recorded (prompts and outputs); a static n-gram cache is
built from that run with `specreg lookup-cache build --run ID` (the build's llama-lookup-create,
SmolLM2's tokenizer). The second half, whose prompts and outputs are in no cache, is measured
with each method as `specreg run` records it: first encounter (ngram-mod and ngram-cache keep
state across requests, so every sample gets a fresh llama-server), no repeats, the methods
interleaved round by round in rotating order. Reported per method: drafted, accepted, accepted
per drafted token, accepted per generated token and tokens/s (median over rounds).

Then `specreg run SMOLLM2 --spec-type ngram-mod,draft-simple --draft Q4_0` on code prompts:
the stack's per-type statistics. Everything runs in a throwaway SPECREG_HOME with threads=1.

Measured here (2 cores, 2026-11-23, defaults; cache from run 1: 2,187 tokens, 432 n-grams):

| method (10 held-out prompts x 2 rounds) | drafted | accepted | acc/drafted | acc/generated | t/s |
|---|---|---|---|---|---|
| plain | 0 | 0 | - | 0.000 | 142.2 |
| ngram-mod (defaults: n-match 24) | 0 | 0 | - | 0.000 | 137.7 |
| ngram-mod K=16 (n-min 4) | 8 | 8 | 1.000 | 0.004 | 134.6 |
| ngram-cache (context only) | 790 | 90 | 0.114 | 0.048 | 103.5 |
| ngram-cache + cache | 2818 | 814 | 0.289 | 0.430 | 65.3 |
| ngram-mod,ngram-cache + cache | 2818 | 814 | 0.289 | 0.430 | 64.7 |

The cache accepts 814 tokens on prompts it never saw where ngram-mod accepts 0 (8 with n-min 4):
43 % of the generated tokens came from it. It is still slower on this machine: SmolLM2-135M on
one thread is compute-bound, so verifying 8 drafted tokens costs several plain steps; on a
memory-bound target the same acceptance pays. recommend learns exactly that from these runs:
the cache is not listed unasked (plain 142 t/s wins), and `--spec-type ngram-cache` shows it
at 65.8 t/s predicted, 0.46x, its runs as evidence. The stack ngram-mod,draft-simple with the
Q4_0 draft on 2 code prompts: 117/215 accepted (all by draft-simple; ngram-mod drafted 0), 48 t/s.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

CUSTOMERS = [
    ("Anna Silva", "Lisbon"), ("Bruno Costa", "Porto"), ("Chen Wei", "Shanghai"),
    ("Dara Okafor", "Lagos"), ("Elif Kaya", "Izmir"), ("Farid Haddad", "Beirut"),
    ("Greta Berg", "Oslo"), ("Hiro Tanaka", "Osaka"), ("Ines Moreau", "Lyon"),
    ("Jonas Weber", "Bremen"), ("Kira Novak", "Brno"), ("Luis Ortega", "Seville"),
    ("Maya Cohen", "Haifa"), ("Nils Lund", "Malmo"), ("Olga Petrova", "Kazan"),
    ("Paulo Reis", "Braga"), ("Quinn Hale", "Leeds"), ("Rosa Marin", "Valencia"),
    ("Sami Virtanen", "Tampere"), ("Tara Singh", "Pune"), ("Uma Rao", "Mysore"),
    ("Viktor Horvat", "Split"),
]  # fmt: skip
PRODUCTS = [
    ("desk lamp", 24.5), ("notebook", 3.2), ("fountain pen", 18.0), ("backpack", 49.9),
    ("water bottle", 12.75), ("headphones", 79.0), ("coffee mug", 8.4), ("keyboard", 55.0),
    ("mouse pad", 6.5), ("phone stand", 14.99),
]  # fmt: skip
SCHEMA = (
    'Write the order below as one JSON object with exactly these keys: "order_id" (integer), '
    '"customer" (string), "city" (string), "items" (a list of objects with the keys '
    '"product", "quantity" and "unit_price"), "total" (number) and "paid" (boolean).'
)


def order_prompts(n: int, seed: int = 19) -> list[dict[str, str]]:
    """`n` distinct prompts of one schema: the same instruction, different orders."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        name, city = CUSTOMERS[i % len(CUSTOMERS)]
        items = rng.sample(PRODUCTS, 2)
        qty = [rng.randint(1, 4) for _ in items]
        paid = rng.random() < 0.5
        bought = " and ".join(
            f"{q} x {p} at {price:.2f} each" for q, (p, price) in zip(qty, items, strict=True)
        )
        text = (
            f"{SCHEMA}\nOrder {1000 + i}: {name} from {city} bought {bought}; the order is "
            f"{'paid' if paid else 'not paid yet'}.\nJSON:\n"
        )
        out.append({"id": f"order-{i + 1:02d}", "task": "json", "prompt": text})
    return out


def specreg(*args: str) -> dict[str, Any]:
    """`specreg ARGS --json`: the document, or exit with its error."""
    proc = subprocess.run(
        [sys.executable, "-m", "specreg", *args, "--json"], capture_output=True, text=True
    )
    if proc.returncode != 0:
        sys.exit(f"specreg {' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return dict(json.loads(proc.stdout))


def figures(run: dict[str, Any]) -> dict[str, Any]:
    generated = sum(p["predicted_n"] or 0 for p in run["prompts"])
    drafted, accepted = run["draft_n"] or 0, run["draft_n_accepted"] or 0
    return {
        "run": run["run_id"],
        "tps": run["tokens_per_s"],
        "drafted": drafted,
        "accepted": accepted,
        "generated": generated,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=20, help="workload size (half builds)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--n-predict", type=int, default=96)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    from specreg.llama.install import find_llama
    from specreg.llama.models import ensure_test_models

    install = find_llama()
    models = ensure_test_models(install.binary("llama-quantize"))
    smol = str(models.smollm2.path)
    draft = str(models.draft("smollm2", "Q4_0").path)
    home = Path(tempfile.mkdtemp(prefix="specreg-bench-"))
    os.environ["SPECREG_HOME"] = str(home)
    prompts = order_prompts(args.prompts)
    half = len(prompts) // 2
    first, second = home / "first.jsonl", home / "second.jsonl"
    first.write_text("".join(json.dumps(p) + "\n" for p in prompts[:half]))
    second.write_text("".join(json.dumps(p) + "\n" for p in prompts[half:]))
    common = ["--threads", str(args.threads), "--n-predict", str(args.n_predict), "--repeat", "1",
              "--retries", "1"]  # fmt: skip

    n_held = len(prompts) - half
    print(
        f"llama.cpp {install.version}; SmolLM2-135M Q4_1; threads {args.threads}; n_predict "
        f"{args.n_predict}; {len(prompts)} prompts of one JSON schema, {half} build the cache, "
        f"{n_held} held out; {args.rounds} rounds\n"
    )
    built_from = specreg("run", smol, "--prompts", str(first), *common)["run"]
    cache = specreg(
        "lookup-cache", "build", "orders", "--task", "json", "--model", smol,
        "--run", str(built_from["run_id"]), "--threads", str(args.threads),
    )["cache"]  # fmt: skip
    print(f"cache `orders` from run {built_from['run_id']} (the first {half} prompts and their "
          f"outputs): {cache['n_tokens']} tokens, {cache['n_ngrams']} n-grams, "
          f"{cache['n_bytes']} bytes, family {cache['tok_family']}\n")  # fmt: skip
    held = {hashlib.sha256(p["prompt"].encode()).hexdigest() for p in prompts[half:]}
    assert not held & set(cache["prompt_sha256s"]), "a held-out prompt built the cache"

    methods: dict[str, list[str]] = {
        "plain": [],
        "ngram-mod": ["--spec-type", "ngram-mod"],
        "ngram-mod K=16 (n-min 4)": ["--spec-type", "ngram-mod", "--k", "16"],
        "ngram-cache (context only)": ["--spec-type", "ngram-cache"],
        "ngram-cache + cache": ["--spec-type", "ngram-cache", "--lookup-cache", "orders"],
        "ngram-mod,ngram-cache + cache": [
            "--spec-type", "ngram-mod,ngram-cache", "--lookup-cache", "orders",
        ],
    }  # fmt: skip
    got: dict[str, list[dict[str, Any]]] = {m: [] for m in methods}
    names = list(methods)
    for r in range(args.rounds):
        order = names[r % len(names) :] + names[: r % len(names)]  # rotate: interleaved
        for name in order:
            run = specreg("run", smol, "--prompts", str(second), *methods[name], *common)["run"]
            assert run["regime"] == "first-encounter" and run["trusted"], run["trust_reason"]
            assert run["status"] == "ok", run["error"]
            got[name].append(figures(run))
    print("| method (held-out prompts) | drafted | accepted | accepted/drafted "
          "| accepted/generated | tok/s (median) | runs |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for name, rows in got.items():
        d, a, g = (sum(x[k] for x in rows) for k in ("drafted", "accepted", "generated"))
        tps = statistics.median(x["tps"] for x in rows if x["tps"])
        per_drafted = f"{a / d:.3f}" if d else "-"
        print(f"| {name} | {d} | {a} | {per_drafted} | {a / g:.3f} | {tps:.1f} "
              f"| {', '.join(str(x['run']) for x in rows)} |")  # fmt: skip

    stack = specreg(
        "run", smol, "--spec-type", "ngram-mod,draft-simple", "--draft", draft, "--task", "code",
        "--max-prompts", "2", *common,
    )["run"]  # fmt: skip
    print(f"\nstack run {stack['run_id']}: {stack['spec_type']} with the Q4_0 draft on 2 code "
          f"prompts: {stack['draft_n_accepted']}/{stack['draft_n']} accepted, "
          f"{stack['tokens_per_s']:.1f} tok/s")  # fmt: skip
    for spec_type, f in (stack.get("type_figures") or {}).items():
        print(f"  {spec_type}: {f}")

    # What recommend makes of these runs: listed unasked only where they predict a win.
    rec = specreg("recommend", smol, "--task", "json", "--top", "50")
    cached = [o for o in rec["options"] if o["lookup_cache"]]
    best = rec["options"][0]
    kind = best["stack"] or best["method"]
    print(f"\nrecommend --task json: best {kind} K={best['k']} at {best['tps']:.1f} "
          f"t/s; workload-cache options listed unasked: {len(cached)}")  # fmt: skip
    asked = specreg("recommend", smol, "--task", "json", "--spec-type", "ngram-cache")
    for o in asked["options"]:
        if o["lookup_cache"]:
            runs = ", ".join(e["row_id"] for e in o["evidence"])
            print(f"recommend --spec-type ngram-cache: cache={o['lookup_cache']} predicted "
                  f"{o['tps']:.1f} t/s ({o['speedup']:.2f}x plain), evidence {runs}")  # fmt: skip


if __name__ == "__main__":
    main()
