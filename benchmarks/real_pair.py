"""Every prediction specreg makes for a real pair of two sizes, against a measurement, in one run.

    SPECREG_CACHE=$PWD/.cache flock /tmp/specreg-llama.lock python benchmarks/real_pair.py \\
        [--tasks code,prose,json,summarize,math] [--n-predict 32] [--threads 2] [--repeat 1]
        [--prompts 1|N|all] [--keep DIR]

Target Qwen2.5-Coder-1.5B-Instruct, draft Qwen2.5-Coder-0.5B-Instruct (Q4_K_M both, from
`specreg llama models`). Everything goes through the CLI, as a user runs it, into a throwaway
registry (or --keep DIR, whose calibration and agreement are reused):

1. Prediction before any speculative run: `calibrate` (target and draft) and `agree` (per
   task) only, then `recommend --json` per task for plain; draft-simple at K = 2, 4, 8, 16;
   ngram-mod (recommend's K); the stack ngram-mod,draft-simple (recommend's K).
2. Measurement: `run` of each candidate on a fresh llama-server (first encounter: nothing
   drafted or cached before), on the task's first prompt (--prompts all: every prompt of the
   task, the ones `agree` scores, so both sides see the same text), into a second registry so
   no run informs the prediction.
3. Per task: predicted beside measured t/s, Spearman of the two (goal >= 0.8), every t/s within
   25 % (goal), the predicted best's measured speed within 5 % of the measured best (goal).
   Where a goal is missed: which part of the model misses. Acceptance: predicted per-token
   acceptance against the one the run's accepted/drafted implies at its K. Target step: plain
   predicted against plain measured. Verify + draft cost: the seconds of one speculative step
   (tokens per step over t/s), predicted against measured, beside the target's verify pass
   (llama-bench's over K + 1 tokens, times llama-server's pass factor as `calibrate` measured
   it on this host), so the rest is draft cost (and the logits rows of the drafted positions).
4. Tune against the exhaustive sweep: `tune` (default budget 6) replayed over the measurements
   of step 2: each run it asks for is answered with the measured t/s of that candidate; one the
   sweep did not measure is answered as a failed run and named. No run is recorded, so tune's
   refits see no new evidence (its ranking moves only through the measured steps). Its pick's
   measured t/s against the sweep's best (goal: within 5 % on at least 4 of the 5 tasks, with
   at most a third of the sweep's runs).
5. The reference host (--reference): the K `recommend` picks for the shipped sweeps that keep
   the bound, leave-one-family-out, and for the held-out sweeps, against the best constant K
   and the rule of thumb (benchmarks/k_choice.py).

Measurements taken while other processes load the host are not quiet-host numbers: the load
average before and after each phase is printed with the results.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scipy.stats import spearmanr

from specreg.recommender.costmodel import expected_tokens_per_step, per_token_acceptance
from specreg.samples.qwen_pair import ensure_qwen_pair

TASKS = ("code", "prose", "json", "summarize", "math")
DRAFT_KS = (2, 4, 8, 16)
STACK = "ngram-mod,draft-simple"
TOLERANCE = 0.25
BEST_TOLERANCE = 0.05
HERE = Path(__file__).resolve().parent
# Issue 26's table: this 2-core host, quiet, a fresh llama-server per configuration, one code
# prompt, 128 tokens, temperature 0 (t/s; accepted, drafted). Printed beside the prediction for
# code, because measurements taken here under other processes' load are not quiet numbers.
QUIET_CODE = {
    "plain": (18.6, None),
    "draft-simple K=4": (9.8, (93, 132)),
    "draft-simple K=8": (7.9, (105, 172)),
    "draft-simple K=16": (6.4, (109, 277)),
    "ngram-mod K=8": (18.1, (0, 0)),
}


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


class Cli:
    """`specreg` as a user runs it, on one registry."""

    def __init__(self, db: Path, threads: int) -> None:
        self.db = db
        self.threads = threads
        # A shared host: measurements proceed under others' load and say so (the load average
        # is printed); a quiet host needs none of this.
        self.env = {
            **os.environ,
            "SPECREG_MAX_LOAD": os.environ.get("SPECREG_MAX_LOAD", "1000"),
            "SPECREG_MAX_SPREAD": os.environ.get("SPECREG_MAX_SPREAD", "1000"),
        }

    def __call__(self, *args: str, check: bool = True) -> dict[str, Any]:
        argv = [sys.executable, "-m", "specreg", *args, "--db", str(self.db), "--json"]
        r = subprocess.run(argv, capture_output=True, text=True, env=self.env)
        if check and r.returncode != 0:
            raise SystemExit(f"specreg {' '.join(args)} failed ({r.returncode}): {r.stderr[-800:]}")
        return dict(json.loads(r.stdout)) if r.stdout.startswith("{") else {"error": r.stderr}

    def cached(self, path: Path, *args: str) -> dict[str, Any]:
        """A command's document kept in `path` (--keep reuses calibration and agreement).
        Exit 1 is accepted: calibrate's "still disturbed after every retry" is recorded (and
        printed here as contended), not lost."""
        if path.exists():
            return dict(json.loads(path.read_text()))
        doc = self(*args, check=False)
        if "error" in doc:
            raise SystemExit(f"specreg {' '.join(args)} failed: {doc['error'][-800:]}")
        path.write_text(json.dumps(doc))
        return doc


@dataclass
class Candidate:
    label: str
    spec_type: str  # none | draft-simple | ngram-mod | the stack
    k: int | None
    draft: bool
    predicted_tps: float = math.nan
    predicted_acceptance: float | None = None
    measured_tps: float = math.nan
    draft_n: int = 0
    accepted: int = 0
    run_s: float = 0.0
    why: list[str] = field(default_factory=list)

    def run_args(self, draft_path: Path) -> list[str]:
        args = ["--spec-type", self.spec_type] if self.spec_type != "none" else []
        args += ["--k", str(self.k)] if self.k else []
        return args + (["--draft", str(draft_path)] if self.draft else [])

    @property
    def measured_acceptance(self) -> float | None:
        if not self.draft_n or not self.k:
            return None
        return float(per_token_acceptance(self.accepted / self.draft_n, self.k))

    @property
    def error(self) -> float:
        return self.predicted_tps / self.measured_tps - 1.0


def predict(cli: Cli, target: Path, task: str) -> list[Candidate]:
    """recommend's predicted t/s for each candidate on `task` (no run recorded)."""
    by_type = {
        s: cli("recommend", str(target), "--task", task, "--spec-type", s, "--top", "60")["options"]
        for s in ("draft-simple", "ngram-mod", STACK)
    }
    plain = next(o for o in by_type["draft-simple"] if o["method"] == "none")
    out = [Candidate("plain", "none", None, False, plain["tps"], None, why=plain["why"])]
    for k in DRAFT_KS:
        o = next(o for o in by_type["draft-simple"] if o["method"] == "draft" and o["k"] == k)
        out.append(
            Candidate(
                f"draft-simple K={k}",
                "draft-simple",
                k,
                True,
                o["tps"],
                o["acceptance"],
                why=o["why"],
            )
        )
    ngram = max((o for o in by_type["ngram-mod"] if o["method"] != "none"), key=lambda o: o["tps"])
    out.append(
        Candidate(
            f"ngram-mod K={ngram['k']}",
            "ngram-mod",
            ngram["k"],
            False,
            ngram["tps"],
            ngram["acceptance"],
            why=ngram["why"],
        )
    )
    stacks = [o for o in by_type[STACK] if o["stack"] == STACK]
    if stacks:
        s = max(stacks, key=lambda o: o["tps"])
        out.append(
            Candidate(
                f"{STACK} K={s['k']}", STACK, s["k"], True, s["tps"], s["acceptance"], why=s["why"]
            )
        )
    return out


