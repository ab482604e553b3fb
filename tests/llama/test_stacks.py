"""The stack type: what the pinned llama.cpp accepts as --spec-type, in the order it uses it,
and the one-line refusals quoting the build's own rule."""

from __future__ import annotations

import re

import pytest

from specreg.errors import UsageError
from specreg.host.sources import llama_source_dir
from specreg.llamacpp import NGRAM_CACHE_DRAFT_MAX
from specreg.stacks import K_FLAG, Stack, StackError, parse_stack, reordered, stack_of
from specreg.terms import (
    MODEL_DRAFTER_TYPES,
    SPEC_PRIORITY,
    SPEC_TYPES,
    Method,
)


def test_the_users_stack_is_lookup_first_then_the_draft_model() -> None:
    s = parse_stack("ngram-mod,draft-simple")
    assert s.types == ("ngram-mod", "draft-simple")
    assert s.spelled == "ngram-mod,draft-simple"
    assert s.stacked and s.speculative and s.needs_draft_file
    assert s.model_drafter == "draft-simple"
    assert s.lookups == ("ngram-mod",)
    assert s.method is Method.DRAFT
    assert s.primary == "draft-simple"


def test_any_order_given_is_the_builds_order() -> None:
    s = parse_stack("draft-simple, ngram-cache,ngram-simple")
    assert s.types == ("ngram-simple", "ngram-cache", "draft-simple")
    assert reordered("draft-simple,ngram-cache,ngram-simple", s)
    assert not reordered("ngram-simple,ngram-cache,draft-simple", s)
    assert parse_stack(["draft-simple", "ngram-mod"]) == parse_stack("ngram-mod,draft-simple")


def test_a_repeated_type_counts_once_as_the_builds_bitmask_does() -> None:
    assert parse_stack("ngram-mod,ngram-mod").types == ("ngram-mod",)


def test_single_types_and_plain() -> None:
    assert parse_stack("none") == Stack()
    assert stack_of(None) == Stack() and stack_of("") == Stack()
    assert not Stack().speculative and Stack().spelled == "none" and Stack().method is Method.NONE
    cache = parse_stack("ngram-cache")
    assert cache.uses_lookup_cache and cache.method is Method.NGRAM and not cache.stacked
    assert parse_stack("draft-mtp").method is Method.MTP
    assert parse_stack("ngram-mod").primary == "ngram-mod"
    # ngram-cache has no K of its own; a K given with a stack goes to a type that has one
    assert parse_stack("ngram-cache,ngram-mod").primary == "ngram-mod"


def test_every_n_gram_type_stacks_with_every_model_drafter() -> None:
    for drafter in MODEL_DRAFTER_TYPES:
        s = parse_stack(f"{drafter},ngram-simple,ngram-map-k,ngram-map-k4v,ngram-mod,ngram-cache")
        assert s.types[-1] == drafter and len(s.types) == 6


@pytest.mark.parametrize(
    ("value", "line"),
    [
        (
            "ngram-mod,draft-smple",
            "unknown speculative type 'draft-smple' (llama.cpp: 'unknown speculative type: "
            "draft-smple'): use one of " + ", ".join(SPEC_TYPES),
        ),
        (
            "none,ngram-mod",
            "none cannot be stacked with ngram-mod: llama.cpp reads any list holding none as "
            "none alone (common_speculative_types_from_names), so the others would never run; "
            "drop none or the other types",
        ),
        (
            "draft-eagle3,ngram-mod,draft-simple",
            "draft-simple and draft-eagle3 cannot be stacked: llama.cpp loads one draft model "
            "into one draft context and tries draft-simple first every step, so draft-eagle3 "
            "would never draft (common_speculative_init); keep one model drafter and stack "
            "n-gram types in front of it",
        ),
        ("", "no speculative type given: name one, or a comma list such as ngram-mod,draft-simple"),
    ],
)
def test_invalid_combinations_are_refused_in_one_line(value: str, line: str) -> None:
    with pytest.raises(StackError) as err:
        parse_stack(value)
    assert str(err.value) == line
    assert "\n" not in str(err.value)
    assert isinstance(err.value, UsageError)  # exit 2


def test_mtp_and_a_draft_model_cannot_share_the_one_draft_context() -> None:
    with pytest.raises(StackError, match="draft-simple and draft-mtp cannot be stacked"):
        parse_stack("draft-mtp,draft-simple")


def _source(path: str) -> str:
    return (llama_source_dir() / path).read_text()


def test_the_priority_is_the_pinned_builds() -> None:
    """terms.SPEC_PRIORITY, checked against common_speculative_init in the pinned source."""
    src = _source("common/speculative.cpp")
    init = src[src.index("common_speculative * common_speculative_init(") :]
    init = init[: init.index("std::vector<std::unique_ptr<common_speculative_impl>> impls")]
    order = re.findall(r"add_config_if_enabled\(COMMON_SPECULATIVE_TYPE_(\w+)", init)
    assert tuple(t.lower().replace("_", "-") for t in order) == SPEC_PRIORITY
    # the rules quoted above are the build's own
    assert 'throw std::invalid_argument("unknown speculative type: " + name);' in src
    assert "return std::vector<common_speculative_type> { COMMON_SPECULATIVE_TYPE_NONE };" in src
    assert "uint16_t n_draft = 8; // TODO get from config?" in src
    assert NGRAM_CACHE_DRAFT_MAX == 8
    assert "bool save_static = false;" in src and "bool save_dynamic = false;" in src


def test_k_flags_exist_in_the_builds_arguments() -> None:
    args = _source("common/arg.cpp")
    for spec_type, flag in K_FLAG.items():
        assert spec_type in SPEC_TYPES
        if flag is not None:
            assert f'{{"{flag}"}}' in args, flag
    assert K_FLAG["ngram-cache"] is None
