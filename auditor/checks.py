"""The checks of one ordered (target, draft) pair, from registry facts and stored vocabularies.

Pure functions of two models' facts, their vocabularies and a `RuleSet`; no database access,
so `audit_all` can run them once per vocabulary class instead of once per pair. The facts a
check reads are named in `ModelFacts` (a registry `ModelRecord` has them all): a misspelt or
missing fact is a type error, never a silent default.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import numpy as np

from specreg.auditor.rules import RuleSet
from specreg.auditor.verdict import Check, Severity
from specreg.auditor.vocab import (
    ExtraTokens,
    dna_strip_start,
    extra_tokens,
    first_text_difference,
)
from specreg.registry.gguf_header import StringArray
from specreg.registry.llama_vocab import VOCAB_TYPE_IDS  # numbers users see in llama.cpp logs

# A draft must be this many times smaller than the target's active weights to pay for itself;
# the reference host's self-speculative runs (ratio 1-2) ran slower than no speculation.
MIN_USEFUL_SIZE_RATIO = 4.0
NULL_TOKEN = -1


class VocabLike(Protocol):
    """A stored vocabulary: token texts as serialized, token types if the file has them."""

    @property
    def tokens(self) -> StringArray: ...

    @property
    def token_types(self) -> np.ndarray | None: ...


class ModelFacts(Protocol):
    """The registry facts of one model that the checks read (None: the file does not say)."""

    @property
    def architecture(self) -> str | None: ...
    # tokenizer, as llama.cpp's loader resolves it (registry/llama_vocab.py)
    @property
    def tok_model(self) -> str | None: ...
    @property
    def tok_pre(self) -> str | None: ...
    @property
    def vocab_type(self) -> str | None: ...
    @property
    def n_tokens(self) -> int | None: ...
    @property
    def vocab_sha(self) -> str | None: ...
    @property
    def bos_id(self) -> int | None: ...
    @property
    def eos_id(self) -> int | None: ...
    @property
    def bos_text(self) -> str | None: ...
    @property
    def eos_text(self) -> str | None: ...
    @property
    def add_bos(self) -> bool | None: ...
    @property
    def add_eos(self) -> bool | None: ...
    @property
    def add_bos_stored(self) -> bool | None: ...
    @property
    def add_eos_stored(self) -> bool | None: ...
    @property
    def chat_template_sha256(self) -> str | None: ...
    # shape and kind
    @property
    def n_params(self) -> int | None: ...
    @property
    def n_params_active(self) -> int | None: ...
    @property
    def embedding_length(self) -> int | None: ...
    @property
    def block_count(self) -> int | None: ...
    @property
    def is_recurrent(self) -> bool | None: ...
    @property
    def is_hybrid(self) -> bool | None: ...
    @property
    def sliding_window(self) -> int | None: ...
    @property
    def uses_mla(self) -> bool | None: ...
    @property
    def is_mmproj(self) -> bool | None: ...
    @property
    def nextn_predict_layers(self) -> int | None: ...
    @property
    def has_mtp_tensors(self) -> bool | None: ...
    @property
    def draft_kind(self) -> str | None: ...
    @property
    def draft_binding(self) -> str | None: ...


def _tok(v: int | None) -> int:
    return NULL_TOKEN if v is None else int(v)


@dataclass(frozen=True)
class SpecialToken:
    """One side's BOS or EOS as llama.cpp's check sees it: added or not, and its id."""

    add: bool  # effective add_bos/add_eos after the loader's defaults
    id: int  # NULL_TOKEN when absent
    add_stored: bool | None  # what the GGUF itself declares (None: key absent)
    text: str | None


SpecialKind = Literal["bos", "eos"]


def special_token(m: ModelFacts, kind: SpecialKind) -> SpecialToken:
    if kind == "bos":
        return SpecialToken(bool(m.add_bos), _tok(m.bos_id), m.add_bos_stored, m.bos_text)
    return SpecialToken(bool(m.add_eos), _tok(m.eos_id), m.add_eos_stored, m.eos_text)


def special_token_rule(t: SpecialToken, d: SpecialToken, rules: RuleSet) -> tuple[bool, bool]:
    """(passed, ids compared): llama.cpp's BOS/EOS rule for one kind."""
    compare_ids = t.add if rules.special_ids_only_when_added else True
    return t.add == d.add and (not compare_ids or t.id == d.id), compare_ids


