"""What the options alone do not say: no gain, no draft (and what draft would fit), no candidate
of the requested type, drafts measured agreement rules out, options over the KLD budget or
beyond the host's memory, slow rollbacks, plain decoding far below its roofline."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from specreg.auditor import head_kind
from specreg.recommender.acceptance import ACC_AGREEMENT
from specreg.recommender.candidates import K_GRID, Ask, Grounds, head_advice
from specreg.recommender.features import ConfigFacts, feature_matrix
from specreg.recommender.predictor import SpeedPredictor
from specreg.recommender.ranking import MIN_GAIN, Ranking
from specreg.recommender.results import Option, memory_advice
from specreg.recommender.roofline import Roofline
from specreg.registry.queries import ModelRecord
from specreg.stacks import Stack
from specreg.terms import Method

# Hypothetical drafts for "this draft would fit": same tokenizer, Q8_0.
HYPOTHETICAL_PARAMS_B = (0.1, 0.25, 0.5, 1.0, 1.5, 3.0)
HYPOTHETICAL_BPW = 8.5
# Below this measured per-token agreement a draft cannot pay for itself at any K or cost.
RULED_OUT_AGREEMENT = 0.1


def advice(
    g: Grounds, model: SpeedPredictor, ask: Ask, ranking: Ranking, roof: Roofline
) -> list[str]:
    """What the options alone do not say, in the order `recommend` prints it."""
    target, options = g.target, ranking.options
    out: list[str] = []
    if not ranking.speculate:
        out.append(
            "do not speculate: no candidate is predicted to beat plain decoding by "
            f"{MIN_GAIN - 1:.0%} on this host"
        )
    if not g.drafts:
        out.append(_no_draft_advice(target, g.base, model, ask.task))
    requested = ask.requested
    heads = head_advice(g, requested, ask.task)  # draft heads: not scored, said why
    missing = requested is not None and not any(o.spec_type == requested.spelled for o in options)
    if missing and requested is not None and not head_kind(requested.model_drafter):
        out.append(_no_candidate(requested, target, ask.task))
    out.extend(heads)
    out.extend(_agreement_advice(options))
    if memory := memory_advice(options):
        out.append(memory)
    if ranking.over_budget:
        out.append(
            f"{ranking.over_budget} behaviour-changing options cost more than the KLD budget "
            f"{ask.max_kld:g} and are not shown"
        )
    if target.is_hybrid or target.is_recurrent:
        out.append(
            "hybrid/recurrent target: llama-server speculates on it with context checkpoints "
            "(slower rollbacks than a plain transformer)"
        )
    if roof.baseline_measured and roof.fraction < 0.3:
        out.append(
            f"plain decoding runs at {roof.fraction:.0%} of its roofline bound: check "
            "threads (-t = physical cores), NUMA interleave and memory pinning first"
        )
    return out


def _no_candidate(requested: Stack, target: ModelRecord, task: str) -> str:
    if requested.needs_draft_file:
        why = "no compatible draft model in the registry"
    elif requested.uses_lookup_cache:
        why = (
            f"no lookup cache for {task} in the target's tokenizer family: build one with "
            "`specreg lookup-cache build`"
        )
    else:
        why = f"{target.display_name} cannot run it"
    return f"no candidate for --spec-type {requested.spelled}: {why}"


def _agreement_advice(options: Sequence[Option]) -> list[str]:
    """Drafts that measured agreement rules out: no K of theirs beats plain decoding."""
    best: dict[str, Option] = {}
    for o in options:
        mine = o.acceptance_source == ACC_AGREEMENT and o.draft_id and o.experts is None
        if mine and (o.draft_id not in best or o.speedup > best[o.draft_id].speedup):
            best[o.draft_id] = o  # type: ignore[index]
    out = []
    for o in best.values():
        if o.agreement is None or o.speedup >= 1.0:
            continue
        if o.agreement.acceptance < RULED_OUT_AGREEMENT:
            out.append(
                f"measured agreement rules out {o.draft_name}: {o.agreement.summary}; it "
                f"almost never drafts the target's token (best K={o.k}: {o.speedup:.2f}x)"
            )
        else:
            out.append(
                f"with its measured agreement {o.draft_name} does not beat plain decoding on "
                f"this host: {o.agreement.summary}; best K={o.k}: {o.speedup:.2f}x"
            )
    return out


def _no_draft_advice(
    target: ModelRecord, base: ConfigFacts, model: SpeedPredictor, task: str
) -> str:
    """What would fit: the best hypothetical same-tokenizer draft, and the model-free modes."""
    hyp = [
        base.with_(
            method=Method.DRAFT,
            k=k,
            draft_params_b=p,
            draft_bpw=HYPOTHETICAL_BPW,
            draft_gb=p * HYPOTHETICAL_BPW / 8,
            draft_arch_family=base.target_arch_family,
            tok_relation="identical",
        )
        for p in HYPOTHETICAL_PARAMS_B
        for k in K_GRID
    ]
    pred = model.predict(feature_matrix([base, *hyp]))
    i = int(np.argmax(pred[1:]))
    best = hyp[i]
    parts = ["no compatible draft in the registry"]
    if task in ("summarize", "code", "json"):
        parts.append(f"use ngram-mod for {task} (it reuses text from the prompt)")
    if (target.nextn_predict_layers or 0) > 0:
        parts.append("use the target's MTP heads (--spec-type draft-mtp)")
    parts.append(
        f"this draft would fit: a {best.draft_params_b:g}B {target.architecture or ''} model "
        f"sharing the target's tokenizer (fingerprint {(target.tok_fingerprint or '?')[:12]}), "
        f"Q8_0, K={best.k}: predicted {pred[1 + i] / pred[0]:.1f}x"
    )
    return "; ".join(parts)
