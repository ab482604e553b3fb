"""What `specreg runs` says of a run, in plain words (issue 25): an interrupted run reads
`interrupted`, not `interrupted (interrupted)`, and a run that left K to llama.cpp says which
K that was."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

from specreg.llama.config import Config
from specreg.registry.db import opened
from specreg.registry.run_store import RunRecord, record_run

from support.cli import specreg

NOW = datetime(2026, 11, 24, 12, 0, tzinfo=timezone.utc)


def _record(db: Path, run: RunRecord) -> int:
    with opened(db) as con:
        return record_run(con, run)


def test_interrupted_reads_once_and_other_failures_keep_their_kind(tmp_path: Path) -> None:
    db = tmp_path / "registry.duckdb"
    _record(db, RunRecord("run", "interrupted", NOW, {}, "plain", "none",
                          error_kind="interrupted", error="Ctrl-C"))  # fmt: skip
    _record(db, RunRecord("run", "failed", NOW, {}, "plain", "none",
                          error_kind="spec-init", error="no draft"))  # fmt: skip
    r = specreg("runs", "--db", str(db))
    assert r.returncode == 0, r.stderr
    assert "interrupted (interrupted)" not in r.stdout
    assert "interrupted" in r.stdout and "failed (spec-init)" in r.stdout


def test_a_run_without_k_says_the_k_llama_cpp_used(tmp_path: Path) -> None:
    db = tmp_path / "registry.duckdb"
    config = Config(spec_type="draft-simple")
    given = Config(spec_type="draft-simple", k=8)
    ngram = Config(spec_type="ngram-mod")
    ids = [
        _record(
            db,
            RunRecord(
                "run", "ok", NOW, c.to_json(), c.label, c.spec_type, tokens_per_s=10.0, k=c.k
            ),
        )  # fmt: skip
        for c in (config, given, ngram)
    ]
    shown = [specreg("runs", str(i), "--db", str(db)).stdout for i in ids]
    assert "  K: 3 (llama.cpp's default for draft-simple; --k sets it)" in shown[0]
    assert "  K:" not in shown[1]
    assert "  K: 64 (llama.cpp's default for ngram-mod; --k sets it)" in shown[2]