def vocab_signature(m: ModelFacts) -> tuple[Any, ...]:
    """Everything common_speculative_are_compatible reads from one side."""
    return (
        m.vocab_type if m.vocab_type is not None else "",
        bool(m.add_bos),
        _tok(m.bos_id),
        bool(m.add_eos),
        _tok(m.eos_id),
        int(m.n_tokens or 0),
        m.vocab_sha,
        m.add_bos_stored,
        m.add_eos_stored,
        m.tok_model,
    )


@dataclass(frozen=True)
class VocabOutcome:
    checks: tuple[Check, ...]
    accepts: bool
    first_diff: int | None
    extra: ExtraTokens | None


def _special_check(kind: SpecialKind, t: ModelFacts, d: ModelFacts, rules: RuleSet) -> Check:
    st, sd = special_token(t, kind), special_token(d, kind)
    add_t, add_d, id_t, id_d = st.add, sd.add, st.id, sd.id
    passed, compare_ids = special_token_rule(st, sd, rules)
    values = {
        "target_add": add_t,
        "draft_add": add_d,
        "target_add_stored": st.add_stored,
        "draft_add_stored": sd.add_stored,
        "target_id": id_t,
        "draft_id": id_d,
        "target_text": st.text,
        "draft_text": sd.text,
        "ids_compared": compare_ids,
    }
    up = kind.upper()
    if passed:
        msg = f"add_{kind} {str(add_t).lower()} on both" + (
            f", same {up} id {id_t}" if compare_ids else f" ({up} ids not compared)"
        )
    elif add_t != add_d:
        msg = f"add_{kind} differs: target {str(add_t).lower()}, draft {str(add_d).lower()}"
    else:
        msg = (
            f"{up} ids differ: target {id_t} {values['target_text']!r}, "
            f"draft {id_d} {values['draft_text']!r}"
        )
    return Check(kind, passed, Severity.BLOCKS, msg, values, llama_check=True)


def _vocab_type_check(t: ModelFacts, d: ModelFacts) -> Check:
    type_t = t.vocab_type if t.vocab_type is not None else "?"
    type_d = d.vocab_type if d.vocab_type is not None else "?"
    return Check(
        "vocab_type",
        type_t == type_d,
        Severity.BLOCKS,
        f"vocab type {type_t}" + (" on both" if type_t == type_d else f" vs {type_d}"),
        {
            "target": type_t,
            "draft": type_d,
            "target_id": VOCAB_TYPE_IDS.get(type_t),
            "draft_id": VOCAB_TYPE_IDS.get(type_d),
            "target_tok_model": t.tok_model,
            "draft_tok_model": d.tok_model,
        },
        llama_check=True,
    )


def _vocab_size_check(n_t: int, n_d: int, rules: RuleSet) -> Check:
    diff = abs(n_t - n_d)
    size_ok = diff <= rules.vocab_max_size_difference
    return Check(
        "vocab_size",
        size_ok,
        Severity.BLOCKS,
        f"{n_t} vs {n_d} tokens, difference {diff} "
        + ("<=" if size_ok else ">")
        + f" {rules.vocab_max_size_difference}",
        {
            "target_n_tokens": n_t,
            "draft_n_tokens": n_d,
            "difference": diff,
            "max_difference": rules.vocab_max_size_difference,
        },
        llama_check=True,
    )


def _token_text_check(
    t: ModelFacts, d: ModelFacts, vt: VocabLike | None, vd: VocabLike | None, rules: RuleSet
) -> tuple[Check, int | None]:
    """The token-text rule, and the first id whose texts differ (None: identical)."""
    start = rules.vocab_check_start_token_id
    stop = min(int(t.n_tokens or 0), int(d.n_tokens or 0))
    first: int | None = None
    if vt is not None and vd is not None:
        strip_t = dna_strip_start(vt.tokens) if t.tok_model == "hybriddna" else None
        strip_d = dna_strip_start(vd.tokens) if d.tok_model == "hybriddna" else None
        first = first_text_difference(vt.tokens, vd.tokens, start, strip_t, strip_d)
    elif (vt is None) != (vd is None) and stop > start:
        first = start  # one side has token texts, the other only dummies ("")
    values: dict[str, Any] = {"start_id": start, "stop_id": stop, "first_differing_id": first}
    if first is not None:
        values["target_text"] = vt.tokens[first] if vt is not None else ""
        values["draft_text"] = vd.tokens[first] if vd is not None else ""
        msg = (
            f"token {first} differs: target {values['target_text']!r}, "
            f"draft {values['draft_text']!r}"
        )
    else:
        msg = f"token texts identical for ids {start}..{max(stop - 1, start)}"
    check = Check("token_text", first is None, Severity.BLOCKS, msg, values, llama_check=True)
    return check, first


