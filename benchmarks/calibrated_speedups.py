"""Does a calibrated host get the right answer before any speculative run?

For SmolLM2-135M (Q4_1) and Gemma-3-270M (Q4_K_M) on this machine:

1. `specreg calibrate` the target and its Q4_0 self-draft (llama-bench: one pass over
   1, 2, 4, ... 32 tokens and plain generation) into a fresh registry holding just the two,
   and `specreg agree` the pair (how often the draft's top token is the target's, measured
   with llama-perplexity on the target's own text: no speculative run);
2. `recommend` (no run of any kind recorded) names its best K for the Q4_0 draft and for
   ngram-mod, with predicted speedups (also shown: the draft with the prior's acceptance
   guess instead of the measured agreement);
3. the runner measures plain decoding, the draft and ngram-mod at those K in interleaved rounds
   (its own registry; the runner's public plan/run, contended samples measured again);
4. predicted against measured speedup (target: within 25 %), and the order of the two methods
   per target.

Run under the llama.cpp lock (2 shared cores):
    SPECREG_CACHE=$PWD/.cache flock /tmp/specreg-llama.lock python benchmarks/calibrated_speedups.py
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specreg.host.facts import detect_host_facts
from specreg.host.machine import Host, detect_host
from specreg.llama.config import Config
from specreg.llama.install import LlamaInstall, find_llama
from specreg.llama.models import ensure_test_models
from specreg.recommender.advisor import open_advisor
from specreg.recommender.recommend import Option
from specreg.registry.calibration import latest_calibration
from specreg.registry.db import opened
from specreg.registry.scan import model_record, scan_paths
from specreg.runner import runs
from specreg.runner.calibrate import Bench, DraftChoice, calibrate_target
from specreg.runner.settings import Settings
from specreg.runner.workload import load_workload
from specreg.samples.model_files import SmallModel
from specreg.terms import Method

TOLERANCE = 0.25


@dataclass(frozen=True)
class Row:
    target: str
    method: str
    k: int | None
    predicted: float
    predicted_prior: float  # with the prior's acceptance instead of the measured agreement
    measured: float
    measured_tps: tuple[float, ...]
    plain_tps: tuple[float, ...]

    @property
    def error(self) -> float:
        return self.predicted / self.measured - 1.0


def best_of(options: tuple[Option, ...], method: Method) -> Option:
    return max((o for o in options if o.method is method), key=lambda o: o.tps)


@dataclass(frozen=True)
class Prediction:
    draft: Option  # recommend's best K for the Q4_0 draft, acceptance from `specreg agree`
    ngram: Option
    draft_prior: Option  # the same K with the prior's acceptance (calibration only)
    calibration_s: float
    agreement_s: float
    curve: dict[str, Any]


def _recommend(db: Path, host: Host, target: SmallModel, task: str) -> tuple[Option, ...]:
    facts = detect_host_facts(fingerprint=host.fingerprint)
    with opened(db) as con:
        return open_advisor(con, facts).recommend(con, str(target.path), task=task).options


def predict(
    root: Path, install: LlamaInstall, host: Host, target: SmallModel, draft: SmallModel,
    threads: int, task: str,
) -> Prediction:  # fmt: skip
    """Calibrate, measure the pair's agreement, recommend (no run of any kind recorded)."""
    db = root / f"predict-{target.family}.duckdb"
    fresh = not db.exists()
    with opened(db) as con:
        scan_paths(con, [target.path, draft.path])
    t0 = time.monotonic()
    if fresh:
        calibrate_target(
            db, str(target.path), drafts=DraftChoice((str(draft.path),)),
            bench=Bench(repetitions=5, gen_tokens=64), settings=Settings(threads=threads),
            install=install, host=host,
        )  # fmt: skip
    cal_s = time.monotonic() - t0
    prior = _recommend(db, host, target, task)
    t0 = time.monotonic()
    if fresh:
        subprocess.run(
            [sys.executable, "-m", "specreg", "agree", str(target.path), str(draft.path),
             "--task", task, "--threads", str(threads), "--db", str(db),
             "--llama-bin", str(install.bin_dir)],
            check=True, capture_output=True, text=True,
        )  # fmt: skip
    agree_s = time.monotonic() - t0
    options = _recommend(db, host, target, task)
    with opened(db) as con:
        recs = [
            latest_calibration(con, host.fingerprint, model_record(con, m.path).model_id, threads)
            for m in (target, draft)
        ]
    t, d = recs
    assert t is not None and t.gen_seconds
    curve = {
        "verify_ratio": {k: round(t.verify_ratio(k), 2) for k in (1, 2, 4, 8, 16, 31)},
        "gen_tps": round(1 / t.gen_seconds, 1),
        "draft_step_ratio": round(d.gen_seconds / t.gen_seconds, 3)
        if d is not None and d.gen_seconds
        else None,
        "reruns": sum(p.reruns for r in recs if r for p in r.points),
    }
    best = best_of(options, Method.DRAFT)
    same_k = next(o for o in prior if o.method is Method.DRAFT and o.k == best.k)
    return Prediction(best, best_of(options, Method.NGRAM), same_k, cal_s, agree_s, curve)


