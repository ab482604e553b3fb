"""`specreg sweep`: the exhaustive comparison, every point of a grid measured for real.

The grid is written as axes, each `AXIS=VALUE,VALUE,...`, separated by spaces or `;` (one
`--grid` option may hold several, and `--grid` may be repeated):

    spec=none,ngram-mod,draft-simple k=2,4,8 draft=smollm2-q8,smollm2-q4 experts=2,4

- `spec`: speculative types; a stack is written with `+` (`ngram-mod+draft-simple`), since `,`
  separates values. `none` is plain decoding.
- `k`: draft lengths: integers, or a range `A..B` (step 1) / `A..B:S` (step S), inclusive.
- `draft`: draft models (a path, an id prefix or a name), for the types that need a draft file.
- `experts`: MoE experts used per token.

Points are the cross product, less what would repeat a measurement: plain decoding ignores `k`
and `draft`, n-gram types and MTP ignore `draft`, a type without a K in llama-server
(ngram-cache) ignores `k`. Plain decoding is always measured (a speedup needs it), once per host:
on Ray it runs on every host that takes part, first, so every point's speedup is against plain
decoding on the host that measured it.

A point becomes a `Job`: everything one measurement needs, models named by registry id and path,
so any host can run it (`run_job`), resolving the models in its own registry (scanning the same
path if it has not seen the model yet). The caller records each run as `running` before it
starts and completes it with the host's record (runner/distributed.py for Ray, `LocalHost`
here): a host never writes the caller's registry.
"""

from __future__ import annotations

import logging
import re
import statistics
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import duckdb

from specreg.errors import UsageError
from specreg.llama.config import Config
from specreg.registry.queries import ModelRecord
from specreg.registry.run_store import STATUS_OK, get_run, new_run_uuid
from specreg.runner.runs import Registry, RunLog, model_file, registry_at
from specreg.runner.settings import DEFAULTS, Settings
from specreg.runner.workload import Prompts, Workload
from specreg.stacks import K_FLAG, parse_stack
from specreg.terms import SPEC_DRAFT_SIMPLE, SPEC_NONE
from specreg.tune.distributed import LOCAL, Cluster
from specreg.tune.jobs import Hosts, Job, OnRun, Outcome

if TYPE_CHECKING:
    from specreg.host.load import LoadPolicy

log = logging.getLogger(__name__)

AXES = ("spec", "k", "draft", "experts")
GRID_EXAMPLE = "--grid 'spec=none,ngram-mod,draft-simple k=2,4 draft=MODEL'"
_RANGE = re.compile(r"^(\d+)\.\.(\d+)(?::(\d+))?$")


# -- the grid ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Grid:
    """The axes of a sweep as written (drafts as the user named them)."""

    spec_types: tuple[str, ...]  # stacks as llama.cpp spells them (comma list, its order)
    ks: tuple[int | None, ...] = (None,)  # None: the build's default K
    drafts: tuple[str, ...] = ()
    experts: tuple[int | None, ...] = (None,)

    @property
    def text(self) -> str:
        """The grid written back in its own syntax."""
        parts = ["spec=" + ",".join(s.replace(",", "+") for s in self.spec_types)]
        if self.ks != (None,):
            parts.append("k=" + ",".join(str(k) for k in self.ks))
        if self.drafts:
            parts.append("draft=" + ",".join(self.drafts))
        if self.experts != (None,):
            parts.append("experts=" + ",".join(str(e) for e in self.experts))
        return " ".join(parts)


def _ints(axis: str, values: list[str]) -> tuple[int, ...]:
    out: list[int] = []
    for value in values:
        found = _RANGE.match(value)
        if found:
            lo, hi, step = int(found[1]), int(found[2]), int(found[3] or 1)
            if lo > hi or step < 1:
                raise UsageError(f"grid {axis}={value}: a range is LOW..HIGH or LOW..HIGH:STEP")
            out += range(lo, hi + 1, step)
        elif value.isdigit() and int(value) >= 1:
            out.append(int(value))
        else:
            raise UsageError(
                f"grid {axis}={value}: give whole numbers of at least 1, or a range such as 2..8"
            )
    return tuple(dict.fromkeys(out))


