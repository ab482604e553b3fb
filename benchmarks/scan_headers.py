"""Header reading speed on llama.cpp's real vocab GGUFs, against gguf-py and against `cat`.

Targets (issue 2): at least 150x faster than gguf-py's GGUFReader on the same files, and
within 20x of the time to simply read those bytes (`cat FILES > /dev/null`), both measured here
in one run with warm page cache. Usage: python benchmarks/scan_headers.py [--reader-files N]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import time

from gguf import GGUFReader

from specreg.registry.gguf_header import read_header
from specreg.sources import vocab_gguf_paths


def best_of(n: int, fn) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--reader-files", type=int, default=0, help="GGUFReader on N files (0: all)")
    args = ap.parse_args()
    paths = vocab_gguf_paths()
    total_bytes = sum(p.stat().st_size for p in paths)
    subprocess.run(["cat", *map(str, paths)], stdout=subprocess.DEVNULL, check=True)  # warm

    cat = best_of(5, lambda: subprocess.run(["cat", *map(str, paths)], stdout=subprocess.DEVNULL))
    ours_each = {p.name: best_of(3, lambda p=p: read_header(p)) for p in paths}
    ours = sum(ours_each.values())

    subset = paths if args.reader_files <= 0 else paths[: args.reader_files]
    reader_each = {}
    for p in subset:
        t0 = time.perf_counter()
        GGUFReader(p)
        reader_each[p.name] = time.perf_counter() - t0
    reader = sum(reader_each.values())
    ours_subset = sum(ours_each[p.name] for p in subset)

    print(f"{len(paths)} vocab GGUFs, {total_bytes / 1e6:.1f} MB")
    print(f"{'file':34} {'specreg ms':>11} {'GGUFReader s':>13} {'ratio':>8}")
    for p in paths:
        r = reader_each.get(p.name)
        ratio = f"{r / ours_each[p.name]:8.0f}x" if r else ""
        rs = f"{r:13.2f}" if r else ""
        print(f"{p.name:34} {ours_each[p.name] * 1e3:11.1f} {rs:>13} {ratio}")
    speedup = reader / ours_subset
    vs_cat = ours / cat
    print(
        f"\nspecreg total {ours * 1e3:.0f} ms; GGUFReader {reader:.1f} s on {len(subset)} files;"
        f" cat {cat * 1e3:.1f} ms"
    )
    print(
        f"speedup over GGUFReader: {speedup:.0f}x (target >= 150x) "
        f"{'PASS' if speedup >= 150 else 'FAIL'}"
    )
    print(
        f"time relative to cat:    {vs_cat:.1f}x (target <= 20x) "
        f"{'PASS' if vs_cat <= 20 else 'FAIL'}"
    )
    print(f"median per file: {statistics.median(ours_each.values()) * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
