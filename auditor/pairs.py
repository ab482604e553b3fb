"""One pair, or one target against every draft in the registry."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable
from typing import Any

import duckdb

from specreg.auditor.checks import (
    ModelFacts,
    VocabOutcome,
    advisory_checks,
    binding_check,
    capability_checks,
    head_target_check,
    head_vocab_check,
    risk_checks,
    vocab_checks,
    vocab_signature,
)
from specreg.auditor.rules import PINNED_RULES, RuleSet
from specreg.auditor.verdict import Check, ModelRef, PairVerdict, Severity, Verdict, verdict_of
from specreg.registry.queries import (
    ModelRecord,
    human_bytes,
    human_count,
    list_models,
    resolve_model,
)
from specreg.registry.vocab_store import Vocab, load_vocab
from specreg.terms import DRAFT_MODEL_TYPES, SPEC_DRAFT_SIMPLE, SPEC_MTP


def vision_dirs(models: Iterable[ModelRecord]) -> frozenset[str]:
    """Folders holding a vision projector: the language models there are served with it."""
    return frozenset(os.path.dirname(m.path) for m in models if m.is_mmproj and m.path)


class VocabCache:
    """Vocabularies by sha, loaded once per audit."""

    def __init__(self, con: duckdb.DuckDBPyConnection) -> None:
        self._con = con
        self._vocabs: dict[str, Vocab | None] = {}

    def get(self, sha: str | None) -> Vocab | None:
        if not sha:
            return None
        if sha not in self._vocabs:
            self._vocabs[sha] = load_vocab(self._con, sha)
        return self._vocabs[sha]


def target_names(m: ModelRecord) -> tuple[str, ...]:
    """What a model is called where a draft head names the model it was trained for."""
    names = [m.name, m.basename and m.size_label and f"{m.basename} {m.size_label}"]
    if m.basename and m.size_label and m.finetune:
        names.append(f"{m.basename} {m.size_label} {m.finetune}")
    return tuple(n for n in names if n)


def ref(m: ModelRecord) -> ModelRef:
    return ModelRef(m.model_id or "", m.display_name, m.path or "")


def has_mtp(m: ModelFacts) -> bool:
    return bool(m.nextn_predict_layers) or bool(m.has_mtp_tensors)


def pair_checks(
    t: ModelFacts,
    d: ModelFacts,
    rules: RuleSet,
    vocab: VocabOutcome | None,
    vision: bool = False,
    target_names: tuple[str, ...] = (),
) -> tuple[tuple[Check, ...], str | None]:
    """All checks of (t, d) given the vocabulary outcome (for a draft head too, when it carries
    a vocabulary); also the --spec-type to use. `target_names`: what the target is called, for
    the model a draft head says it was trained for."""
    checks: list[Check] = []
    kind = d.draft_kind
    if kind:
        spec_type = f"draft-{kind}"
        if kind not in rules.bound_draft_kinds:
            checks.append(
                Check(
                    "draft_kind",
                    False,
                    Severity.BLOCKS,
                    f"this build has no --spec-type {spec_type}",
                    {"draft_kind": kind},
                )
            )
        else:
            checks.append(binding_check(t, d))
            if vocab is not None:  # the head carries a vocabulary: its target's
                checks.append(head_vocab_check(t, d, vocab))
            trained_for = head_target_check(t, d, target_names)
            if trained_for is not None:
                checks.append(trained_for)
    else:
        spec_type = rules.draft_simple_type or "draft"
        assert vocab is not None
        checks.extend(vocab.checks)
    checks.extend(capability_checks(t, d, rules, vision))
    checks.extend(risk_checks(t, d, None if kind else vocab, rules))
    checks.extend(advisory_checks(t, d, None if kind else vocab))
    return tuple(checks), spec_type


def draftless_modes(t: ModelFacts, rules: RuleSet) -> tuple[str, ...]:
    """Speculation this target can do with no draft file: its MTP heads, the n-gram modes."""
    modes = [SPEC_MTP] if has_mtp(t) and rules.draft_mtp else []
    recurrent = t.is_recurrent or t.is_hybrid
    if recurrent and not rules.recurrent_targets_speculate:
        return ()
    return (*modes, *rules.ngram_spec_types)


def remedies_for(
    t: ModelRecord,
    verdict: Verdict,
    checks: tuple[Check, ...],
    rules: RuleSet,
    alternatives: Iterable[ModelRecord] = (),
) -> tuple[str, ...]:
    """Only remedies that exist: other drafts in the registry, MTP heads, n-gram modes."""
    if verdict is Verdict.COMPATIBLE:
        return ()
    failed = {c.name for c in checks if not c.passed}
    out: list[str] = []
    alts = [a for a in alternatives if a.model_id != t.model_id]
    same_fp = [a for a in alts if a.tok_fingerprint and a.tok_fingerprint == t.tok_fingerprint]
    accepted = [a for a in alts if a not in same_fp]
    for group, text in (
        (same_fp, "a draft with this tokenizer fingerprint exists"),
        (accepted, "a smaller draft llama.cpp accepts for this target exists"),
    ):
        if group:
            names = ", ".join(a.display_name for a in group[:3])
            more = f" (and {len(group) - 3} more)" if len(group) > 3 else ""
            out.append(f"{text}: {names}{more}")
    if has_mtp(t) and rules.draft_mtp:
        out.append("use the target's MTP heads: --spec-type draft-mtp, no draft file")
    if "recurrent_target" in failed:
        out.append(
            "use a llama.cpp build whose server speculates with context checkpoints "
            f"(the pinned build {PINNED_RULES.since_build} does)"
        )
    vocab_refused = any(c.llama_check and not c.passed for c in checks)
    if vocab_refused and rules.server_translates_vocab:
        out.append(
            "this build's llama-server translates tokens between the two vocabularies instead "
            "of refusing the draft (slower, lower acceptance); llama-speculative still refuses"
        )
    if verdict is Verdict.INCOMPATIBLE or verdict is Verdict.RISKY:
        if rules.ngram_spec_types:
            out.append("use an n-gram mode, no draft needed: --spec-type ngram-mod")
        else:
            out.append("use prompt lookup, no draft needed: llama-lookup")
    return tuple(out)


def judge(
    t: ModelRecord,
    d: ModelRecord,
    rules: RuleSet,
    vocabs: VocabCache,
    outcome: VocabOutcome | None = None,
    alternatives: Iterable[ModelRecord] = (),
    vision_dirs: frozenset[str] = frozenset(),
) -> PairVerdict:
    if outcome is None and (not d.draft_kind or d.n_tokens):
        outcome = vocab_checks(t, d, vocabs.get(t.vocab_sha), vocabs.get(d.vocab_sha), rules)
    vision = bool(t.path) and os.path.dirname(t.path or "") in vision_dirs
    checks, spec_type = pair_checks(t, d, rules, outcome, vision, target_names(t))
    verdict = verdict_of(checks)
    accepts = None if d.draft_kind else (outcome.accepts if outcome else None)
    flags: tuple[str, ...] = ()
    if verdict is not Verdict.INCOMPATIBLE:
        if d.draft_kind:
            flags = (*rules.spec_type_flags(spec_type or ""), rules.draft_model_flag, d.path or "")
        else:
            flags = (*rules.draft_flags, d.path or "")
    return PairVerdict(
        target=ref(t),
        draft=ref(d),
        verdict=verdict,
        llama_accepts=accepts,
        checks=checks,
        remedies=remedies_for(t, verdict, checks, rules, alternatives),
        rules_label=rules.label,
        llama_build=rules.since_build,
        spec_type=spec_type if verdict is not Verdict.INCOMPATIBLE else None,
        flags=flags,
    )


def _alternatives(
    target: ModelRecord, models: list[ModelRecord], rules: RuleSet, vocabs: VocabCache
) -> list[ModelRecord]:
    """Smaller models the target's vocabulary check accepts, smallest first."""
    out = []
    size_t = target.n_params_active or target.n_params or 0
    seen: dict[tuple[Any, ...], bool] = {}
    for m in models:
        if m.model_id == target.model_id or m.draft_kind or m.is_mmproj:
            continue
        if size_t and (m.n_params or 0) >= size_t:
            continue
        sig = vocab_signature(m)
        if sig not in seen:
            seen[sig] = vocab_checks(
                target, m, vocabs.get(target.vocab_sha), vocabs.get(m.vocab_sha), rules
            ).accepts
        if seen[sig]:
            out.append(m)
    return out