def vocab_checks(
    t: ModelFacts, d: ModelFacts, vt: VocabLike | None, vd: VocabLike | None, rules: RuleSet
) -> VocabOutcome:
    """common_speculative_are_compatible, every check evaluated (llama.cpp stops at the first)."""
    n_t, n_d = int(t.n_tokens or 0), int(d.n_tokens or 0)
    text_check, first = _token_text_check(t, d, vt, vd, rules)
    checks = (
        _vocab_type_check(t, d),
        _special_check("bos", t, d, rules),
        _special_check("eos", t, d, rules),
        _vocab_size_check(n_t, n_d, rules),
        text_check,
    )
    extra: ExtraTokens | None = None
    # Classify the extra ids only when the size rule can let them through (or nearly): the
    # question is whether llama.cpp's accepted pair is safe, and it bounds the work.
    near = abs(n_t - n_d) <= 4 * rules.vocab_max_size_difference
    if n_t != n_d and near and vt is not None and vd is not None:
        big, side = (vt, "target") if n_t > n_d else (vd, "draft")
        extra = extra_tokens(big.tokens, big.token_types, min(n_t, n_d), side)
    return VocabOutcome(checks, all(c.passed for c in checks), first, extra)


def extra_tokens_check(outcome: VocabOutcome) -> Check | None:
    """The size rule lets real tokens through; name them (risky at run time)."""
    ex = outcome.extra
    if ex is None:
        return None
    values = {
        "side": ex.side,
        "first_id": ex.first_id,
        "stop_id": ex.stop_id,
        "count": ex.count,
        "padding": ex.n_padding,
        "only_padding": ex.only_padding,
        "real_examples": [list(e) for e in ex.real_examples],
    }
    if ex.only_padding:
        msg = f"the {ex.count} extra {ex.side} ids {ex.first_id}..{ex.stop_id - 1} are padding"
        return Check("extra_tokens", True, Severity.RISK, msg, values)
    real = ex.count - ex.n_padding
    who = (
        "the target can emit ids the draft does not have"
        if ex.side == "target"
        else "the draft can propose ids the target does not have"
    )
    examples = ", ".join(f"{i} {txt!r}" for i, txt in ex.real_examples[:3])
    msg = (
        f"{real} of the {ex.count} extra {ex.side} ids {ex.first_id}..{ex.stop_id - 1} are "
        f"real tokens ({examples}): {who}"
    )
    return Check("extra_tokens", False, Severity.RISK, msg, values)


def _binding(m: ModelFacts) -> dict[str, Any]:
    raw = m.draft_binding
    if not raw:
        return {}
    try:
        val = json.loads(raw)
    except (TypeError, ValueError):
        return {}
    return val if isinstance(val, dict) else {}


def _binding_value(binding: dict[str, Any], suffix: str) -> Any:
    for key, value in binding.items():
        if key.endswith(suffix):
            return value
    return None


def binding_check(t: ModelFacts, d: ModelFacts) -> Check:
    """EAGLE-3 / DFlash / DSpark drafts read the target's hidden states: they fit one target."""
    kind = d.draft_kind
    binding = _binding(d)
    hidden = _binding_value(binding, "target_hidden_size")
    layers = _binding_value(binding, "target_layers")
    emb = t.embedding_length
    blocks = t.block_count
    values: dict[str, Any] = {
        "draft_kind": kind,
        "binding": binding,
        "target_embedding_length": emb,
        "target_block_count": blocks,
    }
    problems = []
    if hidden is not None and emb is not None and int(hidden) != int(emb):
        problems.append(f"trained on hidden size {hidden}, target has {emb}")
    if isinstance(layers, list) and layers and blocks is not None and max(layers) >= int(blocks):
        problems.append(f"reads target layer {max(layers)}, target has {blocks} blocks")
    if kind == "eagle3" and isinstance(layers, list) and len(layers) != 3:
        problems.append(f"eagle3.target_layers has {len(layers)} entries, llama.cpp needs 3")
    if problems:
        return Check(
            "draft_binding",
            False,
            Severity.BLOCKS,
            f"{kind} draft built for another target: " + "; ".join(problems),
            values,
        )
    if hidden is None and not layers:
        return Check(
            "draft_binding",
            False,
            Severity.RISK,
            f"{kind} draft names no target (no target_hidden_size/target_layers); "
            "it fits only the model it was trained for",
            values,
        )
    return Check(
        "draft_binding",
        True,
        Severity.BLOCKS,
        f"{kind} draft's binding matches the target's shape",
        values,
    )


