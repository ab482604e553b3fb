"""Scan speed on llama.cpp's real vocab GGUFs, against gguf-py and against `cat`.

Three measurements in one run, warm page cache:
- the header parser alone, per file, against gguf-py's `GGUFReader` on the same files and
  against `cat FILES > /dev/null` (targets: >= 150x faster than GGUFReader, <= 20x cat);
- the whole `specreg scan DIR` process into a fresh registry (interpreter start, imports,
  parse, facts, compression, DuckDB writes), against the same GGUFReader total (issue 11:
  >= 150x, i.e. under 0.85 s where GGUFReader takes 125 s);
- a no-change rescan of the same folder, as a process.

Usage: python benchmarks/scan_headers.py [--reader-files N] [--runs 5]
(--reader-files N times GGUFReader on the first N files only, and estimates the rest.)
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

from gguf import GGUFReader

from specreg.host.sources import vocab_gguf_paths
from specreg.registry.gguf_header import read_header


def best_of(n: int, fn: Callable[[], object]) -> float:
    return min(timed(fn) for _ in range(n))


def timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def spread(times: list[float]) -> str:
    return (
        f"best {min(times):.3f} s, median {statistics.median(times):.3f} s, "
        f"worst {max(times):.3f} s over {len(times)} runs"
    )


def scan_process(folder: Path, db: Path, *, fresh: bool) -> float:
    """Wall time of one `specreg scan FOLDER` process."""
    if fresh:
        for p in (db, Path(f"{db}.wal")):
            p.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "specreg", "scan", str(folder), "--db", str(db)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    elapsed = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"specreg scan failed ({proc.returncode}): {proc.stderr.strip()}")
    return elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--reader-files", type=int, default=0, help="GGUFReader on N files (0: all)")
    ap.add_argument("--runs", type=int, default=5, help="runs of each whole-process scan")
    args = ap.parse_args()
    paths = vocab_gguf_paths()
    folder = paths[0].parent
    assert sorted(folder.glob("*.gguf")) == paths, "the vocab folder holds other GGUFs"
    total_bytes = sum(p.stat().st_size for p in paths)
    subprocess.run(["cat", *map(str, paths)], stdout=subprocess.DEVNULL, check=True)  # warm

    cat = best_of(5, lambda: subprocess.run(["cat", *map(str, paths)], stdout=subprocess.DEVNULL))
    ours_each = {p.name: best_of(3, partial(read_header, p)) for p in paths}
    ours = sum(ours_each.values())

    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "registry.duckdb"
        scan_process(folder, db, fresh=True)  # warm the interpreter's own files
        e2e = [scan_process(folder, db, fresh=True) for _ in range(args.runs)]
        rescan = [scan_process(folder, db, fresh=False) for _ in range(args.runs)]

    subset = paths if args.reader_files <= 0 else paths[: args.reader_files]
    reader_each = {p.name: timed(partial(GGUFReader, p)) for p in subset}
    reader = sum(reader_each.values())
    ours_subset = sum(ours_each[p.name] for p in subset)
    # GGUFReader on every file: measured, or scaled from the subset by the parser's times.
    reader_all = reader if len(subset) == len(paths) else reader * ours / ours_subset

    print(f"{len(paths)} vocab GGUFs, {total_bytes / 1e6:.1f} MB, {os.cpu_count()} cores")
    print(f"{'file':34} {'specreg ms':>11} {'GGUFReader s':>13} {'ratio':>8}")
    for p in paths:
        r = reader_each.get(p.name)
        ratio = f"{r / ours_each[p.name]:8.0f}x" if r else ""
        rs = f"{r:13.2f}" if r else ""
        print(f"{p.name:34} {ours_each[p.name] * 1e3:11.1f} {rs:>13} {ratio}")
    speedup = reader / ours_subset
    vs_cat = ours / cat
    how = "measured" if len(subset) == len(paths) else f"estimated from {len(subset)} files"
    print(
        f"\nparser total {ours * 1e3:.0f} ms; GGUFReader {reader:.1f} s on {len(subset)} files"
        f" ({reader_all:.1f} s on all, {how}); cat {cat * 1e3:.1f} ms"
    )
    print(
        f"parser speedup over GGUFReader: {speedup:.0f}x (target >= 150x) "
        f"{'PASS' if speedup >= 150 else 'FAIL'}"
    )
    print(
        f"parser time relative to cat:    {vs_cat:.1f}x (target <= 20x) "
        f"{'PASS' if vs_cat <= 20 else 'FAIL'}"
    )
    print(f"median per file: {statistics.median(ours_each.values()) * 1e3:.1f} ms")
    whole = min(e2e)
    print(f"\n`specreg scan` process, fresh registry: {spread(e2e)}")
    print(
        f"  GGUFReader (all files) / specreg scan: {reader_all / whole:.0f}x (target >= 150x) "
        f"{'PASS' if reader_all / whole >= 150 else 'FAIL'}; relative to cat: {whole / cat:.0f}x"
    )
    print(f"`specreg scan` process, no-change rescan: {spread(rescan)}")


if __name__ == "__main__":
    main()