def check_pair(
    con: duckdb.DuckDBPyConnection,
    target: str | ModelRecord,
    draft: str | ModelRecord,
    rules: RuleSet | None = None,
) -> PairVerdict:
    """Will `draft` speculate for `target` with this llama.cpp, and if not, exactly why."""
    rules = rules or PINNED_RULES
    t = target if isinstance(target, ModelRecord) else resolve_model(con, target)
    d = draft if isinstance(draft, ModelRecord) else resolve_model(con, draft)
    vocabs = VocabCache(con)
    models = list_models(con)
    vdirs = vision_dirs(models)
    pv = judge(t, d, rules, vocabs, vision_dirs=vdirs)
    if pv.verdict is not Verdict.COMPATIBLE and pv.remedies:
        alts = [a for a in _alternatives(t, models, rules, vocabs) if a.model_id != d.model_id]
        pv = judge(t, d, rules, vocabs, alternatives=alts, vision_dirs=vdirs)
    why = not_a_draft(t, d)
    if why is None:
        return pv
    # no flags to run it; the drafts that exist instead
    alts = [a for a in _alternatives(t, models, rules, vocabs) if a.model_id != d.model_id]
    found = remedies_for(t, Verdict.INCOMPATIBLE, (), rules, alts)
    remedies = tuple(r for r in found if not r.startswith("use an n-gram"))
    return dataclasses.replace(pv, flags=(), not_a_draft=why, remedies=remedies or pv.remedies)