def measure(
    root: Path, install: LlamaInstall, host: Host, target: SmallModel, draft: SmallModel,
    configs: list[tuple[str, Config, Path | None]], threads: int, task: str, rounds: int,
    n_predict: int,
) -> dict[str, list[float]]:  # fmt: skip
    """Interleaved rounds of every config, each a recorded run (median over its repeats)."""
    db = root / "measure.duckdb"
    with opened(db) as con:
        scan_paths(con, [target.path, draft.path])
        workload = load_workload((task,))
        out: dict[str, list[float]] = {name: [] for name, _, _ in configs}
        for _ in range(rounds):
            for name, config, draft_path in configs:
                spec = runs.RunSpec(
                    target.path, draft_path, config.with_(threads=threads), workload, task=task
                )
                settings = Settings(n_predict=n_predict, repeats=2, retries=3)
                p = runs.plan(con, install, host, spec, settings)
                tps = runs.run(con, p).measurement.tokens_per_s
                if tps:
                    out[name].append(tps)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1, help="llama.cpp threads (default 1)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--n-predict", type=int, default=64)
    ap.add_argument("--task", default="code")
    ap.add_argument("--predict-only", action="store_true", help="calibrate and recommend only")
    ap.add_argument("--keep", type=Path, default=None, help="keep the registries in this folder "
                    "(a calibration found there is reused)")  # fmt: skip
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    install = find_llama()
    host = detect_host()
    models = ensure_test_models(install.binary("llama-quantize"))
    rows: list[Row] = []
    notes: dict[str, Any] = {}
    t_start = time.monotonic()
    for target in (models.smollm2, models.gemma3):
        draft = models.draft(target.family, "Q4_0")
        with tempfile.TemporaryDirectory() as tmp:
            root = args.keep or Path(tmp)
            root.mkdir(parents=True, exist_ok=True)
            pred = predict(root, install, host, target, draft, args.threads, args.task)
            if args.predict_only:
                for o in (pred.draft_prior, pred.draft, pred.ngram):
                    print(
                        f"{target.family} {o.label}: predicted {o.speedup:.2f}x, acceptance "
                        f"{o.acceptance:.2f} ({o.acceptance_source})"
                    )
                    print("   " + "\n   ".join(o.why))
                print(f"  {pred.curve}")
                continue
            configs = [
                ("plain", Config(), None),
                ("draft", Config(spec_type="draft-simple", k=pred.draft.k), draft.path),
                ("ngram-mod", Config(spec_type="ngram-mod", k=pred.ngram.k), None),
            ]
            got = measure(
                root, install, host, target, draft, configs, args.threads, args.task,
                args.rounds, args.n_predict,
            )  # fmt: skip
        plain = statistics.median(got["plain"])
        for name, opt in (("draft", pred.draft), ("ngram-mod", pred.ngram)):
            rows.append(
                Row(
                    target=target.family,
                    method=name,
                    k=opt.k,
                    predicted=opt.speedup,
                    predicted_prior=pred.draft_prior.speedup if name == "draft" else opt.speedup,
                    measured=statistics.median(got[name]) / plain,
                    measured_tps=tuple(got[name]),
                    plain_tps=tuple(got["plain"]),
                )  # fmt: skip
            )
        notes[target.family] = {
            "calibration_seconds": round(pred.calibration_s, 1),
            "agreement_seconds": round(pred.agreement_s, 1),
            "draft_acceptance_agreement": pred.draft.acceptance,
            "draft_acceptance_prior": pred.draft_prior.acceptance,
            **pred.curve,
        }
    # the order of the two methods per target (plain decoding shown beside them)
    ranks_ok: dict[str, tuple[list[str], list[str]]] = {}
    for fam in sorted({r.target for r in rows}):
        mine = [r for r in rows if r.target == fam]
        ranks_ok[fam] = (
            [r.method for r in sorted(mine, key=lambda r: -r.predicted)],
            [r.method for r in sorted(mine, key=lambda r: -r.measured)],
        )
    overall_pred = [f"{r.target} {r.method}" for r in sorted(rows, key=lambda r: -r.predicted)]
    overall_meas = [f"{r.target} {r.method}" for r in sorted(rows, key=lambda r: -r.measured)]
    result = {
        "threads": args.threads,
        "task": args.task,
        "rows": [
            {"target": r.target, "method": r.method, "k": r.k, "predicted_speedup": r.predicted,
             "predicted_speedup_prior_acceptance": r.predicted_prior,
             "measured_speedup": r.measured, "error": r.error,
             "within_25pct": abs(r.error) <= TOLERANCE, "measured_tps": r.measured_tps,
             "plain_tps": r.plain_tps}
            for r in rows
        ],
        "order_per_target": {f: {"predicted": p, "measured": m, "same": p == m}
                             for f, (p, m) in ranks_ok.items()},
        "order_overall": {"predicted": overall_pred, "measured": overall_meas,
                          "same": overall_pred == overall_meas},
        "calibration": notes,
        "seconds": time.monotonic() - t_start,
    }  # fmt: skip
    if args.json:
        print(json.dumps(result, indent=1))
        return
    print(f"llama.cpp {install.version}, {args.threads} thread(s), task {args.task}")
    for fam, n in notes.items():
        print(
            f"{fam}: calibrated in {n['calibration_seconds']} s, agreement in "
            f"{n['agreement_seconds']} s; verify cost in single steps by K {n['verify_ratio']}; "
            f"draft step / target step {n['draft_step_ratio']}; draft acceptance per token "
            f"{n['draft_acceptance_agreement']:.2f} measured by agree "
            f"({n['draft_acceptance_prior']:.2f} the prior's guess)"
        )
    print(
        f"{'target':8s} {'method':10s} {'K':>3s} {'predicted':>9s} {'measured':>9s} {'error':>7s}"
        f"   {'prior acc.':>10s}"
    )
    for r in rows:
        print(
            f"{r.target:8s} {r.method:10s} {r.k or 0:3d} {r.predicted:8.2f}x {r.measured:8.2f}x "
            f"{r.error:+7.0%}   {r.predicted_prior:9.2f}x"
            f"{'' if abs(r.error) <= TOLERANCE else '  (outside 25 %)'}"
        )
    for fam, (p, m) in ranks_ok.items():
        same = "" if p == m else "  (differs)"
        print(f"{fam} order: predicted {' > '.join(p)}; measured {' > '.join(m)}{same}")
    print(f"overall order same: {overall_pred == overall_meas} ({result['seconds']:.0f} s)")


if __name__ == "__main__":
    main()
