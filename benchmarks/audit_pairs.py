"""All-pairs audit of a 500-model registry (target: under 2 s), against a naive auditor that
compares every ordered pair token by token, measured in the same run.

The registry: the demo collection (sparse GGUFs with real shapes and tokenizer layouts: Qwen2.5
padded and unpadded, Qwen3, DeepSeek-R1-Distill, Llama 3, Gemma 3, an EAGLE-3 head) plus
llama.cpp's 19 real vocab GGUFs, really scanned. It is then grown to 500 models by adding
quantisation variants of the scanned models as registry rows (new ids, sizes and quant names,
the same vocabulary rows): what a scan of 500 such files would store, without writing 500
multi-megabyte vocabularies to disk. The tokenizer families are those of the scanned files.

The naive auditor loads each model's token list and, for every ordered pair, applies llama.cpp's
checks in llama.cpp's order with the token-by-token text loop. Running it on all ~250,000 pairs
would take long, so it runs on a uniform random sample of pairs and the total is extrapolated
(printed as such, with the sample size).

Usage: python benchmarks/audit_pairs.py [--models 500] [--sample 1000]
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path

TARGET_SECONDS = 2.0
QUANTS = [("Q8_0", 1.0), ("Q6_K", 0.98), ("Q5_K_M", 0.97), ("Q4_K_M", 0.96), ("Q4_0", 0.95),
          ("Q3_K_M", 0.94), ("Q2_K", 0.93), ("IQ4_XS", 0.955), ("F16", 1.01), ("BF16", 1.011),
          ("IQ3_XXS", 0.925), ("Q4_K_S", 0.958)]  # fmt: skip


def build_registry(db: Path, n_models: int) -> int:
    from specreg.host.sources import vocab_gguf_paths
    from specreg.registry.db import opened
    from specreg.registry.scan import scan_paths
    from specreg.samples.demo import make_demo_tree

    tree = db.parent / "demo"
    make_demo_tree(tree)
    with opened(db) as con:
        result = scan_paths(con, [tree, vocab_gguf_paths()[0].parent])
        assert result.ok, result.errors
        ids = [r[0] for r in con.execute("SELECT model_id FROM models ORDER BY path").fetchall()]
        variant = 0
        while len(ids) * (variant + 1) < n_models:
            quant, factor = QUANTS[variant % len(QUANTS)]
            variant += 1
            con.execute(
                "INSERT INTO models SELECT * REPLACE ("
                " model_id || '-v' || ? AS model_id,"
                " coalesce(name, basename, model_id) || ' ' || ? || ' v' || ? AS name,"
                " ? AS quant,"
                " CAST(n_params * ? AS BIGINT) AS n_params,"
                " CAST(n_params_active * ? AS BIGINT) AS n_params_active)"
                " FROM models WHERE model_id IN (SELECT unnest(?::VARCHAR[]))",
                [variant, quant, variant, quant, factor, factor, ids],
            )
        # Trim to exactly n_models.
        all_ids = [
            r[0] for r in con.execute("SELECT model_id FROM models ORDER BY model_id").fetchall()
        ]
        extra = all_ids[n_models:]
        if extra:
            con.execute(
                "DELETE FROM models WHERE model_id IN (SELECT unnest(?::VARCHAR[]))", [extra]
            )
        return int(con.execute("SELECT count(*) FROM models").fetchone()[0])


def naive_pair(t, d, vt, vd, rules) -> bool:  # type: ignore[no-untyped-def]
    """llama.cpp's loop as written: scalar checks, then every token text from id 5."""
    from specreg.auditor.vocab import llama_text

    if t.vocab_type != d.vocab_type:
        return False
    for kind in ("bos", "eos"):
        add_t, add_d = bool(getattr(t, f"add_{kind}")), bool(getattr(d, f"add_{kind}"))
        if add_t != add_d or (add_t and getattr(t, f"{kind}_id") != getattr(d, f"{kind}_id")):
            return False
    if abs((t.n_tokens or 0) - (d.n_tokens or 0)) > rules.vocab_max_size_difference:
        return False
    if vt is None or vd is None:
        return vt is vd
    for i in range(rules.vocab_check_start_token_id, min(len(vt.tokens), len(vd.tokens))):
        if llama_text(vt.tokens, i) != llama_text(vd.tokens, i):
            return False
    return True


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", type=int, default=500)
    ap.add_argument("--sample", type=int, default=1000)
    args = ap.parse_args()

    from specreg.auditor import audit_all
    from specreg.auditor.rules import PINNED_RULES
    from specreg.registry.db import opened
    from specreg.registry.queries import list_models
    from specreg.registry.vocab_store import load_vocab

    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "registry.duckdb"
        t0 = time.perf_counter()
        n = build_registry(db, args.models)
        print(f"registry: {n} models, built in {time.perf_counter() - t0:.1f} s")
        with opened(db) as con:
            models = list_models(con)
            families = {m.tok_fingerprint for m in models}
            print(
                f"tokenizer families (fingerprints): {len(families)}, distinct vocabularies: "
                f"{len({m.vocab_sha for m in models})}"
            )
            times = []
            for _ in range(3):
                t0 = time.perf_counter()
                result = audit_all(con)
                times.append(time.perf_counter() - t0)
            bucketed = min(times)
            print(
                f"bucketed audit_all: {result.n_pairs} ordered pairs in {bucketed:.3f} s "
                f"(best of 3; runs {', '.join(f'{t:.3f}' for t in times)}); "
                f"{result.vocab_comparisons} text comparisons; counts {result.counts}"
            )

            # The naive auditor: vocabularies loaded once, then every sampled pair on its own.
            vocabs = {}
            t0 = time.perf_counter()
            for m in models:
                if m.vocab_sha and m.vocab_sha not in vocabs:
                    vocabs[m.vocab_sha] = load_vocab(con, m.vocab_sha)
            load_s = time.perf_counter() - t0
            rng = random.Random(0)
            pairs = [(a, b) for a, b in (rng.sample(models, 2) for _ in range(args.sample))]
            t0 = time.perf_counter()
            accepted = 0
            for t, d in pairs:
                accepted += naive_pair(
                    t, d, vocabs.get(t.vocab_sha), vocabs.get(d.vocab_sha), PINNED_RULES
                )
            sample_s = time.perf_counter() - t0
            naive_total = load_s + sample_s / len(pairs) * result.n_pairs
            print(
                f"naive token-by-token: {sample_s:.2f} s for {len(pairs)} sampled pairs "
                f"({accepted} accepted) -> {naive_total:.1f} s extrapolated to "
                f"{result.n_pairs} pairs (incl. {load_s:.2f} s loading vocabularies)"
            )
    print(f"ratio naive / bucketed: {naive_total / bucketed:.0f}x")
    ok = bucketed < TARGET_SECONDS
    print(f"target: all pairs under {TARGET_SECONDS:.0f} s -> {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
