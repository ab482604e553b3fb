"""A draft's guesses at the tokens of a target's answer: what `specreg agree` keeps.

Written by `llama.logits.compare` (saved logits) and `quality.drafting` (llama-server), read
by `recommender.acceptance.replay`; a part below all three.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class DraftTrace:
    """The draft's greedy guess at each token of one answer, in order: whether its top token
    is the target's, and its own probability of that top token. Drafting at temperature 0 is
    a function of these alone (`recommender.acceptance.replay`): the tokens a verification
    accepts follow the runs of agreement, not just their share."""

    same: tuple[bool, ...]
    top_p: tuple[float, ...]
    start: int = 0  # the answer token of the first guess (saved logits leave token 0 out)

    @property
    def drafted(self) -> slice:
        """The guesses at tokens the build drafts: every one but the answer's first, which
        the prompt's pass produces."""
        return slice(max(1 - self.start, 0), None)

    @property
    def answer_len(self) -> int:
        return self.start + len(self.same)

    def draft_at(
        self, j: int, k: int, room: int, p_min: float = 0.0, n_min: int = 0
    ) -> tuple[int, int]:
        """(drafted, accepted) of greedy draft-simple verifying at answer token j, by the
        build's rules (common/speculative.cpp): up to `k` guesses and no more than `room`,
        stopping before one the draft is less sure of than `p_min` (or one not known); a
        draft shorter than `n_min` is dropped; the leading guesses that agree are accepted."""
        length, at = 0, j - self.start
        while (
            length < min(k, room)
            and 0 <= at + length < len(self.same)
            and self.top_p[at + length] >= p_min
        ):
            length += 1
        if length < n_min:
            return 0, 0
        ok = 0
        while ok < length and self.same[at + ok]:
            ok += 1
        return length, ok

    def to_json(self) -> dict[str, Any]:
        return {
            "same": "".join("1" if x else "0" for x in self.same),
            "top_p": [round(float(p), 3) for p in self.top_p],
            "start": self.start,
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> DraftTrace:
        same = tuple(c == "1" for c in str(doc["same"]))
        top_p = tuple(float(p) for p in doc.get("top_p") or [1.0] * len(same))
        if len(top_p) != len(same):
            raise ValueError(f"a draft trace of {len(same)} tokens with {len(top_p)} top_p")
        return cls(same, top_p, int(doc.get("start", 0)))
