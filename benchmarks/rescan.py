"""A no-change rescan of 1,000 GGUF files (target: under 0.5 s), against the physical floor
of walking and stat-ing the same tree (`os.walk` + `os.stat`) measured in the same run; both
in-process (`scan_paths`) and as a whole `specreg scan` process (interpreter and imports too).

Usage: python benchmarks/rescan.py [--files 1000] [--runs 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from gguf import GGUFWriter

from specreg.registry.db import opened
from specreg.registry.scan import scan_paths


def write_tree(root: Path, n: int) -> None:
    for i in range(n):
        sub = root / f"org{i % 25}" / f"model{i % 97}"
        sub.mkdir(parents=True, exist_ok=True)
        w = GGUFWriter(sub / f"m{i:04d}-Q4_K_M.gguf", "llama")
        w.add_name(f"model {i}")
        w.add_block_count(2)
        w.add_tokenizer_model("gpt2")
        w.add_token_list([f"t{i}-{j}" for j in range(64)])
        w.add_token_merges(["t 1"])
        w.add_tensor("token_embd.weight", np.zeros((4, 4), dtype=np.float32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--files", type=int, default=1000)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "models"
        write_tree(root, args.files)
        db = Path(tmp) / "registry.duckdb"
        with opened(db) as con:
            t0 = time.perf_counter()
            first = scan_paths(con, [root])
            cold = time.perf_counter() - t0
            times = []
            for _ in range(args.runs):
                t0 = time.perf_counter()
                again = scan_paths(con, [root])
                times.append(time.perf_counter() - t0)
        assert first.n_models == args.files and again.n_unchanged == args.files
        t0 = time.perf_counter()
        for dirpath, _, names in os.walk(root):
            for name in names:
                os.stat(os.path.join(dirpath, name))
        floor = time.perf_counter() - t0
        cmd = [sys.executable, "-m", "specreg", "scan", str(root), "--db", str(db)]
        process = []
        for _ in range(args.runs):
            t0 = time.perf_counter()
            subprocess.run(cmd, stdout=subprocess.DEVNULL, check=True)
            process.append(time.perf_counter() - t0)
        best = min(times)
        print(
            f"{args.files} files: first scan {cold:.2f} s; no-change rescan best {best:.3f} s,"
            f" median {statistics.median(times):.3f} s, worst {max(times):.3f} s"
        )
        print(f"walk+stat floor {floor * 1e3:.1f} ms; rescan / floor = {best / floor:.1f}x")
        print(
            f"as a `specreg scan` process: best {min(process):.3f} s, median"
            f" {statistics.median(process):.3f} s, worst {max(process):.3f} s"
        )
        print(
            f"target < 0.5 s: in-process {'PASS' if best < 0.5 else 'FAIL'}, "
            f"process {'PASS' if min(process) < 0.5 else 'FAIL'}"
        )


if __name__ == "__main__":
    main()
