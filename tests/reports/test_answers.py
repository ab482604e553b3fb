"""The default report answers "what should I run?" (issue 25, point 16): each target's page
starts with the recommendation, its drafts come in the order `specreg drafts` ranks them, and
the time the report says it took includes the recommender's set-up."""

from __future__ import annotations

import html
import json
import re
import time
from pathlib import Path

from support.cli import specreg, specreg_json

TARGET = "Qwen2.5 Coder 32B Instruct"


def _text(page: str) -> str:
    return html.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", page)))


def test_the_default_report_says_what_to_run_in_the_order_of_drafts(
    sparse_tree: Path, tmp_path: Path
) -> None:
    db = str(tmp_path / "registry.duckdb")
    assert specreg("scan", str(sparse_tree), "--db", db).returncode == 0
    target = next(
        m for m in specreg_json("models", "--db", db, "--json")["models"] if m["name"] == TARGET
    )
    ranked = specreg_json("drafts", target["model_id"], "--db", db, "--json")["drafts"]
    names = [d["draft"]["name"] for d in ranked]
    assert names[:2] == ["Qwen2.5 Coder 0.5B Instruct", "Qwen2.5 7B Instruct"]

    r = specreg("report", "--db", db, "-o", str(tmp_path / "site"))
    assert r.returncode == 0, r.stderr
    page = _text((tmp_path / "site" / f"target-{target['model_id']}.html").read_text())
    run_at, drafts_at = page.index("What to run"), page.index("Compatible drafts")
    assert run_at < drafts_at  # the answer comes first
    answer = page[run_at:drafts_at]
    assert "chat draft-simple Qwen2.5 Coder 0.5B Instruct K=" in answer
    assert "llama-server" in answer and "--spec-draft-model" in answer
    shown = page[drafts_at:]
    assert [shown.index(n) for n in names] == sorted(shown.index(n) for n in names)

    skipped = specreg("report", "--db", db, "-o", str(tmp_path / "bare"), "--no-recommend")
    assert skipped.returncode == 0, skipped.stderr
    bare = _text((tmp_path / "bare" / f"target-{target['model_id']}.html").read_text())
    assert "left out of this report (--no-recommend)" in bare


def test_the_time_reported_counts_from_the_callers_start(sparse_tree: Path, tmp_path: Path) -> None:
    from specreg.registry.db import opened
    from specreg.registry.scan import scan_paths
    from specreg.reports import build_site

    with opened(tmp_path / "registry.duckdb") as con:
        scan_paths(con, [sparse_tree])
        result = build_site(con, tmp_path / "site", started=time.perf_counter() - 60.0)
    assert result.seconds >= 60.0
    assert json.loads(json.dumps(result.to_json()))["seconds"] >= 60.0
