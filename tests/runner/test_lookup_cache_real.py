"""`specreg lookup-cache build|list` with the build's real llama-lookup-create and SmolLM2's
tokenizer: the file, its facts and the registry artefact; a cache is listed only for models of
the tokenizer family that built it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from specreg.cli.main import cli
from specreg.registry.db import opened
from specreg.registry.lookup_caches import get_cache
from specreg.runner.lookup_cache import read_cache_file
from specreg.samples.small_models import SmallModels

from support.cli import specreg

pytestmark = pytest.mark.llama

RECORDS = "\n".join(
    json.dumps({"id": i, "name": n, "city": c, "active": i % 2 == 0})
    for i, (n, c) in enumerate([("Anna", "Lisbon"), ("Bob", "Oslo"), ("Chen", "Lima")] * 3)
)


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.output


def test_build_and_list_a_cache_from_files(
    tmp_path: Path, llama_bin: Path, small_models: SmallModels
) -> None:
    corpus = tmp_path / "records.jsonl"
    corpus.write_text(RECORDS + "\n")
    db = str(tmp_path / "r.duckdb")
    smol, gemma = str(small_models.smollm2.path), str(small_models.gemma3.path)
    code, out = invoke(
        "lookup-cache", "build", "json-records", str(corpus), "--task", "json",
        "--model", smol, "--threads", "1", "--llama-bin", str(llama_bin), "--db", db, "--json",
    )  # fmt: skip
    assert code == 0, out
    doc = json.loads(out)
    assert doc["version"] == "1" and doc["kind"] == "lookup-cache"
    cache = doc["cache"]
    assert cache["name"] == "json-records" and cache["task"] == "json"
    assert cache["n_tokens"] > 50 and cache["n_ngrams"] > 10
    assert cache["sources"] == [
        {
            "kind": "file",
            "ref": str(corpus),
            "sha256": cache["sources"][0]["sha256"],
            "n_chars": len(RECORDS) + 1,
            "prompt_id": None,
            "prompt_sha256": None,
        }
    ]
    assert cache["llama_version"] and "llama-lookup-create" in cache["argv"][0]
    assert Path(cache["path"]).is_file()
    facts = read_cache_file(Path(cache["path"]), n_vocab=cache["n_vocab"])
    assert facts.static and facts.n_bytes == cache["n_bytes"] == Path(cache["path"]).stat().st_size
    with opened(Path(db), read_only=True) as con:
        assert get_cache(con, "json-records").tok_family == cache["tok_family"]

    code, out = invoke("lookup-cache", "list", "--db", db)
    assert code == 0 and "json-records" in out and cache["tok_family"] in out
    listed = json.loads(invoke("lookup-cache", "list", "--model", smol, "--db", db, "--json")[1])
    assert [c["name"] for c in listed["caches"]] == ["json-records"]
    # Gemma's tokenizer is another family: the cache is never offered to it
    invoke("scan", gemma, "--db", db)
    other = json.loads(invoke("lookup-cache", "list", "--model", gemma, "--db", db, "--json")[1])
    assert other["caches"] == []


def test_nothing_to_build_from_is_one_usage_line(
    tmp_path: Path, llama_bin: Path, small_models: SmallModels
) -> None:
    db = str(tmp_path / "r.duckdb")
    r = specreg(
        "lookup-cache", "build", "empty", "--task", "json", "--from-runs",
        "--model", str(small_models.smollm2.path), "--llama-bin", str(llama_bin), "--db", db,
    )  # fmt: skip
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.startswith(
        "error: nothing to build empty from (--from-runs found no recorded outputs): give files "
        "of your workload, or record runs of --task json on a model of this tokenizer family "
        "(smollm:"
    )
    assert r.stderr.count("\n") == 1
