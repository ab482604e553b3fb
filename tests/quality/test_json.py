"""`specreg quality --json` and `specreg agree --json` are pinned by JSON schemas
(tests/schemas/quality.json, agreement.json): built here from result objects, so no llama.cpp
is needed; the real tests check the same documents from real runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from specreg.llama.perplexity import KldStats
from specreg.quality.agreement import AgreementPoint, AgreementResult, GeneratedText
from specreg.quality.kld import QualityPoint, QualityResult, TextSource

from support.schemas import validate

TEXT = TextSource("code", "code", Path("/t/code.txt"), "ab" * 32, "shipped")
STATS = KldStats(
    mean_kld=0.25, mean_kld_unc=0.01, same_top=0.7, same_top_unc=0.03, ppl=40.0, ppl_unc=7.0,
    ln_ppl_ratio=0.19, ln_ppl_ratio_unc=0.04, rms_dp=0.09, rms_dp_unc=0.007, ppl_base=33.0,
    ppl_base_unc=6.5, percentiles={"p99": 0.63, "median": 0.23},
)  # fmt: skip


def quality_doc() -> dict[str, Any]:
    return QualityResult(
        target="/m/q4_0.gguf", target_id="t", reference="/m/q4_1.gguf", reference_id="r",
        experts=None, default_experts=None, expert_count=None, build="b", llama_version="v",
        points=(
            QualityPoint(TEXT, 1, STATS, 252, 128, False, 3.5),
            QualityPoint(TEXT, 2, None, None, 128, True, 0.4, error="llama-perplexity ..."),
        ),
    ).to_json()  # fmt: skip


def agreement_doc() -> dict[str, Any]:
    common: dict[str, Any] = dict(
        draft_id="d", draft_name="d.gguf", draft_path="/m/d.gguf", task="code", n_tokens=252,
        same_top=0.9, same_top_unc=0.02, mean_kld=0.01, mean_kld_unc=0.001,
        n_vocab_target=49152, seconds=1.5,
    )  # fmt: skip
    return AgreementResult(
        target="/m/t.gguf", target_id="t", temperature=0.7, build="b",
        texts=(GeneratedText(TEXT, 575, True),),
        points=(
            AgreementPoint(measurement_id=1, method="kl-divergence", accept=0.9,
                           n_vocab_draft=49152, **common),
            AgreementPoint(measurement_id=2, method="saved-logits", accept=0.6,
                           n_vocab_draft=49216, confidence={0.0: (1.0, 0.9), 0.9: (0.5, 0.98)},
                           **common),
        ),
    ).to_json()  # fmt: skip


def test_quality_and_agreement_documents_match_their_schemas() -> None:
    validate(quality_doc())
    validate(agreement_doc())
    doc = agreement_doc()
    assert doc["points"][1]["confidence"] == {"0": [1.0, 0.9], "0.9": [0.5, 0.98]}
    assert doc["acceptance"] == "target's probability of the draft's top token at temperature 0.7"
