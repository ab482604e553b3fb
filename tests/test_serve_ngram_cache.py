"""A served ngram-cache backend comes with what its per-slot context cache does to it on a
long-lived llama-server (it stops learning after the first request) and the remedy."""

from __future__ import annotations

from specreg.runner.config import Config
from specreg.serve.routes import BackendSpec, Target, ngram_cache_note


def backend(spec_type: str, *flags: str) -> BackendSpec:
    target = Target(name="smollm2", model_id="m" * 16, path="/m.gguf", aliases=())
    config = Config(spec_type=spec_type)
    return BackendSpec(
        name=f"smollm2~{spec_type}", target=target, config=config, draft_id=None,
        draft_path=None, prefix=(), binary="llama-server",
        flags=("--spec-type", spec_type, *flags),
    )  # fmt: skip


def test_ngram_cache_without_a_workload_cache_is_warned_with_the_remedy() -> None:
    note = ngram_cache_note(backend("ngram-cache"))
    assert note == (
        "smollm2~ngram-cache runs ngram-cache: llama-server keeps its per-slot context cache "
        "across requests and adds a request's text only once it outgrows the longest earlier "
        "one, so after the first request it drafts almost nothing; give it a workload cache "
        "(`specreg lookup-cache build`, then lookup_cache: NAME in specreg.yaml) or serve ngram-mod"
    )


def test_with_a_static_cache_it_keeps_drafting_from_that_cache() -> None:
    note = ngram_cache_note(backend("ngram-cache", "--lookup-cache-static", "/c.lcs"))
    assert note is not None and note.endswith(
        "drafts from its static lookup cache only (rebuild the cache as the workload changes: "
        "`specreg lookup-cache build`)"
    )


def test_other_types_need_no_note() -> None:
    assert ngram_cache_note(backend("ngram-mod")) is None
    assert ngram_cache_note(backend("none")) is None