def parse_grid(specs: Sequence[str]) -> Grid:
    """The grid of one or more `--grid` values (see the module's docstring for the syntax)."""
    axes: dict[str, list[str]] = {}
    for spec in specs:
        for item in re.split(r"[\s;]+", spec.strip()):
            if not item:
                continue
            name, eq, values = item.partition("=")
            name = name.strip().lower()
            if not eq or name not in AXES:
                raise UsageError(
                    f"grid term {item!r}: write AXIS=VALUE,VALUE with AXIS one of "
                    f"{', '.join(AXES)} ({GRID_EXAMPLE})"
                )
            if name in axes:
                raise UsageError(f"grid axis {name} is given twice: list all its values once")
            listed = [v.strip() for v in values.split(",") if v.strip()]
            if not listed:
                raise UsageError(f"grid axis {name} has no values ({GRID_EXAMPLE})")
            axes[name] = listed
    drafts = tuple(dict.fromkeys(axes.get("draft", [])))
    if "spec" not in axes:
        if not drafts:
            raise UsageError(f"the grid names no speculative type: add spec=... ({GRID_EXAMPLE})")
        axes["spec"] = [SPEC_DRAFT_SIMPLE]
    spec_types = tuple(dict.fromkeys(parse_stack(s.split("+")).spelled for s in axes["spec"]))
    return Grid(
        spec_types=spec_types,
        ks=_ints("k", axes["k"]) if "k" in axes else (None,),
        drafts=drafts,
        experts=_ints("experts", axes["experts"]) if "experts" in axes else (None,),
    )


@dataclass(frozen=True)
class Point:
    """One configuration of the sweep; `draft` for the types that read a draft file."""

    config: Config
    draft: ModelRecord | None = None

    @property
    def plain(self) -> bool:
        return not self.config.speculative and self.config.experts is None

    @property
    def label(self) -> str:
        draft = f" draft={Path(self.draft.path).name}" if self.draft is not None else ""
        return f"{self.config.label}{draft}"


def grid_points(grid: Grid, drafts: Sequence[ModelRecord], base: Config) -> tuple[Point, ...]:
    """The grid's points, plain decoding first; what would repeat a measurement is left out."""
    points: list[Point] = [Point(base.with_(spec_type=SPEC_NONE))]
    for experts in grid.experts:
        for spec_type in grid.spec_types:
            stack = parse_stack(spec_type)
            if not stack.speculative:
                points.append(Point(base.with_(spec_type=SPEC_NONE, experts=experts)))
                continue
            ks = grid.ks if K_FLAG.get(stack.primary) else (None,)
            if stack.needs_draft_file and not drafts:
                raise UsageError(
                    f"spec={spec_type.replace(',', '+')} needs a draft model: add draft=MODEL "
                    "to the grid"
                )
            for draft in drafts if stack.needs_draft_file else (None,):
                for k in ks:
                    config = base.with_(spec_type=stack.spelled, k=k, experts=experts)
                    points.append(Point(config, draft))
    return tuple(dict.fromkeys(points))


# -- the sweep --------------------------------------------------------------------------------


@dataclass(frozen=True)
class SweepRun:
    """One recorded run of the sweep, with its speedup over plain decoding on its host."""

    label: str
    run_id: int
    run_uuid: str
    host_name: str | None
    host_fingerprint: str | None
    status: str
    error_kind: str | None
    error: str | None
    tokens_per_s: float | None
    acceptance: float | None
    speedup: float | None  # over this sweep's plain run on the same host
    attempt: int = 1
    retry_of: str | None = None

    def to_json(self) -> dict[str, Any]:
        from specreg.jsonout import plain

        return dict(plain(self))


@dataclass(frozen=True)
class SweepHost:
    name: str | None
    fingerprint: str | None
    runs: int
    failed: int
    dropped: str | None = None  # why the sweep stopped sending this host jobs