def measure(
    cli: Cli,
    target: Path,
    draft: Path,
    task: str,
    c: Candidate,
    n_predict: int,
    repeat: int = 1,
    prompts: int | None = 1,
) -> None:
    """A first-encounter run of `c` over the task's first `prompts` prompts (None: all of
    them, the ones `agree` scores), or the one a kept registry (--keep) already holds."""
    kept = [
        r for r in cli("runs")["runs"]
        if r["status"] == "ok" and r["task"] == task and r["spec_type"] == c.spec_type
        and (r["k"] == c.k or c.spec_type == "none") and r["kind"] == "run"
        and (prompts is None or len({p.get("prompt_id") for p in r.get("prompts") or []})
             == prompts)
    ]  # fmt: skip
    if kept:
        doc = kept[0]
        c.measured_tps = doc.get("tokens_per_s") or math.nan
        c.draft_n = doc.get("draft_n") or 0
        c.accepted = doc.get("draft_n_accepted") or 0
        return
    t0 = time.monotonic()
    doc = cli(
        "run",
        str(target),
        *c.run_args(draft),
        "--task",
        task,
        *(["--max-prompts", str(prompts)] if prompts else []),
        "--n-predict",
        str(n_predict),
        "--repeat",
        str(repeat),
        "--threads",
        str(cli.threads),
        "--ctx",
        "2048",
        check=False,
    )
    c.run_s = time.monotonic() - t0
    doc = doc.get("run") or doc
    c.measured_tps = doc.get("tokens_per_s") or math.nan
    c.draft_n = doc.get("draft_n") or 0
    c.accepted = doc.get("draft_n_accepted") or 0


