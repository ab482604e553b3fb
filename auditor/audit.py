"""Every ordered pair of the registry, bucketed so the expensive work runs once per bucket.

llama.cpp's vocabulary check reads only a model's vocabulary signature (type, effective
add_bos/add_eos, BOS/EOS ids, token count, token list). Models with one signature form a class;
the check runs once per pair of classes, and the token texts are compared once per pair of
distinct token lists (none at all for equal lists). The other checks read a handful of model
facts, so a pair's verdict is memoised on those facts too. Only pairs of classes the vocabulary
check accepts are expanded to model pairs; a refused class pair counts |A| x |B| pairs at once.
"""

from __future__ import annotations

import os
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

import duckdb

from specreg.auditor.checks import (
    MIN_USEFUL_SIZE_RATIO,
    SpecialKind,
    VocabOutcome,
    special_token,
    special_token_rule,
    vocab_checks,
    vocab_signature,
)
from specreg.auditor.pairs import VocabCache, judge, target_names, vision_dirs
from specreg.auditor.rules import PINNED_RULES, RuleSet
from specreg.auditor.verdict import Verdict
from specreg.registry.audits import AuditClassVerdict as ClassVerdict  # the stored row
from specreg.registry.queries import ModelRecord, list_models


@dataclass(frozen=True)
class PairSummary:
    """One ordered pair the vocabulary check lets through (or a bound draft), compactly."""

    target_id: str
    draft_id: str
    verdict: Verdict
    llama_accepts: bool | None
    findings: tuple[str, ...]
    """Names of the failed checks (warnings and risks included)."""


@dataclass(frozen=True)
class AuditResult:
    JSON_KIND = "audit"
    # 2: each pair names its models ("target_name", "draft_name") beside their ids
    JSON_VERSION = "2"

    rules_label: str
    llama_build: int
    n_models: int
    classes: tuple[tuple[int, tuple[str, ...]], ...]
    """Vocabulary classes: (class id, model ids)."""
    class_verdicts: tuple[ClassVerdict, ...]
    pairs: tuple[PairSummary, ...]
    """Every ordered pair whose verdict is not settled by a refused class pair."""
    counts: dict[str, int]
    """Ordered pairs per verdict value."""
    refusals: dict[str, int]
    """Ordered pairs refused, per first failed vocabulary check."""
    seconds: float
    vocab_comparisons: int
    """Distinct token lists compared text by text (the expensive step)."""
    audit_id: int | None = None
    """The saved audit's id in the registry (None until saved)."""
    names: dict[str, str] = field(default_factory=dict)
    """Model id -> the name a model is shown by (`ModelRecord.display_name`)."""

    @property
    def n_pairs(self) -> int:
        return self.n_models * (self.n_models - 1)

    @property
    def accepted(self) -> tuple[PairSummary, ...]:
        """The pairs llama.cpp's check lets through (risky ones included), by target name,
        then verdict, then draft name: what `audit` names."""
        ok = [p for p in self.pairs if p.verdict is not Verdict.INCOMPATIBLE]
        return tuple(
            sorted(
                ok, key=lambda p: (self.name(p.target_id), p.verdict.rank, self.name(p.draft_id))
            )
        )

    def name(self, model_id: str) -> str:
        return self.names.get(model_id, model_id)

    @property
    def findings(self) -> tuple[PairSummary, ...]:
        """Pairs llama.cpp accepts that fail at run time: what `audit --fail-on-findings` counts."""
        return tuple(p for p in self.pairs if p.verdict is Verdict.RISKY)

    def to_json(self) -> dict[str, Any]:
        from specreg.jsonout import document

        pairs = [
            {
                "target": p.target_id,
                "target_name": self.name(p.target_id),
                "draft": p.draft_id,
                "draft_name": self.name(p.draft_id),
                "verdict": p.verdict.value,
                "compatible": p.verdict in (Verdict.COMPATIBLE, Verdict.WARNINGS),
                "findings": list(p.findings),
            }
            for p in self.pairs
        ]
        payload = {
            "audit_id": self.audit_id,
            "rules": self.rules_label,
            "llama_build": self.llama_build,
            "n_models": self.n_models,
            "n_pairs": self.n_pairs,
            "counts": self.counts,
            "refusals": self.refusals,
            "seconds": self.seconds,
            "pairs": pairs,
        }
        return document(self.JSON_KIND, self.JSON_VERSION, payload)

    def summary(self, target_id: str, draft_id: str) -> PairSummary | None:
        for p in self.pairs:
            if p.target_id == target_id and p.draft_id == draft_id:
                return p
        return None


