"""Per-type statistics of a speculative stack, as llama.cpp reports them.

With several types enabled, llama-server's `draft_n`/`draft_n_accepted` are the stack's totals.
Which type drafted what is in `common_speculative_print_stats` (common/speculative.cpp), one
line per enabled type each time a request finishes (`server_slot::print_timings`, before the
response is sent), counting since the server started:

    spec common_specu: statistics     draft-simple: #calls(b,g,a) =    2     21     21,
        #gen drafts =     21, #acc drafts =    17, #gen tokens =     61, #acc tokens =    38, ...

The lines are logged at trace level (LOG_TRC, verbosity 4), so a stacked configuration's server
runs with `-lv 4`. llama-speculative-simple prints the same lines when it finishes. A request's
own figures are the difference between its lines and the previous request's.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from typing import Any

# The verbosity at which llama.cpp logs the per-type lines (LOG_LEVEL_TRACE, common/log.h).
STATS_VERBOSITY = 4
_LINE = re.compile(
    r"statistics\s+(?P<type>[a-z0-9-]+): #calls\(b,g,a\) =\s*(?P<begins>\d+)"
    r"\s+(?P<draft_calls>\d+)\s+(?P<accepts>\d+), #gen drafts =\s*(?P<drafts>\d+), "
    r"#acc drafts =\s*(?P<drafts_accepted>\d+), #gen tokens =\s*(?P<drafted>\d+), "
    r"#acc tokens =\s*(?P<accepted>\d+)"
)


@dataclass(frozen=True)
class TypeFigures:
    """What one speculative type of a stack did: llama.cpp's counters for it."""

    begins: int = 0  # requests started
    draft_calls: int = 0  # steps it was asked for a draft
    accepts: int = 0  # verifications of its drafts
    drafts: int = 0  # drafts it produced
    drafts_accepted: int = 0  # of those, drafts with at least one token accepted
    drafted: int = 0  # tokens drafted
    accepted: int = 0  # tokens accepted

    def __add__(self, other: TypeFigures) -> TypeFigures:
        return TypeFigures(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(self)))

    def __sub__(self, other: TypeFigures) -> TypeFigures:
        return TypeFigures(*(getattr(self, f.name) - getattr(other, f.name) for f in fields(self)))

    @property
    def acceptance(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(self)}
        acc = self.acceptance
        out["acceptance"] = None if acc is None else round(acc, 4)
        return out

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> TypeFigures:
        return cls(**{f.name: int(doc.get(f.name) or 0) for f in fields(cls)})


def cumulative(log_text: str) -> dict[str, list[TypeFigures]]:
    """Per type, its counters after each finished request, in order."""
    out: dict[str, list[TypeFigures]] = {}
    for m in _LINE.finditer(log_text):
        values = {k: int(v) for k, v in m.groupdict().items() if k != "type"}
        out.setdefault(m["type"], []).append(TypeFigures(**values))
    return out


def finished(log_text: str) -> int:
    """How many requests have printed their per-type lines."""
    counts = [len(v) for v in cumulative(log_text).values()]
    return min(counts) if counts else 0


def request_figures(log_text: str, index: int) -> dict[str, TypeFigures]:
    """Per type, what the `index`-th finished request (0: the first) did on its own."""
    out = {}
    for spec_type, seen in cumulative(log_text).items():
        if index < len(seen):
            before = seen[index - 1] if index > 0 else TypeFigures()
            out[spec_type] = seen[index] - before
    return out


def total(per_sample: Iterable[Mapping[str, TypeFigures]]) -> dict[str, TypeFigures]:
    """Per type, the sum over samples (types in the order first seen)."""
    out: dict[str, TypeFigures] = {}
    for sample in per_sample:
        for spec_type, f in sample.items():
            out[spec_type] = out.get(spec_type, TypeFigures()) + f
    return out


def to_json(figures: Mapping[str, TypeFigures]) -> dict[str, dict[str, Any]] | None:
    return {t: f.to_json() for t, f in figures.items()} or None
