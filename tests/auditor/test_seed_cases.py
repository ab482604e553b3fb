"""The reference host's observed verdicts (auditor/data/seed_compat_cases.csv) as tests.

The host ran llama.cpp build 7371. Each measured row is replayed on the demo collection (sparse
GGUFs with the real shapes and tokenizer layouts) plus a few drafts generated here, under the
rules of build 7371 and of the pinned build. Where the two builds differ, or where llama.cpp's
rules at either build do not explain what the host recorded, the case says so in `note`.
Family generalisations, literature results and untested expectations are listed as not
replayable, with the reason, so every row of the file is accounted for.
"""

from __future__ import annotations

import csv
import dataclasses
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import pytest
from gguf.constants import GGMLQuantizationType as Q

from specreg.auditor import Verdict, check_pair, rules_for_build
from specreg.registry.db import opened
from specreg.registry.scan import scan_paths
from specreg.samples.demo import Arch, DemoModel, demo_models, qwen_vocab, write_demo_model

from support.auditor import vocab_sizes

C, W, R, X = Verdict.COMPATIBLE, Verdict.WARNINGS, Verdict.RISKY, Verdict.INCOMPATIBLE
OLD = rules_for_build(7371)
PINNED = rules_for_build(None)


def _with_token(vocab, token_id: int, text: str):  # type: ignore[no-untyped-def]
    tokens = list(vocab.tokens)
    tokens[token_id] = text
    return dataclasses.replace(vocab, tokens=tuple(tokens))


def _q2_k(model: DemoModel, filename: str) -> DemoModel:
    """A demo model quantized to Q2_K, in one file."""
    return dataclasses.replace(
        model, weight_type=Q.Q2_K, filename=filename, name=f"{model.name} Q2_K", n_split=1
    )


def extra_models() -> list[DemoModel]:
    """Drafts the seed rows name that the demo collection does not hold."""
    demo = {m.name: m for _, m in demo_models()}
    q25, q3 = qwen_vocab("qwen2.5"), qwen_vocab("qwen3")
    ds_small = qwen_vocab("deepseek-distill")
    qwen2 = dataclasses.replace(
        q25,
        tokens=q25.tokens[:151646] + tuple(f"[PAD{i}]" for i in range(151646, 151936)),
    )
    small_q3 = Arch("qwen3", 28, 1024, 3072, 16, 8, 151936)
    small_q2 = Arch("qwen2", 24, 896, 4864, 14, 2, 151936)
    return [
        # Official Qwen3 GGUFs carry BOS = <|endoftext|> (151643); Qwen3-Coder-480B's is 11.
        DemoModel(
            "Qwen3-0.6B-Q8_0.gguf",
            "Qwen3 0.6B",
            small_q3,
            dataclasses.replace(q3, bos_id=151643),
            Q.Q8_0,
        ),
        # PARD drafts add their own tokens: simulated by one padding id made a real token.
        DemoModel(
            "PARD-Qwen3-0.6B-Q4_0.gguf",
            "PARD Qwen3 0.6B",
            small_q3,
            _with_token(q3, 151669, "<|pard_mask|>"),
            Q.Q4_0,
        ),
        DemoModel(
            "PARD-DeepSeek-R1-1.5B-Q8_0.gguf",
            "PARD DeepSeek R1 1.5B",
            Arch("qwen2", 28, 1536, 8960, 12, 2, 151936),
            _with_token(ds_small, 151649, "<|pard_mask|>"),
            Q.Q8_0,
        ),
        DemoModel("Qwen2-0.5B-Q2_K.gguf", "Qwen2 0.5B", small_q2, qwen2, Q.Q2_K),
        DemoModel(
            "Qwen2.5-Coder-1.5B-Q4_K_M.gguf",
            "Qwen2.5 Coder 1.5B",
            Arch("qwen2", 28, 1536, 8960, 12, 2, 151936),
            q25,
        ),
        _q2_k(demo["Qwen3 Next 80B A3B Instruct"], "Qwen3-Next-80B-A3B-Instruct-Q2_K.gguf"),
        _q2_k(demo["Qwen2.5 Coder 32B Instruct"], "Qwen2.5-Coder-32B-Instruct-Q2_K.gguf"),
    ]


