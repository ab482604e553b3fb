"""Runs that cannot be trusted stay visible and teach nothing: a registry written before the
measurement protocol v2 is migrated (migration 5), its replaying runs of stateful methods are
flagged with the reason, and recommend, train and propose leave them out. Runs killed before
they finished are seen as interrupted."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import duckdb
import pytest
from click.testing import CliRunner

from specreg.cli.main import cli
from specreg.host.machine import detect_host
from specreg.registry.db import connect, opened
from specreg.registry.run_store import (
    INTERRUPTED_ERROR,
    RunRecord,
    finish_run,
    get_run,
    list_runs,
    mark_interrupted,
    record_run,
    start_run,
)

from support import declare as dfx
from support.declare import Site
from support.fake_server import kill_fakes, make_fake, stalled
from support.recommender import demo_model

MIGRATION_5_RUNS = (
    "regime", "protocol", "repeat_figures", "phase_figures", "trusted", "trust_reason", "owner",
)  # fmt: skip
MIGRATION_5_PROMPTS = (
    "samples_draft_n", "samples_draft_n_accepted", "samples_session", "samples_position",
)  # fmt: skip
OLD_COLUMNS = (
    "kind", "status", "started_at", "config", "config_label", "spec_type", "target_model_id",
    "draft_model_id", "k", "temperature", "task", "prompt_set", "n_predict", "repeats",
    "threads", "host_fingerprint", "tokens_per_s", "draft_n", "draft_n_accepted", "acceptance",
)  # fmt: skip
REPLAY_REASON = (
    "replay-affected: ngram-mod keeps state across requests and its repeats were measured on "
    "one llama-server, so from the second repeat on the server had seen the prompt and its answer"
)


def as_before_migration_5(db: Path) -> None:
    """Make `db` a registry as specreg wrote it before the protocol v2 (no migration 5)."""
    con = duckdb.connect(str(db))
    for column in MIGRATION_5_RUNS:
        con.execute(f"ALTER TABLE runs DROP COLUMN {column}")
    for column in MIGRATION_5_PROMPTS:
        con.execute(f"ALTER TABLE run_prompts DROP COLUMN {column}")
    con.execute("DELETE FROM migrations WHERE number = 5")
    con.close()


def old_run(db: Path, **values: object) -> int:
    """A run row written by the runner before migration 5 (the old columns only)."""
    row: dict[str, object] = {
        "kind": "run", "status": "ok", "started_at": datetime(2026, 11, 1, tzinfo=timezone.utc),
        "config": "{}", "temperature": 0.0, "task": "code", "prompt_set": "tasks:code",
        "n_predict": 64, "repeats": 3, "threads": 2, "host_fingerprint": detect_host().fingerprint,
        "draft_model_id": None, "k": None, "draft_n": 0, "draft_n_accepted": 0,
        "acceptance": None,
    }  # fmt: skip
    row.update(values)
    row.setdefault("config_label", str(row["spec_type"]))
    con = duckdb.connect(str(db))
    marks = ", ".join("?" for _ in OLD_COLUMNS)
    got = con.execute(
        f"INSERT INTO runs ({', '.join(OLD_COLUMNS)}) VALUES ({marks}) RETURNING run_id",
        [row[c] for c in OLD_COLUMNS],
    ).fetchone()
    con.close()
    assert got is not None
    return int(got[0])


@pytest.fixture
def old_registry(scanned_db: Path, tmp_path: Path):  # type: ignore[no-untyped-def]
    """The demo registry as of before the change, holding the runs the old runner recorded."""
    db = tmp_path / "old.duckdb"
    shutil.copy(scanned_db, db)
    with opened(db) as con:
        target = demo_model(con, "Qwen2.5-Coder", "32B").model_id
        draft = demo_model(con, "Qwen2.5-Coder", "0.5B").model_id
    as_before_migration_5(db)
    ids = {
        "plain": old_run(db, spec_type="none", target_model_id=target, tokens_per_s=10.0),
        "replayed": old_run(
            db, spec_type="ngram-mod", target_model_id=target, tokens_per_s=15.7, k=64,
            config=json.dumps({"engine": "server"}), draft_n=318, draft_n_accepted=318,
            acceptance=1.0,
        ),
        "warmed": old_run(
            db, spec_type="ngram-cache", target_model_id=target, tokens_per_s=11.0, repeats=1,
            draft_n=10, draft_n_accepted=3, acceptance=0.3,
        ),
        "lookup": old_run(
            db, spec_type="ngram-mod", target_model_id=target, tokens_per_s=10.5, k=16,
            config=json.dumps({"engine": "llama-lookup"}), draft_n=50, draft_n_accepted=10,
            acceptance=0.2,
        ),
        "draft": old_run(
            db, spec_type="draft-simple", target_model_id=target, draft_model_id=draft, k=8,
            tokens_per_s=12.0, draft_n=200, draft_n_accepted=120, acceptance=0.6,
        ),
        "served": old_run(
            db, kind="serve", spec_type="ngram-mod", target_model_id=target, repeats=1,
            config=json.dumps({"engine": "server", "regime": "warm"}), tokens_per_s=14.0,
            draft_n=64, draft_n_accepted=64, acceptance=1.0,
        ),
    }  # fmt: skip
    return db, target, ids


def test_migration_flags_replaying_runs_with_the_reason_and_deletes_nothing(old_registry) -> None:  # type: ignore[no-untyped-def]
    db, _, ids = old_registry
    con = connect(db)  # a writable open migrates
    try:
        runs = {r.run_id: r for r in list_runs(con)}
    finally:
        con.close()
    assert set(runs) == set(ids.values())
    replayed, warmed = runs[ids["replayed"]], runs[ids["warmed"]]
    assert (replayed.trusted, replayed.regime, replayed.trust_reason) == (
        False, "replay", REPLAY_REASON,
    )  # fmt: skip
    assert not warmed.trusted and warmed.trust_reason == (
        "replay-affected: ngram-cache keeps state across requests and it was measured on a "
        "llama-server that had answered a warm-up request of the workload's first prompt (and a "
        "contention retry would replay its prompt)"
    )
    assert replayed.protocol and replayed.protocol["version"] == 1
    # one process per prompt (llama-lookup), stateless methods and plain runs stay trusted
    for name in ("plain", "lookup", "draft"):
        r = runs[ids[name]]
        assert (r.trusted, r.regime, r.trust_reason) == (True, "first-encounter", None)
    served = runs[ids["served"]]
    assert (served.trusted, served.regime) == (True, "warm")
    # a warm server's ngram-mod figure is true of serving, but no evidence of first use
    assert not served.first_use_evidence and runs[ids["draft"]].first_use_evidence


def test_runs_shows_untrusted_runs_with_the_reason(old_registry) -> None:  # type: ignore[no-untyped-def]
    db, _, ids = old_registry
    connect(db).close()
    out = CliRunner().invoke(cli, ["runs", "--db", str(db)], terminal_width=200)
    assert out.exit_code == 0, out.output
    assert f"run {ids['replayed']} not trusted: {REPLAY_REASON}" in " ".join(out.output.split())
    listed = CliRunner().invoke(cli, ["runs", "--db", str(db), "--json"])
    doc = {r["run_id"]: r for r in json.loads(listed.output)["runs"]}
    assert doc[ids["replayed"]]["trusted"] is False
    assert doc[ids["replayed"]]["trust_reason"] == REPLAY_REASON
    one = CliRunner().invoke(cli, ["runs", str(ids["replayed"]), "--db", str(db)])
    assert "NOT TRUSTED (no evidence for recommend, train, propose): replay-affected" in one.output


def test_recommend_and_train_leave_untrusted_runs_out(old_registry, prior_model) -> None:  # type: ignore[no-untyped-def]
    from specreg.host.facts import REFERENCE_HOST
    from specreg.recommender.local import local_observations
    from specreg.recommender.prior import load_prior
    from specreg.recommender.recommend import recommend

    db, target, ids = old_registry
    host = dataclasses.replace(REFERENCE_HOST, fingerprint=detect_host().fingerprint)
    with opened(db) as con:
        local = local_observations(con, host)
        rec = recommend(
            con, target, model=prior_model, host=host, task="code",
            observations=[*load_prior().observations, *local],
        )  # fmt: skip
    used = {o.row_id for o in local}
    assert used == {f"run:{ids[n]}" for n in ("plain", "lookup", "draft")}
    cited = {e.row_id for o in rec.options for e in o.evidence if e.source == "local"}
    assert f"run:{ids['lookup']}" in cited  # local ngram evidence is cited ...
    assert not cited & {f"run:{ids[n]}" for n in ("replayed", "warmed", "served")}  # ... not these

    trained = CliRunner().invoke(cli, ["train", "--no-cv", "--json", "--db", str(db)])
    assert trained.exit_code == 0, trained.output
    assert json.loads(trained.output)["summary"]["n_local"] == 3


@pytest.mark.parametrize("trusted", [True, False])
def test_propose_leaves_untrusted_runs_out(site: Site, trusted: bool) -> None:
    from specreg.declare.propose import make_proposal

    from support.declare import pair_ids  # the site's 32B target and 0.5B draft

    target, draft = pair_ids(site)
    for tps in (11.0, 11.2):  # the pinned draft-simple k=16, measured
        dfx.record_run(site.db, target=target, draft=draft, k=16, tps=tps, acceptance=0.6)
    with opened(site.db) as con:
        for tps in (30.0, 31.0, 29.0):  # ngram-mod "beats" it by replaying its answers
            record_run(
                con,
                RunRecord(
                    kind="run", status="ok", started_at=datetime(2026, 11, 20, tzinfo=timezone.utc),
                    config={}, config_label="ngram-mod", spec_type="ngram-mod",
                    target_model_id=target, temperature=0.0, host_fingerprint="host-a",
                    threads=96, task="code", prompt_set="code", n_predict=256, repeats=3,
                    tokens_per_s=tps, acceptance=1.0, behaviour_changing=False,
                    trusted=trusted, trust_reason=None if trusted else REPLAY_REASON,
                ),
            )  # fmt: skip
        changes = make_proposal(con, site.spec).changes
    assert [c.now.get("spec_type") for c in changes] == ([["ngram-mod"]] if trusted else [])


def test_a_killed_run_is_recorded_and_seen_as_interrupted(
    tmp_path: Path, gguf_factory, specreg_home: Path
) -> None:  # type: ignore[no-untyped-def]
    bin_dir, pids = make_fake(tmp_path, "stall")
    started = stalled(pids)
    target = gguf_factory("t.gguf", tokens=["<s>", "</s>", "a"], bos=0, eos=1)
    db = tmp_path / "registry.duckdb"
    argv = [sys.executable, "-m", "specreg", "run", str(target), "--llama-bin", str(bin_dir),
            "--db", str(db), "--max-prompts", "1", "--repeat", "1", "--retries", "0"]  # fmt: skip
    proc = subprocess.Popen(argv, env={**os.environ, "SPECREG_HOME": str(specreg_home)})
    try:
        for _ in range(600):
            if started.exists() or proc.poll() is not None:
                break
            subprocess.run(["sleep", "0.1"])
        assert started.exists(), "the run never reached llama-server"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        kill_fakes(pids)  # llama-server dies with specreg; the fake's own child does not
    # read-only: already shown as interrupted; a writable open records it so
    listed = CliRunner().invoke(cli, ["runs", "--failed", "--json", "--db", str(db)])
    (run,) = json.loads(listed.output)["runs"]
    assert (run["status"], run["error_kind"], run["error"]) == (
        "interrupted", "interrupted", INTERRUPTED_ERROR,
    )  # fmt: skip
    with opened(db) as con:
        assert mark_interrupted(con) == 1  # what the next `specreg run` does first
        assert get_run(con, run["run_id"]).status == "interrupted"
        assert mark_interrupted(con) == 0


def test_start_and_finish_replace_the_running_record(specreg_home: Path) -> None:
    now = datetime.now(timezone.utc)
    rec = RunRecord(kind="run", status="ok", started_at=now, config={}, config_label="plain",
                    spec_type="none", tokens_per_s=5.0)  # fmt: skip
    with opened(specreg_home / "r.duckdb") as con:
        run_id = start_run(con, rec)
        assert get_run(con, run_id).status == "running"  # this process's own run
        finish_run(con, run_id, rec)
        done = get_run(con, run_id)
        assert (done.status, done.tokens_per_s, done.owner) == ("ok", 5.0, None)


def test_a_run_whose_later_repeats_accept_far_more_is_recorded_untrusted() -> None:
    from specreg.llama.config import Config
    from specreg.runner.measurement import PromptResult
    from specreg.runner.records import to_record

    from support.measurements import PROMPT, completion, measurement

    tokens = tuple(range(64))
    replayed = (completion(tokens, 100.0, 0, 0), completion(tokens, 150.0, 53, 53))
    m = measurement(Config(spec_type="ngram-simple"), [PromptResult(PROMPT, replayed)])
    record = to_record(m, "run", "t", None, task="code")
    assert not record.trusted and not record.first_use_evidence
    assert record.trust_reason == (
        "replay-suspect: later repeats accepted far more than the first for the same prompt "
        "(code-1: repeat 2 accepted 53 tokens, repeat 1 0)"
    )
    assert [f["draft_n_accepted"] for f in record.repeat_figures] == [0, 53]
    assert record.prompts[0].samples_draft_n_accepted == (0, 53)
    steady = (completion(tokens, 100.0, 8, 4), completion(tokens, 101.0, 8, 4))
    ok = to_record(measurement(Config(), [PromptResult(PROMPT, steady)]), "run", "t", None)
    assert ok.trusted and ok.trust_reason is None
