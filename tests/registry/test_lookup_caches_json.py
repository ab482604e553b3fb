"""`lookup-cache build|list --json` are pinned by tests/schemas (lookup-cache, lookup-caches),
built from the result objects as the commands emit them."""

from __future__ import annotations

from datetime import datetime, timezone

from specreg.registry.lookup_caches import CacheSource, LookupCache, LookupCacheList

from support.schemas import validate

CACHE = LookupCache(
    name="json-records",
    path="/home/u/.specreg/lookup-caches/json-records.lcs",
    n_bytes=4096,
    sha256="ab" * 32,
    task="json",
    tok_fingerprint="fc3b69e6" * 4,
    tok_family="smollm:fc3b69e6",
    n_vocab=49152,
    model_id="0123456789abcdef",
    model_path="/models/SmolLM2.gguf",
    n_tokens=1200,
    n_ngrams=700,
    n_chars=4800,
    sources=(
        CacheSource("file", "/data/records.jsonl", "cd" * 32, 4000),
        CacheSource("run", "run:7", "ef" * 32, 800, "json-1", "01" * 32),
    ),
    prompt_sha256s=("01" * 32,),
    llama_version="11434 (pypi-sdist)",
    llama_bin_dir="/cache/bin",
    argv=("llama-lookup-create", "-m", "/models/SmolLM2.gguf"),
    built_at=datetime(2026, 1, 2, tzinfo=timezone.utc),
    seconds=1.25,
)


def test_build_and_list_documents_follow_their_schemas() -> None:
    one = CACHE.to_json()
    validate(one)
    assert one["cache"]["sources"][1] == {
        "kind": "run",
        "ref": "run:7",
        "sha256": "ef" * 32,
        "n_chars": 800,
        "prompt_id": "json-1",
        "prompt_sha256": "01" * 32,
    }
    assert one["cache"]["built_at"] == "2026-01-02T00:00:00+00:00"
    validate(LookupCacheList((CACHE,)).to_json())
    validate(LookupCacheList(()).to_json())