def attribution(
    c: Candidate,
    plain: Candidate,
    verify_ratio: dict[int, float],
    step_s: float | None = None,
    pass_factor: float = 1.0,
) -> str:
    """Which part of the model misses for a candidate outside the goal. A step's cost is in
    seconds on both sides (tokens a step over t/s): counted in each side's own plain step, a
    miss of the plain step would pass for a miss of the draft. `step_s` is llama-bench's
    target step, which the calibrated verify ratios are relative to."""
    if c.spec_type == "none":
        return f"target step: predicted {c.predicted_tps:.1f} t/s, measured {c.measured_tps:.1f}"
    parts = []
    a_pred, a_meas = c.predicted_acceptance, c.measured_acceptance
    if a_pred is not None and a_meas is not None and c.k:
        e_pred = float(expected_tokens_per_step(a_pred, c.k))
        e_meas = float(expected_tokens_per_step(a_meas, c.k))
        parts.append(
            f"acceptance {a_pred:.0%} predicted vs {a_meas:.0%} measured per token "
            f"({e_pred:.2f} vs {e_meas:.2f} tokens a step)"
        )
        # seconds of one speculative step, each side from its own tokens a step and t/s
        step_pred = e_pred / c.predicted_tps
        step_meas = e_meas / c.measured_tps
        v = verify_ratio.get(c.k)
        verify_s = v * step_s * pass_factor if v and step_s else None
        vtxt = (
            f"; the target's verify pass {verify_s * 1e3:.0f} ms (llama-bench's over K+1 = "
            f"{v:.2f} steps, x{pass_factor:.3f} in llama-server), so draft and the rest "
            f"~{(step_meas - verify_s) * 1e3:.0f} ms measured vs "
            f"~{(step_pred - verify_s) * 1e3:.0f} predicted"
            if verify_s
            else ""
        )
        parts.append(
            f"a step {step_pred * 1e3:.0f} ms predicted vs {step_meas * 1e3:.0f} measured{vtxt}"
        )
    elif not c.draft_n:
        parts.append(
            f"acceptance: nothing drafted on first encounter (predicted "
            f"{c.predicted_acceptance or 0:.0%} per token)"
        )
    if plain.measured_tps > 0 and abs(plain.error) > TOLERANCE:
        parts.append(f"target step off by {plain.error:+.0%}")
    return "; ".join(parts)


