"""How fast the command line answers, end to end, against the floor measured in the same run.

The floor is what any Python CLI built on click and rich pays: a fresh interpreter importing
click and rich (`python -c "import click, rich.console, rich.table"`); commands that read the
registry also pay for DuckDB, so their floor adds `import duckdb`. Every command runs as the
user runs it (a new process of the installed `specreg` entry point) on the demo collection,
scanned, with the recommender's fit already cached. Rounds are interleaved (each round runs
every command once) so a noisy neighbour hits all of them alike. Goals are judged on the best
round of each (other processes on a shared host only ever add time); medians are shown too.

Goals (issue 21): `--help` and every `COMMAND --help` within 1.5x of the floor; `models`,
`show`, `runs` within 1.5x of the floor with DuckDB; `recommend` with a cached fit under 1.5 s.

Usage: python benchmarks/cli_startup.py [--rounds 9]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FLOOR = [sys.executable, "-c", "import click, rich.console, rich.table"]
FLOOR_DB = [sys.executable, "-c", "import click, rich.console, rich.table, duckdb"]
TARGET = "Qwen2.5 Coder 32B Instruct"
DRAFT = "Qwen2.5 Coder 0.5B Instruct"


def specreg_argv() -> list[str]:
    """The installed entry point, as users run it (else the module, as the tests do)."""
    found = shutil.which("specreg")
    return [found] if found else [sys.executable, "-m", "specreg"]


def commands() -> list[tuple[str, list[str], str]]:
    """(label, arguments, goal) for every command measured; goal: "help", "registry" or ""."""
    import click

    from specreg.cli.main import COMMAND_MODULES, cli

    out = [("--version", ["--version"], "help"), ("--help", ["--help"], "help")]
    ctx = click.Context(cli)
    for name in sorted(COMMAND_MODULES):
        out.append((f"{name} --help", [name, "--help"], "help"))
        command = cli.get_command(ctx, name)
        if isinstance(command, click.Group):
            for sub in sorted(command.list_commands(ctx)):
                out.append((f"{name} {sub} --help", [name, sub, "--help"], "help"))
    out += [
        ("models", ["models"], "registry"),
        ("show M", ["show", TARGET], "registry"),
        ("runs", ["runs"], "registry"),
        ("plan", ["plan", "--spec", "{spec}"], ""),
        ("compat T D", ["compat", TARGET, DRAFT], ""),
        ("drafts T", ["drafts", TARGET], ""),
        ("audit", ["audit"], ""),
        ("recommend T", ["recommend", TARGET], "recommend"),
    ]
    return out


def timed(argv: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    r = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    seconds = time.perf_counter() - t0
    if r.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(argv)} failed: {r.stderr.decode(errors='replace')}")
    return seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=9)
    args = ap.parse_args()
    base = specreg_argv()
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        env = {**os.environ, "SPECREG_HOME": str(home)}
        env.pop("SPECREG_LLAMA_BIN", None)
        demo = Path(tmp) / "demo"
        spec = Path(tmp) / "specreg.yaml"
        spec.write_text("version: 1\n")
        subprocess.run([*base, "demo", str(demo)], env=env, check=True, capture_output=True)
        subprocess.run([*base, "scan", str(demo)], env=env, check=True, capture_output=True)
        # the first recommend fits and caches the model; the measured ones read the cache
        subprocess.run([*base, "recommend", TARGET], env=env, check=True, capture_output=True)

        cases = [
            (label, [*base, *(a.replace("{spec}", str(spec)) for a in argv)], goal)
            for label, argv, goal in commands()
        ]
        times: dict[str, list[float]] = {"floor": [], "floor+duckdb": []}
        times.update({label: [] for label, _, _ in cases})
        for _ in range(args.rounds):
            times["floor"].append(timed(FLOOR, env))
            times["floor+duckdb"].append(timed(FLOOR_DB, env))
            for label, argv, _ in cases:
                times[label].append(timed(argv, env))

    med = {k: statistics.median(v) for k, v in times.items()}
    best = {k: min(v) for k, v in times.items()}
    floor, floor_db = best["floor"], best["floor+duckdb"]
    load = os.getloadavg()[0]
    print(f"{os.cpu_count()} CPUs (load {load:.1f}), {args.rounds} interleaved rounds; ratios of")
    print("best rounds (medians in brackets)")
    print(
        f"floor (python + click + rich):       {floor * 1000:5.0f} ms [{med['floor'] * 1000:.0f}]"
    )
    print(
        f"floor + duckdb (registry commands):  {floor_db * 1000:5.0f} ms "
        f"[{med['floor+duckdb'] * 1000:.0f}]"
    )
    print()
    print(f"{'command':28} {'ms':>6} {'[median]':>9} {'vs floor':>9} {'vs +duckdb':>11}  goal")
    missed = []
    for label, _, goal in cases:
        t = best[label]
        ratio, ratio_db = t / floor, t / floor_db
        if goal == "help":
            ok, want = ratio <= 1.5, "<= 1.5x floor"
        elif goal == "registry":
            ok, want = ratio_db <= 1.5, "<= 1.5x floor+duckdb"
        elif goal == "recommend":
            ok, want = t < 1.5, "< 1.5 s"
        else:
            ok, want = True, ""
        mark = "" if not want else ("ok  " if ok else "MISS")
        m = f"[{med[label] * 1000:.0f}]"
        print(f"{label:28} {t * 1000:6.0f} {m:>9} {ratio:8.2f}x {ratio_db:10.2f}x  {mark} {want}")
        if not ok:
            missed.append(label)
    helps = [best[label] / floor for label, _, goal in cases if goal == "help"]
    print()
    print(f"--help family: {min(helps):.2f}x-{max(helps):.2f}x of the floor")
    print(f"goals missed: {', '.join(missed) if missed else 'none'}")


if __name__ == "__main__":
    main()