@dataclass(frozen=True)
class Case:
    row: int
    target: str
    draft: str
    pinned: Verdict
    build_7371: Verdict
    note: str = ""

    @property
    def seed_works(self) -> bool:
        return SEED[self.row]["verdict"] == "works"


CASES = [
    Case(
        0,
        "Qwen2.5 Coder 32B Instruct",
        "Qwen2.5 Coder 0.5B Instruct",
        C,
        C,
        "152064 vs 151936: the 128 extra target ids are padding",
    ),
    Case(1, "DeepSeek R1 Distill Qwen 32B", "PARD DeepSeek R1 1.5B", X, X),
    Case(
        2,
        "DeepSeek R1 Distill Qwen 32B",
        "DeepSeek R1 Distill Qwen 1.5B",
        C,
        C,
        "DISAGREES WITH THE SEED at both builds: the gap is exactly 128 and the extra ids are "
        "padding, which llama.cpp accepts; the host's failure had another cause",
    ),
    Case(3, "DeepSeek R1 Distill Qwen 32B", "Qwen2.5 Coder 0.5B Instruct", X, X),
    Case(4, "Qwen3 Coder 480B A35B Instruct", "PARD Qwen3 0.6B", X, X),
    Case(
        5,
        "Qwen3 Coder 480B A35B Instruct",
        "Qwen3 0.6B",
        C,
        X,
        "TODAY'S RULES DISAGREE: BOS ids 11 vs 151643 were compared at build 7371; the pinned "
        "build compares them only when BOS is added, and Qwen3 never adds it",
    ),
    Case(
        6, "Qwen3 Coder 480B A35B Instruct", "Qwen3 0.6B", C, X, "TODAY'S RULES DISAGREE, as row 5"
    ),
    Case(7, "Qwen3 Coder 480B A35B Instruct", "Qwen3 Coder Instruct DRAFT 0.75B", C, C),
    Case(
        8,
        "Qwen3 Next 80B A3B Instruct",
        "PARD Qwen3 0.6B",
        X,
        X,
        "the pinned build would speculate on the hybrid target; the PARD tokens still refuse",
    ),
    Case(
        9,
        "Qwen3 Next 80B A3B Instruct",
        "Qwen3 Next 80B A3B Instruct Q2_K",
        W,
        X,
        "TODAY'S RULES DISAGREE: build 7371 could not roll back the hybrid state; the pinned "
        "server speculates with context checkpoints (a same-size draft only warns)",
    ),
    Case(
        10,
        "Qwen2.5 Coder 32B Instruct",
        "Qwen2.5 Coder 32B Instruct Q2_K",
        W,
        W,
        "works but cannot pay off: the draft is as large as the target",
    ),
    Case(11, "Qwen2.5 Coder 32B Instruct", "Qwen2.5 Coder 0.5B Instruct", C, C),
    Case(
        12,
        "Qwen2.5 7B Instruct",
        "Qwen2.5 Coder 0.5B Instruct",
        C,
        C,
        "Qwen2.5-VL-7B has the Qwen2.5 vocabulary; replayed with Qwen2.5-7B",
    ),
    Case(13, "Qwen2.5 7B Instruct", "Qwen2.5 Coder 0.5B Instruct", C, C, "as row 12 (Math-7B)"),
    Case(14, "Qwen2.5 Coder 32B Instruct", "Qwen2.5 Coder 1.5B", C, C),
    Case(15, "Qwen2.5 Coder 32B Instruct", "Qwen2.5 Coder 1.5B", C, C, "as row 14 (Q2_K)"),
    Case(16, "Qwen2.5 Coder 32B Instruct", "Qwen2 0.5B", X, X),
    Case(17, "Qwen2.5 Coder 32B Instruct", "Qwen3 0.6B", X, X),
    Case(24, "Qwen2.5 Coder 32B Instruct", "Qwen3 Coder Instruct DRAFT 0.75B", X, X),
    Case(25, "Qwen2.5 Coder 32B Instruct", "DeepSeek R1 Distill Qwen 1.5B", X, X),
    Case(28, "Qwen3 Coder 30B A3B Instruct", "Qwen2.5 Coder 0.5B Instruct", X, X),
    Case(30, "Meta Llama 3.1 8B Instruct", "Qwen2.5 Coder 0.5B Instruct", X, X),
    Case(
        33,
        "Qwen3 Next 80B A3B Instruct",
        "Qwen3 Coder Instruct DRAFT 0.75B",
        C,
        X,
        "TODAY'S RULES DISAGREE: hybrid targets speculate with checkpoints in the pinned build",
    ),
    Case(35, "Meta Llama 3.1 8B Instruct", "Llama 3.2 1B Instruct", C, C),
]

