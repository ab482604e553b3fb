"""`specreg compat`, `drafts`, `audit`, `graph export`: exit codes, JSON, pinned lines."""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

from click.testing import CliRunner

from specreg.cli.main import cli


def _run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    return result.exit_code, result.output


def _specreg(*args: str) -> subprocess.CompletedProcess[str]:
    """Through the real entry point, where exit codes are decided."""
    return subprocess.run([sys.executable, "-m", "specreg", *args], capture_output=True, text=True)


def test_compat_json(scanned_db: Path) -> None:
    code, out = _run(
        "compat",
        "Qwen2.5 Coder 32B Instruct",
        "Qwen2.5 Coder 0.5B Instruct",
        "--db",
        str(scanned_db),
        "--json",
    )
    doc = json.loads(out)
    assert code == 0
    assert doc["version"] == "2" and doc["kind"] == "compat"
    assert doc["not_a_draft"] is None
    assert doc["compatible"] is True and doc["verdict"] in (
        "compatible",
        "compatible-with-warnings",
    )
    names = [c["name"] for c in doc["checks"]]
    assert names[:5] == ["vocab_type", "bos", "eos", "vocab_size", "token_text"]
    assert doc["flags"][:3] == ["--spec-type", "draft-simple", "--spec-draft-model"]


def test_compat_exit_codes(scanned_db: Path) -> None:
    db = ["--db", str(scanned_db)]
    refused = _specreg("compat", "Meta Llama 3.1 8B Instruct", "Qwen2.5 Coder 0.5B Instruct", *db)
    assert refused.returncode == 1
    assert refused.stdout.startswith(
        "incompatible: Qwen2.5 Coder 0.5B Instruct as draft for Meta Llama 3.1 8B Instruct"
    )
    assert "remedy: a draft with this tokenizer fingerprint exists: Llama 3.2 1B Instruct" in (
        refused.stdout
    )
    missing = _specreg("compat", "no-such-model", "Qwen2.5 Coder 0.5B Instruct", *db)
    assert missing.returncode == 2
    assert missing.stderr.strip() == (
        "error: no model matches 'no-such-model': give a path, an id from `specreg models`, "
        "or a name"
    )


def test_compat_of_a_larger_or_the_same_model_is_not_a_draft(scanned_db: Path) -> None:
    """Issue 41, point 7: the arguments swapped, or one model twice, exit 1 with "not a draft"
    as `drafts` says it, and no flags to run it."""
    db = ["--db", str(scanned_db)]
    big, small = "Qwen2.5 Coder 32B Instruct", "Qwen2.5 Coder 0.5B Instruct"
    for target, draft, why in (
        (small, big, "21.1 GB of weights against the target's 672.6 MB: a draft must be smaller"),
        (big, big, "it is the target itself"),
    ):
        r = _specreg("compat", target, draft, *db)
        assert r.returncode == 1, r.stderr
        first = r.stdout.splitlines()[0]
        assert first.startswith(f"not a draft: {draft} for {target}: {why}"), r.stdout
        assert "llama.cpp's own check alone: compatible" in r.stdout
        assert "flags:" not in r.stdout
        doc = json.loads(_specreg("compat", target, draft, *db, "--json").stdout)
        assert doc["not_a_draft"].startswith(why) and doc["flags"] == []


def test_drafts_lists_rejected_on_request(scanned_db: Path) -> None:
    db = ["--db", str(scanned_db)]
    code, out = _run("drafts", "Meta Llama 3.1 8B Instruct", *db, "--json")
    doc = json.loads(out)
    assert code == 0
    assert doc["draftless"] == [
        "ngram-simple",
        "ngram-map-k",
        "ngram-map-k4v",
        "ngram-mod",
        "ngram-cache",
    ]
    drafts = [d["draft"]["name"] for d in doc["drafts"]]
    assert "Llama 3.2 1B Instruct" in drafts and "EAGLE3 LLaMA3.1 Instruct 8B" in drafts
    assert all(d["compatible"] for d in doc["drafts"])
    _, out = _run("drafts", "Meta Llama 3.1 8B Instruct", *db, "--json", "--rejected")
    rejected = [d for d in json.loads(out)["drafts"] if not d["compatible"]]
    assert rejected and all(d["reasons"] for d in rejected)


def test_drafts_offers_mtp_heads(scanned_db: Path) -> None:
    code, out = _run("drafts", "GLM 4.5 Air", "--db", str(scanned_db))
    assert code == 0
    assert out.splitlines()[0] == (
        "without a draft: --spec-type draft-mtp | ngram-simple | ngram-map-k | ngram-map-k4v | "
        "ngram-mod | ngram-cache"
    )


def test_audit_persists_and_fails_on_findings(scanned_db: Path) -> None:
    db = ["--db", str(scanned_db)]
    code, out = _run("audit", *db, "--json")
    doc = json.loads(out)
    assert code == 0 and doc["audit_id"] == 1
    assert sum(doc["counts"].values()) == doc["n_pairs"]
    risky = doc["counts"].get("passes-llama-check-risky", 0)
    assert risky > 0  # Phi-3 / Llama SPM, among others
    proc = _specreg("audit", *db, "--fail-on-findings")
    assert proc.returncode == 1
    assert "pairs pass llama.cpp's check but are risky" in proc.stdout


