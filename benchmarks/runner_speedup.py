"""Speedup table for the small real models on this host.

    SPECREG_CACHE=$PWD/.cache python benchmarks/runner_speedup.py [--n-predict 128] [--repeat 3]

One baseline per target (shared by its configs, measured with top probabilities), then each
configuration verified against it. Prints a markdown table; runs are not recorded.
"""

from __future__ import annotations

import argparse
import time

from specreg.host.machine import detect_host
from specreg.llama.config import Config
from specreg.llama.install import find_llama
from specreg.llama.models import ensure_test_models
from specreg.runner.measure import Probes, measure
from specreg.runner.settings import Settings
from specreg.runner.verify import judge
from specreg.runner.workload import load_workload


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n-predict", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--tasks", default="code,summarize")
    ap.add_argument("--k", default="2,4,8")
    ap.add_argument("--threads", type=int, default=None, help="default: physical cores")
    ap.add_argument("--retries", type=int, default=2, help="re-measure contended samples")
    args = ap.parse_args()
    install = find_llama()
    host = detect_host()
    models = ensure_test_models(install.binary("llama-quantize"))
    workload = load_workload(tuple(args.tasks.split(",")))
    ks = [int(k) for k in args.k.split(",")]
    threads = args.threads or host.threads
    print(f"host: {host.cpu_model}, {host.physical_cores} cores, llama.cpp threads {threads}")
    print(
        f"llama.cpp {install.version}; prompts {workload.name} ({len(workload.prompts)}); "
        f"n_predict {args.n_predict}; repeats {args.repeat}\n"
    )
    print(
        "| target | config | draft | tok/s (median, range) | baseline tok/s | speedup [range] "
        "| acceptance | verdict |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for target in (models.smollm2, models.gemma3):
        t0 = time.monotonic()
        kw = Settings(n_predict=args.n_predict, repeats=args.repeat, retries=args.retries)
        plain = Config(threads=args.threads)
        base = measure(
            install, host, plain, target.path, None, workload, kw, probes=Probes(probs=True)
        )
        refs = {p.prompt.prompt_id: p.tokens for p in base.prompts}
        configs = [
            (plain.with_(spec_type="draft-simple", k=k), models.draft(target.family, q))
            for q in ("Q8_0", "Q4_0")
            for k in ks
        ]
        configs += [(plain.with_(spec_type=t), None) for t in ("ngram-simple", "ngram-mod")]
        other = models.gemma3 if target.family == "smollm2" else models.smollm2
        configs.append((plain.with_(spec_type="draft-simple", k=4), other))
        for cfg, draft in configs:
            m = measure(install, host, cfg, target.path, draft.path if draft else None,
                        workload, kw, probes=Probes(reference_tokens=refs))  # fmt: skip
            v = judge(base, m)
            rng = m.tokens_per_s_range
            brng = base.tokens_per_s_range
            tps = f"{m.tokens_per_s:.1f} ({rng[0]:.1f}-{rng[1]:.1f})" if rng else "-"
            btps = f"{base.tokens_per_s:.1f} ({brng[0]:.1f}-{brng[1]:.1f})" if brng else "-"
            sp = (
                f"{v.speedup:.2f}x [{v.speedup_range[0]:.2f}-{v.speedup_range[1]:.2f}]"
                if v.speedup and v.speedup_range
                else "-"
            )
            acc = f"{m.acceptance:.0%}" if m.acceptance is not None else "-"
            dname = f"{draft.family} {draft.quant}" if draft else "-"
            verdict = v.verdict + ("" if v.passed else f": {v.reason[:90]}")
            ties = sum(p.verdict == "near-tie" for p in v.prompts)
            if ties:
                verdict += f" ({ties} near-tie)"
            print(f"| {target.family} {target.quant} | {cfg.label} | {dname} | {tps} | {btps} "
                  f"| {sp} | {acc} | {verdict} |", flush=True)  # fmt: skip
        print(f"<!-- {target.family}: {time.monotonic() - t0:.0f} s -->", flush=True)


if __name__ == "__main__":
    main()