def _cap_signature(m: ModelRecord, vdirs: frozenset[str]) -> tuple[Any, ...]:
    return (
        bool(m.path) and os.path.dirname(m.path or "") in vdirs,
        bool(m.is_mmproj),
        m.draft_kind,
        bool(m.is_recurrent),
        bool(m.is_hybrid),
        bool(m.sliding_window),
        bool(m.uses_mla),
        m.architecture if (m.is_recurrent or m.is_hybrid) else None,
        m.tok_pre,
        bool(m.nextn_predict_layers) or bool(m.has_mtp_tensors),
    )


def _size(m: ModelRecord) -> int | None:
    return m.n_params_active or m.n_params or None


def audit_all(
    con: duckdb.DuckDBPyConnection,
    rules: RuleSet | None = None,
    models: list[ModelRecord] | None = None,
) -> AuditResult:
    """Every ordered (target, draft) pair of the registry's present models."""
    rules = rules or PINNED_RULES
    t0 = time.perf_counter()
    models = list_models(con) if models is None else models
    vocabs = VocabCache(con)
    vdirs = vision_dirs(models)
    plain = [m for m in models if not m.draft_kind]
    bound = [m for m in models if m.draft_kind]
    members = _vocab_classes(plain)
    classes = _judge_classes(members, rules, vocabs)
    tally = _Tally()
    _plain_pairs(classes, members, rules, vocabs, vdirs, tally)
    _bound_pairs(bound, models, rules, vocabs, vdirs, tally)
    # A draft head as the target is never servable.
    if bound and plain:
        tally.refuse("target_is_language_model", len(bound) * len(plain))
    return AuditResult(
        rules_label=rules.label,
        llama_build=rules.since_build,
        n_models=len(models),
        classes=tuple((cid, tuple(m.model_id or "" for m in ms)) for cid, ms in members.items()),
        class_verdicts=tuple(classes.verdicts),
        pairs=tuple(tally.pairs),
        counts=dict(tally.counts),
        refusals=dict(tally.refusals),
        seconds=time.perf_counter() - t0,
        vocab_comparisons=classes.n_text,
        names={m.model_id: m.display_name for m in models if m.model_id},
    )


def _vocab_classes(plain: list[ModelRecord]) -> dict[int, list[ModelRecord]]:
    """Models with one vocabulary signature form a class; class ids in order of first member."""
    class_of_sig: dict[tuple[Any, ...], int] = {}
    members: dict[int, list[ModelRecord]] = defaultdict(list)
    for m in plain:
        cid = class_of_sig.setdefault(vocab_signature(m), len(class_of_sig))
        members[cid].append(m)
    return members


@dataclass
class _Classes:
    """The vocabulary check between every ordered pair of classes."""

    verdicts: list[ClassVerdict]
    outcomes: dict[tuple[int, int], VocabOutcome]  # accepted class pairs with model pairs
    n_text: int  # distinct token lists compared text by text


def _judge_classes(
    members: dict[int, list[ModelRecord]], rules: RuleSet, vocabs: VocabCache
) -> _Classes:
    """Run the vocabulary check once per ordered pair of classes, on their first members.

    The check is symmetric, so texts are compared once per unordered pair of distinct token
    lists (none for equal lists).
    """
    text_cache: dict[tuple[tuple[str, bool], ...], bool] = {}
    out = _Classes([], {}, 0)
    reps = {cid: ms[0] for cid, ms in members.items()}
    for a in sorted(reps):
        for b in sorted(reps):
            ta, tb = reps[a], reps[b]
            outcome = None
            failed = _scalar_failures(ta, tb, rules)
            if not failed:
                # hybriddna loaders rewrite texts, so the tokenizer model is part of the key.
                sides = ((ta.vocab_sha or "", ta.tok_model == "hybriddna"),
                         (tb.vocab_sha or "", tb.tok_model == "hybriddna"))  # fmt: skip
                key = tuple(sorted(sides))
                if sides[0] == sides[1]:
                    text_ok = True
                elif key in text_cache:
                    text_ok = text_cache[key]
                else:
                    outcome = vocab_checks(
                        ta, tb, vocabs.get(ta.vocab_sha), vocabs.get(tb.vocab_sha), rules
                    )
                    text_ok = outcome.checks[-1].passed
                    text_cache[key] = text_ok
                    out.n_text += 1
                if not text_ok:
                    failed = ("token_text",)
            n_pairs = len(members[a]) * len(members[b]) - (len(members[a]) if a == b else 0)
            out.verdicts.append(ClassVerdict(a, b, not failed, failed, n_pairs))
            if not failed and n_pairs:
                if outcome is None and sides[0] == sides[1]:
                    # One token list: equal texts and no extra ids, nothing to load.
                    outcome = vocab_checks(ta, tb, None, None, rules)
                out.outcomes[(a, b)] = outcome or vocab_checks(
                    ta, tb, vocabs.get(ta.vocab_sha), vocabs.get(tb.vocab_sha), rules
                )
    return out


