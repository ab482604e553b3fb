"""Measured draft agreement against the acceptance of real speculative runs, in one run.

    SPECREG_CACHE=$PWD/.cache flock /tmp/specreg-llama.lock \\
        python benchmarks/agreement_vs_acceptance.py [--tasks code,prose] [--k 4]

For every real pair the tests can build (SmolLM2-135M Q4_1 with its Q8_0/Q4_0 self-drafts and
the random-weight synthetic MoE, Gemma-3-270M Q4_K_M with its Q8_0/Q4_0 self-drafts, the
synthetic MoE with its Q8_0 self-draft, and the real pair of two sizes: Qwen2.5-Coder-1.5B with
its 0.5B draft, from `specreg llama models`) and every task prompt set:

* agreement: `measure_agreement` (same top token on the target's own greedy text) over the
  answers' tokens, as `agree` takes it by default: the draft's guesses on llama-server after
  each prompt alone (`--via server`); beside it the saved-logits measurement (`--via logits`:
  the answers inside llama-perplexity's filler-led chunks, and the whole text with its
  prompts);
* first-encounter acceptance: one draft-simple run at K on a fresh llama-server (accepted /
  drafted over the task's prompts, no warm-up, nothing replayed);
* the predicted accepted-per-drafted at K: drafting replayed on the server's guesses (what the
  recommender uses), from the saved-logits share with per-token independence, and the
  prior's guess (the recommender's acceptance for the pair).

Prints the table, the Spearman rank correlation of agreement with measured acceptance (goal
>= 0.8) and the mean absolute error of the predicted accepted-per-drafted (goal <= 0.10)
against the prior's. Runs go to a throwaway registry; logits and texts to the cache.
"""

from __future__ import annotations

import argparse
import math
import statistics
import tempfile
import time
from pathlib import Path

from scipy.stats import spearmanr

