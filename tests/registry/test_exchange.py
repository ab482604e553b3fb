"""`specreg runs export|import`: registries of hosts that ran without Ray merged through one
parquet file, each run recorded once (by run_uuid), with its prompts, its baseline and the
host fingerprint it was measured with."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

import duckdb
import pytest
from click.testing import CliRunner

from specreg.cli.main import cli
from specreg.registry.db import opened
from specreg.registry.exchange import export_runs, import_runs
from specreg.registry.run_store import (
    PromptRecord,
    RunRecord,
    get_run,
    list_runs,
    record_run,
    start_run,
)

from support.cli import specreg

HOST_A = "aaaaaaaaaaaaaaaa"
HOST_B = "bbbbbbbbbbbbbbbb"


def _run(host: str, spec_type: str, tps: float, **kw: object) -> RunRecord:
    prompt = PromptRecord(
        prompt_id="code-1", prompt_sha256="ab", n_samples=2, tokens_per_s=tps,
        samples_tps=(tps - 1, tps + 1), draft_n=8, draft_n_accepted=5,
        samples_draft_n=(4, 4), samples_draft_n_accepted=(2, 3), divergence={"position": 3},
    )  # fmt: skip
    fields = {
        "kind": "run", "status": "ok", "started_at": datetime.now(timezone.utc),
        "config": {"engine": "server", "spec_type": spec_type}, "config_label": spec_type,
        "spec_type": spec_type, "k": 4 if spec_type != "none" else None,
        "argv": ("llama-server", "-m", "/m/t.gguf"), "host_fingerprint": host,
        "host": {"fingerprint": host, "physical_cores": 2}, "tokens_per_s": tps,
        "repeat_figures": ({"n_samples": 1, "tokens_per_s": tps},), "task": "code",
        "protocol": {"name": "first-encounter/one-server/v2"}, "prompts": (prompt,),
        **kw,
    }  # fmt: skip
    return RunRecord(**fields)  # type: ignore[arg-type]


def _registry(path: Path, host: str, plain: float, spec: float) -> list[int]:
    """A registry holding a plain baseline and a verified run of it on `host`."""
    with opened(path) as con:
        base = record_run(con, _run(host, "none", plain, kind="baseline"))
        spec_id = record_run(
            con, _run(host, "ngram-mod", spec, kind="verify", baseline_run_id=base, speedup=1.5)
        )
        failed = record_run(
            con, _run(host, "draft-simple", 0.0, status="failed", error="crash", prompts=())
        )
    return [base, spec_id, failed]


def _comparable(r: RunRecord) -> dict[str, object]:
    """What a run is, wherever it is recorded: everything but the local ids."""
    data = {k: v for k, v in r.__dict__.items() if k not in ("run_id", "baseline_run_id")}
    data["host"] = {k: v for k, v in (r.host or {}).items() if not k.startswith("bandwidth")}
    return data


def test_export_then_import_gives_the_same_runs_once(tmp_path: Path) -> None:
    a, b = tmp_path / "a.duckdb", tmp_path / "b.duckdb"
    _registry(a, HOST_A, 50.0, 75.0)
    _registry(b, HOST_B, 20.0, 10.0)
    out = tmp_path / "a.parquet"
    with opened(a, read_only=True) as con:
        exported = export_runs(con, out, host_fingerprint=HOST_A, host_facts={"bandwidth_gbs": 9.5})
        source = {r.run_uuid: r for r in list_runs(con, with_prompts=True)}
    assert (exported.n_runs, exported.n_prompts, exported.hosts) == (3, 2, ((HOST_A, 3),))

    with opened(b) as con:
        first = import_runs(con, out)
        second = import_runs(con, out)
        merged = list_runs(con, with_prompts=True)
    assert (first.n_in_file, first.n_new, first.n_known, first.n_prompts) == (3, 3, 0, 2)
    assert first.hosts == ((HOST_A, 3),)
    assert (second.n_new, second.n_known, second.run_ids) == (0, 3, ())
    assert len(merged) == 6 and len({r.run_uuid for r in merged}) == 6

    imported = {r.run_uuid: r for r in merged if r.run_id in first.run_ids}
    assert imported.keys() == source.keys()
    for uuid, got in imported.items():
        assert _comparable(got) == _comparable(source[uuid])
        # the exporting host's measured bandwidth travels with its own runs
        assert (got.host or {})["bandwidth_gbs"] == 9.5
    # the baseline link follows the baseline's uuid to its new local id
    verify = next(r for r in imported.values() if r.kind == "verify")
    baseline = next(r for r in imported.values() if r.kind == "baseline")
    assert verify.baseline_run_id == baseline.run_id
    assert baseline.run_id not in _registry_ids_of(b, HOST_B)
    # the runs measured on b are untouched
    assert {r.host_fingerprint for r in merged if r.run_id not in first.run_ids} == {HOST_B}


def _registry_ids_of(path: Path, host: str) -> set[int]:
    with opened(path, read_only=True) as con:
        return {r.run_id or 0 for r in list_runs(con) if r.host_fingerprint == host}


def test_files_from_two_hosts_merge_and_overlaps_count_once(tmp_path: Path) -> None:
    a, b, c = tmp_path / "a.duckdb", tmp_path / "b.duckdb", tmp_path / "c.duckdb"
    _registry(a, HOST_A, 50.0, 75.0)
    _registry(b, HOST_B, 20.0, 10.0)
    with opened(a, read_only=True) as con:
        export_runs(con, tmp_path / "a.parquet")
    with opened(b) as con:
        import_runs(con, tmp_path / "a.parquet")  # b now holds a's runs too
        export_runs(con, tmp_path / "b.parquet")
    with opened(c) as con:
        got_a = import_runs(con, tmp_path / "a.parquet")
        got_b = import_runs(con, tmp_path / "b.parquet")
        hosts = sorted(r.host_fingerprint or "" for r in list_runs(con))
    assert (got_a.n_new, got_b.n_new, got_b.n_known) == (3, 3, 3)
    assert hosts == [HOST_A] * 3 + [HOST_B] * 3


def test_a_run_still_running_is_not_exported(tmp_path: Path) -> None:
    db = tmp_path / "a.duckdb"
    with opened(db) as con:
        record_run(con, _run(HOST_A, "none", 50.0))
        start_run(con, replace(_run(HOST_A, "ngram-mod", 0.0), prompts=()))
        result = export_runs(con, tmp_path / "a.parquet")
    assert (result.n_runs, result.n_running) == (1, 1)


def test_cli_export_import_and_the_runs_group(tmp_path: Path) -> None:
    a, b = tmp_path / "a.duckdb", tmp_path / "b.duckdb"
    ids = _registry(a, HOST_A, 50.0, 75.0)
    _registry(b, HOST_B, 20.0, 10.0)
    out = tmp_path / "runs.parquet"
    runner = CliRunner()
    exported = runner.invoke(cli, ["runs", "export", str(out), "--db", str(a), "--json"])
    assert exported.exit_code == 0, exported.output
    doc = json.loads(exported.output)
    assert (doc["version"], doc["kind"], doc["n_runs"]) == ("1", "runs-export", 3)

    for expected_new in (3, 0):
        imported = runner.invoke(cli, ["runs", "import", str(out), "--db", str(b), "--json"])
        assert imported.exit_code == 0, imported.output
        doc = json.loads(imported.output)
        assert (doc["kind"], doc["n_new"]) == ("runs-import", expected_new)
    text = runner.invoke(cli, ["runs", "import", str(out), "--db", str(b)], terminal_width=200)
    assert text.exit_code == 0
    assert "imported 0 new runs" in text.output and "3 already here" in text.output

    # `runs`, `runs ID` and options before or after the id still work
    listed = runner.invoke(cli, ["runs", "--db", str(a), "--json"])
    assert [r["run_id"] for r in json.loads(listed.output)["runs"]] == sorted(ids, reverse=True)
    for args in (["runs", str(ids[1]), "--db", str(a), "--json"],
                 ["runs", "--db", str(a), "--json", str(ids[1])]):  # fmt: skip
        one = runner.invoke(cli, args)
        assert one.exit_code == 0, one.output
        assert [r["run_id"] for r in json.loads(one.output)["runs"]] == [ids[1]]
    shown = runner.invoke(cli, ["runs", str(ids[1]), "--db", str(a)], terminal_width=200)
    assert f"run {ids[1]} (verify) ngram-mod: ok" in shown.output


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "no file {path}: give a file written by `specreg runs export`"),
        (b"not parquet", "is not a parquet file"),
    ],
)
def test_import_of_a_wrong_file_is_one_usage_line(
    tmp_path: Path, content: bytes | None, message: str
) -> None:
    path = tmp_path / "x.parquet"
    if content is not None:
        path.write_bytes(content)
    db = tmp_path / "b.duckdb"
    _registry(db, HOST_B, 20.0, 10.0)
    result = specreg("runs", "import", str(path), "--db", str(db))
    assert result.returncode == 2
    (line,) = result.stderr.splitlines()
    assert line.startswith("error: ") and message.format(path=path) in line


def test_import_refuses_a_parquet_file_that_is_no_runs_export(tmp_path: Path) -> None:
    path = tmp_path / "other.parquet"
    duckdb.connect().execute(f"COPY (SELECT 1 AS a) TO '{path}' (FORMAT parquet)")
    db = tmp_path / "b.duckdb"
    _registry(db, HOST_B, 20.0, 10.0)
    with opened(db) as con, pytest.raises(Exception, match="is not a specreg runs export"):
        import_runs(con, path)
    with opened(db, read_only=True) as con:
        assert len(list_runs(con)) == 3
        assert get_run(con, 1).host_fingerprint == HOST_B
