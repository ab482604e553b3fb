"""llama.cpp's ngram-mod, replayed on the target's own text: what a first-encounter run drafts.

ngram-mod drafts only where the last `n_match` tokens (24 in the pinned build) occurred before
in the context, so whether it drafts at all depends on the text, not on the model: an answer
that copies from its prompt (an edit, a summary that quotes) drafts, an answer to a short
question almost never does. The target's greedy answers to the shipped prompts, kept by
`specreg agree`, are that text; the tokens a fresh server's ngram-mod drafts and accepts on
them follow from the build's rules alone (common/speculative.cpp, common_speculative_impl_
ngram_mod; tools/server/server-context.cpp):

* on a request, every n-gram of the prompt is added (its n_match tokens -> the next one);
* before each draft, the n-grams of the text since the last addition are added once more than
  32 new tokens have piled up;
* a draft looks up the last n_match tokens (the context and the token just sampled), then its
  own continuation, up to `n_max` tokens, and is dropped if it is shorter than `n_min`; the
  server cuts it to the answer's remaining tokens but one;
* the target accepts the leading tokens it agrees with; five drafts in a row with under a
  quarter accepted clear the table (it is refilled from the whole context at the next draft).

Hash collisions of the build's 4M-entry table are left out. Stacked in front of a draft
model (`ngram-mod,draft-simple`), the lookup drafts first and the draft model only where it has
nothing: replayed on the draft's guesses that `agree` kept (`stack_replay`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from specreg.drafttrace import DraftTrace
from specreg.llamacpp import NGRAM_PARAMS

# The pinned build's ngram-mod (common/common.h, common_params_speculative_ngram_mod).
_NGRAM_MOD = NGRAM_PARAMS["ngram-mod"]
N_MATCH_DEFAULT = _NGRAM_MOD["n_match"].default
# What a stack's ngram-mod drafts with: its K flags go to its primary type.
N_MAX_DEFAULT = _NGRAM_MOD["n_max"].default
N_MIN_DEFAULT = _NGRAM_MOD["n_min"].default
ADD_EVERY = 32  # new tokens before the n-grams since the last addition are added
LOW_ACCEPTANCE = 0.25
LOW_STREAK = 5


@dataclass(frozen=True)
class LookupSteps:
    """A replay's totals over one or more answers."""

    steps: int  # verifications (one per generated token or accepted run), the first excepted
    drafting: int  # steps that drafted
    drafted: int
    accepted: int

    def __add__(self, other: LookupSteps) -> LookupSteps:
        return LookupSteps(
            self.steps + other.steps,
            self.drafting + other.drafting,
            self.drafted + other.drafted,
            self.accepted + other.accepted,
        )

    @property
    def draft_rate(self) -> float:
        """The share of steps that drafted."""
        return self.drafting / self.steps if self.steps else 0.0

    @property
    def tokens_per_drafting_step(self) -> float:
        """Tokens a drafting step yields: the accepted ones and the target's own."""
        return 1.0 + self.accepted / self.drafting if self.drafting else 1.0


NO_STEPS = LookupSteps(0, 0, 0, 0)


class _NgramMod:
    """The build's ngram-mod state for one request (the table is a dict: no collisions)."""

    def __init__(self, prompt: Sequence[int], n_max: int, n_min: int, n_match: int) -> None:
        self.n_max, self.n_min, self.n = n_max, n_min, n_match
        self.table: dict[tuple[int, ...], int] = {}
        self.i_last = self.low = 0
        if len(prompt) >= n_match:
            self._add(prompt, len(prompt) - n_match, 0)
            self.i_last = len(prompt) - n_match

    def _add(self, text: Sequence[int], upto: int, start: int) -> None:
        for i in range(start, upto):  # the n-grams starting in [start, upto)
            self.table[tuple(text[i : i + self.n])] = text[i + self.n]

    def draft(self, text: Sequence[int], room: int) -> list[int]:
        """The draft after `text` (the context and the token just sampled), cut to `room`."""
        context = len(text) - 1  # what the server hands the drafter: all but the last sampled
        if context < self.n:
            return []
        if self.i_last + ADD_EVERY < context:
            self._add(text, context - self.n, self.i_last)
            self.i_last = context - self.n
        window, out = list(text[-self.n :]), []
        for _ in range(self.n_max):
            token = self.table.get(tuple(window[-self.n :]))
            if token is None:
                break
            out.append(token)
            window.append(token)
        return out[:room] if len(out) >= self.n_min else []

    def accept(self, ok: int, drafted: int) -> None:
        self.low = self.low + 1 if ok / drafted < LOW_ACCEPTANCE else 0
        if self.low >= LOW_STREAK:  # the table is cleared, refilled at the next draft
            self.table.clear()
            self.i_last, self.low = 0, 0


