"""The auditor's checks on real and generated vocabularies: evidence, risks, capabilities."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from gguf.constants import TokenType

from specreg.auditor import (
    PairVerdict,
    Verdict,
    audit_all,
    check_pair,
    compatible_drafts,
    rules_for_build,
)
from specreg.auditor.rules import PINNED_BUILD, RULESETS
from specreg.auditor.vocab import (
    dna_strip_start,
    first_text_difference,
    naive_first_text_difference,
)
from specreg.registry.db import opened
from specreg.registry.gguf_header import read_header
from specreg.registry.queries import list_models
from specreg.registry.scan import scan_paths

from support.auditor import vocab_sizes

NORMAL, UNUSED, CONTROL = int(TokenType.NORMAL), int(TokenType.UNUSED), int(TokenType.CONTROL)


def _registry(tmp_path: Path, *paths: Path) -> Path:
    db = tmp_path / "reg.duckdb"
    with opened(db) as con:
        result = scan_paths(con, list(paths))
    assert result.ok, result.errors
    return db


def _checked(tmp_path: Path, target: Path, draft: Path) -> PairVerdict:
    """`target` against `draft`, the two scanned into a registry of their own."""
    with opened(_registry(tmp_path, target, draft), read_only=True) as con:
        return check_pair(con, str(target), str(draft))


def test_rules_are_keyed_by_build() -> None:
    assert rules_for_build(None).since_build == PINNED_BUILD
    assert rules_for_build(0).since_build == PINNED_BUILD  # unnumbered builds report 0
    assert rules_for_build(PINNED_BUILD).vocab_max_size_difference == 128
    assert rules_for_build(1500).vocab_max_size_difference == 100
    old = rules_for_build(7371)
    assert not old.special_ids_only_when_added and not old.recurrent_targets_speculate
    assert old.draft_flags == ("-md",)
    # one spelling with recommend, run and export: the dialect's (issue 41 point 16)
    assert rules_for_build(PINNED_BUILD).draft_flags == (
        "--spec-type", "draft-simple", "--spec-draft-model"
    )  # fmt: skip
    assert [r.since_build for r in RULESETS] == sorted(r.since_build for r in RULESETS)


def test_first_difference_equals_token_loop(vocab_paths: list[Path]) -> None:
    """The raw-region search finds exactly what the token-by-token loop finds."""
    qwen = read_header(next(p for p in vocab_paths if p.name.endswith("qwen2.gguf")))
    tokens = qwen.kv["tokenizer.ggml.tokens"]
    assert first_text_difference(tokens, tokens) is None
    others = [read_header(p).kv["tokenizer.ggml.tokens"] for p in vocab_paths[:6]]
    for other in others:
        assert first_text_difference(tokens, other) == naive_first_text_difference(tokens, other)


def test_llama_text_quirks(gguf_factory) -> None:  # type: ignore[no-untyped-def]
    """An empty token reads as [EMPTY_i] and strcmp stops at NUL: differences llama.cpp cannot
    see are not reported, the first one it can see is."""
    base = [f"t{i}" for i in range(40)]
    a = list(base)
    b = list(base)
    a[7], b[7] = "x\0one", "x\0two"  # equal up to NUL
    a[9], b[9] = "", "[EMPTY_9]"  # the loader renames an empty token
    b[20] = "changed"
    ta = read_header(gguf_factory("a.gguf", tokens=a)).kv["tokenizer.ggml.tokens"]
    tb = read_header(gguf_factory("b.gguf", tokens=b)).kv["tokenizer.ggml.tokens"]
    assert first_text_difference(ta, tb) == 20
    assert naive_first_text_difference(ta, tb) == 20


def test_hybriddna_marker_is_stripped_like_the_loader(gguf_factory) -> None:  # type: ignore[no-untyped-def]
    """The hybriddna loader erases the k-mer marker after <oov>: a vocabulary with the marker
    matches one without it from there on, but not before."""
    marker = "\ue000"
    plain = [f"t{i}" for i in range(10)] + ["<oov>"] + ["ACGT", "TTGA", "GG"]
    marked = plain[:11] + [k + marker for k in plain[11:]]
    early = list(marked)
    early[6] = "t6" + marker  # before <oov>: not stripped
    ta = read_header(gguf_factory("p.gguf", tokens=plain)).kv["tokenizer.ggml.tokens"]
    tb = read_header(gguf_factory("m.gguf", tokens=marked)).kv["tokenizer.ggml.tokens"]
    tc = read_header(gguf_factory("e.gguf", tokens=early)).kv["tokenizer.ggml.tokens"]
    strip = dna_strip_start(tb)
    assert strip == 11
    assert first_text_difference(ta, tb) == 11  # read raw, the texts differ
    assert first_text_difference(ta, tb, strip_dft=strip) is None
    assert first_text_difference(ta, tc, strip_dft=strip) == 6
    assert first_text_difference(tb, tc, 5, strip, strip) == 6


def test_incompatible_pair_explains_every_check(vocab_dir: Path, tmp_path: Path) -> None:
    pv = _checked(
        tmp_path, vocab_dir / "ggml-vocab-qwen2.gguf", vocab_dir / "ggml-vocab-llama-spm.gguf"
    )
    assert pv.verdict is Verdict.INCOMPATIBLE and not pv.compatible and pv.llama_accepts is False
    assert {c.name for c in pv.checks if c.llama_check} == {
        "vocab_type",
        "bos",
        "eos",
        "vocab_size",
        "token_text",
    }
    assert pv.check("vocab_type").values["target"] == "BPE"
    assert pv.check("vocab_type").values["draft_id"] == 1
    bos = pv.check("bos").values
    assert (bos["target_add"], bos["draft_add"], bos["draft_id"], bos["draft_text"]) == (
        False,
        True,
        1,
        "<s>",
    )
    assert vocab_sizes(pv) == (151936, 32000, 119936)
    text = pv.check("token_text").values
    assert text["first_differing_id"] == 5 and text["target_text"] and text["draft_text"]
    assert any("n-gram" in r for r in pv.remedies)
    assert pv.spec_type is None and pv.flags == ()
    doc = pv.as_dict()
    assert doc["compatible"] is False and doc["verdict"] == "incompatible"
    assert all({"name", "passed", "values"} <= set(c) for c in doc["checks"])


def test_real_extra_tokens_are_risky(vocab_dir: Path, tmp_path: Path) -> None:
    """Phi-3 (32,064) vs Llama SPM (32,000): llama.cpp accepts, but 11 of the 64 extra ids are
    real tokens such as <|endoftext|> and <|assistant|>."""
    pv = _checked(
        tmp_path, vocab_dir / "ggml-vocab-phi-3.gguf", vocab_dir / "ggml-vocab-llama-spm.gguf"
    )
    assert pv.llama_accepts is True and pv.verdict is Verdict.RISKY and not pv.compatible
    extra = pv.check("extra_tokens").values
    assert extra["side"] == "target" and extra["count"] == 64 and not extra["only_padding"]
    assert [32000, "<|endoftext|>"] in extra["real_examples"]


def test_padding_only_gap_is_compatible(gguf_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    toks = [f"t{i}" for i in range(300)]
    padded = toks + [f"[PAD{i}]" for i in range(300, 428)]
    big = gguf_factory(
        "big.gguf",
        tokens=padded,
        token_types=[NORMAL] * 300 + [UNUSED] * 128,
        bos=1,
        add_bos=True,
        general_name="big",
    )
    small = gguf_factory("small.gguf", tokens=toks, bos=1, add_bos=True, general_name="small")
    over = gguf_factory(
        "over.gguf",
        tokens=padded + ["[PAD428]"],
        token_types=[NORMAL] * 300 + [UNUSED] * 129,
        bos=1,
        add_bos=True,
        general_name="over",
    )
    db = _registry(tmp_path, big, small, over)
    with opened(db, read_only=True) as con:
        ok = check_pair(con, "big", "small")
        refused = check_pair(con, "over", "small")
    assert ok.llama_accepts and ok.check("extra_tokens").values["only_padding"]
    assert ok.verdict in (Verdict.COMPATIBLE, Verdict.WARNINGS)
    assert refused.verdict is Verdict.INCOMPATIBLE
    assert refused.check("vocab_size").values["difference"] == 129


def test_missing_bos_is_risky(gguf_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """T5-style (UGM) vocabularies have no BOS by default: llama.cpp's check passes, the legacy
    llama-speculative refuses."""
    toks = [f"t{i}" for i in range(64)]
    a = gguf_factory("a.gguf", tokens=toks, model="t5", pre=None, general_name="ta")
    b = gguf_factory("b.gguf", tokens=toks, model="t5", pre=None, general_name="tb")
    pv = _checked(tmp_path, a, b)
    assert pv.llama_accepts and pv.check("bos").values["target_id"] == -1
    assert pv.verdict is Verdict.RISKY and not pv.check("bos_present").passed


def test_demo_capabilities(scanned_db: Path) -> None:
    with opened(scanned_db, read_only=True) as con:
        hybrid = check_pair(con, "Qwen3 Next 80B A3B Instruct", "Qwen3 Coder Instruct DRAFT 0.75B")
        hybrid_old = check_pair(
            con,
            "Qwen3 Next 80B A3B Instruct",
            "Qwen3 Coder Instruct DRAFT 0.75B",
            rules_for_build(7371),
        )
        eagle = check_pair(con, "Meta Llama 3.1 8B Instruct", "EAGLE3 LLaMA3.1 Instruct 8B")
        eagle_wrong = check_pair(con, "Llama 3.2 1B Instruct", "EAGLE3 LLaMA3.1 Instruct 8B")
        glm = check_pair(con, "GLM 4.5 Air", "Qwen3 Coder Instruct DRAFT 0.75B")
        gemma_old = check_pair(con, "Gemma 3 27b It", "Gemma 3 1b It", rules_for_build(7371))
    assert hybrid.compatible and hybrid.check("recurrent_target").passed
    assert not hybrid_old.compatible and not hybrid_old.check("recurrent_target").passed
    assert any("context checkpoints" in r for r in hybrid_old.remedies)
    assert eagle.compatible and eagle.spec_type == "draft-eagle3" and eagle.llama_accepts is None
    assert "--spec-type" in eagle.flags and "draft-eagle3" in eagle.flags
    assert eagle_wrong.verdict is Verdict.INCOMPATIBLE
    assert "hidden size 4096" in eagle_wrong.check("draft_binding").message
    assert any("draft-mtp" in r for r in glm.remedies)
    assert gemma_old.verdict is Verdict.RISKY and not gemma_old.check("swa_target").passed


def test_drafts_ranked_and_rejected_on_request(scanned_db: Path) -> None:
    with opened(scanned_db, read_only=True) as con:
        good = compatible_drafts(con, "Qwen2.5 Coder 32B Instruct")
        everything = compatible_drafts(con, "Qwen2.5 Coder 32B Instruct", include_rejected=True)
    assert good and all(pv.compatible for pv in good)
    assert good[0].draft.label == "Qwen2.5 Coder 0.5B Instruct"
    assert len(everything) == len(list_models_of(scanned_db)) - 1
    ranks = [pv.verdict.rank for pv in everything]
    assert ranks == sorted(ranks)


def list_models_of(db: Path) -> list:  # type: ignore[type-arg]
    with opened(db, read_only=True) as con:
        return list_models(con)


def test_audit_all_equals_pairwise_checks(scanned_db: Path) -> None:
    """The bucketed audit gives every ordered pair the verdict check_pair gives it."""
    with opened(scanned_db, read_only=True) as con:
        models = list_models(con)
        result = audit_all(con, models=models)
        summaries = {(p.target_id, p.draft_id): p for p in result.pairs}
        assert sum(result.counts.values()) == result.n_pairs == len(models) * (len(models) - 1)
        rng = random.Random(1)
        pairs = [(t, d) for t in models for d in models if t is not d]
        for t, d in rng.sample(pairs, 60) + [
            (t, d) for t, d in pairs if (t.model_id, d.model_id) in summaries
        ]:
            pv = check_pair(con, t, d)
            s = summaries.get((t.model_id, d.model_id))
            assert (s.verdict if s else Verdict.INCOMPATIBLE) is pv.verdict, (t.name, d.name)
            if s:
                assert set(s.findings) == {c.name for c in pv.failed}


@pytest.mark.parametrize("build", [None, 7371, 1500])
def test_audit_counts_are_consistent_per_build(scanned_db: Path, build: int | None) -> None:
    with opened(scanned_db, read_only=True) as con:
        result = audit_all(con, rules_for_build(build))
    assert sum(result.counts.values()) == result.n_pairs
    assert result.llama_build == rules_for_build(build).since_build


def test_vision_target_is_risky_on_old_builds(gguf_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    toks = [f"t{i}" for i in range(300)]
    vl = tmp_path / "vl"
    target = gguf_factory(
        "vl-7b.gguf", tokens=toks, bos=1, add_bos=True, general_name="vl-7b", directory=vl
    )
    gguf_factory(
        "mmproj-vl-7b.gguf", tokens=toks, arch="clip", general_name="vl-proj", directory=vl
    )
    draft = gguf_factory("small.gguf", tokens=toks, bos=1, add_bos=True, general_name="small")
    db = _registry(tmp_path, vl, draft)
    with opened(db, read_only=True) as con:
        new = check_pair(con, str(target), str(draft))
        old = check_pair(con, str(target), str(draft), rules_for_build(7371))
        proj = check_pair(con, str(vl / "mmproj-vl-7b.gguf"), str(draft))
        audit_old = audit_all(con, rules_for_build(7371))
    assert new.check("vision_target").passed and new.compatible
    assert old.verdict is Verdict.RISKY and not old.check("vision_target").passed
    assert (
        proj.verdict is Verdict.INCOMPATIBLE and not proj.check("target_is_language_model").passed
    )
    s = audit_old.summary(new.target.model_id, new.draft.model_id)
    assert s is not None and s.verdict is Verdict.RISKY and "vision_target" in s.findings


HEAD = "EAGLE3 LLaMA3.1 Instruct 8B"


def test_an_eagle3_head_is_checked_for_its_targets_vocabulary(scanned_db: Path) -> None:
    """Issue 41, point 5: GLM 4.5 Air is 4096 wide like Llama 3.1 8B, but the head carries Llama
    3's 128,256-token vocabulary, not GLM's 151,552: incompatible, with the reason, and the
    audit says the same."""
    with opened(scanned_db, read_only=True) as con:
        glm = check_pair(con, "GLM 4.5 Air", HEAD)
        own = check_pair(con, "Meta Llama 3.1 8B Instruct", HEAD)
        audit = audit_all(con)
    assert glm.verdict is Verdict.INCOMPATIBLE and glm.spec_type is None and not glm.flags
    assert glm.check("draft_binding").passed  # the shape alone fits
    vocab = glm.check("head_vocab")
    assert not vocab.passed and "151552 vs 128256 tokens" in vocab.message
    assert vocab.message.endswith("it was trained for another model")
    assert "trained for Meta Llama 3.1 8B Instruct, not GLM 4.5 Air" in (
        glm.check("head_target").message
    )
    assert own.compatible and own.check("head_vocab").passed and own.check("head_target").passed
    for pv in (glm, own):
        summary = audit.summary(pv.target.model_id, pv.draft.model_id)
        assert summary is not None and summary.verdict is pv.verdict


def test_an_eagle3_head_on_another_model_of_its_shape_warns(gguf_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A head names the model it was trained for (general.base_model.0.name): another model of
    that shape and vocabulary runs it, with a warning; one of another vocabulary cannot."""
    big = (("token_embd.weight", (256, 4)),)
    base = gguf_factory("base.gguf", general_name="Tiny Base", tensors=big)
    other = gguf_factory("other.gguf", general_name="Tiny Other", tensors=big)
    alien = gguf_factory(
        "alien.gguf", general_name="Tiny Alien", tensors=big, tokens=[f"u{i}" for i in range(64)]
    )
    head = gguf_factory(
        "head.gguf",
        arch="eagle3",
        general_name="Tiny Head",
        kv={
            "eagle3.target_hidden_size": 4,
            "eagle3.target_layers": [0, 0, 0],
            "general.base_model.0.name": "tiny-base",
        },
    )
    db = _registry(tmp_path, base, other, alien, head)
    with opened(db, read_only=True) as con:
        own, elsewhere, refused = (check_pair(con, t, "Tiny Head") for t in (base, other, alien))
        audit = audit_all(con)
    assert own.verdict is Verdict.COMPATIBLE and own.check("head_target").passed
    assert elsewhere.verdict is Verdict.WARNINGS
    assert elsewhere.warnings == (
        "eagle3 head trained for tiny-base, not Tiny Other: expect a lower acceptance",
    )
    assert refused.verdict is Verdict.INCOMPATIBLE and not refused.check("head_vocab").passed
    for pv in (own, elsewhere, refused):
        summary = audit.summary(pv.target.model_id, pv.draft.model_id)
        assert summary is not None and summary.verdict is pv.verdict
