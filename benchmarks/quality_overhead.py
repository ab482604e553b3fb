"""What specreg's quality measurement costs over the plain llama-perplexity calls it wraps.

    SPECREG_CACHE=$PWD/.cache flock /tmp/specreg-llama.lock python benchmarks/quality_overhead.py

One measurement is SmolLM2-135M Q4_0 against its Q4_1 on one shipped text with a cold
reference: `--kl-divergence-base` on the reference, then `--kl-divergence` on Q4_0. The
competitor runs exactly those two commands with subprocess and nothing else. Both alternate
for `--repeat` rounds (interleaved, so a noisy neighbour hits both); the ratio of medians is
specreg's overhead (registry, cache bookkeeping, size estimate, parsing). A warm measurement
(reference cached) is timed against the single `--kl-divergence` call as well.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from specreg.host.machine import detect_host
from specreg.llama.install import find_llama
from specreg.llama.models import ensure_test_models
from specreg.llama.perplexity import LogitsCache
from specreg.quality.kld import Measuring, measure_quality, plan_quality, quality_texts
from specreg.registry.db import opened


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--task", default="prose")
    ap.add_argument("--chunks", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    install = find_llama()
    host = detect_host()
    models = ensure_test_models(install.binary("llama-quantize"))
    ref, lossy = models.smollm2.path, models.draft("smollm2", "Q4_0").path
    (text,) = quality_texts((args.task,))
    binary = str(install.binary("llama-perplexity"))
    tmp = Path(tempfile.mkdtemp(prefix="specreg-bench-"))
    common = ["-f", str(text.path), "-c", "128", "-t", str(args.threads)]
    common += ["--chunks", str(args.chunks)]
    base = tmp / "plain.kld"
    plain_save = [binary, "-m", str(ref), *common, "--kl-divergence-base", str(base)]
    plain_kld = [binary, "-m", str(lossy), *common, "--kl-divergence-base", str(base),
                 "--kl-divergence"]  # fmt: skip

    def run_plain(argv: list[str]) -> float:
        t0 = time.monotonic()
        subprocess.run(argv, capture_output=True, check=True)
        return time.monotonic() - t0

    times: dict[str, list[float]] = {"specreg cold": [], "plain cold": [], "specreg warm": [],
                                     "plain warm": []}  # fmt: skip
    with opened(tmp / "registry.duckdb") as con:
        plan = plan_quality(con, lossy, reference=ref)  # scans both models once, untimed
        for i in range(args.repeat):
            m = Measuring(install, host, chunks=args.chunks, threads=args.threads,
                          cache=LogitsCache(tmp / f"cache-{i}"))  # fmt: skip
            t0 = time.monotonic()
            cold = measure_quality(con, m, plan, (text,))
            times["specreg cold"].append(time.monotonic() - t0)
            t0 = time.monotonic()
            warm = measure_quality(con, m, plan, (text,))
            times["specreg warm"].append(time.monotonic() - t0)
            assert cold.ok and warm.ok and warm.points[0].reference_cached
            times["plain cold"].append(run_plain(plain_save) + run_plain(plain_kld))
            times["plain warm"].append(run_plain(plain_kld))
    s = cold.points[0].stats
    assert s is not None
    print(f"host: {host.cpu_model}, threads {args.threads}; llama.cpp {install.version}")
    print(
        f"SmolLM2-135M Q4_0 against Q4_1 on {text.name}: {cold.points[0].n_tokens} tokens, "
        f"mean KLD {s.mean_kld:.4f} ± {s.mean_kld_unc:.4f}, same top {s.same_top:.1%}"
    )
    print(f"{args.repeat} interleaved rounds, median seconds [min-max]:\n")
    print("| measurement | specreg | plain llama-perplexity | overhead ratio |")
    print("|---|---|---|---|")
    for kind in ("cold", "warm"):
        ours, theirs = times[f"specreg {kind}"], times[f"plain {kind}"]
        mo, mt = statistics.median(ours), statistics.median(theirs)
        what = "reference saved + KLD" if kind == "cold" else "reference cached: KLD only"
        print(f"| {what} | {mo:.2f} [{min(ours):.2f}-{max(ours):.2f}] "
              f"| {mt:.2f} [{min(theirs):.2f}-{max(theirs):.2f}] | {mo / mt:.2f}x |")  # fmt: skip


if __name__ == "__main__":
    main()
