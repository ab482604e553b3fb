"""`specreg quality` with the pinned llama.cpp's llama-perplexity on real small models:
SmolLM2-135M Q4_0 against its Q4_1, the model against itself, and the synthetic MoE with
fewer experts than its default. One text, two chunks, one thread: behaviour, not speed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from specreg.cli.main import cli
from specreg.host.machine import detect_host
from specreg.quality.kld import Measuring, measure_quality, plan_quality, quality_texts
from specreg.registry.quality_store import PURPOSE_QUALITY, list_quality
from specreg.samples.small_models import SmallModels
from specreg.samples.synthetic import SyntheticModels

from support.quality import CHUNKS
from support.schemas import validate

pytestmark = pytest.mark.llama


def test_q4_0_against_q4_1_costs_and_the_model_against_itself_does_not(
    con, measuring: Measuring, small_models: SmallModels
) -> None:
    q4_1 = small_models.smollm2.path
    q4_0 = small_models.draft("smollm2", "Q4_0").path
    texts = quality_texts(("prose",))
    lossy = measure_quality(con, measuring, plan_quality(con, q4_0, reference=q4_1), texts)
    s = lossy.points[0].stats
    assert s is not None and s.complete, lossy.points[0].error
    assert s.mean_kld > 0 and s.mean_kld > 3 * s.mean_kld_unc
    assert s.same_top < 1.0 and s.ppl > s.ppl_base  # type: ignore[operator]
    assert s.kld_p99 is not None and s.kld_p99 > s.mean_kld
    assert lossy.points[0].n_tokens == CHUNKS * 63 and not lossy.points[0].reference_cached

    itself = measure_quality(con, measuring, plan_quality(con, q4_1, reference=q4_1), texts)
    s0 = itself.points[0].stats
    assert s0 is not None and itself.points[0].reference_cached  # the same saved logits
    assert abs(s0.mean_kld) <= max(2 * s0.mean_kld_unc, 1e-4)
    assert s0.same_top == 1.0

    rows = list_quality(con, purpose=PURPOSE_QUALITY)
    assert [r.model_path for r in rows] == [str(q4_1), str(q4_0)]  # newest first
    row = rows[1]
    assert row.ok and row.base_path == str(q4_1) and row.task == "prose"
    assert row.mean_kld == pytest.approx(s.mean_kld) and row.same_top == pytest.approx(s.same_top)
    assert row.text_sha256 == texts[0].sha256 and row.text_source == "shipped"
    assert row.llama_build_id == lossy.build and row.host_fingerprint == detect_host().fingerprint
    assert row.n_tokens == CHUNKS * 63 and "--kl-divergence" in row.argv


def test_fewer_experts_cost_more_than_the_default_count(
    con, measuring: Measuring, synthetic_models: SyntheticModels
) -> None:
    moe = synthetic_models.moe.path
    default = synthetic_models.spec.n_expert_used
    texts = quality_texts(("code",))
    got = {
        n: measure_quality(con, measuring, plan_quality(con, moe, experts=n), texts).points[0]
        for n in (1, default)
    }
    fewer, full = got[1].stats, got[default].stats
    assert fewer is not None and full is not None
    assert fewer.mean_kld > full.mean_kld + 3 * (fewer.mean_kld_unc + full.mean_kld_unc)
    assert abs(full.mean_kld) <= max(2 * full.mean_kld_unc, 1e-4)
    rows = list_quality(con, purpose=PURPOSE_QUALITY)
    assert sorted(r.experts for r in rows) == [1, default]
    assert {r.expert_key for r in rows} == {"qwen3moe.expert_used_count"}


def test_the_command_prints_and_records(
    small_models: SmallModels, tmp_path: Path, specreg_home: Path
) -> None:
    q4_1 = str(small_models.smollm2.path)
    q8_0 = str(small_models.draft("smollm2", "Q8_0").path)
    args = ["quality", q8_0, "--against", q4_1, "--task", "json", "--chunks", "2", "--threads",
            "1", "--json"]  # fmt: skip
    r = CliRunner().invoke(cli, args, catch_exceptions=False)
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert (doc["version"], doc["kind"]) == ("1", "quality")
    validate(doc)  # tests/schemas pins every field
    (point,) = doc["points"]
    assert point["task"] == "json" and point["ok"] and 0 < point["mean_kld"] < 0.1
    assert point["same_top"] > 0.8 and point["n_tokens"] == 126
    shown = CliRunner().invoke(cli, [*args[:-1]], catch_exceptions=False)
    assert shown.exit_code == 0
    assert "against SmolLM2-135M-Instruct.Q4_1.gguf" in shown.stdout
    assert " json " in shown.stdout and " 126 " in shown.stdout