def _leading(draft: Sequence[int], answer: Sequence[int], j: int) -> int:
    ok = 0
    while ok < len(draft) and draft[ok] == answer[j + ok]:
        ok += 1
    return ok


def ngram_mod_replay(
    prompt: Sequence[int],
    answer: Sequence[int],
    *,
    n_max: int,
    n_min: int,
    n_match: int = N_MATCH_DEFAULT,
) -> LookupSteps:
    """What a fresh llama-server's ngram-mod drafts and accepts while the target generates
    `answer` after `prompt` (token ids, the prompt as the server tokenized it)."""
    got = stack_replay(prompt, answer, None, n_max=n_max, n_min=n_min, k=0, n_match=n_match)
    return got.lookup


@dataclass(frozen=True)
class StackSteps:
    """ngram-mod stacked in front of a draft model: the lookup's steps, and the draft model's
    (on every step the lookup had nothing for)."""

    lookup: LookupSteps
    model: LookupSteps

    def __add__(self, other: StackSteps) -> StackSteps:
        return StackSteps(self.lookup + other.lookup, self.model + other.model)

    @property
    def tokens_per_step(self) -> float:
        steps = self.lookup.steps
        return 1.0 + (self.lookup.accepted + self.model.accepted) / steps if steps else 1.0

    @property
    def lookup_share(self) -> float:
        """The share of steps the lookup drafted (the draft model drafted none there)."""
        return self.lookup.draft_rate


NO_STACK = StackSteps(NO_STEPS, NO_STEPS)


def stack_replay(
    prompt: Sequence[int],
    answer: Sequence[int],
    guesses: DraftTrace | None,
    *,
    n_max: int,
    n_min: int,
    k: int,
    n_match: int = N_MATCH_DEFAULT,
) -> StackSteps:
    """ngram-mod first at every step and, where it has nothing, greedy draft-simple at K on
    the draft's `guesses` at the answer's tokens (`specreg agree`'s trace; None: no draft
    model), replayed while the target generates `answer` after `prompt`."""
    lookup = _NgramMod(prompt, n_max, n_min, n_match)
    text = [*prompt, *answer[:1]]  # the first answer token comes from the prompt's pass
    steps = [0, 0, 0, 0]  # all steps; lookup drafting, drafted, accepted
    model = [0, 0, 0]  # draft-model drafting, drafted, accepted
    j = 1
    while j < len(answer):
        room = max(len(answer) - j - 1, 0)  # n_remaining - 1
        draft = lookup.draft(text, room)
        steps[0] += 1
        if draft:
            ok = _leading(draft, answer, j)
            steps[1], steps[2], steps[3] = steps[1] + 1, steps[2] + len(draft), steps[3] + ok
            lookup.accept(ok, len(draft))
        else:
            length, ok = guesses.draft_at(j, k, room) if guesses is not None else (0, 0)
            if length:
                model[0], model[1], model[2] = model[0] + 1, model[1] + length, model[2] + ok
        text.extend(answer[j : j + ok + 1])
        j += ok + 1
    return StackSteps(
        LookupSteps(steps[0], steps[1], steps[2], steps[3]),
        LookupSteps(steps[0], model[0], model[1], model[2]),
    )