@dataclass
class _Tally:
    """Pairs judged so far: their summaries, counts per verdict, refusals per first check."""

    pairs: list[PairSummary] = field(default_factory=list)
    counts: Counter[str] = field(default_factory=Counter)
    refusals: Counter[str] = field(default_factory=Counter)

    def add(self, pair: PairSummary) -> None:
        self.counts[pair.verdict.value] += 1
        self.pairs.append(pair)

    def refuse(self, check: str, n_pairs: int) -> None:
        self.counts[Verdict.INCOMPATIBLE.value] += n_pairs
        self.refusals[check] += n_pairs


def _ratio_ok(t: ModelRecord, d: ModelRecord) -> bool | None:
    """Whether the draft is small enough to pay for itself; None when a size is unknown."""
    size_t, size_d = _size(t), _size(d)
    return (size_t / size_d >= MIN_USEFUL_SIZE_RATIO) if size_t and size_d else None


def _plain_pairs(
    classes: _Classes,
    members: dict[int, list[ModelRecord]],
    rules: RuleSet,
    vocabs: VocabCache,
    vdirs: frozenset[str],
    tally: _Tally,
) -> None:
    """Judge the model pairs of accepted class pairs; a refused class pair counts at once.

    A pair's verdict is memoised on the few facts the other checks read.
    """
    memo: dict[tuple[Any, ...], tuple[Verdict, tuple[str, ...]]] = {}
    for cv in classes.verdicts:
        if not cv.accepts:
            tally.refuse(cv.failed[0], cv.n_pairs)
            continue
        if not cv.n_pairs:
            continue
        outcome = classes.outcomes[(cv.target_class, cv.draft_class)]
        for t in members[cv.target_class]:
            cap_t, tpl_t = _cap_signature(t, vdirs), t.chat_template_sha256
            for d in members[cv.draft_class]:
                if d is t:
                    continue
                tpl_d = d.chat_template_sha256
                memo_key = (
                    cv.target_class,
                    cv.draft_class,
                    cap_t,
                    bool(d.is_mmproj),
                    d.tok_pre,
                    bool(tpl_t and tpl_d and tpl_t != tpl_d),
                    _ratio_ok(t, d),
                )
                hit = memo.get(memo_key)
                if hit is None:
                    pv = judge(t, d, rules, vocabs, outcome, vision_dirs=vdirs)
                    hit = memo[memo_key] = (pv.verdict, tuple(c.name for c in pv.failed))
                tally.add(PairSummary(t.model_id or "", d.model_id or "", hit[0], True, hit[1]))


def _bound_pairs(
    bound: list[ModelRecord],
    models: list[ModelRecord],
    rules: RuleSet,
    vocabs: VocabCache,
    vdirs: frozenset[str],
    tally: _Tally,
) -> None:
    """Bound drafts (EAGLE-3, DFlash, DSpark) against every model.

    llama.cpp runs no vocabulary check for them; their binding reads the target's shape, their
    vocabulary is their target's and they may name the model they were trained for, so the
    memo key holds the target's shape, vocabulary and names.
    """
    memo: dict[tuple[Any, ...], tuple[Verdict, tuple[str, ...]]] = {}
    for d in bound:
        tpl_d = d.chat_template_sha256
        d_key = (d.draft_binding, d.draft_kind, bool(d.is_mmproj), d.bos_id is None)
        for t in models:
            if t is d:
                continue
            tpl_t = t.chat_template_sha256
            key = (
                d_key,
                _cap_signature(t, vdirs),
                vocab_signature(t),  # a head carries its target's vocabulary
                target_names(t),  # and may name the model it was trained for
                t.embedding_length,
                t.block_count,
                t.bos_id is None,
                bool(tpl_t and tpl_d and tpl_t != tpl_d),
                _ratio_ok(t, d),
            )
            hit = memo.get(key)
            if hit is None:
                pv = judge(t, d, rules, vocabs, vision_dirs=vdirs)
                hit = memo[key] = (pv.verdict, tuple(c.name for c in pv.failed))
            tally.add(PairSummary(t.model_id or "", d.model_id or "", hit[0], None, hit[1]))


def _scalar_failures(t: ModelRecord, d: ModelRecord, rules: RuleSet) -> tuple[str, ...]:
    """The vocabulary checks that need no token texts, in llama.cpp's order."""
    out = []
    if t.vocab_type != d.vocab_type:
        out.append("vocab_type")
    kinds: tuple[SpecialKind, ...] = ("bos", "eos")
    for kind in kinds:
        passed, _ = special_token_rule(special_token(t, kind), special_token(d, kind), rules)
        if not passed:
            out.append(kind)
    if abs((t.n_tokens or 0) - (d.n_tokens or 0)) > rules.vocab_max_size_difference:
        out.append("vocab_size")
    return tuple(out)