def head_vocab_check(t: ModelFacts, d: ModelFacts, outcome: VocabOutcome) -> Check:
    """A draft head (EAGLE-3, DFlash) is converted with its target's tokenizer and proposes
    that vocabulary's ids: a head whose vocabulary llama.cpp's rule would not take for the
    target's was trained for another model (`outcome`: `vocab_checks` of the two)."""
    kind = d.draft_kind
    values = {
        "target_n_tokens": t.n_tokens,
        "draft_n_tokens": d.n_tokens,
        "target_tok_pre": t.tok_pre,
        "draft_tok_pre": d.tok_pre,
        "failed": [c.name for c in outcome.checks if not c.passed],
    }
    if outcome.accepts:
        return Check(
            "head_vocab", True, Severity.BLOCKS, f"{kind} head's vocabulary is the target's", values
        )
    why = "; ".join(c.message for c in outcome.checks if not c.passed)
    return Check(
        "head_vocab",
        False,
        Severity.BLOCKS,
        f"{kind} head's vocabulary is not the target's ({why}): it was trained for another model",
        values,
    )


def head_target_check(t: ModelFacts, d: ModelFacts, target_names: tuple[str, ...]) -> Check | None:
    """The model a draft head names as its base (`general.base_model.0.name`) against the target's
    names, compared as `queries.name_key` compares them; None when the head names none. Another
    model of the same shape and vocabulary runs, with the acceptance of a head not trained on it."""
    from specreg.registry.queries import name_key

    base = _binding_value(_binding(d), "base_model.0.name")
    if not isinstance(base, str) or not name_key(base):
        return None
    keys = {name_key(n) for n in target_names if n}
    values = {"trained_for": base, "target_names": list(target_names)}
    if name_key(base) in keys:
        return Check("head_target", True, Severity.WARNS, f"trained for {base}, the target", values)
    shown = target_names[0] if target_names else "another model"
    return Check(
        "head_target",
        False,
        Severity.WARNS,
        f"{d.draft_kind} head trained for {base}, not {shown}: expect a lower acceptance",
        values,
    )


def _mmproj_check(role: str) -> Check:
    return Check(
        f"{role}_is_language_model",
        False,
        Severity.BLOCKS,
        f"the {role} is a vision projector (mmproj), not a language model",
        {"is_mmproj": True},
    )


def _draft_head_check(kind: str) -> Check:
    return Check(
        "target_is_language_model",
        False,
        Severity.BLOCKS,
        f"the target is a {kind} draft head, not a model to serve",
        {"draft_kind": kind},
    )


def target_refusal(t: ModelFacts) -> Check | None:
    """The failed check that refuses `t` as a target whatever the draft (a vision projector,
    a draft head), or None: what `audit` counts as target_is_language_model."""
    if t.is_mmproj:
        return _mmproj_check("target")
    if t.draft_kind:
        return _draft_head_check(t.draft_kind)
    return None


def capability_checks(
    t: ModelFacts, d: ModelFacts, rules: RuleSet, vision: bool = False
) -> list[Check]:
    """`vision`: the target is served with a vision projector (an mmproj beside it)."""
    checks: list[Check] = []
    for role, m in (("target", t), ("draft", d)):
        if m.is_mmproj:
            checks.append(_mmproj_check(role))
    if t.draft_kind:
        checks.append(_draft_head_check(t.draft_kind))

    recurrent = bool(t.is_recurrent)
    hybrid = bool(t.is_hybrid)
    if recurrent or hybrid:
        kind = "recurrent" if recurrent else "hybrid"
        ok = rules.recurrent_targets_speculate
        msg = (
            f"{kind} target ({t.architecture}): this build speculates with context checkpoints"
            if ok
            else f"{kind} target ({t.architecture}): this build cannot roll back "
            "recurrent state, so it cannot speculate on it"
        )
        checks.append(
            Check(
                "recurrent_target",
                ok,
                Severity.BLOCKS,
                msg,
                {
                    "architecture": t.architecture,
                    "is_recurrent": recurrent,
                    "is_hybrid": hybrid,
                    "build_speculates_with_checkpoints": ok,
                },
            )
        )
    if vision:
        ok = rules.vision_targets_speculate
        checks.append(
            Check(
                "vision_target",
                ok,
                Severity.RISK,
                "vision target (an mmproj sits beside it): "
                + (
                    "this build speculates with a projector loaded"
                    if ok
                    else "this build's server refuses speculative decoding when --mmproj is given"
                ),
                {"vision": True, "build_speculates_with_mmproj": ok},
            )
        )
    for flag, present, ok, what in (
        (
            "swa_target",
            bool(t.sliding_window),
            rules.swa_targets_speculate,
            "sliding-window attention",
        ),
        ("mla_target", bool(t.uses_mla), rules.mla_targets_speculate, "MLA attention"),
    ):
        if present:
            checks.append(
                Check(
                    flag,
                    ok,
                    Severity.RISK,
                    f"{what} target: "
                    + (
                        "this build speculates on it"
                        if ok
                        else "this build's cache cannot drop drafted tokens reliably"
                    ),
                    {"sliding_window": t.sliding_window, "uses_mla": t.uses_mla},
                )
            )
    return checks