# What llama.cpp calls a draft head's file type, from its --spec-type (draft-eagle3: eagle3).
HEAD_SPEC_PREFIX = "draft-"


def head_kind(spec_type: str | None) -> str | None:
    """The draft head kind a speculative type needs (`draft-eagle3`: `eagle3`), None for a type
    that drafts with a plain model or none."""
    if spec_type in DRAFT_MODEL_TYPES and spec_type != SPEC_DRAFT_SIMPLE:
        return spec_type.removeprefix(HEAD_SPEC_PREFIX)
    return None


def spec_type_refusal(spec_type: str | None, d: ModelFacts, name: str = "the draft") -> str | None:
    """Why `d` cannot draft as `spec_type` (the one model drafter of a stack), or None: a head
    type (draft-eagle3, draft-dflash, draft-dspark) reads the target's hidden states and needs a
    head of its kind (llama.cpp: "draft model is not eagle3"); draft-simple runs a plain model,
    never a head."""
    kind = head_kind(spec_type)
    if kind is not None and d.draft_kind != kind:
        what = f"a draft head ({d.draft_kind})" if d.draft_kind else "a plain model"
        instead = f"draft-{d.draft_kind}" if d.draft_kind else SPEC_DRAFT_SIMPLE
        return (
            f"--spec-type {spec_type} needs a draft head ({kind}) trained for the target, and "
            f"{name} is {what}: run it with --spec-type {instead}"
        )
    if spec_type == SPEC_DRAFT_SIMPLE and d.draft_kind:
        return (
            f"{name} is a draft head ({d.draft_kind}), which draft-simple cannot run: use "
            f"--spec-type draft-{d.draft_kind}"
        )
    return None


def not_a_draft(t: ModelRecord, d: ModelRecord) -> str | None:
    """Why `d` is no draft for `t` whatever llama.cpp says, or None: the target itself, or a
    model whose weights are as large as the target's or larger, in all or in those read per
    token, cannot make the target faster and needs at least its memory again. A smaller quant
    of the target itself (a self-draft) is smaller and stays a draft."""
    if t.model_id and t.model_id == d.model_id:
        return "it is the target itself"
    if t.n_bytes and d.n_bytes:
        if d.n_bytes >= t.n_bytes:
            return (
                f"{human_bytes(d.n_bytes)} of weights against the target's "
                f"{human_bytes(t.n_bytes)}: a draft must be smaller than its target"
            )
        read_t, read_d = _read_per_token(t), _read_per_token(d)
        if read_d >= read_t:
            return (
                f"reads {human_bytes(int(read_d))} per token against the target's "
                f"{human_bytes(int(read_t))}: a draft step would cost as much as a target step"
            )
        return None
    total_t, total_d = t.n_params, d.n_params  # sizes unknown: parameters instead
    if total_t and total_d and total_d >= total_t:
        return (
            f"{human_count(total_d)} parameters against the target's {human_count(total_t)}: "
            "a draft must be smaller than its target"
        )
    return None


def _read_per_token(m: ModelRecord) -> float:
    """Bytes of weights read per token: the active share of an MoE's file, all of a dense one."""
    total, active = m.n_params or 0, m.n_params_active or 0
    share = active / total if total and active and active < total else 1.0
    return (m.n_bytes or 0) * share


def compatible_drafts(
    con: duckdb.DuckDBPyConnection,
    target: str | ModelRecord,
    rules: RuleSet | None = None,
    include_rejected: bool = False,
    *,
    include_larger: bool = False,
) -> list[PairVerdict]:
    """Every other model as a draft for `target`, best first: verdict, then smallest draft.

    Models as large as the target or larger (`not_a_draft`) are left out unless
    `include_larger` (or `include_rejected`, which lists every other model); when included
    they come after the drafts of their verdict.
    """
    rules = rules or PINNED_RULES
    t = target if isinstance(target, ModelRecord) else resolve_model(con, target)
    vocabs = VocabCache(con)
    models = list_models(con)
    by_id = {m.model_id: m for m in models}
    vdirs = vision_dirs(models)
    outcomes: dict[tuple[Any, ...], VocabOutcome] = {}
    results = []
    for d in models:
        if d.model_id == t.model_id:
            continue
        outcome = None
        if not d.draft_kind:
            # Models with the same vocabulary signature get the same vocabulary outcome.
            sig = vocab_signature(d)
            if sig not in outcomes:
                outcomes[sig] = vocab_checks(
                    t, d, vocabs.get(t.vocab_sha), vocabs.get(d.vocab_sha), rules
                )
            outcome = outcomes[sig]
        if not (include_larger or include_rejected) and not_a_draft(t, d):
            continue
        pv = judge(t, d, rules, vocabs, outcome, vision_dirs=vdirs)
        if include_rejected or pv.compatible:
            results.append(pv)

    def order(pv: PairVerdict) -> tuple[int, bool, int, str]:
        d = by_id[pv.draft.model_id]
        return (pv.verdict.rank, not_a_draft(t, d) is not None, d.n_params or 0, pv.draft.label)

    results.sort(key=order)
    return results