@dataclass(frozen=True)
class SweepResult:
    JSON_KIND = "sweep"
    JSON_VERSION = "1"

    target_name: str
    target_id: str
    grid: str
    n_points: int
    runs: tuple[SweepRun, ...]
    not_run: tuple[str, ...]  # labels of points no host could run
    hosts: tuple[SweepHost, ...]
    seconds: float
    ray_address: str | None = None

    @property
    def ok(self) -> bool:
        """Every point has a successful run."""
        done = {r.label for r in self.runs if r.status == STATUS_OK}
        return not self.not_run and all(r.label in done for r in self.runs)

    def best(self) -> dict[str | None, SweepRun]:
        """The fastest successful run per host fingerprint."""
        out: dict[str | None, SweepRun] = {}
        for r in self.runs:
            if r.status != STATUS_OK or r.tokens_per_s is None:
                continue
            held = out.get(r.host_fingerprint)
            if held is None or (held.tokens_per_s or 0) < r.tokens_per_s:
                out[r.host_fingerprint] = r
        return out

    def to_json(self) -> dict[str, Any]:
        from specreg.jsonout import document

        payload = {
            "target": self.target_name,
            "target_id": self.target_id,
            "grid": self.grid,
            "n_points": self.n_points,
            "ok": self.ok,
            "runs": self.runs,
            "not_run": list(self.not_run),
            "hosts": self.hosts,
            "best": [
                {
                    "host_fingerprint": fp,
                    "label": r.label,
                    "run_id": r.run_id,
                    "tokens_per_s": r.tokens_per_s,
                    "speedup": r.speedup,
                }
                for fp, r in self.best().items()
            ],  # fmt: skip
            "seconds": self.seconds,
            "ray_address": self.ray_address,
        }
        return document(self.JSON_KIND, self.JSON_VERSION, payload)


@dataclass(frozen=True)
class SweepPlan:
    """A sweep resolved and checked before anything runs."""

    target: ModelRecord
    target_path: Path
    grid: Grid
    points: tuple[Point, ...]
    workload: Workload
    task: str | None
    settings: Settings = DEFAULTS
    notes: tuple[str, ...] = ()

    JSON_KIND = "sweep-plan"
    JSON_VERSION = "1"

    def to_json(self) -> dict[str, Any]:
        from specreg.jsonout import document

        payload = {
            "target": self.target.display_name,
            "target_id": self.target.model_id,
            "grid": self.grid.text,
            "points": [
                {
                    "label": pt.label,
                    "config": pt.config.to_json(),
                    "draft_id": pt.draft.model_id if pt.draft else None,
                }
                for pt in self.points
            ],  # fmt: skip
            "prompts": [pr.prompt_id for pr in self.workload.prompts],
            "n_predict": self.settings.n_predict,
            "repeats": self.settings.repeats,
        }
        return document(self.JSON_KIND, self.JSON_VERSION, payload)

    def jobs(self, host_names: Sequence[str]) -> list[Job]:
        """One job per point; plain decoding once per host (pinned) when there are several."""
        out = []
        for point in self.points:
            job = Job(
                run_uuid=new_run_uuid(),
                label=point.label,
                config=point.config,
                target_id=self.target.model_id,
                target_path=str(self.target_path),
                draft_id=point.draft.model_id if point.draft else None,
                draft_path=str(point.draft.path) if point.draft else None,
                workload=self.workload,
                task=self.task,
                settings=self.settings,
            )
            if point.plain and len(host_names) > 1:
                out += [replace(job, run_uuid=new_run_uuid(), host=h) for h in host_names]
            else:
                out.append(job)
        return out


@dataclass(frozen=True)
class SweepRequest:
    """What `specreg sweep` is asked: the target (a path, an id prefix or a name), the grid as
    written (one or more `--grid` values), the prompts."""

    target: str
    grids: tuple[str, ...]
    prompts: Prompts = field(default_factory=Prompts)


def plan_sweep(
    con: duckdb.DuckDBPyConnection,
    target: Path,
    grid: Grid,
    workload: Workload,
    *,
    task: str | None = None,
    settings: Settings = DEFAULTS,
) -> SweepPlan:
    """The sweep of `grid` on `target`, models resolved in the caller's registry (a draft by
    path, id prefix or name); every point runs with `settings` (its threads in every config)."""
    from specreg.registry.scan import model_record

    record = model_record(con, target)
    drafts = [model_record(con, model_file(con, ref)) for ref in grid.drafts]
    points = grid_points(grid, drafts, settings.configured(Config()))
    return SweepPlan(
        target=record,
        target_path=Path(target).resolve(),
        grid=grid,
        points=points,
        workload=workload,
        task=task,
        settings=settings,
    )


def plan_target(db_path: Path, request: SweepRequest, settings: Settings = DEFAULTS) -> SweepPlan:
    """`request` planned in the registry at `db_path` (`sweep --dry-run` shows it)."""
    return _planned(db_path, request, settings)[0]


