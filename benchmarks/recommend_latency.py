"""`specreg recommend` with a kept fit on the demo collection (goal: under 1.5 s end to end on
a 2-core machine), against the floor measured in the same run: an interpreter that imports
click, rich and DuckDB (what any registry command needs) and exits. Runs alternate, so load
from other processes falls on both. Also prints whether scikit-learn or SciPy was imported
(the fitted model is kept as numpy arrays; importing those two costs ~0.7 s).

Usage: python benchmarks/recommend_latency.py [--runs 7]
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

TARGET = "Qwen2.5 Coder 32B Instruct"
FLOOR = "import click, rich.console, rich.table, duckdb"
HEAVY = "import sys; from specreg.cli.main import main\n" + (
    "sys.argv = ['specreg', *sys.argv[1:]]\n"
    "try:\n    main()\nfinally:\n"
    "    print(sorted({m.split('.')[0] for m in sys.modules} & {'sklearn', 'scipy'}),"
    " file=sys.stderr)\n"
)


def seconds(argv: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, env=env, check=True, capture_output=True)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=7)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "SPECREG_HOME": str(Path(tmp) / "home")}
        specreg = [sys.executable, "-m", "specreg"]
        demo = str(Path(tmp) / "demo")
        subprocess.run([*specreg, "demo", demo], env=env, check=True, capture_output=True)
        subprocess.run([*specreg, "scan", demo], env=env, check=True, capture_output=True)
        recommend = [*specreg, "recommend", TARGET, "--bandwidth", "20"]
        t_fit = seconds(recommend, env)  # the first call fits and keeps the model
        probe = subprocess.run(
            [sys.executable, "-c", HEAVY, *recommend[3:]], env=env, capture_output=True, text=True
        )
        floor, cached = [], []
        for _ in range(args.runs):
            floor.append(seconds([sys.executable, "-c", FLOOR], env))
            cached.append(seconds(recommend, env))
    f, c = statistics.median(floor), statistics.median(cached)
    print(f"first recommend (fits the model): {t_fit:.2f} s")
    print(f"floor (python + click + rich + duckdb): {f:.3f} s (median of {args.runs})")
    print(f"recommend, kept fit: {c:.3f} s = {c / f:.1f}x the floor; goal < 1.5 s: "
          f"{'met' if c < 1.5 else 'NOT met'}")  # fmt: skip
    print(f"heavy modules imported by recommend with a kept fit: {probe.stderr.strip()}")


if __name__ == "__main__":
    main()
