"""Stacks and workload lookup caches with the real llama.cpp and SmolLM2-135M (threads=1, few
tokens): the user's stack runs, is recorded whole with per-type figures and verifies at
temperature 0; a cache built from recorded outputs is used on held-out prompts only, never by
another tokenizer family, and a broken cache file is one line before any server starts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specreg.samples.small_models import SmallModels

from support.cli import specreg, specreg_json

pytestmark = pytest.mark.llama

FEW = ["--threads", "1", "--n-predict", "24", "--repeat", "1", "--retries", "0"]


def test_the_users_stack_runs_is_recorded_whole_and_verifies(
    tmp_path: Path, llama_bin: Path, small_models: SmallModels
) -> None:
    smol = str(small_models.smollm2.path)
    draft = str(small_models.draft("smollm2", "Q4_0").path)
    db = str(tmp_path / "r.duckdb")
    stack = ["--spec-type", "ngram-mod,draft-simple", "--draft", draft]
    where = ["--task", "code", "--max-prompts", "1", "--llama-bin", str(llama_bin), "--db", db]
    args = [smol, *stack, *where, *FEW, "--json"]
    run = specreg_json("run", *args)["run"]
    assert run["status"] == "ok" and run["spec_type"] == "ngram-mod,draft-simple"
    assert run["config"]["spec_type"] == "ngram-mod,draft-simple"
    argv = run["argv"]
    assert argv[argv.index("--spec-type") + 1] == "ngram-mod,draft-simple"
    assert argv[argv.index("--spec-draft-model") + 1] == draft
    # per-type figures from llama.cpp's statistics lines, adding up to the server's totals
    figures = run["type_figures"]
    assert list(figures) == ["ngram-mod", "draft-simple"]
    assert figures["draft-simple"]["drafted"] > 0 and figures["draft-simple"]["accepted"] > 0
    assert run["draft_n"] == sum(f["drafted"] for f in figures.values()) > 0
    assert run["draft_n_accepted"] == sum(f["accepted"] for f in figures.values())
    assert run["prompts"][0]["type_figures"] == figures  # one prompt, one sample
    assert run["prompts"][0]["output_text"]

    verified = specreg_json("verify", *args)
    assert verified["run"]["verdict"] == "pass", verified["run"]["verdict_reason"]
    assert verified["run"]["spec_type"] == "ngram-mod,draft-simple"

    shown = specreg("runs", str(run["run_id"]), "--db", db)
    assert "ngram-mod,draft-simple" in shown.stdout
    assert "draft-simple: " in shown.stdout and "tokens accepted" in shown.stdout


def test_combinations_the_build_rejects_are_one_usage_line(
    tmp_path: Path, small_models: SmallModels
) -> None:
    r = specreg(
        "run", str(small_models.smollm2.path), "--spec-type", "none,ngram-mod",
        "--db", str(tmp_path / "r.duckdb"),
    )  # fmt: skip
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr == (
        "error: Invalid value for '--spec-type': none cannot be stacked with ngram-mod: "
        "llama.cpp reads any list holding none as none alone "
        "(common_speculative_types_from_names), so the others would never run; drop none or "
        "the other types (see `specreg run --help`)\n"
    )


def _prompts(path: Path, ids: range) -> Path:
    rows = [
        {
            "id": f"order-{i}",
            "prompt": f'Order {i} as JSON with the keys "id", "customer" and "paid":\n'
            f'{{"id": {i}, "customer": "',
        }
        for i in ids
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_a_workload_cache_from_recorded_runs_on_held_out_prompts(
    tmp_path: Path, llama_bin: Path, small_models: SmallModels, specreg_home: Path
) -> None:
    smol, gemma = str(small_models.smollm2.path), str(small_models.gemma3.path)
    db = str(tmp_path / "r.duckdb")
    common = [*FEW, "--llama-bin", str(llama_bin), "--db", db]
    built = _prompts(tmp_path / "first.jsonl", range(1, 3))
    held = _prompts(tmp_path / "second.jsonl", range(3, 5))
    first = specreg_json("run", smol, "--prompts", str(built), *common, "--json")["run"]
    assert all(p["output_text"] for p in first["prompts"])

    cache = specreg_json(
        "lookup-cache", "build", "orders", "--task", "json", "--model", smol,
        "--run", str(first["run_id"]), "--threads", "1", "--llama-bin", str(llama_bin),
        "--db", db, "--json",
    )["cache"]  # fmt: skip
    assert [s["ref"] for s in cache["sources"]] == [f"run:{first['run_id']}"] * 2
    assert sorted(cache["prompt_sha256s"]) == sorted(p["prompt_sha256"] for p in first["prompts"])

    # the prompts that built it would measure a replay
    again = specreg("run", smol, "--lookup-cache", "orders", "--prompts", str(built), *common)
    assert again.returncode == 2 and again.stderr.startswith(
        "error: order-1, order-2: the lookup cache orders holds this prompt and its recorded "
        "output, so a run on it measures a replay"
    )
    # held out: ngram-cache reads it (--lookup-cache implies ngram-cache)
    run = specreg_json(
        "run", smol, "--lookup-cache", "orders", "--prompts", str(held), *common, "--json"
    )["run"]
    assert run["status"] == "ok" and run["spec_type"] == "ngram-cache"
    assert run["lookup_cache"] == "orders" and run["lookup_cache_sha256"] == cache["sha256"]
    assert run["argv"][run["argv"].index("--lookup-cache-static") + 1] == cache["path"]
    assert run["regime"] == "first-encounter" and run["trusted"]

    # another tokenizer family never gets it
    other = specreg("run", gemma, "--lookup-cache", "orders", "--prompts", str(held), *common)
    assert other.returncode == 2
    assert "lookup cache orders was built for tokenizer family smollm:" in other.stderr
    assert other.stderr.count("\n") == 1

    # a truncated file: one line from specreg, and no llama-server was started for it
    logs = specreg_home / "logs"
    before = set(logs.iterdir())
    path = Path(cache["path"])
    path.write_bytes(path.read_bytes()[:-6])
    broken = specreg("run", smol, "--lookup-cache", "orders", "--prompts", str(held), *common)
    assert broken.returncode == 2 and broken.stdout == ""
    assert broken.stderr.startswith(f"error: lookup cache {path} is truncated (")
    assert "llama-server would abort on it" in broken.stderr
    assert broken.stderr.count("\n") == 1
    assert set(logs.iterdir()) == before