def _planned(
    db_path: Path, request: SweepRequest, settings: Settings
) -> tuple[SweepPlan, LoadPolicy]:
    """The plan, and the load guard's policy for this host (the settings' options and its
    quiet noise floor)."""
    from specreg.host.machine import detect_host
    from specreg.registry.db import opened

    grid = parse_grid(request.grids)
    workload = request.prompts.workload()
    with opened(db_path) as con:
        target = model_file(con, request.target)
        p = plan_sweep(con, target, grid, workload, task=request.prompts.task, settings=settings)
        return p, settings.load_policy(con, detect_host().fingerprint)


def _sweep_runs(
    con: duckdb.DuckDBPyConnection, outcomes: Iterable[Outcome]
) -> tuple[SweepRun, ...]:
    recorded = [(o, get_run(con, o.run_id)) for o in outcomes]
    plain: dict[str | None, list[float]] = {}
    for _, r in recorded:
        if r.spec_type == SPEC_NONE and r.experts is None and r.status == STATUS_OK:
            plain.setdefault(r.host_fingerprint, []).append(float(r.tokens_per_s or 0.0))
    out = []
    for o, r in recorded:
        base = plain.get(r.host_fingerprint)
        speedup = (
            r.tokens_per_s / statistics.median(base)
            if base and r.tokens_per_s and r.status == STATUS_OK
            else None
        )
        out.append(
            SweepRun(
                label=o.job.label,
                run_id=o.run_id,
                run_uuid=o.job.run_uuid,
                host_name=o.host_name or (r.host or {}).get("name"),
                host_fingerprint=r.host_fingerprint,
                status=r.status,
                error_kind=r.error_kind,
                error=r.error,
                tokens_per_s=r.tokens_per_s,
                acceptance=r.acceptance,
                speedup=speedup,
                attempt=o.job.attempt,
                retry_of=o.job.retry_of,
            )
        )
    return tuple(out)


def sweep(
    registry: duckdb.DuckDBPyConnection | Registry,
    p: SweepPlan,
    hosts: Hosts,
    *,
    on_run: OnRun = None,
) -> SweepResult:
    """Measure every point of `p` on `hosts` (this machine, or a Ray cluster's); every run
    recorded as it ends. Given a `Registry`, it is open only while a run is written (see
    `runner.runs.RunLog`)."""
    t0 = time.monotonic()
    run_log = RunLog(registry)
    outcomes, not_run, dropped = hosts.run(run_log, p.jobs(hosts.names()), on_run)
    with run_log.open() as con:
        runs = _sweep_runs(con, outcomes)
    return SweepResult(
        target_name=p.target.display_name,
        target_id=p.target.model_id,
        grid=p.grid.text,
        n_points=len(p.points),
        runs=runs,
        not_run=tuple(j.label for j in not_run),
        hosts=_host_summary(runs, dropped),
        seconds=time.monotonic() - t0,
        ray_address=hosts.address,
    )


def _host_summary(runs: Sequence[SweepRun], dropped: dict[str, str]) -> tuple[SweepHost, ...]:
    """Each host's runs and failures, and the hosts the sweep stopped sending jobs, with why."""
    by_host: dict[tuple[str | None, str | None], list[SweepRun]] = {}
    for r in runs:
        by_host.setdefault((r.host_name, r.host_fingerprint), []).append(r)
    summary = [
        SweepHost(
            name, fp, len(rs), sum(r.status != STATUS_OK for r in rs), dropped.get(name or "")
        )
        for (name, fp), rs in by_host.items()
    ]
    summary += [
        SweepHost(name, None, 0, 0, why)
        for name, why in dropped.items()
        if name not in {h.name for h in summary}
    ]
    return tuple(summary)


def sweep_target(
    db_path: Path,
    request: SweepRequest,
    settings: Settings = DEFAULTS,
    *,
    cluster: Cluster = LOCAL,
    llama_bin: Path | None = None,
    on_run: OnRun = None,
) -> SweepResult:
    """`specreg sweep`: every point of `request`'s grid measured, on this machine one after
    another (with the llama.cpp in `llama_bin`) or on the hosts of the Ray `cluster`, and
    recorded in the registry at `db_path`, which is open only while a run is written."""
    from specreg.host import load
    from specreg.tune.distributed import import_ray, sweep_hosts

    if cluster.address is not None:
        import_ray()  # before any model is scanned: one line on how to get Ray
    p, policy = _planned(db_path, request, settings)
    with sweep_hosts(cluster, llama_bin=llama_bin) as where, load.using(policy):
        return sweep(registry_at(db_path), p, where, on_run=on_run)