NOT_REPLAYED = {
    18: "EAGLE-1 heads are not a llama.cpp draft type at any build",
    19: "family rule",
    20: "family rule",
    21: "family rule",
    22: "family rule",
    23: "family rule",
    26: "family rule, contradicted by rows 5-6 at build 7371",
    27: "family rule (row 5 replays the measurement)",
    29: "family rule, no PARD-Llama model",
    31: "inventory claim, untested",
    32: "family rule (rows 1-3 replay the measurements)",
    34: "untested expectation",
    36: "untested expectation",
    37: "untested expectation",
    38: "untested expectation",
    39: "untested expectation",
    40: "EXTERNAL literature",
    41: "EXTERNAL literature",
    42: "EXTERNAL literature",
    43: "EXTERNAL, not llama.cpp",
}


def _seed_rows() -> list[dict[str, str]]:
    text = (resources.files("specreg.auditor") / "data" / "seed_compat_cases.csv").read_text()
    return list(csv.DictReader(text.splitlines()))


SEED = _seed_rows()


@pytest.fixture(scope="session")
def seed_db(sparse_tree: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    extra = tmp_path_factory.mktemp("seed-extra")
    for m in extra_models():
        write_demo_model(extra, m)
    db = tmp_path_factory.mktemp("seed-db") / "registry.duckdb"
    with opened(db) as con:
        result = scan_paths(con, [sparse_tree, extra])
    assert result.ok, result.errors
    return db


def test_every_seed_row_is_accounted_for() -> None:
    replayed = {c.row for c in CASES}
    assert replayed.isdisjoint(NOT_REPLAYED)
    assert replayed | set(NOT_REPLAYED) == set(range(len(SEED)))


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"row{c.row}")
def test_seed_case(seed_db: Path, case: Case) -> None:
    with opened(seed_db, read_only=True) as con:
        old = check_pair(con, case.target, case.draft, OLD)
        new = check_pair(con, case.target, case.draft, PINNED)
    assert (old.verdict, new.verdict) == (case.build_7371, case.pinned), (old.reasons, new.reasons)
    # The host's observation is the build-7371 verdict, except where the note says otherwise.
    agrees_with_seed = old.compatible == case.seed_works
    assert agrees_with_seed != ("DISAGREES WITH THE SEED" in case.note)
    builds_differ = old.verdict.rank != new.verdict.rank and (old.compatible != new.compatible)
    assert builds_differ == ("TODAY'S RULES DISAGREE" in case.note)


def test_bos_comma_case_explains_itself(seed_db: Path) -> None:
    with opened(seed_db, read_only=True) as con:
        old = check_pair(con, "Qwen3 Coder 480B A35B Instruct", "Qwen3 0.6B", OLD)
        new = check_pair(con, "Qwen3 Coder 480B A35B Instruct", "Qwen3 0.6B", PINNED)
    bos_old, bos_new = old.check("bos"), new.check("bos")
    assert not bos_old.passed and bos_new.passed
    assert bos_old.values["target_id"] == 11 and bos_old.values["target_text"]
    assert bos_old.values["draft_id"] == 151643
    assert bos_new.values["ids_compared"] is False
    # A real remedy: the registry holds a draft the old build accepts for this target.
    assert any("DRAFT 0.75B" in r for r in old.remedies)
    assert any("translates tokens" in r for r in old.remedies)
    assert not any("translates tokens" in r for r in new.remedies)


def test_deepseek_gap_of_128_is_padding(seed_db: Path) -> None:
    with opened(seed_db, read_only=True) as con:
        pv = check_pair(con, "DeepSeek R1 Distill Qwen 32B", "DeepSeek R1 Distill Qwen 1.5B")
    assert vocab_sizes(pv) == (152064, 151936, 128)
    extra = pv.check("extra_tokens").values
    assert extra["only_padding"] and extra["count"] == 128