def risk_checks(
    t: ModelFacts, d: ModelFacts, outcome: VocabOutcome | None, rules: RuleSet
) -> list[Check]:
    checks: list[Check] = []
    if outcome is not None:
        ex = extra_tokens_check(outcome)
        if ex is not None:
            checks.append(ex)
    missing = [role for role, m in (("target", t), ("draft", d)) if _tok(m.bos_id) == NULL_TOKEN]
    if missing:
        checks.append(
            Check(
                "bos_present",
                False,
                Severity.RISK,
                f"no BOS id in the {' and '.join(missing)}: the legacy llama-speculative demands "
                "matching special tokens and refuses such a pair",
                {"target_bos_id": t.bos_id, "draft_bos_id": d.bos_id},
            )
        )
    return checks


def advisory_checks(t: ModelFacts, d: ModelFacts, outcome: VocabOutcome | None) -> list[Check]:
    checks: list[Check] = []
    pre_t, pre_d = t.tok_pre, d.tok_pre
    if outcome is not None and outcome.accepts and pre_t != pre_d:
        checks.append(
            Check(
                "pre_tokenizer",
                False,
                Severity.WARNS,
                f"pre-tokenizers differ ({pre_t} vs {pre_d}) over identical tokens: the draft may "
                "split text differently from the target",
                {"target": pre_t, "draft": pre_d},
            )
        )
    if outcome is not None and outcome.accepts:
        # llama.cpp compares the effective add_bos; a draft whose own metadata says otherwise
        # (the key absent and defaulted, or overridden as for Gemma 4) was trained on the other.
        add = bool(t.add_bos)
        declared = d.add_bos_stored
        if declared is not None and bool(declared) != add:
            checks.append(
                Check(
                    "bos_training",
                    False,
                    Severity.WARNS,
                    f"the target {'adds' if add else 'does not add'} BOS but the draft's GGUF "
                    f"declares add_bos_token={str(bool(declared)).lower()}: the draft sees prompts "
                    "unlike those it was trained on",
                    {
                        "target_add_bos": add,
                        "draft_add_bos_stored": declared,
                        "target_add_bos_stored": t.add_bos_stored,
                    },
                )
            )
    tpl_t, tpl_d = t.chat_template_sha256, d.chat_template_sha256
    if tpl_t and tpl_d and tpl_t != tpl_d:
        checks.append(
            Check(
                "chat_template",
                False,
                Severity.WARNS,
                "chat templates differ: chat prompts look different to the draft",
                {"target_sha256": tpl_t, "draft_sha256": tpl_d},
            )
        )
    size_t = t.n_params_active or t.n_params
    size_d = d.n_params_active or d.n_params
    if size_t and size_d:
        ratio = float(size_t) / float(size_d)
        ok = ratio >= MIN_USEFUL_SIZE_RATIO
        checks.append(
            Check(
                "size_ratio",
                ok,
                Severity.WARNS,
                f"target active weights / draft weights = {ratio:.1f}"
                + ("" if ok else f" (< {MIN_USEFUL_SIZE_RATIO:g}: little or no speedup possible)"),
                {
                    "target_params": int(size_t),
                    "draft_params": int(size_d),
                    "ratio": ratio,
                    "min_useful_ratio": MIN_USEFUL_SIZE_RATIO,
                },
            )
        )
    return checks
