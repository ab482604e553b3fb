"""Every `--json` document is pinned by a JSON schema (tests/schemas/KIND.json): its version and
kind, every field by name (none missing, none unknown) and its type. A new field fails here
until its schema names it (tests/schemas/infer_schema.py drafts one from a document); renaming
or removing a field also bumps the result's JSON_VERSION."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from support import schemas
from support.cli import specreg_json

TARGET = "Qwen2.5 Coder 32B Instruct"
DRAFT = "Qwen2.5 Coder 0.5B Instruct"
# Every kind a test below validates; a schema file for anything else is stale.
KINDS = {
    "scan", "models", "model", "demo", "compat", "drafts", "audit", "graph", "recommendation",
    "train", "tune", "run", "runs", "verify", "report", "plan", "import", "export",
    "quality", "agreement",  # validated in quality/test_json.py (built from result objects)
    "lookup-cache", "lookup-caches",  # validated in registry/test_lookup_caches_json.py
    "serve-routes",
    "doctor", "calibration", "sweep", "sweep-plan", "runs-export", "runs-import",
    "llama-build", "llama-info", "llama-models",
}  # fmt: skip


def validate(doc: dict[str, Any]) -> None:
    schemas.validate(doc)
    assert doc["kind"] in KINDS


@pytest.mark.parametrize(
    "args",
    [
        ["models", "--json"],
        ["show", TARGET, "--json"],
        ["compat", TARGET, DRAFT, "--json"],
        ["drafts", TARGET, "--rejected", "--json"],
        ["audit", "--json"],
        ["graph", "export", "--format", "json"],
        ["recommend", TARGET, "--json"],
        ["recommend", TARGET, "--policy", "speed", "--json"],
        ["runs", "--json"],
        ["serve", TARGET, "--dry-run", "--json"],
    ],
    ids=" ".join,
)
def test_registry_commands(scanned_db: Path, args: list[str]) -> None:
    validate(specreg_json(*args, "--db", str(scanned_db), codes=(0, 1)))


def test_scan_with_a_bad_file(gguf_factory) -> None:  # type: ignore[no-untyped-def]
    good = gguf_factory("good.gguf")
    (good.parent / "bad.gguf").write_bytes(b"GGUF" + (7).to_bytes(4, "little") + b"\0" * 40)
    doc = specreg_json("scan", str(good.parent), "--json", codes=(1,))
    assert doc["errors"]
    validate(doc)


def test_demo_train_and_report(tmp_path: Path, scanned_db: Path) -> None:
    validate(specreg_json("demo", str(tmp_path / "demo"), "--json"))
    validate(specreg_json("train", "--no-cv", "--db", str(scanned_db), "--json"))
    report = ["report", "-o", str(tmp_path / "site"), "--db", str(scanned_db), "--json"]
    validate(specreg_json(*report))


def test_declare_commands(scanned_db: Path, tmp_path: Path) -> None:
    models = specreg_json("models", "--json", "--db", str(scanned_db))["models"]
    by_name = {m["name"]: m["model_id"] for m in models}
    spec = tmp_path / "specreg.yaml"
    spec.write_text(
        "version: 1\nllama:\n  dialect: current\nmodels:\n"
        f"  {by_name[TARGET]}:\n    aliases: [t]\n  {by_name[DRAFT]}:\n    aliases: [d]\n"
        "roles:\n  coder:\n    target: t\n    configs:\n      default:\n        draft: d\n"
    )
    plan = specreg_json("plan", "--spec", str(spec), "--db", str(scanned_db), "--json", codes=(1,))
    assert plan["findings"]  # the demo tree's undeclared models, at least
    validate(plan)
    export = ["export", "--format", "llama-swap", "--spec", str(spec), "--db", str(scanned_db)]
    validate(specreg_json(*export, "--json"))


def test_import(tmp_path: Path) -> None:
    from support.declare import write_registry

    source = write_registry(tmp_path / "model_registry.yaml", tmp_path / "models")
    out = tmp_path / "specreg.yaml"
    validate(specreg_json("import", str(source), "--spec", str(out), "--json"))


def _run_record() -> Any:
    from specreg.registry.run_store import PromptRecord, RunRecord

    prompt = PromptRecord(
        prompt_id="code-1", prompt_sha256="ab", n_samples=2, tokens_per_s=10.0,
        samples_tps=(9.0, 11.0), draft_n=4, draft_n_accepted=2, verdict="near-tie",
        divergence={"position": 3, "margin": 0.01},
    )  # fmt: skip
    return RunRecord(
        kind="verify", status="ok", started_at=datetime.now(timezone.utc),
        config={"engine": "server"}, config_label="draft-simple K=4", spec_type="draft-simple",
        seconds=3.5, target_path="/m/t.gguf", draft_path="/m/d.gguf", k=4,
        argv=("llama-server", "-m", "/m/t.gguf"), tokens_per_s=10.0, acceptance=0.5,
        speedup=1.2, verdict="pass", run_id=7, prompts=(prompt,),
    )  # fmt: skip


def test_run_results() -> None:
    """run/verify/runs documents of a recorded run (the real runs are the runner's tests)."""
    from specreg.cli.common import json_text
    from specreg.registry.run_store import RunList, VerifiedRun

    run = _run_record()
    for result in (run, RunList((run,)), VerifiedRun(run, run)):
        validate(json.loads(json_text(result.to_json())))


def test_tune_result(scanned_db: Path) -> None:
    from specreg.cli.common import json_text
    from specreg.host.facts import detect_host_facts
    from specreg.recommender.advisor import open_advisor
    from specreg.registry.db import opened
    from specreg.tune.tuner import TuneResult, TuneStep

    with opened(scanned_db, read_only=True) as con:
        rec = open_advisor(con, detect_host_facts(40.0)).recommend(con, TARGET)
    steps = (TuneStep(rec.options[0], 10.0, 1, "plain first"), TuneStep(rec.options[1], None, 2))
    result = TuneResult(rec.target_name, steps, rec, True, "confirmed", len(rec.options))
    validate(json.loads(json_text(result.to_json())))


def test_doctor(tmp_path: Path) -> None:
    # --memory: the memory_config part is filled too (else it is null)
    args = ("doctor", "--memory", "2xDDR5-4800", "--db", str(tmp_path / "r.duckdb"), "--json")
    doc = specreg_json(*args, codes=(0, 1))
    assert doc["bandwidth"] and doc["memory_config"] and doc["checks"]
    validate(doc)


def test_calibration_result() -> None:
    from specreg.cli.common import json_text
    from specreg.registry.calibration import KIND_BATCH, KIND_GEN, CalibrationRecord, point
    from specreg.runner.calibrate import CalibrationResult

    batch = [point(KIND_BATCH, n, (0.01 * n, 0.011 * n)) for n in (1, 2, 4, 8, 16)]
    record = CalibrationRecord(
        host_fingerprint="hostA", model_id="m1", model_path="/m/t.gguf", role="target",
        threads=2, measured_at=datetime(2026, 1, 2, tzinfo=timezone.utc), repetitions=2,
        points=(*batch, point(KIND_GEN, 64, (0.64, 0.70), foreign_cpu_s=0.01)),
        model_bytes=123, seconds=2.5, llama_version="b11434", llama_bin_dir="/llama/bin",
        argv=("llama-bench", "-m", "/m/t.gguf"), load_foreign_cpu=0.02, calibration_id=1,
    )  # fmt: skip
    result = CalibrationResult("hostA", (record,), seconds=3.0, reruns=1)
    validate(json.loads(json_text(result.to_json())))


def test_sweep_plan_and_result(scanned_db: Path) -> None:
    from specreg.cli.common import json_text
    from specreg.tune.sweep import SweepHost, SweepResult, SweepRun

    models = specreg_json("models", "--json", "--db", str(scanned_db))["models"]
    draft = next(m["model_id"] for m in models if m["name"] == DRAFT)
    grid = ["--grid", f"spec=none,ngram-mod,draft-simple k=2,4 draft={draft}"]
    plan = specreg_json("sweep", TARGET, *grid, "--dry-run", "--json", "--db", str(scanned_db))
    assert any(p["draft_id"] for p in plan["points"])
    validate(plan)
    runs = (
        SweepRun("plain", 1, "u1", "alpha", "f1", "ok", None, None, 10.0, None, 1.0),
        SweepRun("ngram-mod k=2", 2, "u2", None, "f1", "failed", "crash", "exit 1", None, None,
                 None, attempt=2, retry_of="u0"),
    )  # fmt: skip
    hosts = (SweepHost("alpha", "f1", 2, 1), SweepHost(None, None, 0, 0, dropped="worker died"))
    result = SweepResult(
        TARGET, "abc", "spec=none,ngram-mod k=2", 2, runs, ("ngram-mod k=4",), hosts, 5.0,
        ray_address="127.0.0.1:6379",
    )  # fmt: skip
    validate(json.loads(json_text(result.to_json())))


def test_runs_export_and_import(tmp_path: Path) -> None:
    from specreg.registry.db import opened
    from specreg.registry.run_store import record_run

    a, b, out = tmp_path / "a.duckdb", tmp_path / "b.duckdb", tmp_path / "runs.parquet"
    with opened(a) as con:
        record_run(con, replace(_run_record(), run_id=None, host_fingerprint="f1"))
    validate(specreg_json("runs", "export", str(out), "--db", str(a), "--json"))
    validate(specreg_json("runs", "import", str(out), "--db", str(b), "--json"))


def test_llama_results(tmp_path: Path) -> None:
    """llama build|info|models documents (the real commands build and fetch: llama tests)."""
    from specreg.cli.common import json_text
    from specreg.host.machine import detect_host
    from specreg.llama.build import BuildInfo
    from specreg.llama.install import LlamaInfo, LlamaInstall
    from specreg.samples.model_files import ModelFiles, SmallModel

    build = BuildInfo(
        "0.6.0", tmp_path / "src", tmp_path / "build", tmp_path / "bin", ("llama-server",),
        ("-DGGML_NATIVE=ON",), "Ninja", True, 1.5, True, tmp_path / "build.log", ("AMX",),
        "the native build died here (llama-simple was killed by signal 4)",
        ({"binary": "llama-simple", "ok": True, "returncode": 0, "signal": None,
          "seconds": 0.4, "message": "", "timed_out": False},),
    )  # fmt: skip
    install = LlamaInstall(
        tmp_path / "bin", "cache", "11434 (pypi-sdist)", "spec-type", ("none", "ngram-mod"),
        ("llama-server", "llama-bench"),
    )  # fmt: skip
    models = ModelFiles((SmallModel("smollm2", "Q4_1", tmp_path / "s.gguf", 100),))
    infos = (LlamaInfo(install, detect_host()), LlamaInfo(install, detect_host(), build))
    for result in (build, *infos, models):
        validate(json.loads(json_text(result.to_json())))


def test_every_schema_is_checked() -> None:
    assert {p.stem for p in schemas.SCHEMAS.glob("*.json")} == KINDS
