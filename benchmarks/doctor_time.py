"""How long `specreg doctor` takes on this machine (goal: under 10 s), and what it measured.

Runs the real command (bandwidth measurement included) a few times as a user would, and prints
each wall time, the bandwidth it measured with its method, and the load it saw (doctor measures
again while other processes take the CPU, within a time budget).

Run: python benchmarks/doctor_time.py [--runs N]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

GOAL_S = 10.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    walls = []
    for _ in range(args.runs):
        t0 = time.monotonic()
        r = subprocess.run(
            [sys.executable, "-m", "specreg", "doctor", "--json"], capture_output=True, text=True
        )
        walls.append(time.monotonic() - t0)
        doc = json.loads(r.stdout)
        bw = doc["bandwidth"] or {}
        print(
            f"{walls[-1]:5.1f} s wall (doctor's own {doc['seconds']:.1f} s), exit {r.returncode}, "
            f"{doc['n_findings']} finding(s); read {bw.get('read_gbs', 0):.1f} GB/s (median "
            f"{bw.get('read_median_gbs', 0):.1f}), huge pages {bw.get('huge_gain') or 0:+.1%}, "
            f"others used {bw.get('foreign_share') or 0:.0%} of the CPUs, "
            f"{bw.get('attempts', 0)} re-measurement(s)"
        )
    print(f"method: {bw.get('method_str')}")
    worst = max(walls)
    print(
        f"median {statistics.median(walls):.1f} s, worst {worst:.1f} s: "
        f"{'under' if worst < GOAL_S else 'OVER'} the {GOAL_S:.0f} s goal"
    )


if __name__ == "__main__":
    main()
