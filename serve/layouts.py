"""Split layouts in `serve`: where a configuration runs at the load a request meets.

`specreg capacity` measures, per configuration (plain decoding, and the best speculative
one), the aggregate decode throughput of one full instance over every core and of the
topology's first split (one instance per NUMA node on a multi-node host, two halves of the
cores on a one-node host: host/topology.py `layouts`) at 1, 2, 4 and 8 concurrent requests.
Where the split's aggregate beat the full instance's, serve also runs that configuration as
replicas, one on each placement of the split, and a request the policy sends to that
configuration at such a load goes to the replica with the fewest requests in flight; at other
loads to the full instance. Without such a measurement on this host nothing changes.

The cores stay the scheduler's (serve.cores): the full instance overlaps every replica and the
replicas are disjoint, so the replicas decode together while the full instance waits, and the
full instance decodes alone; a request on a replica joins only another replica (serve.app
`alternatives`), and one whose replica cannot serve goes to the full instance. Replicas start
when the load first sends them a request and count against the memory budget like any backend.
Their requests are recorded (a run names its replica) but are no evidence for the adaptive
policy, which compares configurations on the full instance; the layout is the capacity curve's
call.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from specreg.host.topology import Placement, split_layout
from specreg.jsonout import fields_of
from specreg.llama.config import Config
from specreg.registry.capacity import CONTEXT_SHORT, LAYOUT_FULL, CapacityCurve
from specreg.serve.loadpolicy import LEVELS, level_of


@dataclass(frozen=True)
class SplitPoint:
    """One concurrency of a capacity measurement: the decode t/s of the split's instances
    together, and of the full instance."""

    concurrency: int
    split_tps: float
    full_tps: float

    @property
    def split_wins(self) -> bool:
        return self.split_tps > self.full_tps

    def to_json(self) -> dict[str, Any]:
        return fields_of(self, split_wins=self.split_wins)


@dataclass(frozen=True)
class SplitEvidence:
    """What `specreg capacity` measured of one configuration (short context) on the full
    instance and on the split, concurrency by concurrency."""

    config_label: str  # as capacity names it (plain, ngram-mod k=16, ...)
    spec_type: str
    k: int | None
    draft_id: str | None
    layout: str  # the split's: node, nodes, half
    measured_at: datetime
    points: tuple[SplitPoint, ...]  # by concurrency

    @property
    def levels(self) -> tuple[int, ...]:
        """The load levels (serve.loadpolicy) whose requests run on the split: those whose
        measured concurrency found the split's aggregate above the full instance's. A level
        above the highest measured follows the highest; one below it that was not measured
        stays on the full instance."""
        by_level = {level_of(p.concurrency): p for p in self.points}  # the highest of a level
        if not by_level:
            return ()
        top = max(by_level)
        wins = []
        for level in LEVELS:
            point = by_level.get(level, by_level[top] if level > top else None)
            if point is not None and point.split_wins:
                wins.append(level)
        return tuple(wins)

    @property
    def why(self) -> str:
        """`specreg capacity of plain (2026-11-20 14:03 UTC, short context): at 4 concurrent
        requests 41.2 t/s in all on the node split against 30.1 on the full instance; ...`."""
        when = self.measured_at.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        wins = "; ".join(
            f"at {p.concurrency} concurrent request{'s' * (p.concurrency != 1)} "
            f"{p.split_tps:.1f} t/s in all on the {self.layout} split against {p.full_tps:.1f} "
            "on the full instance"
            for p in self.points
            if p.split_wins
        )
        return f"specreg capacity of {self.config_label} ({when}, short context): {wins}"

    def runs(self, config: Config, draft_id: str | None) -> bool:
        """Whether a backend of `config` with that draft runs the configuration measured: its
        type, K and draft (a MoE budget or a lookup cache makes another configuration)."""
        c = config
        same = (c.spec_type, c.k, draft_id) == (self.spec_type, self.k, self.draft_id)
        return same and c.experts is None and c.lookup_cache is None

    def to_json(self) -> dict[str, Any]:
        return {
            "config_label": self.config_label,
            "layout": self.layout,
            "context": CONTEXT_SHORT,
            "measured_at": self.measured_at.isoformat(),
            "points": [p.to_json() for p in self.points],
        }


@dataclass(frozen=True)
class Replica:
    """A backend running the full instance `of`'s configuration on one placement of the split."""

    backend: str
    of: str
    placement: Placement
    evidence: SplitEvidence

    @property
    def layout(self) -> str:
        return self.evidence.layout

    @property
    def levels(self) -> tuple[int, ...]:
        return self.evidence.levels

    @property
    def loads(self) -> str:
        """The requests in flight at which it serves: `3 or more`."""
        return loads_str(self.levels)

    def to_json(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "of": self.of,
            "layout": self.layout,
            "placement": self.placement.to_json(),
            "levels": list(self.levels),
            "loads": self.loads,
            "why": self.evidence.why,
            "capacity": self.evidence.to_json(),
        }


