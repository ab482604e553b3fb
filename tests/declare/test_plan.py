"""`specreg plan`: each kind of drift between specreg.yaml, the disk and measured runs."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from ruamel.yaml.comments import CommentedMap

from specreg.declare import deps
from specreg.declare.plan import Plan, make_plan
from specreg.declare.spec import load_spec, read_yaml, write_yaml
from specreg.registry.db import opened
from specreg.registry.stores import store_dirs

from support.declare import LLAMA_1B, QWEN3_480B_DIR, QWEN25_05B, Site, record_run, run_cli

# fixtures, shared through the module that defines them


def plan_of(s: Site) -> Plan:
    spec, _ = load_spec(s.spec)
    with opened(s.db) as con:
        return make_plan(con, spec)


def model_id(s: Site, rel: str) -> str:
    with opened(s.db) as con:
        m = deps.model_at_path(con, s.models / rel)
    assert m is not None
    return m.model_id


def edit_spec(s: Site, fn) -> None:  # type: ignore[no-untyped-def]
    doc = read_yaml(s.spec)
    fn(doc)
    write_yaml(s.spec, doc)


def test_clean_site_has_no_drift_and_exits_0(site: Site) -> None:
    plan = plan_of(site)
    assert plan.findings == ()
    code, out, _ = run_cli(["plan", "--spec", str(site.spec), "--db", str(site.db)])
    assert code == 0
    assert out == "no drift: 9 models and 6 roles as declared\n"


def test_declared_model_missing(private_site: Site) -> None:
    s = private_site
    mid = model_id(s, QWEN25_05B)
    (s.models / QWEN25_05B).unlink()
    s.rescan()
    plan = plan_of(s)
    assert [f.kind for f in plan.findings] == ["model-missing"]
    f = plan.findings[0]
    assert f.subject == f"models.{mid}"
    assert f.message == (
        f"Qwen2.5-Coder-0.5B-Instruct: declared model {mid[:12]} is not on disk, "
        f"last seen at {os.path.realpath(s.models / QWEN25_05B)}"
    )
    assert f.where is not None and f.where.line is not None
    code, out, _ = run_cli(["plan", "--spec", str(s.spec), "--db", str(s.db)])
    assert code == 1
    assert "model-missing" in out and "1 difference(s)" in out


def test_declared_model_fingerprint_changed(private_site: Site) -> None:
    s = private_site
    old = model_id(s, LLAMA_1B)
    target = s.models / LLAMA_1B
    target.unlink()
    os.link(s.spare / "lmstudio-community/gemma-3-1b-it-GGUF/gemma-3-1b-it-Q8_0.gguf", target)
    s.rescan()
    plan = plan_of(s)
    changed = plan.of_kind("model-changed")
    assert len(changed) == 1 and changed[0].subject == f"models.{old}"
    new = changed[0].evidence[0]
    assert new != old
    assert changed[0].message == (
        f"Llama-3.2-1B-Instruct: the file at {target} is now a different model "
        f"(fingerprint {new[:12]}, declared {old[:12]})"
    )
    # the new file is also a model nobody declared
    assert [f.subject for f in plan.of_kind("undeclared-model")] == [new]


def test_split_set_incomplete(private_site: Site) -> None:
    s = private_site
    part = s.models / QWEN3_480B_DIR / "Qwen3-Coder-480B-A35B-Instruct-Q4_K_M-00003-of-00008.gguf"
    part.unlink()
    s.rescan()
    plan = plan_of(s)
    found = plan.of_kind("split-incomplete")
    assert len(found) == 1
    assert found[0].message.startswith(
        "Qwen3-Coder-480B-A35B-Instruct: split set incomplete, missing"
    )
    assert "00003-of-00008" in found[0].message
    # an incomplete set cannot be launched: export skips it with the reason
    code, out, _ = run_cli(
        ["export", "--format", "llama-server", "--spec", str(s.spec), "--db", str(s.db)]
    )
    assert code == 0
    assert (
        "# skipped architect_coding/default: target: Qwen3-Coder-480B-A35B-Instruct is "
        "missing split parts:" in out
    )


def test_undeclared_model_found_unless_excluded(private_site: Site) -> None:
    s = private_site
    src = s.spare / "bartowski/DeepSeek-R1-Distill-Qwen-1.5B-GGUF"
    dst = s.models / "bartowski/DeepSeek-R1-Distill-Qwen-1.5B-GGUF"
    dst.mkdir(parents=True)
    for f in src.iterdir():
        os.link(f, dst / f.name)
    s.rescan()
    plan = plan_of(s)
    assert [f.kind for f in plan.findings] == ["undeclared-model"]
    assert "DeepSeek-R1-Distill-Qwen-1.5B-Q8_0.gguf" in plan.findings[0].message

    edit_spec(s, lambda doc: doc.insert(4, "exclude", ["*DeepSeek*"]))
    assert plan_of(s).findings == ()


def test_pinned_draft_no_longer_compatible(site: Site) -> None:
    def repin(doc: CommentedMap) -> None:
        doc["roles"]["general"]["configs"]["default"]["draft"] = "Qwen2.5-Coder-0.5B-Instruct"

    edit_spec(site, repin)
    plan = plan_of(site)
    assert [f.kind for f in plan.findings] == ["draft-incompatible"]
    f = plan.findings[0]
    assert f.subject == "roles.general.configs.default.draft"
    assert f.message.startswith(
        "general/default: pinned draft Qwen2.5-Coder-0.5B-Instruct no "
        "longer passes with Meta-Llama-3.1-8B-Instruct: incompatible"
    )
    assert f.evidence  # the auditor's reasons


def test_role_with_no_compatible_draft(site: Site) -> None:
    def add(doc: CommentedMap) -> None:
        doc["roles"]["gemma_spec"] = CommentedMap(
            [
                ("target", "gemma-3-27b-it"),
                ("configs", {"default": {"draft": "Qwen2.5-Coder-0.5B-Instruct"}}),
            ]
        )
        doc["roles"]["gemma_plain"] = CommentedMap([("target", "gemma-3-27b-it")])

    edit_spec(site, add)
    plan = plan_of(site)
    kinds = sorted((f.kind, f.subject) for f in plan.findings)
    assert kinds == [
        ("draft-incompatible", "roles.gemma_spec.configs.default.draft"),
        ("no-compatible-draft", "roles.gemma_plain"),
        ("no-compatible-draft", "roles.gemma_spec"),
    ]
    assert plan.of_kind("no-compatible-draft")[0].message.endswith(
        "no model on disk is a compatible draft for gemma-3-27b-it; consider an n-gram "
        "spec_type or an MTP head"
    )


def test_pinned_config_beaten_by_measured_runs(site: Site) -> None:
    target = model_id(
        site,
        "lmstudio-community/Qwen2.5-Coder-32B-Instruct-GGUF/Qwen2.5-Coder-32B-Instruct-Q4_K_M.gguf",
    )
    draft = model_id(site, QWEN25_05B)
    for tps in (11.0, 11.2):
        record_run(site.db, target=target, draft=draft, k=16, tps=tps, acceptance=0.6)
    # not comparable or not allowed: another host, fewer experts under policy quality
    record_run(site.db, target=target, draft=draft, k=4, tps=40.0, host="host-b")
    record_run(site.db, target=target, draft=draft, k=16, tps=30.0, experts=4)
    assert plan_of(site).findings == ()

    ids = [
        record_run(site.db, target=target, draft=draft, k=8, tps=t, acceptance=0.7)
        for t in (12.4, 12.6, 12.5)
    ]
    plan = plan_of(site)
    assert [f.kind for f in plan.findings] == ["config-beaten"]
    f = plan.findings[0]
    assert f.subject == "roles.coder_escalation.configs.default"
    assert f.message == (
        "coder_escalation/default: pinned 11.10 tok/s (median of 2 measured run(s)) is beaten by "
        "draft-simple draft Qwen2.5-Coder-0.5B-Instruct draft_max 8 at 12.50 tok/s (+12.6 %, "
        "3 run(s)); `specreg propose` writes the change"
    )
    assert sorted(f.evidence) == sorted(str(i) for i in ids)

    code, out, _ = run_cli(["plan", "--spec", str(site.spec), "--db", str(site.db), "--json"])
    assert code == 1
    doc = json.loads(out)
    assert doc["kind"] == "plan" and doc["drift"] is True
    assert doc["findings"][0]["kind"] == "config-beaten"


def test_plan_changes_nothing(private_site: Site) -> None:
    s = private_site
    (s.models / QWEN25_05B).unlink()
    s.rescan()
    before = s.spec.read_bytes()
    code, _, _ = run_cli(["plan", "--spec", str(s.spec), "--db", str(s.db)])
    assert code == 1
    assert s.spec.read_bytes() == before


def test_missing_spec_is_a_usage_error(tmp_path: Path) -> None:
    code, _, err = run_cli(["plan", "--spec", str(tmp_path / "specreg.yaml")])
    assert code == 2
    assert err == (
        f"error: {tmp_path / 'specreg.yaml'}: no such file (create one with "
        "`specreg import` or `specreg init`)"
    )


def test_plan_scan_covers_declared_stores(
    site: Site, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hub = tmp_path / "hf" / "hub"
    snap = hub / "models--bartowski--DeepSeek-R1-Distill-Qwen-1.5B-GGUF" / "snapshots" / "a1b2"
    snap.mkdir(parents=True)
    os.link(
        site.spare
        / "bartowski/DeepSeek-R1-Distill-Qwen-1.5B-GGUF/DeepSeek-R1-Distill-Qwen-1.5B-Q8_0.gguf",
        snap / "model.gguf",
    )
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    edit_spec(site, lambda doc: doc.insert(4, "stores", ["huggingface", "ollama"]))
    assert plan_of(site).findings == ()  # not scanned yet
    code, out, _ = run_cli(
        ["plan", "--scan", "--spec", str(site.spec), "--db", str(site.db), "--json"]
    )
    assert code == 1
    (f,) = json.loads(out)["findings"]
    assert f["kind"] == "undeclared-model" and f["evidence"] == [str(snap / "model.gguf")]


def test_store_folders_follow_each_tools_override() -> None:
    home = Path("/home/u")
    assert store_dirs("huggingface", {}, home) == [home / ".cache/huggingface/hub"]
    assert store_dirs("huggingface", {"HF_HOME": "/hf"}, home) == [Path("/hf/hub")]
    assert store_dirs("huggingface", {"HF_HUB_CACHE": "/c", "HF_HOME": "/hf"}, home) == [Path("/c")]
    assert store_dirs("llama-cpp", {"LLAMA_CACHE": "/l"}, home) == [Path("/l")]
    assert store_dirs("ollama", {}, home) == [home / ".ollama/models/blobs"]
    assert store_dirs("lmstudio", {}, home) == [
        home / ".lmstudio/models",
        home / ".cache/lm-studio/models",
    ]


def test_real_entry_point_exit_codes(private_site: Site) -> None:
    s = private_site
    env = {**os.environ, "SPECREG_HOME": str(s.root / "home")}
    args = ["specreg", "plan", "--spec", str(s.spec), "--db", str(s.db)]
    assert subprocess.run(args, env=env, capture_output=True).returncode == 0
    (s.models / QWEN25_05B).unlink()
    args_scan = [*args, "--scan"]
    proc = subprocess.run(args_scan, env=env, capture_output=True, text=True)
    assert proc.returncode == 1 and "model-missing" in proc.stdout
    s.spec.write_text(s.spec.read_text().replace("draft_max: 16", "k: 16", 1))
    proc = subprocess.run(args, env=env, capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.startswith(f"error: {s.spec}:")
    assert proc.stderr.rstrip().endswith(
        ".configs.default.k: unknown key; K is spelled draft_max (drafted tokens per step)"
    )


def test_numbers_without_host_and_protocol_compare_with_nothing(site: Site) -> None:
    """Imported evidence (47 tok/s on someone's EPYC) is not beaten by a run on this host;
    a run of the pinned config on the same host and protocol is what makes them comparable."""
    target = model_id(
        site,
        "lmstudio-community/Meta-Llama-3.1-8B-Instruct-GGUF/Meta-Llama-3.1-8B-Instruct-Q4_K_M.gguf",
    )
    draft = model_id(site, LLAMA_1B)
    record_run(site.db, target=target, draft=draft, k=8, tps=100.0)
    assert plan_of(site).findings == ()
    record_run(site.db, target=target, draft=draft, k=24, tps=90.0)
    (f,) = plan_of(site).findings
    assert (
        f.kind == "config-beaten"
        and "pinned 90.00 tok/s (median of 1 measured run(s))" in f.message
    )
