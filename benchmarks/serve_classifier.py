"""Task classifier accuracy beside the user's character-count rule.

    python benchmarks/serve_classifier.py [--test-size 0.3] [--folds 5]

The classifier is fitted on the training part of the shipped labelled set and scored on the
held-out part (stratified, seeded), then by k-fold cross-validation; the rule needs no fitting
and is scored on the same held-out part. The rule knows only code/math/json/prose, so its
accuracy on those four tasks alone is printed too. The runner's prompt sets, written
separately, are a second held-out check. Prints markdown.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import Counter

from sklearn.model_selection import StratifiedKFold, train_test_split

from specreg.runner.workload import load_workload
from specreg.serve.classify import TaskClassifier, heuristic_task, labelled_prompts
from specreg.terms import TASKS

RULE_TASKS = ("code", "math", "json", "prose")


def accuracy(pred: list[str], true: list[str]) -> float:
    return sum(p == t for p, t in zip(pred, true, strict=True)) / max(1, len(true))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--test-size", type=float, default=0.3)
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    prompts = labelled_prompts()
    X = [p.text for p in prompts]
    y = [p.task for p in prompts]
    counts = Counter(y)
    print(f"labelled set: {len(X)} prompts ({', '.join(f'{t} {counts[t]}' for t in TASKS)})\n")

    Xtr, Xte, ytr, yte = train_test_split(
        X, y, test_size=args.test_size, stratify=y, random_state=args.seed
    )
    clf = TaskClassifier().fit(Xtr, ytr)
    pred = clf.predict(Xte)
    rule = [heuristic_task(x) for x in Xte]
    four = [i for i, t in enumerate(yte) if t in RULE_TASKS]

    folds = []
    for tr, te in StratifiedKFold(args.folds, shuffle=True, random_state=args.seed).split(X, y):
        m = TaskClassifier().fit([X[i] for i in tr], [y[i] for i in tr])
        folds.append(m.score([X[i] for i in te], [y[i] for i in te]))

    runner = load_workload(TASKS).prompts
    full = TaskClassifier().fit(X, y)
    t0 = time.perf_counter()
    for x in X:
        full.predict_one(x)
    per_request_us = (time.perf_counter() - t0) / len(X) * 1e6

    print("| measure | classifier | user's rule |")
    print("|---|---|---|")
    print(
        f"| held-out {len(yte)} prompts ({args.test_size:.0%}), all six tasks | "
        f"{accuracy(pred, yte):.1%} | {accuracy(rule, yte):.1%} |"
    )
    print(
        f"| held-out, only {'/'.join(RULE_TASKS)} ({len(four)}) | "
        f"{accuracy([pred[i] for i in four], [yte[i] for i in four]):.1%} | "
        f"{accuracy([rule[i] for i in four], [yte[i] for i in four]):.1%} |"
    )
    print(
        f"| {args.folds}-fold CV, all six tasks | {statistics.mean(folds):.1%} "
        f"(sd {statistics.stdev(folds):.1%}) | {accuracy([heuristic_task(x) for x in X], y):.1%} |"
    )
    print(
        f"| runner's prompt sets ({len(runner)}, written separately) | "
        f"{accuracy(full.predict([p.text for p in runner]), [p.task for p in runner]):.1%} | "
        f"{accuracy([heuristic_task(p.text) for p in runner], [p.task for p in runner]):.1%} |"
    )
    print(f"\nclassifier time per request: {per_request_us:.0f} us (plain Python)\n")

    print("held-out per task (recall): | task | n | classifier | rule |")
    print("|---|---|---|---|")
    for task in TASKS:
        idx = [i for i, t in enumerate(yte) if t == task]
        print(
            f"| {task} | {len(idx)} | "
            f"{accuracy([pred[i] for i in idx], [task] * len(idx)):.0%} | "
            f"{accuracy([rule[i] for i in idx], [task] * len(idx)):.0%} |"
        )
    confusions = Counter((t, p) for t, p in zip(yte, pred, strict=True) if t != p)
    if confusions:
        print("\nheld-out mistakes (true -> predicted): " + ", ".join(
            f"{t}->{p} x{n}" for (t, p), n in confusions.most_common()
        ))  # fmt: skip


if __name__ == "__main__":
    main()
