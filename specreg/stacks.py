"""A speculative stack: the llama.cpp types one configuration enables, and the build's rules.

llama-server takes `--spec-type` as a comma list (`common/arg.cpp`), and `common_speculative_init`
(`common/speculative.cpp`) builds one implementation per enabled type and, at every step, asks
them in a fixed priority (`terms.SPEC_PRIORITY`: the n-gram types, then the model drafter) until
one drafts: "prompt lookup first, the draft model as fallback". A `Stack` is that list in the
order the build uses it. `parse_stack` accepts what the build accepts and refuses, in one line
quoting the build's rule, what it would reject or silently ignore:

- an unknown name: `common_speculative_types_from_names` throws "unknown speculative type: X";
- `none` next to other types: the same function returns `{none}` for any list holding it, so
  the other types would never run;
- two model drafters: the build loads one draft model into one draft context
  (`common_speculative_init_result`), and the first model drafter in priority drafts every step,
  so a second could never draft (and EAGLE-3/DFlash constructors reject a plain draft model).

A repeated type is dropped, as the build's bitmask (`common_get_enabled_speculative_configs`)
does. This module knows no paths and no processes: the runner turns a stack into flags, the
recommender into candidates, specreg.yaml into a pinned configuration.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from specreg.errors import UsageError

# Each type's K flag and default are the build's (specreg.llamacpp); importable from here too.
from specreg.llamacpp import K_DEFAULT as K_DEFAULT
from specreg.llamacpp import K_FLAG as K_FLAG
from specreg.terms import (
    DRAFT_MODEL_TYPES,
    METHOD_OF,
    MODEL_DRAFTER_TYPES,
    NGRAM_TYPES,
    SPEC_NONE,
    SPEC_PRIORITY,
    SPEC_TYPES,
    Method,
)

NGRAM_CACHE = "ngram-cache"


class StackError(UsageError):
    """A list of speculative types that the pinned llama.cpp would reject or half-ignore."""


@dataclass(frozen=True)
class Stack:
    """The speculative types of one configuration, in the order llama.cpp tries them."""

    types: tuple[str, ...] = ()  # never holds `none`; empty means plain decoding

    @property
    def spelled(self) -> str:
        """llama.cpp's `--spec-type` value: the types in priority order, or `none`."""
        return ",".join(self.types) or SPEC_NONE

    @property
    def speculative(self) -> bool:
        return bool(self.types)

    @property
    def stacked(self) -> bool:
        """More than one type: per-type statistics say which one drafted what."""
        return len(self.types) > 1

    @property
    def model_drafter(self) -> str | None:
        """The one type drafting with a model (a draft file or the target's MTP heads)."""
        return next((t for t in self.types if t in MODEL_DRAFTER_TYPES), None)

    @property
    def ngram_types(self) -> tuple[str, ...]:
        return tuple(t for t in self.types if t in NGRAM_TYPES)

    @property
    def needs_draft_file(self) -> bool:
        """A separate draft GGUF (`-md`) is needed: a draft-* type is in the stack."""
        return any(t in DRAFT_MODEL_TYPES for t in self.types)

    @property
    def uses_lookup_cache(self) -> bool:
        """ngram-cache is in the stack: the one type that reads `--lookup-cache-static`."""
        return NGRAM_CACHE in self.types

    @property
    def method(self) -> Method:
        """The method that carries the stack's cost: its model drafter's, else n-gram lookup."""
        if not self.types:
            return Method.NONE
        drafter = self.model_drafter
        return METHOD_OF[drafter] if drafter else Method.NGRAM

    @property
    def primary(self) -> str:
        """The type a single K applies to: the model drafter, else the first n-gram type with
        a K of its own, else the first type (`none` when plain)."""
        if self.model_drafter:
            return self.model_drafter
        with_k = [t for t in self.types if K_FLAG.get(t)]
        return (with_k or list(self.types) or [SPEC_NONE])[0]

    @property
    def lookups(self) -> tuple[str, ...]:
        """The types tried before the model drafter (all of them when there is none)."""
        return tuple(t for t in self.types if t not in MODEL_DRAFTER_TYPES)

    def has(self, spec_type: str) -> bool:
        return spec_type in self.types

    def __str__(self) -> str:
        return self.spelled


def _names(value: str | Sequence[str]) -> list[str]:
    items = value.split(",") if isinstance(value, str) else [str(v) for v in value]
    return [t.strip() for t in items if t.strip()]


def parse_stack(value: str | Sequence[str]) -> Stack:
    """The stack of a `--spec-type` value (`ngram-mod,draft-simple`) or a list of type names.

    Raises `StackError` (one line, with the build's rule) for what the pinned llama.cpp would
    reject or silently ignore.
    """
    names = _names(value)
    if not names:
        raise StackError(
            "no speculative type given: name one, or a comma list such as ngram-mod,draft-simple"
        )
    for name in names:
        if name not in SPEC_TYPES:
            raise StackError(
                f"unknown speculative type {name!r} (llama.cpp: 'unknown speculative type: "
                f"{name}'): use one of {', '.join(SPEC_TYPES)}"
            )
    if SPEC_NONE in names:
        if set(names) == {SPEC_NONE}:
            return Stack()
        others = ",".join(dict.fromkeys(n for n in names if n != SPEC_NONE))
        raise StackError(
            f"none cannot be stacked with {others}: llama.cpp reads any list holding none as "
            "none alone (common_speculative_types_from_names), so the others would never run; "
            "drop none or the other types"
        )
    ordered = tuple(t for t in SPEC_PRIORITY if t in names)
    drafters = [t for t in ordered if t in MODEL_DRAFTER_TYPES]
    if len(drafters) > 1:
        first, second = drafters[0], drafters[1]
        raise StackError(
            f"{first} and {second} cannot be stacked: llama.cpp loads one draft model into one "
            f"draft context and tries {first} first every step, so {second} would never draft "
            "(common_speculative_init); keep one model drafter and stack n-gram types in front "
            "of it"
        )
    return Stack(ordered)


def stack_of(spec_type: str | None) -> Stack:
    """The stack of a recorded or configured `spec_type` (a type or a comma list), unchecked
    beyond what `parse_stack` checks; `None` or empty is plain decoding."""
    if not spec_type:
        return Stack()
    return parse_stack(spec_type)


def reordered(value: str | Sequence[str], stack: Stack) -> bool:
    """Whether `value` listed the stack's types in another order than llama.cpp tries them."""
    given = [n for n in dict.fromkeys(_names(value)) if n != SPEC_NONE]
    return tuple(given) != stack.types