def task_report(
    task: str,
    cands: list[Candidate],
    verify_ratio: dict[int, float],
    step_s: float | None = None,
    pass_factor: float = 1.0,
) -> dict[str, Any]:
    ok = [c for c in cands if c.measured_tps > 0]
    plain = cands[0]
    if len(ok) < 2:
        print(f"\n## {task}: {len(ok)} of {len(cands)} runs succeeded, nothing to compare")
        return {"task": task, "spearman": math.nan, "within_25pct": 0, "n": len(ok),
                "predicted_best_loss": math.nan, "rows": []}  # fmt: skip
    rho = spearmanr([c.predicted_tps for c in ok], [c.measured_tps for c in ok]).statistic
    best_meas = max(ok, key=lambda c: c.measured_tps)
    best_pred = max(ok, key=lambda c: c.predicted_tps)
    best_loss = 1.0 - best_pred.measured_tps / best_meas.measured_tps
    print(f"\n## {task}")
    print(
        "| candidate | predicted t/s | measured t/s | error | predicted acc | measured "
        "acc (accepted/drafted) | run s |"
    )
    print("|---|---|---|---|---|---|---|")
    for c in cands:
        acc_m = c.measured_acceptance
        print(
            f"| {c.label} | {c.predicted_tps:.2f} | {c.measured_tps:.2f} | {c.error:+.0%} | "
            f"{'-' if c.predicted_acceptance is None else f'{c.predicted_acceptance:.0%}'} | "
            f"{'-' if acc_m is None else f'{acc_m:.0%}'} ({c.accepted}/{c.draft_n}) | "
            f"{c.run_s:.0f} |"
        )
    within = [c for c in ok if abs(c.error) <= TOLERANCE]
    missed = "" if rho >= 0.8 else f": MISSED by {0.8 - rho:.2f}"
    print(f"Spearman {rho:.2f} (goal >= 0.8{missed})")
    print(f"within 25 %: {len(within)} of {len(ok)}")
    print(
        f"predicted best {best_pred.label} ({best_pred.measured_tps:.2f} t/s measured); "
        f"measured best {best_meas.label} ({best_meas.measured_tps:.2f}): loses "
        f"{best_loss:.1%} (goal <= 5 %{'' if best_loss <= BEST_TOLERANCE else ': MISSED'})"
    )
    said = "do not speculate" if best_pred.spec_type == "none" else f"speculate: {best_pred.label}"
    right = "do not speculate" if best_meas.spec_type == "none" else f"speculate: {best_meas.label}"
    print(f"recommend's answer: {said}; measured: {right}")
    for c in ok:
        if abs(c.error) > TOLERANCE:
            why = attribution(c, plain, verify_ratio, step_s, pass_factor)
            print(f"  miss {c.label} {c.error:+.0%}: {why}")
    return {
        "task": task,
        "spearman": rho,
        "within_25pct": len(within),
        "n": len(ok),
        "predicted_best": best_pred.label,
        "measured_best": best_meas.label,
        "predicted_best_loss": best_loss,
        "rows": [
            {
                "label": c.label,
                "predicted_tps": c.predicted_tps,
                "measured_tps": c.measured_tps,
                "predicted_acceptance": c.predicted_acceptance,
                "measured_acceptance": c.measured_acceptance,
                "draft_n": c.draft_n,
                "accepted": c.accepted,
            }
            for c in cands
        ],
    }


