"""specreg.yaml pins stacks and lookup caches: a comma list or a YAML list, kept in the order
llama.cpp tries the types, refused with the build's rule and the file's line when it would not
run as written."""

from __future__ import annotations

from pathlib import Path

import pytest

from specreg.declare.spec import SpecFileError, load_spec
from specreg.samples.small_models import SmallModels

from support.declare import smollm2_spec
from support.lookup_cache import cache_record, write_cache

SPEC = """\
version: 1
models:
  08ec9e1ab3e664d7:
    aliases: [coder30]
  b293b27200927914:
    aliases: [coder-draft]
roles:
  coder:
    target: coder30
    configs:
      default:
        spec_type: {spec_type}
        draft: coder-draft
      json:
        spec_type: ngram-cache
        lookup_cache: json-records
"""


def load(tmp_path: Path, spec_type: str, *, extra: str = "") -> tuple[str, ...]:
    path = tmp_path / "specreg.yaml"
    path.write_text(SPEC.format(spec_type=spec_type) + extra)
    return load_spec(path)[0].roles[0].configs[0].spec_types


def error(tmp_path: Path, spec_type: str, *, replace: tuple[str, str] = ("", "")) -> str:
    path = tmp_path / "specreg.yaml"
    path.write_text(SPEC.format(spec_type=spec_type).replace(*replace))
    with pytest.raises(SpecFileError) as err:
        load_spec(path)
    return str(err.value)


def test_a_stack_in_llama_cpps_spelling_or_as_a_list(tmp_path: Path) -> None:
    assert load(tmp_path, "ngram-mod,draft-simple") == ("ngram-mod", "draft-simple")
    assert load(tmp_path, "[draft-simple, ngram-mod]") == ("ngram-mod", "draft-simple")
    assert load(tmp_path, "draft-simple") == ("draft-simple",)


def test_the_lookup_cache_is_pinned_by_name(tmp_path: Path) -> None:
    path = tmp_path / "specreg.yaml"
    path.write_text(SPEC.format(spec_type="draft-simple"))
    json_cfg = load_spec(path)[0].roles[0].configs[1]
    assert json_cfg.spec_types == ("ngram-cache",) and json_cfg.lookup_cache == "json-records"


def test_combinations_the_build_would_not_run_are_refused_at_their_line(tmp_path: Path) -> None:
    at = f"{tmp_path / 'specreg.yaml'}:12: roles.coder.configs.default.spec_type: "
    assert error(tmp_path, "draft-simple,draft-eagle3") == (
        at + "draft-simple and draft-eagle3 cannot be stacked: llama.cpp loads one draft model "
        "into one draft context and tries draft-simple first every step, so draft-eagle3 would "
        "never draft (common_speculative_init); keep one model drafter and stack n-gram types "
        "in front of it"
    )
    assert error(tmp_path, "[none, draft-simple]").startswith(
        at + "none cannot be stacked with draft-simple: llama.cpp reads any list holding none"
    )
    assert error(tmp_path, "ngram-mod,draft-smple").startswith(
        at + "unknown speculative type 'draft-smple' (llama.cpp: 'unknown speculative type: "
    )


def test_a_lookup_cache_needs_ngram_cache(tmp_path: Path) -> None:
    line = error(
        tmp_path, "draft-simple", replace=("spec_type: ngram-cache", "spec_type: ngram-mod")
    )
    assert line == (
        f"{tmp_path / 'specreg.yaml'}:16: roles.coder.configs.json.lookup_cache: a lookup cache "
        "is read by ngram-cache only: add ngram-cache to spec_type (got ngram-mod)"
    )


EXPORT_SPEC = smollm2_spec(
    """\
      json:
        spec_type: ngram-cache,ngram-mod
        lookup_cache: orders
""",
    llama="llama:\n  dialect: current\n  threads: 1\n",
)


def test_export_renders_the_stack_and_the_cache_with_their_origins(
    tmp_path: Path, specreg_home: Path, small_models: SmallModels
) -> None:
    from specreg.declare.launch import build
    from specreg.registry.db import opened
    from specreg.registry.lookup_caches import record_cache
    from specreg.registry.scan import model_record

    path = small_models.smollm2.path
    cache_file = write_cache(tmp_path / "orders.lcs", [([1, 2], [(3, 2)])])
    spec_file = tmp_path / "specreg.yaml"
    with opened(specreg_home / "registry.duckdb") as con:
        rec = model_record(con, path)
        cache = cache_record("orders", cache_file, rec)
        record_cache(con, cache)
        spec_file.write_text(EXPORT_SPEC.format(model_id=rec.model_id, path=path))
        plan = build(con, load_spec(spec_file)[0], port=None)
        (launch,) = plan.launches
        argv = launch.argv
        assert argv[argv.index("--spec-type") + 1] == "ngram-mod,ngram-cache"
        assert argv[argv.index("--lookup-cache-static") + 1] == str(cache_file)
        origin = next(f.origin for f in launch.flags if f.flag == "--lookup-cache-static")
        assert origin.startswith("roles.assistant.configs.json.lookup_cache (specreg.yaml:")
        assert origin.endswith("-> registry lookup cache orders (test:orders, json)")
        # a cache that would make llama-server abort is not exported
        cache_file.write_bytes(cache_file.read_bytes()[:-4])
        plan = build(con, load_spec(spec_file)[0], port=None)
    assert not plan.launches
    assert plan.skipped[0].reason.startswith(
        f"lookup_cache: lookup cache {cache_file} is truncated"
    )
