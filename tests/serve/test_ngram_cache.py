"""A served ngram-cache backend comes with what its per-slot context cache does to it on a
long-lived llama-server (it stops learning after the first request) and the remedy."""

from __future__ import annotations

from pathlib import Path

from specreg.llama.config import Config
from specreg.llama.install import LlamaInstall
from specreg.samples.small_models import SmallModels
from specreg.serve.routes import BackendSpec, Shape, Target, ngram_cache_note

from support.declare import smollm2_spec
from support.lookup_cache import cache_record, write_cache


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


SPEC = smollm2_spec("""\
      json:
        spec_type: ngram-mod,ngram-cache
        lookup_cache: orders
      code:
        spec_type: ngram-cache
""")


def test_a_pinned_stack_with_a_workload_cache_is_served_in_one_backend(
    tmp_path: Path, specreg_home: Path, llama_install: LlamaInstall, small_models: SmallModels
) -> None:
    from specreg.declare.spec import load_spec
    from specreg.host.facts import HostFacts
    from specreg.host.machine import detect_host
    from specreg.recommender.advisor import open_advisor
    from specreg.registry.db import opened
    from specreg.registry.lookup_caches import record_cache
    from specreg.registry.scan import model_record
    from specreg.serve.routes import plan_routes

    path = small_models.smollm2.path
    cache_file = write_cache(tmp_path / "orders.lcs", [([1, 2], [(3, 2)]), ([2, 3], [(4, 1)])])
    with opened(specreg_home / "registry.duckdb") as con:
        rec = model_record(con, path)
        record_cache(con, cache_record("orders", cache_file, rec))
        spec_file = tmp_path / "specreg.yaml"
        spec_file.write_text(SPEC.format(model_id=rec.model_id, path=path))
        advisor = open_advisor(con, HostFacts(30.0, 2, "user"))
        spec = load_spec(spec_file)[0]
        table = plan_routes(
            con, llama_install, detect_host(), advisor, [], spec=spec, shape=Shape(threads=1)
        )
    json_backend = table.backend(table.route("smollm2", "json").backend)
    flags = json_backend.flags
    assert flags[flags.index("--spec-type") + 1] == "ngram-mod,ngram-cache"
    assert flags[flags.index("--lookup-cache-static") + 1] == str(cache_file)
    notes = [n for n in table.notes if "runs ngram-cache" in n]
    assert len(notes) == 2  # the cache backend and the bare ngram-cache one
    assert any(n.startswith(json_backend.name) and "static lookup cache only" in n for n in notes)
    assert any("drafts almost nothing" in n for n in notes)