def test_audit_names_the_pairs(scanned_db: Path) -> None:
    """Issue 41, point 8: the pairs llama.cpp accepts by target and draft name in the text, and
    every pair's names beside its ids in --json."""
    from support.tty import name_on_one_line, specreg_tty, too_wide

    db = ["--db", str(scanned_db)]
    doc = json.loads(_specreg("audit", *db, "--json").stdout)
    assert doc["version"] == "2"
    models = json.loads(_specreg("models", *db, "--json").stdout)["models"]
    name = {m["model_id"]: m["name"] or Path(m["path"]).name for m in models}
    assert doc["pairs"] and all(
        (p["target_name"], p["draft_name"]) == (name[p["target"]], name[p["draft"]])
        for p in doc["pairs"]
    )
    accepted = [p for p in doc["pairs"] if p["verdict"] != "incompatible"]
    code, screen = specreg_tty("audit", *db, columns=80)
    assert code == 0, screen
    assert f"pairs llama.cpp accepts ({len(accepted)}; " in screen
    named = screen.split("pairs llama.cpp accepts")[1]
    assert not too_wide(named, 80), too_wide(named, 80)
    lines = named.splitlines()
    for p in accepted:  # each pair on a line of its own: the target's id, then the draft's
        assert any(
            line.startswith(p["target"][:10]) and f" {p['draft'][:10]} " in line for line in lines
        ), (p, screen)
        assert name_on_one_line(p["target_name"], named) and name_on_one_line(
            p["draft_name"], named
        )


def test_graph_export(scanned_db: Path, tmp_path: Path) -> None:
    db = ["--db", str(scanned_db)]
    code, out = _run("graph", "export", "--format", "json", *db)
    assert code == 0
    doc = json.loads(out)
    nodes = {n["id"]: n for n in doc["nodes"]}
    assert doc["edges"] and all(e["verdict"] != "incompatible" for e in doc["edges"])
    # Tokenizer families are clusters: the Llama 3 models share one.
    llama = [n for n in nodes.values() if "Llama" in n["label"] or "LLaMA" in n["label"]]
    assert len({n["family"] for n in llama}) == 1 and len(llama) == 3
    assert any(len(c["models"]) >= 3 for c in doc["clusters"])
    target = tmp_path / "g.graphml"
    code, _ = _run("graph", "export", "--format", "graphml", "-o", str(target), *db)
    assert code == 0
    root = ET.parse(target).getroot()
    ns = {"g": "http://graphml.graphdrawing.org/xmlns"}
    assert len(root.findall(".//g:node", ns)) == len(nodes)
    assert len(root.findall(".//g:edge", ns)) == len(doc["edges"])


def _fake_llama(tmp_path: Path, version: str, help_text: str) -> Path:
    """A fake llama-server: canned --help and --version (mocking only the process boundary)."""
    bin_dir = tmp_path / "fake-llama"
    bin_dir.mkdir()
    server = bin_dir / "llama-server"
    server.write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = "--version" ]; then echo "version: {version}" >&2; exit 0; fi\n'
        f"cat <<'HELP'\n{help_text}\nHELP\n"
    )
    server.chmod(0o755)
    return bin_dir


def test_rules_follow_the_users_binary(scanned_db: Path, tmp_path: Path) -> None:
    old = _fake_llama(tmp_path, "7371 (deadbeef)", "-md, --model-draft FNAME\n--draft-max N")
    pair = ["Qwen3 Next 80B A3B Instruct", "Qwen3 Coder Instruct DRAFT 0.75B"]
    db = ["--db", str(scanned_db), "--json"]
    code, out = _run("compat", *pair, *db)
    assert code == 0 and json.loads(out)["llama_build"] == 11434
    code, out = _run("compat", *pair, *db, "--llama-bin", str(old))
    doc = json.loads(out)
    assert code == 1 and doc["llama_build"] <= 7371
    assert doc["reasons"] == [
        "hybrid target (qwen3next): this build cannot roll back recurrent state, so it cannot "
        "speculate on it"
    ]
    code, out = _run("compat", *pair, *db, "--llama-build", "11434")
    assert code == 0


def test_saved_audit_round_trips_and_goes_stale(scanned_db: Path, sparse_tree: Path) -> None:
    import networkx as nx

    from specreg.auditor import audit_and_save, build_graph, stored_graph
    from specreg.registry.db import opened
    from specreg.registry.scan import scan_paths

    with opened(scanned_db) as con:
        result, audit_id = audit_and_save(con)
        saved = stored_graph(con)
        fresh = build_graph(con)
        assert saved is not None
        assert nx.utils.graphs_equal(saved, fresh)
        n_rows = con.execute(
            "SELECT count(*) FROM audit_pairs WHERE audit_id = ?", [audit_id]
        ).fetchone()
        assert n_rows is not None and n_rows[0] == len(result.pairs)
        scan_paths(con, [sparse_tree])  # a later scan makes the saved audit stale
        assert stored_graph(con) is None
