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

Hash collisions of the build's 4M-entry table are left out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# The pinned build's ngram-mod (common/common.h, common_params_speculative_ngram_mod).
N_MATCH_DEFAULT = 24
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
    table: dict[tuple[int, ...], int] = {}
    text = list(prompt)

    def add(upto: int, start: int) -> None:  # the n-grams starting in [start, upto)
        for i in range(start, upto):
            table[tuple(text[i : i + n_match])] = text[i + n_match]

    i_last = 0
    if len(text) >= n_match:
        add(len(text) - n_match, 0)
        i_last = len(text) - n_match
    text.extend(answer[:1])  # the first answer token comes from the prompt's pass
    steps = drafting = drafted = accepted = low = 0
    j = 1
    while j < len(answer):
        context = len(text) - 1  # what the server hands the drafter: all but the last sampled
        draft: list[int] = []
        if context >= n_match:
            if i_last + ADD_EVERY < context:
                add(context - n_match, i_last)
                i_last = context - n_match
            window = text[-n_match:]
            for _ in range(n_max):
                token = table.get(tuple(window[-n_match:]))
                if token is None:
                    break
                draft.append(token)
                window.append(token)
            if len(draft) < n_min:
                draft = []
            draft = draft[: max(len(answer) - j - 1, 0)]  # n_remaining - 1
        ok = 0
        while ok < len(draft) and draft[ok] == answer[j + ok]:
            ok += 1
        steps += 1
        if draft:
            drafting, drafted, accepted = drafting + 1, drafted + len(draft), accepted + ok
            low = low + 1 if ok / len(draft) < LOW_ACCEPTANCE else 0
            if low >= LOW_STREAK:
                table.clear()
                i_last, low = 0, 0
        text.extend(answer[j : j + ok + 1])
        j += ok + 1
    return LookupSteps(steps, drafting, drafted, accepted)
