"""`specreg run TARGET --draft D` refuses a pair the auditor knows is incompatible before
llama.cpp starts, with the auditor's reason and remedy, and records nothing (issue 25, point
12); `--force` goes on to llama.cpp's own word."""

from __future__ import annotations

from pathlib import Path

from support.cli import specreg, specreg_json

TARGET = "Qwen2.5 Coder 32B Instruct"
DRAFT = "Llama 3.2 1B Instruct"  # another tokenizer line: llama.cpp refuses the pair


def test_an_incompatible_draft_is_refused_before_anything_runs(
    sparse_tree: Path, tmp_path: Path
) -> None:
    db = str(tmp_path / "registry.duckdb")
    assert specreg("scan", str(sparse_tree), "--db", db).returncode == 0
    verdict = specreg_json("compat", TARGET, DRAFT, "--db", db, "--json", codes=(1,))
    assert verdict["verdict"] == "incompatible"
    draft_id = verdict["draft"]["id"]

    r = specreg("run", TARGET, "--draft", DRAFT, "--db", db, "--max-prompts", "1")
    assert r.returncode == 2
    reasons = "; ".join(verdict["reasons"])
    assert r.stderr.strip() == (
        f"error: {DRAFT} ({draft_id[:10]}) cannot draft for {TARGET} with llama.cpp "
        f"{verdict['rules']}: {reasons}; remedy: {verdict['remedies'][0]} (--force runs it "
        "anyway, to hear llama.cpp's own word)"
    )
    assert specreg_json("runs", "--db", db, "--json")["runs"] == []

    # --force passes the auditor by: the next check of the plan speaks (nothing starts)
    forced = specreg(
        "run", TARGET, "--draft", DRAFT, "--db", db, "--force", "--engine", "legacy", "--warm", "1"
    )
    assert forced.returncode == 2
    assert forced.stderr.startswith("error: --warm needs llama-server"), forced.stderr


def test_a_head_type_with_a_plain_draft_is_refused(sparse_tree: Path, tmp_path: Path) -> None:
    """Issue 41, point 5: --spec-type draft-eagle3 with a plain draft (llama.cpp: "draft model
    is not eagle3"), and an EAGLE-3 head run as draft-simple, are refused before anything runs."""
    db = str(tmp_path / "registry.duckdb")
    assert specreg("scan", str(sparse_tree), "--db", db).returncode == 0
    ids = {m["name"]: m["model_id"] for m in specreg_json("models", "--db", db, "--json")["models"]}
    llama, plain, head = (
        "Meta Llama 3.1 8B Instruct",
        "Llama 3.2 1B Instruct",
        "EAGLE3 LLaMA3.1 Instruct 8B",
    )
    r = specreg("run", llama, "--draft", plain, "--spec-type", "draft-eagle3", "--db", db)
    assert r.returncode == 2
    assert r.stderr.strip() == (
        f"error: --spec-type draft-eagle3 needs a draft head (eagle3) trained for the target, and "
        f"{plain} ({ids[plain][:10]}) is a plain model: run it with --spec-type draft-simple "
        "(--force runs it anyway)"
    )
    r = specreg("run", llama, "--draft", head, "--db", db)  # draft-simple, the default
    assert r.returncode == 2
    assert r.stderr.strip() == (
        f"error: {head} ({ids[head][:10]}) is a draft head (eagle3), which draft-simple cannot "
        "run: use --spec-type draft-eagle3 (--force runs it anyway)"
    )
    assert specreg_json("runs", "--db", db, "--json")["runs"] == []