def tune_replay(db: Path, target: Path, task: str, cands: list[Candidate], budget: int) -> str:
    """`tune` with its default budget, each run it asks for answered from the sweep."""
    from specreg.host.facts import detect_host_facts
    from specreg.host.machine import detect_host
    from specreg.recommender.recommend import Option
    from specreg.registry.db import opened
    from specreg.tune.tuner import Ran, TuneRequest, tune

    asked: list[str] = []

    def replay(option: Option) -> Ran:
        spec = option.stack or ("none" if option.method.value == "none" else option.spec_type)
        hit = next(
            (
                c
                for c in cands
                if c.spec_type == spec
                and (c.k == option.k or spec == "none")
                and c.measured_tps > 0
            ),
            None,
        )
        asked.append(option.label + ("" if hit else " (not in the sweep)"))
        if hit is None:
            return None, None
        return hit.measured_tps, None, hit.draft_n  # not recorded: its drafts said here

    facts = detect_host_facts(fingerprint=detect_host().fingerprint)
    with opened(db) as con:
        result = tune(con, TuneRequest(str(target), task=task, budget=budget), replay, host=facts)
    best = max((c for c in cands if c.measured_tps > 0), key=lambda c: c.measured_tps)
    pick = result.best
    got = pick.measured_tps if pick is not None and pick.measured_tps else math.nan
    loss = 1.0 - got / best.measured_tps
    verdict = "met" if loss <= BEST_TOLERANCE and len(asked) <= len(cands) / 3 else "MISSED"
    return (
        f"| {task} | {pick.label if pick else '-'} | {got:.2f} | {best.label} | "
        f"{best.measured_tps:.2f} | {loss:.1%} | {len(asked)} of {len(cands)} | {verdict} | "
        f"{'; '.join(asked)} |"
    )


