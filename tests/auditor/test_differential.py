"""specreg's vocabulary verdict against llama.cpp's own `common_speculative_are_compatible`.

A C++ harness compiled against the pinned build loads GGUFs with `vocab_only` and calls the
function; specreg must agree on every ordered pair of llama.cpp's real vocab GGUFs and of
mutated copies (padding by 128 and 129, real extra tokens, cuts, BOS/EOS changes, token texts
changed at ids 3, 4, 5, 1000 and the last id, tokenizer model and pre-tokenizer changed).
It also compares what each side believes about every file (type, effective add_bos/add_eos,
BOS/EOS ids, size), which names the culprit when a verdict differs.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from specreg.auditor import audit_all, compatible_drafts
from specreg.llama.build import BuildInfo
from specreg.registry.db import opened
from specreg.registry.queries import ModelRecord, list_models
from specreg.registry.scan import scan_paths

from support.auditor_harness import HarnessResult, compile_harness, run_harness
from support.mutations import write_mutations

pytestmark = pytest.mark.llama

# Bases for the mutations: byte-level BPE without BOS (qwen2), BPE adding BOS (llama-bpe),
# SentencePiece (llama-spm) and WordPiece (bert-bge).
MUTATION_BASES = ("qwen2", "llama-bpe", "llama-spm", "bert-bge")


@pytest.fixture(scope="session")
def harness(llama_build_info: BuildInfo, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = llama_build_info.build_dir.parent / "specreg-harness"
    return compile_harness(llama_build_info.src_dir, llama_build_info.lib_dir, out)


@pytest.fixture(scope="session")
def mutated_dir(vocab_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("mutated-vocabs")
    for base in MUTATION_BASES:
        write_mutations(vocab_dir / f"ggml-vocab-{base}.gguf", out / base)
    return out


@pytest.fixture(scope="session")
def differential(
    harness: Path, vocab_dir: Path, mutated_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[list[ModelRecord], HarnessResult, dict[tuple[str, str], bool | None], Path]:
    db = tmp_path_factory.mktemp("diff-db") / "registry.duckdb"
    with opened(db) as con:
        scan = scan_paths(con, [vocab_dir, mutated_dir])
        assert scan.ok, scan.errors
        models = list_models(con)
        # Ordered pairs: all real vocabs with each other; each base with its mutations, and
        # the mutations of one base with each other.
        groups = [[m for m in models if "/ggml-vocab-" in (m.path or "")]]
        for base in MUTATION_BASES:
            real = [m for m in groups[0] if m.path.endswith(f"ggml-vocab-{base}.gguf")]
            groups.append(real + [m for m in models if f"/{base}/" in (m.path or "")])
        index = {m.model_id: i for i, m in enumerate(models)}
        pairs = sorted(
            {
                (index[t.model_id], index[d.model_id])
                for g in groups
                for t, d in itertools.permutations(g, 2)
            }
        )
        result = run_harness(harness, [m.path for m in models], pairs)
        ours: dict[tuple[str, str], bool | None] = {}
        wanted = {(models[t].model_id, models[d].model_id) for t, d in pairs}
        for t in {models[t] for t, _ in pairs}:
            for pv in compatible_drafts(con, t, include_rejected=True):
                key = (pv.target.model_id, pv.draft.model_id)
                if key in wanted:
                    ours[key] = pv.llama_accepts
    return models, result, ours, db


def test_harness_loads_every_file(differential) -> None:  # type: ignore[no-untyped-def]
    models, result, _, _ = differential
    failed = [m.path for m, h in zip(models, result.models, strict=True) if not h.loaded]
    assert failed == []


def test_llama_facts_equal_registry_facts(differential) -> None:  # type: ignore[no-untyped-def]
    models, result, _, _ = differential
    diffs = []
    for m, h in zip(models, result.models, strict=True):
        ours = (
            m.vocab_type,
            bool(m.add_bos),
            bool(m.add_eos),
            -1 if m.bos_id is None else m.bos_id,
            -1 if m.eos_id is None else m.eos_id,
            m.n_tokens,
        )
        theirs = (h.vocab_type, h.add_bos, h.add_eos, h.bos_id, h.eos_id, h.n_tokens)
        if ours != theirs:
            diffs.append((Path(m.path).name, ours, theirs))
    assert diffs == []


def test_verdicts_agree_on_every_pair(differential) -> None:  # type: ignore[no-untyped-def]
    models, result, ours, _ = differential
    by_index = {i: m for i, m in enumerate(models)}
    disagreements = []
    for (t, d), theirs in result.verdicts.items():
        mine = ours[(by_index[t].model_id, by_index[d].model_id)]
        if mine != theirs:
            disagreements.append(
                (Path(by_index[t].path).name, Path(by_index[d].path).name, mine, theirs)
            )
    n = len(result.verdicts)
    accepted = sum(1 for v in result.verdicts.values() if v)
    # Enough pairs, and both answers well represented, or agreement would prove little.
    # 342 real pairs plus ~50 mutated files (identical copies fold into one model).
    assert n >= 1000
    assert accepted >= 40 and n - accepted >= 300
    print(
        f"differential: {n} ordered pairs over {len(models)} files, {accepted} accepted by "
        f"llama.cpp, {len(disagreements)} disagreements"
    )
    assert disagreements == [], f"{len(disagreements)} of {n} pairs disagree"


def test_bucketed_audit_agrees_with_llama(differential) -> None:  # type: ignore[no-untyped-def]
    models, result, _, db = differential
    with opened(db) as con:
        audit = audit_all(con)
    accepted = {(p.target_id, p.draft_id) for p in audit.pairs if p.llama_accepts}
    for (t, d), theirs in result.verdicts.items():
        key = (models[t].model_id, models[d].model_id)
        assert (key in accepted) == bool(theirs), key


def test_mutations_hit_every_rule(differential) -> None:  # type: ignore[no-untyped-def]
    """Each mutation changes llama.cpp's answer as its rule says (the mutations are real)."""
    models, result, _, _ = differential
    name = {i: Path(m.path).stem for i, m in enumerate(models)}
    verdict = {(name[t], name[d]): v for (t, d), v in result.verdicts.items()}
    base = "ggml-vocab-qwen2"
    assert verdict[(base, "qwen2--pad128")] is True
    assert verdict[(base, "qwen2--pad129")] is False
    assert verdict[(base, "qwen2--text3")] is True  # ids below 5 are not compared
    assert verdict[(base, "qwen2--text4")] is True
    assert verdict[(base, "qwen2--text5")] is False
    assert verdict[(base, "qwen2--text1000")] is False
    assert verdict[(base, "qwen2--text_last")] is False
    assert verdict[(base, "qwen2--bos_changed_add_off")] is True  # BOS not added: ids ignored
    assert verdict[(base, "qwen2--bos_changed_add_on")] is False
    assert verdict[(base, "qwen2--add_eos_flipped")] is False
    assert verdict[(base, "qwen2--model_llama")] is False
    assert verdict[("ggml-vocab-llama-bpe", "llama-bpe--bos_changed_add_off")] is False