from specreg.host.facts import detect_host_facts
from specreg.host.machine import detect_host
from specreg.llama.config import Config
from specreg.llama.install import find_llama
from specreg.llama.models import ensure_synthetic_models, ensure_test_models
from specreg.llama.perplexity import LogitsCache
from specreg.quality.agreement import measure_agreement, plan_agreement
from specreg.quality.kld import Measuring
from specreg.recommender.acceptance import drafted_acceptance_at, load_agreement, replay
from specreg.recommender.costmodel import drafted_acceptance
from specreg.recommender.features import ConfigFacts, feature_matrix
from specreg.recommender.local import draft_fields, target_fields
from specreg.recommender.train import cached_fit, load_trained
from specreg.registry.db import opened
from specreg.registry.scan import model_record
from specreg.runner.measure import measure
from specreg.runner.settings import Settings
from specreg.runner.workload import TASKS, Workload, task_prompts
from specreg.samples.model_files import models_dir
from specreg.samples.qwen_pair import ensure_qwen_pair
from specreg.terms import Method


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", default=",".join(TASKS))
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--n-predict", type=int, default=64, help="tokens per prompt in the runs")
    ap.add_argument("--threads", type=int, default=None, help="default: physical cores")
    ap.add_argument("--chunks", type=int, default=4)
    ap.add_argument("--no-gemma", action="store_true", help="SmolLM2 and the synthetic MoE only")
    ap.add_argument("--no-qwen", action="store_true", help="leave out the Qwen2.5-Coder pair")
    ap.add_argument(
        "--agree-n-predict",
        type=int,
        default=None,
        help="tokens per prompt of the target's agreement text (default: --n-predict, so it "
        "is the text the runs generate)",
    )
    ap.add_argument("--only", default="", help="pairs whose draft file name contains this")
    args = ap.parse_args()
    tasks = tuple(args.tasks.split(","))
    install = find_llama()
    host = detect_host()
    facts = detect_host_facts(fingerprint=host.fingerprint)
    trained = load_trained()
    prior = trained[0] if trained else cached_fit()
    models = ensure_test_models(install.binary("llama-quantize"))
    synth = ensure_synthetic_models(
        models_dir(), models.smollm2.path, install.binary("llama-quantize")
    )
    pairs = [
        (models.smollm2.path, models.draft("smollm2", "Q8_0").path),
        (models.smollm2.path, models.draft("smollm2", "Q4_0").path),
        (models.smollm2.path, synth.moe.path),
        (synth.moe.path, synth.moe_draft.path),
    ]
    if not args.no_gemma:
        pairs += [
            (models.gemma3.path, models.draft("gemma3", "Q8_0").path),
            (models.gemma3.path, models.draft("gemma3", "Q4_0").path),
        ]
    if not args.no_qwen:
        pair = ensure_qwen_pair()
        pairs.append((pair.target.path, pair.draft.path))
    pairs = [(t, d) for t, d in pairs if args.only in d.name]
    agree_n = args.agree_n_predict or args.n_predict
    home = Path(tempfile.mkdtemp(prefix="specreg-bench-"))
    m = Measuring(install, host, chunks=args.chunks, threads=args.threads, cache=LogitsCache())
    threads = args.threads or host.threads
    print(f"host: {host.cpu_model}, llama.cpp threads {threads}; llama.cpp {install.version}")
    print(
        f"draft-simple K={args.k}, {args.n_predict} tokens a prompt, fresh server per run; "
        f"agreement on the target's greedy text of {agree_n} tokens a prompt\n"
    )
    print("| target | draft | task | agreement (server) | saved logits (answers) | whole text "
          "| KLD | agree s | predicted acc/drafted (replayed) | from saved logits "
          "| prior's guess | measured acc/drafted (accepted/drafted) | run s |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    rows = []
    with opened(home / "registry.duckdb") as con:
        for target, draft in pairs:
            t_rec, d_rec = model_record(con, target), model_record(con, draft)
            base = ConfigFacts(
                bandwidth_gbs=facts.bandwidth_gbs, physical_cores=facts.physical_cores,
                **target_fields(t_rec), method=Method.DRAFT, k=args.k, experts=0,
                temperature=0.0, task="chat", **draft_fields(d_rec, t_rec),
            )  # fmt: skip
            for task in tasks:
                t0 = time.monotonic()
                plan = plan_agreement(con, target, (draft,), (task,))
                (point,) = measure_agreement(con, m, plan, n_predict=agree_n).points
                agree_s = time.monotonic() - t0
                found = load_agreement(con, t_rec.model_id, task).get(d_rec.model_id)
                traces = found.traces if found is not None else ()
                (logits,) = measure_agreement(con, m, plan, n_predict=agree_n, via="logits").points
                guess = float(prior.predict_acceptance(feature_matrix([base.with_(task=task)]))[0])
                t0 = time.monotonic()
                run = measure(
                    install, host, Config(spec_type="draft-simple", k=args.k, threads=threads),
                    target, draft, Workload(f"task:{task}", task_prompts(task)),
                    Settings(n_predict=args.n_predict, repeats=1, warmup=False, retries=0),
                )  # fmt: skip
                run_s = time.monotonic() - t0
                if run.failure is not None or not point.ok or point.same_top is None or not traces:
                    print(f"| {target.name} | {draft.name} | {task} | failed: "
                          f"{run.failure or point.error} |||||||")  # fmt: skip
                    continue
                measured = run.acceptance if run.acceptance is not None else 0.0
                accepted, drafted = replay(traces, args.k)
                predicted = accepted / drafted if drafted else math.nan
                saved = logits.same_top if logits.same_top is not None else math.nan
                whole = logits.text_same_top if logits.text_same_top is not None else math.nan
                from_saved = drafted_acceptance_at(saved, args.k)
                kld = logits.mean_kld if logits.mean_kld is not None else math.nan
                prior_pred = float(drafted_acceptance(guess, args.k))
                rows.append((point.same_top, measured, predicted, prior_pred, guess, saved,
                             from_saved))  # fmt: skip
                print(
                    f"| {target.name} | {draft.name} | {task} | {point.same_top:.1%} "
                    f"| {saved:.1%} | {whole:.1%} | {kld:.3f} | {agree_s:.1f} | {predicted:.1%} "
                    f"| {from_saved:.1%} | {prior_pred:.1%} "
                    f"| {measured:.1%} ({run.draft_n_accepted}/{run.draft_n}) | {run_s:.1f} |"
                )
    agreement = [r[0] for r in rows]
    measured = [r[1] for r in rows]
    rho = spearmanr(agreement, measured).statistic
    rho_prior = spearmanr([r[4] for r in rows], measured).statistic
    rho_saved = spearmanr([r[5] for r in rows], measured).statistic
    mae = statistics.fmean(abs(r[2] - r[1]) for r in rows)
    mae_prior = statistics.fmean(abs(r[3] - r[1]) for r in rows)
    mae_saved = statistics.fmean(abs(r[6] - r[1]) for r in rows)
    print(f"\n{len(rows)} pairs x tasks")
    print(f"Spearman(agreement, measured acceptance) = {rho:.3f} (goal >= 0.8); "
          f"from saved logits: {rho_saved:.3f}; "
          f"the prior's acceptance: {rho_prior:.3f}")  # fmt: skip
    print(f"MAE of accepted/drafted at K={args.k}: replayed on the guesses {mae:.3f} "
          f"(goal <= 0.10); from the saved-logits share {mae_saved:.3f}; "
          f"the prior's guess {mae_prior:.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