def loads_str(levels: Sequence[int]) -> str:
    """Load levels as the requests in flight they hold: (4, 8, 16, 32, 64) -> `3 or more`,
    (4,) -> `3-4`, (1,) -> `1`."""
    low = {level: (LEVELS[i - 1] + 1 if i else 1) for i, level in enumerate(LEVELS)}
    runs: list[list[int]] = []
    for i, level in enumerate(LEVELS):
        if level not in levels:
            continue
        if runs and runs[-1][-1] == LEVELS[i - 1]:
            runs[-1].append(level)
        else:
            runs.append([level])
    parts = []
    for run in runs:
        lo, hi = low[run[0]], run[-1]
        parts.append(f"{lo} or more" if hi == LEVELS[-1] else str(lo) if lo == hi else f"{lo}-{hi}")
    return ", ".join(parts)


# -- reading the capacity curve ---------------------------------------------------------------


def split_evidence(
    curve: CapacityCurve, split: Sequence[Placement]
) -> tuple[list[SplitEvidence], str | None]:
    """Per configuration the curve measured both on the full instance and on `split` (the same
    layout, as many instances), its points; and a note when the curve measured only another
    split (the host's cores changed since), which gives no replicas."""
    layout, instances = split_layout(split), len(split)
    shape = (layout, instances)
    points = [p for p in curve.points if p.context == CONTEXT_SHORT]
    found = []
    for label in dict.fromkeys(p.config_label for p in points):
        mine = [p for p in points if p.config_label == label]
        full = {p.concurrency: p for p in mine if p.layout == LAYOUT_FULL}
        split_at = {p.concurrency: p for p in mine if (p.layout, p.instances) == shape}
        pairs = tuple(
            SplitPoint(c, split_at[c].aggregate_tps, full[c].aggregate_tps)
            for c in sorted(full.keys() & split_at.keys())
        )
        if pairs:
            first = mine[0]
            found.append(SplitEvidence(label, first.spec_type, first.k, first.draft_id, layout,
                                       curve.measured_at, pairs))  # fmt: skip
    other = sorted({(p.layout, p.instances) for p in points if p.layout != LAYOUT_FULL})
    if found or not other:
        return found, None
    was, n = other[0]
    return found, (
        f"specreg capacity measured a {was} split into {n} instances, and this host's cores "
        f"split into {instances} {layout} placements now: no split replicas (run specreg "
        "capacity again)"
    )


# -- serving ----------------------------------------------------------------------------------


class SplitLayouts:
    """Where each request runs: see the module docstring. It counts the requests it placed,
    per configuration, load level and layout, for the status."""

    def __init__(self, replicas: Sequence[Replica]):
        self.replicas_of: dict[str, list[Replica]] = {}  # by the full instance's name
        for r in replicas:
            self.replicas_of.setdefault(r.of, []).append(r)
        self._full_of = {r.backend: r.of for r in replicas}
        self.placed: Counter[tuple[str, int, str]] = Counter()

    def is_replica(self, backend: str) -> bool:
        return backend in self._full_of

    def full_of(self, backend: str) -> str | None:
        """The full instance whose configuration the replica `backend` runs (None: no replica)."""
        return self._full_of.get(backend)

    def layout(self, backend: str, level: int) -> str:
        """The layout `backend`'s configuration runs on at load `level`: full, or its split."""
        mine = self.replicas_of.get(backend)
        return mine[0].layout if mine and level in mine[0].levels else LAYOUT_FULL

    def place(self, backend: str, load: int, in_flight: Mapping[str, int]) -> str:
        """Where a request the policy sent to `backend` at `load` runs: at a level where the
        split wins, the replica with the fewest requests in flight (the first of a tie) among
        the usable ones `in_flight` counts; else `backend` itself."""
        level = level_of(load)
        usable = [r.backend for r in self.replicas_of.get(backend, ()) if r.backend in in_flight]
        layout = self.layout(backend, level) if usable else LAYOUT_FULL
        chosen = min(usable, key=lambda n: in_flight[n]) if layout != LAYOUT_FULL else backend
        self.placed[(backend, level, layout)] += 1
        return chosen

    def annotate(self, task: dict[str, Any]) -> dict[str, Any]:
        """A task's policy status with the layout of its choice, at level 1 and at each level
        it has met."""
        out = {**task, "layout": self.layout(task["choice"], 1)}
        if "levels" in task:
            out["levels"] = [
                {**lv, "layout": self.layout(lv["choice"], lv["level"])} for lv in task["levels"]
            ]
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "replicas": [r.to_json() for rs in self.replicas_of.values() for r in rs],
            "levels": [
                {"backend": of, "level": level, "layout": self.layout(of, level)}
                for of in self.replicas_of
                for level in LEVELS
            ],
            "requests": [
                {"backend": of, "level": level, "layout": layout, "requests": n}
                for (of, level, layout), n in sorted(self.placed.items())
            ],
        }
