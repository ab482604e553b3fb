"""Advice that does not contradict itself (issue 25, points 1-4), on the demo collection:
evidence that disagrees with a prediction moves it and is named, a model as large as its target
is no draft, a draft head is no target, and a configuration that cannot fit in memory says so."""

from __future__ import annotations

from pathlib import Path

import duckdb
from cli_run import specreg

from specreg.registry.queries import list_models


def _draft_head(con: duckdb.DuckDBPyConnection) -> str:
    heads = [m for m in list_models(con) if m.draft_kind == "eagle3"]
    assert heads, "the demo tree has an EAGLE-3 head"
    return heads[0].display_name


def test_recommend_refuses_a_draft_head_as_the_auditor_does(scanned_db: Path) -> None:
    from specreg.registry.db import opened

    with opened(scanned_db, read_only=True) as con:
        head = _draft_head(con)
    audit = specreg("compat", head, "Llama 3.2 1B Instruct", "--db", str(scanned_db), "--json")
    assert audit.returncode == 1 and '"target_is_language_model"' in audit.stdout
    r = specreg("recommend", head, "--bandwidth", "20", "--db", str(scanned_db))
    assert r.returncode == 2, r.stdout
    assert r.stdout == ""
    assert r.stderr.strip() == (
        f"error: {head} is not a target: the target is a eagle3 draft head, not a model to "
        "serve (target_is_language_model); recommend for the model it drafts for"
    )