def reference_host() -> None:
    """The K recommend picks on the reference host's sweeps that keep the bound
    (benchmarks/k_choice.py): leave-one-family-out, and the held-out sweeps."""
    spec = importlib.util.spec_from_file_location("k_choice", HERE / "k_choice.py")
    assert spec is not None and spec.loader is not None
    kc = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = kc  # dataclasses look their module up there
    spec.loader.exec_module(kc)
    est = kc.SpeculationRegressor(n_members=0, random_state=0)
    lfo, lfo_out = kc.leave_family_out(est, True)
    held, held_out = kc.holdout(est, True)
    print("\n" + kc.table("reference host: leave-one-family-out (benchmarks/k_choice.py)",
                           lfo, lfo_out))  # fmt: skip
    print("\n" + kc.table("reference host: held-out sweeps", held, held_out))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", default=",".join(TASKS))
    ap.add_argument("--n-predict", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--repeat", type=int, default=1, help="timed samples per run (each on a fresh server)"
    )
    ap.add_argument("--keep", type=Path, default=None, help="registries here (reused)")
    ap.add_argument(
        "--prompts", default="1", help="prompts measured per task: N, or all (agree's own)"
    )
    ap.add_argument("--reference", action="store_true", help="also the reference-host check")
    ap.add_argument("--predict-only", action="store_true")
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = ap.parse_args()
    tasks = tuple(args.tasks.split(","))
    pair = ensure_qwen_pair()
    root = args.keep or Path(tempfile.mkdtemp(prefix="specreg-real-pair-"))
    root.mkdir(parents=True, exist_ok=True)
    predict_cli = Cli(root / "predict.duckdb", args.threads)
    measure_cli = Cli(root / "measure.duckdb", args.threads)
    target, draft = pair.target.path, pair.draft.path
    print(
        f"target {target.name}, draft {draft.name}; {args.threads} threads, "
        f"{args.n_predict} tokens, {args.prompts} prompt(s) a task; registries in {root}"
    )
    predict_cli("scan", str(target), str(draft))
    # the measurements go to a registry of their own: no run informs a prediction
    measure_cli("scan", str(target), str(draft))
    t0, load0 = time.monotonic(), loadavg()
    cal = predict_cli.cached(
        root / "calibrate.json",
        "calibrate",
        str(target),
        "--draft",
        str(draft),
        "--threads",
        str(args.threads),
        "--repetitions",
        "3",
        "--gen-tokens",
        "64",
    )
    print(
        f"calibrate: {time.monotonic() - t0:.0f} s, load {load0} -> {loadavg()}; contended "
        f"{cal.get('contended')}, reruns {cal.get('reruns')}"
    )
    verify_ratio: dict[int, float] = {}
    step_s: float | None = None  # llama-bench's target step
    for r in cal["models"]:
        if r["role"] == "target" and r["verify_ratio"]:
            verify_ratio = {int(k): float(v) for k, v in r["verify_ratio"].items()}
            step_s = r.get("gen_seconds")
    print(f"calibrated verify cost of K+1 tokens in plain steps: {verify_ratio}")
    pf, noise = cal.get("pass_factor") or {}, cal.get("noise_floor") or {}
    pass_factor = float(pf.get("value") or 1.0)
    skipped = f"; {pf['skipped']}" if pf.get("skipped") else ""
    print(
        f"pass factor {pass_factor:.3f} ({pf.get('source')}: llama-server "
        f"{(pf.get('server_seconds') or 0) * 1e3:.1f} ms a token, llama-bench "
        f"{(pf.get('bench_seconds') or 0) * 1e3:.1f}{skipped}); noise floor "
        f"{noise.get('spread')} ({noise.get('source')})"
    )
    for task in tasks:
        t0, load0 = time.monotonic(), loadavg()
        doc = predict_cli.cached(
            root / f"agree-{task}.json",
            "agree",
            str(target),
            str(draft),
            "--task",
            task,
            "--threads",
            str(args.threads),
            "--n-predict",
            str(max(args.n_predict, 64)),
        )
        pts = doc.get("points", [])
        same = pts[0]["same_top"] if pts else None
        print(
            f"agree {task}: same top token {same}, {time.monotonic() - t0:.0f} s, "
            f"load {load0} -> {loadavg()}"
        )
    predictions = {task: predict(predict_cli, target, task) for task in tasks}
    if args.predict_only:
        for task, cands in predictions.items():
            print(task, [(c.label, round(c.predicted_tps, 2)) for c in cands])
        return
    reports = []
    for task, cands in predictions.items():
        load0 = loadavg()
        for c in cands:
            measure(measure_cli, target, draft, task, c, args.n_predict, args.repeat,
                    None if args.prompts == "all" else int(args.prompts))  # fmt: skip
        print(f"measured {task}: load {load0} -> {loadavg()}")
        reports.append(task_report(task, cands, verify_ratio, step_s, pass_factor))
    print("\n## tune (default budget 6, replayed over the sweep above) against the sweep's best")
    print("| task | tune's pick | its t/s | sweep best | t/s | loss | runs | goal | runs asked |")
    print("|---|---|---|---|---|---|---|---|---|")
    for task, cands in predictions.items():
        print(tune_replay(root / "predict.duckdb", target, task, cands, budget=6))
    if "code" in predictions:
        print("\n## code: prediction against issue 26's quiet measurement (128 tokens)")
        print("| candidate | predicted t/s | quiet t/s | error | accepted/drafted |")
        print("|---|---|---|---|---|")
        for c in predictions["code"]:
            if c.label in QUIET_CODE:
                tps, acc = QUIET_CODE[c.label]
                print(f"| {c.label} | {c.predicted_tps:.2f} | {tps} | "
                      f"{c.predicted_tps / tps - 1:+.0%} | {acc or '-'} |")  # fmt: skip
    met = sum(r["predicted_best_loss"] <= BEST_TOLERANCE for r in reports)
    rho_ok = sum(r["spearman"] >= 0.8 for r in reports)
    print(
        f"\nover {len(reports)} tasks: Spearman >= 0.8 on {rho_ok}; predicted best within 5 % "
        f"on {met}; t/s within 25 % on {sum(r['within_25pct'] for r in reports)} of "
        f"{sum(r['n'] for r in reports)} candidates"
    )
    if args.reference:
        reference_host()
    if args.json:
        args.json.write_text(json.dumps({"tasks": reports, "verify_ratio": verify_ratio}, indent=1))


if __name__ == "__main__":
    main()
