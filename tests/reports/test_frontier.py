"""The report's speed-against-quality-cost frontier per target, on the demo registry with
quality measurements and plain runs recorded as `specreg quality` and `specreg run` would."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import pytest

from specreg.registry.db import opened
from specreg.registry.quality_store import PURPOSE_QUALITY, QualityRecord, record_quality
from specreg.registry.run_store import RunRecord, record_run
from specreg.reports import build_site
from specreg.reports.data import FrontierPoint
from specreg.reports.frontier import pareto
from specreg.reports.gather import page_name
from specreg.reports.plots import PlotCache
from specreg.reports.site import gather_site

from support.recommender import demo_model

NOW = datetime.now(timezone.utc)


def quality(con, target_id, model_id, kld, experts=None, task="code"):  # type: ignore[no-untyped-def]
    record_quality(
        con,
        QualityRecord(
            purpose=PURPOSE_QUALITY, status="ok", started_at=NOW, config={},
            base_model_id=target_id, model_id=model_id, experts=experts, task=task,
            n_tokens=252, mean_kld=kld, same_top=1 - kld,
        ),
    )  # fmt: skip


def plain_run(con, target_id, tps, experts=None):  # type: ignore[no-untyped-def]
    record_run(
        con,
        RunRecord(
            kind="run", status="ok", started_at=NOW, config={}, config_label="plain",
            spec_type="none", target_model_id=target_id, experts=experts, tokens_per_s=tps,
            host_fingerprint="h",
        ),
    )  # fmt: skip


def point(label: str, kld: float, tps: float | None) -> FrontierPoint:
    return FrontierPoint(label, kld, True, tps, True)


def test_the_frontier_is_what_no_other_point_beats_on_both_axes() -> None:
    got = {
        p.label: p.on_frontier
        for p in pareto(
            [
                point("ref", 0.0, 10.0),
                point("fast", 0.2, 14.0),
                point("worse", 0.3, 12.0),
                point("faster", 0.5, 16.0),
                point("unknown speed", 0.1, None),
            ]  # fmt: skip
        )
    }
    assert got == {"ref": True, "fast": True, "worse": False, "faster": True,
                   "unknown speed": False}  # fmt: skip


def test_the_target_page_shows_measured_and_predicted_points(
    scanned_db: Path, tmp_path: Path
) -> None:
    with opened(scanned_db) as con:
        moe = demo_model(con, "Qwen3-Coder", "30B-A3B")
        dense = demo_model(con, "Qwen2.5-Coder", "32B")
        quality(con, moe.model_id, moe.model_id, 0.08, experts=4)
        quality(con, moe.model_id, moe.model_id, 0.06, experts=4, task="prose")
        plain_run(con, moe.model_id, 20.0)
        plain_run(con, moe.model_id, 26.0, experts=4)
        site = gather_site(con, PlotCache(None))
        build_site(con, tmp_path / "site", cache=None)
    tv = next(t for t in site.targets if t.model.model_id == moe.model_id)
    by = {p.label.split(" (")[0]: p for p in tv.frontier}
    ref, four, six = by[Path(moe.path).name], by["4 of 8 experts"], by["6 of 8 experts"]
    assert (ref.mean_kld, ref.tokens_per_s, ref.measured) == (0.0, 20.0, True)
    assert four.measured and four.mean_kld == pytest.approx(0.07) and four.tokens_per_s == 26.0
    # 6 of 8: cost predicted from this model's 4-of-8 measurements, speed from the baseline.
    assert not six.kld_measured and not six.speed_measured
    assert 20.0 < (six.tokens_per_s or 0) < 26.0
    assert ref.on_frontier and four.on_frontier
    assert tv.frontier_svg.startswith("<svg") and "quality cost" in tv.frontier_svg
    # A dense model with nothing measured against it has no frontier.
    assert next(t for t in site.targets if t.model.model_id == dense.model_id).frontier == ()
    page = (tmp_path / "site" / page_name(moe.model_id)).read_text()
    assert "Speed against quality cost" in page and "4 of 8 experts" in page
    assert "predicted" in page and "measured" in page
